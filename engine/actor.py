"""Actors: trio tasks that receive committed events and emit new ones.

An actor shares nothing with other actors: it learns about the world only from the envelopes
delivered to its mailbox (the event types it ``subscribes`` to, after they were committed to the
log) and changes it only by emitting events. That is what lets a later backend place actors on
other machines without changing them.
"""

from __future__ import annotations

import abc
import random
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, TypeGuard, TypeVar

import structlog
import trio

from engine.events import Envelope, Event
from engine.seeds import derive_rng

T = TypeVar("T")

PACE_WAIT_S = 1.0
"""The longest :meth:`Context.pace` waits for room in a full write buffer."""


class Host(Protocol):
    """What a :class:`Context` needs of the process hosting its actor: the driver's
    ``Runtime``, or the host of a remote actor (``engine.remote.RemoteHost``)."""

    seed: int

    def actor_seed(self, name: str) -> int:
        """The seed of actor ``name``."""
        ...

    def push(
        self,
        actor: str,
        ev: Event,
        cause: int | None,
        corr: str,
        bounded: bool = False,
        size: int = 0,
    ) -> bool:
        """Queue ``ev`` (``size`` bytes encoded); False (nothing queued) when ``bounded`` and
        the buffer is full."""
        ...

    def check_event(self, ev: Event) -> int:
        """Raise ``EventInvalid`` unless ``ev`` would decode from the log; its encoded size."""
        ...

    async def wait_space(self) -> None:
        """Wait until a full buffer has room."""
        ...

    def subscribed(self, cls: type[Event], besides: str = "") -> bool:
        """Whether some actor of the run, other than the one named ``besides``, subscribes to
        events of ``cls`` (True where that cannot be known)."""
        ...

    def ctrl_c_possible(self) -> bool:
        """Whether a ``KeyboardInterrupt`` raised now in an actor's code on the event loop's
        thread may be the user's Ctrl-C: the runtime does not take SIGINT as a stop of its
        own, or a stop signal has arrived (a second one goes where it went before). Else it
        is the code's own (a plug-in world raising it)."""
        ...


class Actor(abc.ABC):
    """Base class of actors. Subclasses set ``subscribes`` and implement :meth:`run`."""

    subscribes: ClassVar[tuple[type[Event], ...]] = ()

    @abc.abstractmethod
    async def run(self, ctx: Context) -> None:
        """The actor's life. Returning ends the actor (and the run, for the driver)."""

    async def recover(self, ctx: Context, history: Sequence[Envelope[Event]]) -> None:  # noqa: B027
        """Rebuild the state a resumed run's actor had (``coevo resume``), before :meth:`run`.

        Called once, on the first start of a resumed run. ``history`` is every event the
        earlier sessions committed, in seq order; each earlier resume begins with a
        ``RunResumed``. The default keeps nothing: actors with state worth keeping override
        it (and may emit what the log lacks once :meth:`run` starts).
        """


@dataclass(frozen=True)
class ActorSpec:
    """How the runtime starts and supervises one actor.

    Attributes:
        name: unique actor name; also its identity for seeds and in envelopes.
        factory: builds a fresh actor (called again on every restart).
        on_failure: "restart" (up to ``max_restarts`` times) or "stop" (fail the run).
        max_restarts: restarts allowed before the failure stops the run.
        driver: the run completes when this actor's ``run`` returns.
        accepts: optional filter on subscribed events (e.g. only those addressed to this actor).
        restart_for: with "restart", the failures restarted (empty: any); any other stops the
            run (a remote inference actor restarts when its process is lost, not when its code
            raised on a request nobody would answer again).
        recover_on_restart: a restarted actor is rebuilt as on resume: its
            :meth:`Actor.recover` is given the whole log committed so far, and its mailbox
            skips what that history holds (a remote learner, whose state is a fold of the log
            and whose weights are in the newest checkpoint the log names).
    """

    name: str
    factory: Callable[[], Actor]
    on_failure: Literal["restart", "stop"] = "stop"
    max_restarts: int = 3
    driver: bool = False
    accepts: Callable[[Event], bool] | None = None
    restart_for: tuple[type[Exception], ...] = ()
    recover_on_restart: bool = False

    @property
    def restarted_errors(self) -> tuple[type[Exception], ...]:
        """The errors supervision restarts this actor for while it has restarts left: none
        with "stop", ``restart_for`` with "restart" (every error when it is empty)."""
        if self.on_failure != "restart":
            return ()
        return self.restart_for or (Exception,)

    def __post_init__(self) -> None:
        if not self.name or self.name == "runtime":
            raise ValueError(f"invalid actor name {self.name!r}")
        if self.on_failure not in ("restart", "stop"):
            raise ValueError(f"on_failure must be 'restart' or 'stop', got {self.on_failure!r}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")


