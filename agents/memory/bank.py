"""EMPO2's and Complementary RL's tip bank, the pure core of the memory
(:class:`TipBank`): slots of at most ``capacity`` tips each (FIFO eviction, exact-text dedup
per slot), each slot a vector index over the tips' keys. It takes vectors, never
text-to-vector calls, and turns each message into the events that record it, so the bank is a
fold of its own events. The actor around it (embedding, batching, answering) is
:class:`agents.memory.memory_actor.MemoryActor`.

Retrieval follows EMPO2's released code: the ``top_k`` tips most similar to the query, those
with cosine similarity above ``threshold`` kept, shown ordered by their stored score
(descending; ties by similarity). Complementary RL's "diverse" rule counts each pick (retrieval
counts, recency) except for a read-only request (an evaluation episode's), so evaluation never
changes what training retrieves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import numpy as np

from agents.events.extractor import ExtractorCalled
from agents.events.memory import (
    RetrievalRequested,
    TipEvicted,
    TipProposed,
    TipRejected,
    TipsRetrieved,
    TipStored,
)
from agents.methods.credit import diversified_scores
from engine.events import Event
from stores.tip_index import VectorIndex, make_index


@dataclass(frozen=True)
class MemorySettings:
    """The bank's rules (a scenario's memory keys).

    Attributes:
        capacity: tips per slot; the oldest is evicted beyond it.
        threshold: "threshold" rule: a tip is retrieved only if its cosine similarity to the
            query is above it.
        top_k: "threshold" rule: most tips retrieved per query.
        index: "usearch" or "exact" (brute force).
        lam: "diverse" rule: weight of the retrieval-count penalty.
        recent: "diverse" rule: an entry picked in the slot's last ``recent`` retrievals is
            penalised by 1.
        pool: "diverse" rule: candidates re-ranked per entry asked for.
    """

    capacity: int = 1000
    threshold: float = 0.5
    top_k: int = 10
    index: Literal["usearch", "exact"] = "usearch"
    lam: float = 0.4
    recent: int = 8
    pool: int = 16

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.top_k < 1 or self.pool < 1:
            raise ValueError(f"capacity, top_k and pool must be >= 1, got {self}")
        if not -1.0 <= self.threshold < 1.0:
            raise ValueError(f"threshold must be in [-1, 1), got {self.threshold}")
        if self.lam < 0 or self.recent < 0:
            raise ValueError(f"lam and recent must be >= 0, got {self}")


@dataclass(slots=True)
class Tip:
    """One stored tip (an EMPO2 reflection or an extractor-written entry)."""

    tip_id: int
    slot: str
    text: str
    score: float
    episode: str
    call: str = ""
    parents: tuple[int, ...] = ()
    retrieved: int = 0
    last_pick: int = -(10**9)  # the slot's retrieval number when last picked


@dataclass
class _Slot:
    index: VectorIndex
    order: deque[int] = field(default_factory=deque[int])  # FIFO, oldest first
    by_text: dict[str, int] = field(default_factory=dict[str, int])
    retrievals: int = 0


REPLACING = {"update": "update", "merge": "merge", "rewrite": "rewrite"}


class TipBank:
    """Every slot's tips and index.

    Args:
        settings: the bank's rules.
        dim: the embedding dimension.
    """

    def __init__(self, settings: MemorySettings, dim: int) -> None:
        self.settings = settings
        self.dim = dim
        self.tips: dict[int, Tip] = {}
        self._slots: dict[str, _Slot] = {}
        self._next_id = 0

    def size(self, slot: str) -> int:
        """Tips in ``slot`` now."""
        s = self._slots.get(slot)
        return len(s.order) if s else 0

    def entries(self, slot: str) -> list[int]:
        """The ids of ``slot``'s tips, oldest first."""
        s = self._slots.get(slot)
        return list(s.order) if s else []

    def slots(self) -> list[str]:
        """Every slot that holds a tip, in order of creation."""
        return [name for name, s in self._slots.items() if s.order]

    def store(self, tip: TipProposed, vector: np.ndarray) -> list[Event]:
        """Store a reflection under its key's ``vector`` (dim,); the events that record it.

        Returns:
            ``[TipRejected]`` for an empty or duplicate text, else ``[TipStored]`` followed by
            ``TipEvicted`` when the slot was full.
        """
        return self._insert(
            Tip(-1, tip.slot, tip.text.strip(), tip.score, tip.episode), tip.key, vector
        )

    def apply(self, called: ExtractorCalled, vectors: Sequence[np.ndarray]) -> list[Event]:
        """Apply an extractor call's operations in order; ``vectors`` embed the content of
        each operation that has one (add, update, merge, rewrite), in order.

        The entries an operation replaces are evicted first, then its content is stored. An
        operation naming an entry that is no longer in the slot is refused with
        ``TipRejected(reason="gone")``; a content already in the slot with "duplicate" (its
        replaced entries stay evicted: the bank already says it).
        """
        events: list[Event] = []
        contents = iter(vectors)
        for op, ids, content in called.ops:
            vec = next(contents) if op != "discard" and op != "return" else None
            if op == "return":
                continue
            ids = tuple(dict.fromkeys(ids))  # the parser refuses repeated ids; never evict twice
            gone = [i for i in ids if i not in self.tips or self.tips[i].slot != called.slot]
            if gone:
                events.append(self._refused(called, "gone"))
                continue
            events += [self._evict(i, REPLACING.get(op, "discard")) for i in ids]
            if op != "discard":
                assert vec is not None
                tip = Tip(-1, called.slot, content.strip(), 0.0, called.source, called.call, ids)
                events += self._insert(tip, content, vec)
        return events

    def retrieve(self, req: RetrievalRequested, vector: np.ndarray) -> TipsRetrieved:
        """The tips of ``req.slot`` for the query embedded as ``vector`` (dim,)."""
        if req.rule == "diverse":
            return self._diverse(req, vector)
        slot = self._slots.get(req.slot)
        found: list[tuple[int, float]] = []
        if slot is not None and slot.order:
            hits = slot.index.search(vector.reshape(1, -1).astype(np.float32), self.settings.top_k)
            found = [(key, sim) for key, sim in hits[0] if sim > self.settings.threshold]
        # found is by similarity (rank order); show by stored score, then by rank
        shown = sorted(range(len(found)), key=lambda r: (-self.tips[found[r][0]].score, r))
        return self._answer(req, [found[r] for r in shown], list(shown), len(found))

    def _diverse(self, req: RetrievalRequested, vector: np.ndarray) -> TipsRetrieved:
        """Complementary RL's pick: ``k`` of the ``pool * k`` most similar, re-ranked by
        ``-rank - lam * log(1 + retrieved) - [picked in the last `recent` retrievals]``. The
        pick counts (retrieval counts, recency) unless the request is read-only."""
        slot = self._slots.get(req.slot)
        k = max(req.k, 1)
        if slot is None or not slot.order:
            return self._answer(req, [], [], 0)
        hits = slot.index.search(vector.reshape(1, -1).astype(np.float32), self.settings.pool * k)
        found = hits[0]
        tips = [self.tips[key] for key, _ in found]
        recent = [slot.retrievals - t.last_pick < self.settings.recent for t in tips]
        scores = diversified_scores(
            list(range(len(found))), [t.retrieved for t in tips], recent, lam=self.settings.lam
        )
        picked = sorted(range(len(found)), key=lambda r: (-scores[r], r))[:k]
        if not req.read_only:
            self._count(slot, [tips[r] for r in picked])
        answer = self._answer(req, [found[r] for r in picked], picked, len(found))
        return msgspec.structs.replace(answer, scores=tuple(scores[r] for r in picked))

    def _answer(
        self,
        req: RetrievalRequested,
        shown: list[tuple[int, float]],
        ranks: list[int],
        similar: int,
    ) -> TipsRetrieved:
        return TipsRetrieved(
            episode=req.episode,
            worker=req.worker,
            turn=req.turn,
            slot=req.slot,
            tip_ids=tuple(key for key, _ in shown),
            similarities=tuple(sim for _, sim in shown),
            ranks=tuple(ranks),
            tips=tuple(self.tips[key].text for key, _ in shown),
            similar=similar,
            slot_size=self.size(req.slot),
            calls=tuple(self.tips[key].call for key, _ in shown),
            read_only=req.read_only,
        )

    def evolve(self, ev: Event, vector: np.ndarray | None = None) -> None:
        """Apply an event this bank emitted, rebuilding the bank from the log (a resumed
        run); ``vector`` (dim,) embeds a :class:`TipStored`'s key. A retrieval from a slot
        that held tips prepares its index as its search did (:meth:`VectorIndex.prepare`: an
        HNSW graph is built where the run built it); one with "diverse" scores, not read-only,
        counts its picks. Events that change nothing (:class:`TipRejected`, a merge request)
        are ignored.

        Raises:
            ValueError: ``ev`` does not follow from the bank's state (a tip id out of order,
                an eviction of a tip the bank does not hold).
        """
        if isinstance(ev, TipStored):
            if ev.tip_id != self._next_id or vector is None:
                raise ValueError(f"tip {ev.tip_id} stored; the bank's next id is {self._next_id}")
            self._next_id += 1
            tip = Tip(ev.tip_id, ev.slot, ev.text, ev.score, ev.episode, ev.call, ev.parents)
            self._place(tip, vector)
        elif isinstance(ev, TipEvicted):
            if ev.tip_id not in self.tips:
                raise ValueError(f"tip {ev.tip_id} evicted, but the bank does not hold it")
            self._evict(ev.tip_id, ev.reason)
        elif isinstance(ev, TipsRetrieved):
            slot = self._slots.get(ev.slot)
            if slot is not None and ev.slot_size:
                slot.index.prepare()
            if ev.scores and not ev.read_only:
                self._count(self._slots[ev.slot], [self.tips[key] for key in ev.tip_ids])

    def graphs(self) -> list[str]:
        """The slots whose index has built a structure that every vector it then held or took
        since shaped (an HNSW graph, :attr:`UsearchIndex.has_graph`)."""
        return [name for name, s in self._slots.items() if getattr(s.index, "has_graph", False)]

    @staticmethod
    def _count(slot: _Slot, picked: list[Tip]) -> None:
        """A "diverse" pick of ``picked`` counts: one more retrieval of the slot, and of each."""
        slot.retrievals += 1
        for tip in picked:
            tip.retrieved += 1
            tip.last_pick = slot.retrievals

    def _insert(self, tip: Tip, key: str, vector: np.ndarray) -> list[Event]:
        if not tip.text:
            return [TipRejected(episode=tip.episode, slot=tip.slot, reason="empty", call=tip.call)]
        slot = self._slots.get(tip.slot)
        if slot is not None and tip.text in slot.by_text:
            return [
                TipRejected(
                    episode=tip.episode,
                    slot=tip.slot,
                    reason="duplicate",
                    duplicate_of=slot.by_text[tip.text],
                    call=tip.call,
                )
            ]
        tip.tip_id = self._next_id
        self._next_id += 1
        slot = self._place(tip, vector)
        events: list[Event] = [
            TipStored(
                tip_id=tip.tip_id,
                slot=tip.slot,
                episode=tip.episode,
                text=tip.text,
                score=tip.score,
                key=key,
                call=tip.call,
                parents=tip.parents,
            )
        ]
        if len(slot.order) > self.settings.capacity:
            events.append(self._evict(slot.order[0], "fifo"))
        return events

    def _place(self, tip: Tip, vector: np.ndarray) -> _Slot:
        """Put ``tip`` (its id set) into its slot, creating the slot on first use."""
        slot = self._slots.get(tip.slot)
        if slot is None:
            slot = self._slots[tip.slot] = _Slot(make_index(self.settings.index, self.dim))
        slot.index.add([tip.tip_id], vector.reshape(1, -1).astype(np.float32))
        slot.order.append(tip.tip_id)
        slot.by_text[tip.text] = tip.tip_id
        self.tips[tip.tip_id] = tip
        return slot

    def _evict(self, tip_id: int, reason: str) -> TipEvicted:
        old = self.tips.pop(tip_id)
        slot = self._slots[old.slot]
        slot.order.remove(tip_id)
        slot.index.remove([tip_id])
        del slot.by_text[old.text]
        return TipEvicted(tip_id=tip_id, slot=old.slot, reason=reason)

    def _refused(self, called: ExtractorCalled, reason: str) -> TipRejected:
        return TipRejected(episode=called.source, slot=called.slot, reason=reason, call=called.call)
