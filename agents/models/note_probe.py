"""Does the policy read a note? Play it on held-out variants with a helpful note, a wrong one,
other kinds (:data:`agents.models.notes.NOTE_KINDS`) and none, and compare success.

Both memory methods assume a policy that follows a hint in its prompt. This probe measures it
for any policy model in score mode: every episode of a variant is played with the same seed in
each condition, so the conditions differ only in the notes shown. Notes come from the memoryless
Explorer's play (:mod:`agents.models.notes`): a held-out variant's ``variant`` note is the note of a
success on it, its ``wrong`` note the note of a success on another variant of the family with
the same goal that fails here when followed.

Episodes are played in lockstep, one batched forward pass per turn for every live episode
(:func:`play_batch`); what each samples depends only on its own seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agents.models.notes import NoteSource, Shown, render, write_library
from agents.models.policy import score_and_choose
from agents.models.prompts import (
    PromptEncoder,
    Step,
    cut_gap,
    encode_response,
    fit_scoring,
    turn_messages,
)
from agents.report.intervals import bootstrap_ratio
from engine.world import Task, TextWorld

PROBE_KINDS = ("none", "variant", "wrong", "family", "unrelated")
"""The conditions of the probe, "none" first (the others are compared with it)."""


@dataclass(frozen=True, slots=True)
class Job:
    """One episode to play: the task, the tips its prompts show, and its seed."""

    task: Task
    tips: tuple[str, ...]
    seed: int


@dataclass(slots=True)
class _Live:
    job: Job
    world: TextWorld
    goal: str
    text: str
    admissible: tuple[str, ...]
    history: list[Step]
    rng: random.Random
    done: bool = False
    success: bool = False


def play_batch(
    model: Any,
    tokenizer: Any,
    make_world: Callable[[], TextWorld],
    jobs: Sequence[Job],
    *,
    window: int,
    temperature: float = 1.0,
    batch: int = 32,
) -> list[bool]:
    """Play ``jobs`` with the policy in score mode, ``batch`` episodes at a time in lockstep;
    the success of each, in order. A job's draws come from its own seed only."""
    out: list[bool] = []
    worlds = [make_world() for _ in range(min(batch, len(jobs)))]
    try:
        for start in range(0, len(jobs), batch):
            chunk = jobs[start : start + batch]
            out += _play_chunk(model, tokenizer, worlds, chunk, window, temperature)
    finally:
        for world in worlds:
            world.close()
    return out


def _play_chunk(
    model: Any,
    tokenizer: Any,
    worlds: Sequence[TextWorld],
    jobs: Sequence[Job],
    window: int,
    temperature: float,
) -> list[bool]:
    live = []
    for world, job in zip(worlds, jobs, strict=False):
        obs = world.reset(job.task, job.seed)
        rng = random.Random(f"coevo.note-probe/{job.seed}")
        live.append(_Live(job, world, obs.goal, obs.text, obs.admissible, [], rng))
    cache: dict[str, list[int]] = {}
    encoder = PromptEncoder(tokenizer)
    while active := [ep for ep in live if not ep.done]:
        messages = [
            turn_messages(ep.goal, ep.history, ep.text, tips=ep.job.tips, window=window)
            for ep in active
        ]
        prompts = encoder.encode(messages, [ep.job.tips for ep in active])
        for action in {a for ep in active for a in ep.admissible} - cache.keys():
            cache[action] = encode_response(tokenizer, action)
        limit, gap = model.config.max_position_embeddings, cut_gap(tokenizer)
        fitted = [
            fit_scoring(prompt, [cache[a] for a in ep.admissible], limit, gap)
            for prompt, ep in zip(prompts, active, strict=True)
        ]  # cut as inference cuts what does not fit
        prompts, candidates = [p for p, _ in fitted], [c for _, c in fitted]
        choices = score_and_choose(
            model,
            prompts,
            candidates,
            [ep.rng for ep in active],
            temperature=temperature,
            pad_id=tokenizer.pad_token_id,
            device=torch.device("cpu"),
        )
        for ep, choice in zip(active, choices, strict=True):
            action = ep.admissible[choice.index]
            obs = ep.world.step(action)
            ep.history.append((action, obs.text))
            ep.text, ep.admissible = obs.text, obs.admissible
            ep.done, ep.success = obs.done, obs.success
    return [ep.success for ep in live]


