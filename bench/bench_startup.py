"""Start-up of short commands, old code against new, alternating: CPU and wall seconds of
``coevo validate`` (the quickstart, a policy scenario) and ``coevo log`` / ``coevo replay
--verify`` of a run, each in a fresh interpreter, with this checkout and with ``--baseline``.

    .venv/bin/python bench/bench_startup.py RUN_DIR --baseline ../main-worktree --rounds 3
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(tree: Path, args: list[str]) -> tuple[float, float]:
    """``(wall, CPU)`` seconds of ``python -m scenarios.cli ARGS`` with the code in ``tree``."""
    t0, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, "-m", "scenarios.cli", *args],
        check=True,
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return time.perf_counter() - t0, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a run directory")
    parser.add_argument("--baseline", type=Path, required=True, help="the old checkout")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    run = str(args.run.resolve())
    commands = {
        "validate quickstart": ["validate", str(ROOT / "scenarios/quickstart.toml")],
        "log --limit 10": ["log", run, "--limit", "10"],
        "replay --verify": ["replay", run, "--verify"],
    }
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for name, cmd in commands.items():
            for side, tree in (("old", args.baseline.resolve()), ("new", ROOT)):
                got.setdefault((name, side), []).append(timed(tree, cmd))
    print("| command | old wall s | new wall s | old CPU s | new CPU s |")
    print("|---|---:|---:|---:|---:|")
    for name in commands:
        old, new = got[(name, "old")], got[(name, "new")]
        med = [statistics.median(x[i] for x in side) for i in (0, 1) for side in (old, new)]
        print(f"| `coevo {name}` | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} | {med[3]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
