"""A learning run's evaluation rounds: held-out tasks played at version 0, every
``eval.every``-th version and the last, without the memory and (where the method shows one)
with it; and, where the method has a memory (``method.adapts``), the adaptation test of the
first and last rounds: held-out tasks played several times in a row with a memory of their own
and no weight update.

The trainer (:mod:`agents.learning.trainer`) owns one :class:`EvalRounds`: it asks it which
versions are due, hands it the end of each episode it planned, and puts the jobs it returns at
the front of its queue (evaluation goes first). An update that would replace a version waits
until that version's rounds have all ended (:meth:`EvalRounds.holds`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agents.events.episodes import EpisodeAborted, EpisodeAssigned, EpisodeFinished
from agents.events.policy import AdaptRoundFinished, EvalRoundFinished, EvalRoundStarted
from agents.methods.base import Method
from agents.methods.settings import EvalConfig
from engine.actor import Context
from engine.world import Task

__all__ = ["EvalRounds", "JobMaker", "eval_tasks"]


def eval_tasks(tasks: Sequence[Task], n: int) -> list[Task]:
    """The ``n`` tasks of every evaluation round: spread evenly over ``tasks``, cycling."""
    if not tasks:
        raise ValueError("no evaluation tasks")
    return [tasks[i * len(tasks) // n] for i in range(n)]


class JobMaker(Protocol):
    """The trainer's maker of the next episode's assignment (its id and seed count it)."""

    def __call__(
        self,
        ctx: Context,
        task: Task,
        purpose: str,
        *,
        rollout: str = "plain",
        scope: str = "",
        reflect: bool = False,
    ) -> EpisodeAssigned: ...


@dataclass
class _Round:
    number: int
    version: int
    episodes: set[str]
    memory: bool = False
    successes: int = 0
    score: float = 0.0
    ended: int = 0


@dataclass
class _Adapt:
    """An adaptation round in progress: attempt ``a`` of task ``i`` starts once attempt
    ``a - 1`` has ended and the memory has stored (or refused) its tip."""

    number: int
    version: int
    tasks: list[Task]
    attempts: int
    successes: list[int]
    scores: list[float]
    attempt_of: dict[str, tuple[int, int]] = field(default_factory=dict[str, tuple[int, int]])
    ended: set[str] = field(default_factory=set[str])
    tip_done: set[str] = field(default_factory=set[str])
    last_ended: int = 0
    aborted: int = 0


class EvalRounds:
    """The rounds of one run, their episodes and which versions they still hold.

    Args:
        heldout: evaluation tasks.
        evaluation: the evaluation settings.
        method: the learning method (its ``memory_eval`` mode, if any, plays a second round).
        updates: the run's updates (the last version's round plays ``final_episodes``).
        job: makes each episode's assignment.
    """

    def __init__(
        self,
        heldout: Sequence[Task],
        evaluation: EvalConfig,
        method: Method,
        updates: int,
        job: JobMaker,
    ) -> None:
        self._tasks = eval_tasks(heldout, evaluation.episodes) if evaluation.every else []
        final = evaluation.final_episodes
        self._final = eval_tasks(heldout, final) if evaluation.every and final else []
        self._adapt_tasks = (
            eval_tasks(heldout, evaluation.adapt_tasks) if evaluation.adapt_attempts else []
        )
        self._eval = evaluation
        self._method = method
        self._updates = updates
        self._job = job
        self._number = 0
        self._rounds: dict[str, _Round] = {}  # episode -> its eval round
        self._adapts: dict[str, _Adapt] = {}  # episode -> its adaptation round
        self._open: dict[int, int] = {}  # version -> its rounds still playing
        self._evaluated: set[int] = set()
        # versions whose rounds (evaluation, with memory, adaptation) have all ended; until
        # then no update that would replace that version is requested (a log written before
        # this hold goes on without it: EvalRoundStarted.holds_updates)
        self.hold = True

    @property
    def playing(self) -> bool:
        """Whether an episode of a round has not ended yet."""
        return bool(self._rounds or self._adapts)

    def owns(self, episode: str) -> bool:
        """Whether ``episode`` belongs to a round (not to a training group)."""
        return episode in self._rounds or episode in self._adapts

    def due(self, version: int) -> bool:
        """Whether evaluation rounds are played at ``version`` (0, every ``eval.every``-th,
        and the last)."""
        return bool(self._tasks) and (version % self._eval.every == 0 or version == self._updates)

    def holds(self, version: int) -> bool:
        """Whether an update replacing ``version`` must wait: its rounds have not all ended."""
        return self.hold and self.due(version) and version not in self._evaluated

    def forget(self, episode: str) -> None:
        """A lost attempt of ``episode`` is played again: its own tip is awaited again."""
        if episode in self._adapts:
            self._adapts[episode].tip_done.discard(episode)

    async def start(self, ctx: Context, version: int) -> list[EpisodeAssigned]:
        """Start the rounds of ``version``; returns their jobs, to go first in this order."""
        number = self._number
        self._number += 1
        tasks = self._final if version == self._updates and self._final else self._tasks
        front = await self._round_of(
            ctx, number, version, [self._job(ctx, t, "eval") for t in tasks]
        )
        if (shown := self._method.memory_eval) is not None:  # the same tasks, with the memory
            jobs = [self._job(ctx, t, "eval", rollout=shown, scope="train") for t in tasks]
            front = await self._round_of(ctx, number, version, jobs, memory=True) + front
        if self._adapt_tasks and version in (0, self._updates):
            front = self._start_adapt(ctx, number, version) + front
        return front

    async def _round_of(
        self,
        ctx: Context,
        number: int,
        version: int,
        jobs: list[EpisodeAssigned],
        memory: bool = False,
    ) -> list[EpisodeAssigned]:
        r = _Round(number, version, {j.episode for j in jobs}, memory)
        for job in jobs:
            self._rounds[job.episode] = r
        self._opened(version)
        await ctx.emit(
            EvalRoundStarted(
                round=number,
                policy_version=version,
                episodes=len(jobs),
                memory=memory,
                holds_updates=self.hold,
            )
        )
        return jobs

    def _opened(self, version: int) -> None:
        self._open[version] = self._open.get(version, 0) + 1

    def _closed(self, version: int) -> bool:
        """One round at ``version`` ended; True once all have (the updates they held go on)."""
        self._open[version] -= 1
        if self._open[version]:
            return False
        del self._open[version]
        self._evaluated.add(version)
        return True

    async def ended(
        self,
        ctx: Context,
        ev: EpisodeFinished | EpisodeAborted,
        train_episodes: int,
    ) -> tuple[list[EpisodeAssigned], bool]:
        """One of the rounds' episodes ended (:meth:`owns`), ``train_episodes`` played so far.

        Returns:
            The jobs to go first (an adaptation round's next attempt), and whether a version's
            rounds have all ended with it.
        """
        if ev.episode in self._adapts:
            return await self._adapt_ended(ctx, ev)
        r = self._rounds.pop(ev.episode)
        r.ended += 1
        if isinstance(ev, EpisodeFinished):
            r.successes += int(ev.success)
            r.score += ev.score
        if r.ended < len(r.episodes):
            return [], False
        n = len(r.episodes)
        await ctx.emit(
            EvalRoundFinished(
                round=r.number,
                policy_version=r.version,
                episodes=n,
                success=r.successes / n,
                score=r.score / n,
                train_episodes=train_episodes,
                memory=r.memory,
            )
        )
        return [], self._closed(r.version)

    async def tip_done(self, ctx: Context, episode: str) -> tuple[list[EpisodeAssigned], bool]:
        """The memory stored or refused ``episode``'s tip; as :meth:`ended` returns."""
        if episode not in self._adapts:
            return [], False
        self._adapts[episode].tip_done.add(episode)
        return await self._adapt_next(ctx, episode)

    def _start_adapt(self, ctx: Context, number: int, version: int) -> list[EpisodeAssigned]:
        n = self._eval.adapt_attempts
        a = _Adapt(number, version, list(self._adapt_tasks), n, [0] * n, [0.0] * n)
        self._opened(version)
        return [self._adapt_job(ctx, a, i, 0) for i in range(len(a.tasks))]

    def _adapt_job(self, ctx: Context, a: _Adapt, task: int, attempt: int) -> EpisodeAssigned:
        job = self._job(
            ctx,
            a.tasks[task],
            "eval",
            rollout="tips",
            scope=f"adapt{a.number}-t{task}",
            reflect=attempt + 1 < a.attempts,
        )
        self._adapts[job.episode] = a
        a.attempt_of[job.episode] = (task, attempt)
        return job

    async def _adapt_ended(
        self, ctx: Context, ev: EpisodeFinished | EpisodeAborted
    ) -> tuple[list[EpisodeAssigned], bool]:
        a = self._adapts[ev.episode]
        _, attempt = a.attempt_of[ev.episode]
        if isinstance(ev, EpisodeFinished):
            a.successes[attempt] += int(ev.success)
            a.scores[attempt] += ev.score
        else:
            a.aborted += 1
            a.tip_done.add(ev.episode)  # no reflection comes for an aborted episode
        a.ended.add(ev.episode)
        return await self._adapt_next(ctx, ev.episode)

    async def _adapt_next(self, ctx: Context, episode: str) -> tuple[list[EpisodeAssigned], bool]:
        """Start the next attempt once ``episode`` has ended and its tip is stored (the tip may
        be recorded before or after the episode's end); finish the round after the last."""
        a = self._adapts[episode]
        task, attempt = a.attempt_of[episode]
        last = attempt + 1 == a.attempts
        if episode not in a.ended or (not last and episode not in a.tip_done):
            return [], False
        del self._adapts[episode]
        if not last:
            return [self._adapt_job(ctx, a, task, attempt + 1)], False
        a.last_ended += 1
        if a.last_ended < len(a.tasks):
            return [], False
        n = len(a.tasks)
        await ctx.emit(
            AdaptRoundFinished(
                round=a.number,
                policy_version=a.version,
                tasks=n,
                attempts=a.attempts,
                success=tuple(k / n for k in a.successes),
                score=tuple(x / n for x in a.scores),
                aborted=a.aborted,
            )
        )
        return [], self._closed(a.version)
