"""Recovery at any cut of a live history: the scheduler, the trainer (GRPO, EMPO2 with its
adaptation test, Complementary RL) and the credit book are driven live by a generated world
(episodes that start, finish or abort in any order, workers restarted, tips stored, updates
answered), their output committed to the log in delayed batches as the runtime does. For every
cut of that log, an actor rebuilt by :meth:`Replayed.recover` from the events before the cut
and then given the events after it emits exactly what the live actor emitted after the cut:
the same events, in order, with the same corr and cause.

A resumed run does more than continue: the scheduler and the trainer record every episode the
stopped run left running as abandoned and assign it again. That is checked too: what their own
``resume`` emits is the replay's undelivered decisions (assignments excepted), then one
``episode_abandoned`` per episode assigned in the log and not ended before the cut, then those
episodes and the assignments that were never logged again, with the same id, index, seed and
task, before any new episode.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Literal, cast

import msgspec
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from test_credit_stream import streams

from agents.acting.scheduler import RESUMED, Scheduler
from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
)
from agents.events.memory import TipRejected, TipsRetrieved, TipStored
from agents.events.policy import GradientRequested, PolicyUpdated
from agents.learning.credit_actor import CreditActor, CreditSettings
from agents.learning.trainer import GrpoTrainer
from agents.methods.builtin import Complementary, Empo2
from agents.methods.settings import ComplementaryConfig, Empo2Config, EvalConfig, GrpoConfig
from engine.actor import Context, provenance
from engine.events import Envelope, Event
from engine.lifecycle import ActorRestarted
from engine.recovery import Emitted, Replayed
from engine.seeds import derive_rng
from scenarios.worlds.minilab import MiniLab

SEED = 21
NAME = "actor"
WORKERS = ("w0", "w1", "w2")
WORLD = MiniLab(families=("heat", "unlock"), train_variants=3, heldout_variants=3)
TRAIN = [t for f in ("heat", "unlock") for t in WORLD.tasks(f, "train")]
HELDOUT = [t for f in ("heat", "unlock") for t in WORLD.tasks(f, "heldout")]


class Recorder:
    """The part of a :class:`Context` these actors use; ``emit`` records, with the provenance
    the runtime's context gives (``engine.actor.provenance``)."""

    def __init__(self) -> None:
        self.name = NAME
        self.run_seed = SEED
        self.current: Envelope[Event] | None = None
        self.emitted: list[Emitted] = []

    def rng(self, *identity: str | int) -> random.Random:
        return derive_rng(self.run_seed, *identity)

    async def to_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    async def emit(
        self, ev: Event, *, corr: str | None = None, cause: int | Literal[False] | None = False
    ) -> None:
        self.emitted.append((ev, *provenance(self.current, corr, cause)))

    def take(self) -> list[Emitted]:
        out, self.emitted = self.emitted, []
        return out


def ctx_of(rec: Recorder) -> Context:
    return cast(Context, rec)


