"""``coevo check`` on a large log: one pass of every invariant, and each one's own cost.

Writes a well-formed run of ``--events`` events (default 1,000,000) with
``agents.testing.streams.StreamBuilder``: a Complementary RL-like mix (episodes of several
turns, each turn an action request, its sample and a step; guided episodes retrieving an entry
at their first turn; every finished episode sent to the extractor, whose calls store, update
and merge entries; credits and extractor updates by the credit actor's own fold, an extractor
request per 64 credited calls, the default; a group's advantages every 2 episodes and a policy
update every 2 groups; a stop and resume now and then), so that every invariant holds and
each pass reads the whole log. Its payloads are small (the builder's), so decoding is cheaper
than on a real run's log of the same length; real logs are timed too (``--runs DIR ...``).

Then, in one process and ``--rounds`` times each (the median wall and CPU time are printed):
reading and decoding the log alone (the floor), ``check_stream`` with every invariant, and
each invariant alone.

Run: ``.venv/bin/python bench/bench_check.py [--events N] [--rounds R] [--out DIR]
[--runs RUN ...]``.
"""

from __future__ import annotations

import argparse
import platform
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agents.audit.inputs import AuditSettings
from agents.invariants import Credit
from agents.learning.credit_actor import CreditSettings
from agents.methods.builtin import Grpo
from agents.testing.streams import GRPO, StreamBuilder
from engine.eventlog import new_run_meta
from engine.invariants import CheckContext, CheckReport, Invariant, check_stream, registered
from scenarios.cli.check import gc_paused
from stores.lmdb_log import LmdbEventLog

CREDIT = CreditSettings()
"""The credit actor's defaults (an extractor request per 64 credited calls), as a run's."""

AUDIT = AuditSettings(CREDIT, Grpo(GRPO), GRPO.reward)

MIX = ("assign",) * 2 + ("start",) * 2 + ("turn",) * 14 + ("finish",) * 2 + ("merge",)


def build(path: Path, events: int, seed: int = 0) -> int:
    """Write a well-formed run of about ``events`` events into ``path/log``; returns its size."""
    meta = new_run_meta("bench", scenario_name="bench", seed=seed, coevo_version="bench")
    log = LmdbEventLog.create(path / "log", meta, durable=False)
    rng = random.Random(seed)
    builder = StreamBuilder(memory="extractor", credit=CREDIT)
    builder.begin()
    written = 0
    try:
        while written < events:
            for _ in range(2000):
                running = len(builder._running)
                op = "assign" if running < 4 else rng.choice(MIX)
                builder.play("stop" if rng.random() < 1e-5 else op, rng.randrange(8))
            batch = builder.take()
            log.append(batch)
            written += len(batch)
        builder.complete()
        log.append(builder.take())
        return log.next_seq
    finally:
        log.close()


def fresh(names: list[str]) -> list[Invariant]:
    return [
        Credit.with_settings(AUDIT) if n == "credit" else registered()[n].factory(CheckContext())
        for n in names
    ]


def timed(fn: Callable[[], object], rounds: int) -> tuple[float, float, object]:
    """Median wall and CPU seconds of ``fn`` over ``rounds`` calls (the machine is shared:
    CPU time is what the pass itself costs), and its last result."""
    wall, cpu, out = [], [], None
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu), out


def measure(path: Path, rounds: int) -> list[str]:
    log = LmdbEventLog.open(path / "log")
    n = log.next_seq
    rows: list[str] = []

    def row(label: str, wall: float, cpu: float, note: str = "") -> None:
        rows.append(f"| {label} | {wall:.2f} | {cpu:.2f} | {n / cpu:,.0f} | {note} |")

    def read() -> int:
        return sum(len(chunk) for chunk in log.read_chunks(0, n))

    wall, floor, _ = timed(read, rounds)
    row("read and decode the log (floor)", wall, floor)
    names = sorted(registered())
    wall, cpu, report = timed(lambda: check_stream(log.read_chunks(0, n), fresh(names)), rounds)
    assert isinstance(report, CheckReport)
    row(f"every invariant ({len(names)}), one pass", wall, cpu, f"violation: {report.violation}")

    def paused() -> object:
        with gc_paused():
            return check_stream(log.read_chunks(0, n), fresh(names))

    wall, cpu, report = timed(paused, rounds)
    assert isinstance(report, CheckReport) and report.ok
    row("the same, garbage collector paused (`coevo check`)", wall, cpu, "")
    for name in names:
        wall, cpu, report = timed(
            lambda nm=name: check_stream(log.read_chunks(0, n), fresh([nm])), rounds
        )
        row(f"`{name}` alone", wall, cpu, f"{cpu - floor:+.2f} s CPU over the floor")
    log.close()
    return rows


def real_runs(runs: list[str], rounds: int) -> list[str]:
    """``coevo check`` on real runs, in process (the CLI's own path, its output discarded)."""
    import contextlib
    import io

    from scenarios.cli import main

    rows = []
    for run in runs:
        log = LmdbEventLog.open(Path(run) / "log")
        n = log.next_seq
        log.close()
        with contextlib.redirect_stdout(io.StringIO()) as out:
            wall, cpu, code = timed(lambda r=run: main(["check", r]), rounds)
        printed: str = out.getvalue()
        first = printed.splitlines()[0].split(": ", 1)[1]
        rows.append(
            f"| {Path(run).name} | {wall:.2f} | {cpu:.2f} | {n / cpu:,.0f} | {code} | {first} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="keep the synthetic run here (reused if it exists)")
    parser.add_argument("--runs", nargs="*", default=[], help="real runs to time coevo check on")
    args = parser.parse_args()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-check-"))
    try:
        if not (root / "log").exists():
            root.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            size = build(root, args.events)
            print(f"wrote {size:,} events in {time.perf_counter() - start:.1f} s")
        print(f"# {platform.python_version()}, {platform.machine()}, {args.rounds} rounds (median)")
        print("| pass | wall s | CPU s | events/CPU s | |\n|---|---:|---:|---:|---|")
        print("\n".join(measure(root, args.rounds)))
        if args.runs:
            head = "real run (`coevo check`, in process) | wall s | CPU s | events/CPU s | exit"
            print(f"\n| {head} | |")
            print("|---|---:|---:|---:|---:|---|")
            print("\n".join(real_runs(args.runs, args.rounds)))
    finally:
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
