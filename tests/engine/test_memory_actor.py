"""The memory actor on the runtime: whatever mix of tips, extractor calls, retrievals (both
rules) and merge passes reaches it, and however its mailbox batches them (one embedding call
per batch; several batches embedding at once), it answers each message, in log order, exactly
as the bank does applied to one message at a time, with the message's seq as cause and its
correlation id. trio's MockClock with autojump: a batch waits for everything queued."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from functools import partial
from typing import cast

import msgspec
import numpy as np
import structlog
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.events.extractor import ExtractorCalled, MergeDue, MergePlanned, MergeRequested
from agents.events.memory import RetrievalRequested, TipEvicted, TipProposed, TipsRetrieved
from agents.memory.bank import MemorySettings, TipBank
from agents.memory.memory_actor import MemoryActor, merge_requests
from agents.models.embedder import HashingEmbedder
from engine.actor import Actor, ActorSpec, Context
from engine.eventlog import MemoryEventLog
from engine.events import Envelope, Event
from engine.lifecycle import ActorFailed, RunStarted
from engine.projection import ActorStats
from engine.recovery import ReplayContext
from engine.runtime import Runtime
from stores.tip_index import EXACT_BELOW

SEED = 4
DIM = 32
BANK = MemorySettings(capacity=3, threshold=0.1, top_k=3, index="exact", pool=2, recent=2)
CHUNK, MOST = 2, 2
SLOTS = ("train/heat", "train/unlock")
WORDS = ("open the box", "take the apple", "heat the water", "unlock the door", "look around")
STARTED = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=SEED, coevo_version="0")


def text(i: int) -> str:
    return f"{WORDS[i % len(WORDS)]} {'then ' + WORDS[i // len(WORDS) % len(WORDS)]}"


def tip(n: int, slot: str, t: int, k: int) -> TipProposed:
    return TipProposed(
        episode=f"ep{n}", slot=slot, key=text(k), score=(t % 3) / 2, text=text(t),
        prompt_ids=(), response_ids=(), token_logps=(), temperature=0.0, policy_version=0,
    )  # fmt: skip


def call(n: int, slot: str, op: str, ids: list[int], t: int) -> ExtractorCalled:
    content = "" if op in ("discard", "return") else text(t)
    return ExtractorCalled(
        call=f"x{n}", task="extract", source=f"ep{n}", slot=slot, prompt_ids=(), response_ids=(),
        token_logps=(), text="", temperature=1.0, extractor_version=0,
        ops=((op, tuple(ids) if op not in ("add", "return") else (), content),),
    )  # fmt: skip


def retrieval(n: int, slot: str, diverse: bool, q: int) -> RetrievalRequested:
    return RetrievalRequested(
        episode=f"ep{n}", worker="w", turn=0, slot=slot, query=text(q),
        rule="diverse" if diverse else "threshold", k=1 if diverse else 0,
    )  # fmt: skip


messages = st.lists(
    st.one_of(
        st.builds(tip, st.just(0), st.sampled_from(SLOTS), st.integers(0, 12), st.integers(0, 12)),
        st.builds(
            call,
            st.just(0),
            st.sampled_from(SLOTS),
            st.sampled_from(["add", "update", "merge", "rewrite", "discard", "return"]),
            st.lists(st.integers(0, 8), min_size=1, max_size=3, unique=True),
            st.integers(0, 12),
        ),
        st.builds(retrieval, st.just(0), st.sampled_from(SLOTS), st.booleans(), st.integers(0, 12)),
        st.builds(MergeDue, step=st.integers(1, 3)),
    ),
    min_size=1,
    max_size=25,
)


def numbered(plan: Sequence[Event]) -> list[Event]:
    """The plan with distinct episodes and calls, and a last retrieval that ends the run."""
    out: list[Event] = []
    for n, ev in enumerate([*plan, retrieval(0, SLOTS[0], False, 0)]):
        if isinstance(ev, TipProposed | RetrievalRequested):
            ev = type(ev)(**{**_fields(ev), "episode": f"ep{n}"})
        elif isinstance(ev, ExtractorCalled):
            ev = type(ev)(**{**_fields(ev), "call": f"x{n}", "source": f"ep{n}"})
        out.append(ev)
    return out


def _fields(ev: Event) -> dict[str, object]:
    return {f: getattr(ev, f) for f in ev.__struct_fields__}


class Feeder(Actor):
    """Emits the messages in order, message ``i`` with correlation id ``m{i}``."""

    def __init__(self, plan: list[Event]) -> None:
        self.plan = plan

    async def run(self, ctx: Context) -> None:
        for i, ev in enumerate(self.plan):
            await ctx.emit(ev, corr=f"m{i}")


class UntilAnswered(Actor):
    """Ends the run once the last message (a retrieval) is answered."""

    subscribes = (TipsRetrieved,)

    def __init__(self, last: str) -> None:
        self.last = last

    async def run(self, ctx: Context) -> None:
        async for env in ctx.events():
            if env.corr == self.last:
                return


def live(plan: list[Event], batch_max: int, in_flight: int = 1) -> list[tuple[Event, str, int]]:
    """What the memory actor emits, as ``(event, corr, index of the message it answers)``."""
    specs = [
        ActorSpec(name="feeder", factory=partial(Feeder, plan)),
        ActorSpec(
            name="memory",
            factory=partial(
                MemoryActor,
                partial(HashingEmbedder, dim=DIM),
                BANK,
                batch_max=batch_max,
                merge_chunk=CHUNK,
                merge_max=MOST,
                in_flight=in_flight,
            ),
        ),
        ActorSpec(name="until", factory=partial(UntilAnswered, f"m{len(plan) - 1}"), driver=True),
    ]
    log = MemoryEventLog()
    clock = trio.testing.MockClock(autojump_threshold=0)
    trio.run(Runtime(log, STARTED, specs, [ActorStats()], seed=SEED).run, clock=clock)
    envs = list(log.read())
    message = {env.seq: int(env.corr[1:]) for env in envs if env.actor == "feeder"}
    return [(env.event, env.corr, message[env.cause]) for env in envs if env.actor == "memory"]


def one_at_a_time(plan: list[Event]) -> list[tuple[Event, str, int]]:
    """The bank applied to each message in turn, each embedded alone."""
    embedder = HashingEmbedder(dim=DIM)
    bank = TipBank(BANK, DIM)
    out: list[tuple[Event, str, int]] = []
    for i, ev in enumerate(plan):
        made: list[Event]
        if isinstance(ev, TipProposed):
            made = bank.store(ev, embedder.embed([ev.key])[0])
        elif isinstance(ev, ExtractorCalled):
            texts = [c for op, _, c in ev.ops if op not in ("discard", "return")]
            made = bank.apply(ev, [embedder.embed([t])[0] for t in texts])
        elif isinstance(ev, MergeDue):
            chunks = merge_requests(bank, ev.step, SEED, chunk=CHUNK, most=MOST)
            made = [*chunks, MergePlanned(step=ev.step, requests=len(chunks))]
        else:
            assert isinstance(ev, RetrievalRequested)
            made = [bank.retrieve(ev, embedder.embed([ev.query])[0])]
        out += [(m, f"m{i}", i) for m in made]
    return out


@settings(max_examples=25, deadline=None)
@given(plan=messages, batch_max=st.sampled_from([2, 5, 64]), in_flight=st.sampled_from([1, 2, 3]))
def test_answers_follow_the_log_whatever_the_batching(
    plan: list[Event], batch_max: int, in_flight: int
) -> None:
    full = numbered(plan)
    expected = one_at_a_time(full)
    assert live(full, 1) == expected
    assert live(full, batch_max, in_flight) == expected


def test_batches_embed_at_once_up_to_in_flight_and_apply_in_order() -> None:
    """With a slow embedder, two batches do embed at the same time (never more than
    ``in_flight``), each text is embedded once, a batch of every message is embedded in two
    parts at once, and the answers are still the log's order."""
    plan = numbered(
        [tip(0, SLOTS[k % 2], t, t) for k, t in enumerate(range(8))]
        + [retrieval(0, SLOTS[k % 2], k % 3 == 0, k) for k in range(10)]
    )
    busy, most, embedded = 0, 0, []
    lock = threading.Lock()
    real = HashingEmbedder.embed

    def slow(self: HashingEmbedder, texts: Sequence[str]) -> object:
        nonlocal busy, most
        with lock:
            busy += 1
            most = max(most, busy)
            embedded.extend(texts)
        time.sleep(0.02)
        with lock:
            busy -= 1
        return real(self, texts)

    HashingEmbedder.embed = slow  # type: ignore[method-assign]
    try:
        one = live(plan, 2, 1)
        assert most == 1
        embedded.clear()
        two = live(plan, 2, 2)
        assert most == 2
        assert len(embedded) == len(set(embedded))  # no text embedded twice across batches
        most, calls = 0, len(embedded)
        whole = live(plan, 64, 2)  # one batch holds every message: its two parts at once
    finally:
        HashingEmbedder.embed = real  # type: ignore[method-assign]
    assert most == 2 and len(embedded) > calls
    assert one == two == whole == one_at_a_time(plan)


