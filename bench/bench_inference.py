"""The inference actor's batches, old code against new: CPU time per batch and the scores.

Reads the ``ActionRequested`` events of a rollout log (``coevo run`` of the quickstart with
``run.method=rollout``), cuts them into batches of ``--batch`` in log order (as the inference
actor would get them from that many workers), and answers every batch with
``PolicyRunner.answer`` of this checkout and of ``--baseline`` (a checkout of the code before,
e.g. a ``git worktree`` of main), each in its own process, alternating, ``--rounds`` times.
Prints the median CPU seconds of each side and their ratio, and how the scores compare.
Each side loads the model and prompt settings from its own copy of ``--scenario`` (relative to
its tree; the one the run was made from), not from the run's ``scenario.toml``: that records
every setting of the code that wrote it, which older code may not know.

    .venv/bin/python bench/bench_inference.py RUN_DIR --baseline ../main-worktree --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# run in a fresh interpreter whose first import path is the checkout under test
CHILD = r"""
import json, random, sys, time
import torch
torch.set_num_threads(1)
from agents.events.policy import ActionRequested
from scenarios.loader import load_scenario
from scenarios.policy_models import policy_model_dir
from scenarios.policy_setup import load_runner_for
from stores.lmdb_log import LmdbEventLog
run, batch, out, source = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
scenario = load_scenario(source, [])
runner = load_runner_for(scenario, policy_model_dir(scenario, "bench"))
log = LmdbEventLog.open(run + "/log")
requests = [e.event for e in log.read() if isinstance(e.event, ActionRequested)]
log.close()
batches = [requests[i : i + batch] for i in range(0, len(requests), batch)]
runner.answer(batches[0])  # warm-up
cpu, wall = time.process_time(), time.perf_counter()
answers = [a for b in batches for a in runner.answer(b)]
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
json.dump({"cpu": cpu, "wall": wall, "batches": len(batches),
           "scores": [list(a.candidate_scores) for a in answers],
           "choices": [a.choice for a in answers],
           "prompts": [list(a.prompt_ids) for a in answers]}, open(out, "w"))
"""


def measure(tree: Path, run: Path, batch: int, scenario: Path) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys; sys.path.insert(0, {str(tree)!r})\n" + CHILD,
                str(run),
                str(batch),
                f.name,
                str(tree / scenario),
            ],
            check=True,
            cwd=tree,
        )
        return json.loads(Path(f.name).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a rollout run directory")
    parser.add_argument("--baseline", type=Path, required=True, help="the old checkout")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--scenario",
        type=Path,
        default=Path("scenarios/quickstart.toml"),
        help="the run's scenario, each tree's own copy when relative (default: %(default)s)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    old: list[dict] = []
    new: list[dict] = []
    for _ in range(args.rounds):
        old.append(measure(args.baseline.resolve(), args.run.resolve(), args.batch, args.scenario))
        new.append(measure(ROOT, args.run.resolve(), args.batch, args.scenario))
        print(f"round: old {old[-1]['cpu']:.2f} s, new {new[-1]['cpu']:.2f} s CPU", flush=True)
    a, b = old[-1], new[-1]
    flat_a = [s for row in a["scores"] for s in row]
    flat_b = [s for row in b["scores"] for s in row]
    same = sum(x == y for x, y in zip(flat_a, flat_b, strict=True))
    worst = max(abs(x - y) for x, y in zip(flat_a, flat_b, strict=True))
    cpu_old = statistics.median(r["cpu"] for r in old)
    cpu_new = statistics.median(r["cpu"] for r in new)
    print(f"batches of {args.batch}: {a['batches']}; requests {len(a['choices'])}")
    print(
        f"CPU s, median of {args.rounds}: old {cpu_old:.2f} [{min(r['cpu'] for r in old):.2f}-"
        f"{max(r['cpu'] for r in old):.2f}], new {cpu_new:.2f} [{min(r['cpu'] for r in new):.2f}-"
        f"{max(r['cpu'] for r in new):.2f}]; old/new {cpu_old / cpu_new:.2f}x"
    )
    print(f"prompt ids equal: {a['prompts'] == b['prompts']}")
    print(f"candidate scores: {same} of {len(flat_a)} bit for bit equal, max |diff| {worst:.3g}")
    print(
        f"choices equal: {sum(x == y for x, y in zip(a['choices'], b['choices'], strict=True))}"
        f" of {len(a['choices'])}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
