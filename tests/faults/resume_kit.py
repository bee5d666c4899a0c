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

import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from agents.acting.scheduler import RESUMED
from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
)
from agents.events.policy import PolicyUpdated
from engine.errors import LogError
from engine.events import Envelope, Event
from engine.lifecycle import RunFailed, RunResumed, RunStarted, RunStopped
from engine.replay import verify_log
from scenarios.assemble import fact_checks, projections
from scenarios.checks import check_context
from stores.lmdb_log import LmdbEventLog

ROOT = Path(__file__).resolve().parents[2]
UNCOMPARED = frozenset({"seconds", "worker", "run_id", "train_episodes"})
"""Fields that depend on timing in an uninterrupted run too: wall seconds, which worker played
an episode, and an evaluation round's ``train_episodes`` (the training episodes handed to the
learner when the round ended, while the next update's episodes are being played)."""

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
batches_in_flight = 1  # two passes at once changed one score's last bits (kill sweep, 12-02)

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
        [sys.executable, "-m", "scenarios.cli", *args],
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


SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGKILL: -signal.SIGKILL}
"""The exit status of a process stopped by each signal: coevo turns SIGINT into a stop with
exit 130; SIGKILL cannot be caught (``Popen.returncode`` is minus the signal)."""

SITE_INTERRUPTED = "Fatal Python error: init_import_site"
"""What CPython prints (exit 1) when a KeyboardInterrupt interrupts its import of ``site``, in
its own start-up, before any of coevo's code runs."""


def catches(pid: int, sig: int) -> bool | None:
    """Whether process ``pid`` has a handler installed for ``sig`` now: bit ``sig - 1`` of the
    ``SigCgt`` mask in ``/proc/PID/status`` (Linux). None where that cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return None


def stopped_as_expected(sig: int, code: int, err: str, caught: bool | None) -> bool:
    """Whether exit status ``code`` (stderr ``err``) is how a process ends on ``sig``.

    A SIGINT stops coevo gracefully (130) once the interpreter has installed its handler.
    Sent while the interpreter starts (``caught`` False: no handler yet, read just before the
    signal went) its default action ends the process (-2), and during CPython's import of
    ``site`` it ends with CPython's fatal error: in both cases before coevo opened its log.
    """
    if code == SIGNAL_EXIT[sig]:
        return True
    if sig != signal.SIGINT:
        return False
    if caught is False and code == -signal.SIGINT:
        return True
    return code == 1 and SITE_INTERRUPTED in err and "KeyboardInterrupt" in err


def stop_at(
    proc: subprocess.Popen[bytes],
    run: Path,
    events: int,
    sig: int,
    timeout: float = 600,
    errors: list[str] | None = None,
) -> int | None:
    """Send ``sig`` once the log holds ``events`` events; wait for the process to end, which
    must be by that signal (:func:`stopped_as_expected`: :data:`SIGNAL_EXIT`, or a SIGINT that
    came before the interpreter could handle it). Its stderr is appended to ``errors``.

    Returns:
        The exit code, or None if the process ended on its own (exit 0) before that.
    """
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if next_seq(run) >= events:
            caught = catches(proc.pid, sig)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=timeout)
            if errors is not None:
                errors.append(err.decode())
            if proc.returncode == 0:  # it had exited on its own as the signal was sent
                return None
            expected = stopped_as_expected(sig, proc.returncode, err.decode(), caught)
            assert expected, (proc.returncode, caught, err.decode()[-2000:])
            return proc.returncode
        assert time.monotonic() < deadline, "the run did not reach the kill point in time"
        time.sleep(0.05)
    _, err = proc.communicate()
    if errors is not None:
        errors.append(err.decode())
    assert proc.returncode == 0, err.decode()[-2000:]
    return None


def finish(
    proc: subprocess.Popen[bytes], timeout: float = 600, errors: list[str] | None = None
) -> None:
    _, err = proc.communicate(timeout=timeout)
    if errors is not None:
        errors.append(err.decode())
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


ONCE = {
    "episode_finished": ("episode",),
    "policy_updated": ("policy_version",),
    "gradient_requested": ("update",),
    "advantages_computed": ("group",),
    "tip_stored": ("tip_id",),
    "extractor_called": ("call",),
    "extractor_updated": ("extractor_version",),
    "extractor_gradient_requested": ("update",),
    "credit_assigned": ("episode",),
    "merge_requested": ("step", "slot", "entries"),
}
"""Facts a run records once, by the fields that name them."""

ONCE_PER_ATTEMPT = {
    "episode_assigned": ("episode",),
    "episode_started": ("episode",),
    "step_taken": ("episode", "turn"),
    "action_requested": ("episode", "turn"),
    "action_sampled": ("episode", "turn"),
    "retrieval_requested": ("episode", "turn"),
    "tips_retrieved": ("episode", "turn"),
    "reflection_requested": ("episode",),
    "tip_proposed": ("episode",),
    "extraction_requested": ("episode",),
}
"""Facts an attempt at an episode records once (an attempt ends at its episode's
``episode_abandoned``; the next one runs the episode again from its seed)."""

ANSWERS = frozenset({"action_sampled", "tips_retrieved", "tip_proposed", "extractor_called"})
"""Answers to one request each: their ``cause`` is the request's seq."""


