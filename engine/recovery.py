"""Rebuilding an actor's state for ``coevo resume`` by replaying it on the log.

An actor whose state is a deterministic fold of the events it subscribes to (it reads no clock
and draws no unseeded randomness) can be rebuilt exactly: feed it every event of the earlier
sessions it would have received, in log order, in a :class:`ReplayContext` that records what
it emits instead of queuing it. What it emits must begin with what the log says it emitted
(else :class:`ResumeDiverged`: the code and the log disagree); what it emits beyond that is
what the stopped process decided but never committed, and is emitted first when the resumed
actor runs. :class:`Replayed` is that recipe as a base class.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar, cast

import trio

from engine.actor import Actor, Context, provenance
from engine.errors import ResumeDiverged
from engine.events import Envelope, Event
from engine.lifecycle import RunResumed
from engine.seeds import derive_rng

T = TypeVar("T")

Emitted = tuple[Event, str, int | None]
"""An event an actor emitted, with its correlation id and cause."""


class ReplayContext:
    """The part of :class:`Context` a replayed actor may use: ``emit`` records, nothing is
    queued, and ``current`` is the envelope being replayed (for causation)."""

    def __init__(self, name: str, run_seed: int) -> None:
        self.name = name
        self.run_seed = run_seed
        self.current: Envelope[Event] | None = None
        self.emitted: list[Emitted] = []

    def rng(self, *identity: str | int) -> random.Random:
        """As :meth:`Context.rng`."""
        return derive_rng(self.run_seed, *identity)

    async def to_thread(
        self, fn: Callable[..., T], *args: Any, limiter: trio.CapacityLimiter | None = None
    ) -> T:
        """As :meth:`Context.to_thread`."""
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter)

    async def emit(
        self, ev: Event, *, corr: str | None = None, cause: int | Literal[False] | None = False
    ) -> None:
        self.emitted.append((ev, *provenance(self.current, corr, cause)))

    def settle(self, logged: Sequence[Event]) -> list[Emitted]:
        """Check that the replay emitted ``logged`` first; return (and forget) the rest.

        Raises:
            ResumeDiverged: the replay emitted something else.
        """
        head = [ev for ev, _, _ in self.emitted[: len(logged)]]
        if head != list(logged):
            pairs = enumerate(zip(head, logged, strict=False))
            at = next((i for i, (a, b) in pairs if a != b), len(head))
            raise ResumeDiverged(
                f"the {self.name}'s replay emits {head[at] if at < len(head) else 'nothing'!r} "
                f"where the log has {logged[at]!r} (its event {at}): the code resuming the run "
                "decides otherwise than the code that wrote it (coevo or a plug-in changed "
                "since, or edited in place: run_started and run_resumed record each session's "
                "coevo_version: a checkout's commit, '.dirty' when it had uncommitted changes)"
            )
        tail = self.emitted[len(logged) :]
        del self.emitted[len(logged) :]
        return tail


class Replayed(Actor):
    """An actor rebuilt on resume by replaying it on the log (see the module docstring).

    Subclasses implement :meth:`handle` (one event; True when the actor's work is done) and
    may override :meth:`begin` (what it emits before any event), :meth:`resume` (what it does
    at the log's end: by default, emit what the replay decided beyond it) and :meth:`finished`.
    They must emit only through the context they are given and keep all state on ``self``.
    """

    _tail: list[Emitted] | None = None  # set by recover: what the log lacks
    _done: bool = False

    @abc.abstractmethod
    async def handle(self, ctx: Context, ev: Event) -> bool:
        """React to one event; True when the actor's work is done (its ``run`` returns)."""

    async def begin(self, ctx: Context) -> None:
        """What the actor does before its first event (nothing by default)."""

    async def resume(self, ctx: Context, tail: list[Emitted]) -> None:
        """Continue after the log's end; ``tail`` is what the replay emitted beyond it."""
        for ev, corr, cause in tail:
            await ctx.emit(ev, corr=corr, cause=cause)

    def finished(self) -> bool:
        """True when there is nothing left to do (checked before waiting for events)."""
        return False

    async def run(self, ctx: Context) -> None:
        if self._tail is None:
            await self.begin(ctx)
        else:
            await self.resume(ctx, self._tail)
        if self._done or self.finished():
            return
        async for env in ctx.events():
            if await self.handle(ctx, env.event):
                return

    async def recover(self, ctx: Context, history: Sequence[Envelope[Event]]) -> None:
        """Replay on ``history`` (each earlier resume included), check what the replay emits
        against the log, and keep what it emits beyond the log for :meth:`run`.

        Raises:
            ResumeDiverged: the replay emits something other than what the log holds.
        """
        replay = ReplayContext(ctx.name, ctx.run_seed)
        rctx = cast(Context, replay)
        logged = [env for env in history if env.actor == ctx.name]
        await self.begin(rctx)
        for env in history:
            ev = env.event
            if isinstance(ev, RunResumed):
                n = sum(1 for e in logged if e.seq < env.seq)
                await self.resume(rctx, replay.settle([e.event for e in logged[:n]]))
            elif isinstance(ev, self.subscribes) and not self._done:
                replay.current = env
                self._done = await self.handle(rctx, ev)
                replay.current = None
        self._tail = replay.settle([e.event for e in logged])