def probe_notes(
    world: TextWorld, variants: Sequence[Task], library: Sequence[Task], *, tries: int, key: str
) -> tuple[dict[str, list[tuple[Task, tuple[str, ...]]]], int]:
    """The notes of every probe condition for each of ``variants`` that enters the probe, and
    how many do.

    A variant enters only when the Explorer found a success on it within ``tries`` (so it has a
    helpful note) and a wrong note exists for it; ``library`` are the tasks whose notes serve
    as other variants' (``family``, ``unrelated`` and ``wrong`` notes).
    """
    own = write_library(world, variants, tries, f"{key}/own")
    others = write_library(world, library, tries, f"{key}/library")
    source = NoteSource(others, world)
    out: dict[str, list[tuple[Task, tuple[str, ...]]]] = {kind: [] for kind in PROBE_KINDS}
    rng = random.Random(f"coevo.note-probe/{key}")
    for task in variants:
        written = own[task]
        shown = {
            kind: source.pick(kind, task, written.goal, rng, own=written) for kind in PROBE_KINDS
        }
        if written.success is None or not shown["wrong"].tips:
            continue
        shown["variant"] = Shown("variant", (written.success,))  # the success note alone
        for kind, notes in shown.items():
            out[kind].append((task, notes.tips))
    return out, len(out["none"])


def _rate(flags: Sequence[bool]) -> float | None:
    return round(sum(flags) / len(flags), 4) if flags else None


def _ratio(rate: float | None, base: float | None) -> float | None:
    return round(rate / base, 3) if rate is not None and base else None


def _ratio_interval(top: Sequence[bool], bottom: Sequence[bool]) -> list[float | None] | None:
    """The 95% bootstrap interval of ``mean(top) / mean(bottom)`` over episodes; an upper bound
    of None where the interval is unbounded (``pretrain.json`` held ``Infinity``, not JSON)."""
    if not top or not any(bottom):
        return None
    got = bootstrap_ratio([[float(x) for x in top]], [[float(x) for x in bottom]])
    return [round(got.low, 3), round(got.high, 3) if math.isfinite(got.high) else None]


def note_probe(
    model: Any,
    tokenizer: Any,
    make_world: Callable[[], TextWorld],
    *,
    variants: int,
    seeds: int,
    tries: int,
    window: int,
    key: str = "probe",
) -> dict:
    """Success of the policy (sampled at temperature 1) with each kind of note on the first
    ``variants`` held-out variants of every family, ``seeds`` episodes per variant and
    condition, notes shown as written and as entries; the ratios to "none".

    Returns:
        ``{"all": ..., "<family>": ...}``, each with ``variants``, per form (``"written"``,
        ``"entry"``) the success rate per kind, and ``"helpful_vs_none"`` /
        ``"wrong_vs_none"`` (of the written form, None when "none" never succeeded).
    """
    world = make_world()
    try:
        report: dict[str, Any] = {}
        flags: dict[str, dict[str, dict[str, list[bool]]]] = {}
        for family in world.families():
            held = list(world.tasks(family, "heldout"))[:variants]
            library = list(world.tasks(family, "train"))[: 4 * variants]
            library += [
                t for f in world.families() if f != family for t in world.tasks(f, "train")[:8]
            ]
            shown, covered = probe_notes(world, held, library, tries=tries, key=f"{key}/{family}")
            for form in ("written", "entry"):
                for kind, notes in shown.items():
                    js = [
                        Job(task, render(tips, form == "entry"), seed)
                        for task, tips in notes
                        for seed in range(seeds)
                    ]
                    won = play_batch(model, tokenizer, make_world, js, window=window)
                    flags.setdefault(family, {}).setdefault(form, {})[kind] = won
                    flags.setdefault("all", {}).setdefault(form, {}).setdefault(kind, [])
                    flags["all"][form][kind] += won
            report.setdefault(family, {})["variants"] = covered
        report.setdefault("all", {})["variants"] = sum(
            r["variants"] for f, r in report.items() if f != "all"
        )
    finally:
        world.close()
    for group, forms in flags.items():
        for form, by_kind in forms.items():
            report[group][form] = {kind: _rate(won) for kind, won in by_kind.items()}
        written = report[group]["written"]
        report[group]["helpful_vs_none"] = _ratio(written.get("variant"), written.get("none"))
        report[group]["wrong_vs_none"] = _ratio(written.get("wrong"), written.get("none"))
        for name, kind in (("helpful", "variant"), ("wrong", "wrong")):
            report[group][f"{name}_vs_none_interval"] = _ratio_interval(
                forms["written"].get(kind, []), forms["written"].get("none", [])
            )
    return report