class Context:
    """What an actor may use: its mailbox, its seeds, ``emit``, a logger and worker threads.

    Attributes:
        name: the actor's name.
        seed: the actor's seed, derived from the run seed and the name.
        run_seed: the run seed (derive further seeds with :meth:`rng`).
        attempt: 0 on first start, n after the n-th restart.
        log: a structlog logger bound to the actor.
    """

    def __init__(
        self,
        runtime: Host,
        name: str,
        mailbox: Mailbox,
        *,
        source: bool,
        attempt: int,
    ) -> None:
        self._runtime = runtime
        self._push = runtime.push
        self._check = runtime.check_event
        self._mailbox = mailbox
        self._source = source
        self.name = name
        self.run_seed = runtime.seed
        self.seed = runtime.actor_seed(name)
        self.attempt = attempt
        self.current: Envelope[Event] | None = None
        self.log = structlog.get_logger("coevo").bind(actor=name)

    def rng(self, *identity: str | int) -> random.Random:
        """A random stream for ``identity`` under the run seed (independent of scheduling)."""
        return derive_rng(self.run_seed, *identity)

    async def emit(
        self, ev: Event, *, corr: str | None = None, cause: int | Literal[False] | None = False
    ) -> None:
        """Queue ``ev`` for the log; it is delivered to subscribers once committed.

        ``cause`` defaults to the seq of the envelope being handled and ``corr`` to its
        correlation id. An actor with no subscriptions (a pure source) waits here while the
        write buffer is full; an actor that reacts to events never waits (its output is bounded
        by its input), which keeps back-pressure free of cycles. ``emit`` is a checkpoint only
        when it waits.

        Raises:
            EventInvalid: ``ev`` would not decode from the log (a field of another type than
                declared); nothing is queued.
        """
        size = self._check(ev)
        corr, cause = provenance(self.current, corr, cause)
        while not self._push(self.name, ev, cause, corr, self._source, size):
            await self._runtime.wait_space()

    async def pace(self) -> None:
        """A checkpoint for an actor that emits many events for one it handles (an episode's
        turns, when a scripted agent plays a world stepped on the event loop, never wait on
        anything): the writer commits, other actors run and a stop signal is taken between
        them, and while the write buffer is full the actor waits for room, at most
        :data:`PACE_WAIT_S` seconds (a reacting actor waits no longer: the writer may itself
        be waiting to deliver into this actor's mailbox)."""
        await trio.lowlevel.checkpoint()
        with trio.move_on_after(PACE_WAIT_S):
            await self._runtime.wait_space()

    def ctrl_c_possible(self) -> bool:
        """Whether a ``KeyboardInterrupt`` raised now on the loop's thread may be the user's
        Ctrl-C (:meth:`Host.ctrl_c_possible`); else it is the actor's code's own."""
        return self._runtime.ctrl_c_possible()

    def answered(self, cls: type[Event]) -> bool:
        """Whether some other actor of the run subscribes to ``cls`` (an event nobody else
        subscribes to is recorded and never answered: a request would wait forever)."""
        return self._runtime.subscribed(cls, besides=self.name)

    def events(self) -> Inbox:
        """Iterate the envelopes delivered to this actor, in seq order.

        Sets :attr:`current` to the envelope being handled (for causation). The iterator is a
        plain object, not an async generator, so leaving the loop early needs no cleanup.
        """
        return Inbox(self, self._mailbox)

    async def to_thread(
        self, fn: Callable[..., T], *args: Any, limiter: trio.CapacityLimiter | None = None
    ) -> T:
        """Run blocking ``fn(*args)`` in a worker thread (never on the event loop); with
        ``limiter``, wait for one of its tokens first (at most that many such calls at once)."""
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter)


