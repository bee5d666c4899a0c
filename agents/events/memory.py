"""Memory events: EMPO2's tips, from the reflection that wrote them to every retrieval of them.

A tip is born when an env worker asks the policy to reflect on a finished episode
(``ReflectionRequested``); the inference actor answers with the tip's text and token ids
(``TipProposed``); the memory actor stores it (``TipStored``, perhaps evicting the oldest tip of
the slot: ``TipEvicted``) or refuses it (``TipRejected``: an exact duplicate, or empty). Every
``TipProposed`` is followed by exactly one ``TipStored`` or ``TipRejected``.

In tip modes, each turn an env worker asks for tips (``RetrievalRequested``, with the query
text) and the memory actor answers (``TipsRetrieved``: ids, cosine similarities, ranks, texts).

A *slot* is ``"{scope}/{family}/{variant}"`` (Complementary RL: ``"{scope}/{family}"``, one
partition per family): one memory per task variant, and per scope (``"train"`` for training; each
adaptation round on held-out variants has its own scope, so evaluation never reads what another
round wrote).
"""

from __future__ import annotations

import math
from typing import Any

from engine.events import Event, event


def slot_of(scope: str, family: str, variant: int | None = None) -> str:
    """The memory slot of a task variant within ``scope`` (EMPO2), or of a whole family
    (Complementary RL's bank partition) when ``variant`` is None."""
    return f"{scope}/{family}" if variant is None else f"{scope}/{family}/{variant}"


@event
class RetrievalRequested(Event, tag="retrieval_requested", frozen=True, kw_only=True):
    """An env worker asks for the tips of ``slot`` most similar to ``query`` (the turn's
    history as text, tips excluded).

    ``rule`` is "threshold" (EMPO2: the most similar above a threshold, by stored score) or
    "diverse" (Complementary RL: the best ``k`` after re-ranking by rank, retrieval count and
    recent use, no threshold). ``read_only`` (an evaluation episode's retrieval): the answer is
    what a training retrieval would get now, but the pick is not counted, so evaluation never
    changes what training retrieves (a "threshold" retrieval never changes the bank anyway).
    """

    episode: str
    worker: str
    turn: int
    slot: str
    query: str
    rule: str = "threshold"
    k: int = 0
    read_only: bool = False


@event
class TipsRetrieved(Event, tag="tips_retrieved", frozen=True, kw_only=True):
    """The memory's answer to one :class:`RetrievalRequested`.

    Attributes:
        tip_ids: the tips shown, in prompt order: by stored score, descending (EMPO2's rule);
            by re-ranking score, descending (the "diverse" rule, ``scores``).
        similarities: the cosine similarity of each tip's key to the query.
        ranks: each tip's rank by similarity among the candidates (0: most similar).
        tips: the tips' texts.
        similar: EMPO2's rule: how many stored tips passed the similarity threshold (capped
            at ``top_k``), the ``n`` of its intrinsic reward ``1 / (n + 1)``; the "diverse"
            rule: how many candidates the search returned (``pool * k`` at most, no
            threshold).
        slot_size: tips in the slot when it was searched.
        scores: with the "diverse" rule, each tip's re-ranking score.
        calls: the extractor call that wrote each tip ("" for a reflection).
        read_only: the request's: a "diverse" pick that was not counted (the bank's retrieval
            counts and recency are as before it; :meth:`agents.memory.bank.TipBank.evolve` folds it
            as nothing). False in logs written before the field: every pick counted then.
    """

    episode: str
    worker: str
    turn: int
    slot: str
    tip_ids: tuple[int, ...]
    similarities: tuple[float, ...]
    ranks: tuple[int, ...]
    tips: tuple[str, ...]
    similar: int
    slot_size: int
    scores: tuple[float, ...] = ()
    calls: tuple[str, ...] = ()
    read_only: bool = False

    def entries(self) -> list[tuple[int, int, float, float | None, str, str]]:
        """Each entry shown, as (tip id, rank, similarity, re-ranking score or None, text,
        writer call): a malformed answer's missing values (in a log written before ``emit``
        refused one: :meth:`unrecordable`) read -1, NaN, None, "" and ""."""

        def at(items: tuple[Any, ...], i: int, missing: Any) -> Any:
            return items[i] if i < len(items) else missing

        return [
            (
                tip,
                at(self.ranks, i, -1),
                at(self.similarities, i, math.nan),
                at(self.scores, i, None),
                at(self.tips, i, ""),
                at(self.calls, i, ""),
            )
            for i, tip in enumerate(self.tip_ids)
        ]

    def unrecordable(self) -> str:
        """Whether its tuples describe the same tips, each similarity a number and the counts
        not negative: the audit reads them side by side (a plug-in memory's answer with three
        tips and one similarity passed every check and broke it)."""
        n = len(self.tip_ids)
        for name, items, may_be_empty in (
            ("similarities", self.similarities, False),
            ("ranks", self.ranks, False),
            ("tips", self.tips, False),
            ("scores", self.scores, True),
            ("calls", self.calls, True),
        ):
            if len(items) != n and not (may_be_empty and not items):
                return f"{n} tip_ids but {len(items)} {name}"
        if not all(math.isfinite(x) for x in (*self.similarities, *self.scores)):
            return "a similarity or score is not a finite number"
        if self.similar < 0 or self.slot_size < 0:
            return f"similar ({self.similar}) and slot_size ({self.slot_size}) must be >= 0"
        return ""

    @classmethod
    def made_recordable(cls, fields: dict[str, Any]) -> dict[str, Any]:
        """Drawn fields cut or padded to one length, the length of ``tip_ids`` (``scores`` and
        ``calls`` may stay empty), non-finite numbers made 0 and counts made >= 0."""
        n = len(fields["tip_ids"])

        def fit(items: tuple[Any, ...], pad: Any, optional: bool = False) -> tuple[Any, ...]:
            if optional and not items:
                return ()
            return (*items[:n], *(pad,) * (n - len(items)))

        def finite(xs: tuple[float, ...]) -> tuple[float, ...]:
            return tuple(x if math.isfinite(x) else 0.0 for x in xs)

        return {
            **fields,
            "similarities": finite(fit(fields["similarities"], 0.0)),
            "ranks": fit(fields["ranks"], 0),
            "tips": fit(fields["tips"], ""),
            "scores": finite(fit(fields.get("scores", ()), 0.0, optional=True)),
            "calls": fit(fields.get("calls", ()), "", optional=True),
            "similar": max(fields["similar"], 0),
            "slot_size": max(fields["slot_size"], 0),
        }


