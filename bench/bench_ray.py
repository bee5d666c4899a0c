"""Env workers on Ray against the same workers in the driver (``[runtime] backend``): steps per
second on a latency-bound world, the cost of an event crossing from a remote actor, and the
driver's ceiling in events per second.

Run: ``.venv/bin/python bench/bench_ray.py`` (needs ``pip install -e '.[ray]'``; a few minutes
on 2 cores). Results: docs/BENCHMARKS.md ("Env workers on Ray").

Three parts, every run in this process on the in-memory log (the writer, numbering, folding and
delivery as in a real run; no fsync), with scripted explorers:

- scaling: ``scenarios.worlds.paced:PacedLab`` (minilab whose every reset and step sleeps
  ``--delay-ms``, in a worker thread) with 1, 2, 4, ... workers, each playing
  ``--episodes-per-worker`` episodes, locally and on Ray. Steps per second are counted in the
  window in which every worker is busy: from the moment the last worker began its first episode
  to the moment the first worker finished its last one (the start of Ray's worker processes and
  the tail of the run are left out). The ideal is ``workers / (delay + think time)``.
- crossing: minilab at full speed (microseconds a step, stepped on the event loop) with one
  worker, locally and on Ray: the extra time per event of the remote run is what it costs to emit
  an event from a remote actor (its share of a poll, its bytes, its decode and ``emit`` in the
  driver).
- ceiling: minilab at full speed with ``--ceiling-workers`` workers, locally and on Ray: the
  events per second the driver takes in when nothing waits on the world.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.events.episodes import EpisodeFinished, EpisodeStarted, StepTaken  # noqa: E402
from engine.eventlog import MemoryEventLog  # noqa: E402
from engine.events import Envelope, Event  # noqa: E402
from engine.lifecycle import RunStarted  # noqa: E402
from engine.runtime import Runtime  # noqa: E402
from scenarios.assemble import assemble  # noqa: E402
from scenarios.loader import load_scenario  # noqa: E402

SCENARIO = """
name = "bench-ray"
seed = 3

[world]
name = "{world}"
options = {options}

[agent]
kind = "{agent}"

[run]
episodes = {episodes}
workers = {workers}

[runtime]
backend = "{backend}"

[runtime.ray.env_workers]
num_cpus = 0.05
per_process = {per_process}

[logging]
progress = false
"""


@dataclass
class Row:
    part: str
    backend: str
    workers: int
    events: int
    steps: int
    seconds: float
    window_steps: int
    window_events: int
    window_seconds: float
    cpu_seconds: float
    worker_rss_mb: float = 0.0
    per_process: int = 1
    processes: int = 0
    start_seconds: float = 0.0

    @property
    def steps_per_s(self) -> float:
        return self.window_steps / self.window_seconds if self.window_seconds > 0 else 0.0

    @property
    def events_per_s(self) -> float:
        return self.window_events / self.window_seconds if self.window_seconds > 0 else 0.0

    @property
    def driver_cpu_us_per_event(self) -> float:
        """The driver process's CPU time (every thread) per event of the run."""
        return self.cpu_seconds / self.events * 1e6

    @property
    def us_per_event(self) -> float:
        return self.window_seconds / self.window_events * 1e6


def run_once(
    part: str,
    backend: str,
    workers: int,
    world: str,
    options: str,
    episodes: int,
    agent: str = "explorer",
    per_process: int = 1,
) -> Row:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.toml"
        text = SCENARIO.format(
            world=world,
            options=options,
            episodes=episodes,
            workers=workers,
            backend=backend,
            agent=agent,
            per_process=per_process,
        )
        path.write_text(text, encoding="utf-8")
        scenario = load_scenario(path)
        assembly = assemble(scenario, str(path))
    log = MemoryEventLog()
    started = RunStarted(
        run_id="bench", scenario="bench", scenario_hash="", seed=3, coevo_version=""
    )
    records = [r for spec in assembly.specs if (r := getattr(spec.factory, "inflight", None))]
    rss: dict[int, float] = {}  # remote process -> its resident memory

    def sample(batch: list[Envelope[Event]]) -> None:
        """The remote processes' resident memory, once, when every worker has one."""
        if records and not rss and all(r.pid for r in records):
            rss.update({r.pid: resident_mb(r.pid) for r in records})

    runtime = Runtime(
        log,
        started,
        assembly.specs,
        assembly.projections,
        seed=3,
        config=assembly.config,
        observers=[sample],
    )
    t0, cpu0 = time.perf_counter(), time.process_time()
    outcome = trio.run(runtime.run)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert outcome.reason == "completed", outcome
    envs = list(log.read(0, None))
    steps, events, window = window_of(envs)
    return Row(
        part,
        backend,
        workers,
        len(envs),
        sum(isinstance(e.event, StepTaken) for e in envs),
        seconds,
        steps,
        events,
        window,
        cpu,
        sum(rss.values()) / workers if rss else 0.0,
        per_process,
        len(rss),
        under_way(envs),
    )


