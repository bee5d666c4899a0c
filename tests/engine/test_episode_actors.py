"""Scheduler and env workers on the runtime: budgets, restarts, outcomes independent of timing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

import pytest
import trio
import trio.testing

from agents.acting.env_worker import EnvWorker
from agents.acting.projections import EpisodeTable
from agents.acting.scheduler import Scheduler
from agents.acting.scripted import Explorer
from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from engine.actor import Actor, ActorSpec, Context
from engine.eventlog import MemoryEventLog
from engine.lifecycle import ActorRestarted, RunStarted, RunStopped
from engine.projection import ActorStats
from engine.replay import verify_log
from engine.runtime import Runtime
from engine.world import Observation, Task, TextWorld
from scenarios.assemble import fact_checks
from scenarios.worlds.minilab import MiniLab

STARTED = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=5, coevo_version="0")


class FlakyFactory:
    """Builds a MiniLab, except that its first ``failures`` calls raise."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def __call__(self) -> TextWorld:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("world failed to start")
        return MiniLab(families=("fetch",), train_variants=20)


class CrashingWorker(Actor):
    """An env worker whose first life dies mid-episode (after the start and one turn of its
    first episode, as a lost process would); once restarted it is a plain :class:`EnvWorker`."""

    subscribes = EnvWorker.subscribes

    def __init__(self, make_world: Callable[[], TextWorld]) -> None:
        self._make_world = make_world

    async def run(self, ctx: Context) -> None:
        if ctx.attempt > 0:
            await EnvWorker(self._make_world, Explorer).run(ctx)
            return
        async for env in ctx.events():
            job = env.event
            assert isinstance(job, EpisodeAssigned)
            ep, one = job.episode, ("a",)
            await ctx.emit(
                EpisodeStarted(
                    episode=ep, worker=ctx.name, goal="g", observation="o", admissible=one
                )
            )
            turn = StepTaken(
                episode=ep, turn=0, action="a", observation="o", admissible=one, reward=0.0,
                done=False, score=0.0,
            )  # fmt: skip
            await ctx.emit(turn)
            raise RuntimeError("the worker's process died")


def run_episodes(
    episodes: int,
    workers: int,
    make_world: FlakyFactory,
    worker: Callable[[str], Actor] | None = None,
) -> MemoryEventLog:
    tasks = MiniLab(families=("fetch",), train_variants=20).tasks("fetch", "train")
    names = [f"w{i}" for i in range(workers)]

    def default(name: str) -> Actor:
        return EnvWorker(make_world, Explorer)

    specs = [
        ActorSpec(name="scheduler", factory=partial(Scheduler, tasks, episodes, names), driver=True)
    ]
    for name in names:
        specs.append(
            ActorSpec(
                name=name,
                factory=partial(worker, name)
                if worker
                else partial(EnvWorker, make_world, Explorer),
                on_failure="restart",
                max_restarts=3,
                accepts=lambda ev, name=name: getattr(ev, "worker", None) == name,
            )
        )
    log = MemoryEventLog()
    runtime = Runtime(log, STARTED, specs, [ActorStats(), EpisodeTable()], seed=5)
    trio.run(runtime.run)
    return log


def test_every_planned_episode_ends_exactly_once() -> None:
    log = run_episodes(12, 3, FlakyFactory(0))
    envs = list(log.read())
    assigned = [e.event.episode for e in envs if isinstance(e.event, EpisodeAssigned)]
    finished = [e.event.episode for e in envs if isinstance(e.event, EpisodeFinished)]
    assert sorted(assigned) == sorted(finished) == [f"ep{i:06d}" for i in range(12)]
    assert isinstance(envs[-1].event, RunStopped) and envs[-1].event.reason == "completed"
    assert verify_log(log, [ActorStats(), EpisodeTable()]).ok


def test_worker_restarted_before_its_episode_began_still_runs_it() -> None:
    log = run_episodes(6, 2, FlakyFactory(1))
    envs = list(log.read())
    assert any(isinstance(e.event, ActorRestarted) for e in envs)
    assert not any(isinstance(e.event, EpisodeAborted) for e in envs)
    finished = [e.event.episode for e in envs if isinstance(e.event, EpisodeFinished)]
    assert sorted(finished) == [f"ep{i:06d}" for i in range(6)]


def test_an_episode_a_worker_dies_in_runs_again_and_every_planned_one_finishes() -> None:
    def worker(name: str) -> Actor:
        if name == "w1":
            return CrashingWorker(FlakyFactory(0))
        return EnvWorker(FlakyFactory(0), Explorer)

    log = run_episodes(6, 2, FlakyFactory(0), worker)
    envs = list(log.read())
    lost = [e.event for e in envs if isinstance(e.event, EpisodeAbandoned)]
    assert [(a.episode, a.worker) for a in lost] == [("ep000001", "w1")]
    assert lost[0].reason == "worker restarted (RuntimeError: the worker's process died)"
    assert not any(isinstance(e.event, EpisodeAborted) for e in envs)
    finished = [e.event for e in envs if isinstance(e.event, EpisodeFinished)]
    assert sorted(f.episode for f in finished) == [f"ep{i:06d}" for i in range(6)]
    # the re-run is the episode a run without the crash plays
    clean = run_episodes(6, 2, FlakyFactory(0)).read()
    outcome = {f.episode: (f.steps, f.score) for f in finished}
    assert outcome == {
        e.event.episode: (e.event.steps, e.event.score)
        for e in clean
        if isinstance(e.event, EpisodeFinished)
    }
    checked = verify_log(log, [ActorStats(), EpisodeTable()], fact_checks())
    assert checked.ok, checked.error


