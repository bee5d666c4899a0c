"""LmdbEventLog beyond the Protocol: the writer lock, map growth, readers in other processes,
format checks, durability modes and corruption reports."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import lmdb
import msgspec
import pytest

from engine.errors import (
    LogClosed,
    LogCorrupted,
    LogError,
    LogLocked,
    SchemaTooNew,
    SequenceConflict,
)
from engine.eventlog import LOG_FORMAT, new_run_meta
from engine.events import Envelope, Event
from engine.lifecycle import ActorStarted, RunStopped
from stores import lmdb_log, lmdb_records
from stores.lmdb_env import is_blank
from stores.lmdb_log import LmdbEventLog
from stores.lmdb_pages import read_metas

ROOT = Path(__file__).resolve().parents[2]
META = new_run_meta("unit", scenario_name="unit", seed=0, coevo_version="0.1.0")


def envelopes(start: int, count: int, pad: str = "") -> list[Envelope[Event]]:
    return [
        Envelope(
            seq=s,
            run="unit",
            t=s,
            actor="runtime",
            event=ActorStarted(actor=f"worker-{s}{pad}", actor_type="env", seed=s),
        )
        for s in range(start, start + count)
    ]


def python(code: str, **kwargs: object) -> subprocess.Popen[str]:
    """Start ``python -c code`` with the repository importable, pipes on stdin/stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kwargs,  # type: ignore[arg-type]
    )


def raw_put(path: Path, db: bytes, key: bytes, value: bytes | None) -> None:
    """Write (or delete, for None) one raw LMDB record, bypassing the log."""
    with lmdb.open(str(path), max_dbs=3, create=False) as env:
        handle = env.open_db(db, create=False)
        with env.begin(write=True, db=handle) as txn:
            if value is None:
                txn.delete(key)
            else:
                txn.put(key, value)


def raw_get(path: Path, db: bytes, key: bytes) -> bytes:
    with lmdb.open(str(path), max_dbs=3, create=False, readonly=True) as env:
        handle = env.open_db(db, create=False)
        with env.begin(db=handle) as txn:
            value = txn.get(key)
    assert value is not None
    return value


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "run" / "log"


# -- the writer lock -------------------------------------------------------------------------


def test_second_writer_in_same_process_is_refused(path: Path) -> None:
    with LmdbEventLog.create(path, META) as writer:
        with pytest.raises(LogLocked, match=f"already has a writer \\(pid {os.getpid()} on "):
            LmdbEventLog.open(path, writable=True)
        with LmdbEventLog.open(path) as reader:  # readers are never refused
            writer.append(envelopes(0, 2))
            assert reader.next_seq == 2
    with LmdbEventLog.open(path, writable=True) as writer:  # the lock died with close()
        writer.append(envelopes(2, 1))
        assert writer.next_seq == 3


def test_second_writer_in_other_process_is_refused(path: Path) -> None:
    code = (
        "import sys\n"
        "from engine.errors import LogLocked\n"
        "from stores.lmdb_log import LmdbEventLog\n"
        "try:\n"
        "    LmdbEventLog.open(sys.argv[1], writable=True)\n"
        "except LogLocked as exc:\n"
        "    print('locked:', exc)\n"
        "else:\n"
        "    print('opened')\n"
    )
    with LmdbEventLog.create(path, META):
        child = python(code.replace("sys.argv[1]", repr(str(path))))
        out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    holder = f"(pid {os.getpid()} on {socket.gethostname()})"
    assert out.startswith(f"locked: event log at {path} already has a writer {holder}")


def test_a_deleted_lock_file_does_not_let_a_second_writer_in(path: Path) -> None:
    """``writer.lock`` deleted (or replaced) while a run writes is a new file, and its lock
    alone let a second process resume into the live log. The directory is locked too."""
    from stores.lmdb_env import LOCK_FILE

    with LmdbEventLog.create(path, META) as writer:
        (path / LOCK_FILE).unlink()
        with pytest.raises(LogLocked, match="already has a writer"):
            LmdbEventLog.open(path, writable=True)
        writer.append(envelopes(0, 2))
    with LmdbEventLog.open(path, writable=True) as writer:  # both locks died with close()
        writer.append(envelopes(2, 1))
        assert writer.next_seq == 3


def test_a_live_writer_whose_lock_file_was_deleted_or_replaced_is_still_seen(
    path: Path,
) -> None:
    """Readers ask whether a log's writer lives (``coevo log --follow``, a run's state) from
    ``writer.lock``: deleted or replaced while a run writes, it told them of a killed run.
    The lock the writer holds on the directory tells them."""
    from stores.lmdb_env import LOCK_FILE, writer_alive

    with LmdbEventLog.create(path, META):
        assert writer_alive(path)
        (path / LOCK_FILE).unlink()
        assert writer_alive(path)
        (path / LOCK_FILE).write_text(f"999999999 {socket.gethostname()}\n")  # a stale copy
        assert writer_alive(path)
    assert not writer_alive(path)


