"""The GRPO trainer: the driver of a learning run.

It plans groups of K rollouts of one task, keeps every env worker busy, computes each group's
advantages when its last episode ends (:class:`AdvantagesComputed`), asks the learner for an
update every ``groups_per_update`` groups (:class:`GradientRequested`), runs evaluation rounds on
held-out variants, and returns (ending the run) after the last update's evaluation.

Staleness: group ``g`` feeds update ``g // groups_per_update``, which produces version
``g // groups_per_update + 1``. A group starts only once the policy is at least at version
``g // groups_per_update - max_staleness``, so no sample is older than the bound allows.

What each episode is (task, seed) is a pure function of the run seed and its index, so it never
depends on which worker ran it or when.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from agents.advantages import group_advantages, group_stats
from agents.episode_events import EpisodeAborted, EpisodeAssigned, EpisodeFinished
from agents.policy_events import (
    AdvantagesComputed,
    EvalRoundFinished,
    EvalRoundStarted,
    GradientRequested,
    PolicyUpdated,
)
from agents.scheduler import episode_id, plan_episode
from engine.actor import Actor, Context
from engine.seeds import derive_seed
from scenarios.schema import EvalConfig, GrpoConfig
from scenarios.worlds.base import Task

ADV_EPS = 1e-6


@dataclass
class _Group:
    task: Task
    episodes: list[str]
    rewards: dict[str, float] = field(default_factory=dict[str, float])
    ended: int = 0


@dataclass
class _Round:
    number: int
    version: int
    episodes: set[str]
    successes: int = 0
    score: float = 0.0
    ended: int = 0


def eval_tasks(tasks: Sequence[Task], n: int) -> list[Task]:
    """The ``n`` tasks of every evaluation round: spread evenly over ``tasks``, cycling."""
    if not tasks:
        raise ValueError("no evaluation tasks")
    return [tasks[i * len(tasks) // n] for i in range(n)]


def gradient_request(
    grpo: GrpoConfig, update: int, episodes: Sequence[str], advantages: Sequence[float]
) -> GradientRequested:
    """The request for update ``update`` with the scenario's loss settings."""
    return GradientRequested(
        update=update,
        episodes=tuple(episodes),
        advantages=tuple(advantages),
        epochs=grpo.epochs,
        minibatch=grpo.minibatch,
        lr=grpo.lr,
        clip_low=grpo.clip_low,
        clip_high=grpo.clip_high,
        dual_clip=grpo.dual_clip or None,
        kl_coef=grpo.kl_coef,
        aggregation=grpo.aggregation,
        max_grad_norm=grpo.max_grad_norm,
        max_staleness=grpo.max_staleness,
    )


def rule_name(grpo: GrpoConfig) -> str:
    """The advantage formula's name, as recorded in :class:`AdvantagesComputed`."""
    return f"grpo-{'std' if grpo.std_norm else 'mean'}-{grpo.reward}"


