"""Complementary RL's co-evolution, read from run logs: the extractor's credited reward over
training, the bank's size, and what its calls did (operations, malformed answers).

Used by ``bench/method_results.py`` for runs that have an extractor; also runnable alone:

    .venv/bin/python bench/extractor_report.py runs/methods/complementary-seed0 [...]
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.episode_events import EpisodeFinished
from agents.extractor_events import CreditAssigned, ExtractorCalled, ExtractorUpdated
from agents.memory_events import TipEvicted, TipStored
from engine.events import Event

OPS = ("add", "update", "merge", "rewrite", "discard", "return")


@dataclass
class Coevolution:
    """One run's extractor facts.

    Attributes:
        credits: ``(training episodes ended so far, credit)`` per credit, in order.
        bank: ``(training episodes ended so far, entries in the bank)`` after each change.
        ops: operation counts of all extractor calls.
        calls: extraction and merge calls; ``malformed`` of them had no usable operation.
        updates: extractor updates, ``trained`` of them with a gradient (samples > 0).
    """

    credits: list[tuple[int, float]] = field(default_factory=list)
    bank: list[tuple[int, int]] = field(default_factory=list)
    ops: Counter[str] = field(default_factory=Counter)
    calls: int = 0
    malformed: int = 0
    plain: int = 0
    updates: int = 0
    trained: int = 0


def fold_coevolution(events: list[Event]) -> Coevolution:
    """The extractor facts of a run (pure)."""
    c = Coevolution()
    ended = 0
    size = 0
    for ev in events:
        if isinstance(ev, EpisodeFinished) and ev.purpose == "train":
            ended += 1
        elif isinstance(ev, CreditAssigned):
            c.credits.append((ended, ev.credit))
        elif isinstance(ev, TipStored | TipEvicted):
            size += 1 if isinstance(ev, TipStored) else -1
            c.bank.append((ended, size))
        elif isinstance(ev, ExtractorCalled):
            c.calls += 1
            c.malformed += int(ev.malformed)
            c.plain += int(any(e.startswith("no operation syntax") for e in ev.errors))
            c.ops.update(op for op, _, _ in ev.ops)
        elif isinstance(ev, ExtractorUpdated):
            c.updates += 1
            c.trained += int(ev.samples > 0)
    return c


def quarters(credits: list[tuple[int, float]]) -> list[float]:
    """Mean credit in each quarter of the run's credits, in order."""
    values = [x for _, x in credits]
    n = len(values)
    if n < 4:
        return []
    return [statistics.mean(values[k * n // 4 : (k + 1) * n // 4]) for k in range(4)]


def coevolution_table(runs: dict[str, list[tuple[int, Coevolution]]]) -> list[str]:
    lines = [
        "| method | seed | credits | mean credit by quarter of training | bank at end | "
        "calls | read as plain add | malformed | ops (add/update/merge/rewrite/discard) | "
        "extractor updates (with gradient) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, items in runs.items():
        for seed, c in items:
            q = " -> ".join(f"{x:+.2f}" for x in quarters(c.credits)) or "-"
            ops = "/".join(str(c.ops[o]) for o in OPS[:5])
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
            window = 64
            vals = [x for _, x in c.credits]
            rolling = [
                statistics.mean(vals[max(0, i - window + 1) : i + 1]) for i in range(len(vals))
            ]
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
    from method_results import read_run

    runs: dict[str, list[tuple[int, Coevolution]]] = {}
    for arg in sys.argv[1:]:
        got = read_run(Path(arg))
        if got is None:
            raise SystemExit(f"{arg}: no finished run")
        runs.setdefault(Path(arg).name, []).append((0, fold_coevolution(got[0])))
    print("\n".join(coevolution_table(runs)))


if __name__ == "__main__":
    main()
