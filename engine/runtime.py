"""The actor runtime: one nursery, one writer, one total order.

Actors emit events into a bounded write buffer. A single writer task takes the buffer in batches
(group commit: whatever is queued, up to ``batch_max``), gives each event the next sequence number
and folds it into the run's projections (:mod:`engine.numbering`), and hands the batch to the log's
writing thread, which appends it in one transaction (fsync when durable). While that commit is under
way the writer numbers the next batch; a batch's envelopes are delivered to the mailboxes of the
actors subscribed to them only once its commit returned, in commit order. Every ``checksum_every``
events the writer inserts a :class:`ProjectionChecked` right after the event it covers, and every
``snapshot_every`` events it stores the projection states beside the log, in the same transaction as
the batch that records the :class:`SnapshotTaken`.

Supervision: an actor that raises produces :class:`ActorFailed`; its spec restarts it (up to a
limit) or stops the run (what counts as its failure: :mod:`engine.supervision`). SIGINT/SIGTERM
cancel the actors, the writer flushes what was emitted, and the run ends with
:class:`RunStopped`.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import itertools
import operator
import signal
import sys
import time
import traceback
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
import trio

from engine.actor import Actor, ActorSpec, Context, Mailbox, error_leaves
from engine.committer import IN_FLIGHT, Committer, Prepared
from engine.errors import ActorCrashed
from engine.eventlog import EventLog, LogHistory
from engine.events import Codec, Envelope, Event
from engine.lifecycle import (
    ActorFailed,
    ActorRestarted,
    ActorStarted,
    RunFailed,
    RunResumed,
    RunStarted,
    RunStopped,
)
from engine.loopwatch import LoopWatch
from engine.numbering import Numbering, Pending
from engine.projection import Projection
from engine.replay import replay_until
from engine.seeds import derive_seed
from engine.stopping import SIGNAL_EXIT, STOP_NOTICE_EVERY_S, STOP_NOTICE_S, stop_signals
from engine.supervision import (
    RecoveryStopped,
    StoppableHistory,
    actor_failure,
    built,
)


def _sole_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of a (nested) exception group: the error that ended the run, raised
    plainly so that callers can catch ``LogError`` and friends."""
    return next(error_leaves(group))


WRITE_BUFFER_BYTES = 64 * 2**20
"""Default bytes of encoded events a source actor may have queued before ``emit`` waits: a
world that answers megabytes a turn fills it long before the event count does."""


_SIZE = operator.itemgetter(5)
"""A pending event's size encoded (:data:`engine.numbering.Pending`)."""


class RuntimeConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Knobs of the runtime (the scenario's ``[runtime]`` table maps onto these).

    Attributes:
        batch_max: most events committed in one transaction. The writer commits whatever is
            queued, up to this; a large cap lets a loaded run spread each fsync over more events.
        batch_wait: seconds the writer lingers for more events before a partial batch (0: none).
        write_buffer: events a source actor may have queued before ``emit`` waits.
        write_buffer_bytes: the same in bytes (the events encoded), and the most bytes of
            events in one commit (a single larger event still goes alone): with the two
            batches between numbering and delivery, the writer holds about three times this.
        mailbox: batches an actor's mailbox holds before delivery waits.
        checksum_every: events between projection checksums (0: only at the end), at least.
        snapshot_every: events between projection snapshots (0: never), at least.
        checksum_budget: bytes of encoded projection state a checksum digests per event since
            the one before, at most: a larger state spaces checksums further apart, so that
            their cost per event stays bounded however long the run (0: no bound).
        snapshot_budget: the same for the bytes a snapshot stores (0: no bound).
        handle_signals: turn SIGINT/SIGTERM/SIGHUP into a graceful stop (main thread only).
        switch_interval: while the run lasts, the seconds a thread may keep the GIL while
            another waits for it (``sys.setswitchinterval``; 0: leave it as it is). The log's
            writing thread needs the GIL for a moment after each LMDB call; at Python's
            default of 5 ms it waits that long whenever the actors keep the event loop busy.
        stall_warning: seconds one turn of the event loop may run (a task computing without
            yielding: every other actor waits) before the run's log warns where it is
            (:mod:`engine.loopwatch`; 0: no watch).
    """

    batch_max: int = 4096
    batch_wait: float = 0.0
    write_buffer: int = 8192
    write_buffer_bytes: int = WRITE_BUFFER_BYTES
    mailbox: int = 64
    checksum_every: int = 1000
    snapshot_every: int = 20000
    checksum_budget: int = 256
    snapshot_budget: int = 32
    handle_signals: bool = False
    switch_interval: float = 0.001
    stall_warning: float = 10.0


@dataclass
class RunOutcome:
    """How a run ended."""

    reason: str
    exit_code: int
    events: int
    error: str = ""
    actor: str = ""  # the actor whose failure ended it (reason "failed")


@dataclass(eq=False)
class _Subscriber:
    spec: ActorSpec
    types: tuple[type[Event], ...]
    send: trio.MemorySendChannel[list[Envelope[Event]]]
    recv: trio.MemoryReceiveChannel[list[Envelope[Event]]]
    first: Actor | None
    closed: bool = False


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
        resumed: for ``coevo resume``: the first event of the new session, written before any
            actor starts; each actor's :meth:`Actor.recover` is then given ``history``.
        history: the events of the earlier sessions, in seq order (with ``resumed``).
        verdict: given the projections' states of a run that completed, the exit code it
            ends with (0: as the runtime saw it; 1 when, say, no episode finished); recorded
            in its ``run_stopped``.
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
        resumed: RunResumed | None = None,
        history: Sequence[Envelope[Event]] = (),
        verdict: Callable[[dict[str, Any]], int] | None = None,
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
        self._resumed = resumed
        self._history = history
        self._verdict = verdict
        self._pending: list[Pending] = []
        self._pending_bytes = 0
        self._buffer_events = self._cfg.write_buffer
        self._buffer_bytes = self._cfg.write_buffer_bytes
        self._wake = trio.lowlevel.ParkingLot()
        self._space = trio.lowlevel.ParkingLot()
        self._closing = False
        self._subs: list[_Subscriber] = []
        self._routes: dict[type[Event], list[_Subscriber]] = {}
        self._numbering = Numbering(
            self.run_id,
            self._projections,
            self._cfg.checksum_every,
            self._cfg.snapshot_every,
            self._cfg.checksum_budget,
            self._cfg.snapshot_budget,
        )
        self._next = 0  # seq of the next event to commit (= events committed)
        self._in_flight = 0  # batches numbered and not yet delivered
        self._committed: collections.deque[tuple[Prepared, BaseException | None]] = (
            collections.deque()
        )
        self._delivered = trio.lowlevel.ParkingLot()
        self._pushed = 0  # events pushed so far
        self._committed_pushed = 0  # of those, committed (in push order)
        self._commits = trio.lowlevel.ParkingLot()
        self._fed_all = False
        self._actor_scope: trio.CancelScope | None = None
        self._stop_reason: tuple[str, int] | None = None
        self._signalled = False  # a stop signal arrived (ctrl_c_possible)
        self._running: set[str] = set()  # the actors whose task has not returned
        self._root: trio.Nursery | None = None
        self._stop_notice = trio.CancelScope()  # ends with the actors (_notice_stop)
        self._noticing = False  # _notice_stop started (once: by a stop asked for, or a crash)
        self._log_out = structlog.get_logger("coevo").bind(actor="runtime")
        self.check_event = Codec().check
        """Raise ``EventInvalid`` unless an event would decode from the log (``Context.emit``
        calls it on every actor's event)."""

    def actor_seed(self, name: str) -> int:
        """The seed of actor ``name``."""
        return derive_seed(self.seed, "actor", name)

    @property
    def states(self) -> dict[str, Any]:
        """The projections' states after the last numbered batch: at most two batches ahead of
        the log during the run, the whole log's once it has ended (read, do not change them)."""
        return self._numbering.fold.states

    @property
    def next_seq(self) -> int:
        """Sequence number the next committed event gets."""
        return self._next

    def statistics(self) -> dict[str, Any]:
        """Pending events (and their bytes encoded), committed events and per-mailbox queue
        lengths."""
        return {
            "pending": len(self._pending),
            "pending_bytes": self._pending_bytes,
            "committed": self._next,
            "mailboxes": {s.spec.name: s.send.statistics().current_buffer_used for s in self._subs},
        }

    # --- emission ---------------------------------------------------------------------------

    def _full(self) -> bool:
        """Whether the write buffer holds ``write_buffer`` events, or ``write_buffer_bytes``
        (an event larger than that still goes into an empty buffer)."""
        pending = self._pending
        return bool(pending) and (
            len(pending) >= self._buffer_events or self._pending_bytes >= self._buffer_bytes
        )

    async def wait_space(self) -> None:
        """Wait until the writer has taken events out of a full write buffer."""
        while self._full():
            await self._space.park()

    def push(
        self,
        actor: str,
        ev: Event,
        cause: int | None,
        corr: str,
        bounded: bool = False,
        size: int = 0,
    ) -> bool:
        """Queue an event of ``size`` bytes encoded for the writer (see
        :meth:`Context.emit`); never waits.

        Returns:
            False, with nothing queued, if ``bounded`` (a source actor's event) and the write
            buffer is full: the caller waits (:meth:`wait_space`) and pushes again.
        """
        pending = self._pending
        if (
            bounded
            and pending
            and (len(pending) >= self._buffer_events or self._pending_bytes >= self._buffer_bytes)
        ):  # _full(), inline: this runs for every event
            return False
        if not pending:
            self._wake.unpark_all()
        pending.append((actor, ev, cause, corr, self._clock(), size))
        self._pending_bytes += size
        self._pushed += 1
        return True

    async def wait_committed(self) -> None:
        """Wait until every event pushed so far is committed (not necessarily delivered)."""
        target = self._pushed
        while self._committed_pushed < target:
            await self._commits.park()

    # --- the run ----------------------------------------------------------------------------

    async def run(self) -> RunOutcome:
        """Start the writer and the actors; return when the run has ended and is flushed.

        Raises:
            LogError: the log failed (the run cannot be recorded any further).
        """
        await trio.to_thread.run_sync(self._rebuild_fold)
        self._numbering.seq = self._next = self._log.next_seq
        self._log_out.info("run started", run_id=self.run_id, actors=len(self._specs))
        watch = LoopWatch(self._cfg.stall_warning, self._log_out)
        if self._cfg.stall_warning > 0:
            watch.start()
        try:
            async with trio.open_nursery() as root:
                self._root = root
                await root.start(self._writer)
                if self._next == 0:
                    self.push("runtime", self._run_started, None, "")
                elif self._resumed is not None:
                    self.push("runtime", self._resumed, None, "")
                outcome = await self._run_actors()
                self._stop_notice.cancel()
                if outcome.reason == "completed" and self._verdict is not None:
                    await self.wait_committed()  # every event folded into the states
                    outcome.exit_code = self._verdict(self.states) or outcome.exit_code
                self.push("runtime", self._final_event(outcome), None, "")
                self._closing = True
                self._wake.unpark_all()
        except BaseExceptionGroup as group:
            raise _sole_error(group) from None
        finally:
            watch.stop()  # nothing to stop when it was not started
        outcome.events = self._next
        self._log_out.info(
            "run ended", reason=outcome.reason, exit_code=outcome.exit_code, events=outcome.events
        )
        return outcome

    def _final_event(self, outcome: RunOutcome) -> Event:
        if outcome.reason == "failed":
            return RunFailed(
                error_type="ActorCrashed",
                message=outcome.error,
                actor=outcome.actor,
                exit_code=outcome.exit_code,
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
                with self._signal_handler() as signals:
                    async with trio.open_nursery() as nursery:
                        if signals is not None:
                            nursery.start_soon(self._watch_signals, signals)
                        for sub in self._subs:
                            nursery.start_soon(self._supervise, sub)
        except* ActorCrashed as group:
            crashes.extend(e for e in group.exceptions if isinstance(e, ActorCrashed))
        if crashes:
            return RunOutcome("failed", 1, 0, error=str(crashes[0]), actor=crashes[0].actor)
        reason, code = self._stop_reason or ("completed", 0)
        return RunOutcome(reason, code, 0)

    def request_stop(self, reason: str = "requested", exit_code: int = 0) -> None:
        """Cancel the actors; the run ends with :class:`RunStopped` (``reason``)."""
        if self._stop_reason is None:
            self._stop_reason = (reason, exit_code)
            self._begin_notice(reason)
        if self._actor_scope is not None:
            self._actor_scope.cancel()

    def _begin_notice(self, reason: str) -> None:
        """Start :meth:`_notice_stop` for the stop under way, unless one runs already."""
        if not self._noticing and self._root is not None:
            self._noticing = True
            self._root.start_soon(self._notice_stop, reason)

    async def _notice_stop(self, reason: str) -> None:
        """Say which actors a stop still waits on, once it has waited :data:`STOP_NOTICE_S`
        (an update in a thread cannot be cancelled: a stop waited minutes without a word);
        once a signal has come, that a second one ends the process."""
        with self._stop_notice:
            waited = STOP_NOTICE_S
            await trio.sleep(waited)
            while self._running:
                hint = {}
                if self._signalled or reason.startswith("signal:"):
                    hint["now"] = (
                        "a second Ctrl-C or SIGTERM ends the process (the log keeps every "
                        "commit, and coevo resume continues the run)"
                    )
                self._log_out.warning(
                    "stopping: still waiting for actors to finish what they are doing",
                    actors=sorted(self._running),
                    waited_s=round(waited),
                    stop=reason,
                    **hint,
                )
                await trio.sleep(STOP_NOTICE_EVERY_S)
                waited += STOP_NOTICE_EVERY_S

    @contextlib.contextmanager
    def _signal_handler(self) -> Generator[trio.MemoryReceiveChannel[int] | None]:
        """The stop signals handed to the event loop while the actors run
        (:func:`engine.stopping.stop_signals`); None: the run does not handle signals."""
        if not self._cfg.handle_signals:
            yield None
            return
        with stop_signals(self._arrived, self._take_signal, self._waiting_on) as signals:
            yield signals

    def _arrived(self) -> None:  # in the signal handler
        self._signalled = True

    def _waiting_on(self) -> list[str]:
        return sorted(self._running)

    async def _watch_signals(self, signals: trio.MemoryReceiveChannel[int]) -> None:
        """Hold the actors' nursery open until the first SIGINT, SIGTERM or SIGHUP was taken
        (:meth:`_take_signal`): a resume's recovery that a signal ends returns before the
        signal reaches the loop, and the run would end as completed."""
        await signals.receive()

    def _take_signal(self, signum: int) -> None:
        """Stop gracefully at a SIGINT, SIGTERM or SIGHUP, also while a stop that began
        otherwise (a failure, the driver's end, a request) waits on actors."""
        sig = signal.Signals(signum)
        self._log_out.warning("signal received, stopping", signal=sig.name)
        self.request_stop(f"signal:{sig.name}", SIGNAL_EXIT.get(sig, 1))

    # --- supervision ------------------------------------------------------------------------

    def ctrl_c_possible(self) -> bool:
        """Whether a ``KeyboardInterrupt`` raised now on the loop's thread may be the user's
        Ctrl-C: the run does not handle signals, or one has arrived."""
        return not self._cfg.handle_signals or self._signalled

    def subscribed(self, cls: type[Event], besides: str = "") -> bool:
        """Whether some actor, other than the one named ``besides``, subscribes to events of
        ``cls``."""
        return any(
            s.types and issubclass(cls, s.types) and s.spec.name != besides for s in self._subs
        )

    def _subscribe(self, spec: ActorSpec) -> None:
        try:
            actor = built(spec)
        except BaseException as raised:
            if (exc := actor_failure(raised, self.ctrl_c_possible())) is None:
                raise
            self._on_failure(dataclasses.replace(spec, on_failure="stop"), 0, exc)
            raise ActorCrashed(spec.name, f"{type(exc).__name__}: {exc}") from exc
        send, recv = trio.open_memory_channel[list[Envelope[Event]]](self._cfg.mailbox)
        self._subs.append(_Subscriber(spec, tuple(actor.subscribes), send, recv, actor))

    async def _supervise(self, sub: _Subscriber) -> None:
        spec = sub.spec
        attempt = 0
        actor, sub.first = sub.first, None
        mailbox = Mailbox(sub.recv)
        self._running.add(spec.name)
        with sub.recv, contextlib.ExitStack() as running:
            running.callback(self._running.discard, spec.name)
            while True:
                try:
                    if actor is None:
                        actor = built(spec)
                    ctx = Context(self, spec.name, mailbox, source=not sub.types, attempt=attempt)
                    self._log_out.debug("actor started", started=spec.name, attempt=attempt)
                    self.push("runtime", self._started(spec, actor, attempt), None, "")
                    if self._resumed is not None and attempt == 0:
                        await actor.recover(ctx, self._stoppable(self._history))
                    elif attempt > 0 and spec.recover_on_restart:
                        # what the lost actor emitted is in the history it is rebuilt from
                        await self.wait_committed()
                        history = self._read_log()
                        mailbox.skip_through = history[-1].seq if history else -1
                        await actor.recover(ctx, self._stoppable(history))
                    await actor.run(ctx)
                except RecoveryStopped:  # (a remote actor's proxy reads it as it runs)
                    return  # the stop is under way (the signal reaches the loop next)
                except BaseException as raised:
                    if (exc := actor_failure(raised, self.ctrl_c_possible())) is None:
                        raise
                    if not self._on_failure(spec, attempt, exc):
                        self._begin_notice(f"{spec.name} failed")  # the others are cancelled
                        raise ActorCrashed(spec.name, f"{type(exc).__name__}: {exc}") from exc
                    attempt += 1
                    reason = f"{type(exc).__name__}: {str(exc).partition(chr(10))[0]}"
                    restarted = ActorRestarted(actor=spec.name, attempt=attempt, reason=reason)
                    self.push("runtime", restarted, None, "")
                    actor = None
                    continue
                if spec.driver:
                    self.request_stop("completed", 0)
                return

    def _stoppable(self, history: Sequence[Envelope[Event]]) -> Sequence[Envelope[Event]]:
        """``history`` for an actor's recovery, which a stop signal ends at once."""
        return StoppableHistory(history, lambda: self._signalled or self._stop_reason is not None)

    def _read_log(self) -> Sequence[Envelope[Event]]:
        """Every event the log holds now, read on demand (:class:`LogHistory`: not held)."""
        return LogHistory(self._log, self._log.next_seq)

    def _started(self, spec: ActorSpec, actor: Any, attempt: int) -> ActorStarted:
        return ActorStarted(
            actor=spec.name,
            actor_type=type(actor).__name__,
            seed=self.actor_seed(spec.name),
            attempt=attempt,
        )

    def _on_failure(self, spec: ActorSpec, attempt: int, exc: Exception) -> bool:
        """Record the failure; True if the actor is to be restarted (never for an error that
        says no restart can mend it: ``CoevoError.restartable``)."""
        restart = (
            attempt < spec.max_restarts
            and isinstance(exc, spec.restarted_errors)
            and getattr(exc, "restartable", True)
        )
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
        """Feed numbered batches to the log's writing thread and deliver what it committed."""
        committer = Committer(self._log, self._on_committed)
        interval = sys.getswitchinterval()
        if self._cfg.switch_interval > 0:
            sys.setswitchinterval(self._cfg.switch_interval)
        committer.start()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._deliverer)
                task_status.started()
                await self._feed(committer)
        finally:
            with trio.CancelScope(shield=True):  # a limiter of its own: never queued behind
                # threads that a plug-in's hung calls hold (trio's default has 40 tokens)
                await trio.to_thread.run_sync(committer.stop, limiter=trio.CapacityLimiter(1))
            sys.setswitchinterval(interval)

    async def _feed(self, committer: Committer) -> None:
        """Take batches off the write buffer, number, fold and encode them, and queue them for
        the committer; at most ``IN_FLIGHT`` batches are between here and their delivery."""
        cfg = self._cfg
        while True:
            while not self._pending or self._in_flight >= IN_FLIGHT:
                if self._closing and not self._pending:
                    self._fed_all = True
                    self._delivered.unpark_all()
                    return
                await self._wake.park()
            if cfg.batch_wait > 0 and len(self._pending) < cfg.batch_max:
                await trio.sleep(cfg.batch_wait)
            n = self._batch_size()
            batch = self._pending[:n]
            del self._pending[:n]
            self._pending_bytes = (
                sum(map(_SIZE, self._pending)) if self._pending_bytes and self._pending else 0
            )
            self._space.unpark_all()
            self._in_flight += 1
            envelopes, snapshots = self._numbering.prepare(batch)
            pushed = self._pushed - len(self._pending)
            encoded = self._log.encode(envelopes)
            committer.submit(Prepared(envelopes, snapshots, encoded, pushed))

    def _batch_size(self) -> int:
        """How many pending events the next batch takes: up to ``batch_max``, and up to
        ``write_buffer_bytes`` of them encoded (at least one)."""
        n = min(len(self._pending), self._cfg.batch_max)
        most = self._buffer_bytes
        if self._pending_bytes <= most:
            return n
        ends = list(itertools.accumulate(map(_SIZE, self._pending[:n])))
        return max(1, bisect.bisect_right(ends, most))

    def _on_committed(self, prepared: Prepared, error: BaseException | None) -> None:
        """The committer's report of one batch (run on the event loop, in commit order)."""
        self._committed.append((prepared, error))
        self._delivered.unpark_all()

    async def _deliverer(self) -> None:
        """Deliver committed batches in order; raise the committer's error, if any."""
        committed = self._committed
        while True:
            while not committed:
                if self._fed_all and not self._in_flight:
                    return
                await self._delivered.park()
            prepared, error = committed.popleft()
            if error is not None:
                raise error
            envelopes = prepared.envelopes
            self._next = envelopes[-1].seq + 1
            self._committed_pushed = prepared.pushed
            self._commits.unpark_all()
            for observe in self._observers:
                observe(envelopes)
            await self._deliver(envelopes)
            self._in_flight -= 1
            self._wake.unpark_all()

    def _rebuild_fold(self) -> None:
        """Fold an existing log (a resumed run) so checksums continue from its state."""
        if self._log.next_seq:
            self._numbering.fold, _ = replay_until(self._log, self._projections)

    async def _deliver(self, envelopes: list[Envelope[Event]]) -> None:
        """Hand every subscriber the envelopes it subscribes to and accepts, in seq order.
        Most envelopes of a busy run have no subscriber (steps, checksums): the kinds in the
        batch are looked up once, and a batch with none routed costs one list comprehension."""
        kinds = [type(env.event) for env in envelopes]
        routed = {cls: subs for cls in dict.fromkeys(kinds) if (subs := self._routes_for(cls))}
        if not routed:
            return
        per_sub: dict[_Subscriber, list[Envelope[Event]]] = {}
        for env, cls in zip(envelopes, kinds, strict=True):
            for sub in routed.get(cls, ()):
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
