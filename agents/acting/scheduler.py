"""The scheduler: plans the run's episodes and keeps every env worker busy until the budget is
spent. It is the run's driver: when every planned episode has ended, it returns and the run
completes.

The plan is a pure function of the run seed and the episode index (which task, which seed), so
what each episode is never depends on which worker ran it or when.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
)
from engine.actor import Context
from engine.events import Event
from engine.lifecycle import ActorRestarted
from engine.recovery import Emitted, Replayed
from engine.seeds import derive_rng, derive_seed
from engine.world import Task


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


RESUMED = "the run stopped while it ran; the resume runs it again"
"""An :class:`EpisodeAbandoned`'s reason when a resume re-runs it (logs before 2026-12-05: "")."""


async def abandon_running(
    ctx: Context, running: Iterable[EpisodeAssigned], tail: Sequence[Emitted]
) -> list[EpisodeAssigned]:
    """Record the episodes a stopped run left running as :class:`EpisodeAbandoned` and return
    them in index order, to be run again (a resume). An assignment in ``tail`` (what the
    replay decided beyond the log) never reached its worker: it is run again, not abandoned."""
    unlogged = {ev.episode for ev, _, _ in tail if isinstance(ev, EpisodeAssigned)}
    again = sorted(running, key=lambda job: job.index)
    for job in again:
        if job.episode not in unlogged:
            await ctx.emit(
                EpisodeAbandoned(
                    episode=job.episode, worker=job.worker, purpose=job.purpose, reason=RESUMED
                ),
                corr=job.episode,
                cause=None,
            )
    return again


async def rerun_lost(ctx: Context, job: EpisodeAssigned, restarted: ActorRestarted) -> None:
    """Run again the episode a worker had begun when it failed and was restarted: record the
    lost attempt as :class:`EpisodeAbandoned` with the failure, and assign the episode again
    (same id, index and seed) to the restarted worker, so that nothing planned is lost and the
    episode is the one a run without the failure plays."""
    why = f"worker restarted ({restarted.reason})" if restarted.reason else "worker restarted"
    lost = EpisodeAbandoned(episode=job.episode, worker=job.worker, purpose=job.purpose, reason=why)
    await ctx.emit(lost, corr=job.episode)
    await ctx.emit(job, corr=job.episode)


class Scheduler(Replayed):
    """Assigns ``episodes`` episodes over ``workers``, one in flight per worker.

    A resumed run (:meth:`Replayed.recover`) records the episodes its previous session left
    running as :class:`EpisodeAbandoned` and assigns them again (same index and seed) before
    any new one.
    """

    subscribes = (EpisodeStarted, EpisodeFinished, EpisodeAborted, ActorRestarted)

    def __init__(self, tasks: Sequence[Task], episodes: int, workers: Sequence[str]) -> None:
        if episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {episodes}")
        if not workers:
            raise ValueError("the scheduler needs at least one worker")
        self._tasks = tuple(tasks)
        self._episodes = episodes
        self._workers = tuple(workers)
        self._next = 0  # the next new episode's index
        self._again: deque[int] = deque()  # abandoned episodes to assign first
        self._running: dict[str, EpisodeAssigned] = {}  # worker -> its episode
        self._started: set[str] = set()  # episodes whose worker has begun them
        self._ended = 0

    async def begin(self, ctx: Context) -> None:
        for worker in self._workers:
            await self._assign(ctx, worker)

    async def handle(self, ctx: Context, ev: Event) -> bool:
        if isinstance(ev, EpisodeStarted):
            self._started.add(ev.episode)
            return False
        if isinstance(ev, ActorRestarted):
            # an episode the failed worker had begun is lost and runs again; one it had not
            # begun is still in its mailbox (or, remote, sent again) and the restarted worker
            # runs it
            job = self._running.get(ev.actor)
            if job is not None and job.episode in self._started:
                self._started.discard(job.episode)
                await rerun_lost(ctx, job, ev)
            return False
        assert isinstance(ev, EpisodeFinished | EpisodeAborted)
        if not self._end(ev):
            return False
        if self.finished():
            return True
        await self._assign(ctx, ev.worker)
        return False

    def _end(self, ev: EpisodeFinished | EpisodeAborted) -> bool:
        """Count the end of the episode ``ev.worker`` is running; False if that is not
        ``ev.episode`` (an end of an episode the worker no longer runs is not counted)."""
        job = self._running.get(ev.worker)
        if job is None or job.episode != ev.episode:
            return False
        del self._running[ev.worker]
        self._started.discard(ev.episode)
        self._ended += 1
        return True

    async def resume(self, ctx: Context, tail: list[Emitted]) -> None:
        """Emit what the replay decided beyond the log (assignments excepted: they never
        reached a worker; a lost attempt's abandon included), record every episode left
        running as abandoned, and assign them again, then new ones, to workers that are all
        free."""
        for ev, corr, cause in tail:
            if isinstance(ev, EpisodeAssigned):
                continue
            await ctx.emit(ev, corr=corr, cause=cause)
        again = await abandon_running(ctx, self._running.values(), tail)
        self._again.extend(job.index for job in again)
        self._running.clear()
        self._started.clear()
        await self.begin(ctx)

    def finished(self) -> bool:
        return self._ended == self._episodes

    async def _assign(self, ctx: Context, worker: str) -> None:
        """Give ``worker`` the next episode to run, if any is left."""
        if self._again:
            index = self._again.popleft()
        elif self._next < self._episodes:
            index, self._next = self._next, self._next + 1
        else:
            return
        task, seed = plan_episode(ctx.run_seed, index, self._tasks)
        eid = episode_id(index)
        job = EpisodeAssigned(
            episode=eid,
            index=index,
            worker=worker,
            family=task.family,
            variant=task.variant,
            split=task.split,
            seed=seed,
        )
        self._running[worker] = job
        await ctx.emit(job, corr=eid)
