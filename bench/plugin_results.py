"""docs/RESULTS.md's line for the plug-in method of docs/METHODS.md (the ExpeL-style insight
list), measured like the headline: the plug-in is taken from the page as it stands into
``--runs/plugin``, run by import path on the headline's GRPO scenario for each seed, and its final
round is set beside GRPO's headline runs (the same folds and intervals as ``bench/headline.py``).

    .venv/bin/python bench/plugin_results.py --seeds 0 1 2 --parallel 2

A finished run under ``--runs/insights-seed<N>`` is read, not rerun; GRPO's runs must be there
already (``make headline``). The table goes to ``--out/plugin.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # doc_blocks

from doc_blocks import doc_block
from headline import BASELINE, Final, final_of, summarize, table
from headline_logs import Modes, modes_of, modes_table
from method_results import read_run, run_all, unfinished

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "METHODS.md"
NAME = "insights"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--grpo-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--hard", nargs="+", default=["circuit"])
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "headline")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args()
    plugin = args.runs / "plugin"
    plugin.mkdir(parents=True, exist_ok=True)
    try:
        (plugin / "insights.py").write_text(doc_block(DOC, "# insights.py"))
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(plugin), os.environ.get("PYTHONPATH", "")) if p
    )
    sets = ['run.method="insights:Insights"', f'name="{NAME}"']
    jobs = []
    for seed in args.seeds:
        out = args.runs / f"{NAME}-seed{seed}"
        if read_run(out) is None:
            if out.exists():
                raise SystemExit(unfinished(out))
            jobs.append((ROOT / "scenarios" / "grpo.toml", out, seed, sets))
    run_all(jobs, args.parallel)
    finals: dict[str, list[Final]] = {}
    modes: dict[str, list[Modes]] = {}
    for name, seeds in ((BASELINE, args.grpo_seeds), (NAME, args.seeds)):
        for seed in seeds:
            got = read_run(args.runs / f"{name}-seed{seed}")
            if got is None:
                raise SystemExit(f"{args.runs / f'{name}-seed{seed}'}: no finished run")
            finals.setdefault(name, []).append(final_of(got[0]))
            modes.setdefault(name, []).append(modes_of(got[0]))
    hard = tuple(args.hard)
    lines = [*table(summarize(finals, hard), hard), "", *modes_table(modes)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plugin.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
