"""``torn_tail``: where a file a killed writer left within a line keeps its whole lines; and
``replace_file``: a whole file or none, whoever else writes it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stores.rundir import torn_tail


@pytest.mark.parametrize(
    ("data", "whole"),
    [
        (b"", None),
        (b"a\n", None),
        (b"a\nb\n", None),
        (b"a\nb", 2),
        (b"torn", 0),
        (b"a\n" + b"x" * 200_000, 2),  # a torn line longer than a block read from the end
        (b"a\n" * 100_000 + b"x", 200_000),
    ],
    ids=["empty", "one line", "two lines", "torn", "no whole line", "long torn", "long file"],
)
def test_the_end_of_the_last_whole_line(tmp_path: Path, data: bytes, whole: int | None) -> None:
    path = tmp_path / "f"
    path.write_bytes(data)
    assert torn_tail(path) == whole


def test_a_replaced_file_leaves_another_writers_partial_alone(tmp_path: Path) -> None:
    """Two ``coevo report`` at once wrote through one ``.report.html.partial``: the one that
    renamed second found its file gone ("cannot write: No such file or directory"). Each
    process writes a partial file of its own."""
    from stores.rundir import replace_file

    target = tmp_path / "report.html"
    other = tmp_path / ".report.html.partial"  # another process's, half written
    other.write_bytes(b"<html>half")
    mine = tmp_path / f".report.html.{os.getpid() + 1}.partial"
    mine.write_bytes(b"<html>half")
    replace_file(target, b"<html>whole</html>")
    assert target.read_bytes() == b"<html>whole</html>"
    assert other.read_bytes() == mine.read_bytes() == b"<html>half"