class World:
    """What the rest of a run does, seen from the committed log: workers start, finish and
    abort the episodes assigned to them (or restart), tips come back for reflections, the
    learner answers gradient requests in order. Each step is drawn by Hypothesis."""

    def __init__(self, data: st.DataObject, *, restarts: bool) -> None:
        self.data = data
        self.restarts = 2 if restarts else 0  # workers restarted, at most
        self.retrievals: dict[str, int] = {}  # episode -> retrievals reported
        self.assigned: dict[str, EpisodeAssigned] = {}  # running: assigned, not ended
        self.started: set[str] = set()
        self.lost: set[str] = set()  # begun by a worker that restarted, not yet abandoned
        self.reflections: list[str] = []  # finished episodes owed a tip
        self.requests: list[int] = []  # gradient requests not yet answered
        self.version = 0
        self.n = 0

    def see(self, env: Envelope[Event]) -> None:
        ev = env.event
        if isinstance(ev, EpisodeAssigned):
            self.assigned[ev.episode] = ev
        elif isinstance(ev, EpisodeAbandoned) and env.actor == NAME:  # a restarted worker's
            self.assigned.pop(ev.episode, None)  # until it is assigned again
            self.lost.discard(ev.episode)
        elif isinstance(ev, GradientRequested):
            self.requests.append(ev.update)

    def moves(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for ep, job in self.assigned.items():
            if ep in self.lost:
                continue
            if ep not in self.started:
                out.append(("start", ep))
            else:
                out += [("finish", ep), ("abort", ep)]
                if job.rollout in ("tips", "distill") and self.retrievals.get(ep, 0) < 2:
                    out.append(("retrieve", ep))
            if self.restarts:
                out.append(("restart", ep))
        out += [("tip", ep) for ep in self.reflections[:1]]
        out += [("update", "")] if self.requests else []
        return out

    def play(self, move: tuple[str, str]) -> Event:
        kind, ep = move
        self.n += 1
        job = self.assigned.get(ep)
        if kind == "start":
            assert job is not None
            self.started.add(ep)
            return EpisodeStarted(
                episode=ep, worker=job.worker, goal="g", observation="o", admissible=("a",)
            )
        if kind == "retrieve":
            assert job is not None
            similar = self.data.draw(st.integers(0, 3))
            self.retrievals[ep] = self.retrievals.get(ep, 0) + 1
            return TipsRetrieved(
                episode=ep, worker=job.worker, turn=self.n, slot=job.slot or "s", tip_ids=(),
                similarities=(), ranks=(), tips=(), similar=similar, slot_size=3,
            )  # fmt: skip
        if kind in ("finish", "abort"):
            assert job is not None
            del self.assigned[ep]
            self.started.discard(ep)
            if kind == "abort":
                return EpisodeAborted(
                    episode=ep, worker=job.worker, reason="x", purpose=job.purpose
                )
            if job.reflect:
                self.reflections.append(ep)
            score = self.data.draw(st.sampled_from([0.0, 0.25, 1.0]))
            return EpisodeFinished(
                episode=ep, worker=job.worker, family=job.family, variant=job.variant,
                split=job.split, steps=3, score=score, success=score == 1.0, total_reward=score,
                purpose=job.purpose,
            )  # fmt: skip
        if kind == "restart":
            assert job is not None
            self.restarts -= 1
            if ep in self.started:  # lost with the worker: the actor runs it again
                self.started.discard(ep)
                self.lost.add(ep)
            return ActorRestarted(actor=job.worker, attempt=1)
        if kind == "tip":
            self.reflections.remove(ep)
            if self.data.draw(st.booleans()):
                return TipRejected(episode=ep, slot="s", reason="duplicate")
            return TipStored(tip_id=self.n, slot="s", episode=ep, text="t", score=0.0, key="k")
        update = self.requests.pop(0)
        self.version += 1
        return PolicyUpdated(
            policy_version=self.version, update=update, samples=1, stale=0, loss=0.0,
            grad_norm=0.0, clip_frac=0.0, kl=0.0, ratio_mean=1.0, ref_kl=0.0, digest="d",
            checkpoint="c", seconds=0.0,
        )  # fmt: skip


class Inputs:
    """The next input for the log so far, drawn once and kept until it is taken."""

    def __init__(self, draw: Callable[[list[Envelope[Event]]], Event | None]) -> None:
        self.draw = draw
        self.next: Event | None = None

    def peek(self, log: list[Envelope[Event]]) -> Event | None:
        if self.next is None:
            self.next = self.draw(log)
        return self.next

    def take(self) -> Event:
        assert self.next is not None
        ev, self.next = self.next, None
        return ev


def world_inputs(world: World) -> Inputs:
    """A world's moves as inputs (it sees each committed event once)."""
    seen = [0]

    def draw(log: list[Envelope[Event]]) -> Event | None:
        for env in log[seen[0] :]:
            world.see(env)
        seen[0] = len(log)
        options = world.moves()
        if not options:
            return None
        return world.play(world.data.draw(st.sampled_from(options), label="move"))

    return Inputs(draw)


async def live(
    make: Callable[[], Replayed], inputs: Inputs, data: st.DataObject
) -> list[Envelope[Event]]:
    """Drive a fresh actor live. Each round commits some of what it emitted (its output
    waits in the write buffer a while, as in the runtime; all of it once nothing else can
    happen), or else commits the next input. Every committed event the actor subscribes to,
    its own included, is delivered to it in log order."""
    actor, rec = make(), Recorder()
    log: list[Envelope[Event]] = []
    pending: list[Emitted] = []
    done = False

    async def commit(name: str, ev: Event, corr: str, cause: int | None) -> None:
        nonlocal done
        env = Envelope(seq=len(log), run="r", t=0, actor=name, event=ev, corr=corr, cause=cause)
        log.append(env)
        if isinstance(ev, actor.subscribes) and not done:
            rec.current = env
            done = await actor.handle(ctx_of(rec), ev)
            rec.current = None
            pending.extend(rec.take())

    await actor.begin(ctx_of(rec))
    pending += rec.take()
    while True:
        upcoming = inputs.peek(log)
        if pending:
            n = len(pending) if upcoming is None else data.draw(st.integers(0, len(pending)))
            if n:
                batch = pending[:n]
                del pending[:n]
                for ev, corr, cause in batch:
                    await commit(NAME, ev, corr, cause)
                continue
        if upcoming is None:
            return log
        await commit("world", inputs.take(), getattr(upcoming, "episode", ""), None)


async def recovered(make: Callable[[], Replayed], history: list[Envelope[Event]]) -> Replayed:
    actor = make()
    await actor.recover(ctx_of(Recorder()), history)
    return actor


async def resumed_by_replay(
    make: Callable[[], Replayed], log: list[Envelope[Event]], cut: int
) -> list[Emitted]:
    """Recover at ``cut``, emit what the replay decided beyond it, then handle every input
    after it: the replay's state must be the live actor's."""
    actor = await recovered(make, log[:cut])
    rec = Recorder()
    assert actor._tail is not None
    await Replayed.resume(actor, ctx_of(rec), actor._tail)
    done = actor._done or actor.finished()
    for env in log[cut:]:
        if isinstance(env.event, actor.subscribes) and not done:
            rec.current = env
            done = await actor.handle(ctx_of(rec), env.event)
            rec.current = None
    return rec.emitted


def emitted_after(log: list[Envelope[Event]], cut: int) -> list[Emitted]:
    return [(e.event, e.corr, e.cause) for e in log[cut:] if e.actor == NAME]


async def check_every_cut(make: Callable[[], Replayed], log: list[Envelope[Event]]) -> None:
    for cut in range(len(log) + 1):
        assert await resumed_by_replay(make, log, cut) == emitted_after(log, cut), cut


async def check_abandoned_and_assigned_again(
    make: Callable[[], Replayed], log: list[Envelope[Event]]
) -> None:
    """The actor's own ``resume`` at every cut (see the module docstring)."""
    for cut in range(len(log) + 1):
        history = log[:cut]
        actor = await recovered(make, history)
        tail = actor._tail
        assert tail is not None
        rec = Recorder()
        await actor.resume(ctx_of(rec), tail)
        out = rec.emitted
        kept = [t for t in tail if not isinstance(t[0], EpisodeAssigned)]
        assert out[: len(kept)] == kept, cut
        ended = {
            e.event.episode
            for e in history
            if isinstance(e.event, EpisodeFinished | EpisodeAborted)
        } | {e.episode for e, _, _ in tail if isinstance(e, EpisodeAborted)}
        assigned = {
            e.event.episode: e.event for e in history if isinstance(e.event, EpisodeAssigned)
        }
        unlogged = [e for e, _, _ in tail if isinstance(e, EpisodeAssigned)]
        rerun = {job.episode for job in unlogged}  # a lost attempt's, abandoned already
        running = sorted(
            (job for ep, job in assigned.items() if ep not in ended and ep not in rerun),
            key=lambda j: j.index,
        )
        abandoned = [
            (EpisodeAbandoned(episode=j.episode, worker=j.worker, purpose=j.purpose,
                              reason=RESUMED), j.episode, None)
            for j in running
        ]  # fmt: skip
        rest = out[len(kept) :]
        assert rest[: len(abandoned)] == abandoned, cut
        again = sorted([*running, *unlogged], key=lambda j: j.index)
        given_again = [e for e, _, _ in rest[len(abandoned) :] if isinstance(e, EpisodeAssigned)]
        assert [_task(j) for j in given_again[: len(again)]] == [_task(j) for j in again], cut


def _task(job: EpisodeAssigned) -> dict[str, Any]:
    """An assignment without the worker it went to (a resumed session starts all free)."""
    out = msgspec.structs.asdict(job)
    out.pop("worker")
    return out


# --- the scheduler ------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(data=st.data(), episodes=st.integers(1, 7), workers=st.integers(1, 3))
def test_the_scheduler_resumes_at_any_cut(data: st.DataObject, episodes: int, workers: int) -> None:
    def make() -> Replayed:
        return Scheduler(TRAIN, episodes, WORKERS[:workers])

    async def check() -> None:
        log = await live(make, world_inputs(World(data, restarts=True)), data)
        assert sum(isinstance(e.event, EpisodeFinished | EpisodeAborted) for e in log) >= episodes
        await check_every_cut(make, log)
        await check_abandoned_and_assigned_again(make, log)

    trio.run(check)


# --- the trainer --------------------------------------------------------------------------------

GRPO = GrpoConfig(group_size=2, groups_per_update=1)
TRAINERS: dict[str, Callable[[int, int], GrpoTrainer]] = {
    "grpo": lambda staleness, workers: GrpoTrainer(
        TRAIN, HELDOUT, 4, WORKERS[:workers],
        msgspec.structs.replace(GRPO, max_staleness=staleness),
        EvalConfig(every=1, episodes=1, final_episodes=2),
    ),
    "empo2": lambda staleness, workers: GrpoTrainer(
        TRAIN, HELDOUT, 4, WORKERS[:workers],
        msgspec.structs.replace(GRPO, max_staleness=staleness),
        EvalConfig(every=2, episodes=1, adapt_attempts=2, adapt_tasks=1),
        Empo2(GRPO, Empo2Config(p=1.0, q=0.5, draw="episode")),
    ),
    "complementary": lambda staleness, workers: GrpoTrainer(
        TRAIN, HELDOUT, 6, WORKERS[:workers],
        msgspec.structs.replace(GRPO, max_staleness=staleness),
        EvalConfig(every=1, episodes=1),
        Complementary(GRPO, ComplementaryConfig(warmup=1, merge_every=1)),
    ),
}  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    method=st.sampled_from(sorted(TRAINERS)),
    staleness=st.integers(0, 1),
    workers=st.integers(1, 3),
)
def test_the_trainer_resumes_at_any_cut(
    data: st.DataObject, method: str, staleness: int, workers: int
) -> None:
    def make() -> Replayed:
        return TRAINERS[method](staleness, workers)

    async def check() -> None:
        log = await live(make, world_inputs(World(data, restarts=True)), data)
        assert any(isinstance(e.event, PolicyUpdated) for e in log)
        await check_every_cut(make, log)
        await check_abandoned_and_assigned_again(make, log)

    trio.run(check)


