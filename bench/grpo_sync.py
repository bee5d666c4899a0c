"""GRPO as a plain synchronous loop: no actors, no events, no log.

The same pieces as a coevo run (the prompt format, :class:`PolicyRunner` scoring the
admissible actions, :func:`grpo_step`, :func:`group_advantages`, the same task plan and seeds),
driven the way a short research script would drive them: every update plays its
``groups_per_update * group_size`` episodes in lockstep, one batched forward pass per turn
across all live episodes, then trains, then copies the weights to the sampler.

It exists to measure coevo's overhead (``bench/grpo_results.py``): same model, same budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agents.acting.inference import ActSettings, PolicyRunner
from agents.acting.scheduler import plan_episode
from agents.events.policy import ActionRequested, ActionSampled
from agents.learning.trainer import ADV_EPS, gradient_request
from agents.learning.update import Sample, Trainee, grpo_step
from agents.methods.advantages import group_advantages
from agents.models.prompts import Step, turn_messages
from engine.seeds import derive_rng, derive_seed
from engine.world import Observation, Task, TextWorld
from engine.world_registry import load_world
from scenarios.schema import Scenario
from stores.checkpoints import load_weights
from stores.model_dirs import load_model_dir


@dataclass
class SyncResult:
    """What one synchronous run did."""

    updates: int
    episodes: int
    env_steps: int
    seconds: float
    rollout_seconds: float
    train_seconds: float
    train_success: list[float]


@dataclass
class _Live:
    world: TextWorld
    obs: Observation
    goal: str
    seed: int
    history: list[Step]
    turns: list[ActionSampled]
    turn: int = 0


def _play(
    runner: PolicyRunner, worlds: list[TextWorld], tasks: list[Task], seeds: list[int], window: int
) -> tuple[list[list[ActionSampled]], list[float], list[bool], int]:
    """Play one episode per world in lockstep; returns turns, scores, successes, steps."""
    live = []
    for world, task, seed in zip(worlds, tasks, seeds, strict=True):
        obs = world.reset(task, seed)
        live.append(_Live(world, obs, obs.goal, seed, [], []))
    steps = 0
    while any(not ep.obs.done for ep in live):
        active = [i for i, ep in enumerate(live) if not ep.obs.done]
        requests = [_request(live[i], i, window) for i in active]
        answers = runner.answer(requests)
        for i, answer in zip(active, answers, strict=True):
            ep = live[i]
            ep.obs = ep.world.step(answer.action)
            ep.history.append((answer.action, ep.obs.text))
            ep.turns.append(answer)
            ep.turn += 1
            steps += 1
    return (
        [ep.turns for ep in live],
        [ep.obs.score for ep in live],
        [ep.obs.success for ep in live],
        steps,
    )


def _request(ep: _Live, slot: int, window: int) -> ActionRequested:
    messages = turn_messages(ep.goal, ep.history, ep.obs.text, window=window)
    return ActionRequested(
        episode=f"slot{slot}",
        worker="sync",
        turn=ep.turn,
        messages=tuple((m["role"], m["content"]) for m in messages),
        admissible=ep.obs.admissible,
        seed=derive_seed(ep.seed, "act", ep.turn),
    )


def run_sync(scenario: Scenario, model_dir: Path, tasks: list[Task]) -> SyncResult:
    """Train with GRPO for the scenario's budget in a synchronous loop."""
    g, p = scenario.grpo, scenario.policy
    device = torch.device("cpu")
    net, tokenizer = load_model_dir(model_dir, device)
    runner = PolicyRunner(net, tokenizer, ActSettings(mode=p.mode, temperature=p.temperature))
    trainee_net, trainee_tok = load_model_dir(model_dir, device)
    trainee = Trainee(trainee_net, trainee_tok, device, reference=g.kl_coef > 0)
    per = g.group_size * g.groups_per_update
    updates = scenario.run.episodes // per
    n = per
    worlds = [load_world(scenario.world.name, dict(scenario.world.options)) for _ in range(n)]
    t0 = time.perf_counter()
    rollout = train = 0.0
    steps = 0
    index = 0
    success: list[float] = []
    for update in range(updates):
        r0 = time.perf_counter()
        group_tasks = [
            plan_episode(scenario.seed, update * g.groups_per_update + k, tasks)[0]
            for k in range(g.groups_per_update)
        ]
        ep_tasks = [t for t in group_tasks for _ in range(g.group_size)]
        seeds = [derive_seed(scenario.seed, "episode", index + i) for i in range(n)]
        index += n
        turns, scores, wins, played = _play(runner, worlds, ep_tasks, seeds, p.window)
        steps += played
        success.append(sum(wins) / n)
        rewards = scores if g.reward == "score" else [float(w) for w in wins]
        samples: list[Sample] = []
        for k in range(g.groups_per_update):
            part = slice(k * g.group_size, (k + 1) * g.group_size)
            advs = group_advantages(rewards[part], std_norm=g.std_norm, eps=ADV_EPS)
            for ep_turns, adv in zip(turns[part], advs, strict=True):
                samples += [Sample(t, adv) for t in ep_turns]
        t1 = time.perf_counter()
        req = gradient_request(g, update, (), ())
        grpo_step(
            trainee, samples, req, derive_rng(scenario.seed, "update", update).getrandbits(63)
        )
        load_weights(
            runner.model, {k: v.detach().clone() for k, v in trainee.model.state_dict().items()}
        )
        runner.version = update + 1
        rollout += t1 - r0
        train += time.perf_counter() - t1
    return SyncResult(
        updates=updates,
        episodes=updates * n,
        env_steps=steps,
        seconds=time.perf_counter() - t0,
        rollout_seconds=rollout,
        train_seconds=train,
        train_success=success,
    )


def as_dict(result: SyncResult) -> dict[str, Any]:
    """A JSON-able view of a result."""
    return dict(result.__dict__)
