"""The credit actor's fold (``CreditBook.decide``) over a run's worth of guided episodes, old vs
new, interleaved in one process: before 6f1c400 an extractor request recomputed every call's
mean from every credit so far (cost: credits x requests); since, a request reads only its
batch's calls. The old book is the committed file at ``--baseline`` (default 6f1c400~1), loaded
from git as a module of its own.

    .venv/bin/python bench/bench_credit_book.py [--credits 5000 10000 20000] [--batch 1 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.events.episodes import EpisodeFinished  # noqa: E402
from agents.events.memory import TipsRetrieved  # noqa: E402
from agents.learning import credit_actor  # noqa: E402
from engine.events import Event  # noqa: E402


def old_module(commit: str) -> Any:
    """``agents/learning/credit_actor.py`` as of ``commit``, imported under another name."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:agents/learning/credit_actor.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "credit_actor_old.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("credit_actor_old", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["credit_actor_old"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def stream(credits: int, calls: int = 500) -> list[Event]:
    """``credits`` guided training episodes, each shown an entry of one of ``calls`` calls."""
    out: list[Event] = []
    for i in range(credits):
        episode = f"e{i}"
        call = f"x{i * 7919 % calls}"
        out.append(
            TipsRetrieved(
                episode=episode,
                worker="w",
                turn=0,
                slot="train/heat",
                tip_ids=(i % calls,),
                similarities=(1.0,),
                ranks=(0,),
                tips=("t",),
                similar=1,
                slot_size=calls,
                calls=(call,),
            )
        )
        out.append(
            EpisodeFinished(
                episode=episode,
                worker="w",
                family="heat",
                variant=0,
                split="train",
                steps=1,
                score=float(i % 2),
                success=i % 2 == 1,
                total_reward=float(i % 2),
                purpose="train",
            )
        )
    return out


def fold(module: Any, events: list[Event], batch: int) -> tuple[float, list[Event]]:
    settings = module.CreditSettings(batch=batch)
    book = module.CreditBook()
    start = time.process_time()
    out = [made for ev in events for made in book.decide(ev, settings)]
    return time.process_time() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--credits", type=int, nargs="+", default=[5000, 10000, 20000])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default="6f1c400~1")
    args = parser.parse_args()
    old = old_module(args.baseline)
    print("| credits | batch | requests | old CPU s | new CPU s | old/new |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in args.credits:
        events = stream(n)
        for batch in args.batch:
            times: dict[str, list[float]] = {"old": [], "new": []}
            outs: dict[str, list[Event]] = {}
            for _ in range(args.rounds):  # interleaved
                for name, module in (("old", old), ("new", credit_actor)):
                    seconds, outs[name] = fold(module, events, batch)
                    times[name].append(seconds)
            assert outs["old"] == outs["new"], "the two books decided differently"
            requests = sum(1 for e in outs["new"] if type(e).__name__.startswith("Extractor"))
            a, b = statistics.median(times["old"]), statistics.median(times["new"])
            print(f"| {n:,} | {batch} | {requests:,} | {a:.2f} | {b:.2f} | {a / b:.1f}x |")


if __name__ == "__main__":
    main()
