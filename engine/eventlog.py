"""The event-log Protocol and its in-memory twin.

An event log is the single source of truth of a run: an append-only sequence of envelopes with
contiguous sequence numbers from 0, the run's metadata, and projection snapshots stored beside
it. :class:`MemoryEventLog` is the reference model the LMDB log is tested against; it keeps
encoded bytes, so it exercises the same codec.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec

from engine.errors import LogClosed, LogError, SequenceConflict
from engine.events import Codec, Envelope, Event, event_types

LOG_FORMAT = 2
"""Version of the on-disk layout and envelope format. A log with a larger number is refused.
2: an LMDB record holds its batch in parts (1: in one array; still read and appended to)."""


class ModelFiles(msgspec.Struct, frozen=True, kw_only=True):
    """A model directory as a run started from it: its absolute path, and the sha256 of each
    file that defines the model (config, tokenizer, weights) by name."""

    path: str
    files: dict[str, str]


class RunMeta(msgspec.Struct, frozen=True, kw_only=True):
    """What a run stores beside its events: enough to know what produced the log.

    Attributes:
        run_id: unique id of the run.
        created_ns: wall-clock creation time, ns since the epoch.
        coevo_version: version of coevo that created the log.
        log_format: :data:`LOG_FORMAT` of the writer.
        scenario_name: the scenario's ``name``.
        scenario_toml: the resolved scenario, as TOML text.
        scenario_hash: sha256 of ``scenario_toml``.
        seed: the run seed every other seed derives from.
        event_versions: schema version of every event class known to the writer, by tag.
        machine: the machine that created the log (:func:`machine_description`; "" in logs
            written before 2026-12-02): a model update re-executes bit for bit only where the
            kernels round its floating-point sums as there.
        models: the model directories the run started from, by role (``policy``,
            ``extractor``): each one's path and the digests of the files that define it, which
            a resume compares (empty in logs written before 2026-12-03, and for runs without a
            model).
    """

    run_id: str
    created_ns: int
    coevo_version: str
    log_format: int
    scenario_name: str
    scenario_toml: str
    scenario_hash: str
    seed: int
    event_versions: dict[str, int]
    machine: str = ""
    models: dict[str, ModelFiles] = msgspec.field(default_factory=dict[str, ModelFiles])


def new_run_meta(
    run_id: str,
    *,
    scenario_name: str,
    seed: int,
    coevo_version: str,
    scenario_toml: str = "",
    scenario_hash: str = "",
    created_ns: int = 0,
    models: dict[str, ModelFiles] | None = None,
) -> RunMeta:
    """Run metadata for a new log, with this coevo's log format and event versions, made on
    this machine."""
    return RunMeta(
        run_id=run_id,
        created_ns=created_ns,
        coevo_version=coevo_version,
        log_format=LOG_FORMAT,
        scenario_name=scenario_name,
        scenario_toml=scenario_toml,
        scenario_hash=scenario_hash,
        seed=seed,
        event_versions={tag: cls.version for tag, cls in event_types().items()},
        machine=machine_description(),
        models=models or {},
    )


def machine_description() -> str:
    """This machine as a run's metadata records it: architecture, CPU model (a VM may show only
    "AMD EPYC": its family and model tell the generation), logical CPUs and the widest vector
    instructions, which decide how torch's kernels round (e.g. "x86_64, AMD EPYC (family 25
    model 17), 2 CPUs, avx512f")."""
    info: dict[str, str] = {}
    try:
        with Path("/proc/cpuinfo").open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                key, sep, value = line.partition(":")
                if not sep:
                    break  # the first CPU's block ends
                info.setdefault(key.strip(), value.strip())
    except OSError:  # not Linux
        pass
    cpu = info.get("model name") or platform.processor() or "unknown CPU"
    if "cpu family" in info and "model" in info:
        cpu += f" (family {info['cpu family']} model {info['model']})"
    flags = set(info.get("flags", info.get("Features", "")).split())
    widest = next((f for f in ("avx512f", "avx2", "avx", "sve", "asimd") if f in flags), "")
    parts = [platform.machine(), cpu, f"{os.cpu_count()} CPUs", widest]
    return ", ".join(p for p in parts if p)


Snapshot = tuple[str, int, bytes]
"""A projection snapshot to store: the projection's name, the last seq folded, the state."""


@dataclass(frozen=True)
class EncodedBatch:
    """A batch in a log's stored form, from :meth:`EventLog.encode`, for
    :meth:`EventLog.append_encoded` of the same log.

    Attributes:
        first: seq of the first envelope (unused when the batch is empty).
        count: envelopes in the batch.
        pieces: the encoded bytes, in the log's own layout.
    """

    first: int
    count: int
    pieces: list[bytes]


class VerifyReport(msgspec.Struct, frozen=True, kw_only=True):
    """Result of checking every record of a log: checksum, decode, contiguous seq."""

    records: int
    ok: bool
    first_bad: int | None = None
    error: str = ""


