"""``torn_tail``: where a file a killed writer left within a line keeps its whole lines."""

from __future__ import annotations

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
