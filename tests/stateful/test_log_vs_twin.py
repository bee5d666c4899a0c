"""The LMDB log against its in-memory twin: any interleaving of appends (valid and conflicting,
records of several parts), range reads, reopens, crashes and a concurrent reader leaves both
with the same contents.

A crash is modelled where it can hurt: inside a write transaction that has put part of what it
commits (its events record, not yet its snapshot), and in the middle of a commit, after LMDB
wrote the transaction's pages and before it wrote the meta page that makes them the newest
commit (the meta page is put back as it was). Either way, the process's handles all vanish
and a new writer must find exactly the commits before, and carry on from there.
(``tests/unit/test_lmdb_log.py`` kills a real writer process at random moments.)"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from engine.errors import LogError, SequenceConflict
from engine.eventlog import MemoryEventLog, new_run_meta
from engine.events import Envelope, Event
from engine.lifecycle import ActorRestarted, ActorStarted, RunStopped
from stores import lmdb_log, lmdb_records
from stores.lmdb_log import LmdbEventLog
from stores.lmdb_pages import read_metas

META = new_run_meta("stateful", scenario_name="stateful", seed=0, coevo_version="0.1.0")

names = st.text(max_size=6)
events: st.SearchStrategy[Event] = st.one_of(
    st.builds(ActorStarted, actor=names, actor_type=names, seed=st.integers(0, 2**32)),
    st.builds(ActorRestarted, actor=names, attempt=st.integers(0, 5)),
    st.builds(RunStopped, reason=names),
)
batches = st.lists(events, max_size=8)
seqs = st.integers(-2, 40)


def envelopes(start: int, evs: list[Event]) -> list[Envelope[Event]]:
    return [
        Envelope(seq=start + i, run="stateful", t=i, actor="runtime", event=ev)
        for i, ev in enumerate(evs)
    ]


class Crashed(BaseException):
    """The process dies here (nothing after it runs)."""


class LogVsTwin(RuleBasedStateMachine):
    """Drive an LMDB writer (plus, at times, a read-only handle) and the twin in lock-step."""

    @initialize()
    def create(self) -> None:
        self.chunk, lmdb_log.READ_CHUNK = lmdb_log.READ_CHUNK, 4  # many short read txns
        self.part, lmdb_records.RECORD_PART = lmdb_records.RECORD_PART, 3  # records in parts
        self.dir = Path(tempfile.mkdtemp(prefix="coevo-stateful-"))
        self.path = self.dir / "log"
        self.writer = LmdbEventLog.create(self.path, META, durable=False, map_size=64 * 1024)
        self.twin = MemoryEventLog()
        self.reader: LmdbEventLog | None = None

    def teardown(self) -> None:
        if hasattr(self, "dir"):
            lmdb_log.READ_CHUNK = self.chunk
            lmdb_records.RECORD_PART = self.part
            self.writer.close()
            if self.reader is not None:
                self.reader.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(evs=batches)
    def append(self, evs: list[Event]) -> None:
        batch = envelopes(self.twin.next_seq, evs)
        self.twin.append(batch)
        self.writer.append(batch)

    @rule(evs=batches.filter(bool), offset=st.integers(-3, 3).filter(lambda n: n != 0))
    def append_conflicting(self, evs: list[Event], offset: int) -> None:
        batch = envelopes(self.twin.next_seq + offset, evs)
        for log in (self.twin, self.writer):
            try:
                log.append(batch)
            except SequenceConflict:
                pass
            else:
                raise AssertionError(f"{log!r} accepted a batch at offset {offset}")

    @rule(evs=st.lists(events, min_size=2, max_size=6), hole=st.integers(1, 5))
    def append_with_gap(self, evs: list[Event], hole: int) -> None:
        batch = envelopes(self.twin.next_seq, evs)
        cut = min(hole, len(batch) - 1)
        gappy = batch[:cut] + envelopes(batch[cut].seq + 1, evs[cut:])
        for log in (self.twin, self.writer):
            try:
                log.append(gappy)
            except SequenceConflict:
                pass
            else:
                raise AssertionError(f"{log!r} accepted a batch with a gap")

    @rule(start=seqs, stop=st.none() | seqs)
    def read_range(self, start: int, stop: int | None) -> None:
        assert list(self.writer.read(start, stop)) == list(self.twin.read(start, stop))

    @rule()
    def reopen(self) -> None:
        self.writer.close()
        self.writer = LmdbEventLog.open(self.path, writable=True, durable=False)

    def vanish(self) -> None:
        """Every handle of the process goes (a crash), then a new writer opens the log: it
        holds exactly the twin's commits and verifies."""
        self.writer.close()
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        self.writer = LmdbEventLog.open(self.path, writable=True, durable=False)
        assert list(self.writer.read()) == list(self.twin.read())
        assert self.writer.verify().ok

    @rule()
    def crash(self) -> None:
        """The process dies between commits."""
        self.vanish()

    @rule(evs=batches.filter(bool), upto=seqs, data=st.binary(max_size=8))
    def crash_inside_a_transaction(self, evs: list[Event], upto: int, data: bytes) -> None:
        """The process dies in a write transaction that has put the batch's record (of several
        parts) and not yet its snapshot: nothing of it was committed."""
        batch = envelopes(self.twin.next_seq, evs)

        def dies(txn: Any, puts: list[Any]) -> None:
            db, key, value = puts[0]
            txn.put(key, value, db=db, append=True)
            raise Crashed

        self.writer._put_all = dies  # type: ignore[method-assign]
        try:
            self.writer.append(batch, snapshots=[("a", min(max(upto, 0), batch[-1].seq), data)])
        except Crashed:
            pass
        else:
            raise AssertionError("the transaction was not under way")
        self.vanish()

    @rule(evs=batches.filter(bool))
    def crash_before_the_meta_page(self, evs: list[Event]) -> None:
        """The process dies in a commit after LMDB wrote the transaction's pages and before it
        wrote the meta page: the meta page of that transaction's slot is as it was."""
        data = self.path / "data.mdb"
        older = min((m for m in read_metas(data) if m is not None), key=lambda m: m.txnid)
        with data.open("rb") as fh:
            fh.seek(older.page * older.psize)
            before = fh.read(older.psize)
        self.writer.append(envelopes(self.twin.next_seq, evs))  # the twin never sees it
        newest = max((m for m in read_metas(data) if m is not None), key=lambda m: m.txnid)
        assert newest.page == older.page, "the commit wrote the other meta page"
        self.writer.close()
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        with data.open("r+b") as fh:
            fh.seek(older.page * older.psize)
            fh.write(before)
        self.vanish()

    @rule()
    def writer_returns_to_a_reader(self) -> None:
        """Only a reader holds the log (read-only environment) when the writer comes back."""
        self.writer.close()
        if self.reader is not None:
            self.reader.close()
        self.reader = LmdbEventLog.open(self.path)
        assert list(self.reader.read()) == list(self.twin.read())
        self.writer = LmdbEventLog.open(self.path, writable=True, durable=False)

    @precondition(lambda self: self.reader is None)
    @rule()
    def open_reader(self) -> None:
        self.reader = LmdbEventLog.open(self.path)

    @precondition(lambda self: self.reader is not None)
    @rule()
    def close_reader(self) -> None:
        assert self.reader is not None
        self.reader.close()
        self.reader = None

    @precondition(lambda self: self.reader is not None)
    @rule(start=seqs, stop=st.none() | seqs)
    def reader_reads(self, start: int, stop: int | None) -> None:
        assert self.reader is not None
        assert list(self.reader.read(start, stop)) == list(self.twin.read(start, stop))

    @precondition(lambda self: self.reader is not None)
    @rule(start=seqs, evs=st.lists(events, min_size=1, max_size=6))
    def reader_reads_while_writer_appends(self, start: int, evs: list[Event]) -> None:
        """A read already under way ends where the log ended when it started."""
        assert self.reader is not None
        ours, theirs = self.reader.read(start), self.twin.read(start)
        head = [next(ours, None)], [next(theirs, None)]
        batch = envelopes(self.twin.next_seq, evs)
        self.writer.append(batch)
        self.twin.append(batch)
        assert head[0] + list(ours) == head[1] + list(theirs)
        assert self.reader.next_seq == self.twin.next_seq

    @rule(upto=seqs, data=st.binary(max_size=8), name=st.sampled_from(["a", "ab", "b"]))
    def snapshot(self, upto: int, data: bytes, name: str) -> None:
        if 0 <= upto < self.twin.next_seq:
            self.twin.put_snapshot(name, upto, data)
            self.writer.put_snapshot(name, upto, data)
        for at in (upto, upto + 3):
            assert self.writer.get_snapshot(name, at) == self.twin.get_snapshot(name, at)

    @rule(evs=batches, upto=seqs, data=st.binary(max_size=8), name=st.sampled_from(["a", "b"]))
    def append_with_snapshot(self, evs: list[Event], upto: int, data: bytes, name: str) -> None:
        """A batch and a snapshot commit together, or (``upto`` outside the log) neither does."""
        batch = envelopes(self.twin.next_seq, evs)
        refused = set[str]()
        for label, log in (("twin", self.twin), ("lmdb", self.writer)):
            try:
                log.append(batch, snapshots=[(name, upto, data)])
            except LogError:
                refused.add(label)
        assert refused in (set(), {"twin", "lmdb"})
        assert self.writer.get_snapshot(name, upto) == self.twin.get_snapshot(name, upto)

    @invariant()
    def same_next_seq(self) -> None:
        if hasattr(self, "writer"):
            assert self.writer.next_seq == self.twin.next_seq
            if self.reader is not None:
                assert self.reader.next_seq == self.twin.next_seq


LogVsTwin.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
TestLogVsTwin = LogVsTwin.TestCase
