"""Replay: rebuild projection state at any point of a log, verify a whole log, and read events
back with filters (live, too).

All of it is pure reading; nothing here writes to the log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass

import trio

from engine.errors import LogCorrupted, LogInconsistent, ReplayDiverged, SchemaTooNew
from engine.eventlog import EventLog, joined_chunks
from engine.events import Envelope, Event
from engine.invariants import Invariant, Sessions, check_all, check_causes, completed
from engine.lifecycle import ProjectionChecked, SnapshotTaken
from engine.projection import Fold, Projection, decode_state


def replay_until(
    log: EventLog, projections: Sequence[Projection], until: int | None = None
) -> tuple[Fold, int | None]:
    """Fold ``log`` up to and including seq ``until`` (None: the whole log).

    Starts from the newest snapshot at or before ``until`` that every projection has.

    Returns:
        The fold, and the seq of the snapshot it started from (None: from the beginning).
    """
    end = log.next_seq - 1 if until is None else min(until, log.next_seq - 1)
    fold = Fold(projections)
    start_snapshot: int | None = None
    snaps = [log.get_snapshot(p.name, end) for p in projections]
    if projections and all(s is not None for s in snaps):
        uptos = {s[0] for s in snaps if s is not None}
        if len(uptos) == 1:
            upto = uptos.pop()
            states = {
                p.name: decode_state(p, s[1]) for p, s in zip(projections, snaps, strict=True) if s
            }
            fold = Fold(projections, states)
            fold.last_seq = upto
            start_snapshot = upto
    for chunk in joined_chunks(log.read_chunks(fold.last_seq + 1, end + 1)):
        fold.apply_all(chunk)
    return fold, start_snapshot


FactCheck = Invariant
"""A check ``verify_log`` runs over the log's events besides the checksums: any invariant."""


@dataclass
class VerifyResult:
    """Outcome of :func:`verify_log`."""

    events: int
    checks: int
    ok: bool
    error: str = ""
    first_bad_seq: int | None = None
    damaged: bool = False
    """The failure is a record that fails its checksum or cannot be read (not a divergence)."""
    uncheckable: tuple[str, ...] = ()
    """Fact checks that found they cannot judge this log ("NAME: why"; a plug-in method's
    ``score`` that fails on its events now): left out, not failures."""
    readable: int | None = None
    """Of a damaged log: the events before this seq still read (a bad envelope inside a
    record's part hides the part's earlier envelopes too)."""


def verify_log(
    log: EventLog, projections: Sequence[Projection], facts: Sequence[FactCheck] = ()
) -> VerifyResult:
    """Re-fold the whole log and compare with every recorded :class:`ProjectionChecked` and
    :class:`SnapshotTaken` (both carry the digests of every projection after ``upto``), and
    check each cause is an earlier event (``numbering``'s part the reader does not hold) and
    the invariants ``facts`` (and :class:`~engine.invariants.Sessions`), each finished at
    the log's end (one that finds it cannot judge the log is left out, said in
    :attr:`VerifyResult.uncheckable`).

    Stops at the first corrupted record, divergent checksum or repeated fact, and names it; a
    corrupted record is never folded. On a live run, verifies the events committed when it
    started.
    """
    fold = Fold(projections)
    active: Sequence[FactCheck] = (Sessions(), *facts)
    checks = 0
    last: Envelope[Event] | None = None
    uncheckable: list[tuple[str, str]] = []
    try:
        end = log.next_seq  # a live run keeps writing: verify what was there when we started
    except LogCorrupted as exc:  # the last record is damaged: reached, and reported, in order
        end = exc.seq + 1
    try:
        for chunk in joined_chunks(log.read_chunks(0, end)):
            check_causes(chunk)  # the reader holds the seqs in order; the causes, not
            active = check_all(active, chunk, False, uncheckable)
            folded = 0  # chunk[:folded] is folded
            for i in [i for i, env in enumerate(chunk) if type(env.event) in _RECORDED]:
                fold.apply_all(chunk[folded:i])
                folded = i  # the check itself is folded with what follows it
                check = chunk[i].event
                assert isinstance(check, ProjectionChecked | SnapshotTaken)
                _compare(fold, chunk[i].seq, check)
                checks += 1
            fold.apply_all(chunk[folded:])
            last = chunk[-1] if chunk else last
        if fold.last_seq + 1 == end:
            check_all(active, None, completed(last), uncheckable)
    except (LogCorrupted, SchemaTooNew) as exc:
        bad = exc.seq if isinstance(exc, LogCorrupted) else fold.last_seq + 1
        damaged = isinstance(exc, LogCorrupted)
        before = exc.before if isinstance(exc, LogCorrupted) else None
        return VerifyResult(
            fold.last_seq + 1, checks, False, str(exc), bad, damaged, _noted(uncheckable), before
        )
    except (ReplayDiverged, LogInconsistent) as exc:
        return VerifyResult(
            fold.last_seq + 1, checks, False, str(exc), exc.seq, False, _noted(uncheckable)
        )
    if fold.last_seq + 1 != end:
        msg = f"log has {end} events but only {fold.last_seq + 1} were read"
        bad = fold.last_seq + 1
        return VerifyResult(bad, checks, False, msg, bad, False, _noted(uncheckable))
    return VerifyResult(fold.last_seq + 1, checks, True, uncheckable=_noted(uncheckable))