class GrpoTrainer(Actor):
    """Plans, feeds and trains a GRPO run.

    Args:
        tasks: training tasks.
        heldout: evaluation tasks.
        episodes: training episodes (whole updates of ``groups_per_update * group_size``).
        workers: env worker names.
        grpo: the GRPO settings.
        evaluation: the evaluation settings.
    """

    subscribes = (EpisodeFinished, EpisodeAborted, PolicyUpdated)

    def __init__(
        self,
        tasks: Sequence[Task],
        heldout: Sequence[Task],
        episodes: int,
        workers: Sequence[str],
        grpo: GrpoConfig,
        evaluation: EvalConfig,
    ) -> None:
        per_update = grpo.group_size * grpo.groups_per_update
        if episodes < per_update:
            raise ValueError(
                f"run.episodes = {episodes} is less than one update "
                f"(group_size * groups_per_update = {per_update})"
            )
        if not tasks or not workers:
            raise ValueError("the trainer needs tasks and workers")
        self._tasks = tuple(tasks)
        self._eval_tasks = eval_tasks(heldout, evaluation.episodes) if evaluation.every else []
        self._updates = episodes // per_update
        self._workers = tuple(workers)
        self._grpo = grpo
        self._eval = evaluation
        # run state (set up in run)
        self._queue: deque[EpisodeAssigned] = deque()
        self._free: list[str] = []
        self._groups: dict[str, _Group] = {}
        self._owner: dict[str, str] = {}  # episode -> group
        # completed groups not yet trained on, in completion order
        self._pending: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {}
        self._rounds: dict[str, _Round] = {}  # episode -> its eval round
        self._index = 0
        self._planned = 0
        self._requested = 0
        self._version = 0
        self._round = 0

    @property
    def updates(self) -> int:
        """The number of updates this run makes."""
        return self._updates

    async def run(self, ctx: Context) -> None:
        self._free = list(self._workers)
        if self._eval_tasks:
            await self._start_round(ctx)
        await self._fill(ctx)
        async for env in ctx.events():
            ev = env.event
            if isinstance(ev, PolicyUpdated):
                self._version = ev.policy_version
                if self._eval_tasks and (
                    ev.policy_version % self._eval.every == 0 or ev.policy_version == self._updates
                ):
                    await self._start_round(ctx)
            else:
                assert isinstance(ev, EpisodeFinished | EpisodeAborted)
                self._free.append(ev.worker)
                await self._ended(ctx, ev)
            if self._finished():
                return
            await self._fill(ctx)

    def _finished(self) -> bool:
        return self._version == self._updates and not self._rounds and not self._queue

    async def _fill(self, ctx: Context) -> None:
        """Plan what may start, then hand queued episodes to free workers."""
        per = self._grpo.groups_per_update
        while (
            self._planned < self._updates * per
            and self._version >= self._planned // per - self._grpo.max_staleness
            and len(self._queue) < len(self._free)
        ):
            self._plan_group(ctx)
        while self._queue and self._free:
            job = self._queue.popleft()
            worker = self._free.pop(0)
            await ctx.emit(msgspec.structs.replace(job, worker=worker), corr=job.episode)

    def _plan_group(self, ctx: Context) -> None:
        g = self._planned
        task, _ = plan_episode(ctx.run_seed, g, self._tasks)
        gid = f"g{g:05d}"
        group = _Group(task=task, episodes=[])
        for _ in range(self._grpo.group_size):
            job = self._job(ctx, task, "train")
            group.episodes.append(job.episode)
            self._owner[job.episode] = gid
            self._queue.append(job)
        self._groups[gid] = group
        self._planned += 1

    def _job(self, ctx: Context, task: Task, purpose: str) -> EpisodeAssigned:
        index = self._index
        self._index += 1
        return EpisodeAssigned(
            episode=episode_id(index),
            index=index,
            worker="",
            family=task.family,
            variant=task.variant,
            split=task.split,
            seed=derive_seed(ctx.run_seed, "episode", index),
            purpose=purpose,
        )

    async def _start_round(self, ctx: Context) -> None:
        jobs = [self._job(ctx, t, "eval") for t in self._eval_tasks]
        r = _Round(number=self._round, version=self._version, episodes={j.episode for j in jobs})
        self._round += 1
        for job in jobs:
            self._rounds[job.episode] = r
        self._queue.extendleft(reversed(jobs))  # evaluation goes first
        await ctx.emit(
            EvalRoundStarted(round=r.number, policy_version=r.version, episodes=len(jobs))
        )

    async def _ended(self, ctx: Context, ev: EpisodeFinished | EpisodeAborted) -> None:
        if ev.episode in self._rounds:
            await self._round_ended(ctx, ev)
            return
        gid = self._owner.pop(ev.episode)
        group = self._groups[gid]
        group.ended += 1
        if isinstance(ev, EpisodeFinished):
            group.rewards[ev.episode] = (
                ev.score if self._grpo.reward == "score" else (1.0 if ev.success else 0.0)
            )
        if group.ended == len(group.episodes):
            await self._group_done(ctx, gid, group)

    async def _round_ended(self, ctx: Context, ev: EpisodeFinished | EpisodeAborted) -> None:
        r = self._rounds.pop(ev.episode)
        r.ended += 1
        if isinstance(ev, EpisodeFinished):
            r.successes += int(ev.success)
            r.score += ev.score
        if r.ended == len(r.episodes):
            n = len(r.episodes)
            await ctx.emit(
                EvalRoundFinished(
                    round=r.number,
                    policy_version=r.version,
                    episodes=n,
                    success=r.successes / n,
                    score=r.score / n,
                    train_episodes=self._requested * self._per_update(),
                )
            )

    def _per_update(self) -> int:
        return self._grpo.group_size * self._grpo.groups_per_update

    async def _group_done(self, ctx: Context, gid: str, group: _Group) -> None:
        episodes = [e for e in group.episodes if e in group.rewards]
        rewards = [group.rewards[e] for e in episodes]
        advantages = (
            group_advantages(rewards, std_norm=self._grpo.std_norm, eps=ADV_EPS) if rewards else []
        )
        mean, std = group_stats(rewards) if rewards else (0.0, 0.0)
        await ctx.emit(
            AdvantagesComputed(
                group=gid,
                update=self._requested,
                family=group.task.family,
                variant=group.task.variant,
                episodes=tuple(episodes),
                rewards=tuple(rewards),
                advantages=tuple(advantages),
                rule=rule_name(self._grpo),
                eps=ADV_EPS,
                mean=mean,
                std=std,
            )
        )
        del self._groups[gid]
        self._pending[gid] = (tuple(episodes), tuple(advantages))
        if len(self._pending) == self._grpo.groups_per_update:
            await self._request(ctx)

    async def _request(self, ctx: Context) -> None:
        episodes: list[str] = []
        advantages: list[float] = []
        for eps, advs in self._pending.values():
            episodes += eps
            advantages += advs
        self._pending.clear()
        await ctx.emit(gradient_request(self._grpo, self._requested, episodes, advantages))
        self._requested += 1
