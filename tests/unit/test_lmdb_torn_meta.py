"""A reader that meets a live writer rewriting a meta page (a torn read: one commit's number
with another commit's roots and last page) reads it again instead of calling the log damaged,
while a meta page that reads the same twice and names a broken tree is still refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_lmdb_log import META, envelopes

from engine.errors import LogError
from stores import lmdb_pages
from stores.lmdb_log import LmdbEventLog


def _log(path: Path) -> None:
    with LmdbEventLog.create(path, META) as log:
        log.append(envelopes(0, 200))


def _torn(metas: tuple[lmdb_pages.Meta | None, ...]) -> tuple[lmdb_pages.Meta | None, ...]:
    """The metas with the newest one's last page cut below its tree's pages."""
    newest = max((m for m in metas if m), key=lambda m: m.txnid)
    return tuple(dataclasses.replace(m, last_pgno=2) if m is newest else m for m in metas)


def test_a_torn_meta_read_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _log(tmp_path / "log")
    real = lmdb_pages.read_metas
    calls = 0

    def read_metas(file: Path) -> tuple[lmdb_pages.Meta | None, ...]:
        nonlocal calls
        calls += 1
        metas = real(file)
        return _torn(metas) if calls <= 2 else metas  # the first check's two reads: torn

    monkeypatch.setattr(lmdb_pages, "read_metas", read_metas)
    LmdbEventLog.open(tmp_path / "log").close()
    assert calls > 2


def test_a_meta_that_reads_the_same_twice_and_names_a_broken_tree_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _log(tmp_path / "log")
    real = lmdb_pages.read_metas
    monkeypatch.setattr(lmdb_pages, "read_metas", lambda file: _torn(real(file)))
    with pytest.raises(LogError, match=r"is damaged: .* past the file.s last page 2"):
        LmdbEventLog.open(tmp_path / "log")