def duplicates(envs: list[Envelope[Event]]) -> list[str]:
    """Facts recorded more than once: a seq; an episode finished, a policy or extractor
    version, an update's request, a group's advantages, a stored tip, an extractor call, a
    credited episode or a merge chunk twice; within one attempt at an episode, its assignment,
    start, a turn (its step, action request and answer, retrieval and answer), its reflection,
    tip or extraction request twice; a request answered twice."""
    seen: Counter[str] = Counter()
    attempt: Counter[str] = Counter()
    for env in envs:
        ev = env.event
        kind = str(ev.__struct_config__.tag)
        seen[f"seq:{env.seq}"] += 1
        if kind in ONCE:
            seen[f"{kind}:{[getattr(ev, f) for f in ONCE[kind]]}"] += 1
        elif kind in ONCE_PER_ATTEMPT:
            key = [getattr(ev, f) for f in ONCE_PER_ATTEMPT[kind]]
            seen[f"{kind}:{key} attempt {attempt[key[0]]}"] += 1
        if kind in ANSWERS and env.cause is not None:
            seen[f"answer to seq {env.cause}"] += 1
        if isinstance(ev, EpisodeAbandoned):
            attempt[ev.episode] += 1
    return sorted(k for k, n in seen.items() if n > 1)


@dataclass
class Chain:
    """A run stopped by signals and resumed after each until it completed.

    Attributes:
        run: the run directory.
        final: the completed run's log.
        after: the log as it was after each stop.
        signals: the signal of each stop.
        errors: the stderr of every process (the run, then each resume).
        late: 1 if a last signal reached the run after it had recorded its completion.
    """

    run: Path
    final: list[Envelope[Event]]
    after: list[list[Envelope[Event]]]
    signals: list[int] = field(default_factory=list[int])
    errors: list[str] = field(default_factory=list[str])
    late: int = 0

    def counts(self) -> dict[str, int]:
        """What the chain did and what it lost or duplicated (:mod:`fault_counts`'s keys)."""
        ends = [0, *(len(before) for before in self.after)]
        return {
            "stops": len(self.after),
            "stops_after_completion": self.late,
            "stops_before_first_commit": sum(b == a for a, b in itertools.pairwise(ends[1:])),
            "lost": sum(self.final[: len(before)] != before for before in self.after),
            "duplicated": len(duplicates(self.final)),
            "abandoned": sum(isinstance(env.event, EpisodeAbandoned) for env in self.final),
            "events": len(self.final),
            "tracebacks": sum("Traceback" in err for err in self.errors),
        }


def add_counts(into: dict[str, int], counts: dict[str, int]) -> dict[str, int]:
    """``into`` with ``counts`` added, key by key."""
    for key, value in counts.items():
        into[key] = into.get(key, 0) + value
    return into


