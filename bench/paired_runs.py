"""One method under two settings, paired task by task, from the JSON files `bench/headline.py`
writes (every seed's held-out outcomes of the last round, without memory).

Runs of one scenario and seed play the same held-out tasks in their last round whatever a
method setting (evaluation draws its seeds from a sequence of its own, ``eval.own_seeds``), so
two settings can be compared on the same tasks: per seed the difference of their success
rates, and over all seeds the mean difference with a hierarchical bootstrap interval (seeds,
then the pairs within each seed, resampled: :func:`agents.report.intervals.bootstrap_mean`).

    .venv/bin/python bench/paired_runs.py --method empo2 \\
        --a docs/results/headline_a0a91ec.json --b docs/results/empo2_novelty1_a0a91ec.json

The two sides may be two methods (``--method-b``) whose runs play the same held-out tasks (one
world, split and evaluation settings: a variant shipped as a scenario of its own). Each side
may name several files (other seeds of the same setting); a seed both sides hold is
paired, and one whose tasks differ between the sides (another world, split or episode count)
is refused; the files hold each task's family, not its variant, so a change that keeps the
families in order is not seen. The table goes to stdout (and ``--out``, markdown).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.report.intervals import Interval, bootstrap_mean

Outcomes = dict[str, list[tuple[str, bool]]]
"""Per seed, the last round's ``(family, success)`` of each held-out episode, in order."""


def outcomes_of(paths: list[Path], method: str) -> Outcomes:
    """Every seed's held-out outcomes of ``method`` in the files ``paths``.

    Raises:
        SystemExit: a file without the method, or two files with one seed.
    """
    found: Outcomes = {}
    for path in paths:
        try:
            runs = json.loads(path.read_text()).get("outcomes", {}).get(method)
        except (OSError, ValueError, AttributeError) as exc:
            raise SystemExit(f"{path}: not a headline JSON file ({exc})") from None
        if not runs:
            raise SystemExit(f"{path}: no outcomes of method {method!r}")
        for run in runs:
            seed = str(run["seed"])
            if seed in found:
                raise SystemExit(f"{path}: seed {seed} of {method} is in another file too")
            found[seed] = [(str(family), bool(success)) for family, success in run["plain"]]
    return found


def paired(a: Outcomes, b: Outcomes) -> dict[str, list[float]]:
    """Per seed both sides hold, the differences ``b - a`` of each task's success.

    Raises:
        SystemExit: no seed in common, or a seed whose tasks differ between the sides.
    """
    seeds = sorted(a.keys() & b.keys(), key=lambda s: (len(s), s))
    if not seeds:
        raise SystemExit(f"no seed in common (a: {sorted(a)}, b: {sorted(b)})")
    out = {}
    for seed in seeds:
        if [f for f, _ in a[seed]] != [f for f, _ in b[seed]]:
            raise SystemExit(f"seed {seed}: the two sides played other tasks (not paired)")
        out[seed] = [float(y) - float(x) for (_, x), (_, y) in zip(a[seed], b[seed], strict=True)]
    return out


def _rate(outcomes: list[tuple[str, bool]]) -> float:
    return sum(s for _, s in outcomes) / len(outcomes)


def table(a: Outcomes, b: Outcomes, labels: tuple[str, str]) -> tuple[list[str], Interval]:
    """The per-seed rows and the pooled line, and the paired interval."""
    diffs = paired(a, b)
    rows = [
        f"| seed | {labels[0]} | {labels[1]} | {labels[1]} - {labels[0]} |",
        "|---|---|---|---|",
    ]
    for seed, d in diffs.items():
        rows.append(
            f"| {seed} | {_rate(a[seed]):.3f} | {_rate(b[seed]):.3f} | {sum(d) / len(d):+.3f} |"
        )
    seeds = list(diffs)
    side = [bootstrap_mean([[float(s) for _, s in x[seed]] for seed in seeds]) for x in (a, b)]
    gap = bootstrap_mean(list(diffs.values()), successes=False)
    rows.append(f"| all ({len(seeds)} seeds) | {side[0]} | {side[1]} | {_signed(gap)} |")
    return rows, gap


def _signed(x: Interval) -> str:
    return f"{x.value:+.3f} [{x.low:+.3f}, {x.high:+.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", required=True)
    parser.add_argument(
        "--method-b",
        help="the method of the --b files, when it is another (a variant shipped as its own "
        "scenario, as complementary-distill is of complementary); default: --method",
    )
    parser.add_argument("--a", type=Path, nargs="+", required=True, help="the first setting")
    parser.add_argument("--b", type=Path, nargs="+", required=True, help="the second setting")
    parser.add_argument("--labels", nargs=2, default=["a", "b"], metavar=("A", "B"))
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args()
    a, b = outcomes_of(args.a, args.method), outcomes_of(args.b, args.method_b or args.method)
    rows, _ = table(a, b, tuple(args.labels))
    text = "\n".join(rows) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
