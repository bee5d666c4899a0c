"""The resume tests' own checks can fail: ``duplicates`` finds a fact recorded twice, inside an
attempt as across the run, ``check_sessions`` a session that does not begin as it must, and
``stopped_as_expected`` an exit that is not the signal's."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from resume_kit import (
    SITE_INTERRUPTED,
    Chain,
    catches,
    check_sessions,
    duplicates,
    stopped_as_expected,
)

from agents.events.episodes import EpisodeAbandoned, EpisodeAssigned, EpisodeFinished, StepTaken
from agents.events.policy import ActionRequested, ActionSampled
from engine.events import Envelope, Event
from engine.lifecycle import RunResumed, RunStarted, RunStopped


def log(*events: tuple[Event, int | None]) -> list[Envelope[Event]]:
    return [
        Envelope(seq=seq, run="r", t=0, actor="a", event=ev, cause=cause, corr="ep1")
        for seq, (ev, cause) in enumerate(events)
    ]


STARTED = RunStarted(run_id="r", scenario="s", scenario_hash="h", seed=0, coevo_version="0")
ASSIGNED = EpisodeAssigned(
    episode="ep1", index=1, worker="w", family="f", variant=0, split="train", seed=3
)


def step(turn: int) -> StepTaken:
    return StepTaken(
        episode="ep1", turn=turn, action="a", observation="o", admissible=("a",), reward=0.0,
        done=False, score=0.0,
    )  # fmt: skip


def request(turn: int) -> ActionRequested:
    return ActionRequested(
        episode="ep1", worker="w", turn=turn, messages=(), admissible=("a",), seed=turn
    )


def sampled(turn: int) -> ActionSampled:
    return ActionSampled(
        episode="ep1", worker="w", turn=turn, policy_version=0, action="a", prompt_ids=(),
        response_ids=(), token_logps=(), logp=0.0, temperature=1.0,
    )  # fmt: skip


FINISHED = EpisodeFinished(
    episode="ep1", worker="w", family="f", variant=0, split="train", steps=2, score=1.0,
    success=True, total_reward=1.0,
)  # fmt: skip


def test_a_turn_twice_in_one_attempt_is_a_duplicate_and_in_two_attempts_is_not() -> None:
    once = log((STARTED, None), (ASSIGNED, None), (step(0), None), (step(1), None), (FINISHED, 3))
    assert duplicates(once) == []
    twice = log((STARTED, None), (ASSIGNED, None), (step(0), None), (step(0), None))
    assert duplicates(twice) == ["step_taken:['ep1', 0] attempt 0"]
    rerun = log(
        (STARTED, None), (ASSIGNED, None), (step(0), None),
        (EpisodeAbandoned(episode="ep1", worker="w"), None),
        (ASSIGNED, None), (step(0), None), (FINISHED, None),
    )  # fmt: skip
    assert duplicates(rerun) == []
    assert duplicates([*rerun, *log((FINISHED, None))]) == [
        "episode_finished:['ep1']",
        "seq:0",
    ]


def test_a_request_answered_twice_is_a_duplicate() -> None:
    answered = log((STARTED, None), (request(0), None), (sampled(0), 1))
    assert duplicates(answered) == []
    again = log((STARTED, None), (request(0), None), (sampled(0), 1), (sampled(1), 1))
    assert duplicates(again) == ["answer to seq 1"]


def test_sessions_must_begin_with_their_run_resumed() -> None:
    stopped = RunStopped(reason="signal", signal="SIGINT", exit_code=130)
    first = log((STARTED, None), (step(0), None), (stopped, None))
    resumed = RunResumed(after=2, previous="run_stopped", coevo_version="0")
    final = [*first, *log((resumed, None), (step(1), None))[:2]]
    final = [msgspec.structs.replace(env, seq=n) for n, env in enumerate(final)]
    assert check_sessions(final, [first]) == 1
    assert check_sessions(final, [first, first]) == 1  # a resume stopped before it wrote
    assert Chain(Path("run"), final, [first, first]).counts()["stops_before_first_commit"] == 1
    wrong = [final[0], final[1], final[2], final[4]]
    with pytest.raises(AssertionError):
        check_sessions(wrong, [first])


def test_catches_reads_whether_a_process_handles_a_signal_now() -> None:
    assert catches(0, signal.SIGINT) is None  # no such process
    plain = subprocess.Popen(["sleep", "30"])
    # the interpreter installs its SIGINT handler unless it starts with SIGINT ignored (as a
    # background job of a non-interactive shell does): install it as a terminal's start would
    code = "import signal as s, time; s.signal(s.SIGINT, s.default_int_handler); print(flush=True)"
    python = subprocess.Popen(
        [sys.executable, "-c", f"{code}; time.sleep(30)"], stdout=subprocess.PIPE
    )
    try:
        assert python.stdout is not None and python.stdout.readline() == b"\n"
        assert catches(plain.pid, signal.SIGINT) is False
        assert catches(python.pid, signal.SIGINT) is True  # the interpreter's own handler
        assert catches(python.pid, signal.SIGTERM) is False
    finally:
        plain.kill()
        python.kill()
        plain.wait()
        python.communicate()


def test_an_exit_that_is_not_the_signals_is_refused() -> None:
    site = f"{SITE_INTERRUPTED}: Failed to import the site module\n...\nKeyboardInterrupt\n"
    assert stopped_as_expected(signal.SIGINT, 130, "", caught=True)
    assert stopped_as_expected(signal.SIGKILL, -signal.SIGKILL, "", caught=None)
    # before the interpreter installed its handler, SIGINT's default action ends the process
    assert stopped_as_expected(signal.SIGINT, -signal.SIGINT, "", caught=False)
    assert not stopped_as_expected(signal.SIGINT, -signal.SIGINT, "", caught=True)
    assert not stopped_as_expected(signal.SIGINT, -signal.SIGINT, "", caught=None)
    # a KeyboardInterrupt in CPython's import of site, before coevo's code
    assert stopped_as_expected(signal.SIGINT, 1, site, caught=True)
    assert not stopped_as_expected(signal.SIGINT, 1, "coevo: error: boom", caught=True)
    assert not stopped_as_expected(signal.SIGKILL, 1, site, caught=None)
    assert not stopped_as_expected(signal.SIGKILL, 130, "", caught=None)
