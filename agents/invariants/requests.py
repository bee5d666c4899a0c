"""``requests``: every request is answered exactly once, by an answer about the same thing.

A request and its answer: an action (``action_requested`` -> ``action_sampled``), a retrieval
(``retrieval_requested`` -> ``tips_retrieved``), a reflection (``reflection_requested`` ->
``tip_proposed``), a proposed tip (``tip_proposed`` -> ``tip_stored`` or ``tip_rejected``), an
extraction or a merge chunk (``extraction_requested`` / ``merge_requested`` ->
``extractor_called``), a merge pass (``merge_due`` -> ``merge_planned``, which counts the pass's
chunks), the credit actor's settlement at the run's end (``credits_due`` -> ``credits_settled``,
which counts the extractor update requests before it): the answer's ``cause`` is the request's
seq. An update of either model
(``gradient_requested`` -> ``policy_updated``, ``extractor_gradient_requested`` ->
``extractor_updated``) is answered by the update of the same number, in request order.

While the stream runs, an answer must name a request of its kind about the same episode,
turn, slot or step, answered by nothing before it. By the end of a completed run every request
is answered, except what an attempt that did not finish asked for: its episode was abandoned
(played again) or aborted, and nothing is owed to it (docs/RELIABILITY.md, "Resume"); nor is a
merge pass's plan in a log whose writer did not know ``merge_planned`` (older coevo).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, cast

from agents.events.episodes import EpisodeAbandoned, EpisodeFinished
from agents.events.extractor import (
    CreditsDue,
    CreditsSettled,
    ExtractionRequested,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
    MergeDue,
    MergePlanned,
    MergeRequested,
    subject_of,
)
from agents.events.memory import (
    ReflectionRequested,
    RetrievalRequested,
    TipProposed,
    TipRejected,
    TipsRetrieved,
    TipStored,
)
from agents.events.policy import ActionRequested, ActionSampled, GradientRequested, PolicyUpdated
from engine.events import Envelope, Event
from engine.invariants import CheckContext, InvariantViolated, invariant

Key = Callable[[Any], tuple[object, ...]]

_ASKED: dict[type[Event], Key] = {
    ActionRequested: lambda e: (e.episode, e.turn),
    RetrievalRequested: lambda e: (e.episode, e.turn, e.slot),
    ReflectionRequested: lambda e: (e.episode, e.slot),
    TipProposed: lambda e: (e.episode,),
    ExtractionRequested: subject_of,
    MergeRequested: subject_of,
    MergeDue: lambda e: (e.step,),
    CreditsDue: lambda e: (),
}
"""Requests answered through ``cause``, and what an answer must be about."""

_ANSWERS: dict[type[Event], tuple[tuple[type[Event], ...], Key]] = {
    ActionSampled: ((ActionRequested,), lambda e: (e.episode, e.turn)),
    TipsRetrieved: ((RetrievalRequested,), lambda e: (e.episode, e.turn, e.slot)),
    TipProposed: ((ReflectionRequested,), lambda e: (e.episode, e.slot)),
    ExtractorCalled: ((ExtractionRequested, MergeRequested), subject_of),
    MergePlanned: ((MergeDue,), lambda e: (e.step,)),
    CreditsSettled: ((CreditsDue,), lambda e: ()),
}
"""Answers that must name a request (their ``cause``), of which kinds, about what."""

_BANK = (TipStored, TipRejected)
"""The bank's events: the answer to a proposed tip when their cause is one (one each); an
extractor call's operations otherwise (any number)."""

_UPDATES: dict[type[Event], type[Event]] = {
    GradientRequested: PolicyUpdated,
    ExtractorGradientRequested: ExtractorUpdated,
}


_READ = frozenset(
    {
        *_ASKED,
        *_ANSWERS,
        *_BANK,
        *_UPDATES,
        *_UPDATES.values(),
        EpisodeFinished,
        EpisodeAbandoned,
    }
)


