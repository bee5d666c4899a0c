"""Steps per second of the real environments: the library called directly, the coevo adapter
called directly, and the adapter through a whole coevo run (``coevo run``: env workers, the
durable event log, projections).

Run: ``.venv/bin/python bench/bench_envs.py`` (needs ``make install-envs`` and Java; about five
minutes on 2 cores). Results: docs/BENCHMARKS.md.

Every row plays the same episodes: those a ``coevo run`` of ``--episodes`` episodes with seed
:data:`RUN_SEED` plans (task and episode seed), each acted by coevo's random agent with that
episode's own rng, for at most ``--max-steps`` steps, resets included. The library rows build
their action lists as the adapters do (ScienceWorld: ``rank_actions`` over the library's valid
actions; TextWorld: sorted), so the agent makes the same choices everywhere (ScienceWorld's
library runs without stable hashes, so an object's name can differ now and then). Process and
JVM start-up are left out: each direct row warms up with one reset first, and a coevo run is
timed from the moment every worker has begun its first episode to the last
``EpisodeFinished``, counting the steps logged in that window.

For ScienceWorld it also reports the JVM's resident memory after the direct rows: the library's
own JVM (no heap bound) and the adapter's (``-Xmx512m``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.acting.scheduler import plan_episode  # noqa: E402
from agents.acting.scripted import RandomAgent  # noqa: E402
from agents.events.episodes import EpisodeFinished, EpisodeStarted, StepTaken  # noqa: E402
from engine.seeds import derive_rng  # noqa: E402
from engine.world import Observation, Task  # noqa: E402
from engine.world_registry import load_world  # noqa: E402
from scenarios.worlds.scienceworld_text import rank_actions  # noqa: E402
from stores.lmdb_log import LmdbEventLog  # noqa: E402

COEVO = str(Path(sys.executable).parent / "coevo")
RUN_SEED = 1
SW_FAMILIES = ["boil", "find-living-thing"]
SW_OPTIONS: dict[str, Any] = {"variants": 2, "max_actions": 48}
TW_FAMILIES = ["coin_collector", "treasure_hunter", "cooking"]
TW_OPTIONS: dict[str, Any] = {"level": 2, "train_games": 2, "cooking": {"recipe": 1, "take": 1}}


@dataclass
class Row:
    what: str
    steps: int
    episodes: int
    seconds: float


def plan(tasks: list[Task], episodes: int) -> list[tuple[Task, int]]:
    """The episodes a ``coevo run`` with seed :data:`RUN_SEED` plays: (task, episode seed)."""
    return [plan_episode(RUN_SEED, i, tasks) for i in range(episodes)]


def timed_loop(
    episodes: list[tuple[Task, int]],
    reset: Callable[[Task], Sequence[str]],
    step: Callable[[str], tuple[bool, Sequence[str]]],
    max_steps: int,
) -> tuple[int, float]:
    """Play ``episodes`` as coevo's random agent would (same rng per episode); returns (steps,
    seconds). ``reset`` returns the first admissible list, ``step`` (done, admissible)."""
    reset(episodes[0][0])  # warm-up, not timed
    steps = 0
    start = time.perf_counter()
    for task, seed in episodes:
        agent = RandomAgent(derive_rng(seed, "agent"))
        actions = reset(task)
        for _ in range(max_steps):
            action = agent.act(Observation(text="", admissible=tuple(actions), goal=""))
            done, actions = step(action)
            steps += 1
            if done or not actions:
                break
    return steps, time.perf_counter() - start


def adapter_row(
    name: str, options: dict[str, Any], episodes: list[tuple[Task, int]], max_steps: int
) -> tuple[Row, Any]:
    world = load_world(name, {**options, "max_steps": max_steps})

    def reset(task: Task) -> Sequence[str]:
        return world.reset(task, seed=0).admissible

    def step(action: str) -> tuple[bool, Sequence[str]]:
        obs = world.step(action)
        return obs.done, obs.admissible

    steps, seconds = timed_loop(episodes, reset, step, max_steps)
    return Row(f"{name} adapter, called directly", steps, len(episodes), seconds), world


def sciworld_library_row(episodes: list[tuple[Task, int]], max_steps: int) -> tuple[Row, int]:
    """ScienceWorld's own ``ScienceWorldEnv``; its valid actions go through the adapter's
    ``rank_actions`` so the agent chooses from the same lists as in the other rows."""
    from scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv("", envStepLimit=max_steps)
    goal = [""]

    def reset(task: Task) -> Sequence[str]:
        env.load(task.family, task.variant, "", False)
        _, info = env.reset()
        goal[0] = str(info["taskDesc"])
        return rank_actions(info["valid"], goal[0], SW_OPTIONS["max_actions"])

    def step(action: str) -> tuple[bool, Sequence[str]]:
        _, _, done, info = env.step(action)
        return done, rank_actions(info["valid"], goal[0], SW_OPTIONS["max_actions"])

    try:
        steps, seconds = timed_loop(episodes, reset, step, max_steps)
        rss = jvm_rss(env._gateway.java_process.pid)
    finally:
        env.close()
    return Row("ScienceWorldEnv (the library), called directly", steps, len(episodes), seconds), rss


def textworld_library_row(world: Any, episodes: list[tuple[Task, int]], max_steps: int) -> Row:
    """``textworld.start`` on the same game files, admissible commands sorted as the adapter
    sorts them."""
    import textworld

    infos = textworld.EnvInfos(admissible_commands=True, won=True, lost=True)
    envs: dict[Path, Any] = {}
    current: list[Any] = []

    def reset(task: Task) -> Sequence[str]:
        path = world.game_path(task)
        if path not in envs:
            envs[path] = textworld.start(str(path), request_infos=infos)
        current[:] = [envs[path]]
        return sorted(set(current[0].reset().admissible_commands))

    def step(action: str) -> tuple[bool, Sequence[str]]:
        state, _, done = current[0].step(action)
        return bool(done or state.won or state.lost), sorted(set(state.admissible_commands or ()))

    try:
        steps, seconds = timed_loop(episodes, reset, step, max_steps)
    finally:
        for env in envs.values():
            env.close()
    return Row("textworld.start (the library), called directly", steps, len(episodes), seconds)


def coevo_row(
    name: str,
    families: list[str],
    options: dict[str, Any],
    args: argparse.Namespace,
    workers: int,
    tmp: Path,
    durable: bool = True,
) -> Row:
    """A ``coevo run`` of the workload with random agents, timed from the moment every worker
    has started its first episode (so every JVM is up) to the last ``EpisodeFinished``."""
    import tomli_w

    doc = {
        "name": f"bench-{name}-{workers}",
        "seed": RUN_SEED,
        "world": {
            "name": name,
            "families": families,
            "options": {**options, "max_steps": args.max_steps},
        },
        "agent": {"kind": "random"},
        "run": {"episodes": args.episodes, "workers": workers},
        "runtime": {"durable": durable},
        "logging": {"progress": False},
    }
    scenario = tmp / f"{name}-{workers}-{durable}.toml"
    scenario.write_text(tomli_w.dumps(doc))
    out = tmp / f"run-{name}-{workers}-{durable}"
    cmd = [COEVO, "run", str(scenario), "--out", str(out), "--quiet"]
    subprocess.run(cmd, check=True, capture_output=True)
    log = LmdbEventLog.open(out / "log")
    try:
        events = [(env.t, env.event) for env in log.read()]
    finally:
        log.close()
    firsts: dict[str, int] = {}
    for t, e in events:
        if isinstance(e, EpisodeStarted):
            firsts.setdefault(e.worker, t)
    start = max(firsts.values())
    end = max(t for t, e in events if isinstance(e, EpisodeFinished))
    steps = sum(isinstance(e, StepTaken) and start <= t <= end for t, e in events)
    episodes = sum(isinstance(e, EpisodeFinished) and start <= t <= end for t, e in events)
    label = f"through coevo run, {workers} worker{'s' if workers > 1 else ''}"
    label += "" if durable else ", durable = false"
    return Row(label, steps, episodes, (end - start) / 1e9)


def jvm_rss(pid: int) -> int:
    """Resident memory (VmRSS) of a process in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def bench_sciworld(args: argparse.Namespace, tmp: Path) -> list[str]:
    lister = load_world("scienceworld", SW_OPTIONS)
    tasks = [t for f in SW_FAMILIES for t in lister.tasks(f, "train")]
    lister.close()
    episodes = plan(tasks, args.episodes)
    rounds: list[list[Row]] = []
    for k in range(args.rounds):
        here = tmp / f"sw{k}"
        here.mkdir()
        library, library_rss = sciworld_library_row(episodes, args.max_steps)
        adapter, world = adapter_row("scienceworld", SW_OPTIONS, episodes, args.max_steps)
        adapter_rss = jvm_rss(world.jvm_pid)
        world.close()
        rows = [library, adapter]
        rows += [
            coevo_row("scienceworld", SW_FAMILIES, SW_OPTIONS, args, w, here) for w in args.workers
        ]
        rounds.append(rows)
        print(
            f"# round {k}: JVM resident memory after the direct rows: library (no heap bound) "
            f"{library_rss} MiB, adapter (-Xmx512m) {adapter_rss} MiB",
            flush=True,
        )
    return table(f"ScienceWorld ({', '.join(SW_FAMILIES)}, first 2 train variations each)", rounds)


