"""A learner in a process of its own (``[policy] learner_threads``): the deterministic tiny GRPO
run of the resume tests, its learner in a child process with one thread, killed (SIGKILL of the
run) after its first update and resumed, ends exactly as the same run with the learner in the
run's process: the same final digest and the same events. The child ends with the run it
served, and every update records its thread count. A child killed alone is replaced and the
run goes on to the same end. An EMPO2 run whose learner has two threads re-executes bit for
bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from resume_kit import (
    EMPO2,
    GRPO,
    check_consistent,
    coevo,
    comparable,
    final_digest,
    finish,
    next_seq,
    read_log,
)

from agents.events.policy import PolicyUpdated
from agents.testing.processes import alive, children
from engine.events import Envelope, Event
from engine.lifecycle import ActorFailed, ActorRestarted, RunResumed

OWN_PROCESS = GRPO.replace("[policy]\n", "[policy]\nlearner_threads = 1\n")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[Envelope[Event]]:
    """The events of the tiny GRPO run with its learner in the run's process."""
    root = tmp_path_factory.mktemp("reference")
    (root / "in-process.toml").write_text(GRPO)
    finish(
        coevo(["run", str(root / "in-process.toml"), "--out", str(root / "ref"), "--quiet"], root)
    )
    return read_log(root / "ref")


def wait_past(proc: subprocess.Popen[bytes], run: Path, seq: int) -> None:
    """Wait until the running ``coevo run`` (``proc``) has logged more than ``seq`` events."""
    deadline = time.monotonic() + 300
    while next_seq(run) <= seq:
        assert proc.poll() is None, "the run ended before its kill point"
        assert time.monotonic() < deadline, "the run did not reach its kill point in time"
        time.sleep(0.05)


def test_a_killed_run_s_learner_process_ends_and_the_resume_matches_the_in_process_run(
    tmp_path: Path, reference: list[Envelope[Event]]
) -> None:
    (tmp_path / "own-process.toml").write_text(OWN_PROCESS)
    first_update = next(e.seq for e in reference if isinstance(e.event, PolicyUpdated))

    run = tmp_path / "run"
    proc = coevo(
        ["run", str(tmp_path / "own-process.toml"), "--out", str(run), "--quiet"], tmp_path
    )
    wait_past(proc, run, first_update + 20)
    learners = children(proc.pid)
    proc.kill()
    proc.communicate()
    assert len(learners) == 1, learners  # env workers and inference are threads
    deadline = time.monotonic() + 10
    while alive(learners[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(learners[0]), "the learner's process outlived the killed run"
    after = read_log(run)

    finish(coevo(["resume", str(run), "--quiet"], tmp_path))
    final = read_log(run)
    assert any(isinstance(e.event, RunResumed) for e in final)
    check_consistent(run, final, [after])
    assert final_digest(final) == final_digest(reference)
    assert comparable(final) == comparable(reference)
    updates = [e.event for e in final if isinstance(e.event, PolicyUpdated)]
    assert [u.threads for u in updates] == [1, 1, 1]


@pytest.mark.parametrize(
    ("after", "sig"),
    [
        ("first_request", signal.SIGKILL),
        # the other moments and the stall: `make test-faults` (the default suite's time)
        pytest.param("first_update", signal.SIGKILL, marks=pytest.mark.faults),
        pytest.param("first_request", signal.SIGSTOP, marks=pytest.mark.faults),
    ],
    ids=["killed-training", "killed-between-updates", "stopped-training"],
)
def test_a_learner_process_killed_alone_is_replaced_and_the_run_ends_as_without_the_kill(
    tmp_path: Path, reference: list[Envelope[Event]], after: str, sig: signal.Signals
) -> None:
    """Killed (as by the out-of-memory killer) while it trains an update, or between updates,
    or stopped (SIGSTOP) while it trains, which the learner kills once it has heard nothing
    for ``learner_stall_timeout``: supervision restarts the learner, whose new process loads
    the newest checkpoint the log names and redoes what the log does not hold; the run
    completes by itself with the events and the final weights of the run that lost nothing."""
    stall = "learner_threads = 1\nlearner_stall_timeout = 10\n"
    text = OWN_PROCESS.replace("learner_threads = 1\n", stall) if sig == signal.SIGSTOP else None
    (tmp_path / "own-process.toml").write_text(text or OWN_PROCESS)
    kinds = {"first_request": "gradient_requested", "first_update": "policy_updated"}
    point = next(e.seq for e in reference if e.event.__struct_config__.tag == kinds[after])
    run = tmp_path / "run"
    proc = coevo(
        ["run", str(tmp_path / "own-process.toml"), "--out", str(run), "--quiet"], tmp_path
    )
    wait_past(proc, run, point + (0 if after == "first_request" else 20))
    learners = children(proc.pid)
    assert len(learners) == 1, learners
    os.kill(learners[0], sig)
    finish(proc)
    assert not alive(learners[0])
    final = read_log(run)
    failed = [e.event for e in final if isinstance(e.event, ActorFailed)]
    assert [(f.actor, f.error_type, f.action) for f in failed] == [
        ("learner", "LearnerProcessLost", "restart")
    ]
    silent = "the learner's process sent nothing for 10 s during 'update' (stopped, or hung)"
    assert (silent in failed[0].message) == (sig == signal.SIGSTOP), failed[0].message
    restarted = [e.event for e in final if isinstance(e.event, ActorRestarted)]
    assert [(r.actor, r.attempt) for r in restarted] == [("learner", 1)]
    lines = (run / "coevo.jsonl").read_text().splitlines()
    ready = [json.loads(line)["pid"] for line in lines if "learner process ready" in line]
    assert len(ready) == len(set(ready)) == 2, ready  # each process said so once
    assert final_digest(final) == final_digest(reference)
    assert comparable(final) == comparable(reference)
    finish(coevo(["replay", str(run), "--verify"], tmp_path))


def test_an_empo2_run_with_a_two_thread_learner_process_re_executes_bit_for_bit(
    tmp_path: Path,
) -> None:
    """Two torch threads give other bits than one: each update records its count and
    re-execution (in the one ``coevo replay`` process) runs it with as many."""
    (tmp_path / "empo2.toml").write_text(
        EMPO2.replace("[policy]\n", "[policy]\nlearner_threads = 2\n")
    )
    run = tmp_path / "run"
    finish(coevo(["run", str(tmp_path / "empo2.toml"), "--out", str(run), "--quiet"], tmp_path))
    updates = [e.event for e in read_log(run) if isinstance(e.event, PolicyUpdated)]
    assert [u.threads for u in updates] == [2, 2, 2]
    finish(coevo(["replay", str(run), "--reexecute-learner"], tmp_path))
