"""The actor runtime: one nursery, one writer, one total order.

Actors emit events into a bounded write buffer. A single writer task takes the buffer in batches
(group commit), gives each event the next sequence number, folds it into the run's projections,
appends the batch to the log in a worker thread (one transaction, fsync when durable) and only
then delivers the envelopes to the mailboxes of the actors subscribed to them. Every
``checksum_every`` events the writer inserts a :class:`ProjectionChecked` right after the event
it covers, and every ``snapshot_every`` events it stores the projection states beside the log.

Supervision: an actor that raises produces :class:`ActorFailed`; its spec restarts it (up to a
limit) or stops the run. SIGINT/SIGTERM cancel the actors, the writer flushes what was emitted,
and the run ends with :class:`RunStopped`.
"""

from __future__ import annotations

import dataclasses
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
import trio

from engine.actor import Actor, ActorSpec, Context, Mailbox
from engine.errors import ActorCrashed
from engine.events import Envelope, Event
from engine.lifecycle import (
    ActorFailed,
    ActorRestarted,
    ActorStarted,
    ProjectionChecked,
    RunFailed,
    RunStarted,
    RunStopped,
    SnapshotTaken,
)
from engine.projection import (
    Fold,
    Projection,
    digest_bytes,
    encode_state,
)
from engine.replay import replay_until
from engine.seeds import derive_seed
from stores.eventlog import EventLog

_SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
_FINAL_EVENTS = frozenset({RunStopped, RunFailed})


def _sole_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of a (nested) exception group: the error that ended the run, raised
    plainly so that callers can catch ``LogError`` and friends."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]  # pyright: ignore[reportUnknownMemberType]
    return first


class RuntimeConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Knobs of the runtime (the scenario's ``[runtime]`` table maps onto these).

    Attributes:
        batch_max: most events committed in one transaction.
        batch_wait: seconds the writer lingers for more events before a partial batch (0: none).
        write_buffer: events a source actor may have queued before ``emit`` waits.
        mailbox: batches an actor's mailbox holds before delivery waits.
        checksum_every: events between projection checksums (0: only at the end).
        snapshot_every: events between projection snapshots (0: never).
        handle_signals: turn SIGINT/SIGTERM into a graceful stop (main thread only).
    """

    batch_max: int = 1024
    batch_wait: float = 0.0
    write_buffer: int = 8192
    mailbox: int = 64
    checksum_every: int = 1000
    snapshot_every: int = 20000
    handle_signals: bool = False


@dataclass
class RunOutcome:
    """How a run ended."""

    reason: str
    exit_code: int
    events: int
    error: str = ""


@dataclass(eq=False)
class _Subscriber:
    spec: ActorSpec
    types: tuple[type[Event], ...]
    send: trio.MemorySendChannel[list[Envelope[Event]]]
    recv: trio.MemoryReceiveChannel[list[Envelope[Event]]]
    first: Actor | None
    closed: bool = False


_Pending = tuple[str, Event, int | None, str, int]
"""A queued emission: (actor, event, cause, corr, wall time ns)."""


@dataclass
class _Prepared:
    """A numbered and folded batch on its way to the log, with the snapshot to store after it."""

    envelopes: list[Envelope[Event]]
    snapshot: tuple[int, dict[str, bytes]] | None = None


class Runtime:
    """Runs actors over one event log. Use once: ``outcome = await runtime.run()``.

    Args:
        log: the run's event log (opened for writing).
        run_started: the first event of a new run (ignored when the log already has events).
        specs: the actors.
        projections: the folds checksummed and snapshotted during the run.
        seed: the run seed.
        config: runtime knobs.
        clock: wall clock in ns (injectable for tests).
        observers: callbacks given every committed batch, in order, on the event loop (a
            progress display); they are not actors and leave no trace in the log. They must be
            quick and must not raise.
    """

    def __init__(
        self,
        log: EventLog,
        run_started: RunStarted,
        specs: Sequence[ActorSpec],
        projections: Sequence[Projection],
        *,
        seed: int,
        config: RuntimeConfig | None = None,
        clock: Callable[[], int] = time.time_ns,
        observers: Sequence[Callable[[list[Envelope[Event]]], None]] = (),
    ) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"actor names must be unique, got {names}")
        self.seed = seed
        self.run_id = run_started.run_id
        self._log = log
        self._run_started = run_started
        self._specs = tuple(specs)
        self._projections = tuple(projections)
        self._cfg = config or RuntimeConfig()
        self._clock = clock
        self._observers = tuple(observers)
        self._pending: list[_Pending] = []
        self._wake = trio.lowlevel.ParkingLot()
        self._space = trio.lowlevel.ParkingLot()
        self._closing = False
        self._subs: list[_Subscriber] = []
        self._routes: dict[type[Event], list[_Subscriber]] = {}
        self._fold = Fold(self._projections)
        self._since_check = 0
        self._snapshot_seq = -1
        self._next = 0  # seq of the next event to commit (= events committed)
        self._actor_scope: trio.CancelScope | None = None
        self._stop_reason: tuple[str, int] | None = None
        self._log_out = structlog.get_logger("coevo").bind(actor="runtime")

    def actor_seed(self, name: str) -> int:
        """The seed of actor ``name``."""
        return derive_seed(self.seed, "actor", name)

    @property
    def states(self) -> dict[str, Any]:
        """The projections' states as of the last commit (read them, do not change them)."""
        return self._fold.states

    @property
    def next_seq(self) -> int:
        """Sequence number the next committed event gets."""
        return self._next

    def statistics(self) -> dict[str, Any]:
        """Pending events, committed events and per-mailbox queue lengths."""
        return {
            "pending": len(self._pending),
            "committed": self._next,
            "mailboxes": {s.spec.name: s.send.statistics().current_buffer_used for s in self._subs},
        }

    # --- emission ---------------------------------------------------------------------------

    def has_space(self) -> bool:
        """True while the write buffer accepts events from source actors without waiting."""
        return len(self._pending) < self._cfg.write_buffer

    async def wait_space(self) -> None:
        """Wait until the writer has taken events out of a full write buffer."""
        while len(self._pending) >= self._cfg.write_buffer:
            await self._space.park()

    def push(self, actor: str, ev: Event, cause: int | None, corr: str) -> None:
        """Queue an event for the writer (see :meth:`Context.emit`); never waits."""
        pending = self._pending
        if not pending:
            self._wake.unpark_all()
        pending.append((actor, ev, cause, corr, self._clock()))

    # --- the run ----------------------------------------------------------------------------

    async def run(self) -> RunOutcome:
        """Start the writer and the actors; return when the run has ended and is flushed.

        Raises:
            LogError: the log failed (the run cannot be recorded any further).
        """
        await trio.to_thread.run_sync(self._rebuild_fold)
        self._next = self._log.next_seq
        self._log_out.info("run started", run_id=self.run_id, actors=len(self._specs))
        try:
            async with trio.open_nursery() as root:
                await root.start(self._writer)
                if self._next == 0:
                    self.push("runtime", self._run_started, None, "")
                outcome = await self._run_actors()
                self.push("runtime", self._final_event(outcome), None, "")
                self._closing = True
                self._wake.unpark_all()
        except BaseExceptionGroup as group:
            raise _sole_error(group) from None
        outcome.events = self._next
        self._log_out.info(
            "run ended", reason=outcome.reason, exit_code=outcome.exit_code, events=outcome.events
        )
        return outcome

    def _final_event(self, outcome: RunOutcome) -> Event:
        if outcome.reason == "failed":
            return RunFailed(
                error_type="ActorCrashed", message=outcome.error, exit_code=outcome.exit_code
            )
        sig = outcome.reason.removeprefix("signal:") if outcome.reason.startswith("signal:") else ""
        reason = "signal" if sig else outcome.reason
        return RunStopped(reason=reason, signal=sig, exit_code=outcome.exit_code)

    async def _run_actors(self) -> RunOutcome:
        crashes: list[ActorCrashed] = []
        try:
            for spec in self._specs:
                self._subscribe(spec)
            with trio.CancelScope() as scope:
                self._actor_scope = scope
                if self._stop_reason is not None:  # stop requested before the actors started
                    scope.cancel()
                async with trio.open_nursery() as nursery:
                    if self._cfg.handle_signals:
                        nursery.start_soon(self._watch_signals)
                    for sub in self._subs:
                        nursery.start_soon(self._supervise, sub)
        except* ActorCrashed as group:
            crashes.extend(e for e in group.exceptions if isinstance(e, ActorCrashed))
        if crashes:
            return RunOutcome("failed", 1, 0, error=str(crashes[0]))
        reason, code = self._stop_reason or ("completed", 0)
        return RunOutcome(reason, code, 0)

    def request_stop(self, reason: str = "requested", exit_code: int = 0) -> None:
        """Cancel the actors; the run ends with :class:`RunStopped` (``reason``)."""
        if self._stop_reason is None:
            self._stop_reason = (reason, exit_code)
        if self._actor_scope is not None:
            self._actor_scope.cancel()

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                self._log_out.warning("signal received, stopping", signal=name)
                self.request_stop(f"signal:{name}", _SIGNAL_EXIT.get(signum, 1))
                return

    # --- supervision ------------------------------------------------------------------------

    def _subscribe(self, spec: ActorSpec) -> None:
        try:
            actor = spec.factory()
        except Exception as exc:
            self._on_failure(dataclasses.replace(spec, on_failure="stop"), 0, exc)
            raise ActorCrashed(spec.name, f"{type(exc).__name__}: {exc}") from exc
        send, recv = trio.open_memory_channel[list[Envelope[Event]]](self._cfg.mailbox)
        self._subs.append(_Subscriber(spec, tuple(actor.subscribes), send, recv, actor))

    async def _supervise(self, sub: _Subscriber) -> None:
        spec = sub.spec
        attempt = 0
        actor, sub.first = sub.first, None
        mailbox = Mailbox(sub.recv)
        with sub.recv:
            while True:
                try:
                    if actor is None:
                        actor = spec.factory()
                    ctx = Context(self, spec.name, mailbox, source=not sub.types, attempt=attempt)
                    self._log_out.debug("actor started", started=spec.name, attempt=attempt)
                    self.push("runtime", self._started(spec, actor, attempt), None, "")
                    await actor.run(ctx)
                except Exception as exc:
                    if not self._on_failure(spec, attempt, exc):
                        raise ActorCrashed(spec.name, f"{type(exc).__name__}: {exc}") from exc
                    attempt += 1
                    self.push("runtime", ActorRestarted(actor=spec.name, attempt=attempt), None, "")
                    actor = None
                    continue
                if spec.driver:
                    self.request_stop("completed", 0)
                return

    def _started(self, spec: ActorSpec, actor: Any, attempt: int) -> ActorStarted:
        return ActorStarted(
            actor=spec.name,
            actor_type=type(actor).__name__,
            seed=self.actor_seed(spec.name),
            attempt=attempt,
        )

    def _on_failure(self, spec: ActorSpec, attempt: int, exc: Exception) -> bool:
        """Record the failure; True if the actor is to be restarted."""
        restart = spec.on_failure == "restart" and attempt < spec.max_restarts
        tb = "".join(traceback.format_exception(exc, limit=8))
        self.push(
            "runtime",
            ActorFailed(
                actor=spec.name,
                attempt=attempt,
                error_type=type(exc).__name__,
                message=str(exc),
                traceback=tb,
                action="restart" if restart else "stop",
            ),
            None,
            "",
        )
        self._log_out.error(
            "actor failed", failed=spec.name, error=f"{type(exc).__name__}: {exc}", restart=restart
        )
        return restart

    # --- writer -----------------------------------------------------------------------------

    async def _writer(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            while not self._pending:
                if self._closing:
                    return
                await self._wake.park()
            if self._cfg.batch_wait > 0 and len(self._pending) < self._cfg.batch_max:
                await trio.sleep(self._cfg.batch_wait)
            n = min(len(self._pending), self._cfg.batch_max)
            batch = self._pending[:n]
            del self._pending[:n]
            self._space.unpark_all()
            prepared = await trio.to_thread.run_sync(self._commit, batch)
            for observe in self._observers:
                observe(prepared.envelopes)
            await self._deliver(prepared.envelopes)

    def _commit(self, batch: list[_Pending]) -> _Prepared:
        """Prepare one batch and append it (one transaction) with its snapshot (worker thread)."""
        prepared = self._prepare(batch)
        self._log.append(prepared.envelopes)
        self._next = prepared.envelopes[-1].seq + 1
        if prepared.snapshot is not None:
            upto, blobs = prepared.snapshot
            for name, data in blobs.items():
                self._log.put_snapshot(name, upto, data)
        return prepared

    def _prepare(self, batch: list[_Pending]) -> _Prepared:
        """Number and fold one batch.

        The engine's hot loop: envelopes are built in one pass and folded in segments, cut
        where a :class:`ProjectionChecked` goes (every ``checksum_every`` events, and right
        before the run's final event).
        """
        out: list[Envelope[Event]] = []
        append = out.append
        seq = self._next
        run_id = self.run_id
        folding = bool(self._projections)
        every = self._cfg.checksum_every if folding else 0
        folded = 0  # out[:folded] is folded
        for actor, ev, cause, corr, t in batch:
            final = type(ev) in _FINAL_EVENTS
            if folding and final and self._since_check + len(out) > folded:
                seq = self._checkpoint(out, folded, seq, t)
                folded = len(out)
            v = ev.version
            append(
                Envelope(
                    seq=seq, run=run_id, t=t, actor=actor, event=ev, cause=cause, corr=corr, v=v
                )
            )
            seq += 1
            if every and not final and self._since_check + len(out) - folded >= every:
                seq = self._checkpoint(out, folded, seq, t)
                folded = len(out)
        if folding:
            self._fold.apply_all(out[folded:])
            self._since_check += len(out) - folded
        snapshot = self._maybe_snapshot(out, seq - 1)
        return _Prepared(out, snapshot)

    def _checkpoint(self, out: list[Envelope[Event]], folded: int, seq: int, t: int) -> int:
        """Fold ``out[folded:]``, append a :class:`ProjectionChecked` covering events
        ``< seq`` and fold it too; return the next seq."""
        self._fold.apply_all(out[folded:])
        self._since_check = 0
        check = ProjectionChecked(upto=seq - 1, digests=self._fold.digests())
        env = Envelope(seq=seq, run=self.run_id, t=t, actor="runtime", event=check, v=check.version)
        out.append(env)
        self._fold.apply_all([env])
        return seq + 1

    def _maybe_snapshot(
        self, out: list[Envelope[Event]], upto: int
    ) -> tuple[int, dict[str, bytes]] | None:
        """If ``snapshot_every`` events passed: encode the projection states after ``upto``
        and append a :class:`SnapshotTaken` (the blobs are stored right after the batch)."""
        every = self._cfg.snapshot_every
        if not (self._projections and every and upto - self._snapshot_seq >= every):
            return None
        if type(out[-1].event) in _FINAL_EVENTS:  # the final event stays the last one
            return None
        self._snapshot_seq = upto
        blobs = {name: encode_state(st) for name, st in self._fold.states.items()}
        digests = {name: digest_bytes(data) for name, data in blobs.items()}
        taken = SnapshotTaken(upto=upto, digests=digests, size=sum(map(len, blobs.values())))
        t = out[-1].t
        env = Envelope(
            seq=upto + 1, run=self.run_id, t=t, actor="runtime", event=taken, v=taken.version
        )
        out.append(env)
        self._fold.apply_all([env])
        self._since_check += 1
        return upto, blobs

    def _rebuild_fold(self) -> None:
        """Fold an existing log (a resumed run) so checksums continue from its state."""
        if self._log.next_seq:
            self._fold, _ = replay_until(self._log, self._projections)

    async def _deliver(self, envelopes: list[Envelope[Event]]) -> None:
        per_sub: dict[_Subscriber, list[Envelope[Event]]] = {}
        routes = self._routes
        for env in envelopes:
            cls = type(env.event)
            subs = routes.get(cls)
            if subs is None:
                subs = self._routes_for(cls)
            for sub in subs:
                accepts = sub.spec.accepts
                if accepts is None or accepts(env.event):
                    per_sub.setdefault(sub, []).append(env)
        for sub, items in per_sub.items():
            if sub.closed:
                continue
            try:
                await sub.send.send(items)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                sub.closed = True

    def _routes_for(self, cls: type[Event]) -> list[_Subscriber]:
        routes = self._routes.get(cls)
        if routes is None:
            routes = [s for s in self._subs if s.types and issubclass(cls, s.types)]
            self._routes[cls] = routes
        return routes


__all__ = ["RunOutcome", "Runtime", "RuntimeConfig"]
