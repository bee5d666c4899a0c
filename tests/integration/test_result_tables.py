"""The scripts that write docs/RESULTS.md's tables (``bench/headline.py``,
``bench/method_results.py``, ``bench/headline_logs.py``) count what the run counted: an
aborted episode is a failure there as in the trainer and the held-out rounds."""

from __future__ import annotations

from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    episode_success,
)
from agents.events.policy import EvalRoundFinished, EvalRoundStarted
from engine.events import Event
from tests.integration.bench_import import load_bench


def _assigned(i: int, purpose: str = "eval") -> EpisodeAssigned:
    return EpisodeAssigned(
        episode=f"ep{i:06d}", index=i, worker="w", family="heat", variant=i, split="test",
        seed=i, purpose=purpose,
    )  # fmt: skip


def _finished(i: int, success: bool, purpose: str = "eval") -> EpisodeFinished:
    return EpisodeFinished(
        episode=f"ep{i:06d}", worker="w", family="heat", variant=i, split="test", steps=3,
        score=float(success), success=success, total_reward=float(success), purpose=purpose,
    )  # fmt: skip


def _round() -> list[Event]:
    """A held-out round of four episodes: one success, one failure, two aborted (one of
    them abandoned first and run again to its abort)."""
    return [
        EvalRoundStarted(round=0, policy_version=0, episodes=4),
        *(_assigned(i) for i in range(4)),
        _finished(0, True),
        _finished(1, False),
        EpisodeAbandoned(episode="ep000002", worker="w", purpose="eval"),
        EpisodeAborted(episode="ep000002", worker="w", reason="the world failed", purpose="eval"),
        EpisodeAborted(episode="ep000003", worker="w", reason="the world failed", purpose="eval"),
        EvalRoundFinished(
            round=0, policy_version=0, episodes=4, success=0.25, score=0.25, train_episodes=0
        ),
    ]


def test_an_aborted_episode_is_a_failure_and_an_episode_keeps_its_last_end() -> None:
    events = [_assigned(9, "train"), _finished(9, True, "train")]
    events += [EpisodeAborted(episode="ep000009", worker="w", reason="x")]  # ended again
    assert episode_success([*_round(), *events]) == {
        "ep000000": True,
        "ep000001": False,
        "ep000002": False,
        "ep000003": False,
        "ep000009": False,
    }


def test_the_results_scripts_count_aborted_held_out_episodes_as_failures() -> None:
    """An outside tester's world aborted 9 of 30 held-out episodes: the log said 2 of 30,
    headline.py 2 of 21 and method_results.py 1 of 7 of the hard family."""
    events = _round()
    final = load_bench("headline").final_of(events)
    assert sorted(ok for _, ok in final.plain) == [False, False, False, True]
    facts = load_bench("method_results").fold("grpo", 0, events, 1.0)
    assert facts.family_success(0, ("heat",)) == (1, 4)
    assert facts.rounds == [(0, 0, 0.25)]  # what the round itself said
