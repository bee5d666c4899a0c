"""The evidence behind docs/RESULTS.md: GRPO learning curves over seeds, rollout throughput,
and coevo against a plain synchronous loop. Anyone can rerun it:

    .venv/bin/python bench/grpo_results.py                 # everything (tens of minutes)
    .venv/bin/python bench/grpo_results.py --part curves   # one part: curves, rollout, sync

Every number comes from the run logs this script writes under ``--runs`` (default
``runs/bench``); the markdown fragments and PNGs go to ``--out`` (default ``docs/results``).

- curves: ``scenarios/grpo.toml`` for each ``--seeds``; held-out success per evaluation round
  and train success per block, per seed and their mean.
- rollout: env steps/s of policy rollouts (no learning) with ``--workers`` concurrent env
  workers (8 and 32) and batched inference, against one worker with unbatched inference,
  same episodes, same model.
- sync: the quickstart's GRPO budget through coevo (actors, durable log) and through
  ``bench/grpo_sync.py`` (a plain synchronous loop, no actors, no log), same model, same
  budget, evaluation off in both.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agents.report.curves import Curves, fold_curves
from engine.events import Event
from scenarios.cli import main as coevo
from scenarios.loader import load_scenario
from stores.lmdb_log import LmdbEventLog

ROOT = Path(__file__).resolve().parents[1]


def run(scenario: Path, out: Path, overrides: list[str]) -> list[Any]:
    """Run a scenario through the CLI (in process) and return its envelopes."""
    if out.exists():
        raise SystemExit(f"{out} exists: remove it or pass another --runs")
    args = ["run", str(scenario), "--out", str(out), "--quiet"]
    for item in overrides:
        args += ["--set", item]
    code = coevo(args)
    if code != 0:
        raise SystemExit(f"coevo run {scenario} exited {code}")
    log = LmdbEventLog.open(out / "log", writable=False)
    try:
        return list(log.read(0, None))
    finally:
        log.close()


def wall_seconds(envs: list[Any]) -> float:
    """From the run's first event to its last, by the envelopes' clocks."""
    return (envs[-1].t - envs[0].t) / 1e9


def steps(envs: list[Any]) -> int:
    return sum(1 for env in envs if env.event.__struct_config__.tag == "step_taken")


def events_of(envs: list[Any]) -> list[Event]:
    return [env.event for env in envs]


# --- curves ----------------------------------------------------------------------------------


def part_curves(args: argparse.Namespace) -> list[str]:
    per_seed: dict[int, Curves] = {}
    walls: dict[int, float] = {}
    for seed in args.seeds:
        envs = run(args.scenario, args.runs / f"grpo-seed{seed}", [f"seed={seed}", *args.set])
        per_seed[seed] = fold_curves(events_of(envs))
        walls[seed] = wall_seconds(envs)
    png = plot_seeds(per_seed, args.out / "grpo_curves.png")
    lines = [
        "| seed | held-out success, version 0 | held-out success, final | best round | "
        "train success, first block | train success, last block | wall |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for seed, c in per_seed.items():
        first, last = c.heldout[0], c.heldout[-1]
        best = max(row[2] for row in c.heldout)
        lines.append(
            f"| {seed} | {first[2]:.3f} | {last[2]:.3f} (v{last[1]}) | {best:.3f} | "
            f"{c.train[0][1]:.3f} | {c.train[-1][1]:.3f} | {walls[seed]:.0f} s |"
        )
    mean_first = statistics.mean(c.heldout[0][2] for c in per_seed.values())
    mean_last = statistics.mean(c.heldout[-1][2] for c in per_seed.values())
    lines.append(f"| mean | {mean_first:.3f} | {mean_last:.3f} | | | | |")
    cmd = " ".join(["python bench/grpo_results.py --part curves --seeds", *map(str, args.seeds)])
    return [f"Command: `{cmd}` (scenario `{args.scenario}`).", "", *lines, "", f"![]({png.name})"]


def plot_seeds(per_seed: dict[int, Curves], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for seed, c in per_seed.items():
        xs = [row[0] for row in c.heldout]
        (line,) = ax.plot(
            xs, [row[2] for row in c.heldout], marker="o", label=f"held-out, seed {seed}"
        )
        ax.plot(
            [row[0] for row in c.train],
            [row[1] for row in c.train],
            alpha=0.35,
            linestyle="--",
            color=line.get_color(),
        )
    ax.set_xlabel("training episodes")
    ax.set_ylabel("success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("GRPO in minilab (dashed: train success per block)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --- rollout throughput ----------------------------------------------------------------------


def part_rollout(args: argparse.Namespace) -> list[str]:
    base = [
        "run.method=rollout",
        "agent.kind=policy",
        f"run.episodes={args.rollout_episodes}",
        *args.set,
    ]
    configs = [("1 worker, unbatched (batch_max 1)", ["run.workers=1", "policy.batch_max=1"])]
    configs += [
        (f"{n} workers, batched (batch_max {n})", [f"run.workers={n}", f"policy.batch_max={n}"])
        for n in args.workers
    ]
    rows = []
    for label, extra in configs:
        envs = run(args.quickstart, args.runs / f"rollout-{len(rows)}", base + extra)
        n, secs = steps(envs), wall_seconds(envs)
        rows.append((label, n, secs, n / secs))
    lines = ["| rollout | env steps | wall | env steps/s |", "|---|---:|---:|---:|"]
    lines += [f"| {label} | {n} | {secs:.1f} s | {rate:.0f} |" for label, n, secs, rate in rows]
    lines.append("")
    lines += [
        f"{label}: {rate / rows[0][3]:.2f}x one unbatched worker." for label, _, _, rate in rows[1:]
    ]
    return lines


# --- coevo vs a synchronous loop -------------------------------------------------------------


def part_sync(args: argparse.Namespace) -> list[str]:
    from grpo_sync import run_sync

    from scenarios.assemble import assemble
    from scenarios.policy_models import policy_model_dir

    overrides = ["eval.every=0", *args.set]
    scenario = load_scenario(args.quickstart, overrides)
    assembly = assemble(scenario, str(args.quickstart), prepare_model=False)
    model = policy_model_dir(scenario, str(args.quickstart))
    envs = run(args.quickstart, args.runs / "sync-coevo", overrides)
    coevo_secs, coevo_steps = wall_seconds(envs), steps(envs)
    t0 = time.perf_counter()
    result = run_sync(scenario, model, list(assembly.tasks))
    sync_total = time.perf_counter() - t0
    lines = [
        "| GRPO, same model and budget | updates | episodes | env steps | wall | env steps/s |",
        "|---|---:|---:|---:|---:|---:|",
        f"| coevo (actors, durable log, {scenario.run.workers} workers) | "
        f"{sum(1 for e in envs if e.event.__struct_config__.tag == 'policy_updated')} | "
        f"{sum(1 for e in envs if e.event.__struct_config__.tag == 'episode_finished')} | "
        f"{coevo_steps} | {coevo_secs:.1f} s | {coevo_steps / coevo_secs:.0f} |",
        f"| plain synchronous loop (lockstep batch, no log) | {result.updates} | "
        f"{result.episodes} | {result.env_steps} | {result.seconds:.1f} s | "
        f"{result.env_steps / result.seconds:.0f} |",
        "",
        f"coevo / synchronous wall time: {coevo_secs / result.seconds:.2f}x "
        f"(synchronous loop: {result.rollout_seconds:.1f} s rollout + "
        f"{result.train_seconds:.1f} s training, {sync_total:.1f} s including model loads).",
    ]
    return lines


def machine() -> str:
    import torch

    return (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}, torch threads {torch.get_num_threads()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("curves", "rollout", "sync"), action="append")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "grpo.toml")
    parser.add_argument("--quickstart", type=Path, default=ROOT / "scenarios" / "quickstart.toml")
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rollout-episodes", type=int, default=200)
    parser.add_argument("--set", action="append", default=[], help="extra scenario overrides")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "bench")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args()
    args.runs = args.runs / time.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    parts = args.part or ["curves", "rollout", "sync"]
    report: dict[str, list[str]] = {}
    for part in parts:
        print(f"== {part}", file=sys.stderr)
        report[part] = {"curves": part_curves, "rollout": part_rollout, "sync": part_sync}[part](
            args
        )
        (args.out / f"{part}.md").write_text(
            f"Measured {time.strftime('%Y-%m-%d')} on {machine()}.\n\n"
            + "\n".join(report[part])
            + "\n"
        )
        print("\n".join(report[part]))
    print(f"runs: {args.runs}; fragments: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
