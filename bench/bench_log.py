"""Engine throughput next to the raw LMDB floor, measured in the same process.

Four numbers, each the median of several rounds over the same events (realistic ``StepTaken``
events: an observation line and a list of admissible actions); every round measures every row
once, so that floors and engine see the same moment of a noisy machine:

- raw append: LMDB puts of pre-encoded, pre-sealed bytes, ``batch`` per durable transaction
  (by default the engine's own ``batch_max``, so that floor and engine commit as many events
  per fsync; ``--batch 1000`` gives the older, easier floor);
- engine append: the same events emitted by a source actor through the runtime with its default
  :class:`RuntimeConfig` (envelope, seq, projection fold + checksums + snapshots, encode, CRC,
  durable group commits of up to ``batch_max`` events) into an LmdbEventLog;
- raw scan + decode: an LMDB cursor over every record, msgspec-decoding every envelope;
- engine replay: ``coevo replay --verify``'s work (CRC check, decode, fold, checksum compare).

Appends are timed by the wall clock (they wait for fsyncs and use a writing thread); scans by
this process's CPU time (both sides are one thread of pure CPU once the pages are cached), which
other jobs on a shared machine disturb much less.

With ``--run DIR`` (repeatable), the last two also on each real run's log, in the same rounds:
its records as the run wrote them (real runs commit small batches, 1.5-14 events a record),
scanned and decoded raw, and verified as ``coevo replay --verify`` does (the run's projections
and fact checks).

With ``--baseline TREE`` (a checkout of the code before, e.g. a ``git worktree``), old and new
code are measured alternately, each round of each side in a fresh process that imports the engine
from its tree (``PYTHONPATH``; this script and its floors are the same for both): per row the
medians of both sides, each side's median share of the floor measured in its own process, and the
median of the rounds' new/old ratios. Appends also report the process's CPU time per event (all
threads: the event loop and the writing thread).

Run: ``.venv/bin/python bench/bench_log.py [--events N] [--repeats R] [--batch B] [--run DIR]
[--baseline TREE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Union

import lmdb
import msgspec
import trio
from rich.console import Console

from agents.acting.projections import EpisodeTable
from agents.events.episodes import StepTaken
from engine.actor import Actor, ActorSpec, Context
from engine.eventlog import (
    EncodedBatch,
    EventLog,
    MemoryEventLog,
    RunMeta,
    Snapshot,
    check_batch,
    new_run_meta,
)
from engine.events import Codec, Envelope, Event, event_types
from engine.lifecycle import RunStarted
from engine.projection import ActorStats
from engine.replay import verify_log
from engine.runtime import Runtime, RuntimeConfig
from scenarios.cli.logsetup import configure_logging
from stores.lmdb_log import LmdbEventLog

ADMISSIBLE = tuple(f"open {x}" for x in ("box", "crate", "chest", "sack", "drawer", "cabinet"))


def make_events(n: int) -> list[Event]:
    return [
        StepTaken(
            episode=f"ep{i // 15:06d}",
            turn=i % 15,
            action=ADMISSIBLE[i % 6],
            observation=f"you open the {ADMISSIBLE[i % 6][5:]}. inside you see a tin wire.",
            admissible=ADMISSIBLE,
            reward=0.0,
            done=False,
            score=0.0,
        )
        for i in range(n)
    ]


def meta() -> RunMeta:
    return new_run_meta("bench", scenario_name="bench", seed=0, coevo_version="bench")


def raw_append(
    path: Path, records: list[tuple[bytes, bytes]], per_txn: int, events: int
) -> tuple[float, float]:
    """Raw durable LMDB puts of pre-encoded values, ``per_txn`` records per transaction.

    Returns:
        Events per second (``events`` in all), and the process's CPU microseconds per event.
    """
    env = lmdb.open(str(path), map_size=4 << 30, max_dbs=3, sync=True, metasync=True)
    db = env.open_db(b"events")
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(records), per_txn):
        with env.begin(write=True) as txn:
            txn.cursor(db).putmulti(records[i : i + per_txn], append=True)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    env.close()
    return events / elapsed, 1e6 * cpu / events


class Source(Actor):
    def __init__(self, events: list[Event]) -> None:
        self.events = events

    async def run(self, ctx: Context) -> None:
        for ev in self.events:
            await ctx.emit(ev)


class NullLog(MemoryEventLog):
    """Keeps nothing: the runtime's own CPU cost, without any storage."""

    def __init__(self) -> None:
        super().__init__()
        self._count = 0

    @property
    def next_seq(self) -> int:
        return self._count

    def encode(self, envelopes: Sequence[Envelope[Event]]) -> EncodedBatch:
        check_batch(envelopes[0].seq, envelopes)
        return EncodedBatch(envelopes[0].seq, len(envelopes), [])

    def append_encoded(self, batch: EncodedBatch, *, snapshots: Sequence[Snapshot] = ()) -> None:
        assert batch.first == self._count
        self._count += batch.count


