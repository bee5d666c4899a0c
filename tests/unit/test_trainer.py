"""The trainer as a pure driver (a fake context, no runtime): groups feed the update they were
planned for, whatever order they end in, and a run it drove replays to the same log."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
)
from agents.events.extractor import MergeDue, MergePlanned, MergeRequested
from agents.events.policy import (
    AdaptRoundFinished,
    AdvantagesComputed,
    EvalRoundFinished,
    GradientRequested,
    PolicyUpdated,
)
from agents.learning.trainer import GrpoTrainer
from agents.methods.builtin import Complementary, Empo2
from agents.methods.settings import ComplementaryConfig, Empo2Config, EvalConfig, GrpoConfig
from agents.testing.events import policy_updated
from engine.actor import Context
from engine.events import Envelope, Event
from engine.lifecycle import ActorRestarted
from engine.recovery import ReplayContext
from engine.world import Task

SEED = 11
TASKS = [Task(family="heat", variant=v, split="train") for v in range(6)]
HELDOUT = [Task(family="heat", variant=100 + v, split="heldout") for v in range(2)]


def finished(job: EpisodeAssigned) -> EpisodeFinished:
    score = (job.index * 7 % 5) / 4  # groups with a spread of rewards
    return EpisodeFinished(
        episode=job.episode,
        worker=job.worker,
        family=job.family,
        variant=job.variant,
        split=job.split,
        steps=1,
        score=score,
        success=score == 1.0,
        total_reward=score,
        purpose=job.purpose,
    )


def updated(req: GradientRequested) -> PolicyUpdated:
    return policy_updated(req.update + 1)


class Drive:
    """A trainer driven to its end by a fake world, learner and memory: ``choose`` picks, among
    the episodes running, "update" (when one is owed) and "plan" (a merge pass's plan, with
    no chunk, when one is owed), what happens next."""

    def __init__(self, trainer: GrpoTrainer, choose: Callable[[list[str]], str]) -> None:
        self.trainer = trainer
        self.choose = choose
        self.log: list[tuple[str, Event]] = []
        self.running: dict[str, EpisodeAssigned] = {}
        self.owed: list[GradientRequested] = []
        self.plans: list[MergeDue] = []
        self.version = 0
        self.version_at: dict[str, int] = {}  # episode -> policy version when it was assigned
        self.round_ends: list[tuple[int, int]] = []  # (a round's version, the version then)
        self.ctx = ReplayContext("trainer", SEED)

    def _collect(self) -> None:
        for ev, _, _ in self.ctx.emitted:
            self.log.append(("trainer", ev))
            if isinstance(ev, EpisodeAssigned):
                self.running[ev.episode] = ev
                self.version_at[ev.episode] = self.version
            elif isinstance(ev, GradientRequested):
                self.owed.append(ev)
            elif isinstance(ev, MergeDue):
                self.plans.append(ev)
            elif isinstance(ev, EvalRoundFinished | AdaptRoundFinished):
                self.round_ends.append((ev.policy_version, self.version))
        self.ctx.emitted.clear()

    def run(self) -> list[tuple[str, Event]]:
        ctx = cast(Context, self.ctx)

        async def go() -> None:
            await self.trainer.begin(ctx)
            self._collect()
            done = False
            while not done:
                pick = self.choose(
                    sorted(self.running)
                    + (["update"] if self.owed else [])
                    + (["plan"] if self.plans else [])
                )
                if pick == "update":
                    ev: Event = updated(self.owed.pop(0))
                    self.version += 1
                elif pick == "plan":
                    ev = MergePlanned(step=self.plans.pop(0).step, requests=0)
                else:
                    ev = finished(self.running.pop(pick))
                self.log.append(("world", ev))
                done = await self.trainer.handle(ctx, ev)
                self._collect()

        trio.run(go)
        assert not self.running and not self.owed and not self.plans
        return self.log


def of(log: list[tuple[str, Event]], kind: type) -> list:
    return [ev for _, ev in log if isinstance(ev, kind)]


def planned_steps(log: list[tuple[str, Event]], grpo: GrpoConfig) -> dict[str, int]:
    """Training episode -> the step it was planned for: the ``k``-th training assignment is a
    member of group ``k // group_size``, which feeds step ``group // groups_per_update``."""
    train = [ev for ev in of(log, EpisodeAssigned) if ev.purpose == "train"]
    return {
        ev.episode: k // grpo.group_size // grpo.groups_per_update for k, ev in enumerate(train)
    }


