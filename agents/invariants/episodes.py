"""``episodes``: each episode goes assigned, started, its turns in order, then one end.

An attempt at an episode is assigned (``episode_assigned``), starts (``episode_started``),
takes turns 0, 1, 2, ... (``step_taken``) and ends once, finished or aborted; a resumed run
abandons the attempts its previous session left running (``episode_abandoned``) and assigns
them again. So an episode finishes at most once, nothing ends it twice, nothing is assigned
again after its end, and no turn is taken outside its attempt or out of order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from engine.events import Envelope, Event
from engine.invariants import CheckContext, InvariantViolated, invariant


@dataclass
class _Attempt:
    assigned: int  # seq of its assignment
    started: int = -1  # seq of its start (-1: not yet)
    turns: int = 0
    last: int = -1  # seq of its last turn
    ended: int = -1  # seq of its end (-1: running)


_KINDS = frozenset({EpisodeAssigned, EpisodeStarted, StepTaken, EpisodeFinished, EpisodeAborted})


@invariant("episodes")
class Episodes:
    """An episode finishes at most once: each attempt is assigned, started, takes turns 0, 1,
    2, ... and ends once (finished with as many steps as it took, or aborted); nothing follows
    its end but a reflection or extraction about it, only an abandoned attempt (a resume) is
    assigned again, and a completed run left none running."""

    name = "episodes"

    def __init__(self, ctx: CheckContext | None = None) -> None:
        self._attempts: dict[str, _Attempt] = {}

    def check_many(self, envs: Sequence[Envelope[Event]]) -> None:
        for env in envs:
            ev = env.event
            kind = type(ev)
            if kind in _KINDS:
                self._step(env.seq, ev)
            elif kind is EpisodeAbandoned:
                assert isinstance(ev, EpisodeAbandoned)
                self._abandon(env.seq, ev)

    def _step(self, seq: int, ev: Event) -> None:
        episode: str = getattr(ev, "episode")  # noqa: B009 - every kind of _KINDS has it
        att = self._attempts.get(episode)
        if isinstance(ev, EpisodeAssigned):
            if att is not None:
                state = "ended" if att.ended >= 0 else "is running"
                self._fail(seq, f"{episode} assigned again; its attempt {state}", att)
            self._attempts[episode] = _Attempt(assigned=seq)
            return
        if att is None:
            self._fail(seq, f"{_tag(ev)} of {episode}, which was never assigned", None)
        if att.ended >= 0:
            what = "finishes again" if isinstance(ev, EpisodeFinished) else f"{_tag(ev)}"
            self._fail(seq, f"{episode} {what} after it ended at seq {att.ended}", att)
        if isinstance(ev, EpisodeStarted):
            if att.started >= 0:
                self._fail(seq, f"{episode} started twice in one attempt", att)
            att.started = seq
        elif isinstance(ev, StepTaken):
            if att.started < 0:
                self._fail(seq, f"{episode} takes turn {ev.turn} before it started", att)
            if ev.turn != att.turns:
                self._fail(seq, f"{episode} takes turn {ev.turn}, expected {att.turns}", att)
            att.turns += 1
            att.last = seq
        elif isinstance(ev, EpisodeFinished):
            if att.started < 0:
                self._fail(seq, f"{episode} finishes but never started", att)
            if ev.steps != att.turns:
                self._fail(seq, f"{episode} finishes after {ev.steps} steps, took {att.turns}", att)
            att.ended = seq
        else:  # aborted: at any point of its attempt
            att.ended = seq

    def _abandon(self, seq: int, ev: EpisodeAbandoned) -> None:
        att = self._attempts.get(ev.episode)
        if att is None:
            self._fail(seq, f"{ev.episode} abandoned but never assigned", None)
        if att.ended >= 0:
            self._fail(seq, f"{ev.episode} abandoned after it ended at seq {att.ended}", att)
        del self._attempts[ev.episode]  # the next attempt is assigned afresh

    def _fail(self, seq: int, detail: str, att: _Attempt | None) -> NoReturn:
        involved = () if att is None else (att.assigned, att.started, att.last, att.ended)
        raise InvariantViolated(self.name, seq, detail, (s for s in involved if s >= 0))

    def finish(self, completed: bool) -> None:
        """A completed run left no attempt running."""
        if not completed:
            return
        for episode, att in self._attempts.items():
            if att.ended < 0:
                self._fail(att.assigned, f"{episode} never ended, yet the run completed", att)


def _tag(ev: Event) -> str:
    return str(ev.__struct_config__.tag)