@event
class ReflectionRequested(Event, tag="reflection_requested", frozen=True, kw_only=True):
    """An env worker asks the policy to reflect on finished episode ``episode``.

    ``messages`` is the reflection prompt; ``key`` the text the tip will be found by (the
    episode's final state, rendered like a turn's query); ``score`` the episode's final score,
    stored with the tip and used to order retrieved tips.
    """

    episode: str
    worker: str
    slot: str
    messages: tuple[tuple[str, str], ...]
    key: str
    score: float
    success: bool
    seed: int


@event
class TipProposed(Event, tag="tip_proposed", frozen=True, kw_only=True):
    """The policy's reflection on ``episode``: the tip text and how it was sampled;
    ``prompt_cut``: how many tokens the prompt lost from its middle to fit the model's
    positions (``agents.models.prompts.cut_middle``; 0: none)."""

    episode: str
    slot: str
    key: str
    score: float
    text: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    token_logps: tuple[float, ...]
    temperature: float
    policy_version: int
    prompt_cut: int = 0


@event
class TipStored(Event, tag="tip_stored", frozen=True, kw_only=True):
    """Tip ``tip_id`` (numbered in storing order, from 0) entered ``slot``.

    ``call`` is the extractor call that wrote it ("" for a reflection, whose ``episode`` says
    which episode it was about); ``parents`` the entries it replaced (an update or a merge).
    """

    tip_id: int
    slot: str
    episode: str
    text: str
    score: float
    key: str
    call: str = ""
    parents: tuple[int, ...] = ()


@event
class TipEvicted(Event, tag="tip_evicted", frozen=True, kw_only=True):
    """Tip ``tip_id`` left ``slot``: "fifo" (the slot was full and it was the oldest), or
    "update", "merge", "rewrite", "discard" (an extractor call replaced or dropped it)."""

    tip_id: int
    slot: str
    reason: str = "fifo"


@event
class TipRejected(Event, tag="tip_rejected", frozen=True, kw_only=True):
    """The reflection on ``episode`` (or an operation of extractor ``call``) was not applied:
    ``reason`` is "duplicate" (the slot holds the same text; ``duplicate_of`` names that tip),
    "empty", or "gone" (an operation named entries no longer in the bank)."""

    episode: str
    slot: str
    reason: str
    duplicate_of: int = -1
    call: str = ""