def test_episode_outcomes_do_not_depend_on_worker_count() -> None:
    def outcomes(workers: int) -> dict[str, tuple[int, float, bool]]:
        envs = run_episodes(10, workers, FlakyFactory(0)).read()
        return {
            e.event.episode: (e.event.steps, e.event.score, e.event.success)
            for e in envs
            if isinstance(e.event, EpisodeFinished)
        }

    assert outcomes(1) == outcomes(4)


class HangingWorld(MiniLab):
    """A MiniLab stepped in a worker thread whose step hangs (on turn 2) while ``hangs`` has
    some left, until the test releases it."""

    blocking = True

    def __init__(self, hangs: list[int], release: threading.Event) -> None:
        super().__init__(families=("fetch",), train_variants=20)
        self.hangs = hangs
        self.release = release
        self.turn = 0

    def reset(self, task: Task, seed: int) -> Observation:
        self.turn = 0
        return super().reset(task, seed)

    def step(self, action: str) -> Observation:
        self.turn += 1
        if self.hangs[0] and self.turn == 2:
            self.hangs[0] -= 1
            self.release.wait()  # hangs; the worker's timeout abandons this thread
        return super().step(action)


def test_a_hung_world_ends_its_episode_by_the_timeout_and_the_run_goes_on() -> None:
    tasks = MiniLab(families=("fetch",), train_variants=20).tasks("fetch", "train")
    hangs = [1]
    release = threading.Event()
    specs = [
        ActorSpec(
            name="scheduler",
            factory=partial(Scheduler, tasks[:4], 4, ["w0"]),
            driver=True,
        ),
        ActorSpec(
            name="w0",
            factory=partial(
                EnvWorker, partial(HangingWorld, hangs, release), Explorer, step_timeout=600.0
            ),
            accepts=lambda ev: getattr(ev, "worker", None) == "w0",
        ),
    ]
    log = MemoryEventLog()
    runtime = Runtime(log, STARTED, specs, [ActorStats(), EpisodeTable()], seed=5)
    clock = trio.testing.MockClock(autojump_threshold=0.5)  # idle 0.5 s: jump to the deadline
    try:
        trio.run(runtime.run, clock=clock)
    finally:
        release.set()  # let the abandoned thread finish
    envs = list(log.read())
    aborted = [e.event for e in envs if isinstance(e.event, EpisodeAborted)]
    finished = [e.event.episode for e in envs if isinstance(e.event, EpisodeFinished)]
    assert [a.episode for a in aborted] == ["ep000000"]
    assert aborted[0].reason == (
        "TimeoutError: world.step did not return within 600 s (world.step_timeout); "
        "its thread and world were abandoned"
    )
    assert finished == ["ep000001", "ep000002", "ep000003"]
    assert isinstance(envs[-1].event, RunStopped) and envs[-1].event.reason == "completed"
    assert clock.current_time() >= 600


def test_a_step_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="step_timeout must be > 0 or None, got 0"):
        EnvWorker(MiniLab, Explorer, step_timeout=0)


class ExitingWorld(MiniLab):
    """A plug-in world that calls ``sys.exit`` in every third episode's second step, and whose
    ``close`` raises."""

    def __init__(self) -> None:
        super().__init__(families=("fetch",), train_variants=20)
        self.episode = self.turn = 0

    def reset(self, task: Task, seed: int) -> Observation:
        self.episode, self.turn = self.episode + 1, 0
        return super().reset(task, seed)

    def step(self, action: str) -> Observation:
        self.turn += 1
        if self.episode % 3 == 0 and self.turn == 2:
            raise SystemExit(4)
        return super().step(action)

    def close(self) -> None:
        raise OSError("cannot close")


def test_a_world_that_calls_sys_exit_or_cannot_close_ends_its_episode_not_the_run() -> None:
    log = run_episodes(9, 2, ExitingWorld)  # type: ignore[arg-type]
    envs = list(log.read())
    aborted = [e.event for e in envs if isinstance(e.event, EpisodeAborted)]
    finished = [e.event for e in envs if isinstance(e.event, EpisodeFinished)]
    assert aborted and all(
        a.reason == "RuntimeError: world.step called sys.exit(4)" for a in aborted
    )
    assert len(aborted) + len(finished) == 9
    assert not any(isinstance(e.event, ActorRestarted) for e in envs)
    assert isinstance(envs[-1].event, RunStopped) and envs[-1].event.reason == "completed"


class FailsThenCannotRebuild:
    """Builds a world whose first step raises, then fails to build another; counts each
    world's ``close`` calls."""

    def __init__(self) -> None:
        self.built = 0
        self.closes: list[int] = []

    def __call__(self) -> TextWorld:
        self.built += 1
        if self.built > 1:
            raise RuntimeError("world failed to start")
        counts, n = self.closes, len(self.closes)
        counts.append(0)

        class Failing(MiniLab):
            def step(self, action: str) -> Observation:
                raise RuntimeError("world step failed")

            def close(self) -> None:
                counts[n] += 1

        return Failing(families=("fetch",), train_variants=20)


def test_a_world_whose_rebuild_fails_is_closed_once() -> None:
    """A worker closed its failed world, its rebuild raised, and its ``finally`` closed the
    same world again (an abandoned one: waited on a second time, ``step_timeout`` more)."""
    factory = FailsThenCannotRebuild()
    run_episodes(2, 1, factory)  # type: ignore[arg-type]
    assert factory.closes[0] == 1, factory.closes
