"""What the tracker costs the runtime's event loop: :meth:`Tracker.observe` over the batches of
a large log (default: ``bench/bench_audit.py``'s synthetic 1M-event Complementary RL log, built
or reused with ``--out``), with a TensorBoard sink writing in its own thread; and what
``coevo export`` costs on the same log.

Run: ``.venv/bin/python bench/bench_tracking.py [--out DIR] [--events N]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_audit import on_synthetic_log

from agents.tracking.observer import Tracker
from agents.tracking.sinks import open_sink
from scenarios.cli import main as coevo
from stores.lmdb_log import LmdbEventLog


def measure(root: Path, scratch: Path) -> list[str]:
    log = LmdbEventLog.open(root / "log")
    try:
        batches = [list(part) for part in log.read_chunks(0, log.next_seq)]
    finally:
        log.close()
    events = sum(len(b) for b in batches)
    tracker = Tracker([open_sink("tensorboard", scratch / "live", "bench", {})], block=16)
    start = time.perf_counter()
    for batch in batches:
        tracker.observe(batch)
    observed = time.perf_counter() - start
    tracker.close()
    start = time.perf_counter()
    assert coevo(["export", str(root), "--tensorboard", str(scratch / "export")]) == 0
    exported = time.perf_counter() - start
    return [
        f"observe: {events} events in {len(batches)} batches, {observed:.2f} s on the event loop "
        f"({observed / events * 1e9:.0f} ns/event), {len(tracker.written)} points",
        f"coevo export --tensorboard (reading the log included): {exported:.1f} s",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--out", help="keep the synthetic run here (reused if it exists)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-tracking-tb-"))
    try:
        on_synthetic_log(
            "bench-tracking-", args.events, args.out, lambda root: measure(root, scratch)
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
