"""The tip bank on usearch against a brute-force reference: random stores (with duplicates and
evictions) and retrievals over a few slots must give the same events."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from agents.memory import MemorySettings, TipBank
from agents.memory_events import RetrievalRequested, TipProposed, TipRejected, TipStored

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