@invariant("requests")
class Requests:
    """Every request is answered exactly once: an action by a sample, a retrieval by its tips,
    a reflection by a tip, a tip by the bank, an extraction or a merge chunk by an extractor
    call, a merge pass by its plan with as many chunks as it caused, the credit actor's
    settlement by its answer counting the extractor update requests before it (each answer's
    cause is its request, about the same episode, turn, slot or step), an update request of
    either model by its update, in order. By the end of a completed run, nothing an attempt
    that finished asked for is left unanswered."""

    name = "requests"

    def __init__(self, ctx: CheckContext | None = None) -> None:
        self._open: dict[int, tuple[type[Event], tuple[object, ...], str]] = {}
        self._answered: dict[int, int] = {}  # request seq -> its answer's seq
        self._proposed: set[int] = set()  # seqs of tip_proposed (the bank answers them)
        self._asked_updates: dict[type[Event], list[tuple[int, int]]] = {
            k: [] for k in _UPDATES
        }  # kind -> (update, seq) not yet made
        self._made: dict[type[Event], int] = {k: 0 for k in _UPDATES.values()}
        # per answer kind, the seq of each update's answer
        self._updated: dict[type[Event], dict[int, int]] = {k: {} for k in _UPDATES.values()}
        self._finished: set[str] = set()
        self._abandoned: dict[str, int] = {}
        self._chunks: Counter[int] = Counter()  # merge_due seq -> merge chunks it caused
        meta = ctx.meta if ctx is not None else None
        self._plans = meta is None or MergePlanned.__struct_config__.tag in meta.event_versions

    def check_many(self, envs: Sequence[Envelope[Event]]) -> None:
        for env in envs:
            kind = type(env.event)
            if kind not in _READ:  # most events: one set lookup
                continue
            if kind in _ANSWERS:
                self._answer(env, *_ANSWERS[kind])
                if kind is MergePlanned:
                    self._planned(env)
                elif kind is CreditsSettled:
                    self._settled(env)
            elif kind in _BANK and env.cause in self._proposed:
                self._answer(env, (TipProposed,), lambda e: (e.episode,))
            if kind in _ASKED:
                ev = env.event
                self._open[env.seq] = (kind, _ASKED[kind](ev), getattr(ev, "episode", ""))
                if kind is TipProposed:
                    self._proposed.add(env.seq)
                elif kind is MergeRequested and env.cause is not None:
                    self._chunks[env.cause] += 1
            elif kind in _UPDATES:
                update: int = getattr(env.event, "update")  # noqa: B009
                self._asked_updates[kind].append((update, env.seq))
            elif kind is PolicyUpdated or kind is ExtractorUpdated:
                self._update(env, kind)
            elif kind is EpisodeFinished:
                self._finished.add(getattr(env.event, "episode"))  # noqa: B009
            elif kind is EpisodeAbandoned:
                self._abandoned[getattr(env.event, "episode")] = env.seq  # noqa: B009

    def _answer(self, env: Envelope[Event], kinds: tuple[type[Event], ...], key: Key) -> None:
        tag, cause = _tag(env.event), env.cause
        if cause is None:
            self._fail(env.seq, f"{tag} names no request (no cause)")
        if cause in self._answered:
            first = self._answered[cause]
            self._fail(
                env.seq,
                f"the request at seq {cause} answered again (first at seq {first})",
                cause,
                first,
            )
        asked = self._open.get(cause)
        if asked is None:
            self._fail(env.seq, f"{tag} answers seq {cause}, which is no open request", cause)
        kind, about, _ = asked
        if kind not in kinds:
            self._fail(env.seq, f"{tag} answers a {_name(kind)} (seq {cause})", cause)
        if key(env.event) != about:
            self._fail(
                env.seq,
                f"{tag} is about {key(env.event)}, its request (seq {cause}) {about}",
                cause,
            )
        del self._open[cause]
        self._answered[cause] = env.seq

    def _planned(self, env: Envelope[Event]) -> None:
        """A pass's plan (answering its ``merge_due``, checked) counts the chunks it caused."""
        due = cast(int, env.cause)
        told: int = getattr(env.event, "requests")  # noqa: B009
        if told != (seen := self._chunks.pop(due, 0)):
            self._fail(
                env.seq, f"merge_planned counts {told} chunks; its merge_due caused {seen}", due
            )

    def _settled(self, env: Envelope[Event]) -> None:
        """The settlement (answering its ``credits_due``, checked) counts the extractor update
        requests before it."""
        told: int = getattr(env.event, "updates")  # noqa: B009
        open_ = len(self._asked_updates[ExtractorGradientRequested])
        if told != (seen := self._made[ExtractorUpdated] + open_):
            self._fail(
                env.seq,
                f"credits_settled counts {told} extractor update requests; the log holds {seen}",
                cast(int, env.cause),
            )

    def _update(self, env: Envelope[Event], kind: type[Event]) -> None:
        request = next(k for k, v in _UPDATES.items() if v is kind)
        asked = self._asked_updates[request]
        update: int = getattr(env.event, "update")  # noqa: B009
        if (first := self._updated[kind].get(update)) is not None:
            self._fail(
                env.seq, f"{_tag(env.event)} of update {update} again (first at seq {first})", first
            )
        if not asked:
            self._fail(env.seq, f"{_tag(env.event)} of update {update}, which was not requested")
        expected, seq = asked[0]
        if update != expected:
            self._fail(
                env.seq,
                f"{_tag(env.event)} of update {update}; the oldest request open is update "
                f"{expected} (seq {seq})",
                seq,
            )
        asked.pop(0)
        self._made[kind] += 1
        self._updated[kind][update] = env.seq

    def finish(self, completed: bool) -> None:
        """A completed run answered every request of an attempt that finished, every merge
        chunk, every merge pass (where its writer planned them) and every update request."""
        if not completed:
            return
        for seq, (kind, _, episode) in self._open.items():
            if kind is MergeDue and not self._plans:
                continue
            if kind in (MergeRequested, MergeDue, CreditsDue) or self._owed(episode, seq):
                self._fail(seq, f"the {_name(kind)} at seq {seq} is never answered")
        for kind, asked in self._asked_updates.items():
            if asked:
                update, seq = asked[0]
                self._fail(seq, f"{_name(kind)} of update {update} is never answered")

    def _owed(self, episode: str, seq: int) -> bool:
        return episode in self._finished and self._abandoned.get(episode, -1) < seq

    def _fail(self, seq: int, detail: str, *involved: int) -> NoReturn:
        raise InvariantViolated(self.name, seq, detail, involved)


def _tag(ev: Event) -> str:
    return str(ev.__struct_config__.tag)


def _name(kind: type[Event]) -> str:
    return str(kind.__struct_config__.tag)
