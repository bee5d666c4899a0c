"""Helpers of the resume tests: run ``coevo`` in a subprocess, stop it (SIGKILL, SIGINT) once
its log holds a given number of events, and compare logs modulo what a resume may change.

What a resume may change, and nothing else:
- envelope metadata (seq, wall time), the runtime's own events (``run_resumed``, the stopped or
  failed session's final event, ``actor_started``, checksums and snapshots, whose cadence
  restarts with each session) and ``PolicyUpdated.seconds``;
- the attempts of abandoned episodes: every event correlated with an episode before its
  ``episode_abandoned`` (the episode is then assigned again and re-run from its seed);
- which worker ran an episode (a resumed session starts with every worker free).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from agents.episode_events import EpisodeAbandoned
from agents.policy_events import PolicyUpdated
from engine.errors import LogError
from engine.events import Envelope, Event
from engine.lifecycle import RunResumed, RunStopped
from engine.replay import verify_log
from scenarios.assemble import projections
from stores.lmdb_log import LmdbEventLog

ROOT = Path(__file__).resolve().parents[2]
UNCOMPARED = frozenset({"seconds", "worker", "run_id"})

GRPO = """
name = "resume-grpo"
seed = 5

[world]
families = ["fetch"]

[agent]
kind = "policy"

[run]
episodes = 24
workers = 3
method = "grpo"

[policy]
temperature = 5.0
batch_max = 1  # a forward pass per request: batching changes log-probs in their last bits

[policy.embedded]
steps = 20
warmup = 2
episodes_per_family = 6
hidden_size = 32
layers = 1
heads = 2
kv_heads = 1
intermediate_size = 64
eval_variants = 1
eval_notes = 1
note_episodes_per_family = 8
probe_variants = 2
probe_seeds = 1

[grpo]
group_size = 4
groups_per_update = 2
lr = 0.01
max_staleness = 0  # no episode samples a version that depends on when the learner finished
keep_checkpoints = 1

[eval]
every = 2
episodes = 3

[logging]
progress = false
"""
"""A tiny GRPO scenario that is deterministic on CPU (see docs/RELIABILITY.md, Resume): 3
updates, an evaluation round after the second and the last, one checkpoint kept."""

EMPO2 = (
    GRPO.replace('name = "resume-grpo"', 'name = "resume-empo2"')
    .replace('method = "grpo"', 'method = "empo2"')
    .replace("episodes = 3\n", "episodes = 3\nadapt_attempts = 2\nadapt_tasks = 2\n")
    .replace(
        "[logging]",
        '[empo2]\np = 1.0\nq = 0.5\ndraw = "episode"\nembedder = "hashing"\ntip_tokens = 6\n\n'
        "[logging]",
    )
)
"""The GRPO scenario as EMPO2: every training episode reflected on, half of them with tips
shown, the adaptation test in the first and last evaluation rounds."""

COMPLEMENTARY = (
    GRPO.replace('name = "resume-grpo"', 'name = "resume-complementary"')
    .replace('method = "grpo"', 'method = "complementary"')
    .replace("episodes = 24", "episodes = 32")
    .replace(
        "[logging]",
        '[complementary]\nwarmup = 1\nmerge_every = 2\nbatch = 3\nembedder = "hashing"\n'
        'max_new_tokens = 12\nlr = 0.05\ncredit = "score"\nextractor = "embedded-ops"\n\n'
        "[complementary.ops]\nepisodes_per_family = 3\nsteps = 8\nwarmup = 1\nchecks = 1\n\n"
        "[logging]",
    )
)
"""The GRPO scenario as Complementary RL: a warm-up step, then guided and free halves, the
extractor trained every 3 credited calls and a merge pass every 2 steps."""

ROLLOUT = """
name = "resume-rollout"
seed = 11

[world]
name = "minilab"
split = "train"

[agent]
kind = "explorer"

[run]
episodes = 400
workers = 4

[logging]
progress = false
"""
"""Scripted explorers, no model: each episode a pure function of its seed."""


def coevo(args: list[str], cache: Path) -> subprocess.Popen[bytes]:
    """Start ``coevo ARGS`` in a subprocess with the model cache at ``cache``."""
    return subprocess.Popen(
        [sys.executable, "-m", "engine.cli", *args],
        cwd=ROOT,
        env={**os.environ, "COEVO_CACHE": str(cache), "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def next_seq(run: Path) -> int:
    """Events the run's log holds now (0 before it exists)."""
    if not (run / "log" / "data.mdb").is_file():
        return 0
    try:
        log = LmdbEventLog.open(run / "log", writable=False)
    except LogError:  # the run is creating it: the file is there, its databases not yet
        return 0
    try:
        return log.next_seq
    finally:
        log.close()


