"""One method under two settings, paired task by task, from the JSON files `bench/headline.py`
writes (every seed's held-out outcomes of the last round, without memory; with ``--bank``,
Complementary RL's same round played again with its bank).

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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.report.intervals import Interval, bootstrap_mean, paired_mean

Outcomes = dict[str, list[tuple[str, bool]]]
"""Per seed, the last round's ``(family, success)`` of each held-out episode, in order."""

OWN_SEEDS = "2026-12-06 18:55"
"""When evaluation began to draw seeds of its own (``eval.own_seeds``, commit 4339f1a): runs
made before may have played other held-out tasks under two settings of one scenario."""


def outcomes_of(paths: list[Path], method: str, played: str = "plain") -> Outcomes:
    """Every seed's held-out outcomes of ``method`` in the files ``paths``: ``played`` "plain"
    (without memory) or "bank" (with its bank).

    Raises:
        SystemExit: a file without the method, or two files with one seed.
    """
    found: Outcomes = {}
    source: dict[str, Path] = {}  # seed -> the file it was found in
    if twice := sorted({str(p) for p in paths if list(paths).count(p) > 1}):
        raise SystemExit(f"{twice[0]}: given more than once (each file once)")
    for path in paths:
        try:
            doc = json.loads(path.read_text())
            runs = doc.get("outcomes", {}).get(method)
        except OSError as exc:  # a missing file is not "not a headline JSON file"
            raise SystemExit(f"{path}: cannot read it ({exc.strerror})") from None
        except (ValueError, AttributeError) as exc:
            raise SystemExit(f"{path}: not a headline JSON file ({exc})") from None
        if not runs:
            raise SystemExit(f"{path}: no outcomes of method {method!r}")
        _note_before_own_seeds(path, doc)
        for run in runs:
            try:
                seed = str(run["seed"])
                plain = [(str(family), _outcome(success)) for family, success in run[played]]
            except (KeyError, TypeError, ValueError) as exc:
                raise SystemExit(
                    f"{path}: not a headline JSON file (a run of {method} whose seed or held-out "
                    f"outcomes are not as headline.py writes them: {type(exc).__name__}: {exc})"
                ) from None
            if not plain:
                said = "held-out episode" if played == "plain" else "round with its bank"
                raise SystemExit(f"{path}: seed {seed} of {method} has no {said}")
            if seed in found:
                where = "twice in it" if source[seed] == path else f"in {source[seed]} too"
                raise SystemExit(f"{path}: seed {seed} of {method} is {where}")
            found[seed] = plain
            source[seed] = path
    return found


def _outcome(success: object) -> bool:
    """An episode's outcome as headline.py writes it, true or false ("false", a string, read
    as a success).

    Raises:
        TypeError: anything else.
    """
    if not isinstance(success, bool):
        raise TypeError(f"outcome {success!r} is not true or false")
    return success


def _note_before_own_seeds(path: Path, doc: dict[str, Any]) -> None:
    """Say on stderr when the runs of the file ``path`` (read: ``doc``) were made before
    :data:`OWN_SEEDS` (its provenance's ``runs_created``): their pairs may not be the same
    tasks."""
    try:
        created = str(doc["provenance"]["runs_created"])
    except (KeyError, TypeError):
        return
    if created[: len(OWN_SEEDS)] < OWN_SEEDS:
        print(
            f"paired_runs: note: {path}: its runs were made from {created[: len(OWN_SEEDS)]}, "
            f"before evaluation drew seeds of its own ({OWN_SEEDS}, eval.own_seeds): runs of "
            "two settings may have played other tasks of the same families",
            file=sys.stderr,
        )


def paired(a: Outcomes, b: Outcomes) -> dict[str, list[float]]:
    """Per seed both sides hold, the differences ``b - a`` of each task's success.

    Raises:
        SystemExit: no seed in common, or a seed whose tasks differ between the sides.
    """
    seeds = sorted(a.keys() & b.keys(), key=lambda s: (len(s), s))
    if not seeds:
        raise SystemExit(f"no seed in common (a: {sorted(a)}, b: {sorted(b)})")
    for side, x in (("a", a), ("b", b)):
        if alone := sorted(x.keys() - set(seeds), key=lambda s: (len(s), s)):
            print(f"paired_runs: note: seeds only {side} holds, left out: {alone}", file=sys.stderr)
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
    gap = paired_mean(list(diffs.values()))
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
    parser.add_argument(
        "--bank",
        action="store_true",
        help="pair the last round played with the method's bank (Complementary RL's)",
    )
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args()
    labels = tuple(label.strip().replace("|", "\\|") for label in args.labels)
    if not all(labels) or labels[0] == labels[1]:
        raise SystemExit(f"--labels {args.labels}: two labels, not empty, and not the same")
    if args.out is not None and not args.out.parent.is_dir():
        raise SystemExit(f"--out {args.out}: no directory {args.out.parent}")
    played = "bank" if args.bank else "plain"
    a = outcomes_of(args.a, args.method, played)
    b = outcomes_of(args.b, args.method_b or args.method, played)
    rows, _ = table(a, b, (labels[0], labels[1]))
    text = "\n".join(rows) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        try:
            args.out.write_text(text)
        except OSError as exc:
            raise SystemExit(f"--out {args.out}: cannot write: {exc.strerror or exc}") from None


if __name__ == "__main__":
    main()
