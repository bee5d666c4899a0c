"""``replay --verify`` finds a fact recorded twice: what two writers on one run leave behind
(each record intact, each checksum right)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agents.events.episodes import EpisodeAssigned, EpisodeFinished, EpisodeStarted
from agents.events.policy import ActionRequested, ActionSampled
from agents.testing.events import action_sampled, episode_finished
from engine.eventlog import MemoryEventLog
from engine.events import Envelope, Event
from engine.lifecycle import RunResumed, RunStarted, RunStopped
from engine.projection import ActorStats
from engine.replay import verify_log
from scenarios.assemble import fact_checks, projections

START = RunStarted(run_id="r", scenario="s", scenario_hash="h", seed=1, coevo_version="0")


def finished(episode: str) -> EpisodeFinished:
    return episode_finished(
        episode,
        worker="worker-0",
        family="fetch",
        variant=1,
        steps=0,
        score=1.0,
        success=True,
        total_reward=1.0,
    )


def begun(episode: str) -> list[Event]:
    """An episode assigned and started (what a well-formed log holds before its end)."""
    return [
        EpisodeAssigned(
            episode=episode,
            index=0,
            worker="worker-0",
            family="fetch",
            variant=1,
            split="train",
            seed=1,
        ),
        EpisodeStarted(
            episode=episode, worker="worker-0", goal="g", observation="o", admissible=("look",)
        ),
    ]


def requested() -> ActionRequested:
    return ActionRequested(
        episode="ep000001",
        worker="worker-0",
        turn=0,
        messages=(("user", "o"),),
        admissible=("look",),
        seed=1,
    )


def sampled() -> ActionSampled:
    return action_sampled(
        "ep000001",
        0,
        worker="worker-0",
        action="look",
        prompt_ids=(1,),
        response_ids=(2,),
        token_logps=(-0.5,),
        logp=-0.5,
    )


def log_of(events: Sequence[Event | tuple[Event, int]]) -> MemoryEventLog:
    """A log of ``events`` (an ``(event, cause)`` pair sets the cause)."""
    log = MemoryEventLog()
    envs: list[Envelope[Event]] = []
    for seq, item in enumerate(events):
        ev, cause = item if isinstance(item, tuple) else (item, None)
        envs.append(Envelope(seq=seq, run="r", t=seq, actor="a", event=ev, cause=cause, v=1))
    log.append(envs)
    return log


def verify(events: Sequence[Event | tuple[Event, int]]) -> str:
    result = verify_log(log_of(events), projections(), fact_checks())
    return "ok" if result.ok else result.error


def test_a_consistent_log_verifies() -> None:
    resumed = RunResumed(after=4, previous="run_stopped")
    events = [
        START,
        *begun("ep0"),
        finished("ep0"),
        RunStopped(reason="signal"),
        resumed,
        *begun("ep1"),
        finished("ep1"),
    ]
    assert verify([*events, RunStopped(reason="completed")]) == "ok"


@pytest.mark.parametrize(
    ("events", "says"),
    [
        (
            [START, *begun("ep0"), finished("ep0"), finished("ep0")],
            "ep0 finishes again after it ended at seq 3",
        ),
        (
            [START, *begun("ep000001"), requested(), (sampled(), 3), (sampled(), 3)],
            "the request at seq 3 answered again",
        ),
        (
            [START, RunResumed(after=0), RunResumed(after=0)],
            "a second run_resumed after seq 0 (the first at seq 1)",
        ),
        ([START, *begun("ep0"), RunResumed(after=0)], "not the first event of its session"),
        ([START, RunStopped(reason="completed"), begun("ep0")[0]], "after the run completed"),
        ([START, START], "run_started again"),
    ],
    ids=[
        "finished twice",
        "answered twice",
        "resumed twice",
        "stale resume",
        "after the end",
        "started twice",
    ],
)
def test_a_fact_recorded_twice_fails_verify_at_its_seq(
    events: list[Event | tuple[Event, int]], says: str
) -> None:
    result = verify_log(log_of(events), projections(), fact_checks())
    assert not result.ok
    assert result.first_bad_seq == len(events) - 1
    assert says in result.error
    assert result.error.startswith(f"event log inconsistent at seq {len(events) - 1}: ")


def test_an_answer_given_twice_lists_both_answers() -> None:
    """The violation named the first answer's seq but listed only the request and the second
    answer among its events."""
    from agents.invariants.requests import Requests
    from engine.invariants import check_stream

    log = log_of([START, *begun("ep000001"), requested(), (sampled(), 3), (sampled(), 3)])
    report = check_stream([list(log.read())], [Requests()])
    assert report.violation is not None
    assert "answered again (first at seq 4)" in report.violation.message
    assert set(report.violation.involved) >= {3, 4, 5}


def test_the_engine_checks_its_sessions_without_domain_checks() -> None:
    result = verify_log(log_of([START, RunResumed(after=0), RunResumed(after=0)]), [ActorStats()])
    assert not result.ok and "a second run_resumed" in result.error


class Broken:
    """A plug-in's invariant with a bug in ``check_many`` (or, with ``at_finish``, in
    ``finish``)."""

    name = "broken"

    def __init__(self, at_finish: bool = False) -> None:
        self.at_finish = at_finish

    def check_many(self, envs: Sequence[Envelope[Event]]) -> None:
        if not self.at_finish:
            raise KeyError("bug in my invariant")

    def finish(self, completed: bool) -> None:
        raise RuntimeError("bug in finish")


@pytest.mark.parametrize("at_finish", [False, True])
def test_an_invariant_with_a_bug_is_one_error_naming_it_not_a_traceback(at_finish: bool) -> None:
    from engine.invariants import InvariantBroken, check_stream

    log = log_of([START, *begun("ep000001")])
    says = "bug in finish" if at_finish else "'bug in my invariant'"
    with pytest.raises(InvariantBroken, match=f"invariant broken raised .*{says}"):
        verify_log(log, projections(), (Broken(at_finish),))
    with pytest.raises(InvariantBroken, match="a bug in the invariant, not a finding"):
        check_stream([list(log.read())], [Broken(at_finish)])  # type: ignore[list-item]


class CannotJudge:
    """Finds that it cannot judge the stream at its ``at``-th ``check_many`` (None: at its
    ``finish``); counts its calls."""

    name = "judge"

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.chunks = 0
        self.calls = 0

    def check_many(self, envs: Sequence[Envelope[Event]]) -> None:
        self.calls += 1
        self.chunks += 1
        if self.chunks - 1 == self.at:
            self._cannot()

    def finish(self, completed: bool) -> None:
        self.calls += 1
        if self.at is None:
            self._cannot()

    def _cannot(self) -> None:
        from engine.invariants import InvariantUncheckable

        raise InvariantUncheckable(self.name, "its code fails on these events now")


@pytest.mark.parametrize("at", [0, None])
def test_an_invariant_that_cannot_judge_is_left_out_and_the_others_go_on(at: int | None) -> None:
    """A plug-in method's ``score`` that fails now made ``check`` and ``verify`` call a sound
    log inconsistent (at its last kept event): an invariant that cannot judge the stream is
    listed as not checked, asked nothing more, and the others still check (a fact twice after
    it is still found)."""
    from engine.invariants import check_stream, registered

    events = [START, *begun("ep0"), finished("ep0"), RunStopped(reason="completed")]
    log = log_of(events)
    envs = list(log.read())
    said = "judge: its code fails on these events now"
    judge = CannotJudge(at)
    report = check_stream([envs], [judge])  # type: ignore[list-item]
    assert report.ok and report.invariants == () and report.skipped == ()
    assert report.uncheckable == (said,)
    assert judge.calls == (2 if at is None else 1)  # asked nothing after it said so
    judge = CannotJudge(at)
    result = verify_log(log, projections(), (judge,))
    assert result.ok and result.uncheckable == (said,), result
    assert judge.calls == (2 if at is None else 1)
    twice = [*envs[:4], envs[3].__replace__(seq=4), envs[4].__replace__(seq=5)]
    once = registered()["recorded-once"].factory(None)  # type: ignore[arg-type]
    report = check_stream([twice[:2], twice[2:]], [CannotJudge(at), once])  # type: ignore[list-item]
    assert report.violation is not None and report.violation.invariant == "recorded-once"
    if at == 0:  # left out before the violation: not among those checked
        assert report.invariants == ("recorded-once",) and report.uncheckable == (said,)


def test_a_check_that_checked_nothing_says_so() -> None:
    """``check --invariant credit`` whose credit could not judge the run printed "hold 0
    invariants: " (an empty list), and its note "not checked: credit: not checked: ..."."""
    from engine.invariants import CheckReport
    from scenarios.cli.check import _lines  # pyright: ignore[reportPrivateUsage]

    report = CheckReport(events=9, invariants=(), completed=True, uncheckable=("credit: why",))
    assert _lines("R", report, []) == [
        "R: 9 events (completed): no invariant was checked",
        "  not checked: credit: why",
    ]


