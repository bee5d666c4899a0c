"""Facts a run records at most once, checked by ``coevo replay --verify``.

An episode finishes once (an abandoned attempt never finishes; its re-run does), each policy
and extractor version, each update's request, each group's advantages, each stored entry and
each extractor call appear once, and each request is answered once (an action, a retrieval, a
reflection, an extraction). A log that breaks one of these was written by two sessions that
did not see each other's events (see docs/RELIABILITY.md, "Two writers"); its records and
checksums can all be intact.
"""

from __future__ import annotations

from collections.abc import Sequence

from agents.events.episodes import EpisodeFinished
from agents.events.extractor import (
    CreditAssigned,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
)
from agents.events.memory import TipProposed, TipsRetrieved, TipStored
from agents.events.policy import (
    ActionSampled,
    AdvantagesComputed,
    GradientRequested,
    PolicyUpdated,
)
from engine.events import Envelope, Event
from engine.invariants import CheckContext, InvariantViolated

_ONCE: dict[type[Event], str] = {
    EpisodeFinished: "episode",
    PolicyUpdated: "policy_version",
    GradientRequested: "update",
    AdvantagesComputed: "group",
    TipStored: "tip_id",
    ExtractorCalled: "call",
    ExtractorUpdated: "extractor_version",
    ExtractorGradientRequested: "update",
    CreditAssigned: "episode",
}
"""The events that record a fact once, with the field that names the fact."""

_ANSWERS: frozenset[type[Event]] = frozenset(
    {ActionSampled, TipsRetrieved, TipProposed, ExtractorCalled}
)
"""Answers to one request each (their ``cause`` is the request's seq)."""


class RecordedOnce:
    """Facts a run records at most once: an episode's end, a policy or extractor version, an
    update's request, a group's advantages, a stored entry, an extractor call, a credited
    episode; and no request answered twice. An :class:`~engine.invariants.Invariant` (registered
    as ``recorded-once`` by :mod:`agents.invariants`); pure, one instance per pass."""

    name = "recorded-once"

    def __init__(self, ctx: CheckContext | None = None) -> None:
        self._seen: dict[tuple[type[Event], object], int] = {}
        self._answered: dict[int, int] = {}

    def check_many(self, envs: Sequence[Envelope[Event]]) -> None:
        """Raises :class:`InvariantViolated` at the first event that repeats a fact."""
        seen, answered = self._seen, self._answered
        for env in envs:
            kind = type(env.event)
            field = _ONCE.get(kind)
            if field is not None:
                fact = (kind, getattr(env.event, field))
                if fact in seen:
                    tag = kind.__struct_config__.tag
                    raise InvariantViolated(
                        self.name,
                        env.seq,
                        f"{tag} with {field} {fact[1]!r} again (first at seq {seen[fact]})",
                        (seen[fact],),
                    )
                seen[fact] = env.seq
            if kind in _ANSWERS and env.cause is not None:
                if env.cause in answered:
                    raise InvariantViolated(
                        self.name,
                        env.seq,
                        f"the request at seq {env.cause} answered again (first at seq "
                        f"{answered[env.cause]})",
                        (env.cause, answered[env.cause]),
                    )
                answered[env.cause] = env.seq

    def finish(self, completed: bool) -> None:
        return None
