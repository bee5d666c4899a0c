"""The tip bank on usearch against a brute-force reference: random stores (with duplicates and
evictions) and retrievals over a few slots must give the same events. And the bank rebuilt from
the events it emitted (what ``coevo resume`` does) is the same bank."""

from __future__ import annotations

import copy
import itertools
import zlib
from dataclasses import dataclass

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from agents.events.extractor import ExtractorCalled
from agents.events.memory import RetrievalRequested, TipProposed, TipRejected, TipStored
from agents.memory.bank import MemorySettings, TipBank
from engine.events import Event

DIM = 6
SETTINGS = MemorySettings(capacity=4, threshold=0.3, top_k=3, index="usearch")
SLOTS = ("train/heat/1", "train/heat/2", "adapt0-t0/circuit/1000000")
TEXTS = tuple(f"tip {i}" for i in range(8))


def vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


@dataclass
class Ref:
    tip_id: int
    text: str
    score: float
    vec: np.ndarray


class BankVsBruteForce(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.bank = TipBank(SETTINGS, DIM)
        self.slots: dict[str, list[Ref]] = {s: [] for s in SLOTS}  # oldest first
        self.next_id = 0

    @rule(
        slot=st.sampled_from(SLOTS),
        text=st.sampled_from(TEXTS),
        score=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
        seed=st.integers(0, 10_000),
    )
    def store(self, slot: str, text: str, score: float, seed: int) -> None:
        tip = TipProposed(
            episode=f"ep{seed}",
            slot=slot,
            key="k",
            score=score,
            text=text,
            prompt_ids=(),
            response_ids=(),
            token_logps=(),
            temperature=0.0,
            policy_version=0,
        )
        out = self.bank.store(tip, vector(seed))
        held = self.slots[slot]
        same = [r for r in held if r.text == text]
        if same:
            assert out == [
                TipRejected(
                    episode=tip.episode, slot=slot, reason="duplicate", duplicate_of=same[0].tip_id
                )
            ]
            return
        assert isinstance(out[0], TipStored) and out[0].tip_id == self.next_id
        held.append(Ref(self.next_id, text, score, vector(seed)))
        self.next_id += 1
        if len(held) > SETTINGS.capacity:
            gone = held.pop(0)
            assert [e.tip_id for e in out[1:]] == [gone.tip_id]  # type: ignore[attr-defined]
        else:
            assert len(out) == 1

    @rule(slot=st.sampled_from(SLOTS), seed=st.integers(0, 10_000))
    def retrieve(self, slot: str, seed: int) -> None:
        q = vector(seed + 1_000_000)
        req = RetrievalRequested(episode="q", worker="w", turn=0, slot=slot, query="")
        got = self.bank.retrieve(req, q)
        sims = sorted(
            ((float(r.vec @ q), r) for r in self.slots[slot]), key=lambda x: (-x[0], x[1].tip_id)
        )
        if _near_a_boundary([s for s, _ in sims]):
            return  # float32 rounding could decide either way; nothing to compare
        kept = [(s, r) for s, r in sims[: SETTINGS.top_k] if s > SETTINGS.threshold]
        shown = sorted(range(len(kept)), key=lambda k: (-kept[k][1].score, k))
        assert got.tip_ids == tuple(kept[k][1].tip_id for k in shown)
        assert got.ranks == tuple(shown)
        assert got.tips == tuple(kept[k][1].text for k in shown)
        assert np.allclose(got.similarities, [kept[k][0] for k in shown], atol=1e-5)
        assert (got.similar, got.slot_size) == (len(kept), len(self.slots[slot]))


def _near_a_boundary(sims: list[float]) -> bool:
    """Two similarities within rounding of each other, or one within rounding of the
    threshold."""
    close = any(abs(a - b) < 1e-5 for a, b in itertools.pairwise(sims))
    return close or any(abs(s - SETTINGS.threshold) < 1e-5 for s in sims)


BankVsBruteForce.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestBankVsBruteForce = BankVsBruteForce.TestCase


def text_vector(text: str) -> np.ndarray:
    """The vector a text embeds to in :class:`BankRebuiltFromItsEvents` (a fixed function)."""
    return vector(zlib.crc32(text.encode()))


class BankRebuiltFromItsEvents(RuleBasedStateMachine):
    """``coevo resume`` rebuilds the bank by folding the events it emitted (:meth:`TipBank.evolve`):
    after any mix of stores, extractor operations (which evict and refuse) and retrievals under both
    rules, for training (a "diverse" pick counts) or evaluation (read-only), the rebuilt bank must
    hold the same tips, counts and order, and answer the same."""

    @initialize()
    def start(self) -> None:
        self.bank = TipBank(DIVERSE, DIM)
        self.events: list[Event] = []
        self.calls = 0

    @rule(slot=st.sampled_from(SLOTS), text=st.sampled_from(TEXTS), score=st.floats(0, 1))
    def store(self, slot: str, text: str, score: float) -> None:
        tip = TipProposed(
            episode="e",
            slot=slot,
            key=f"key of {text}",
            score=score,
            text=text,
            prompt_ids=(),
            response_ids=(),
            token_logps=(),
            temperature=0.0,
            policy_version=0,
        )
        self.events += self.bank.store(tip, text_vector(tip.key))

    @rule(
        slot=st.sampled_from(SLOTS),
        ops=st.lists(
            st.tuples(
                st.sampled_from(["add", "update", "merge", "discard", "return"]),
                st.lists(st.integers(0, 30), max_size=2),
                st.sampled_from(TEXTS),
            ),
            max_size=3,
        ),
    )
    def extract(self, slot: str, ops: list[tuple[str, list[int], str]]) -> None:
        self.calls += 1
        triples = tuple(
            (op, () if op == "add" else tuple(ids), "" if op == "discard" else text)
            for op, ids, text in ops
        )
        called = ExtractorCalled(
            call=f"x{self.calls}",
            task="extract",
            source=f"ep{self.calls}",
            slot=slot,
            prompt_ids=(),
            response_ids=(),
            token_logps=(),
            text="",
            temperature=1.0,
            extractor_version=0,
            ops=triples,
        )
        contents = [c for op, _, c in triples if op not in ("discard", "return")]
        self.events += self.bank.apply(called, [text_vector(c) for c in contents])

    @rule(
        slot=st.sampled_from(SLOTS),
        seed=st.integers(0, 10_000),
        diverse=st.booleans(),
        read_only=st.booleans(),
    )
    def retrieve(self, slot: str, seed: int, diverse: bool, read_only: bool) -> None:
        req = RetrievalRequested(
            episode="q",
            worker="w",
            turn=0,
            slot=slot,
            query="",
            rule="diverse" if diverse else "threshold",
            k=1 if diverse else 0,
            read_only=read_only,
        )
        before = copy.deepcopy(self.bank.tips)
        self.events.append(self.bank.retrieve(req, vector(seed + 1_000_000)))
        if read_only:  # an evaluation's retrieval changes nothing training sees
            assert self.bank.tips == before

    @invariant()
    def rebuilt_bank_is_the_bank(self) -> None:
        rebuilt = TipBank(DIVERSE, DIM)
        for ev in self.events:
            rebuilt.evolve(ev, text_vector(ev.key) if isinstance(ev, TipStored) else None)
        assert rebuilt.tips == self.bank.tips
        assert rebuilt.slots() == self.bank.slots()
        for slot in SLOTS:
            assert rebuilt.entries(slot) == self.bank.entries(slot)
            probe = RetrievalRequested(episode="p", worker="w", turn=0, slot=slot, query="")
            q = vector(7)
            assert rebuilt.retrieve(probe, q) == self.bank.retrieve(probe, q)
        pick = RetrievalRequested(
            episode="p", worker="w", turn=0, slot=SLOTS[0], query="", rule="diverse", k=1
        )
        assert rebuilt.retrieve(pick, vector(8)) == copy.deepcopy(self.bank).retrieve(
            pick, vector(8)
        )


DIVERSE = MemorySettings(capacity=4, threshold=0.3, top_k=3, index="exact", recent=2, pool=3)

BankRebuiltFromItsEvents.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
TestBankRebuiltFromItsEvents = BankRebuiltFromItsEvents.TestCase


def test_an_operation_naming_an_entry_twice_evicts_it_once() -> None:
    """Found by ``BankRebuiltFromItsEvents``: ``update`` of entries (2, 2) raised KeyError."""
    bank = TipBank(DIVERSE, DIM)
    for text in ("tip 0", "tip 1", "tip 2"):
        tip = TipProposed(
            episode="e",
            slot="s",
            key=text,
            score=0.0,
            text=text,
            prompt_ids=(),
            response_ids=(),
            token_logps=(),
            temperature=0.0,
            policy_version=0,
        )
        bank.store(tip, text_vector(text))
    called = ExtractorCalled(
        call="x1",
        task="extract",
        source="ep1",
        slot="s",
        prompt_ids=(),
        response_ids=(),
        token_logps=(),
        text="",
        temperature=1.0,
        extractor_version=0,
        ops=(("update", (2, 2), "tip 3"),),
    )
    out = bank.apply(called, [text_vector("tip 3")])
    assert [type(e).__name__ for e in out] == ["TipEvicted", "TipStored"]
    assert bank.entries("s") == [0, 1, 3]