def bench_textworld(args: argparse.Namespace, tmp: Path) -> list[str]:
    options = {**TW_OPTIONS, "cache_dir": str(tmp / "games")}
    games = load_world("textworld", {**options, "max_steps": args.max_steps})
    tasks = [t for f in TW_FAMILIES for t in games.tasks(f, "train")]
    for task in tasks:  # generate the games first: not part of any row
        games.reset(task, seed=0)
    episodes = plan(tasks, args.episodes)
    rounds: list[list[Row]] = []
    for k in range(args.rounds):
        here = tmp / f"tw{k}"
        here.mkdir()
        rows = [textworld_library_row(games, episodes, args.max_steps)]
        adapter, world = adapter_row("textworld", options, episodes, args.max_steps)
        world.close()
        rows.append(adapter)
        rows += [coevo_row("textworld", TW_FAMILIES, options, args, w, here) for w in args.workers]
        rows.append(coevo_row("textworld", TW_FAMILIES, options, args, 1, here, durable=False))
        rounds.append(rows)
    games.close()
    return table(f"TextWorld ({', '.join(TW_FAMILIES)}, level 2, 2 games each)", rounds)


def table(title: str, rounds: list[list[Row]]) -> list[str]:
    """Median steps/s of each row over the rounds (and its range), and the median of its
    per-round ratio to the library row of the same round."""
    lines = [
        f"### {title}",
        "",
        f"{len(rounds)} rounds, every row once a round; medians, range in brackets.",
        "",
        "| how | steps/episode | steps/s | vs the library |",
        "|---|---:|---:|---:|",
    ]
    for i, row in enumerate(rounds[0]):
        rates = [r[i].steps / r[i].seconds for r in rounds]
        ratios = [rate / (r[0].steps / r[0].seconds) for rate, r in zip(rates, rounds, strict=True)]
        mean_len = statistics.mean(r[i].steps / r[i].episodes for r in rounds)
        lines.append(
            f"| {row.what} | {mean_len:.1f} | {statistics.median(rates):.1f} "
            f"[{min(rates):.1f}-{max(rates):.1f}] | {statistics.median(ratios):.0%} |"
        )
    lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--env", choices=["scienceworld", "textworld", "all"], default="all")
    parser.add_argument("--episodes", type=int, default=12)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--workers", type=lambda s: [int(w) for w in s.split(",")], default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()[0]
    print(f"# {when}, Python {platform.python_version()}, {os.cpu_count()} CPUs, load {load:.1f}")
    print(f"# {' '.join(sys.argv)}\n")
    with tempfile.TemporaryDirectory() as tmp:
        if args.env in ("scienceworld", "all"):
            print("\n".join(bench_sciworld(args, Path(tmp))), flush=True)
        if args.env in ("textworld", "all"):
            print("\n".join(bench_textworld(args, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