def stop_and_resume(
    root: Path,
    scenario: Path,
    name: str,
    kills: list[tuple[int, int]],
    cache: Path | None = None,
    *,
    relative: bool = False,
) -> Chain:
    """Run ``scenario`` into ``root/name``, send each ``(signal, after this many events)`` in
    turn (the first to the run, the next ones to the resumes), then resume until it completes.
    Models are cached under ``cache`` (default: ``root``).

    A stop's point may have passed before its resume started (the previous stop overshot it:
    a run goes on writing while the signal is sent and handled); the stop then ends the resume
    as it loads, before its first commit, and leaves the log as it was. With ``relative``, each
    point counts the events of its own session (after the log the previous stop left), so that
    every stop interrupts a session that wrote. A stop that lands after the run recorded its
    completion (as it exits) ends the chain: there is nothing to resume.

    Returns:
        The chain: the final log, the log as it was after each stop, the signals, stderr.
    """
    run = root / name
    cache = cache or root
    proc = coevo(["run", str(scenario), "--out", str(run), "--quiet"], cache)
    chain = Chain(run, [], [])
    for sig, events in kills:
        base = len(chain.after[-1]) if relative and chain.after else 0
        code = stop_at(proc, run, base + events, sig, errors=chain.errors)
        log = read_log(run)
        if code is None or completed(log):  # it completed before the stop
            chain.late += code is not None
            chain.final = log
            return chain
        chain.after.append(log)
        chain.signals.append(sig)
        proc = coevo(["resume", str(run), "--quiet"], cache)
    finish(proc, errors=chain.errors)
    chain.final = read_log(run)
    return chain


def completed(envs: list[Envelope[Event]]) -> bool:
    """Whether a log records its run's completion."""
    last = envs[-1].event if envs else None
    return isinstance(last, RunStopped) and last.reason == "completed"


def check_sessions(final: list[Envelope[Event]], after: list[list[Envelope[Event]]]) -> int:
    """Each session's events follow the previous session's: the run's begin with
    ``run_started`` at seq 0, and each resume that committed anything begins with one
    ``run_resumed`` naming the seq it follows and how the session before ended. A resume
    stopped before its first commit left the log as it was.

    Returns:
        The number of resumed sessions that committed events.
    """
    assert isinstance(final[0].event, RunStarted)
    ends = [len(before) for before in after] + [len(final)]
    resumed = [env.seq for env in final if isinstance(env.event, RunResumed)]
    wrote = [start for start, end in itertools.pairwise(ends) if end > start]
    assert resumed == wrote, (resumed, ends)
    for start in wrote:
        ev = final[start].event
        before = final[start - 1].event
        assert isinstance(ev, RunResumed) and ev.after == start - 1
        ended = isinstance(before, RunStopped | RunFailed)
        assert ev.previous == (str(before.__struct_config__.tag) if ended else ""), ev
    return len(wrote)


def check_consistent(
    run: Path, final: list[Envelope[Event]], after: list[list[Envelope[Event]]]
) -> None:
    """What every resumed run must show, deterministic or not: the log verifies, nothing
    committed before a stop was lost or changed, no fact is recorded twice, every session
    begins as :func:`check_sessions` says, and the run completed."""
    log = LmdbEventLog.open(run / "log", writable=False)
    try:
        ctx, notes = check_context(log.read_meta())  # every invariant of the run's method
        result = verify_log(log, projections(), fact_checks(ctx))
    finally:
        log.close()
    assert result.ok, result.error
    assert notes == []
    assert [env.seq for env in final] == list(range(len(final)))
    for before in after:
        assert final[: len(before)] == before
    assert duplicates(final) == []
    assert completed(final)
    check_sessions(final, after)
    check_abandoned(final, after)


def running(envs: list[Envelope[Event]]) -> set[str]:
    """The episodes a log leaves running: assigned, and neither ended (finished, aborted) nor
    abandoned after their last assignment."""
    out: set[str] = set()
    for env in envs:
        ev = env.event
        if isinstance(ev, EpisodeAssigned):
            out.add(ev.episode)
        elif isinstance(ev, EpisodeFinished | EpisodeAborted | EpisodeAbandoned):
            out.discard(ev.episode)
    return out


def check_abandoned(final: list[Envelope[Event]], after: list[list[Envelope[Event]]]) -> None:
    """Each resume that committed abandons (``reason`` :data:`RESUMED`) exactly the episodes the
    log it began from left running, and abandons nothing else for a stop. Whether a stop leaves
    any running is timing: commits alternate between a batch of whole scripted episodes and the
    assignments that follow, and a stop landing just after the first kind leaves none."""
    ends = [len(before) for before in after] + [len(final)]
    for start, end in itertools.pairwise(ends):
        if end == start:  # a resume stopped before its first commit: the next one abandons
            continue
        by_stop = {
            env.event.episode
            for env in final[start:end]
            if isinstance(env.event, EpisodeAbandoned) and env.event.reason == RESUMED
        }
        assert by_stop == running(final[:start]), (start, by_stop, running(final[:start]))
