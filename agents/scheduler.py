"""The scheduler: plans the run's episodes and keeps every env worker busy until the budget is
spent. It is the run's driver: when every planned episode has ended, it returns and the run
completes.

The plan is a pure function of the run seed and the episode index (which task, which seed), so
what each episode is never depends on which worker ran it or when.
"""

from __future__ import annotations

from collections.abc import Sequence

from agents.episode_events import (
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
)
from engine.actor import Actor, Context
from engine.lifecycle import ActorRestarted
from engine.seeds import derive_rng, derive_seed
from scenarios.worlds.base import Task


def plan_episode(run_seed: int, index: int, tasks: Sequence[Task]) -> tuple[Task, int]:
    """The task and seed of the ``index``-th episode of a run (pure).

    Raises:
        ValueError: ``tasks`` is empty.
    """
    if not tasks:
        raise ValueError("no tasks to plan episodes from")
    rng = derive_rng(run_seed, "plan", index)
    task = tasks[rng.randrange(len(tasks))]
    return task, derive_seed(run_seed, "episode", index)


def episode_id(index: int) -> str:
    """The id of the ``index``-th episode."""
    return f"ep{index:06d}"


class Scheduler(Actor):
    """Assigns ``episodes`` episodes over ``workers``, one in flight per worker."""

    subscribes = (EpisodeStarted, EpisodeFinished, EpisodeAborted, ActorRestarted)

    def __init__(self, tasks: Sequence[Task], episodes: int, workers: Sequence[str]) -> None:
        if episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {episodes}")
        if not workers:
            raise ValueError("the scheduler needs at least one worker")
        self._tasks = tuple(tasks)
        self._episodes = episodes
        self._workers = tuple(workers)

    async def run(self, ctx: Context) -> None:
        next_index = 0
        in_flight: dict[str, str] = {}  # worker -> episode id
        started: set[str] = set()  # episodes whose worker has begun them
        ended = 0
        for worker in self._workers[: self._episodes]:
            await self._assign(ctx, next_index, worker)
            in_flight[worker] = episode_id(next_index)
            next_index += 1
        async for env in ctx.events():
            ev = env.event
            if isinstance(ev, EpisodeStarted):
                started.add(ev.episode)
                continue
            if isinstance(ev, ActorRestarted):
                # an episode the failed worker had begun is lost; one it had not begun is still
                # in its mailbox and the restarted worker runs it
                episode = in_flight.get(ev.actor)
                if episode is None or episode not in started:
                    continue
                await ctx.emit(
                    EpisodeAborted(episode=episode, worker=ev.actor, reason="worker restarted")
                )
                continue
            assert isinstance(ev, EpisodeFinished | EpisodeAborted)
            if in_flight.get(ev.worker) != ev.episode:
                continue  # already counted (an abort recorded for a restarted worker)
            del in_flight[ev.worker]
            started.discard(ev.episode)
            ended += 1
            if ended == self._episodes:
                return
            if next_index < self._episodes:
                await self._assign(ctx, next_index, ev.worker)
                in_flight[ev.worker] = episode_id(next_index)
                next_index += 1

    async def _assign(self, ctx: Context, index: int, worker: str) -> None:
        task, seed = plan_episode(ctx.run_seed, index, self._tasks)
        eid = episode_id(index)
        await ctx.emit(
            EpisodeAssigned(
                episode=eid,
                index=index,
                worker=worker,
                family=task.family,
                variant=task.variant,
                split=task.split,
                seed=seed,
            ),
            corr=eid,
        )