def test_a_batch_holds_several_messages_and_merges_are_answered() -> None:
    """The property above is not vacuous: with a large batch the actor does embed several
    messages at once, and a merge pass over a full slot asks the extractor for chunks."""
    plan = numbered(
        [tip(0, SLOTS[0], t, t) for t in range(4)]
        + [retrieval(0, SLOTS[0], True, 1), MergeDue(step=1), retrieval(0, SLOTS[1], False, 2)]
    )
    sizes: list[int] = []
    real = HashingEmbedder.embed

    def counting(self: HashingEmbedder, texts: Sequence[str]) -> object:
        sizes.append(len(texts))
        return real(self, texts)

    HashingEmbedder.embed = counting  # type: ignore[method-assign]
    try:
        got = live(plan, 64)
    finally:
        HashingEmbedder.embed = real  # type: ignore[method-assign]
    assert got == one_at_a_time(plan)
    assert max(sizes) > 1
    assert any(isinstance(ev, MergeRequested) for ev, _, _ in got)


class BrokenEmbedder(HashingEmbedder):
    """Fails on its second call."""

    calls = 0

    def embed(self, texts: Sequence[str]) -> object:  # type: ignore[override]
        BrokenEmbedder.calls += 1
        if BrokenEmbedder.calls == 2:
            raise RuntimeError("the embedder ran out of memory")
        return super().embed(texts)


