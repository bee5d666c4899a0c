"""The scheduler rebuilt for ``coevo resume`` (:class:`engine.recovery.Replayed`): replayed on a
log it must reproduce, then continuing where the log ends."""

from __future__ import annotations

from typing import cast

import pytest
import trio

from agents.acting.scheduler import RESUMED, Scheduler
from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
)
from agents.testing.events import episode_finished
from engine.actor import Context
from engine.errors import ResumeDiverged
from engine.events import Envelope, Event
from engine.lifecycle import ActorRestarted
from engine.recovery import ReplayContext
from engine.world import Task

TASKS = [Task(family="fetch", variant=v, split="train") for v in range(3)]
WORKERS = ("w0", "w1")
SEED = 4


def logged(events: list[tuple[str, Event]]) -> list[Envelope[Event]]:
    return [
        Envelope(seq=i, run="r", t=0, actor=actor, event=ev) for i, (actor, ev) in enumerate(events)
    ]


def live_log(episodes: int, ends: list[tuple[str, Event]]) -> list[Envelope[Event]]:
    """What a live scheduler emits for ``ends`` (the other actors' events), interleaved as a
    log would hold them: each of its events right after the event that caused it."""
    out: list[tuple[str, Event]] = []
    sched = Scheduler(TASKS, episodes, WORKERS)
    ctx = ReplayContext("scheduler", SEED)

    async def drive() -> None:
        await sched.begin(cast(Context, ctx))
        out.extend(("scheduler", ev) for ev, _, _ in ctx.emitted)
        ctx.emitted.clear()
        for actor, ev in ends:
            out.append((actor, ev))
            await sched.handle(cast(Context, ctx), ev)
            out.extend(("scheduler", e) for e, _, _ in ctx.emitted)
            ctx.emitted.clear()

    trio.run(drive)
    return logged(out)


def resumed(history: list[Envelope[Event]], episodes: int) -> tuple[Scheduler, list[Event]]:
    """A scheduler recovered on ``history``, and what it emits when it resumes."""
    sched = Scheduler(TASKS, episodes, WORKERS)
    ctx = ReplayContext("scheduler", SEED)

    async def go() -> None:
        await sched.recover(cast(Context, ctx), history)
        assert sched._tail is not None
        await sched.resume(cast(Context, ctx), sched._tail)

    trio.run(go)
    return sched, [ev for ev, _, _ in ctx.emitted]


def started(ep: str, worker: str) -> EpisodeStarted:
    return EpisodeStarted(episode=ep, worker=worker, goal="", observation="", admissible=())


def finished(ep: str, worker: str) -> EpisodeFinished:
    return episode_finished(
        ep, worker=worker, family="fetch", steps=1, score=1.0, success=True, total_reward=1.0
    )


def test_episodes_left_running_are_abandoned_and_assigned_again_first() -> None:
    history = live_log(5, [("w0", started("ep000000", "w0")), ("w0", finished("ep000000", "w0"))])
    sched, out = resumed(history, 5)
    # ep000001 (w1) and ep000002 (w0, assigned after ep000000) were running
    assert [(type(e).__name__, e.episode) for e in out] == [  # type: ignore[attr-defined]
        ("EpisodeAbandoned", "ep000001"),
        ("EpisodeAbandoned", "ep000002"),
        ("EpisodeAssigned", "ep000001"),
        ("EpisodeAssigned", "ep000002"),
    ]
    again = [e for e in out if isinstance(e, EpisodeAssigned)]
    first = {e.episode: e for e in (env.event for env in history) if isinstance(e, EpisodeAssigned)}
    for job in again:  # the same episode: index and seed
        assert (job.index, job.seed) == (first[job.episode].index, first[job.episode].seed)
    assert not sched.finished()


def test_a_restarted_workers_episode_is_abandoned_and_run_again_with_its_seed() -> None:
    """A worker restarted mid-episode: the scheduler records the attempt as abandoned with the
    reason and assigns the same episode (index, seed) to the restarted worker; the run still
    ends once every planned episode has finished."""
    restart = ActorRestarted(actor="w0", attempt=1, reason="RemoteActorLost: w0: gone")
    full = live_log(3, [("w0", started("ep000000", "w0")), ("runtime", restart)])
    tail = [env.event for env in full[-2:]]
    assert isinstance(tail[0], EpisodeAbandoned)
    assert (tail[0].episode, tail[0].worker) == ("ep000000", "w0")
    assert tail[0].reason == "worker restarted (RemoteActorLost: w0: gone)"
    first = full[0].event
    assert isinstance(first, EpisodeAssigned) and tail[1] == first  # the same job, again
    assert not any(isinstance(env.event, EpisodeAborted) for env in full)
    sched = Scheduler(TASKS, 3, WORKERS)
    ctx = cast(Context, ReplayContext("scheduler", SEED))

    async def play() -> list[bool]:
        await sched.begin(ctx)
        done = []
        for ev in [started("ep000000", "w0"), restart]:
            done.append(await sched.handle(ctx, ev))
        for ep, worker in [("ep000000", "w0"), ("ep000001", "w1"), ("ep000002", "w0")]:
            done.append(await sched.handle(ctx, finished(ep, worker)))
        return done

    assert trio.run(play) == [False, False, False, False, True]


def test_an_abandon_the_log_lacks_is_recorded_once_and_its_episode_run_again() -> None:
    """A worker restarted, the run stopped before the scheduler's abandon was committed: the
    resume records it once (not again as left running) and assigns the episode again first."""
    restart = ActorRestarted(actor="w0", attempt=1, reason="RemoteActorLost: w0: gone")
    full = live_log(3, [("w0", started("ep000000", "w0")), ("runtime", restart)])
    assert isinstance(full[-2].event, EpisodeAbandoned)
    sched, out = resumed(full[:-2], 3)
    abandoned = [e for e in out if isinstance(e, EpisodeAbandoned)]
    assert [(e.episode, e.reason) for e in abandoned] == [
        ("ep000000", "worker restarted (RemoteActorLost: w0: gone)"),
        ("ep000001", RESUMED),
    ]
    assigned = [e.episode for e in out if isinstance(e, EpisodeAssigned)]
    assert assigned == ["ep000000", "ep000001"]
    assert not sched.finished()


def test_a_log_the_replay_does_not_reproduce_is_refused() -> None:
    history = live_log(5, [("w0", started("ep000000", "w0")), ("w0", finished("ep000000", "w0"))])
    first = history[0]
    assert isinstance(first.event, EpisodeAssigned)
    wrong = Envelope(
        seq=0,
        run="r",
        t=0,
        actor="scheduler",
        event=EpisodeAssigned(
            **{
                **{f: getattr(first.event, f) for f in first.event.__struct_fields__},
                "seed": first.event.seed + 1,
            }
        ),
    )
    with pytest.raises(ResumeDiverged, match="scheduler's replay emits") as err:
        resumed([wrong, *history[1:]], 5)
    # an outside tester's resume diverged after the code was edited in place, with no word of
    # where to look
    assert "decides otherwise than the code that wrote it (coevo or a plug-in" in str(err.value)
