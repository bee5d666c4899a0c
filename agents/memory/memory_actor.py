"""The memory actor: the shell around EMPO2's and Complementary RL's tip bank
(:class:`agents.memory.bank.TipBank`, the pure core). It stores reflections and extractor
operations and answers retrievals.

It batches the requests waiting in its mailbox, embeds their texts in one call in a worker
thread, and applies them to the bank in log order, so what it answers never depends on how
requests were batched. Embedding is the costly part and depends only on the texts, so up to
``in_flight`` batches embed at once, a batch in up to ``in_flight`` parts at the same time;
the bank still applies them one after another in log order. A query for a slot that is empty
(and that nothing gathered before it writes to) is not embedded: an empty slot answers
nothing whatever the query. It also plans merge passes (:func:`merge_requests`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import trio

from agents.events.episodes import finished_attempts, live_attempts
from agents.events.extractor import ExtractorCalled, MergeDue, MergePlanned, MergeRequested
from agents.events.memory import (
    RetrievalRequested,
    TipEvicted,
    TipProposed,
    TipStored,
)
from agents.memory.bank import MemorySettings, TipBank
from agents.memory.extraction import MERGE_SYSTEM, merge_messages
from agents.models.embedder import Embedder
from agents.models.prompts import to_pairs
from engine.actor import Actor, Context, task_nursery
from engine.errors import ResumeDiverged
from engine.events import Envelope, Event
from engine.recovery import Emitted, ReplayContext
from engine.seeds import derive_rng


class MemoryActor(Actor):
    """Owns the tip bank: stores every :class:`TipProposed`, applies every
    :class:`ExtractorCalled`, answers every :class:`RetrievalRequested`, and on
    :class:`MergeDue` hands the bank to the extractor in chunks (:class:`MergeRequested`), then
    says how many (:class:`MergePlanned`).

    Args:
        make_embedder: builds the text embedder (called in a worker thread at start).
        settings: the bank's rules.
        batch_max: most requests embedded together.
        batch_wait: seconds to wait for more requests after the first.
        merge_chunk: entries per merge request.
        merge_max: most merge requests per slot per pass (over its newest entries).
        merge_system: the system text of a merge request's prompt.
        in_flight: most batches being embedded at once, and most worker threads embedding
            at once (a batch is embedded in up to that many parts at the same time).
    """

    subscribes = (RetrievalRequested, TipProposed, ExtractorCalled, MergeDue)

    def __init__(
        self,
        make_embedder: Callable[[], Embedder],
        settings: MemorySettings,
        *,
        batch_max: int = 64,
        batch_wait: float = 0.002,
        merge_chunk: int = 5,
        merge_max: int = 16,
        merge_system: str = MERGE_SYSTEM,
        in_flight: int = 2,
    ) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        self._in_flight = in_flight
        self._make_embedder = make_embedder
        self._settings = settings
        self._batch_max = batch_max
        self._batch_wait = batch_wait
        self._merge_chunk = merge_chunk
        self._merge_max = merge_max
        self._merge_system = merge_system
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._coming: set[str] = set()  # texts a batch in flight is embedding
        self._writing: Counter[str] = Counter()  # slot -> writes gathered, not yet applied
        self._restored: tuple[TipBank, Embedder] | None = None  # set by recover
        self._tail: list[Emitted] = []  # what a resumed run's bank decided but never logged
        self._owed: list[Envelope[Event]] = []  # what it received but never applied

    async def run(self, ctx: Context) -> None:
        if self._restored is None:
            embedder = await ctx.to_thread(self._make_embedder)
            bank = TipBank(self._settings, embedder.dim)
        else:
            bank, embedder = self._restored
        for ev, corr, cause in self._tail:
            await ctx.emit(ev, corr=corr, cause=cause)
        if self._owed:
            await self._apply(ctx, bank, embedder, self._owed)
        self._tail, self._owed = [], []
        inbox = ctx.events()
        slots = trio.Semaphore(self._in_flight)  # a slot: from gathering to applied
        threads = trio.CapacityLimiter(self._in_flight)  # embedding threads at once
        send, receive = trio.open_memory_channel[_Embedding](self._in_flight)
        async with task_nursery() as nursery:
            nursery.start_soon(self._apply_in_order, ctx, bank, embedder, receive, slots)
            async with send:
                async for first in inbox:
                    await slots.acquire()
                    batch, _ = await inbox.gather(first, self._batch_max, self._batch_wait)
                    job = _Embedding(batch, [_texts_of(env.event) for env in batch])
                    wanted: list[str] = []
                    for env, ts in zip(batch, job.texts, strict=True):
                        slot = _written_slot(env.event)
                        if slot is not None:
                            self._writing[slot] += 1
                        if self._may_need(bank, env.event):
                            wanted += ts
                    todo = [
                        t
                        for t in dict.fromkeys(wanted)
                        if t not in self._cache and t not in self._coming
                    ]
                    self._coming.update(todo)
                    nursery.start_soon(self._embed_job, ctx, embedder, job, todo, threads)
                    await send.send(job)

    async def _embed_job(
        self,
        ctx: Context,
        embedder: Embedder,
        job: _Embedding,
        todo: list[str],
        threads: trio.CapacityLimiter,
    ) -> None:
        """Embed ``todo`` for ``job``: in up to ``in_flight`` parts at once (a large batch
        uses every embedding thread the batches around it leave free)."""
        try:
            parts = _parts(todo, self._in_flight)
            vectors: list[np.ndarray] = [np.empty(0)] * len(parts)

            async def embed(k: int) -> None:
                vectors[k] = await ctx.to_thread(embedder.embed, parts[k], limiter=threads)

            async with task_nursery() as nursery:
                for k in range(len(parts)):
                    nursery.start_soon(embed, k)
            job.vectors = {
                t: v
                for part, vs in zip(parts, vectors, strict=True)
                for t, v in zip(part, vs, strict=True)
            }
        finally:
            job.done.set()

    async def _apply_in_order(
        self,
        ctx: Context,
        bank: TipBank,
        embedder: Embedder,
        jobs: trio.MemoryReceiveChannel[_Embedding],
        slots: trio.Semaphore,
    ) -> None:
        """Apply each gathered batch, in the order gathered, once its texts are embedded."""
        async with jobs:
            async for job in jobs:
                await job.done.wait()
                self._coming.difference_update(job.vectors)
                self._remember(job.vectors)
                await self._apply_as_needed(ctx, bank, embedder, job)
                for env in job.batch:
                    slot = _written_slot(env.event)
                    if slot is not None:
                        self._writing[slot] -= 1
                slots.release()

    async def _apply_as_needed(
        self, ctx: Context, bank: TipBank, embedder: Embedder, job: _Embedding
    ) -> None:
        """Apply ``job``'s batch event by event, each with its vectors; a retrieval from a slot
        that is empty when it is answered gets none (nothing is searched)."""
        empty = np.zeros(embedder.dim, dtype=np.float32)
        for env, ts in zip(job.batch, job.texts, strict=True):
            vectors = [empty] * len(ts)
            if not isinstance(env.event, RetrievalRequested) or bank.size(env.event.slot):
                if any(t not in self._cache for t in ts):  # evicted, or a slot filled meanwhile
                    await ctx.to_thread(self._embed, embedder, ts)
                vectors = self._cached(ts)
            await self._apply_vectors(ctx, bank, [env], [ts], vectors)

    def _may_need(self, bank: TipBank, ev: Event) -> bool:
        """Whether ``ev``'s texts may be needed when it is answered: always, but for a
        retrieval from a slot that is empty and that no message before it (applied or not)
        writes to."""
        if not isinstance(ev, RetrievalRequested):
            return True
        return bank.size(ev.slot) > 0 or self._writing[ev.slot] > 0

    async def recover(self, ctx: Context, history: Sequence[Envelope[Event]]) -> None:
        """Rebuild the bank as a fold of what it emitted (:meth:`TipBank.evolve`, each stored
        tip's key embedded again), finish the message it was answering when the run stopped
        (a retrieval has one answer, so its is folded like the rest; any other message is
        answered again and what the log lacks of its answer kept for :meth:`run`), and owe
        :meth:`run` the messages it never applied. On resume, retrieval requests left
        unanswered are not owed, nor is a tip or an extraction of an episode that did not
        finish: their episodes are abandoned and played again. Restarted mid-run
        (``ctx.attempt > 0``: its process was lost, ``ActorSpec.recover_on_restart``), those of
        an attempt still running are owed too: that episode goes on and waits for its
        retrievals (:func:`agents.events.episodes.live_attempts`).

        Raises:
            ResumeDiverged: the log's bank events do not follow from one another, or
                answering the last message again gives other events than the log's.
        """
        mine = [env for env in history if env.actor == ctx.name]
        last = mine[-1].cause if mine else None  # the message it was answering last
        if last is None and mine:
            raise ResumeDiverged(f"the {ctx.name} emitted {mine[-1].event!r} with no cause")
        received = [env for env in history if isinstance(env.event, self.subscribes)]
        again = [env for env in received if env.seq == last]
        if last is not None and not again:
            raise ResumeDiverged(f"the {ctx.name} answered seq {last}, which it never received")
        if again and isinstance(again[0].event, RetrievalRequested):
            again = []  # one answer, complete: folded (answering again re-embeds the query)
        done = [env.event for env in mine if not again or env.cause != last]
        embedder = await ctx.to_thread(self._make_embedder)
        evicted = {ev.tip_id for ev in done if isinstance(ev, TipEvicted)}
        vectors: dict[str, np.ndarray] = {}  # by key, embedded once for both folds
        bank = await self._fold(ctx, done, embedder, evicted, vectors)
        if bank.graphs() and evicted:  # an evicted tip's vector may have shaped a graph
            bank = await self._fold(ctx, done, embedder, set(), vectors)
        if again:
            replay = ReplayContext(ctx.name, ctx.run_seed)
            await self._apply(cast(Context, replay), bank, embedder, again)
            self._tail = replay.settle([env.event for env in mine if env.cause == last])
        restarted = ctx.attempt > 0
        of_attempt = live_attempts(history) if restarted else finished_attempts(history)
        after = last if last is not None else -1
        self._owed = [
            env for env in received if env.seq > after and _owed(env, of_attempt, restarted)
        ]
        self._restored = bank, embedder
        ctx.log.info("memory rebuilt", tips=len(bank.tips), owed=len(self._owed))

    async def _fold(
        self,
        ctx: Context,
        done: list[Event],
        embedder: Embedder,
        unembedded: set[int],
        vectors: dict[str, np.ndarray],
    ) -> TipBank:
        """The bank that ``done`` (the events it emitted) rebuilds, every stored tip's key
        embedded but those of ``unembedded``: tips evicted before the end, whose vectors only
        a search could have read, and a rebuilt bank searches nothing (a placeholder
        stands in; :meth:`TipBank.graphs` says where an index kept one). ``vectors`` holds
        the keys embedded so far; those it lacks are embedded and added.

        Raises:
            ResumeDiverged: ``done`` does not follow from an empty bank.
        """
        bank = TipBank(self._settings, embedder.dim)
        keys = {
            ev.key: None
            for ev in done
            if isinstance(ev, TipStored) and ev.tip_id not in unembedded and ev.key not in vectors
        }
        if keys:
            embedded = await ctx.to_thread(embed_all, embedder, list(keys))
            vectors.update(zip(keys, embedded, strict=True))
        placeholder = np.zeros(embedder.dim, dtype=np.float32)
        placeholder[0] = 1.0
        try:
            for ev in done:
                vector = None
                if isinstance(ev, TipStored):
                    vector = placeholder if ev.tip_id in unembedded else vectors[ev.key]
                bank.evolve(ev, vector)
        except ValueError as exc:
            raise ResumeDiverged(f"the {ctx.name} cannot rebuild its bank: {exc}") from None
        return bank

    async def _apply(
        self, ctx: Context, bank: TipBank, embedder: Embedder, batch: list[Envelope[Event]]
    ) -> None:
        texts = [_texts_of(env.event) for env in batch]
        flat = await ctx.to_thread(self._embed, embedder, [t for ts in texts for t in ts])
        await self._apply_vectors(ctx, bank, batch, texts, flat)

    async def _apply_vectors(
        self,
        ctx: Context,
        bank: TipBank,
        batch: list[Envelope[Event]],
        texts: list[list[str]],
        flat: list[np.ndarray],
    ) -> None:
        """Apply ``batch`` to the bank in order, each event with the vectors of its texts."""
        at = 0
        for env, ts in zip(batch, texts, strict=True):
            vectors, at = flat[at : at + len(ts)], at + len(ts)
            ev = env.event
            if isinstance(ev, TipProposed):
                out: list[Event] = bank.store(ev, vectors[0])
            elif isinstance(ev, ExtractorCalled):
                out = bank.apply(ev, vectors)
            elif isinstance(ev, MergeDue):
                chunks = self._merges(ctx, bank, ev)
                out = [*chunks, MergePlanned(step=ev.step, requests=len(chunks))]
            else:
                assert isinstance(ev, RetrievalRequested)
                out = [bank.retrieve(ev, vectors[0])]
            for item in out:
                await ctx.emit(item, cause=env.seq, corr=env.corr)

    def _merges(self, ctx: Context, bank: TipBank, due: MergeDue) -> list[MergeRequested]:
        return merge_requests(
            bank,
            due.step,
            ctx.run_seed,
            chunk=self._merge_chunk,
            most=self._merge_max,
            system=self._merge_system,
        )

    def _embed(self, embedder: Embedder, texts: Sequence[str]) -> list[np.ndarray]:
        """Vectors of ``texts``, from the cache where possible (turn-0 queries of a group, and
        keys, repeat)."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            self._remember(dict(zip(missing, embedder.embed(missing), strict=True)))
        return self._cached(texts)

    def _remember(self, vectors: dict[str, np.ndarray]) -> None:
        for text, vec in vectors.items():
            self._cache[text] = vec
            if len(self._cache) > 65_536:
                self._cache.popitem(last=False)

    def _cached(self, texts: Sequence[str]) -> list[np.ndarray]:
        out = []
        for t in texts:
            self._cache.move_to_end(t)
            out.append(self._cache[t])
        return out


def merge_requests(
    bank: TipBank,
    step: int,
    run_seed: int,
    *,
    chunk: int,
    most: int,
    system: str = MERGE_SYSTEM,
) -> list[MergeRequested]:
    """A merge pass's requests (pure): every slot's newest ``most * chunk`` entries, oldest
    first, in consecutive chunks of ``chunk`` (a chunk of one has nothing to merge), each with
    its seed drawn from the run seed, the step, the slot and the chunk's offset; ``system`` is
    the prompt's system text."""
    out = []
    for slot in bank.slots():
        ids = bank.entries(slot)[-most * chunk :]
        for k in range(0, len(ids), chunk):
            part = ids[k : k + chunk]
            if len(part) < 2:
                continue
            messages = merge_messages([bank.tips[i].text for i in part], system)
            out.append(
                MergeRequested(
                    step=step,
                    slot=slot,
                    entries=tuple(part),
                    messages=to_pairs(messages),
                    seed=derive_rng(run_seed, "merge", step, slot, k).getrandbits(63),
                )
            )
    return out


def embed_all(embedder: Embedder, texts: Sequence[str], chunk: int = 1024) -> list[np.ndarray]:
    """Vectors of ``texts`` (each distinct text embedded once, ``chunk`` at a time; blocking)."""
    distinct = list(dict.fromkeys(texts))
    vectors: dict[str, np.ndarray] = {}
    for k in range(0, len(distinct), chunk):
        part = distinct[k : k + chunk]
        vectors.update(zip(part, embedder.embed(part), strict=True))
    return [vectors[t] for t in texts]


def _owed(
    env: Envelope[Event], of_attempt: Callable[[str, int], bool], restarted: bool = False
) -> bool:
    """Whether a message the bank never applied is applied when it is rebuilt: not a tip or
    an extraction of an attempt ``of_attempt`` does not owe; on resume, not a retrieval (its
    episode was running, so it is abandoned); restarted mid-run, a retrieval of an attempt
    still running (:func:`agents.events.episodes.live_attempts`)."""
    ev = env.event
    if isinstance(ev, RetrievalRequested):
        return restarted and of_attempt(ev.episode, env.seq)
    episode = ev.episode if isinstance(ev, TipProposed) else None
    if isinstance(ev, ExtractorCalled) and ev.task == "extract":
        episode = ev.source
    return episode is None or of_attempt(episode, env.seq)


@dataclass
class _Embedding:
    """A gathered batch, its texts per event, and the vectors of those no batch before it
    embeds (set by the worker thread; ``done`` when it ends, even by raising)."""

    batch: list[Envelope[Event]]
    texts: list[list[str]]
    vectors: dict[str, np.ndarray] = field(default_factory=dict[str, np.ndarray])
    done: trio.Event = field(default_factory=trio.Event)


def _written_slot(ev: Event) -> str | None:
    """The slot ``ev`` may add entries to when applied (a tip, an extractor's operations)."""
    return ev.slot if isinstance(ev, TipProposed | ExtractorCalled) else None


def _parts(texts: list[str], most: int) -> list[list[str]]:
    """``texts`` dealt into at most ``most`` parts of about equal work: by length, longest
    first, in turn (each part then pads its texts to similar lengths)."""
    ranked = sorted(texts, key=len, reverse=True)
    return [part for part in (ranked[k::most] for k in range(most)) if part]


def _texts_of(ev: Event) -> list[str]:
    """The texts an event needs embedded: a tip's key, a query, or the content of each
    operation that writes an entry."""
    if isinstance(ev, TipProposed):
        return [ev.key]
    if isinstance(ev, RetrievalRequested):
        return [ev.query]
    if isinstance(ev, ExtractorCalled):
        return [content for op, _, content in ev.ops if op not in ("discard", "return")]
    return []