def _noted(uncheckable: list[tuple[str, str]]) -> tuple[str, ...]:
    """The invariants that found they cannot judge the log, as "NAME: why"."""
    return tuple(f"{name}: {why}" for name, why in uncheckable)


_RECORDED = frozenset({ProjectionChecked, SnapshotTaken})
"""Events that record the digests of every projection (what verification compares); looked up
by exact type, several times faster than ``isinstance`` on event classes."""


def _compare(fold: Fold, seq: int, check: ProjectionChecked | SnapshotTaken) -> None:
    """Compare the fold after ``check.upto`` with the digests the writer recorded."""
    if check.upto != fold.last_seq:
        raise ReplayDiverged(seq, "*", f"upto {check.upto}", f"folded to {fold.last_seq}")
    derived = fold.digests()
    for name, recorded in check.digests.items():
        got = derived.get(name)
        if got is None:
            raise ReplayDiverged(check.upto, name, recorded, "<projection not known>")
        if got != recorded:
            raise ReplayDiverged(check.upto, name, recorded, got)


@dataclass(frozen=True)
class EventFilter:
    """Which envelopes ``coevo log`` shows. Empty fields match everything."""

    kinds: frozenset[str] = frozenset()
    actors: frozenset[str] = frozenset()
    corr: str = ""
    start: int = 0
    stop: int | None = None

    def matches(self, env: Envelope[Event]) -> bool:
        if self.kinds and env.event.__struct_config__.tag not in self.kinds:
            return False
        if self.actors and env.actor not in self.actors:
            return False
        return (
            not self.corr
            or env.corr == self.corr
            or getattr(env.event, "episode", None) == (self.corr)
        )


def iter_events(log: EventLog, flt: EventFilter) -> Iterator[Envelope[Event]]:
    """The committed envelopes that match ``flt``, in order."""
    for env in log.read(flt.start, flt.stop):
        if flt.matches(env):
            yield env


FOLLOW_CHUNK = 4096
"""Events :func:`follow` reads at a time: a live run's backlog (every event from the start)
was read whole before the first was printed, holding the log in memory (1.2 GB at 600k
events)."""


async def follow(
    log: EventLog,
    flt: EventFilter,
    *,
    poll: float = 0.2,
    writing: Callable[[], bool] | None = None,
) -> AsyncIterator[Envelope[Event]]:
    """Like :func:`iter_events`, then keep waiting for new events (a live tail): until
    ``flt.stop`` is reached, the caller stops iterating, or, given ``writing`` (is a process
    still writing the log?), the tail has caught up with a log nobody writes any more (a run
    that completed, stopped or was killed)."""
    cursor = flt.start
    while flt.stop is None or cursor < flt.stop:
        gone = writing is not None and not writing()  # asked first: no commit is missed
        head = log.next_seq
        if head > cursor:
            end = min(head if flt.stop is None else min(head, flt.stop), cursor + FOLLOW_CHUNK)
            batch = await trio.to_thread.run_sync(lambda a=cursor, b=end: list(log.read(a, b)))
            for env in batch:
                if flt.matches(env):
                    yield env
            cursor = end
            continue
        if gone:
            return
        await trio.sleep(poll)
