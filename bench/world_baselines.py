"""Baselines of the built-in world: how hard each minilab family is, and how fast it steps.

Run: ``.venv/bin/python bench/world_baselines.py`` (single thread, a few minutes at most).

Per family it measures, over the first ``--variants`` variants of each split:
- random: a uniformly random policy (``--repeats`` seeded episodes per train variant);
- explorer: the memoryless heuristic explorer of agents/acting/scripted.py (same episodes);
- +note train / +note heldout: the same explorer given a correct note, the hindsight note of an
  earlier successful episode of the same variant (found by explorers and random agents);
- +other note: the explorer given the note of a different train variant with the same goal,
  which helps only through the family's cross-variant rule;
- mean episode length of the random policy and of the explorer;
- env steps/s: resets and steps with uniformly random admissible actions, one thread.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.acting.scripted import Explorer, RandomAgent, hindsight_note, run_episode
from engine.world import Task
from scenarios.worlds.minilab import MiniLab

COLUMNS = (
    "family",
    "random",
    "explorer",
    "+note train",
    "+note heldout",
    "+other note",
    "len random",
    "len explorer",
    "env steps/s",
)


def note_for(world: MiniLab, task: Task, tries: int) -> str | None:
    """The hindsight note of the first successful episode of ``task``, or None."""
    for seed in range(tries):
        agent = Explorer(seed) if seed % 2 == 0 else RandomAgent(seed)
        result = run_episode(world, task, seed, agent)
        if result.success:
            return hindsight_note(result.transcript)
    return None


def success_with_notes(world: MiniLab, tasks: Sequence[Task], tries: int) -> float:
    """Success of the explorer given each variant's own note (no note found counts as 0)."""
    wins = 0
    for task in tasks:
        note = note_for(world, task, tries)
        if note is not None:
            wins += run_episode(world, task, 0, Explorer(task.variant + 1, note)).success
    return wins / len(tasks)


def success_with_other_notes(world: MiniLab, tasks: Sequence[Task], tries: int) -> float:
    """Success on each variant with the note of the previous variant that had the same goal."""
    last_note: dict[str, str] = {}
    wins = runs = 0
    for task in tasks:
        goal = world.reset(task, 0).goal
        if goal in last_note:
            agent = Explorer(task.variant + 1, last_note[goal])
            wins += run_episode(world, task, 0, agent).success
            runs += 1
        note = note_for(world, task, tries)
        if note is not None:
            last_note[goal] = note
    return wins / max(runs, 1)


def steps_per_second(world: MiniLab, tasks: Sequence[Task], episodes: int) -> float:
    """Env steps per second with uniformly random actions, resets included."""
    rng = random.Random(0)
    steps = 0
    start = time.perf_counter()
    for i in range(episodes):
        obs = world.reset(tasks[i % len(tasks)], i)
        while not obs.done:
            obs = world.step(rng.choice(obs.admissible))
            steps += 1
    return steps / (time.perf_counter() - start)


def family_row(world: MiniLab, family: str, args: argparse.Namespace) -> list[str]:
    """One table row: the measurements of ``family`` over its first ``args.variants`` variants."""
    train = world.tasks(family, "train")[: args.variants]
    heldout = world.tasks(family, "heldout")[: args.variants]
    tries = args.tries
    seeds = [(t, args.repeats * t.variant + r) for t in train for r in range(args.repeats)]
    rand = [run_episode(world, t, seed, RandomAgent(seed)) for t, seed in seeds]
    expl = [run_episode(world, t, seed, Explorer(seed)) for t, seed in seeds]
    return [
        family,
        f"{sum(r.success for r in rand) / len(rand):.3f}",
        f"{sum(r.success for r in expl) / len(expl):.3f}",
        f"{success_with_notes(world, train, tries):.3f}",
        f"{success_with_notes(world, heldout, tries):.3f}",
        f"{success_with_other_notes(world, train, tries):.3f}",
        f"{sum(r.steps for r in rand) / len(rand):.1f}",
        f"{sum(r.steps for r in expl) / len(expl):.1f}",
        f"{steps_per_second(world, world.tasks(family, 'train'), args.speed_episodes):,.0f}",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """Measure every family and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", type=int, default=500, help="variants per family and split")
    parser.add_argument("--repeats", type=int, default=4, help="random/explorer seeds per variant")
    parser.add_argument("--tries", type=int, default=3000, help="episodes to find a note")
    parser.add_argument("--speed-episodes", type=int, default=3000, help="episodes timed")
    args = parser.parse_args(argv)
    world = MiniLab(train_variants=max(args.variants, 1), heldout_variants=max(args.variants, 1))
    print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cpus")
    print(
        f"variants per family and split: {args.variants}; random and explorer: {args.repeats} "
        "episodes per variant; with notes: one episode per variant\n"
    )
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "|".join("---" for _ in COLUMNS) + "|")
    for family in world.families():
        row = family_row(world, family, args)
        print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
