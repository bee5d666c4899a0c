"""The event-log Protocol and its in-memory twin.

An event log is the single source of truth of a run: an append-only sequence of envelopes with
contiguous sequence numbers from 0, the run's metadata, and projection snapshots stored beside
it. :class:`MemoryEventLog` is the reference model the LMDB log is tested against; it keeps
encoded bytes, so it exercises the same codec.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import msgspec

from engine.errors import LogClosed, LogError, SequenceConflict
from engine.events import Codec, Envelope, Event, event_types

LOG_FORMAT = 1
"""Version of the on-disk layout and envelope format. A log with a larger number is refused."""


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


def new_run_meta(
    run_id: str,
    *,
    scenario_name: str,
    seed: int,
    coevo_version: str,
    scenario_toml: str = "",
    scenario_hash: str = "",
    created_ns: int = 0,
) -> RunMeta:
    """Run metadata for a new log, with this coevo's log format and event versions."""
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
    )


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

    def append(self, envelopes: Sequence[Envelope[Event]]) -> None:
        """Append a batch atomically: all of it is committed, or none of it.

        Raises:
            SequenceConflict: the batch does not start at ``next_seq`` or is not contiguous.
            LogError: the log is read-only or closed.
        """
        ...

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Envelope[Event]]:
        """Yield committed envelopes with ``start <= seq < stop`` in order.

        Raises:
            LogCorrupted: a record fails its checksum or does not decode.
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


def check_batch(next_seq: int, envelopes: Sequence[Envelope[Event]]) -> None:
    """Raise :class:`SequenceConflict` unless ``envelopes`` continue the log at ``next_seq``."""
    for offset, env in enumerate(envelopes):
        if env.seq != next_seq + offset:
            raise SequenceConflict(next_seq + offset, env.seq)


class MemoryEventLog:
    """The in-memory twin of the LMDB log: same Protocol, same codec, no durability."""

    def __init__(self, codec: Codec | None = None) -> None:
        self._codec = codec or Codec()
        self._records: list[bytes] = []
        self._meta: RunMeta | None = None
        self._snapshots: dict[str, dict[int, bytes]] = {}
        self._closed = False

    @property
    def next_seq(self) -> int:
        return len(self._records)

    def append(self, envelopes: Sequence[Envelope[Event]]) -> None:
        self._check_open()
        check_batch(len(self._records), envelopes)
        encoded = [self._codec.encode(env) for env in envelopes]
        self._records.extend(encoded)

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Envelope[Event]]:
        self._check_open()
        end = len(self._records) if stop is None else min(stop, len(self._records))
        for seq in range(max(start, 0), end):
            yield self._codec.decode(self._records[seq], seq)

    def read_meta(self) -> RunMeta | None:
        self._check_open()
        return self._meta

    def write_meta(self, meta: RunMeta) -> None:
        self._check_open()
        self._meta = meta

    def put_snapshot(self, name: str, upto: int, data: bytes) -> None:
        self._check_open()
        if not 0 <= upto < len(self._records):
            raise LogError(f"snapshot of {name!r} after seq {upto}, but the log has no such seq")
        self._snapshots.setdefault(name, {})[upto] = bytes(data)

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
