"""Rollout throughput, old code against new, interleaved: env steps/s of ``coevo run``.

Runs the same scenario (by default the quickstart as pure rollouts: ``run.method=rollout``,
32 workers, ``policy.batch_max`` 32, 200 episodes, the same seed, so the same episodes) with
this checkout and with ``--baseline`` (a checkout of the code before, e.g. a ``git worktree``
of main), alternating, ``--rounds`` times, each run in its own process (``python -m
scenarios.cli run``). Env steps/s is the run's ``StepTaken`` events over its wall time from its
first event to its last; the process's own wall time (start-up and imports included) is
printed beside it. Prints each round, the medians, their ranges and the median of the rounds'
ratios.

A relative ``--scenario`` is each tree's own file (what a user of that code runs); the settings
in which the two files differ are printed first. An absolute path is the same file for both.

    .venv/bin/python bench/bench_rollout.py --baseline ../main-worktree --rounds 3
    .venv/bin/python bench/bench_rollout.py --baseline B --scenario scenarios/empo2.toml \\
        --set run.episodes=128 --set eval.every=0 --set eval.final_episodes=0 \\
        --set eval.adapt_attempts=0 --no-rollout [--new-set empo2.embedder=minilm-int8]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stores.lmdb_log import LmdbEventLog  # noqa: E402

ROLLOUT = ["run.method=rollout", "run.episodes=200", "run.workers=32", "policy.batch_max=32"]


def one_run(
    tree: Path, scenario: Path, overrides: list[str], out: Path
) -> tuple[float, float, float]:
    """``(env steps/s, process wall seconds, process CPU ms per env step)`` of one run of
    ``scenario`` with the code in ``tree``."""
    cmd = [sys.executable, "-m", "scenarios.cli", "run", str(scenario), "--out", str(out)]
    cmd.append("--quiet")
    for item in overrides:
        cmd += ["--set", item]
    t0, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin"})
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    log = LmdbEventLog.open(out / "log")
    try:
        envs = list(log.read())
    finally:
        log.close()
    n = sum(1 for e in envs if e.event.__struct_config__.tag == "step_taken")
    return n / ((envs[-1].t - envs[0].t) / 1e9), wall, 1000 * cpu / n


def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def scenario_differences(old: Path, new: Path) -> list[str]:
    """The settings (``key.path: old -> new``) in which two scenario files differ."""
    a, b = (_flat(tomllib.loads(path.read_text())) for path in (old, new))
    return [
        f"{key}: {a.get(key, '(unset)')!r} -> {b.get(key, '(unset)')!r}"
        for key in sorted(a.keys() | b.keys())
        if a.get(key, "(unset)") != b.get(key, "(unset)")
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the old checkout")
    parser.add_argument(
        "--scenario",
        type=Path,
        default=Path("scenarios/quickstart.toml"),
        help="relative: each tree's own copy (default: %(default)s); absolute: one file for both",
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    parser.add_argument(
        "--new-set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="an override for the new side only (a setting the old code does not know)",
    )
    parser.add_argument("--no-rollout", action="store_true", help="not the rollout overrides")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="keep the runs here (default: removed)")
    args = parser.parse_args(argv)
    overrides = ([] if args.no_rollout else ROLLOUT) + args.set
    trees = {"old": args.baseline.resolve(), "new": ROOT}
    scenarios = {side: tree / args.scenario for side, tree in trees.items()}
    for path in scenarios.values():
        if not path.is_file():
            parser.error(f"no scenario file {path}")
    differ = scenario_differences(scenarios["old"], scenarios["new"])
    if differ:
        print("the scenario files differ (old -> new): " + "; ".join(differ), flush=True)
    rates: dict[str, list[float]] = {"old": [], "new": []}
    walls: dict[str, list[float]] = {"old": [], "new": []}
    cpus: dict[str, list[float]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = (args.keep or Path(scratch)).resolve()  # the runs' cwd is their tree
        tmp.mkdir(parents=True, exist_ok=True)
        for k in range(args.rounds):
            for side, tree in trees.items():
                sets = overrides + (args.new_set if side == "new" else [])
                out = tmp / f"{side}-{k}"
                rate, wall, cpu = one_run(tree, scenarios[side], sets, out)
                rates[side].append(rate)
                walls[side].append(wall)
                cpus[side].append(cpu)
            print(
                f"round {k + 1}: old {rates['old'][-1]:.1f} env steps/s ({walls['old'][-1]:.1f} s "
                f"process, {cpus['old'][-1]:.2f} CPU ms/step), new {rates['new'][-1]:.1f} "
                f"({walls['new'][-1]:.1f} s, {cpus['new'][-1]:.2f} ms)",
                flush=True,
            )
    ratios = [n / o for n, o in zip(rates["new"], rates["old"], strict=True)]
    for side in ("old", "new"):
        r, w, c = rates[side], walls[side], cpus[side]
        print(
            f"{side}: env steps/s median {statistics.median(r):.1f} [{min(r):.1f}-{max(r):.1f}], "
            f"process wall median {statistics.median(w):.1f} s [{min(w):.1f}-{max(w):.1f}], "
            f"CPU ms per env step (all threads, start-up included) median "
            f"{statistics.median(c):.2f} [{min(c):.2f}-{max(c):.2f}]"
        )
    print(
        f"new/old env steps/s, median of the rounds' ratios: {statistics.median(ratios):.2f}x "
        f"[{min(ratios):.2f}-{max(ratios):.2f}]"
    )
    per_step = [o / n for n, o in zip(cpus["new"], cpus["old"], strict=True)]
    print(
        f"old/new CPU per env step, median of the rounds' ratios: "
        f"{statistics.median(per_step):.2f}x [{min(per_step):.2f}-{max(per_step):.2f}]"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