def test_an_embedding_error_is_recorded_as_itself() -> None:
    """An error in a batch being embedded reaches supervision as itself (its type and message in
    ``ActorFailed``), not wrapped in an exception group."""
    BrokenEmbedder.calls = 0
    plan = numbered([tip(0, SLOTS[0], t, t) for t in range(6)])
    specs = [
        ActorSpec(name="feeder", factory=partial(Feeder, plan)),
        ActorSpec(
            name="memory",
            factory=partial(MemoryActor, partial(BrokenEmbedder, dim=DIM), BANK, batch_max=2),
        ),
        ActorSpec(name="until", factory=partial(UntilAnswered, f"m{len(plan) - 1}"), driver=True),
    ]
    log = MemoryEventLog()
    clock = trio.testing.MockClock(autojump_threshold=0)
    trio.run(Runtime(log, STARTED, specs, [ActorStats()], seed=SEED).run, clock=clock)
    failed = [e.event for e in log.read() if isinstance(e.event, ActorFailed)]
    assert [(f.actor, f.error_type, f.message) for f in failed] == [
        ("memory", "RuntimeError", "the embedder ran out of memory")
    ]


def test_a_query_for_an_empty_slot_is_not_embedded() -> None:
    """An empty slot answers nothing whatever the query, so its queries are not embedded; a
    query after a tip for its slot (in the same batch or an earlier one) is."""
    empty_queries = [retrieval(0, SLOTS[1], k % 2 == 0, 10 + k) for k in range(3)]
    plan = numbered([*empty_queries, tip(0, SLOTS[0], 1, 1), retrieval(0, SLOTS[0], False, 7)])
    embedded: list[str] = []
    real = HashingEmbedder.embed

    def recording(self: HashingEmbedder, texts: Sequence[str]) -> object:
        embedded.extend(texts)
        return real(self, texts)

    expected = one_at_a_time(plan)
    HashingEmbedder.embed = recording  # type: ignore[method-assign]
    try:
        for batch_max, in_flight in ((1, 1), (64, 2)):
            embedded.clear()
            assert live(plan, batch_max, in_flight) == expected
            assert not {q.query for q in empty_queries} & set(embedded)
            assert plan[4].query in embedded and plan[3].key in embedded
    finally:
        HashingEmbedder.embed = real  # type: ignore[method-assign]


