"""Complementary RL's co-evolution, read from run logs: the extractor's credited reward over
training, the bank's size, and what its calls did (operations, malformed answers).

Used by ``bench/method_results.py`` for runs that have an extractor; also runnable alone:

    .venv/bin/python bench/extractor_report.py runs/methods/complementary-seed0 [...]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.report.curves import Coevolution, fold_coevolution, rolling_mean

OPS = ("add", "update", "merge", "rewrite", "discard", "return")


def quarters(credits: list[tuple[int, float]]) -> list[float]:
    """Mean credit in each quarter of the run's credits, in order."""
    values = [x for _, x in credits]
    n = len(values)
    if n < 4:
        return []
    return [statistics.mean(values[k * n // 4 : (k + 1) * n // 4]) for k in range(4)]


def coevolution_table(runs: dict[str, list[tuple[int, Coevolution]]]) -> list[str]:
    lines = [
        "| method | seed | credits | mean credit by quarter of the credits | bank at end | "
        "calls | read as plain add | malformed | ops (add/update/merge/rewrite/discard/return) | "
        "extractor updates (with gradient) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, items in runs.items():
        for seed, c in items:
            q = " -> ".join(f"{x:+.2f}" for x in quarters(c.credits)) or "-"
            ops = "/".join(str(c.ops[o]) for o in OPS)
            bank = c.bank[-1][1] if c.bank else 0
            lines.append(
                f"| {name} | {seed} | {len(c.credits)} | {q} | {bank} | {c.calls} | {c.plain} | "
                f"{c.malformed} | {ops} | {c.updates} ({c.trained}) |"
            )
    return lines


def plot_coevolution(runs: dict[str, list[tuple[int, Coevolution]]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, items in runs.items():
        for seed, c in items:
            xs = [x for x, _ in c.credits]
            rolling = rolling_mean([x for _, x in c.credits], 64)
            ax.plot(xs, rolling, label=f"{name} seed {seed}", alpha=0.8)
            ax2.plot([x for x, _ in c.bank], [s for _, s in c.bank], label=f"{name} seed {seed}")
    ax.set_title("extractor's credited reward (rolling mean of 64 credits)")
    ax.set_xlabel("training episodes")
    ax.set_ylim(-1.05, 1.05)
    ax2.set_title("bank entries")
    ax2.set_xlabel("training episodes")
    for a in (ax, ax2):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    import argparse

    from method_results import read_run

    from agents.events.extractor import ExtractorCalled
    from engine.lifecycle import RunStarted

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished Complementary RL runs")
    runs: dict[str, list[tuple[int, Coevolution]]] = {}
    for path in parser.parse_args().runs:
        got = read_run(path)
        if got is None:
            raise SystemExit(f"{path}: no finished run")
        events = got[0]
        if not any(isinstance(e, ExtractorCalled) for e in events):
            raise SystemExit(f"{path}: no extractor call in this run (Complementary RL's has)")
        seed = next((e.seed for e in events if isinstance(e, RunStarted)), 0)
        runs.setdefault(path.name, []).append((seed, fold_coevolution(events)))
    print("\n".join(coevolution_table(runs)))


if __name__ == "__main__":
    main()