def trainer_of(
    grpo: GrpoConfig,
    episodes: int,
    workers: int,
    empo2: Empo2Config | None = None,
    comp: ComplementaryConfig | None = None,
    evaluation: EvalConfig | None = None,
) -> GrpoTrainer:
    return GrpoTrainer(
        TASKS,
        HELDOUT,
        episodes,
        [f"w{i}" for i in range(workers)],
        grpo,
        evaluation or EvalConfig(every=0),
        Empo2(grpo, empo2) if empo2 else Complementary(grpo, comp) if comp else None,
    )


def test_a_late_group_feeds_the_update_it_was_planned_for() -> None:
    """Four groups of two in flight (two updates of two groups): groups 0, 2 and 3 end before
    group 1. Update 0 waits for group 1 and trains on groups 0 and 1; update 1 on 2 and 3."""
    grpo = GrpoConfig(group_size=2, groups_per_update=2, max_staleness=1)
    order = ["ep000000", "ep000001", "ep000004", "ep000005", "ep000006", "ep000007"]
    order += ["ep000002", "ep000003"]
    queue = iter(order)

    def choose(options: list[str]) -> str:
        return "update" if "update" in options else next(queue)

    trainer = trainer_of(grpo, 8, 8)
    log = Drive(trainer, choose).run()
    requests = of(log, GradientRequested)
    assert [(r.update, r.episodes) for r in requests] == [
        (0, ("ep000000", "ep000001", "ep000002", "ep000003")),
        (1, ("ep000004", "ep000005", "ep000006", "ep000007")),
    ]
    groups = {g.group: g.update for g in of(log, AdvantagesComputed)}
    assert groups == {"g00000": 0, "g00001": 0, "g00002": 1, "g00003": 1}
    # nothing is requested before group 1's last episode ends: update 1's groups waited
    first = next(i for i, (_, ev) in enumerate(log) if isinstance(ev, GradientRequested))
    last = next(
        i
        for i, (_, ev) in enumerate(log)
        if getattr(ev, "episode", "") == "ep000003" and isinstance(ev, EpisodeFinished)
    )
    assert first > last


def test_a_restarted_workers_episode_runs_again_and_the_update_trains_on_it() -> None:
    """A worker lost mid-episode in a learning run: the trainer records the attempt as
    abandoned with the reason, assigns the same episode to the restarted worker, and the
    update asks for every planned episode (an episode not begun is left to the mailbox)."""
    grpo = GrpoConfig(group_size=2, groups_per_update=1, max_staleness=0)
    trainer = trainer_of(grpo, 2, 2)
    ctx = ReplayContext("trainer", SEED)
    c = cast(Context, ctx)

    async def go() -> list[Event]:
        await trainer.begin(c)
        jobs = {ev.worker: ev for ev, _, _ in ctx.emitted if isinstance(ev, EpisodeAssigned)}
        began = EpisodeStarted(episode=jobs["w0"].episode, worker="w0", goal="", observation="",
                               admissible=())  # fmt: skip
        await trainer.handle(c, began)
        await trainer.handle(c, ActorRestarted(actor="w1", attempt=1, reason="x"))  # not begun
        await trainer.handle(c, ActorRestarted(actor="w0", attempt=1, reason="Lost: gone"))
        for job in (jobs["w1"], jobs["w0"]):
            await trainer.handle(c, finished(job))
        return [ev for ev, _, _ in ctx.emitted]

    out = trio.run(go)
    assigned = of([("t", ev) for ev in out], EpisodeAssigned)
    abandoned = of([("t", ev) for ev in out], EpisodeAbandoned)
    assert [(a.episode, a.worker, a.reason) for a in abandoned] == [
        ("ep000000", "w0", "worker restarted (Lost: gone)")
    ]
    assert [a.episode for a in assigned] == ["ep000000", "ep000001", "ep000000"]
    assert assigned[2] == assigned[0]  # the same job, seed and worker
    (request,) = of([("t", ev) for ev in out], GradientRequested)
    assert request.episodes == ("ep000000", "ep000001")


METHODS = {
    "grpo": dict(grpo=GrpoConfig(group_size=2, groups_per_update=2, max_staleness=1)),
    "empo2": dict(
        grpo=GrpoConfig(group_size=2, groups_per_update=2, max_staleness=1),
        empo2=Empo2Config(p=0.5, q=0.5, embedder="hashing"),
    ),
    "complementary": dict(
        grpo=GrpoConfig(group_size=4, groups_per_update=2, max_staleness=2),
        comp=ComplementaryConfig(warmup=1, merge_every=2, embedder="hashing"),
    ),
}


