"""Env workers driven by the inference actor, and the GRPO trainer's schedule, on the runtime.

Most tests replace the model by a fake runner whose choice depends on the request's seed only,
so they are about the plumbing: every request answered once, batches bounded, versions
followed, the staleness bound kept. That what is sampled does not depend on batching or worker
count is checked with the real runner (a tiny random model, packed scoring of every admissible
action, a stream per request), whose batches are seen to hold several requests.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from functools import partial
from typing import Any, ClassVar

import pytest
import torch
import trio
import trio.testing
from transformers import Qwen2Config, Qwen2ForCausalLM

from agents.acting.env_worker import EnvWorker, PromptSettings
from agents.acting.inference import (
    ActSettings,
    InferenceActor,
    PolicyRunner,
    rope_changes_in_forward,
)
from agents.acting.projections import EpisodeTable
from agents.acting.scheduler import Scheduler
from agents.events.episodes import EpisodeFinished, StepTaken
from agents.events.policy import (
    ActionRequested,
    ActionSampled,
    AdvantagesComputed,
    EvalRoundFinished,
    GradientRequested,
)
from agents.learning.trainer import GrpoTrainer
from agents.methods.settings import EvalConfig, GrpoConfig
from agents.models.embedded import (
    EmbeddedSpec,
    build_tokenizer,
    episode_texts,
    prompt_texts,
    word_pieces,
)
from agents.models.pretrain_play import pretrain_episodes
from agents.testing.events import policy_updated
from agents.testing.models import tiny_qwen2
from engine.actor import Actor, ActorSpec, Context
from engine.eventlog import MemoryEventLog
from engine.lifecycle import ActorFailed, RunStarted, RunStopped
from engine.projection import ActorStats
from engine.replay import verify_log
from engine.runtime import Runtime
from scenarios.worlds.minilab import MiniLab
from stores.checkpoints import MemoryCheckpoints

STARTED = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=9, coevo_version="0")


def make_world(max_steps: int | None = None) -> MiniLab:
    return MiniLab(families=("heat",), train_variants=10, heldout_variants=4, max_steps=max_steps)


class FakeRunner:
    """Picks an admissible action from the request's own seed; records batch sizes."""

    def __init__(self) -> None:
        self.version = 0
        self.batches: list[int] = []

    def answer(self, requests: Sequence[ActionRequested]) -> list[ActionSampled]:
        self.batches.append(len(requests))
        out = []
        for req in requests:
            k = random.Random(req.seed).randrange(len(req.admissible))
            out.append(
                ActionSampled(
                    episode=req.episode,
                    worker=req.worker,
                    turn=req.turn,
                    policy_version=self.version,
                    action=req.admissible[k],
                    prompt_ids=(1, 2),
                    response_ids=(3,),
                    token_logps=(-1.0,),
                    choice=k,
                    logp=-1.0,
                    temperature=1.0,
                )
            )
        return out

    def load(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.version = version


def worker_specs(names: list[str], max_steps: int | None = None) -> list[ActorSpec]:
    world = partial(make_world, max_steps)
    return [
        ActorSpec(
            name=name,
            factory=partial(EnvWorker, world, None, PromptSettings(window=2)),
            accepts=lambda ev, name=name: getattr(ev, "worker", None) == name,
        )
        for name in names
    ]


class OverlapRunner(FakeRunner):
    """A fake runner whose batches take (real) time; records how many are answered at once
    and each load that comes while a batch is being answered."""

    made: ClassVar[list[OverlapRunner]] = []

    def __init__(self) -> None:
        super().__init__()
        self.busy = self.most = 0
        self.lock = threading.Lock()
        self.loads_while_busy = 0
        OverlapRunner.made.append(self)

    def answer(self, requests: Sequence[ActionRequested]) -> list[ActionSampled]:
        with self.lock:
            self.busy += 1
            self.most = max(self.most, self.busy)
        time.sleep(0.005)
        try:
            return super().answer(requests)
        finally:
            with self.lock:
                self.busy -= 1

    def load(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.loads_while_busy += self.busy > 0
        super().load(state, version)


def rollout(
    workers: int,
    batch_max: int,
    runner: FakeRunner | PolicyRunner,
    max_steps: int | None = None,
    in_flight: int = 1,
) -> MemoryEventLog:
    tasks = make_world().tasks("heat", "train")
    names = [f"w{i}" for i in range(workers)]
    specs = [
        ActorSpec(name="scheduler", factory=partial(Scheduler, tasks, 12, names), driver=True),
        ActorSpec(
            name="inference",
            factory=partial(
                InferenceActor,
                lambda: runner,
                MemoryCheckpoints(),
                batch_max=batch_max,
                in_flight=in_flight,
            ),
        ),
        *worker_specs(names, max_steps),
    ]
    log = MemoryEventLog()
    clock = trio.testing.MockClock(autojump_threshold=0)  # a batch waits until all workers ask
    trio.run(Runtime(log, STARTED, specs, [ActorStats(), EpisodeTable()], seed=9).run, clock=clock)
    return log


def actions(log: MemoryEventLog) -> dict[tuple[str, int], str]:
    return {
        (e.event.episode, e.event.turn): e.event.action
        for e in log.read()
        if isinstance(e.event, StepTaken)
    }


@pytest.mark.parametrize("in_flight", [1, 2])
def test_every_request_is_answered_once_in_bounded_batches(in_flight: int) -> None:
    runner = OverlapRunner()
    log = rollout(4, 3, runner, in_flight=in_flight)
    envs = list(log.read())
    requests = [
        (e.event.episode, e.event.turn) for e in envs if isinstance(e.event, ActionRequested)
    ]
    answers = [(e.event.episode, e.event.turn) for e in envs if isinstance(e.event, ActionSampled)]
    assert sorted(requests) == sorted(answers) and len(set(answers)) == len(answers)
    assert sum(runner.batches) == len(requests) and max(runner.batches) <= 3
    assert runner.most == in_flight  # batches were answered at once, never more than allowed
    finished = [e for e in envs if isinstance(e.event, EpisodeFinished)]
    assert len(finished) == 12
    assert isinstance(envs[-1].event, RunStopped) and envs[-1].event.reason == "completed"
    # each answer is caused by its request
    by_seq = {e.seq: e.event for e in envs}
    for e in envs:
        if isinstance(e.event, ActionSampled):
            cause = by_seq[e.cause]
            assert isinstance(cause, ActionRequested) and cause.turn == e.event.turn


class CountingRunner(PolicyRunner):
    """The real runner, recording the size of every batch it answers."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.batches: list[int] = []

    def answer(self, requests: Sequence[ActionRequested]) -> list[ActionSampled]:
        self.batches.append(len(requests))
        return super().answer(requests)


@pytest.fixture(scope="module")
def tiny_policy() -> tuple[Any, Any]:
    """A tiny random Qwen2 model and a tokenizer of minilab's texts."""
    play = pretrain_episodes(make_world(), EmbeddedSpec(episodes_per_family=4, eval_variants=1))
    texts = [t for ep in play for t in episode_texts(ep)] + list(prompt_texts(play[0]))
    tokenizer = build_tokenizer(*word_pieces(texts), 512)
    model = tiny_qwen2(
        len(tokenizer), hidden=16, positions=2048, pad_token_id=tokenizer.pad_token_id
    )
    return model, tokenizer


def tiny_runner(model: Any, tokenizer: Any) -> CountingRunner:
    return CountingRunner(model, tokenizer, ActSettings(temperature=1.0))


def test_what_is_sampled_does_not_depend_on_batching_or_workers(tiny_policy: Any) -> None:
    model, tokenizer = tiny_policy
    alone_runner = CountingRunner(model, tokenizer, ActSettings(temperature=1.0))
    batched_runner = CountingRunner(model, tokenizer, ActSettings(temperature=1.0))
    alone = actions(rollout(1, 1, alone_runner, max_steps=5))
    batched = actions(rollout(4, 4, batched_runner, max_steps=5))
    overlapped = actions(rollout(4, 2, tiny_runner(model, tokenizer), max_steps=5, in_flight=2))
    assert set(alone_runner.batches) == {1}
    # batching happened (how full a batch gets depends on how fast the workers' threads step:
    # the mock clock jumps the batch's wait as soon as every task waits, threads or not)
    assert max(batched_runner.batches) >= 2, batched_runner.batches
    assert alone == batched == overlapped and len(alone) > 12
    assert len(set(alone.values())) > 1  # the sampled actions differ: not one fixed choice


class FakeLearner(Actor):
    """Answers each gradient request with a new version after some (virtual) time."""

    subscribes = (GradientRequested,)

    def __init__(self, checkpoints: MemoryCheckpoints) -> None:
        self.checkpoints = checkpoints

    async def run(self, ctx: Context) -> None:
        version = 0
        async for env in ctx.events():
            assert isinstance(env.event, GradientRequested)
            await trio.sleep(0.05)
            version += 1
            name = self.checkpoints.save(version, torch.nn.Linear(1, 1), None)
            await ctx.emit(
                policy_updated(version, update=env.event.update, checkpoint=name, seconds=0.05)
            )


def train(max_staleness: int, in_flight: int = 1) -> list:
    world = make_world()
    names = ["w0", "w1", "w2"]
    grpo = GrpoConfig(group_size=3, groups_per_update=2, max_staleness=max_staleness)
    evaluation = EvalConfig(every=2, episodes=4)
    trainer = GrpoTrainer(
        world.tasks("heat", "train"), world.tasks("heat", "heldout"), 24, names, grpo, evaluation
    )
    checkpoints = MemoryCheckpoints()
    specs = [
        ActorSpec(name="trainer", factory=lambda: trainer, driver=True),
        ActorSpec(
            name="inference",
            factory=partial(
                InferenceActor, OverlapRunner, checkpoints, batch_max=2, in_flight=in_flight
            ),
        ),
        ActorSpec(name="learner", factory=partial(FakeLearner, checkpoints)),
        *worker_specs(names),
    ]
    log = MemoryEventLog()
    clock = trio.testing.MockClock(autojump_threshold=0)  # the learner's "work" takes no time
    trio.run(Runtime(log, STARTED, specs, [ActorStats(), EpisodeTable()], seed=9).run, clock=clock)
    assert verify_log(log, [ActorStats(), EpisodeTable()]).ok
    return [e.event for e in log.read()]


def test_trainer_requests_every_update_and_evaluates_on_schedule() -> None:
    events = train(max_staleness=1)
    requests = [ev for ev in events if isinstance(ev, GradientRequested)]
    assert [r.update for r in requests] == [0, 1, 2, 3]
    assert all(len(r.episodes) == 6 for r in requests)
    groups = [ev for ev in events if isinstance(ev, AdvantagesComputed)]
    assert len(groups) == 8 and all(len(g.episodes) == 3 for g in groups)
    rounds = [ev for ev in events if isinstance(ev, EvalRoundFinished)]
    assert [r.policy_version for r in rounds] == [0, 2, 4]
    train_eps = [ev for ev in events if isinstance(ev, EpisodeFinished) and ev.purpose == "train"]
    assert len(train_eps) == 24


@pytest.mark.parametrize("in_flight", [1, 2])
def test_no_sample_is_staler_than_the_bound(in_flight: int) -> None:
    """Also: a new version is loaded only when no batch is being answered (OverlapRunner)."""
    for bound in (0, 1):
        OverlapRunner.made.clear()
        events = train(max_staleness=bound, in_flight=in_flight)
        assert [r.loads_while_busy for r in OverlapRunner.made] == [0]
        assert OverlapRunner.made[0].most == in_flight
        version_of: dict[str, set[int]] = {}
        for ev in events:
            if isinstance(ev, ActionSampled):
                version_of.setdefault(ev.episode, set()).add(ev.policy_version)
        for req in (ev for ev in events if isinstance(ev, GradientRequested)):
            oldest = min(min(version_of[e]) for e in req.episodes)
            assert req.update - oldest <= bound


class FailingRunner(FakeRunner):
    """Fails on its third batch."""

    def answer(self, requests: Sequence[ActionRequested]) -> list[ActionSampled]:
        if len(self.batches) == 2:
            raise ValueError("the model could not answer")
        return super().answer(requests)


@pytest.mark.parametrize("in_flight", [1, 2])
def test_a_failed_batch_is_recorded_as_its_own_error(in_flight: int) -> None:
    """A batch's error reaches supervision as itself, not wrapped in an exception group."""
    log = rollout(4, 1, FailingRunner(), in_flight=in_flight)
    failed = [e.event for e in log.read() if isinstance(e.event, ActorFailed)]
    assert [(f.actor, f.error_type, f.message) for f in failed] == [
        ("inference", "ValueError", "the model could not answer")
    ]


def test_a_model_whose_rotary_embedding_changes_in_forward_runs_one_batch_at_a_time() -> None:
    """transformers recomputes "dynamic" and "longrope" rotary embeddings inside the module
    during a forward pass: two batches at once would race on them."""
    plain = Qwen2Config(hidden_size=16, num_attention_heads=2, num_key_value_heads=1)
    dynamic = Qwen2Config(
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
    )
    assert not rope_changes_in_forward(Qwen2ForCausalLM(plain))
    assert rope_changes_in_forward(Qwen2ForCausalLM(dynamic))

    runner = OverlapRunner()
    runner.model = Qwen2ForCausalLM(dynamic)  # type: ignore[attr-defined]
    rollout(4, 1, runner, in_flight=2)
    assert runner.most == 1
