"""Which episodes' requests a rebuilt actor still owes an answer: on resume, those of attempts
that finished (``finished_attempts``); restarted mid-run, those of attempts still running in
this session too (``live_attempts``)."""

from __future__ import annotations

from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeFinished,
    finished_attempts,
    live_attempts,
)
from engine.events import Envelope, Event
from engine.lifecycle import RunResumed


def finished(episode: str) -> EpisodeFinished:
    return EpisodeFinished(
        episode=episode, worker="w", family="f", variant=0, split="train", steps=1,
        score=1.0, success=True, total_reward=1.0,
    )  # fmt: skip


def log(events: dict[int, Event]) -> list[Envelope[Event]]:
    return [Envelope(seq=s, run="r", t=0, actor="a", event=ev) for s, ev in events.items()]


HISTORY = log(
    {
        3: finished("done"),  # asked at 1, finished
        5: EpisodeAbandoned(episode="lost", worker="w"),  # asked at 4, abandoned; re-asked at 8
        6: RunResumed(after=5),
        10: EpisodeAbandoned(episode="old", worker="w"),  # asked at 2 (before the resume)
    }
)

ASKED = [("done", 1), ("old", 2), ("lost", 4), ("lost", 8), ("running", 7), ("before", 2)]


def test_a_restarted_actor_owes_the_running_attempts_of_this_session_too() -> None:
    on_resume = finished_attempts(HISTORY)
    on_restart = live_attempts(HISTORY)
    assert [on_resume(ep, seq) for ep, seq in ASKED] == [True, False, False, False, False, False]
    assert [on_restart(ep, seq) for ep, seq in ASKED] == [True, False, False, True, True, False]