@runtime_checkable
class EventLog(Protocol):
    """An append-only event log with one writer and any number of readers."""

    @property
    def next_seq(self) -> int:
        """Sequence number the next appended event must carry (= number of events)."""
        ...

    @property
    def log_id(self) -> str:
        """An id made when the log was created: a log written anew (even with another log's
        events and metadata) has its own, a copy of a log the same; "" for a log created
        before logs had one (2026-12-07). Caches of what a log holds are keyed by it."""
        ...

    def append(
        self, envelopes: Sequence[Envelope[Event]], *, snapshots: Sequence[Snapshot] = ()
    ) -> None:
        """Append a batch atomically: all of it is committed, or none of it
        (``append_encoded(encode(envelopes), snapshots=snapshots)``).

        Args:
            envelopes: the batch.
            snapshots: ``(name, upto, data)`` stored as :meth:`put_snapshot` does, in the same
                commit as the batch (``upto`` may be a seq of the batch).

        Raises:
            SequenceConflict: the batch does not start at ``next_seq`` or is not contiguous.
            LogError: a snapshot's ``upto`` is not in the log after the batch; the log is
                read-only or closed.
        """
        ...

    def encode(self, envelopes: Sequence[Envelope[Event]]) -> EncodedBatch:
        """The encoding half of an append: no I/O, no lock, any thread (a writer encodes the
        next batch while the previous one commits).

        Raises:
            SequenceConflict: the envelopes' seqs are not consecutive.
        """
        ...

    def append_encoded(self, batch: EncodedBatch, *, snapshots: Sequence[Snapshot] = ()) -> None:
        """The storing half of an append, for a batch from this log's :meth:`encode`.

        Raises:
            SequenceConflict: the batch does not start at ``next_seq``.
            LogError: a snapshot's ``upto`` is not in the log after the batch; the log is
                read-only or closed.
        """
        ...

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Envelope[Event]]:
        """Yield committed envelopes with ``start <= seq < stop`` in order.

        Raises:
            LogCorrupted: a record fails its checksum or does not decode.
        """
        ...

    def read_chunks(
        self, start: int = 0, stop: int | None = None
    ) -> Iterator[list[Envelope[Event]]]:
        """Like :meth:`read`, in lists of consecutive envelopes (for folds over many events).

        Raises:
            LogCorrupted: a record fails its checksum or does not decode (after the chunks
                before it).
        """
        ...

    def read_meta(self) -> RunMeta | None:
        """The run metadata, or None if none was written yet."""
        ...

    def write_meta(self, meta: RunMeta) -> None:
        """Store the run metadata (replacing any earlier one)."""
        ...

    def put_snapshot(self, name: str, upto: int, data: bytes) -> None:
        """Store projection ``name``'s encoded state after folding events ``<= upto``."""
        ...

    def get_snapshot(self, name: str, at_or_before: int) -> tuple[int, bytes] | None:
        """The newest snapshot of ``name`` with ``upto <= at_or_before``, as ``(upto, data)``."""
        ...

    def verify(self) -> VerifyReport:
        """Check every record; never raises for a corrupted record, reports it."""
        ...

    def close(self) -> None:
        """Release the log (and the writer lock). Safe to call twice."""
        ...


def check_snapshot(name: str, upto: int, end: int) -> None:
    """Raise :class:`LogError` unless ``upto`` is a seq of a log of ``end`` events."""
    if not 0 <= upto < end:
        raise LogError(f"snapshot of {name!r} after seq {upto}, but the log has no such seq")


def check_batch(next_seq: int, envelopes: Sequence[Envelope[Event]]) -> None:
    """Raise :class:`SequenceConflict` unless ``envelopes`` continue the log at ``next_seq``."""
    for offset, env in enumerate(envelopes):
        if env.seq != next_seq + offset:
            raise SequenceConflict(next_seq + offset, env.seq)


JOIN_CHUNKS = 64
"""Most envelopes :func:`joined_chunks` puts in one list."""


def last_envelope(log: EventLog) -> Envelope[Event] | None:
    """The log's last committed envelope (None: an empty log); of a live log, the last one
    committed when it was asked."""
    end = log.next_seq
    return next(iter(log.read(end - 1, end)), None) if end else None


def joined_chunks(
    chunks: Iterable[Sequence[Envelope[Event]]], most: int = JOIN_CHUNKS
) -> Iterator[list[Envelope[Event]]]:
    """Consecutive chunks of :meth:`EventLog.read_chunks` joined into lists of up to ``most``
    envelopes (a larger chunk comes alone), for a fold or check called per chunk:
    a run's records hold a few events each (1.5-14 in the headline runs), and one call per
    record costs more than the work in it. ``most`` stays small so that the envelopes are
    still in the CPU's cache when the folds read them.

    Raises:
        LogError: what reading raised, after the envelopes read before it.
    """
    joined: list[Envelope[Event]] = []
    try:
        for chunk in chunks:
            if joined and len(joined) + len(chunk) > most:
                yield joined
                joined = []
            joined += chunk
    except LogError:
        if joined:  # the good envelopes first, as the logs do
            yield joined
        raise
    if joined:
        yield joined


