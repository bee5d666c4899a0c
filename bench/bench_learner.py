"""The learner's update on a run's own samples, with and without skipping zero-advantage turns.

For each run log (``--run``, repeatable), the first ``--updates`` updates' requests and samples
are folded from the log as re-execution folds them, then each side runs them in order from the
run's base weights, alternating sides round by round, each round from a fresh copy. Reported:
CPU seconds per update (this process, one torch thread as the runs use), the share of
trained turns whose advantage is 0, and the ratio of the sides (median of the rounds, range).
The updates are the same up to float rounding (tests/unit/test_updates.py); this measures only
their cost.

    .venv/bin/python bench/bench_learner.py --run runs/headline/grpo-seed0 --updates 6
"""

from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from agents.audit.reexecute import RequestedUpdate, requested_updates  # noqa: E402
from agents.learning.update import Trainee, grpo_step  # noqa: E402
from scenarios.cli.common import find_run, open_run  # noqa: E402
from scenarios.policy_setup import reexecution_for  # noqa: E402


def updates_of(run: Path, n: int) -> tuple[Trainee, list[RequestedUpdate]]:
    """The run's trainee at version 0 and its first ``n`` updates with their inputs."""
    log = open_run(str(run))
    try:
        envs = iter(log.read(0))
        first = next(envs)
        rx = reexecution_for(find_run(str(run)).root, log.read_meta(), first.event.seed)
        updates = list(itertools.islice(requested_updates(envs, first.event.seed), n))
    finally:
        log.close()
    assert rx.trainee is not None, f"{run} trains no policy"
    return rx.trainee, updates


def one_side(trainee: Trainee, updates: list[RequestedUpdate], skip: bool) -> float:
    """CPU seconds of the updates in order from a fresh copy of ``trainee``."""
    fresh = copy.deepcopy(trainee)
    start = time.process_time()
    for u in updates:
        told = msgspec.structs.replace(u.request, skip_zero_advantage=skip, scoring="packed")
        grpo_step(fresh, u.samples, told, u.seed, u.version)
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--run", action="append", required=True, type=Path)
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for run in args.run:
        trainee, updates = updates_of(run, args.updates)
        turns = sum(len(u.samples) for u in updates)
        zero = sum(1 for u in updates for x in u.samples if x.adv == 0)
        cpu: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for skip in (False, True):
                cpu[skip].append(one_side(trainee, updates, skip))
        ratios = [a / b for a, b in zip(cpu[False], cpu[True], strict=True)]
        per = {k: statistics.median(v) / len(updates) for k, v in cpu.items()}
        print(
            f"{run.name}: {len(updates)} updates, {turns} turns, {zero / turns:.1%} with "
            f"advantage 0; "
            f"CPU s per update: all turns {per[False]:.2f}, skipping {per[True]:.2f}; "
            f"all/skipping {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
