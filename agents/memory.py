"""The memory actor: owns EMPO2's tip bank, stores reflections and answers retrievals.

:class:`TipBank` is the pure core: slots of at most ``capacity`` tips each (FIFO eviction,
exact-text dedup per slot), each slot a vector index over the tips' keys. It takes vectors, never
text-to-vector calls, and turns each message into the events that record it, so the bank is a
fold of its own events. :class:`MemoryActor` is the shell: it batches the requests waiting in
its mailbox, embeds their texts in one call in a worker thread, and applies them to the bank in
log order, so what it answers never depends on how requests were batched.

Retrieval follows EMPO2's released code: the ``top_k`` tips most similar to the query, those
with cosine similarity above ``threshold`` kept, shown ordered by their stored score
(descending; ties by similarity).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import trio

from agents.embedder import Embedder
from agents.memory_events import (
    RetrievalRequested,
    TipEvicted,
    TipProposed,
    TipRejected,
    TipsRetrieved,
    TipStored,
)
from engine.actor import Actor, Context
from engine.events import Envelope, Event
from stores.tip_index import VectorIndex, make_index


@dataclass(frozen=True)
class MemorySettings:
    """The bank's rules (a scenario's ``[empo2]`` memory keys).

    Attributes:
        capacity: tips per slot; the oldest is evicted beyond it.
        threshold: a tip is retrieved only if its cosine similarity to the query is above it.
        top_k: most tips retrieved per query.
        index: "usearch" or "exact" (brute force).
    """

    capacity: int = 1000
    threshold: float = 0.5
    top_k: int = 10
    index: str = "usearch"

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.top_k < 1:
            raise ValueError(f"capacity and top_k must be >= 1, got {self}")
        if not -1.0 <= self.threshold < 1.0:
            raise ValueError(f"threshold must be in [-1, 1), got {self.threshold}")


@dataclass(frozen=True, slots=True)
class Tip:
    """One stored tip."""

    tip_id: int
    slot: str
    text: str
    score: float
    episode: str


@dataclass
class _Slot:
    index: VectorIndex
    order: deque[int] = field(default_factory=deque[int])  # FIFO, oldest first
    by_text: dict[str, int] = field(default_factory=dict[str, int])


class TipBank:
    """Every slot's tips and index.

    Args:
        settings: capacity, threshold, top-k and index kind.
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

    def store(self, tip: TipProposed, vector: np.ndarray) -> list[Event]:
        """Store ``tip`` under its key's ``vector`` (dim,); the events that record what happened.

        Returns:
            ``[TipRejected]`` for an empty or duplicate text, else ``[TipStored]`` followed by
            ``TipEvicted`` when the slot was full.
        """
        text = tip.text.strip()
        if not text:
            return [TipRejected(episode=tip.episode, slot=tip.slot, reason="empty")]
        slot = self._slots.get(tip.slot)
        if slot is None:
            slot = self._slots[tip.slot] = _Slot(make_index(self.settings.index, self.dim))  # type: ignore[arg-type]
        if text in slot.by_text:
            return [
                TipRejected(
                    episode=tip.episode,
                    slot=tip.slot,
                    reason="duplicate",
                    duplicate_of=slot.by_text[text],
                )
            ]
        tip_id = self._next_id
        self._next_id += 1
        slot.index.add([tip_id], vector.reshape(1, -1).astype(np.float32))
        slot.order.append(tip_id)
        slot.by_text[text] = tip_id
        self.tips[tip_id] = Tip(tip_id, tip.slot, text, tip.score, tip.episode)
        events: list[Event] = [
            TipStored(
                tip_id=tip_id,
                slot=tip.slot,
                episode=tip.episode,
                text=text,
                score=tip.score,
                key=tip.key,
            )
        ]
        if len(slot.order) > self.settings.capacity:
            old = self.tips.pop(slot.order.popleft())
            slot.index.remove([old.tip_id])
            del slot.by_text[old.text]
            events.append(TipEvicted(tip_id=old.tip_id, slot=old.slot))
        return events

    def retrieve(self, req: RetrievalRequested, vector: np.ndarray) -> TipsRetrieved:
        """The tips of ``req.slot`` for the query embedded as ``vector`` (dim,)."""
        slot = self._slots.get(req.slot)
        found: list[tuple[int, float]] = []
        if slot is not None and slot.order:
            hits = slot.index.search(vector.reshape(1, -1).astype(np.float32), self.settings.top_k)
            found = [(key, sim) for key, sim in hits[0] if sim > self.settings.threshold]
        # found is by similarity (rank order); show by stored score, then by rank
        shown = sorted(range(len(found)), key=lambda r: (-self.tips[found[r][0]].score, r))
        return TipsRetrieved(
            episode=req.episode,
            worker=req.worker,
            turn=req.turn,
            slot=req.slot,
            tip_ids=tuple(found[r][0] for r in shown),
            similarities=tuple(found[r][1] for r in shown),
            ranks=tuple(shown),
            tips=tuple(self.tips[found[r][0]].text for r in shown),
            similar=len(found),
            slot_size=self.size(req.slot),
        )


class MemoryActor(Actor):
    """Owns the tip bank: stores every :class:`TipProposed`, answers every
    :class:`RetrievalRequested`.

    Args:
        make_embedder: builds the text embedder (called in a worker thread at start).
        settings: the bank's rules.
        batch_max: most requests embedded together.
        batch_wait: seconds to wait for more requests after the first.
    """

    subscribes = (RetrievalRequested, TipProposed)

    def __init__(
        self,
        make_embedder: Callable[[], Embedder],
        settings: MemorySettings,
        *,
        batch_max: int = 64,
        batch_wait: float = 0.002,
    ) -> None:
        self._make_embedder = make_embedder
        self._settings = settings
        self._batch_max = batch_max
        self._batch_wait = batch_wait
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()

    async def run(self, ctx: Context) -> None:
        embedder = await ctx.to_thread(self._make_embedder)
        bank = TipBank(self._settings, embedder.dim)
        inbox = ctx.events()
        async for first in inbox:
            batch = [first]
            with trio.move_on_after(self._batch_wait):
                while len(batch) < self._batch_max:
                    batch.append(await inbox.__anext__())
            await self._apply(ctx, bank, embedder, batch)

    async def _apply(
        self, ctx: Context, bank: TipBank, embedder: Embedder, batch: list[Envelope[Event]]
    ) -> None:
        texts = [_text_of(env.event) for env in batch]
        vectors = await ctx.to_thread(self._embed, embedder, texts)
        for env, vector in zip(batch, vectors, strict=True):
            ev = env.event
            if isinstance(ev, TipProposed):
                for out in bank.store(ev, vector):
                    await ctx.emit(out, cause=env.seq, corr=env.corr)
            else:
                assert isinstance(ev, RetrievalRequested)
                await ctx.emit(bank.retrieve(ev, vector), cause=env.seq, corr=env.corr)

    def _embed(self, embedder: Embedder, texts: Sequence[str]) -> list[np.ndarray]:
        """Vectors of ``texts``, from the cache where possible (turn-0 queries of a group, and
        keys, repeat)."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            for text, vec in zip(missing, embedder.embed(missing), strict=True):
                self._cache[text] = vec
                if len(self._cache) > 65_536:
                    self._cache.popitem(last=False)
        out = []
        for t in texts:
            self._cache.move_to_end(t)
            out.append(self._cache[t])
        return out


def _text_of(ev: Event) -> str:
    if isinstance(ev, TipProposed):
        return ev.key
    assert isinstance(ev, RetrievalRequested)
    return ev.query