class LogHistory(Sequence[Envelope[Event]]):
    """The events ``[0, end)`` of ``log`` as a sequence read on demand: iterating decodes them a
    record part at a time, and nothing is kept. What a resumed run hands its actors'
    ``recover`` (and a restarted actor's): a list of a long log's envelopes held about 1.5 KB
    per event for the whole session (3 GB to resume 2M events); each pass over this one costs
    a read of the log instead (about a microsecond per event).

    Raises (on reading):
        LogCorrupted: a record fails its checksum or does not decode.
    """

    def __init__(self, log: EventLog, end: int) -> None:
        self._log = log
        self._end = end

    def __len__(self) -> int:
        return self._end

    def __iter__(self) -> Iterator[Envelope[Event]]:
        for chunk in self._log.read_chunks(0, self._end):
            yield from chunk

    def __reversed__(self) -> Iterator[Envelope[Event]]:
        return reversed(list(self))  # not used by coevo's actors: correct, not cheap

    def __getitem__(self, at: int | slice) -> Any:
        if isinstance(at, slice):
            seqs = range(self._end)[at]
            if seqs.step != 1:
                return [self[i] for i in seqs]
            return [env for c in self._log.read_chunks(seqs.start, seqs.stop) for env in c]
        seq = range(self._end)[at]  # IndexError as a list's, negative indices too
        return next(self._log.read(seq, seq + 1))


_MEMORY_CHUNK = 256


class MemoryEventLog:
    """The in-memory twin of the LMDB log: same Protocol, same codec, no durability."""

    def __init__(self, codec: Codec | None = None) -> None:
        self._codec = codec or Codec()
        self._records: list[bytes] = []
        self._meta: RunMeta | None = None
        self._snapshots: dict[str, dict[int, bytes]] = {}
        self._closed = False
        self._log_id = os.urandom(16).hex()

    @property
    def next_seq(self) -> int:
        return len(self._records)

    @property
    def log_id(self) -> str:
        return self._log_id

    def append(
        self, envelopes: Sequence[Envelope[Event]], *, snapshots: Sequence[Snapshot] = ()
    ) -> None:
        self._check_open()
        self.append_encoded(self.encode(envelopes), snapshots=snapshots)

    def encode(self, envelopes: Sequence[Envelope[Event]]) -> EncodedBatch:
        first = envelopes[0].seq if envelopes else 0
        check_batch(first, envelopes)
        return EncodedBatch(first, len(envelopes), [self._codec.encode(e) for e in envelopes])

    def append_encoded(self, batch: EncodedBatch, *, snapshots: Sequence[Snapshot] = ()) -> None:
        self._check_open()
        if batch.count and batch.first != len(self._records):
            raise SequenceConflict(len(self._records), batch.first)
        end = len(self._records) + batch.count
        for name, upto, _ in snapshots:
            check_snapshot(name, upto, end)
        self._records.extend(batch.pieces)
        for name, upto, data in snapshots:
            self._snapshots.setdefault(name, {})[upto] = bytes(data)

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Envelope[Event]]:
        self._check_open()
        end = len(self._records) if stop is None else min(stop, len(self._records))
        for seq in range(max(start, 0), end):
            yield self._codec.decode(self._records[seq], seq)

    def read_chunks(
        self, start: int = 0, stop: int | None = None
    ) -> Iterator[list[Envelope[Event]]]:
        chunk: list[Envelope[Event]] = []
        try:
            for env in self.read(start, stop):
                chunk.append(env)
                if len(chunk) == _MEMORY_CHUNK:
                    yield chunk
                    chunk = []
        except LogError:
            if chunk:  # the good records first, as the LMDB log does
                yield chunk
            raise
        if chunk:
            yield chunk

    def read_meta(self) -> RunMeta | None:
        self._check_open()
        return self._meta

    def write_meta(self, meta: RunMeta) -> None:
        self._check_open()
        self._meta = meta

    def put_snapshot(self, name: str, upto: int, data: bytes) -> None:
        self.append([], snapshots=[(name, upto, data)])

    def get_snapshot(self, name: str, at_or_before: int) -> tuple[int, bytes] | None:
        self._check_open()
        candidates = [s for s in self._snapshots.get(name, {}) if s <= at_or_before]
        if not candidates:
            return None
        best = max(candidates)
        return best, self._snapshots[name][best]

    def verify(self) -> VerifyReport:
        self._check_open()
        for seq, data in enumerate(self._records):
            try:
                self._codec.decode(data, seq)
            except LogError as exc:
                return VerifyReport(records=seq, ok=False, first_bad=seq, error=str(exc))
        return VerifyReport(records=len(self._records), ok=True)

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed("event log is closed")