class _Recovering(ReplayContext):
    """The context :meth:`MemoryActor.recover` is given on resume (a first attempt)."""

    attempt = 0
    log = structlog.get_logger("test")


def logged_run(plan: list[Event], bank: TipBank) -> list[Envelope[Event]]:
    """A log of ``plan``'s messages, each followed by what ``bank`` answered (the memory actor
    one message at a time, every text embedded by the hashing embedder)."""
    embedder = HashingEmbedder(dim=DIM)
    log: list[Envelope[Event]] = []

    def append(actor: str, ev: Event, cause: int | None) -> None:
        log.append(Envelope(seq=len(log), run="r", t=0, actor=actor, event=ev, cause=cause))

    for ev in plan:
        append("feeder", ev, None)
        seq = len(log) - 1
        if isinstance(ev, TipProposed):
            made = bank.store(ev, embedder.embed([ev.key])[0])
        else:
            assert isinstance(ev, RetrievalRequested)
            made = [bank.retrieve(ev, embedder.embed([ev.query])[0])]
        for m in made:
            append("memory", m, seq)
    return log


def rebuilt(settings: MemorySettings, log: list[Envelope[Event]]) -> tuple[TipBank, list[str]]:
    """The bank a resumed memory actor rebuilds from ``log``, and every text it embedded."""
    embedded: list[str] = []

    class Recording(HashingEmbedder):
        def embed(self, texts: Sequence[str]) -> np.ndarray:
            embedded.extend(texts)
            return super().embed(texts)

    actor = MemoryActor(partial(Recording, dim=DIM), settings)
    trio.run(actor.recover, cast(Context, _Recovering("memory", SEED)), log)
    assert actor._restored is not None
    return actor._restored[0], embedded


def test_a_rebuilt_bank_embeds_only_the_keys_it_still_holds() -> None:
    """On resume the bank embeds the keys of the tips it holds at the log's end, not those
    evicted before it (their vectors were read only by searches, and a rebuilt bank searches
    nothing before then), and answers every later retrieval as the bank that ran on."""
    settings = MemorySettings(capacity=3, threshold=0.1, top_k=3, index="usearch")
    plan: list[Event] = []
    for n in range(40):
        plan.append(tip(n, SLOTS[n % 2], n, n))
        if n % 3 == 0:
            plan.append(retrieval(n, SLOTS[n % 2], n % 2 == 0, n + 1))
    live_bank = TipBank(settings, DIM)
    bank, embedded = rebuilt(settings, logged_run(plan, live_bank))
    assert not bank.graphs()
    assert sorted(embedded) == sorted(t.text for t in live_bank.tips.values())  # key == text
    assert bank.tips == live_bank.tips
    for q in range(12):
        ask = retrieval(99, SLOTS[q % 2], q % 3 == 0, q)
        vector = HashingEmbedder(dim=DIM).embed([ask.query])[0]
        assert bank.retrieve(ask, vector) == live_bank.retrieve(ask, vector)


def test_a_bank_whose_index_built_a_graph_is_rebuilt_with_every_key() -> None:
    """A slot searched past the index's exact threshold built an HNSW graph from every vector
    it held: the rebuilt bank builds it at the same retrieval, so every stored key is embedded
    again (an evicted tip's vector shaped the graph)."""
    settings = MemorySettings(capacity=EXACT_BELOW + 2, threshold=0.1, top_k=3, index="usearch")

    def distinct(n: int) -> TipProposed:
        return msgspec.structs.replace(tip(n, SLOTS[0], n, n), key=f"tip {n}", text=f"tip {n}")

    plan: list[Event] = [distinct(n) for n in range(EXACT_BELOW + 2)]
    plan.append(retrieval(0, SLOTS[0], False, 3))  # past the threshold: the graph is built
    plan += [distinct(n) for n in range(EXACT_BELOW + 2, EXACT_BELOW + 6)]
    live_bank = TipBank(settings, DIM)
    log = logged_run(plan, live_bank)
    assert sum(isinstance(env.event, TipEvicted) for env in log) == 4 and live_bank.graphs()
    bank, embedded = rebuilt(settings, log)
    assert bank.graphs() == [SLOTS[0]]
    assert set(embedded) == {f"tip {n}" for n in range(EXACT_BELOW + 6)}
    assert len(embedded) == len(set(embedded))  # each key once, over both folds
    assert bank.tips == live_bank.tips