def resident_mb(pid: int) -> float:
    """A process's resident memory (Linux), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def under_way(envs: list[Envelope[Event]]) -> float:
    """Seconds from the run's first event to the last worker's first ``episode_started``: the
    start of every worker (on Ray, its process placed and the worker built there)."""
    first: dict[str, int] = {}
    for env in envs:
        if isinstance(env.event, EpisodeStarted):
            first.setdefault(env.event.worker, env.t)
    return (max(first.values()) - envs[0].t) / 1e9


def window_of(envs: list[Envelope[Event]]) -> tuple[int, int, float]:
    """Steps and events logged while every worker was busy, and that window's seconds (by the
    events' times)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for env in envs:
        ev = env.event
        if isinstance(ev, EpisodeStarted):
            first.setdefault(ev.worker, env.t)
        elif isinstance(ev, EpisodeFinished):
            last[ev.worker] = env.t
    start, end = max(first.values()), min(last.values())
    inside = [e for e in envs if start <= e.t <= end]
    steps = sum(isinstance(e.event, StepTaken) for e in inside)
    return steps, len(inside), max(end - start, 0) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument(
        "--world",
        default="scenarios.worlds.paced:PacedLab",
        help="the scaling part's world (default: minilab paced at --delay-ms a step)",
    )
    parser.add_argument("--world-options", help="its options, a TOML inline table")
    parser.add_argument("--agent", default="explorer", help="the scaling part's agent kind")
    parser.add_argument("--episodes-per-worker", type=int, default=8)
    parser.add_argument("--crossing-episodes", type=int, default=400)
    parser.add_argument("--ceiling-workers", type=int, default=8)
    parser.add_argument("--ceiling-episodes", type=int, default=1600)
    parser.add_argument(
        "--parts", nargs="+", default=["scaling", "crossing", "ceiling"], help="what to run"
    )
    parser.add_argument(
        "--per-process",
        type=int,
        nargs="+",
        default=[1],
        help="env workers per Ray process, each a row of the scaling and ceiling parts on Ray",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()

    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    rows: list[Row] = []
    try:
        options = args.world_options or f"{{ delay_ms = {args.delay_ms} }}"
        for n in args.workers if "scaling" in args.parts else ():
            episodes = n * args.episodes_per_worker
            rows.append(run_once("scaling", "local", n, args.world, options, episodes, args.agent))
            print_row(rows[-1])
            for k in args.per_process:
                row = run_once("scaling", "ray", n, args.world, options, episodes, args.agent, k)
                rows.append(row)
                print_row(rows[-1])
        for backend in ("local", "ray") if "crossing" in args.parts else ():
            rows.append(run_once("crossing", backend, 1, "minilab", "{}", args.crossing_episodes))
            print_row(rows[-1])
        if "ceiling" in args.parts:
            n, episodes = args.ceiling_workers, args.ceiling_episodes
            rows.append(run_once("ceiling", "local", n, "minilab", "{}", episodes))
            print_row(rows[-1])
            for k in args.per_process:
                rows.append(run_once("ceiling", "ray", n, "minilab", "{}", episodes, per_process=k))
                print_row(rows[-1])
    finally:
        ray.shutdown()
    machine = platform.processor() or platform.machine()
    print(f"\n{machine}, {os.cpu_count()} cores, ray {ray.__version__}")
    report(rows, None if args.world_options else args.delay_ms)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1), encoding="utf-8")


def print_row(r: Row) -> None:
    print(
        f"{r.part:8} {r.backend:5} workers={r.workers:2}  {r.steps_per_s:8.1f} steps/s (busy "
        f"window {r.window_seconds:5.2f} s)  {r.events_per_s:8.0f} events/s in it; the run "
        f"{r.seconds:5.2f} s, driver CPU {r.driver_cpu_us_per_event:4.0f} µs/event, every "
        f"worker under way after {r.start_seconds:.1f} s"
        + (
            f", {r.processes} processes of {r.per_process} worker(s), "
            f"{r.worker_rss_mb:.0f} MiB resident per remote worker"
            if r.worker_rss_mb
            else ""
        ),
        flush=True,
    )


def report(rows: list[Row], delay_ms: float | None) -> None:
    print(
        "\n| workers | per process | ideal steps/s | local steps/s | Ray steps/s | Ray / local "
        "| under way, local / Ray (s) | MiB per remote worker |"
    )
    print("|---|---|---|---|---|---|---|---|")
    local_of = {r.workers: r for r in rows if r.part == "scaling" and r.backend == "local"}
    for remote in rows:
        if remote.part != "scaling" or remote.backend != "ray":
            continue
        n, r = remote.workers, local_of[remote.workers]
        ideal = f"{n * 1000.0 / delay_ms:.0f}" if delay_ms else "-"
        print(
            f"| {n} | {remote.per_process} | {ideal} | {r.steps_per_s:.1f} | "
            f"{remote.steps_per_s:.1f} | {remote.steps_per_s / r.steps_per_s:.2f} | "
            f"{r.start_seconds:.1f} / {remote.start_seconds:.1f} | {remote.worker_rss_mb:.0f} |"
        )
    by = {(r.part, r.backend, r.workers): r for r in rows}
    local, remote = by.get(("crossing", "local", 1)), by.get(("crossing", "ray", 1))
    if local and remote:
        print(
            f"\ncrossing: {local.us_per_event:.0f} µs per event locally, "
            f"{remote.us_per_event:.0f} µs from a remote worker: "
            f"{remote.us_per_event - local.us_per_event:.0f} µs more"
        )
    for r in rows:
        if r.part == "ceiling":
            print(
                f"ceiling {r.backend} ({r.workers} workers, {r.per_process} per process): "
                f"{r.events_per_s:.0f} events/s; the driver's CPU "
                f"{r.driver_cpu_us_per_event:.0f} µs per event, "
                f"{1e6 / r.driver_cpu_us_per_event:.0f} events/s on a core of its own"
            )


if __name__ == "__main__":
    main()