@pytest.mark.parametrize("method", sorted(METHODS))
@settings(max_examples=40, deadline=None)
@given(data=st.data(), workers=st.integers(1, 12))
def test_groups_feed_their_planned_update_whatever_order_they_end_in(
    method: str, data: st.DataObject, workers: int
) -> None:
    kw = METHODS[method]
    grpo = kw["grpo"]
    comp = kw.get("comp")
    per_step = grpo.group_size * grpo.groups_per_update
    steps = 4
    evaluation = EvalConfig(every=2, episodes=2)
    trainer = trainer_of(grpo, per_step * steps, workers, kw.get("empo2"), comp, evaluation)
    drive = Drive(trainer, lambda options: data.draw(st.sampled_from(options)))
    log = drive.run()

    step_of = planned_steps(log, grpo)
    warmup = comp.warmup if comp else 0
    requests = of(log, GradientRequested)
    assert [r.update for r in requests] == list(range(steps - warmup))
    for r in requests:
        members = sorted(e for e, s in step_of.items() if s == r.update + warmup)
        assert list(r.episodes) == members  # the planned step's groups, all of them, in order
        if method == "empo2":  # one rollout mode per update
            assert len(set(r.rollouts)) == 1
        # no turn is staler than the bound: each episode started at an allowed version
        assert all(drive.version_at[e] >= r.update - grpo.max_staleness for e in r.episodes)
    for g in of(log, AdvantagesComputed):
        assert {step_of[e] - warmup for e in g.episodes} == {g.update}
    # no update lands while a round plays: each ends at the version it names, and its x is
    # the training episodes behind that version (with the warm-up steps)
    assert drive.round_ends and all(v == now for v, now in drive.round_ends)
    for r in of(log, EvalRoundFinished):
        if r.policy_version:
            assert r.train_episodes == (r.policy_version + warmup) * per_step
        else:
            assert r.train_episodes <= warmup * per_step
    if comp is not None:  # every guided episode is trained on; none vanished into a warm-up
        groups = of(log, AdvantagesComputed)
        guided = {
            e for g in groups for e, ro in zip(g.episodes, g.rollouts, strict=True) if ro != "plain"
        }
        trained = {
            e
            for r in requests
            for e, ro in zip(r.episodes, r.rollouts, strict=True)
            if ro != "plain"
        }
        assert guided and trained == guided
        assert [m.step for m in of(log, MergeDue)] == [1, 3]

    # the trainer is rebuilt on resume by replaying it on the log: the replay reproduces it
    envs = [
        Envelope(seq=i, run="r", t=0, actor=actor, event=ev) for i, (actor, ev) in enumerate(log)
    ]
    cut = data.draw(st.integers(0, len(envs)))
    again = trainer_of(grpo, per_step * steps, workers, kw.get("empo2"), comp, evaluation)
    trio.run(again.recover, cast(Context, ReplayContext("trainer", SEED)), envs[:cut])
    if cut == len(envs):
        assert again._tail == []


