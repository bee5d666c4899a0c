"""Domain projections: pure folds of episode events into tables a researcher can query.

``EpisodeTable`` holds one row per episode (who ran it, on what, how it ended) and a summary per
task family; it is what ``coevo replay`` prints and what the run's checksums cover.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from engine.events import Envelope, Event


class EpisodeRow(msgspec.Struct, kw_only=True):
    """One episode as the log tells it."""

    index: int
    worker: str
    family: str
    variant: int
    split: str
    seed: int
    purpose: str
    status: str = "assigned"
    steps: int = 0
    score: float = 0.0
    total_reward: float = 0.0
    success: bool = False
    assigned_seq: int = -1
    ended_seq: int = -1


class FamilyRow(msgspec.Struct, kw_only=True):
    """Outcome counts of one task family."""

    episodes: int = 0
    successes: int = 0
    aborted: int = 0
    steps: int = 0


class EpisodeTableState(msgspec.Struct, kw_only=True):
    """State of :class:`EpisodeTable`."""

    episodes: dict[str, EpisodeRow] = msgspec.field(default_factory=dict)
    families: dict[str, FamilyRow] = msgspec.field(default_factory=dict)
    steps: int = 0


class EpisodeTable:
    """Every episode's row, and per-family success counts."""

    name = "episodes"
    state_type = EpisodeTableState

    def initial(self) -> EpisodeTableState:
        return EpisodeTableState()

    def evolve_many(
        self, state: EpisodeTableState, envs: Sequence[Envelope[Event]]
    ) -> EpisodeTableState:
        handlers = _HANDLERS
        for env in envs:
            handler = handlers.get(type(env.event))
            if handler is not None:
                handler(state, env.event, env.seq)
        return state


def _step(state: EpisodeTableState, ev: StepTaken, seq: int) -> None:
    state.steps += 1
    row = state.episodes.get(ev.episode)
    if row is not None:
        row.steps = ev.turn + 1


def _assign(state: EpisodeTableState, ev: EpisodeAssigned, seq: int) -> None:
    state.episodes[ev.episode] = EpisodeRow(
        index=ev.index,
        worker=ev.worker,
        family=ev.family,
        variant=ev.variant,
        split=ev.split,
        seed=ev.seed,
        purpose=ev.purpose,
        assigned_seq=seq,
    )


def _start(state: EpisodeTableState, ev: EpisodeStarted, seq: int) -> None:
    row = state.episodes.get(ev.episode)
    if row is not None and row.status == "assigned":
        row.status = "running"


def _finish(state: EpisodeTableState, ev: EpisodeFinished, seq: int) -> None:
    row = state.episodes.get(ev.episode)
    if row is None or row.status in ("finished", "aborted"):
        return
    row.status = "finished"
    row.steps = ev.steps
    row.score = ev.score
    row.total_reward = ev.total_reward
    row.success = ev.success
    row.ended_seq = seq
    fam = state.families.setdefault(row.family, FamilyRow())
    fam.episodes += 1
    fam.successes += int(ev.success)
    fam.steps += ev.steps


def _abort(state: EpisodeTableState, ev: EpisodeAborted, seq: int) -> None:
    row = state.episodes.get(ev.episode)
    if row is None or row.status in ("finished", "aborted"):
        return
    row.status = "aborted"
    row.ended_seq = seq
    state.families.setdefault(row.family, FamilyRow()).aborted += 1


def _abandon(state: EpisodeTableState, ev: EpisodeAbandoned, seq: int) -> None:
    """A resumed run re-runs the episode; its row says so until it is assigned again."""
    row = state.episodes.get(ev.episode)
    if row is not None and row.status in ("assigned", "running"):
        row.status = "abandoned"


_HANDLERS: dict[type[Event], Callable[[EpisodeTableState, Any, int], None]] = {
    StepTaken: _step,
    EpisodeAssigned: _assign,
    EpisodeStarted: _start,
    EpisodeFinished: _finish,
    EpisodeAborted: _abort,
    EpisodeAbandoned: _abandon,
}
