"""The EventLog Protocol, once: every backend must pass the same abstract test case."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from engine.errors import LogClosed, LogError, SequenceConflict
from engine.eventlog import (
    LOG_FORMAT,
    EventLog,
    MemoryEventLog,
    RunMeta,
    machine_description,
    new_run_meta,
)
from engine.events import Envelope, Event
from engine.lifecycle import ActorStarted, RunFailed, RunStarted, RunStopped
from stores.lmdb_log import LmdbEventLog

META = RunMeta(
    run_id="run-1",
    created_ns=1_700_000_000_000_000_000,
    coevo_version="0.1.0",
    log_format=LOG_FORMAT,
    scenario_name="contract",
    scenario_toml='name = "contract"\n',
    scenario_hash="0" * 64,
    seed=7,
    event_versions={"run_started": 1},
)


def make_event(seq: int) -> Event:
    """A deterministic lifecycle event per seq, cycling through a few kinds."""
    kinds: list[Event] = [
        RunStarted(run_id="run-1", scenario="s", scenario_hash="h", seed=seq, coevo_version="0"),
        ActorStarted(actor=f"actor-{seq}", actor_type="env", seed=seq, attempt=seq % 3),
        RunFailed(error_type="ValueError", message=f"ünïcode {seq} ✓", actor="", exit_code=2),
        RunStopped(reason="completed"),
    ]
    return kinds[seq % len(kinds)]


def envelopes(start: int, count: int) -> list[Envelope[Event]]:
    """``count`` envelopes with seqs ``start, start + 1, ...``."""
    return [
        Envelope(seq=s, run="run-1", t=1000 + s, actor="runtime", event=make_event(s), corr="c")
        for s in range(start, start + count)
    ]


class EventLogContract:
    """Abstract test case of the EventLog Protocol. Subclasses implement :meth:`make`."""

    def make(self, tmp_path: Path) -> EventLog:
        """A new, empty, writable log whose metadata is :data:`META`."""
        raise NotImplementedError

    @pytest.fixture
    def log(self, tmp_path: Path) -> Iterator[EventLog]:
        log = self.make(tmp_path)
        yield log
        log.close()

    def test_satisfies_the_protocol(self, log: EventLog) -> None:
        assert isinstance(log, EventLog)

    def test_new_log_is_empty(self, log: EventLog) -> None:
        assert log.next_seq == 0
        assert list(log.read()) == []
        assert log.verify().ok

    def test_appended_batches_read_back_in_order(self, log: EventLog) -> None:
        log.append(envelopes(0, 3))
        log.append(envelopes(3, 1))
        log.append(envelopes(4, 5))
        assert log.next_seq == 9
        assert list(log.read()) == envelopes(0, 9)

    def test_empty_batch_changes_nothing(self, log: EventLog) -> None:
        log.append(envelopes(0, 2))
        log.append([])
        assert log.next_seq == 2

    @pytest.mark.parametrize(
        ("start", "stop", "expected"),
        [
            (0, None, range(0, 10)),
            (3, None, range(3, 10)),
            (3, 7, range(3, 7)),
            (0, 0, range(0)),
            (7, 3, range(0)),
            (9, 100, range(9, 10)),
            (10, None, range(0)),
            (50, 60, range(0)),
            (-5, 2, range(0, 2)),
        ],
    )
    def test_read_range(self, log: EventLog, start: int, stop: int | None, expected: range) -> None:
        log.append(envelopes(0, 10))
        assert [env.seq for env in log.read(start, stop)] == list(expected)
        assert list(log.read(start, stop)) == [envelopes(0, 10)[s] for s in expected]
        chunks = list(log.read_chunks(start, stop))
        assert all(chunks)
        assert [env.seq for chunk in chunks for env in chunk] == list(expected)

    def test_chunks_are_the_range_in_order(self, log: EventLog) -> None:
        for first in range(0, 1200, 300):
            log.append(envelopes(first, 300))
        chunks = list(log.read_chunks(150, 1190))
        assert len(chunks) > 1 and all(chunks)
        assert [env for chunk in chunks for env in chunk] == envelopes(150, 1040)

    @pytest.mark.parametrize(
        "batch",
        [
            envelopes(3, 2),  # starts past the end
            envelopes(1, 2),  # starts inside the log
            envelopes(2, 1) + envelopes(4, 1),  # a gap inside the batch
            envelopes(2, 2) + envelopes(3, 1),  # a repeated seq
        ],
        ids=["ahead", "behind", "gap", "repeat"],
    )
    def test_conflicting_batch_writes_nothing(
        self, log: EventLog, batch: list[Envelope[Event]]
    ) -> None:
        log.append(envelopes(0, 2))
        with pytest.raises(SequenceConflict) as info:
            log.append(batch)
        assert info.value.expected != info.value.actual
        assert log.next_seq == 2
        assert list(log.read()) == envelopes(0, 2)
        log.append(envelopes(2, 2))
        assert log.next_seq == 4

    def test_encoded_batch_appends_like_the_batch(self, log: EventLog) -> None:
        log.append(envelopes(0, 2))
        batch = log.encode(envelopes(2, 3))
        assert log.next_seq == 2  # encoding stores nothing
        log.append_encoded(batch, snapshots=[("p", 4, b"four")])
        assert list(log.read()) == envelopes(0, 5)
        assert log.get_snapshot("p", 9) == (4, b"four")

    def test_encoded_batch_must_continue_the_log(self, log: EventLog) -> None:
        log.append(envelopes(0, 2))
        stale = log.encode(envelopes(1, 2))
        with pytest.raises(SequenceConflict) as info:
            log.append_encoded(stale)
        assert (info.value.expected, info.value.actual) == (2, 1)
        assert list(log.read()) == envelopes(0, 2)
        with pytest.raises(SequenceConflict):
            log.encode(envelopes(2, 1) + envelopes(4, 1))

    def test_a_log_has_an_id_of_its_own_that_new_metadata_keeps(
        self, log: EventLog, tmp_path: Path
    ) -> None:
        """Caches of what a log holds (the audit index) tell a log written anew with the same
        events and metadata from the one they were made from by it."""
        made = log.log_id
        assert len(made) == 32 and made == log.log_id
        log.write_meta(RunMeta(**{**_fields(META), "seed": 3}))
        log.append(envelopes(0, 2))
        assert log.log_id == made
        other = self.make(tmp_path / "other")
        try:
            other.append(envelopes(0, 2))
            assert other.log_id != made
        finally:
            other.close()

    def test_meta_round_trips_and_is_replaced(self, log: EventLog) -> None:
        assert log.read_meta() == META
        newer = RunMeta(**{**_fields(META), "scenario_name": "ünïcode ✓", "seed": 2**63})
        log.write_meta(newer)
        assert log.read_meta() == newer

    def test_meta_records_the_machine_and_reads_one_written_without_it(self, log: EventLog) -> None:
        made = new_run_meta("run-2", scenario_name="s", seed=1, coevo_version="0.1.0")
        assert made.machine == machine_description() != ""
        log.write_meta(made)
        assert log.read_meta() == made
        fields = {k: v for k, v in _fields(META).items() if k != "machine"}  # before 2026-12-02
        assert msgspec.msgpack.decode(msgspec.msgpack.encode(fields), type=RunMeta).machine == ""

    def test_snapshot_at_or_before(self, log: EventLog) -> None:
        log.append(envelopes(0, 30))
        log.put_snapshot("counts", 9, b"nine")
        log.put_snapshot("counts", 19, b"nineteen")
        log.put_snapshot("counts-extra", 15, b"other projection")
        log.put_snapshot("", 5, b"")
        assert log.get_snapshot("counts", 8) is None
        assert log.get_snapshot("counts", 9) == (9, b"nine")
        assert log.get_snapshot("counts", 18) == (9, b"nine")
        assert log.get_snapshot("counts", 19) == (19, b"nineteen")
        assert log.get_snapshot("counts", 10**20) == (19, b"nineteen")
        assert log.get_snapshot("counts-extra", 29) == (15, b"other projection")
        assert log.get_snapshot("", 29) == (5, b"")
        assert log.get_snapshot("count", 29) is None
        assert log.get_snapshot("missing", 29) is None
        assert log.get_snapshot("counts", -1) is None

    def test_snapshot_is_replaced_at_same_upto(self, log: EventLog) -> None:
        log.append(envelopes(0, 5))
        log.put_snapshot("p", 4, b"old")
        log.put_snapshot("p", 4, b"new")
        assert log.get_snapshot("p", 4) == (4, b"new")

    @pytest.mark.parametrize("upto", [-1, 5, 6])
    def test_snapshot_past_the_log_is_refused(self, log: EventLog, upto: int) -> None:
        log.append(envelopes(0, 5))
        with pytest.raises(LogError, match="no such seq"):
            log.put_snapshot("p", upto, b"x")
        assert log.get_snapshot("p", 100) is None

    def test_snapshots_commit_with_their_batch(self, log: EventLog) -> None:
        log.append(envelopes(0, 2))
        log.append(envelopes(2, 3), snapshots=[("p", 3, b"three"), ("q", 4, b"four")])
        assert log.next_seq == 5
        assert log.get_snapshot("p", 10) == (3, b"three")
        assert log.get_snapshot("q", 10) == (4, b"four")

    @pytest.mark.parametrize(
        ("first", "upto", "error"),
        [(2, 5, LogError), (2, -1, LogError), (3, 2, SequenceConflict)],
        ids=["snapshot past the batch", "negative upto", "batch conflicts"],
    )
    def test_refused_batch_keeps_neither_events_nor_snapshots(
        self, log: EventLog, first: int, upto: int, error: type[Exception]
    ) -> None:
        log.append(envelopes(0, 2))
        with pytest.raises(error):
            log.append(envelopes(first, 3), snapshots=[("p", 1, b"ok"), ("q", upto, b"x")])
        assert log.next_seq == 2
        assert log.get_snapshot("p", 10) is None and log.get_snapshot("q", 10) is None
        log.append(envelopes(2, 3))
        assert list(log.read()) == envelopes(0, 5)

    def test_verify_counts_records(self, log: EventLog) -> None:
        log.append(envelopes(0, 12))
        report = log.verify()
        assert report.ok
        assert report.records == 12
        assert report.first_bad is None

    def test_close_is_idempotent_and_final(self, log: EventLog) -> None:
        log.append(envelopes(0, 2))
        log.close()
        log.close()
        with pytest.raises(LogClosed):
            log.append(envelopes(2, 1))
        with pytest.raises(LogClosed):
            list(log.read())
        with pytest.raises(LogClosed):
            log.read_meta()
        with pytest.raises(LogClosed):
            log.write_meta(META)
        with pytest.raises(LogClosed):
            log.put_snapshot("p", 0, b"")
        with pytest.raises(LogClosed):
            log.get_snapshot("p", 0)
        with pytest.raises(LogClosed):
            log.verify()


def _fields(meta: RunMeta) -> dict[str, object]:
    return {name: getattr(meta, name) for name in meta.__struct_fields__}


class TestMemoryEventLog(EventLogContract):
    def make(self, tmp_path: Path) -> EventLog:
        log = MemoryEventLog()
        log.write_meta(META)
        return log


class TestLmdbEventLog(EventLogContract):
    def make(self, tmp_path: Path) -> EventLog:
        return LmdbEventLog.create(tmp_path / "log", META, durable=False)

    def test_a_copy_keeps_the_logs_id(self, tmp_path: Path) -> None:
        """``coevo copy`` copies the log: the same events, the same log, the audit index of
        the one is the other's."""
        with LmdbEventLog.create(tmp_path / "log", META, durable=False) as log:
            log.append(envelopes(0, 3))
            log.copy_to(tmp_path / "copy")
            made = log.log_id
        with LmdbEventLog.open(tmp_path / "copy") as copy:
            assert copy.log_id == made and list(copy.read()) == envelopes(0, 3)

    def test_reopened_log_holds_everything(self, tmp_path: Path) -> None:
        log = LmdbEventLog.create(tmp_path / "log", META)
        log.append(envelopes(0, 4))
        log.append(envelopes(4, 4))
        log.append(envelopes(8, 3))
        log.put_snapshot("p", 7, b"seven")
        made = log.log_id
        log.close()
        with LmdbEventLog.open(tmp_path / "log") as again:
            assert again.next_seq == 11
            assert list(again.read()) == envelopes(0, 11)
            assert again.read_meta() == META
            assert again.log_id == made
            assert again.get_snapshot("p", 10) == (7, b"seven")
            assert again.verify().ok
