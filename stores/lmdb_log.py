"""The event log on LMDB: one directory per run, one writer, any number of readers.

Layout of a log directory:

- ``data.mdb`` / ``lock.mdb``: the LMDB environment with three sub-databases:
  ``events`` (one record per appended batch; key: the batch's first seq, 8-byte big-endian),
  ``meta`` (the run metadata and the log format) and ``snapshots`` (key: name, NUL, 8-byte
  big-endian ``upto``).
- ``writer.lock``: the writer's exclusive ``flock``; it dies with the writer's process.

How a batch is stored (one CRC-sealed record of parts, read a part at a time) is in
:mod:`stores.lmdb_records`. A flipped byte is reported as :class:`LogCorrupted` naming the
first seq of its record, never decoded into a wrong event; the records around it still read.

The environment plumbing (one shared environment per process, safe remaps, the writer lock)
is in :mod:`stores.lmdb_env`. The map starts small and doubles on ``MapFullError``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar, overload

import lmdb
import msgspec

from engine.errors import (
    LogClosed,
    LogCorrupted,
    LogDamaged,
    LogError,
    LogWriteFailed,
    SchemaTooNew,
    SequenceConflict,
)
from engine.eventlog import (
    LOG_FORMAT,
    EncodedBatch,
    RunMeta,
    Snapshot,
    VerifyReport,
    check_batch,
    check_snapshot,
)
from engine.events import Codec, Envelope, Event
from stores.lmdb_env import (
    DATA_FILE,
    ENV_LOCK_FILE,
    SharedEnv,
    WriterLock,
    is_blank,
    lock_writer,
)
from stores.lmdb_records import (
    MAX_SEQ,
    SEQ,
    encode_parts,
    events_end,
    find_snapshot,
    record_parts,
    seal,
    seal_record,
    seek_record,
    snapshot_prefix,
    unseal,
)

if TYPE_CHECKING:
    from lmdb import _Database as _Db

__all__ = ["DEFAULT_MAP_SIZE", "READ_CHUNK", "LmdbEventLog"]

DEFAULT_MAP_SIZE = 64 * 1024 * 1024
"""Initial map size of a new log; the map doubles whenever it is full."""

READ_CHUNK = 256
"""Events taken per read transaction (rounded up to whole parts): short transactions."""

_PAGE = 4096
_META_RUN = b"run"
_META_FORMAT = b"log_format"
_META_LOG_ID = b"log_id"
_META_DECODER = msgspec.msgpack.Decoder(RunMeta)
_ENCODER = msgspec.msgpack.Encoder()

T = TypeVar("T")
Txn = lmdb.Transaction  # values are bytes, or views of the map where buffers=True
_Put = tuple["_Db", bytes, bytes | bytearray]  # a database, a key and a value to store


class LmdbEventLog:
    """The :class:`~engine.eventlog.EventLog` on LMDB. Build with :meth:`create` or :meth:`open`.

    A writable handle holds the writer lock until :meth:`close`; a read-only one never locks and
    always sees the latest committed state. Handles are usable from several threads. Handles of
    one process share the environment's fsync setting: a durable writer joining one opened
    without fsync syncs after each commit; a non-durable one joining a syncing one syncs too.
    """

    def __init__(
        self, path: Path, shared: SharedEnv, lock: WriterLock | None, durable: bool, codec: Codec
    ) -> None:
        self._path = path
        self._shared = shared
        self._lock = lock
        self._sync_after_commit = durable and not shared.synced
        self._codec = codec
        self._closed = False
        self._appended = 0  # a writer's next seq: it alone appends, under the writer lock
        self._format = LOG_FORMAT  # of the log's records (an older log keeps its own)
        self._log_id: str | None = None  # read once: made at creation, never changed

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        meta: RunMeta,
        *,
        durable: bool = True,
        map_size: int = DEFAULT_MAP_SIZE,
        codec: Codec | None = None,
    ) -> LmdbEventLog:
        """Create a new log in directory ``path`` (made if missing) and open it as the writer.

        The databases and the metadata are stored in one transaction: a creation interrupted
        (a process killed) leaves a blank data file or a whole log, never a log without its
        metadata. A blank data file (no commit, :func:`~stores.lmdb_env.is_blank`) is
        replaced.

        Args:
            path: the log directory; it must not hold a log yet (a blank data file may be
                there).
            meta: the run metadata, stored with the current :data:`LOG_FORMAT`.
            durable: fsync every commit; False survives a process kill, not a power loss.
            map_size: initial map size in bytes (rounded up to 4 KiB); it grows as needed.
            codec: the codec to share, if any.

        Raises:
            ValueError: ``map_size`` is not positive.
            LogError: a log already exists at ``path``, or LMDB cannot create it there.
            LogLocked: another writer holds the directory's lock.
        """
        if map_size <= 0:
            raise ValueError(f"map_size must be positive, got {map_size}")
        log_dir = Path(path)
        if (log_dir / DATA_FILE).exists() and not is_blank(log_dir):
            raise LogError(f"an event log already exists at {log_dir}")
        log_dir.mkdir(parents=True, exist_ok=True)
        size = -(-map_size // _PAGE) * _PAGE
        return cls._assemble(log_dir, meta, True, durable, codec or Codec(), size)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        writable: bool = False,
        durable: bool = True,
        codec: Codec | None = None,
    ) -> LmdbEventLog:
        """Open an existing log, as a reader or (``writable=True``) as its one writer.

        Args:
            path: the log directory.
            writable: take the writer lock and allow appends.
            durable: fsync every commit (writers only).
            codec: the codec to share, if any.

        Raises:
            LogError: ``path`` holds no coevo event log.
            LogLocked: ``writable`` and another writer holds the lock.
            SchemaTooNew: the log's format is newer than this coevo's :data:`LOG_FORMAT`.
        """
        log_dir = Path(path)
        if not (log_dir / DATA_FILE).is_file():
            raise LogError(f"no coevo event log at {log_dir}")
        return cls._assemble(log_dir, None, writable, durable, codec or Codec(), 0)

    @classmethod
    def _assemble(
        cls,
        path: Path,
        meta: RunMeta | None,
        writable: bool,
        durable: bool,
        codec: Codec,
        size: int,
    ) -> LmdbEventLog:
        """Lock (writers), share the environment, then create the log with ``meta`` or (None)
        check the format of the existing one. Nothing stays locked or open if this raises."""
        lock = lock_writer(path) if writable else None
        try:
            init = None
            if meta is not None:
                init = partial(_init_meta, meta=meta)
                if (path / DATA_FILE).exists():
                    if not is_blank(path):  # lost a race to create
                        raise LogError(f"an event log already exists at {path}")
                    for name in (DATA_FILE, ENV_LOCK_FILE):  # a creation killed before it committed
                        (path / name).unlink(missing_ok=True)
            shared = SharedEnv.acquire(path, meta is not None, writable, size, durable, init)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        log = cls(path, shared, lock, durable, codec)
        try:
            if meta is None:
                log._check_format()
            if writable:
                log._appended = log.next_seq
        except BaseException:
            log.close()
            raise
        return log

    @property
    def path(self) -> Path:
        """The log directory."""
        return self._path

    @property
    def writable(self) -> bool:
        """Whether this handle holds the writer lock."""
        return self._lock is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def next_seq(self) -> int:
        """Sequence number of the next event, from the latest committed state.

        Raises:
            LogCorrupted: the last record fails its checksum.
            LogClosed: the handle is closed.
        """
        self._check_open()
        return self._read_txn(lambda txn: events_end(txn.cursor(self._shared.events)))

    def append(
        self, envelopes: Sequence[Envelope[Event]], *, snapshots: Sequence[Snapshot] = ()
    ) -> None:
        """Append a batch as one record, and any snapshots, in one write transaction: all of
        it, or none of it (``append_encoded(encode(envelopes), snapshots=snapshots)``).

        Args:
            envelopes: the batch.
            snapshots: ``(name, upto, data)`` stored as :meth:`put_snapshot` does (``upto`` may
                be a seq of the batch).

        Raises:
            SequenceConflict: the batch does not continue the committed log.
            ValueError: a snapshot name contains NUL or is longer than 400 bytes.
            LogError: a snapshot's ``upto`` is not in the log after the batch, or the handle is
                read-only.
            LogClosed: the handle is closed.
        """
        self._check_writable()
        self.append_encoded(self.encode(envelopes), snapshots=snapshots)

    def encode(self, envelopes: Sequence[Envelope[Event]]) -> EncodedBatch:
        """The msgspec work of an append (a record's parts), for :meth:`append_encoded`; no
        transaction, any thread.

        Raises:
            SequenceConflict: the envelopes' seqs are not consecutive.
        """
        first = envelopes[0].seq if envelopes else 0
        check_batch(first, envelopes)
        parts = encode_parts(self._codec, envelopes, self._format) if envelopes else []
        return EncodedBatch(first, len(envelopes), parts)

    def append_encoded(self, batch: EncodedBatch, *, snapshots: Sequence[Snapshot] = ()) -> None:
        """Append a batch from :meth:`encode` as one record, and any snapshots, in one write
        transaction (see :meth:`append`).

        Raises:
            SequenceConflict: the batch does not start at the log's next seq.
            ValueError: a snapshot name contains NUL or is longer than 400 bytes.
            LogError: a snapshot's ``upto`` is not in the log after the batch, or the handle is
                read-only.
            LogClosed: the handle is closed.
        """
        self._check_writable()
        if batch.count and batch.first != self._appended:
            raise SequenceConflict(self._appended, batch.first)
        end = self._appended + batch.count
        puts: list[_Put] = [self._snapshot_put(n, upto, data, end) for n, upto, data in snapshots]
        if batch.count:
            key = SEQ.pack(batch.first)
            puts.insert(0, (self._shared.events, key, seal_record(key, batch.count, batch.pieces)))
        if puts:
            self._write(partial(self._put_all, puts=puts), at=batch.first if batch.count else None)
        self._appended = end

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Envelope[Event]]:
        """Yield committed envelopes with ``start <= seq < stop`` in order.

        ``stop=None`` means the log's end when iteration starts. Records are read in short
        transactions of about :data:`READ_CHUNK` events; none is held while the caller runs.

        Raises:
            LogCorrupted: a record fails its checksum, does not decode, or is missing.
            SchemaTooNew: a record's event is newer than this coevo knows.
            LogClosed: the handle is closed.
        """
        for chunk in self.read_chunks(start, stop):
            yield from chunk

    def read_chunks(
        self, start: int = 0, stop: int | None = None
    ) -> Iterator[list[Envelope[Event]]]:
        """Like :meth:`read`, one part of a record (up to :data:`~stores.lmdb_records.RECORD_PART`
        envelopes) at a time: a read transaction checks whole records and copies their parts out,
        and each part is decoded only when the caller asks for it.

        Raises:
            LogCorrupted: a record fails its checksum, does not decode, or is missing (after
                the chunks before it).
            SchemaTooNew: a record's event is newer than this coevo knows.
            LogClosed: the handle is closed.
        """
        seq, end = max(start, 0), stop
        while end is None or seq < end:
            self._check_open()
            parts, end = self._read_txn(partial(self._read_parts, first=seq, end=end), True, at=seq)
            if not parts:
                return
            for first, data in parts:
                try:
                    decoded = self._codec.decode_batch(data, first)
                except LogCorrupted as exc:  # the part's envelopes are decoded together
                    exc.before = min(exc.before, first)
                    raise
                chunk = decoded[max(seq - first, 0) : end - first]
                if chunk:
                    yield chunk
                    seq = chunk[-1].seq + 1

    @property
    def log_id(self) -> str:
        """The id :meth:`create` made for this log ("" for a log created before logs had one).

        Raises:
            LogError: the stored id fails its checksum or does not decode.
            LogClosed: the handle is closed.
        """
        if self._log_id is None:
            self._check_open()
            payload = self._read_txn(partial(self._get_meta, key=_META_LOG_ID))
            try:
                made = "" if payload is None else msgspec.msgpack.decode(payload, type=str)
            except msgspec.MsgspecError as exc:
                raise LogError(f"the log id of {self._path} does not decode: {exc}") from None
            self._log_id = made
        return self._log_id

    def read_meta(self) -> RunMeta | None:
        """The run metadata, or None if none was written.

        Raises:
            LogError: the stored metadata fails its checksum or does not decode.
            LogClosed: the handle is closed.
        """
        self._check_open()
        payload = self._read_txn(partial(self._get_meta, key=_META_RUN))
        try:
            return None if payload is None else _META_DECODER.decode(payload)
        except msgspec.MsgspecError as exc:
            raise LogError(f"run metadata of {self._path} does not decode: {exc}") from None

    def write_meta(self, meta: RunMeta) -> None:
        """Store the run metadata, replacing the earlier one.

        Raises:
            LogError: the handle is read-only.
            LogClosed: the handle is closed.
        """
        self._check_writable()
        value = seal(_META_RUN, _ENCODER.encode(meta))
        self._write(lambda txn: txn.put(_META_RUN, value, db=self._shared.meta))

    def put_snapshot(self, name: str, upto: int, data: bytes) -> None:
        """Store projection ``name``'s encoded state after folding events ``<= upto``.

        Raises:
            ValueError: ``name`` contains NUL or is longer than 400 bytes.
            LogError: no event ``upto`` is committed, or the handle is read-only.
            LogClosed: the handle is closed.
        """
        self.append([], snapshots=[(name, upto, data)])

    def get_snapshot(self, name: str, at_or_before: int) -> tuple[int, bytes] | None:
        """The newest snapshot of ``name`` with ``upto <= at_or_before``, as ``(upto, data)``.

        Raises:
            ValueError: ``name`` contains NUL or is longer than 400 bytes.
            LogCorrupted: that snapshot fails its checksum (``seq`` is its ``upto``).
            LogClosed: the handle is closed.
        """
        self._check_open()
        prefix = snapshot_prefix(name)
        if at_or_before < 0:
            return None
        target = prefix + SEQ.pack(min(at_or_before, MAX_SEQ))
        snapshots = self._shared.snapshots
        found = self._read_txn(lambda txn: find_snapshot(txn.cursor(snapshots), prefix, target))
        if found is None:
            return None
        key, value = found
        upto, data = int.from_bytes(key[len(prefix) :], "big"), unseal(key, value)
        if data is None:
            raise LogCorrupted(upto, f"snapshot {name!r} fails its checksum")
        return upto, data

    def verify(self) -> VerifyReport:
        """Check every event record: key contiguity from 0, checksum, decode.

        Returns:
            A report naming the first bad seq; a corrupted record is reported, never raised.

        Raises:
            LogClosed: the handle is closed.
        """
        self._check_open()
        records = 0
        try:
            for _ in self.read():
                records += 1
        except LogClosed:
            raise
        except LogError as exc:
            return VerifyReport(records=records, ok=False, first_bad=records, error=str(exc))
        return VerifyReport(records=records, ok=True)

    def copy_to(self, path: str | os.PathLike[str]) -> int:
        """Write a consistent copy of the log, as of its last commit, into the new or empty
        directory ``path`` (LMDB's own copy, in one read transaction: never torn, even while
        the run writes; free pages left out). The copy has no writer lock.

        Returns:
            How many events the copy holds (read in the copy's transaction).

        Raises:
            LogError: ``path`` is not a new or empty directory, or the copy failed (a full
                disk); a failed copy's files are removed.
        """
        dest = Path(path)
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise LogError(f"{dest}: not a new or empty directory for the log's copy")

        def copy(txn: Txn[bytes]) -> int:
            try:
                self._shared.env.copy(str(dest), compact=True, txn=txn)
            except (OSError, lmdb.Error) as exc:  # not the log's damage: the copy's failure
                raise LogError(f"cannot copy the event log to {dest}: {exc}") from None
            return events_end(txn.cursor(self._shared.events))

        try:
            dest.mkdir(parents=True, exist_ok=True)
            return self._read_txn(copy)
        except OSError as exc:
            raise LogError(f"cannot copy the event log to {dest}: {exc}") from None
        except LogError:
            for leftover in dest.glob("*.mdb"):
                leftover.unlink(missing_ok=True)
            raise

    def close(self) -> None:
        """Release the environment and the writer lock. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._shared.release()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> LmdbEventLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "closed" if self._closed else "writer" if self.writable else "reader"
        return f"<LmdbEventLog {str(self._path)!r} {mode}>"

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed(f"event log at {self._path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._lock is None:
            raise LogError(f"event log at {self._path} is open read-only")

    @overload
    def _read_txn(
        self,
        body: Callable[[Txn[bytes]], T],
        buffers: Literal[False] = False,
        at: int | None = None,
    ) -> T: ...
    @overload
    def _read_txn(
        self, body: Callable[[Txn[memoryview]], T], buffers: Literal[True], at: int | None = None
    ) -> T: ...
    def _read_txn(
        self, body: Callable[[Txn[Any]], T], buffers: bool = False, at: int | None = None
    ) -> T:
        """Run ``body`` in a fresh read transaction, adopting a map grown by another process.
        With ``buffers``, values are views of the map, valid only inside ``body``.

        Raises:
            LogCorrupted: LMDB found its own structures damaged while reading from seq ``at``.
            LogError: the same, with no seq to name (``at`` is None).
        """
        while True:
            try:
                with self._shared.reading() as env, env.begin(buffers=buffers) as txn:
                    return body(txn)
            except lmdb.MapResizedError:
                with self._shared.exclusive():
                    self._shared.resize(grow=False)
            except lmdb.Error as exc:  # MDB_CORRUPTED, MDB_PAGE_NOTFOUND: damaged pages
                reason = f"LMDB cannot read the log's pages ({exc})"
                if at is not None:
                    raise LogCorrupted(at, reason) from None
                raise LogDamaged(f"event log at {self._path} is damaged: {reason}") from None

    def _write(self, body: Callable[[Txn[memoryview]], T], at: int | None = None) -> T:
        """Run ``body`` in a write transaction and commit, growing the map when it is full.

        Raises:
            LogWriteFailed: the commit or its fsync failed (disk full, I/O error); ``at`` is the
                first seq of the events being written, if any.
        """
        shared = self._shared
        with shared.write_lock:
            while True:
                txn = shared.env.begin(write=True, buffers=True)
                try:
                    result = body(txn)
                    txn.commit()
                except BaseException as exc:
                    with shared.exclusive():
                        txn.abort()  # a no-op if a failed commit aborted it already
                        if not isinstance(exc, lmdb.MapFullError | lmdb.MapResizedError):
                            self._raise_write_failed(exc, at)
                        shared.resize(grow=isinstance(exc, lmdb.MapFullError))
                    continue
                if self._sync_after_commit:
                    try:
                        shared.env.sync(True)
                    except lmdb.Error as exc:
                        self._raise_write_failed(exc, at)
                return result

    def _raise_write_failed(self, exc: BaseException, at: int | None) -> NoReturn:
        """Re-raise ``exc``, as :class:`LogWriteFailed` if LMDB reports a failed write."""
        if isinstance(exc, lmdb.Error):
            reason = str(exc).removeprefix(f"{self._path}: ")
            raise LogWriteFailed(str(self._path), at, reason) from None
        raise exc

    def _check_format(self) -> None:
        """Raise unless the log records a format this coevo reads; note the format."""
        payload = self._read_txn(partial(self._get_meta, key=_META_FORMAT))
        if payload is None:
            raise LogError(f"no coevo event log at {self._path} (no log format recorded)")
        log_format = msgspec.msgpack.decode(payload, type=int)
        if log_format > LOG_FORMAT:
            raise SchemaTooNew(
                f"event log at {self._path} has format {log_format}; this coevo reads up to "
                f"{LOG_FORMAT} (upgrade coevo)"
            )
        self._format = log_format

    def _get_meta(self, txn: Txn[bytes], key: bytes) -> bytes | None:
        value = txn.get(key, db=self._shared.meta)
        payload = None if value is None else unseal(key, value)
        if value is not None and payload is None:
            raise LogError(f"metadata {key.decode()!r} of {self._path} fails its checksum")
        return payload

    def _snapshot_put(
        self, name: str, upto: int, data: bytes, end: int
    ) -> tuple[_Db, bytes, bytes]:
        """The snapshots database, key and sealed value of a snapshot in a log of ``end`` events.

        Raises:
            ValueError: ``name`` contains NUL or is too long for an LMDB key.
            LogError: ``upto`` is not a seq of the log.
        """
        key = snapshot_prefix(name) + SEQ.pack(min(max(upto, 0), MAX_SEQ))
        check_snapshot(name, upto, end)
        return self._shared.snapshots, key, seal(key, bytes(data))

    def _put_all(self, txn: Txn[memoryview], puts: list[_Put]) -> None:
        """Put an events record past the last one (the writer lock keeps ``_appended`` right;
        MDB_APPEND refuses a key that is not past the last one all the same) and snapshots."""
        events = self._shared.events
        for db, key, value in puts:
            added = txn.put(key, value, db=db, append=db is events)
            assert added, "MDB_APPEND refused a key past the last one"

    def _read_parts(
        self, txn: Txn[memoryview], first: int, end: int | None
    ) -> tuple[list[tuple[int, bytes]], int]:
        """The parts holding seqs ``first ..`` of the records from the one holding ``first``,
        up to about :data:`READ_CHUNK` events (the hot path of replay): each record's CRC and
        counts checked, its parts copied out of the map undecoded.

        Returns:
            ``(first seq, bytes)`` of every part with events in ``first <= seq < end``, and
            ``end`` (the committed next seq if ``end`` was None).
        """
        cursor = txn.cursor(self._shared.events)
        if end is None:
            try:
                end = events_end(cursor)
            except LogCorrupted as exc:  # read up to the damaged last record, which raises
                end = exc.seq + 1
        out: list[tuple[int, bytes]] = []
        if first >= end or not seek_record(cursor, first):
            return out, end
        expected, taken = int.from_bytes(cursor.key(), "big"), 0
        while expected < end and taken < READ_CHUNK:
            key, value = cursor.item()  # views of the map: copied out below, never kept
            try:
                parts = record_parts(key, value, expected, self._format)
            except LogError:
                if out:  # hand over the good records first; the next chunk raises
                    break
                raise
            for seq, part, count in parts:
                expected = seq + count
                if expected > first and seq < end:
                    out.append((seq, bytes(part)))
                    taken += count
            try:
                more = cursor.next()
            except lmdb.Error:  # damaged pages past good records: the next chunk raises
                if out:
                    break
                raise
            if not more:
                break
        return out, end


def _init_meta(txn: lmdb.Transaction, dbs: list[_Db], meta: RunMeta) -> None:
    """Store a new log's format, its own id and the run metadata (in the transaction creating
    its databases)."""
    _, meta_db, _ = dbs
    made = ((_META_FORMAT, LOG_FORMAT), (_META_LOG_ID, os.urandom(16).hex()), (_META_RUN, meta))
    for key, value in made:
        txn.put(key, seal(key, _ENCODER.encode(value)), db=meta_db)