@pytest.mark.parametrize("layout", [None, "packed"], ids=["no fields", "an older layout"])
@settings(max_examples=20, deadline=None)
@given(data=st.data(), method=st.sampled_from(sorted(TRAINERS)), staleness=st.integers(0, 1))
def test_a_trainer_whose_requests_predate_their_fields_resumes_writing_them_so(
    data: st.DataObject, method: str, staleness: int, layout: str | None
) -> None:
    """A run begun before ``GradientRequested`` recorded ``skip_zero_advantage`` and
    ``scoring`` (its log holds the two fields' defaults), or before its scoring layout was the
    one new runs name ("packed" before "kept"), resumes at any cut after its first request:
    the replay emits the requests as they were logged, and those after the cut the same way."""

    def make() -> Replayed:
        return TRAINERS[method](staleness, 2)

    def old(env: Envelope[Event]) -> Envelope[Event]:
        if env.actor == NAME and isinstance(env.event, GradientRequested):
            if layout is None:
                before = msgspec.structs.replace(env.event, skip_zero_advantage=False, scoring=None)
            else:
                assert env.event.scoring != layout  # what new runs name
                before = msgspec.structs.replace(env.event, scoring=layout)
            return msgspec.structs.replace(env, event=before)
        return env

    async def check() -> None:
        log = [old(e) for e in await live(make, world_inputs(World(data, restarts=False)), data)]
        first = next(i for i, e in enumerate(log) if isinstance(e.event, GradientRequested))
        for cut in range(first + 1, len(log) + 1):
            assert await resumed_by_replay(make, log, cut) == emitted_after(log, cut), cut

    trio.run(check)


# --- the credit book ----------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    data=st.data(),
    stream=streams(),
    batch=st.integers(1, 3),
    cooldown=st.integers(0, 2),
    abandon=st.lists(st.integers(0, 30), max_size=4),
)
def test_the_credit_book_resumes_at_any_cut(
    data: st.DataObject, stream: list[Event], batch: int, cooldown: int, abandon: list[int]
) -> None:
    """Episodes abandoned after their retrieval (the entry they were shown no longer counts)
    are mixed in."""
    s = CreditSettings(batch=batch, cooldown=cooldown)
    inputs = list(stream)
    for at in abandon:
        retrieved = [e for e in inputs[:at] if isinstance(e, TipsRetrieved)]
        if retrieved:
            inputs.insert(at, EpisodeAbandoned(episode=retrieved[-1].episode, worker="w"))

    def make() -> Replayed:
        return CreditActor(s)

    remaining = iter(inputs)

    async def check() -> None:
        log = await live(make, Inputs(lambda _: next(remaining, None)), data)
        assert len([e for e in log if e.actor == "world"]) == len(inputs)
        await check_every_cut(make, log)

    trio.run(check)
