"""The FactIndex Protocol, once: the LMDB index and its in-memory twin pass the same test case."""

from __future__ import annotations

from pathlib import Path

import pytest

from stores.fact_index import FactIndex, LmdbFactIndex, MemoryFactIndex


class FactIndexContract:
    """Abstract test case of the FactIndex Protocol. Subclasses implement :meth:`make`."""

    @pytest.fixture
    def index(self, tmp_path: Path) -> FactIndex:
        return self.make(tmp_path)

    def make(self, tmp_path: Path) -> FactIndex:
        raise NotImplementedError

    def test_satisfies_the_protocol_and_starts_empty(self, index: FactIndex) -> None:
        assert isinstance(index, FactIndex)
        assert index.upto == 0
        assert index.get(b"a") is None
        assert index.scan(b"") == []

    def test_extend_moves_upto_and_refuses_another_start(self, index: FactIndex) -> None:
        assert index.extend(0, 5, [(b"k1", b"v1")])
        assert index.upto == 5
        assert not index.extend(0, 9, [(b"k2", b"v2")])  # someone indexed 0..5 already
        assert index.get(b"k2") is None and index.upto == 5
        assert index.extend(5, 5, [])
        assert index.extend(5, 7, [(b"k2", b"v2")])
        assert index.upto == 7 and index.get(b"k2") == b"v2"

    def test_scan_is_by_prefix_in_key_order(self, index: FactIndex) -> None:
        facts = [
            (b"tb\x02", b"3"),
            (b"ta\x01", b"1"),
            (b"u", b"x"),
            (b"ta\x00", b"0"),
            (b"t", b"t"),
        ]
        assert index.extend(0, 1, facts)
        assert index.scan(b"ta") == [(b"ta\x00", b"0"), (b"ta\x01", b"1")]
        assert [k for k, _ in index.scan(b"t")] == [b"t", b"ta\x00", b"ta\x01", b"tb\x02"]
        assert index.scan(b"z") == []

    def test_get_many_answers_each_key(self, index: FactIndex) -> None:
        index.extend(0, 1, [(b"a", b"1"), (b"c", b"3")])
        assert index.get_many([b"c", b"b", b"a"]) == [b"3", None, b"1"]
        assert index.get_many([]) == []

    def test_a_key_written_again_is_overwritten(self, index: FactIndex) -> None:
        index.extend(0, 1, [(b"k", b"old")])
        index.extend(1, 2, [(b"k", b"new")])
        assert index.scan(b"k") == [(b"k", b"new")]

    def test_a_range_ending_before_it_starts_is_refused(self, index: FactIndex) -> None:
        with pytest.raises(ValueError, match="before start"):
            index.extend(0, -1, [])


class TestMemoryFactIndex(FactIndexContract):
    def make(self, tmp_path: Path) -> FactIndex:
        return MemoryFactIndex()


class TestLmdbFactIndex(FactIndexContract):
    def make(self, tmp_path: Path) -> FactIndex:
        return LmdbFactIndex.open(tmp_path / "idx", "run-a")

    def test_facts_persist_and_another_ident_starts_afresh(self, tmp_path: Path) -> None:
        with LmdbFactIndex.open(tmp_path / "idx", "run-a") as index:
            index.extend(0, 3, [(b"k", b"v")])
        with LmdbFactIndex.open(tmp_path / "idx", "run-a") as index:
            assert index.upto == 3 and index.get(b"k") == b"v"
        with LmdbFactIndex.open(tmp_path / "idx", "run-b") as index:
            assert index.upto == 0 and index.get(b"k") is None

    def test_the_map_grows_when_full(self, tmp_path: Path) -> None:
        with LmdbFactIndex.open(tmp_path / "idx", "run-a") as index:
            big = b"x" * 4000
            facts = [(i.to_bytes(4, "big"), big) for i in range(20_000)]  # ~80 MB > 64 MiB
            assert index.extend(0, 1, facts)
            assert index.get((19_999).to_bytes(4, "big")) == big

    def test_a_path_that_cannot_be_a_directory_is_an_os_error(self, tmp_path: Path) -> None:
        (tmp_path / "file").write_text("x")
        with pytest.raises(OSError):
            LmdbFactIndex.open(tmp_path / "file", "run-a")

    def test_a_failed_write_says_what_is_free_on_its_disk(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """LMDB said "Input/output error" for a full disk: the message says how full it is."""
        import shutil

        import lmdb

        from stores import fact_index

        with LmdbFactIndex.open(tmp_path / "idx", "run-a") as index:

            class Refusing:
                def __init__(self, env: object) -> None:
                    self.env = env

                def begin(self, **kw: object) -> object:
                    raise lmdb.Error("mdb_txn_commit: Input/output error")

            monkeypatch.setattr(index, "_env", Refusing(index._env))  # pyright: ignore[reportPrivateUsage]
            usage = shutil.disk_usage(tmp_path)._replace(free=5 * 2**20)
            monkeypatch.setattr(fact_index.shutil, "disk_usage", lambda p: usage)
            with pytest.raises(
                fact_index.IndexWriteFailed, match=r"5\.0 MiB free on its disk: full\?"
            ):
                index.extend(0, 1, [(b"k", b"v")])
            monkeypatch.undo()
