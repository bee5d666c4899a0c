"""What checksums and snapshots cost as a run grows: fixed spacing against the byte budget.

A checksum encodes and hashes every projection's whole state and a snapshot stores it; the
episode table holds a row per episode, so its state grows with the run. With a fixed spacing
(``checksum_budget = snapshot_budget = 0``, the engine before the budget) each checksum of a
run ten times longer costs ten times more, and there are ten times more of them. With the
budget (the defaults of :class:`~engine.runtime.RuntimeConfig`) the gap after a checksum of
``B`` bytes is at least ``B / checksum_budget`` events.

For each run length (``--episodes``): a source actor emits that many synthetic episodes
(assigned, started, ``--steps`` steps, finished: the events the episode table folds) through
the runtime with its two projections into an LMDB log (``durable = false``: the CPU, not the
disk), once per configuration, the configurations alternating within each round (and which
goes first, from one round to the next). Reported per configuration and length, medians of
``--rounds``: the run's CPU microseconds per event, its checksums and snapshots, the bytes of
snapshot stored per event, and ``replay --verify``'s rate (CPU time; it recomputes every
checksum).

Run: ``.venv/bin/python bench/bench_state_growth.py [--episodes N ...] [--steps S]
[--rounds R]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import msgspec
import trio
from rich.console import Console

from agents.acting.projections import EpisodeTable
from agents.events.episodes import EpisodeAssigned, EpisodeFinished, EpisodeStarted, StepTaken
from engine.actor import Actor, ActorSpec, Context
from engine.eventlog import new_run_meta
from engine.events import Event
from engine.lifecycle import ProjectionChecked, RunStarted, SnapshotTaken
from engine.projection import ActorStats
from engine.replay import verify_log
from engine.runtime import Runtime, RuntimeConfig
from scenarios.cli.logsetup import configure_logging
from stores.lmdb_log import LmdbEventLog

ACTIONS = ("open box", "take key", "go north", "unlock door", "look", "inventory")
CONFIGS = {
    "fixed spacing (budgets 0)": RuntimeConfig(checksum_budget=0, snapshot_budget=0),
    "byte budget (the defaults)": RuntimeConfig(),
}


def episode_events(index: int, steps: int) -> list[Event]:
    """One synthetic episode: what an env worker emits for it."""
    name, worker = f"ep{index:07d}", f"w{index % 32}"
    events: list[Event] = [
        EpisodeAssigned(
            episode=name, index=index, worker=worker, family=("heat", "unlock")[index % 2],
            variant=index % 50, split="train", seed=index * 7919,
        ),
        EpisodeStarted(
            episode=name, worker=worker, goal="heat the water", observation="a lab.",
            admissible=ACTIONS,
        ),
    ]  # fmt: skip
    for turn in range(steps):
        done = turn == steps - 1
        events.append(
            StepTaken(
                episode=name, turn=turn, action=ACTIONS[turn % 6], observation="you see a box.",
                admissible=ACTIONS, reward=float(done), done=done, score=float(done),
            )
        )  # fmt: skip
    events.append(
        EpisodeFinished(
            episode=name, worker=worker, family=("heat", "unlock")[index % 2], variant=index % 50,
            split="train", steps=steps, score=1.0, success=True, total_reward=1.0,
        )
    )  # fmt: skip
    return events


class Episodes(Actor):
    def __init__(self, episodes: int, steps: int) -> None:
        self.episodes, self.steps = episodes, steps

    async def run(self, ctx: Context) -> None:
        for index in range(self.episodes):
            for ev in episode_events(index, self.steps):
                await ctx.emit(ev)


def one_run(path: Path, episodes: int, steps: int, config: RuntimeConfig) -> dict[str, float]:
    """Run the stream into a fresh log at ``path`` and verify it."""
    meta = new_run_meta("bench", scenario_name="bench", seed=0, coevo_version="bench")
    log = LmdbEventLog.create(path, meta, durable=False, map_size=16 << 30)
    started = RunStarted(run_id="bench", scenario="b", scenario_hash="", seed=0, coevo_version="")
    spec = ActorSpec(name="env", factory=lambda: Episodes(episodes, steps), driver=True)
    runtime = Runtime(log, started, [spec], [ActorStats(), EpisodeTable()], seed=0, config=config)
    c0 = time.process_time()
    outcome = trio.run(runtime.run)
    cpu = time.process_time() - c0
    checks = snapshots = stored = 0
    for chunk in log.read_chunks(0, log.next_seq):
        for env in chunk:
            if isinstance(env.event, ProjectionChecked):
                checks += 1
            elif isinstance(env.event, SnapshotTaken):
                snapshots += 1
                stored += env.event.size
    log.close()
    log = LmdbEventLog.open(path, writable=False)
    c0 = time.process_time()
    result = verify_log(log, [ActorStats(), EpisodeTable()])
    verify_cpu = time.process_time() - c0
    log.close()
    assert result.ok, result.error
    return {
        "events": outcome.events,
        "append_us": 1e6 * cpu / outcome.events,
        "checks": checks,
        "snapshots": snapshots,
        "snapshot_bytes_per_event": stored / outcome.events,
        "verify_rate": result.events / verify_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, nargs="+", default=[2000, 8000, 32000])
    parser.add_argument("--steps", type=int, default=16, help="steps per episode")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    configure_logging(Console(stderr=True), "warning")
    base = Path(tempfile.mkdtemp(prefix="coevo-growth-", dir=os.environ.get("BENCH_DIR")))
    got: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for k in range(args.rounds):
            for episodes in args.episodes:
                order = list(CONFIGS.items())
                for name, config in order[::-1] if k % 2 else order:  # each goes first in turn
                    path = base / f"r{k}-{episodes}-{len(got)}"
                    got.setdefault((name, episodes), []).append(
                        one_run(path, episodes, args.steps, config)
                    )
                    shutil.rmtree(path)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(got, args)


def report(got: dict[tuple[str, int], list[dict[str, float]]], args: argparse.Namespace) -> None:
    cfg = RuntimeConfig()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, msgspec {msgspec.__version__}; episodes of "
          f"{args.steps + 3} events; checksum_every {cfg.checksum_every}, snapshot_every "
          f"{cfg.snapshot_every}; budgets {cfg.checksum_budget} (checksum) and "
          f"{cfg.snapshot_budget} (snapshot) bytes per event; median of {args.rounds}")  # fmt: skip
    print("| spacing | episodes | events | append CPU µs/event | checksums | snapshots "
          "| snapshot bytes/event | replay --verify, events/s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (name, episodes), rounds in got.items():
        med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        print(f"| {name} | {episodes:,} | {med['events']:,.0f} | {med['append_us']:.2f} | "
              f"{med['checks']:,.0f} | {med['snapshots']:,.0f} | "
              f"{med['snapshot_bytes_per_event']:,.0f} | {med['verify_rate']:,.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