def test_an_update_answered_twice_is_said_to_be_answered_again() -> None:
    """A second ``policy_updated`` of update 0 read "which was not requested": it was, and
    answered before."""
    from agents.invariants.requests import Requests
    from agents.learning.trainer import gradient_request
    from agents.methods.settings import GrpoConfig
    from agents.testing.events import policy_updated
    from engine.invariants import check_stream

    asked = gradient_request(GrpoConfig(), 0, (), ())
    log = log_of([START, asked, (policy_updated(1), 1), (policy_updated(1), 1)])
    report = check_stream([list(log.read())], [Requests()])
    assert report.violation is not None
    assert report.violation.seq == 3
    assert "policy_updated of update 0 again (first at seq 2)" in report.violation.message
    assert 2 in report.violation.involved


def test_an_entry_whose_call_is_recorded_after_it_is_not_said_never_recorded() -> None:
    """The call an entry names, recorded only after the entry, read "never recorded"."""
    from agents.events.memory import TipStored
    from agents.invariants.memory import Lineage
    from agents.testing.events import extractor_called
    from engine.invariants import check_stream

    stored = TipStored(tip_id=0, slot="s", episode="", text="t", score=0.0, key="k", call="x9")
    called = extractor_called("x9")
    report = check_stream([list(log_of([START, stored, called]).read())], [Lineage()])
    assert report.violation is not None
    assert "entry 0 written by call 'x9', not recorded before it" in report.violation.message


@pytest.mark.parametrize("cause", [5, 3, -3])
def test_verify_refuses_a_cause_that_is_not_an_earlier_event(cause: int) -> None:
    """An envelope appended through the API whose cause was a later event, itself or negative
    verified "ok" (``coevo check`` found it as ``numbering``)."""
    events: list[Event | tuple[Event, int]] = [START, *begun("ep000001"), (requested(), cause)]
    result = verify_log(log_of([*events, RunStopped(reason="stopped")]), projections())
    assert not result.ok and result.first_bad_seq == 3
    assert f"numbering: its cause is seq {cause}, not an earlier event" in result.error