def engine_append(
    path: Path, events: list[Event], projections: bool, durable: bool = True, check: bool = True
) -> tuple[float, float]:
    """The runtime with its default :class:`RuntimeConfig` (group commits of up to
    ``batch_max`` events, checksums and snapshots at the default cadence). ``check=False``
    leaves out what ``emit`` checks of each event (that it decodes back): not something the
    engine offers, only to show what the check costs.

    Returns:
        Events per second (wall clock), and the process's CPU microseconds per event (the
        event loop and the writing thread together).
    """
    if path.name == "null":
        log: EventLog = NullLog()
    else:
        log = LmdbEventLog.create(path, meta(), durable=durable, map_size=1 << 30)
    started = RunStarted(run_id="bench", scenario="b", scenario_hash="", seed=0, coevo_version="")
    folds = [ActorStats(), EpisodeTable()] if projections else []
    spec = ActorSpec(name="source", factory=lambda: Source(events), driver=True)
    runtime = Runtime(log, started, [spec], folds, seed=0, config=RuntimeConfig())
    if not check:
        runtime.check_event = lambda ev: 0
    t0, c0 = time.perf_counter(), time.process_time()
    outcome = trio.run(runtime.run)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    log.close()
    return outcome.events / elapsed, 1e6 * cpu / outcome.events


def raw_scan_decode(path: Path, batched: bool) -> float:
    """A raw cursor scan decoding every stored value: one envelope, or (``batched``) an engine
    record, an array of parts that are arrays of envelopes (no CRC check, no fold)."""
    union = Union[tuple(event_types().values())]  # noqa: UP007 - dynamic union
    one = msgspec.msgpack.Decoder(Envelope[union])  # type: ignore[valid-type]
    many = msgspec.msgpack.Decoder(list[Envelope[union]])  # type: ignore[valid-type]
    parts = msgspec.msgpack.Decoder(list[msgspec.Raw])
    env = lmdb.open(str(path), readonly=True, max_dbs=3, lock=False)
    db = env.open_db(b"events", create=False)
    t0 = time.process_time()
    n = 0
    with env.begin(buffers=True) as txn:
        for _, value in txn.cursor(db):
            if batched:
                for part in parts.decode(value[8:]):
                    n += len(many.decode(part))
            else:
                one.decode(value)
                n += 1
    elapsed = time.process_time() - t0
    env.close()
    return n / elapsed


def engine_replay(path: Path, real: bool = False, facts: bool = True) -> float:
    """``verify_log`` of the log at ``path``: with the two projections of the synthetic log, or
    (``real``) with what ``coevo replay --verify`` checks a run with (without its fact checks
    if not ``facts``: the folds and checksums alone)."""
    from scenarios.assemble import fact_checks, projections

    log = LmdbEventLog.open(path, writable=False)
    t0 = time.process_time()
    if real:
        result = verify_log(log, projections(), fact_checks() if facts else ())
    else:
        result = verify_log(log, [ActorStats(), EpisodeTable()])
    elapsed = time.process_time() - t0
    log.close()
    assert result.ok, result.error
    return result.events / elapsed


def engine_read(path: Path) -> float:
    """The log's own reading of every event (CRC, decode), without fold or checks: what
    ``engine_replay`` adds to it is the verification itself."""
    log = LmdbEventLog.open(path, writable=False)
    t0 = time.process_time()
    n = sum(len(chunk) for chunk in log.read_chunks(0, log.next_seq))
    elapsed = time.process_time() - t0
    log.close()
    return n / elapsed


def records_of(path: Path) -> tuple[int, int]:
    """``(records, events)`` of the log at ``path``."""
    env = lmdb.open(str(path), readonly=True, max_dbs=3, lock=False)
    db = env.open_db(b"events", create=False)
    with env.begin() as txn:
        records = txn.stat(db)["entries"]
    env.close()
    log = LmdbEventLog.open(path, writable=False)
    events = log.next_seq
    log.close()
    return records, events