def test_the_trainer_waits_for_the_extractors_open_requests_by_seq() -> None:
    """Finished once every extraction and merge request is answered and every extractor update
    made; a lost attempt's request is owed no more, and its late answer does not close the
    re-run's own request of the same episode and slot."""
    from agents.events.extractor import (
        ExtractionRequested,
        ExtractorCalled,
        ExtractorGradientRequested,
        ExtractorUpdated,
    )
    from engine.events import Envelope

    grpo = GrpoConfig(group_size=2, groups_per_update=1)
    trainer = trainer_of(grpo, 2, 1)
    ctx = ReplayContext("trainer", SEED)

    def extraction(seq: int) -> Envelope[Event]:
        ev = ExtractionRequested(
            episode="ep000001", worker="w0", slot="s", entry=-1, messages=(),
            success=True, score=1.0, seed=0,
        )  # fmt: skip
        return Envelope(seq=seq, run="r", t=0, actor="w0", event=ev)

    def answer(seq: int, cause: int) -> Envelope[Event]:
        ev = ExtractorCalled(
            call=f"x{cause}", task="extract", source="ep000001", slot="s", prompt_ids=(),
            response_ids=(), token_logps=(), text="", temperature=1.0, extractor_version=0,
        )  # fmt: skip
        return Envelope(seq=seq, run="r", t=0, actor="extractor", event=ev, cause=cause)

    async def feed(env: Envelope[Event]) -> bool:
        ctx.current = env
        return await trainer.handle(cast(Context, ctx), env.event)

    async def go() -> None:
        trainer._version = trainer.updates  # every update made: only the extractor is owed
        assert trainer.finished()
        assert not await feed(extraction(10))  # the first attempt's request
        trainer._forget_attempt("ep000001")  # its attempt is lost: owed no more
        assert trainer.finished()
        assert not await feed(extraction(20))  # the re-run's request
        assert not await feed(answer(21, 10))  # a late answer to the lost one: not the re-run's
        assert await feed(answer(22, 20))
        request = ExtractorGradientRequested(
            update=0, step=0, calls=(), rewards=(), advantages=(), weights=(), credits=(),
            lr=0.1, clip_low=0.1, clip_high=0.1, max_grad_norm=1.0, alpha=0.5, cooldown=1,
        )  # fmt: skip
        assert not await feed(Envelope(seq=30, run="r", t=0, actor="credit", event=request))
        made = ExtractorUpdated(
            extractor_version=1, update=0, samples=0, loss=0.0, grad_norm=0.0, clip_frac=0.0,
            digest="d", checkpoint="", seconds=0.0,
        )  # fmt: skip
        assert await feed(Envelope(seq=31, run="r", t=0, actor="extractor", event=made))

    trio.run(go)


def test_a_log_from_before_merge_plans_is_told_from_one_cut_mid_pass() -> None:
    """A resumed trainer awaits the plan of every merge pass, except in a log written before
    plans existed: there the memory went past a pass without planning it (an answer to a
    later message), and that plan would never come. A pass the memory had not finished (its
    chunks logged, its plan not) is planned when the memory resumes: it is awaited."""
    from agents.events.memory import TipRejected
    from agents.learning.trainer import _passes_unplanned  # pyright: ignore[reportPrivateUsage]

    def history(*events: tuple[str, Event, int | None]) -> list[Envelope[Event]]:
        return [
            Envelope(seq=i, run="r", t=0, actor=actor, event=ev, cause=cause)
            for i, (actor, ev, cause) in enumerate(events)
        ]

    due = ("trainer", MergeDue(step=1), None)
    chunk = ("memory", MergeRequested(step=1, slot="s", entries=(0, 1), messages=(), seed=1), 0)
    asked = ("learner", policy_updated(1), None)  # any later message
    later = ("memory", TipRejected(episode="e", slot="s", reason="empty"), 2)
    planned = ("memory", MergePlanned(step=1, requests=1), 0)
    assert _passes_unplanned(history(due, chunk, asked, later))  # older coevo: no plan
    assert _passes_unplanned(history(due, asked, later))  # a pass with no chunk, no plan
    assert not _passes_unplanned(history(due, chunk))  # cut mid-pass: planned on resume
    assert not _passes_unplanned(history(due, chunk, planned, asked, later))
    assert not _passes_unplanned(history(due))


def test_a_log_whose_rounds_did_not_hold_updates_resumes_without_the_hold() -> None:
    """A run written before rounds held updates (``holds_updates`` False) had updates land
    while a round played; its trainer's replay must go on without the hold, or it would
    emit its requests later than the log holds them (the resume would diverge)."""
    grpo = GrpoConfig(group_size=2, groups_per_update=2, max_staleness=1)
    evaluation = EvalConfig(every=1, episodes=2)

    def first(options: list[str]) -> str:  # updates as soon as they are owed, rounds last
        return "update" if "update" in options else options[-1]

    old = trainer_of(grpo, 16, 2, evaluation=evaluation)
    old._rounds.hold = False  # pyright: ignore[reportPrivateUsage] (the code before the hold)
    drive = Drive(old, first)
    log = drive.run()
    assert any(v != now for v, now in drive.round_ends)  # an update landed mid-round
    envs = [
        Envelope(seq=i, run="r", t=0, actor=actor, event=ev) for i, (actor, ev) in enumerate(log)
    ]
    for cut in (len(envs) // 2, len(envs)):
        again = trainer_of(grpo, 16, 2, evaluation=evaluation)
        trio.run(again.recover, cast(Context, ReplayContext("trainer", SEED)), envs[:cut])
        assert not again._rounds.hold  # pyright: ignore[reportPrivateUsage]
    held = Drive(trainer_of(grpo, 16, 2, evaluation=evaluation), first)
    held.run()
    assert all(v == now for v, now in held.round_ends)