def test_create_over_existing_log_is_refused(path: Path) -> None:
    with LmdbEventLog.create(path, META) as log:
        log.append(envelopes(0, 3))
    with pytest.raises(LogError, match="already exists"):
        LmdbEventLog.create(path, META)
    with LmdbEventLog.open(path) as log:
        assert list(log.read()) == envelopes(0, 3)


def test_a_creation_interrupted_before_its_commit_leaves_nothing_and_is_redone(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The databases and the metadata are created in one transaction: a process killed while
    creating leaves a blank data file (a new log is created over it), never databases without
    their metadata."""

    class Killed:  # the metadata's encoding is the last step before its commit
        def encode(self, value: object) -> bytes:
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(lmdb_log, "_ENCODER", Killed())
        with pytest.raises(KeyboardInterrupt):
            LmdbEventLog.create(path, META)
    assert is_blank(path)  # LMDB's two meta pages of transaction 0, nothing else
    with pytest.raises(LogError, match="no coevo event log"):
        LmdbEventLog.open(path)
    with LmdbEventLog.create(path, META) as log:
        assert log.read_meta() == META and log.next_seq == 0


def test_a_damaged_id_on_the_newest_meta_page_is_refused_not_read_as_an_older_commit(
    path: Path,
) -> None:
    """LMDB reads the meta page with the larger transaction id: with the newest one's id
    zeroed it read the log as of the commit before, and the last commit was lost silently."""
    with LmdbEventLog.create(path, META) as log:
        log.append(envelopes(0, 3))
        log.append(envelopes(3, 2))
    newest = max((m for m in read_metas(path / "data.mdb") if m), key=lambda m: m.txnid)
    with (path / "data.mdb").open("r+b") as fh:
        fh.seek(newest.page * newest.psize + 144)  # the meta record's transaction id
        fh.write(bytes(8))
    for writable in (False, True):
        with pytest.raises(LogError, match="which must be consecutive: one is damaged"):
            LmdbEventLog.open(path, writable=writable)


def test_create_with_bad_map_size_is_refused(path: Path) -> None:
    with pytest.raises(ValueError, match="map_size must be positive"):
        LmdbEventLog.create(path, META, map_size=0)


@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.mkdir(parents=True)])
def test_open_without_a_log_is_a_clear_error(path: Path, make: object) -> None:
    make(path)  # type: ignore[operator]
    with pytest.raises(LogError, match="no coevo event log at"):
        LmdbEventLog.open(path)
    with pytest.raises(LogError, match="no coevo event log at"):
        LmdbEventLog.open(path, writable=True)


def test_read_only_handle_refuses_writes(path: Path) -> None:
    LmdbEventLog.create(path, META).close()
    with LmdbEventLog.open(path) as reader:
        assert not reader.writable
        for attempt in (
            lambda: reader.append(envelopes(0, 1)),
            lambda: reader.write_meta(META),
            lambda: reader.put_snapshot("p", 0, b""),
        ):
            with pytest.raises(LogError, match="read-only") as info:
                attempt()
            assert not isinstance(info.value, LogClosed)


def test_closed_handle_reports_closed(path: Path) -> None:
    log = LmdbEventLog.create(path, META)
    log.close()
    assert log.closed
    with pytest.raises(LogClosed, match="is closed"):
        _ = log.next_seq


# -- the map ---------------------------------------------------------------------------------


def test_map_grows_from_tiny(path: Path) -> None:
    with LmdbEventLog.create(path, META, durable=False, map_size=64 * 1024) as log:
        for start in range(0, 3000, 50):
            log.append(envelopes(start, 50))
        log.append(envelopes(3000, 2000, pad="x" * 100))  # one batch far larger than the map
        assert log.next_seq == 5000
        assert list(log.read()) == envelopes(0, 3000) + envelopes(3000, 2000, pad="x" * 100)
    with LmdbEventLog.open(path, writable=True, durable=False) as log:  # reopen adopts the size
        log.append(envelopes(5000, 1000))
        assert log.verify().records == 6000


READER = """
import sys
import threading
from stores.lmdb_log import LmdbEventLog
log = LmdbEventLog.open(sys.argv[1])
for line in sys.stdin:
    events = list(log.read())
    seqs_ok = [e.seq for e in events] == list(range(len(events)))
    print(log.next_seq, len(events), seqs_ok, log.verify().ok, flush=True)
log.close()
"""


def test_reader_in_other_process_sees_later_appends_past_map_growth(path: Path) -> None:
    with LmdbEventLog.create(path, META, durable=False, map_size=64 * 1024) as writer:
        writer.append(envelopes(0, 10))
        reader = python(READER.replace("sys.argv[1]", repr(str(path))))
        assert reader.stdin is not None and reader.stdout is not None
        reader.stdin.write("read\n")
        reader.stdin.flush()
        assert reader.stdout.readline().split() == ["10", "10", "True", "True"]
        for start in range(10, 4010, 100):  # grows the map several times under the reader
            writer.append(envelopes(start, 100, pad="y" * 50))
        reader.stdin.write("read\n")
        reader.stdin.flush()
        assert reader.stdout.readline().split() == ["4010", "4010", "True", "True"]
        _, err = reader.communicate(timeout=30)
    assert reader.returncode == 0, err


def test_reader_opened_first_in_process_then_writer(path: Path) -> None:
    LmdbEventLog.create(path, META, map_size=64 * 1024).close()
    with LmdbEventLog.open(path) as reader:
        with LmdbEventLog.open(path, writable=True, durable=False) as writer:
            writer.append(envelopes(0, 2000))  # grows the map shared with the reader
            assert reader.next_seq == 2000
            assert list(reader.read(1990)) == envelopes(1990, 10)
        assert reader.next_seq == 2000


# -- format, durability ----------------------------------------------------------------------


def sealed(key: bytes, payload: bytes) -> bytes:
    """A sealed meta or snapshot value: CRC32 over key + payload, then the payload."""
    return zlib.crc32(payload, zlib.crc32(key)).to_bytes(4, "big") + payload


def sealed_record(key: bytes, count: int, payload: bytes) -> bytes:
    """A sealed events record: CRC32 over key + count + payload, the count, the payload."""
    head = count.to_bytes(4, "big")
    return (
        zlib.crc32(payload, zlib.crc32(head, zlib.crc32(key))).to_bytes(4, "big") + head + payload
    )


def append_one_by_one(log: LmdbEventLog, envs: list[Envelope[Event]]) -> None:
    """One record per event (one append per event), so a record is a seq."""
    for env in envs:
        log.append([env])


def test_newer_log_format_is_refused(path: Path) -> None:
    LmdbEventLog.create(path, META).close()
    assert raw_get(path, b"meta", b"log_format") == sealed(
        b"log_format", msgspec.msgpack.encode(LOG_FORMAT)
    )
    raw_put(path, b"meta", b"log_format", sealed(b"log_format", msgspec.msgpack.encode(99)))
    with pytest.raises(SchemaTooNew, match="format 99"):
        LmdbEventLog.open(path)
    with pytest.raises(SchemaTooNew):
        LmdbEventLog.open(path, writable=True)
    raw_put(path, b"meta", b"log_format", sealed(b"log_format", msgspec.msgpack.encode(1)))
    with LmdbEventLog.open(path, writable=True) as log:  # the refused writer left no lock
        log.append(envelopes(0, 1))


def test_log_without_format_record_is_not_a_log(path: Path) -> None:
    LmdbEventLog.create(path, META).close()
    raw_put(path, b"meta", b"log_format", None)
    with pytest.raises(LogError, match="no coevo event log"):
        LmdbEventLog.open(path)


def test_not_durable_log_works_and_persists(path: Path) -> None:
    with LmdbEventLog.create(path, META, durable=False) as log:
        log.append(envelopes(0, 1000))
        log.append(envelopes(1000, 1000))
    with LmdbEventLog.open(path, writable=True, durable=False) as log:
        log.append(envelopes(2000, 5))
    with LmdbEventLog.open(path) as log:
        assert list(log.read()) == envelopes(0, 2005)


def test_writers_of_either_durability_share_a_readers_env(path: Path) -> None:
    """A reader keeps the environment of a non-durable writer open; a durable writer joins it
    (and syncs each commit itself), then a non-durable one. Durability itself needs a power cut
    to observe; this checks that commits made through the shared environment all land."""
    with LmdbEventLog.create(path, META, durable=False) as writer:
        writer.append(envelopes(0, 3))
        reader = LmdbEventLog.open(path)
    for durable, start in ((True, 3), (False, 6)):
        with LmdbEventLog.open(path, writable=True, durable=durable) as writer:
            writer.append(envelopes(start, 3))
            assert reader.next_seq == start + 3
    assert list(reader.read()) == envelopes(0, 9)
    reader.close()


# -- corruption ------------------------------------------------------------------------------


def test_verify_names_first_corrupted_record(path: Path) -> None:
    with LmdbEventLog.create(path, META) as log:
        append_one_by_one(log, envelopes(0, 20))
    key = (7).to_bytes(8, "big")
    value = bytearray(raw_get(path, b"events", key))
    value[-1] ^= 0x40
    raw_put(path, b"events", key, bytes(value))
    with LmdbEventLog.open(path) as log:
        report = log.verify()
        assert (report.ok, report.first_bad, report.records) == (False, 7, 7)
        assert "seq 7" in report.error and "checksum" in report.error
        seen: list[int] = []
        with pytest.raises(LogCorrupted) as info:
            seen.extend(env.seq for env in log.read())
        assert info.value.seq == 7
        assert seen == list(range(7))  # every good record before it was delivered


def test_missing_record_is_a_gap(path: Path) -> None:
    with LmdbEventLog.create(path, META) as log:
        append_one_by_one(log, envelopes(0, 10))
    raw_put(path, b"events", (4).to_bytes(8, "big"), None)
    with LmdbEventLog.open(path) as log:
        report = log.verify()
        assert (report.ok, report.first_bad) == (False, 4)
        assert "record missing" in report.error
        with pytest.raises(LogCorrupted, match="record missing") as info:
            list(log.read(4, 6))
        assert info.value.seq == 4
        assert list(log.read(5)) == envelopes(5, 5)


def test_record_under_wrong_key_is_corrupted(path: Path) -> None:
    """A checksummed record moved under another key fails: the CRC covers the key."""
    with LmdbEventLog.create(path, META) as log:
        append_one_by_one(log, envelopes(0, 3))
    raw_put(path, b"events", (1).to_bytes(8, "big"), raw_get(path, b"events", bytes(8)))
    with LmdbEventLog.open(path) as log:
        assert log.verify().first_bad == 1


def test_record_of_unknown_event_kind_is_reported(path: Path) -> None:
    with LmdbEventLog.create(path, META) as log:
        log.append(envelopes(0, 2))
        log.append([Envelope(seq=2, run="unit", t=0, actor="runtime", event=RunStopped(reason=""))])
    key = (2).to_bytes(8, "big")
    payload = raw_get(path, b"events", key)[8:].replace(b"run_stopped", b"run_stoppez")
    raw_put(path, b"events", key, sealed_record(key, 1, payload))
    with LmdbEventLog.open(path) as log:
        report = log.verify()
        assert (report.ok, report.first_bad) == (False, 2)
        with pytest.raises(SchemaTooNew, match="run_stoppez"):
            list(log.read())


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda payload: payload + b"\x00", "not an array of envelopes"),  # one part, and more
        (lambda payload: b"\x91\x05", "part is not an array of envelopes"),
        (lambda payload: b"\x92" + payload[1:], "not an array of parts"),  # 2 parts, 1 there
        (lambda payload: b"\xc1", "not an array of parts"),
    ],
    ids=["trailing", "part-not-array", "parts-missing", "not-msgpack"],
)
def test_record_of_bad_parts_is_corrupted(
    path: Path, damage: Callable[[bytes], bytes], message: str
) -> None:
    """A record resealed (its CRC holds) around a payload that is not an array of parts of
    envelopes: a record of one part (read without decoding its array of parts) too."""
    with LmdbEventLog.create(path, META) as log:
        log.append(envelopes(0, 2))
        log.append(envelopes(2, 3))
    key = (2).to_bytes(8, "big")
    payload = raw_get(path, b"events", key)[8:]
    assert payload[0] == 0x91  # one part
    raw_put(path, b"events", key, sealed_record(key, 3, damage(payload)))
    with LmdbEventLog.open(path) as log:
        assert log.verify().first_bad == 2
        with pytest.raises(LogCorrupted, match=message) as info:
            list(log.read(0, 5))
        assert info.value.seq == 2


def test_record_whose_parts_do_not_add_up_is_corrupted(path: Path) -> None:
    with LmdbEventLog.create(path, META) as log:
        log.append(envelopes(0, 2))
        log.append(envelopes(2, 3))
    key = (2).to_bytes(8, "big")
    raw_put(path, b"events", key, sealed_record(key, 4, raw_get(path, b"events", key)[8:]))
    with LmdbEventLog.open(path) as log:
        assert log.verify().first_bad == 2
        with pytest.raises(LogCorrupted, match="holds 3 events, its header says 4") as info:
            list(log.read(0, 5))
        assert info.value.seq == 2


def test_records_hold_their_batch_in_parts(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lmdb_records, "RECORD_PART", 3)
    monkeypatch.setattr(lmdb_log, "READ_CHUNK", 4)
    with LmdbEventLog.create(path, META, durable=False) as log:
        log.append(envelopes(0, 10))
        log.append(envelopes(10, 5))
    parts = msgspec.msgpack.decode(raw_get(path, b"events", bytes(8))[8:])
    assert [len(part) for part in parts] == [3, 3, 3, 1]
    with LmdbEventLog.open(path) as log:
        for start in range(16):
            for stop in range(start, 17):
                chunks = list(log.read_chunks(start, stop))
                assert all(0 < len(chunk) <= 3 for chunk in chunks)
                assert [env for chunk in chunks for env in chunk] == envelopes(0, 15)[start:stop]


def test_format_1_log_is_read_and_appended_to_in_its_format(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log written before records were split into parts (format 1: a record is one array of
    envelopes) reads as before and keeps that layout when a newer writer appends to it."""
    monkeypatch.setattr(lmdb_log, "LOG_FORMAT", 1)
    with LmdbEventLog.create(path, META, durable=False) as log:
        log.append(envelopes(0, 600))
    monkeypatch.undo()
    with LmdbEventLog.open(path, writable=True, durable=False) as log:
        log.append(envelopes(600, 5))
        assert list(log.read()) == envelopes(0, 605) and log.verify().ok
    for first, count in ((0, 600), (600, 5)):
        stored = msgspec.msgpack.decode(raw_get(path, b"events", first.to_bytes(8, "big"))[8:])
        assert [env[0] for env in stored] == list(range(first, first + count))  # envelopes


def test_corrupted_snapshot_and_meta_are_reported(path: Path) -> None:
    with LmdbEventLog.create(path, META) as log:
        log.append(envelopes(0, 5))
        log.put_snapshot("proj", 3, b"state")
    key = b"proj\x00" + (3).to_bytes(8, "big")
    stored = raw_get(path, b"snapshots", key)
    raw_put(path, b"snapshots", key, bytes([stored[0] ^ 0xFF]) + stored[1:])
    raw_put(path, b"meta", b"run", raw_get(path, b"meta", b"run")[:-1])
    with LmdbEventLog.open(path) as log:
        with pytest.raises(LogCorrupted, match="snapshot 'proj'") as info:
            log.get_snapshot("proj", 4)
        assert info.value.seq == 3
        with pytest.raises(LogError, match="fails its checksum"):
            log.read_meta()


@pytest.mark.parametrize("name", ["a\x00b", "x" * 401])
def test_bad_snapshot_names_are_refused(path: Path, name: str) -> None:
    with LmdbEventLog.create(path, META) as log:
        log.append(envelopes(0, 1))
        with pytest.raises(ValueError, match="snapshot name"):
            log.put_snapshot(name, 0, b"")


def test_reads_span_many_chunks(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lmdb_log, "READ_CHUNK", 7)
    with LmdbEventLog.create(path, META, durable=False) as log:
        log.append(envelopes(0, 100))
        assert list(log.read()) == envelopes(0, 100)
        assert list(log.read(13, 71)) == envelopes(13, 58)
        reading = log.read(95)
        assert next(reading).seq == 95
        log.append(envelopes(100, 10))  # a read under way ends where the log ended
        assert [env.seq for env in reading] == [96, 97, 98, 99]


@pytest.mark.timeout(60, method="thread")  # a starved abort blocks in C
def test_threads_read_while_the_map_grows(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Remaps wait for the other threads' read transactions (no read sees a vanished map), and
    aborted writes (conflicts, full map) do not starve behind two busy readers."""
    monkeypatch.setattr(lmdb_log, "READ_CHUNK", 16)
    writer = LmdbEventLog.create(path, META, durable=False, map_size=64 * 1024)
    readers = [LmdbEventLog.open(path) for _ in range(2)]
    errors: list[BaseException] = []
    done = threading.Event()

    def read_until_done(reader: LmdbEventLog) -> None:
        try:
            while not done.is_set():
                seqs = [env.seq for env in reader.read()]
                assert seqs == list(range(len(seqs)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read_until_done, args=(r,)) for r in readers]
    for thread in threads:
        thread.start()
    try:
        for start in range(0, 2000, 40):
            writer.append(envelopes(start, 40, pad="z" * 40))
            with pytest.raises(SequenceConflict):
                writer.append(envelopes(start, 1))
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert errors == []
    assert [list(r.read()) for r in readers] == [envelopes(0, 2000, pad="z" * 40)] * 2
    for log in (writer, *readers):
        log.close()


class SeqSpy:
    """A projection that remembers every seq it folded."""

    name = "spy"

    def initial(self) -> list[int]:
        return []

    def evolve_many(self, state: list[int], envs: object) -> list[int]:
        return [*state, *(env.seq for env in envs)]  # type: ignore[attr-defined]


class CallSpy(SeqSpy):
    """Remembers the seqs of each call to the fold."""

    name = "calls"

    def evolve_many(self, state: list[int], envs: object) -> list[int]:
        return [*state, [env.seq for env in envs]]  # type: ignore[attr-defined, list-item]


def test_verify_folds_small_records_joined(path: Path) -> None:
    """One record per event, as a lightly loaded run writes: verify calls the folds with the
    records joined (up to JOIN_CHUNKS envelopes), not once per record."""
    from engine.eventlog import JOIN_CHUNKS
    from engine.projection import Fold
    from engine.replay import verify_log

    with LmdbEventLog.create(path, META, durable=False) as log:
        append_one_by_one(log, envelopes(0, 300))
    spy = CallSpy()
    folded: list[Fold] = []
    real_apply = Fold.apply_all

    def spy_apply(self: Fold, envs: list[Envelope[Event]]) -> None:
        folded.append(self)
        real_apply(self, envs)

    with pytest.MonkeyPatch.context() as patch, LmdbEventLog.open(path) as log:
        patch.setattr(Fold, "apply_all", spy_apply)
        assert verify_log(log, [spy]).ok
    calls: list[list[int]] = folded[-1].states["calls"]
    assert [seq for call in calls for seq in call] == list(range(300))
    assert [len(call) for call in calls] == [JOIN_CHUNKS] * (300 // JOIN_CHUNKS) + [
        300 % JOIN_CHUNKS
    ]


@pytest.mark.parametrize("bad", [0, 7, 19])
def test_verify_never_folds_a_damaged_record(path: Path, bad: int) -> None:
    from engine.replay import verify_log

    with LmdbEventLog.create(path, META) as log:
        append_one_by_one(log, envelopes(0, 20))
    key = bad.to_bytes(8, "big")
    value = bytearray(raw_get(path, b"events", key))
    value[-2] ^= 0x01
    raw_put(path, b"events", key, bytes(value))
    spy = SeqSpy()
    with LmdbEventLog.open(path) as log:
        result = verify_log(log, [spy])
    assert (result.ok, result.first_bad_seq, result.events) == (False, bad, bad)
    assert f"corrupted at seq {bad}: checksum mismatch" in result.error


def test_verify_folds_exactly_the_records_before_the_damage(path: Path) -> None:
    from engine.projection import Fold
    from engine.replay import verify_log

    with LmdbEventLog.create(path, META) as log:
        append_one_by_one(log, envelopes(0, 12))
    key = (5).to_bytes(8, "big")
    raw_put(path, b"events", key, raw_get(path, b"events", key)[:-3])
    folded: list[Fold] = []
    real_apply = Fold.apply_all

    def spy_apply(self: Fold, envs: list[Envelope[Event]]) -> None:
        folded.append(self)
        real_apply(self, envs)

    with pytest.MonkeyPatch.context() as patch, LmdbEventLog.open(path) as log:
        patch.setattr(Fold, "apply_all", spy_apply)
        result = verify_log(log, [SeqSpy()])
    assert not result.ok and result.first_bad_seq == 5
    assert folded[-1].states["spy"] == [0, 1, 2, 3, 4]


def test_damaged_lmdb_pages_are_reported_at_the_seq_reached(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LMDB's own errors (MDB_CORRUPTED, MDB_PAGE_NOTFOUND) become LogCorrupted at the first
    seq not yet read; the good records before are delivered first."""
    with LmdbEventLog.create(path, META) as log:
        append_one_by_one(log, envelopes(0, 10))
    damaged = (4).to_bytes(8, "big")  # the page holding records 4.. is unreadable

    class Cursor:
        def __init__(self, real: lmdb.Cursor) -> None:
            self.real = real

        def __getattr__(self, name: str) -> object:
            return getattr(self.real, name)

        def _landed(self, moved: bool) -> bool:
            if moved and bytes(self.real.key()) >= damaged:
                raise lmdb.CorruptedError("mdb_cursor_get: MDB_CORRUPTED: page was wrong type")
            return moved

        def next(self) -> bool:
            return self._landed(self.real.next())

        def set_range(self, key: bytes) -> bool:
            return self._landed(self.real.set_range(key))

    class Txn:
        def __init__(self, real: lmdb.Transaction) -> None:
            self.real = real

        def cursor(self, db: object) -> Cursor:
            return Cursor(self.real.cursor(db))

    real_read_parts = LmdbEventLog._read_parts
    monkeypatch.setattr(
        LmdbEventLog,
        "_read_parts",
        lambda self, txn, first, end: real_read_parts(self, Txn(txn), first, end),
    )
    seen: list[int] = []
    log = LmdbEventLog.open(path)
    with pytest.raises(LogCorrupted, match="LMDB cannot read the log's pages") as info:
        seen.extend(env.seq for env in log.read(0, 10))
    log.close()
    assert seen == [0, 1, 2, 3]
    assert info.value.seq == 4


def test_a_truncated_data_file_is_refused_before_it_is_mapped(path: Path) -> None:
    with LmdbEventLog.create(path, META) as log:
        log.append(envelopes(0, 2000))
    size = (path / "data.mdb").stat().st_size
    os.truncate(path / "data.mdb", size - 4096)
    for writable in (False, True, True):  # a refused writer leaves no lock behind
        with pytest.raises(LogError, match=r"data\.mdb has \d+ bytes but its last commit uses"):
            LmdbEventLog.open(path, writable=writable)


# -- a writer process killed ---------------------------------------------------------------------

KILLED_WRITER = """
import random, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_lmdb_log import META, envelopes
from stores import lmdb_records
from stores.lmdb_log import LmdbEventLog

lmdb_records.RECORD_PART = 3  # every batch of more than 3 events is a record of several parts
path, durable, hold = Path({path!r}), {durable!r}, {hold!r}
log = (LmdbEventLog.open(path, writable=True, durable=durable) if (path / "data.mdb").exists()
       else LmdbEventLog.create(path, META, durable=durable, map_size=64 * 1024))
if hold:  # stay inside the next write transaction, its record put, until killed
    real = log._put_all
    def held(txn, puts):
        real(txn, puts)
        print("inside", flush=True)
        sys.stdin.readline()
    log._put_all = held
rng = random.Random(log.next_seq)
while True:
    start = log.next_seq
    log.append(envelopes(start, rng.randrange(1, 40), pad="p" * rng.randrange(200)))
    print(log.next_seq, flush=True)
"""


def kill_writer(path: Path, *, durable: bool, commits: int, hold: bool = False) -> list[int]:
    """Run a writer process that appends batches of random sizes (records of several parts)
    and SIGKILL it after ``commits`` commits (``hold``: while it is inside the next write
    transaction, its record put). Returns the log's length after each commit it reported."""
    code = KILLED_WRITER.format(
        tests=str(Path(__file__).parent), path=str(path), durable=durable, hold=hold
    )
    child = python(code)
    assert child.stdout is not None
    reported: list[int] = []
    while len(reported) < commits:
        line = child.stdout.readline()
        assert line, child.communicate()[1]
        if line.strip() == "inside":
            break
        reported.append(int(line))
    child.kill()
    _, err = child.communicate(timeout=30)
    assert child.returncode == -9, err
    return reported


@pytest.mark.parametrize("durable", [True, False])
def test_a_writer_killed_at_any_moment_leaves_whole_commits(path: Path, durable: bool) -> None:
    """SIGKILL of a writer between or during its commits (it is appending as fast as it can)
    and inside an open write transaction: the log holds whole records up to a commit at or
    after the last one reported, each exactly as written, and verifies; the next writer
    appends after it."""
    boundaries: set[int] = {0}
    for round_, commits in enumerate([5, 1, 12, 3, 30, 7]):
        hold = round_ % 3 == 1
        reported = kill_writer(path, durable=durable, commits=commits, hold=hold)
        boundaries.update(reported)
        with LmdbEventLog.open(path) as log:
            end = log.next_seq
            got = list(log.read())
            assert log.verify().ok
        if hold:  # killed inside its first transaction: nothing of it was committed
            assert reported == [] and end == max(boundaries)
        else:  # every reported commit is there, and perhaps the one under way
            assert end >= max(boundaries)
        assert [env.seq for env in got] == list(range(end))
        for env in got:  # as written: every field derives from the seq
            assert isinstance(env.event, ActorStarted) and env.t == env.event.seed == env.seq
            assert env.event.actor.startswith(f"worker-{env.seq}")
        boundaries.add(end)
    with LmdbEventLog.open(path, writable=True) as log:
        log.append(envelopes(end, 2))
        assert log.next_seq == end + 2 and log.verify().ok


def test_the_lock_file_is_allocated_before_lmdb_maps_it(tmp_path: Path) -> None:
    """LMDB made its lock file sparse and mapped it: on a full disk, touching it killed every
    read command with SIGBUS (a run copied onto a full disk). Its blocks are allocated first."""
    path = tmp_path / "log"
    with LmdbEventLog.create(path, META):
        pass
    (path / "lock.mdb").unlink()  # a copy has none
    with LmdbEventLog.open(path):
        st = os.stat(path / "lock.mdb")
        assert st.st_size == 8192 and st.st_blocks * 512 >= 8192


def test_a_sparse_lock_file_left_by_a_dead_process_is_allocated(tmp_path: Path) -> None:
    """A process killed by SIGBUS touching a sparse lock file left it behind with its length
    and no block: every later open died the same way. It gets its blocks; its length stays."""
    path = tmp_path / "log"
    with LmdbEventLog.create(path, META):
        pass
    lock = path / "lock.mdb"
    lock.unlink()
    with lock.open("wb") as f:
        f.truncate(8192)  # what LMDB's ftruncate leaves: a length, no block
    assert os.stat(lock).st_blocks == 0
    with LmdbEventLog.open(path):
        st = os.stat(lock)
        assert st.st_size == 8192 and st.st_blocks * 512 >= 8192


def test_the_fact_index_allocates_its_lock_file(tmp_path: Path) -> None:
    """The audit index's LMDB lock file was sparse too: ``coevo audit`` and ``serve`` died
    of SIGBUS on a full disk. It is allocated before LMDB maps it."""
    from stores.fact_index import LmdbFactIndex

    index = LmdbFactIndex.open(tmp_path / "audit", "run")
    try:
        st = os.stat(tmp_path / "audit" / "lock.mdb")
        assert st.st_blocks * 512 >= st.st_size > 0
    finally:
        index.close()


def test_no_room_for_the_lock_file_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log"
    with LmdbEventLog.create(path, META):
        pass
    (path / "lock.mdb").unlink()

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(LogError, match=r"no room for its lock file lock\.mdb \(No space left"):
        LmdbEventLog.open(path)
    assert not (path / "lock.mdb").exists()  # nothing half made is left


def test_a_run_whose_lock_mdb_this_user_cannot_write_is_read_once_nobody_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's run, readable by all, failed every reading command with "Permission
    denied" (LMDB's reader table, ``lock.mdb``, wants writing). With nobody writing the log
    it is read without that table; while its writer holds it, the error names the file."""
    import stores.lmdb_env as lmdb_env

    log = LmdbEventLog.create(tmp_path / "log", META, durable=False)
    log.append(envelopes(0, 5))
    log.close()
    real = lmdb.open

    def open_as_another_user(path: str, **kwargs: object) -> lmdb.Environment:
        if kwargs.get("lock", True):  # as LMDB does without write access to lock.mdb
            raise lmdb.Error(f"{path}: Permission denied")
        return real(path, **kwargs)

    monkeypatch.setattr(lmdb_env.lmdb, "open", open_as_another_user)
    reader = LmdbEventLog.open(tmp_path / "log")
    try:
        assert [e.seq for e in reader.read(0, 5)] == list(range(5))
    finally:
        reader.close()
    monkeypatch.setattr(lmdb_env, "writer_alive", lambda _path: True)
    with pytest.raises(LogError, match=r"needs write access to .*lock\.mdb"):
        LmdbEventLog.open(tmp_path / "log")


def test_a_bad_envelope_inside_a_record_says_where_the_events_still_read(path: Path) -> None:
    """A record whose second envelope claims another seq hid the first one too (a part is
    decoded whole): the hint "the events before it still read: --to SEQ" named the bad
    envelope's seq, and that command failed the same way."""
    from engine.eventlog import EncodedBatch
    from engine.events import Codec
    from engine.replay import verify_log
    from scenarios.cli.common import torn_copy_hint

    with LmdbEventLog.create(path, META, durable=False) as log:
        log.append(envelopes(0, 3))
        good = envelopes(3, 2)
        bad = [good[0], msgspec.structs.replace(good[1], seq=5)]
        log.append_encoded(EncodedBatch(3, 2, lmdb_records.encode_parts(Codec(), bad, LOG_FORMAT)))
        with pytest.raises(LogCorrupted) as info:
            list(log.read())
        assert (info.value.seq, info.value.before) == (4, 3)
        assert "record claims seq 5" in str(info.value)
        assert "coevo log RUN --to 3)" in torn_copy_hint(info.value)
        assert list(log.read(0, 3)) == envelopes(0, 3)
        result = verify_log(log, [])
        assert (result.ok, result.damaged, result.first_bad_seq, result.readable) == (
            False,
            True,
            4,
            3,
        )


@pytest.mark.parametrize(("errno_", "code"), [(errno.EACCES, 2), (errno.EROFS, 1)])
def test_a_log_this_user_may_not_write_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_: int, code: int
) -> None:
    """``coevo resume`` of a run this user may not write exited 1, as for a failed write,
    where every other path this user may not use exits 2; a read-only file system stays 1."""
    from stores import lmdb_env

    def refused(*args: object, **kwargs: object) -> int:
        raise (PermissionError if errno_ == errno.EACCES else OSError)(
            errno_, os.strerror(errno_), str(tmp_path)
        )

    monkeypatch.setattr(lmdb_env.os, "open", refused)
    with pytest.raises(LogError, match=r"cannot open the event log at .* for writing") as caught:
        lmdb_env._lock_file(tmp_path)  # pyright: ignore[reportPrivateUsage]
    assert caught.value.exit_code == code


def test_a_log_file_this_user_may_not_write_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LMDB's own open refused (``data.mdb`` or ``lock.mdb`` not writable by this user, the
    directory and ``writer.lock`` writable): exit 1, where every path this user may not use
    exits 2."""
    from stores import lmdb_env

    def refused(path: str, **kwargs: object) -> object:
        raise lmdb.Error(f"{path}: {os.strerror(errno.EACCES)}")

    meta = new_run_meta("r", scenario_name="s", seed=0, coevo_version="test")
    LmdbEventLog.create(tmp_path / "log", meta, durable=False).close()
    monkeypatch.setattr(lmdb_env.lmdb, "open", refused)
    with pytest.raises(LogError, match="Permission denied") as caught:
        LmdbEventLog.open(tmp_path / "log")
    assert caught.value.exit_code == 2