Row = tuple[str, str, Callable[[], "float | tuple[float, float]"]]
"""A measurement: its name, its kind (rows of one kind share the first row as their floor)
and what measures it (events/s, or events/s and CPU microseconds per event)."""
Rates = dict[str, list[list[float]]]
"""Per row, per round: ``[events/s]`` or ``[events/s, CPU us per event]``."""


def measure(args: argparse.Namespace) -> tuple[Rates, dict[str, str]]:
    """Every row once per round, ``args.repeats`` rounds, in this process."""
    n, batch = args.events, args.batch
    events = make_events(n)
    codec = Codec()
    envs = [
        Envelope(seq=i, run="bench", t=0, actor="source", event=ev) for i, ev in enumerate(events)
    ]
    per_event = [(i.to_bytes(8, "big"), codec.encode(env)) for i, env in enumerate(envs)]
    per_batch = []
    for i in range(0, n, batch):
        key, payload = i.to_bytes(8, "big"), codec.encode_batch(envs[i : i + batch])
        head = min(batch, n - i).to_bytes(4, "big")
        crc = zlib.crc32(payload, zlib.crc32(head, zlib.crc32(key))).to_bytes(4, "big")
        per_batch.append((key, crc + head + payload))
    base = Path(tempfile.mkdtemp(prefix="coevo-bench-", dir=os.environ.get("BENCH_DIR")))
    counter = iter(range(10**6))

    def fresh() -> Path:
        path = base / f"r{next(counter)}"
        path.mkdir()
        return path

    try:
        raw_events, replay_log = fresh(), fresh()
        raw_append(raw_events, per_event, batch, n)
        engine_append(replay_log, events, True)
        rows: list[Row] = [
            (f"raw append: one record per event, {batch} per txn", "append",
             lambda: raw_append(fresh(), per_event, batch, n)),
            (f"raw append: one record per {batch} events, 1 per txn", "append",
             lambda: raw_append(fresh(), per_batch, 1, n)),
            ("engine append, no projections", "append",
             lambda: engine_append(fresh(), events, False)),
            ("engine append, 2 projections + checksums + snapshots", "append",
             lambda: engine_append(fresh(), events, True)),
            ("(engine append, no projections, durable = false)", "append",
             lambda: engine_append(fresh(), events, False, False)),
            ("(engine runtime into a log that stores nothing: CPU ceiling)", "append",
             lambda: engine_append(base / "null", events, False)),
            ("(the same, 2 projections + checksums + snapshots)", "append",
             lambda: engine_append(base / "null", events, True)),
            ("(the same, without emit's check that each event decodes back)", "append",
             lambda: engine_append(base / "null", events, True, check=False)),
            ("raw scan + decode: one record per event", "scan",
             lambda: raw_scan_decode(raw_events, False)),
            ("raw scan + decode: the engine's records", "scan",
             lambda: raw_scan_decode(replay_log, True)),
            ("engine replay --verify (CRC, decode, fold 2 projections, check)", "scan",
             lambda: engine_replay(replay_log)),
        ]  # fmt: skip
        for run in args.run:
            records, count = records_of(run / "log")
            label = f"{run.name} ({count:,} events, {count / records:.1f} per record)"
            rows += [
                (f"raw scan + decode: {label}", f"scan {run}",
                 partial(raw_scan_decode, run / "log", True)),
                (f"(engine read: CRC + decode, no fold or checks): {run.name}", f"scan {run}",
                 partial(engine_read, run / "log")),
                (f"(engine replay, folds + checksums, no fact checks): {run.name}", f"scan {run}",
                 partial(engine_replay, run / "log", True, False)),
                (f"engine replay --verify: {label}", f"scan {run}",
                 partial(engine_replay, run / "log", True)),
            ]  # fmt: skip
        rates: Rates = {name: [] for name, _, _ in rows}
        for _ in range(args.repeats):  # every row once per round: floors and engine side by side
            for name, _, run_row in rows:
                got = run_row()
                rates[name].append(list(got) if isinstance(got, tuple) else [got])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return rates, {name: kind for name, kind, _ in rows}