@asynccontextmanager
async def task_nursery() -> AsyncGenerator[trio.Nursery]:
    """A trio nursery for an actor's own concurrent tasks (batches in flight) that fails with
    the error itself, not an exception group: supervision records the error's type and message
    (``ActorFailed``) and decides a restart by its class (``ActorSpec.restart_for``). The first
    error that is not a cancellation is raised; the others are dropped (their tasks were
    cancelled because of it)."""
    try:
        async with trio.open_nursery() as nursery:
            yield nursery
    except BaseExceptionGroup as group:
        raise (first_error(group) or next(error_leaves(group))) from None


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The first error of ``group`` (nested groups included) that is not a cancellation;
    None if it holds cancellations only."""
    return next((e for e in error_leaves(group) if not isinstance(e, trio.Cancelled)), None)


def error_leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    """The errors of ``group`` and of the groups nested in it, depth first, in order."""
    for exc in group.exceptions:
        if _is_group(exc):
            yield from error_leaves(exc)
        else:
            yield exc


def _is_group(exc: BaseException) -> TypeGuard[BaseExceptionGroup[BaseException]]:
    # isinstance alone narrows to BaseExceptionGroup[Unknown]: the members are exceptions
    return isinstance(exc, BaseExceptionGroup)


def provenance(
    current: Envelope[Event] | None, corr: str | None, cause: int | Literal[False] | None
) -> tuple[str, int | None]:
    """The correlation id and cause an emitted event gets (see :meth:`Context.emit`): by
    default those of ``current``, the envelope being handled (none: "" and None)."""
    if cause is False:
        cause = current.seq if current is not None else None
    if corr is None:
        corr = current.corr if current is not None else ""
    return corr, cause


class Mailbox:
    """An actor's bounded inbox of committed envelopes.

    Delivered batches are flattened here; the mailbox outlives an actor's restarts, so a
    restarted actor continues after the envelope its predecessor failed on.

    Attributes:
        skip_through: envelopes up to this seq are dropped (an actor rebuilt from the log up
            to it, ``ActorSpec.recover_on_restart``); -1: none.
    """

    def __init__(self, channel: trio.MemoryReceiveChannel[list[Envelope[Event]]]) -> None:
        self.channel = channel
        self._batch: list[Envelope[Event]] = []
        self._i = 0
        self.skip_through = -1

    async def receive(self) -> Envelope[Event]:
        """The next envelope. Raises ``trio.EndOfChannel`` when the run closes the mailbox."""
        while True:
            if self._i >= len(self._batch):
                self._batch = await self.channel.receive()
                self._i = 0
            env = self._batch[self._i]
            self._i += 1
            if env.seq > self.skip_through:
                return env

    def receive_nowait(self) -> Envelope[Event]:
        """The next envelope if one is already here.

        Raises:
            trio.WouldBlock: none is waiting.
            trio.EndOfChannel: the run closed the mailbox.
        """
        while True:
            if self._i >= len(self._batch):
                self._batch = self.channel.receive_nowait()
                self._i = 0
            env = self._batch[self._i]
            self._i += 1
            if env.seq > self.skip_through:
                return env


class Inbox:
    """Async iterator over a :class:`Mailbox` that records the envelope being handled."""

    def __init__(self, ctx: Context, mailbox: Mailbox) -> None:
        self._ctx = ctx
        self._mailbox = mailbox

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> Envelope[Event]:
        try:
            env = await self._mailbox.receive()
        except trio.EndOfChannel:
            self._ctx.current = None
            raise StopAsyncIteration from None
        self._ctx.current = env
        return env

    def ready(self, max_size: int) -> list[Envelope[Event]]:
        """The envelopes already delivered, at most ``max_size``, without waiting (a proxy
        forwarding its mailbox in batches). :attr:`Context.current` is left as it was."""
        out: list[Envelope[Event]] = []
        while len(out) < max_size:
            try:
                out.append(self._mailbox.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        return out

    async def gather(
        self,
        first: Envelope[Event],
        max_size: int,
        wait: float,
        *,
        stop: Callable[[Event], bool] | None = None,
    ) -> tuple[list[Envelope[Event]], Envelope[Event] | None]:
        """``first`` and the envelopes that arrive within ``wait`` seconds after it, at most
        ``max_size`` in all: a batch of requests for one model call.

        Args:
            first: the envelope that starts the batch.
            max_size: most envelopes in the batch.
            wait: seconds to wait for more after ``first``.
            stop: ends the batch at an envelope it accepts, which is returned apart for the
                caller to handle next (e.g. a new policy version between batches).

        Returns:
            ``(batch, held)``: ``held`` is the envelope ``stop`` accepted, or None. The batch
            also ends when the mailbox closes; iterating again then ends at once.
        """
        batch = [first]
        with trio.move_on_after(wait):
            while len(batch) < max_size:
                try:
                    env = await self.__anext__()
                except StopAsyncIteration:
                    break
                if stop is not None and stop(env.event):
                    return batch, env
                batch.append(env)
        return batch, None