def stop_at(
    proc: subprocess.Popen[bytes], run: Path, events: int, sig: int, timeout: float = 600
) -> int | None:
    """Send ``sig`` once the log holds ``events`` events; wait for the process to end.

    Returns:
        The exit code, or None if the process ended on its own before that.
    """
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if next_seq(run) >= events:
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=timeout)
            if sig == signal.SIGINT:
                assert proc.returncode == 130, err.decode()[-2000:]
            return proc.returncode
        assert time.monotonic() < deadline, "the run did not reach the kill point in time"
        time.sleep(0.05)
    _, err = proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    return None


def finish(proc: subprocess.Popen[bytes], timeout: float = 600) -> None:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()[-2000:]


def read_log(run: Path) -> list[Envelope[Event]]:
    log = LmdbEventLog.open(run / "log", writable=False)
    try:
        return list(log.read(0, None))
    finally:
        log.close()


def comparable(envs: list[Envelope[Event]]) -> Counter[bytes]:
    """The events that must be the same in a resumed run as in an uninterrupted one, as a
    multiset of canonical encodings (the order of events from different actors depends on
    timing even without any interruption)."""
    abandoned: dict[str, int] = {}
    for env in envs:
        if isinstance(env.event, EpisodeAbandoned):
            abandoned[env.event.episode] = env.seq
    out: Counter[bytes] = Counter()
    for env in envs:
        if env.actor == "runtime" or isinstance(env.event, EpisodeAbandoned):
            continue
        if env.corr in abandoned and env.seq < abandoned[env.corr]:
            continue
        body: dict[str, Any] = msgspec.to_builtins(env.event)
        for key in UNCOMPARED:
            body.pop(key, None)
        out[msgspec.json.encode(body, order="deterministic")] += 1
    return out


def final_digest(envs: list[Envelope[Event]]) -> str:
    return [env.event for env in envs if isinstance(env.event, PolicyUpdated)][-1].digest


def duplicates(envs: list[Envelope[Event]]) -> list[str]:
    """Facts recorded more than once: an episode finished twice, a policy version or an
    update's request twice, a group's advantages twice, a seq twice."""
    keys = {
        "episode_finished": "episode",
        "policy_updated": "policy_version",
        "gradient_requested": "update",
        "advantages_computed": "group",
        "tip_stored": "tip_id",
        "extractor_called": "call",
        "extractor_updated": "extractor_version",
        "extractor_gradient_requested": "update",
        "credit_assigned": "episode",
    }
    seen: Counter[str] = Counter()
    for env in envs:
        kind = str(env.event.__struct_config__.tag)
        if kind in keys:
            seen[f"{kind}:{getattr(env.event, keys[kind])}"] += 1
        seen[f"seq:{env.seq}"] += 1
    return sorted(k for k, n in seen.items() if n > 1)


def stop_and_resume(
    root: Path,
    scenario: Path,
    name: str,
    kills: list[tuple[int, int]],
    cache: Path | None = None,
) -> tuple[list[Envelope[Event]], list[list[Envelope[Event]]]]:
    """Run ``scenario`` into ``root/name``, send each ``(signal, after this many events)`` in
    turn (the first to the run, the next ones to the resumes), then resume until it completes.
    Models are cached under ``cache`` (default: ``root``).

    Returns:
        The final log and the log as it was after each stop.
    """
    run = root / name
    cache = cache or root
    proc = coevo(["run", str(scenario), "--out", str(run), "--quiet"], cache)
    after: list[list[Envelope[Event]]] = []
    for sig, events in kills:
        code = stop_at(proc, run, events, sig)
        if code is None:  # it completed before the kill point
            return read_log(run), after
        after.append(read_log(run))
        proc = coevo(["resume", str(run), "--quiet"], cache)
    finish(proc)
    return read_log(run), after


def check_consistent(
    run: Path, final: list[Envelope[Event]], after: list[list[Envelope[Event]]]
) -> None:
    """What every resumed run must show, deterministic or not: the log verifies, nothing
    committed before a stop was lost or changed, no fact is recorded twice, and the run
    completed with one ``run_resumed`` per stop."""
    log = LmdbEventLog.open(run / "log", writable=False)
    try:
        result = verify_log(log, projections())
    finally:
        log.close()
    assert result.ok, result.error
    assert [env.seq for env in final] == list(range(len(final)))
    for before in after:
        assert final[: len(before)] == before
    assert duplicates(final) == []
    last = final[-1].event
    assert isinstance(last, RunStopped) and last.reason == "completed"
    assert sum(isinstance(env.event, RunResumed) for env in final) == len(after)