def shares(rates: Rates, kinds: dict[str, str]) -> dict[str, list[float]]:
    """Per row, per round: events/s as a share of its kind's floor in the same round."""
    floors = {kind: next(n for n, k in kinds.items() if k == kind) for kind in kinds.values()}
    return {
        name: [r[0] / f[0] for r, f in zip(rows, rates[floors[kinds[name]]], strict=True)]
        for name, rows in rates.items()
    }


def child(tree: Path, args: argparse.Namespace) -> tuple[Rates, dict[str, str]]:
    """One round of every row in a fresh process importing the engine from ``tree``."""
    cmd = [sys.executable, __file__, "--json", "--repeats", "1", "--events", str(args.events)]
    cmd += ["--batch", str(args.batch)]
    for run in args.run:
        cmd += ["--run", str(run)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(cmd, check=True, env=env, cwd=tree, capture_output=True, text=True)
    got = json.loads(out.stdout)
    return got["rates"], got["kinds"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=RuntimeConfig().batch_max)
    parser.add_argument("--run", type=Path, action="append", default=[], help="a real run dir")
    parser.add_argument("--baseline", type=Path, help="the old checkout: old vs new, interleaved")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.run = [run.resolve() for run in args.run]
    configure_logging(Console(stderr=True), "warning")
    if args.json:
        rates, kinds = measure(args)
        print(json.dumps({"rates": rates, "kinds": kinds}))
        return
    if args.baseline is None:
        rates, kinds = measure(args)
        report(rates, kinds, args)
        return
    sides: dict[str, Rates] = {"old": {}, "new": {}}
    trees = {"old": args.baseline.resolve(), "new": Path(__file__).resolve().parents[1]}
    kinds: dict[str, str] = {}
    load = os.getloadavg()[0]
    for k in range(args.repeats):
        for side in ("old", "new"):
            got, kinds = child(trees[side], args)
            for name, rounds in got.items():
                sides[side].setdefault(name, []).extend(rounds)
        print(f"round {k + 1} done, load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    report_ab(sides, kinds, args, (load, os.getloadavg()[0]))


def header(args: argparse.Namespace) -> str:
    cfg = RuntimeConfig()
    return (f"machine: {platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, lmdb {lmdb.__version__}, "
            f"msgspec {msgspec.__version__}; {args.events} StepTaken events; raw: {args.batch} "
            f"per txn; engine: RuntimeConfig defaults (batch_max {cfg.batch_max}, write_buffer "
            f"{cfg.write_buffer}, checksum_every {cfg.checksum_every}, snapshot_every "
            f"{cfg.snapshot_every}); median of {args.repeats}")  # fmt: skip


def report(rates: Rates, kinds: dict[str, str], args: argparse.Namespace) -> None:
    print(header(args))
    share = shares(rates, kinds)
    print("| measurement | events/s | vs the floor above it | CPU us/event |")
    print("|---|---:|---:|---:|")
    for name, rounds in rates.items():
        rate = statistics.median(r[0] for r in rounds)
        cpu = f"{statistics.median(r[1] for r in rounds):.2f}" if len(rounds[0]) > 1 else ""
        print(f"| {name} | {rate:,.0f} | {statistics.median(share[name]):.0%} | {cpu} |")


def report_ab(
    sides: dict[str, Rates],
    kinds: dict[str, str],
    args: argparse.Namespace,
    load: tuple[float, float],
) -> None:
    print(header(args) + f"; old ({args.baseline}) and new alternating, one process each")
    print(f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end")
    old, new = sides["old"], sides["new"]
    old_share, new_share = shares(old, kinds), shares(new, kinds)
    print("| measurement | old events/s | new events/s | old % | new % | new/old | "
          "CPU us/event old → new |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in new:
        o, n = old[name], new[name]
        ratio = statistics.median(b[0] / a[0] for a, b in zip(o, n, strict=True))
        cpu = ""
        if len(n[0]) > 1:
            cpu_old, cpu_new = (statistics.median(r[1] for r in side) for side in (o, n))
            cpu = f"{cpu_old:.2f} → {cpu_new:.2f}"
        print(f"| {name} | {statistics.median(r[0] for r in o):,.0f} | "
              f"{statistics.median(r[0] for r in n):,.0f} | "
              f"{statistics.median(old_share[name]):.0%} | "
              f"{statistics.median(new_share[name]):.0%} | {ratio:.2f}x | {cpu} |")  # fmt: skip


if __name__ == "__main__":
    main()
