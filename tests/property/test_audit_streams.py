"""``coevo audit`` on generated event streams: re-derived credit and advantages equal the
recorded ones, every entry's lineage is a finite DAG ending at an extractor call or a
reflection, and every retrieval names an entry that was in the bank at that seq."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_credit_stream import oracle, streams

from agents.audit.answers import audit_tip, lineage
from agents.audit.credit import audit_credit
from agents.audit.derive import derive_credits
from agents.audit.index import refresh
from agents.audit.inputs import AuditSettings, gather, with_overrides
from agents.events.episodes import EpisodeFinished
from agents.events.extractor import CreditAssigned, ExtractorCalled, ExtractorGradientRequested
from agents.events.memory import (
    RetrievalRequested,
    TipEvicted,
    TipProposed,
    TipsRetrieved,
    TipStored,
)
from agents.events.policy import AdvantagesComputed
from agents.learning.credit_actor import CreditSettings
from agents.memory.bank import MemorySettings, TipBank
from agents.methods.builtin import Complementary
from agents.methods.settings import ComplementaryConfig, GrpoConfig
from engine.eventlog import MemoryEventLog
from engine.events import Envelope, Event
from stores.fact_index import MemoryFactIndex

DIM = 4
SLOTS = ("train/heat", "train/unlock")
BANK = MemorySettings(capacity=3, threshold=-1.0, top_k=3, index="exact", pool=2, recent=2)


class Log:
    """Envelopes numbered as they are appended to an in-memory event log."""

    def __init__(self) -> None:
        self.log = MemoryEventLog()
        self.events: list[tuple[int, Event]] = []
        self.causes: dict[int, int | None] = {}

    def add(self, ev: Event, cause: int | None = None) -> int:
        seq = self.log.next_seq
        self.log.append([Envelope(seq=seq, run="r", t=0, actor="a", event=ev, cause=cause)])
        self.events.append((seq, ev))
        self.causes[seq] = cause
        return seq


def _vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


actions = st.lists(
    st.one_of(
        st.tuples(
            st.just("reflect"), st.sampled_from(SLOTS), st.integers(0, 6), st.integers(0, 99)
        ),
        st.tuples(
            st.just("call"),
            st.sampled_from(SLOTS),
            st.sampled_from(["add", "update", "merge", "rewrite", "discard", "return"]),
            st.lists(st.integers(0, 3), max_size=3, unique=True),  # positions in the slot; 3: gone
            st.integers(0, 6),
            st.integers(0, 99),
        ),
        st.tuples(st.just("retrieve"), st.sampled_from(SLOTS), st.booleans(), st.integers(0, 99)),
    ),
    min_size=1,
    max_size=40,
)


def _play(plan: list[tuple]) -> Log:
    """Run ``plan`` through the real tip bank, recording what it emits."""
    out, bank = Log(), TipBank(BANK, DIM)
    for n, action in enumerate(plan):
        if action[0] == "reflect":
            _, slot, text, seed = action
            tip = TipProposed(
                episode=f"ep{n}",
                slot=slot,
                key="k",
                score=0.5,
                text=f"tip {text}",
                prompt_ids=(),
                response_ids=(),
                token_logps=(),
                temperature=0.0,
                policy_version=0,
            )
            cause = out.add(tip)
            for ev in bank.store(tip, _vector(seed)):
                out.add(ev, cause)
        elif action[0] == "call":
            _, slot, op, picks, text, seed = action
            entries = bank.entries(slot)
            ids = tuple(entries[p] if p < len(entries) else 10_000 + p for p in picks)
            ids = () if op in ("add", "return") else ids or tuple(entries[:1]) or (10_000,)
            called = ExtractorCalled(
                call=f"x{n}",
                task="extract",
                source=f"ep{n}",
                slot=slot,
                prompt_ids=(),
                response_ids=(),
                token_logps=(),
                text="",
                temperature=1.0,
                extractor_version=0,
                ops=((op, ids, f"note {text}" if op != "discard" else ""),),
            )
            cause = out.add(called)
            vectors = [] if op in ("discard", "return") else [_vector(seed)]
            for ev in bank.apply(called, vectors):
                out.add(ev, cause)
        else:
            _, slot, diverse, seed = action
            req = RetrievalRequested(
                episode=f"ep{n}",
                worker="w",
                turn=0,
                slot=slot,
                query="q",
                rule="diverse" if diverse else "threshold",
                k=1,
            )
            cause = out.add(req)
            out.add(bank.retrieve(req, _vector(seed)), cause)
    return out


@settings(max_examples=60, deadline=None)
@given(plan=actions)
def test_lineage_is_a_finite_dag_ending_at_a_call_or_a_reflection(plan: list[tuple]) -> None:
    out = _play(plan)
    index = MemoryFactIndex()
    refresh(out.log, index)
    stored = {ev.tip_id: (seq, ev) for seq, ev in out.events if isinstance(ev, TipStored)}
    for tip, (seq, ev) in stored.items():
        node = lineage(index, tip)
        assert node.seq == seq and [p.tip for p in node.parents] == list(ev.parents)
        stack = [node]
        while stack:  # every parent was stored before its child: no cycle, a finite walk
            n = stack.pop()
            assert all(p.seq is not None and p.seq < n.seq for p in n.parents)  # type: ignore[operator]
            stack.extend(n.parents)
        origin = audit_tip(out.log, index, tip).origin
        cause = out.causes[seq]
        assert cause is not None
        written_by = dict(out.events)[cause]
        if ev.call:
            assert origin.kind == "extractor" and isinstance(written_by, ExtractorCalled)
            assert origin.call == ev.call == written_by.call
        else:
            assert origin.kind == "reflection" and isinstance(written_by, TipProposed)
            assert origin.source == ev.episode == written_by.episode


@settings(max_examples=60, deadline=None)
@given(plan=actions)
def test_every_retrieval_names_an_entry_in_the_bank_at_that_seq(plan: list[tuple]) -> None:
    out = _play(plan)
    index = MemoryFactIndex()
    refresh(out.log, index)
    stored: dict[int, int] = {}
    evicted: dict[int, int] = {}
    for seq, ev in out.events:
        if isinstance(ev, TipStored):
            stored[ev.tip_id] = seq
        elif isinstance(ev, TipEvicted):
            evicted[ev.tip_id] = seq
    for seq, ev in out.events:
        if not isinstance(ev, TipsRetrieved):
            continue
        for tip in ev.tip_ids:
            assert stored[tip] < seq and evicted.get(tip, math.inf) > seq
            [use] = [u for u in audit_tip(out.log, index, tip).uses if u.seq == seq]
            assert use.alive and use.episode == ev.episode


def _group_advantages(rewards: list[float], guided: list[bool]) -> list[float]:
    """Mean-only subgroup advantages times the subgroup weights, written out independently."""
    n, n_guided = len(rewards), sum(guided)
    out = []
    for r, g in zip(rewards, guided, strict=True):
        sub = [x for x, h in zip(rewards, guided, strict=True) if h == g]
        a = 0.0 if max(sub) == min(sub) else r - math.fsum(sub) / len(sub)
        w = 1.0 if n_guided in (0, n) else n / (2 * (n_guided if g else n - n_guided))
        out.append(a * w)
    return out


def _recorded(stream: list[Event], s: CreditSettings) -> MemoryEventLog:
    """The stream as a run records it: each credit-actor output right after its cause (the
    outputs an oracle written from the paper's definitions gives, not ``CreditBook``'s, which
    the audit re-derives with), and a group's advantages once its four episodes (in finishing
    order) have ended."""
    out = Log()
    shown = {ev.episode for ev in stream if isinstance(ev, TipsRetrieved) and ev.turn == 0}
    group: list[EpisodeFinished] = []
    for ev, outputs in zip(stream, oracle(stream, s), strict=True):
        cause = out.add(ev)
        for made in outputs:
            out.add(made, cause)
        if isinstance(ev, EpisodeFinished) and ev.purpose == "train":
            group.append(ev)
        if len(group) == 4:
            rewards = [e.score for e in group]
            guided = [e.episode in shown for e in group]
            mean = math.fsum(rewards) / 4
            std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / 3)
            out.add(
                AdvantagesComputed(
                    group=f"g{cause}",
                    update=0,
                    family="heat",
                    variant=1,
                    episodes=tuple(e.episode for e in group),
                    rewards=tuple(rewards),
                    advantages=tuple(_group_advantages(rewards, guided)),
                    rule="subgroup-mean-weighted-score",
                    eps=1e-6,
                    mean=mean,
                    std=std,
                    rollouts=tuple("guided" if g else "plain" for g in guided),
                )
            )
            group = []
    return out.log


COMPLEMENTARY = Complementary(GrpoConfig(), ComplementaryConfig())
"""The method the recorded groups were scored by (its default settings)."""


def _no_method(sets: object) -> Complementary:
    raise AssertionError(f"no method setting is overridden here: {sets}")


@settings(max_examples=100, deadline=None)
@given(
    stream=streams(),
    batch=st.integers(1, 4),
    cooldown=st.integers(0, 2),
    rule=st.sampled_from(["success", "score"]),
)
def test_re_derived_credit_and_advantages_equal_the_recorded(
    stream: list[Event], batch: int, cooldown: int, rule: str
) -> None:
    s = CreditSettings(batch=batch, cooldown=cooldown, rule=rule)
    base = AuditSettings(credit=s, method=COMPLEMENTARY)
    inputs = gather(_recorded(stream, s))
    a = audit_credit(inputs, base, base)
    assert a.match and not a.counterfactual
    assert all(c.equal == c.recorded == c.derived and c.pending == 0 for c in a.checks)
    assert a.credits_changed == a.samples_changed == 0
    # no reweighting: every weight 1, every reward as before
    flat = derive_credits(inputs, with_overrides(base, None, ["reweight=false"], _no_method))
    recorded = [e for e in inputs.recorded if isinstance(e, ExtractorGradientRequested)]
    derived = [e for e in flat if isinstance(e, ExtractorGradientRequested)]
    assert [r.rewards for r in derived] == [r.rewards for r in recorded]
    assert all(w == 1.0 for r in derived for w in r.weights)
    # relative: each credit is the episode's score minus its group's free mean (0 if none)
    rel = derive_credits(inputs, with_overrides(base, "relative", [], _no_method))
    baseline: dict[str, float] = {}
    for _, g in inputs.groups:
        free = [r for r, ro in zip(g.rewards, g.rollouts, strict=True) if ro == "plain"]
        for ep, r in zip(g.episodes, g.rewards, strict=True):
            baseline[ep] = r - (math.fsum(free) / len(free) if free else 0.0)
    credits = [e for e in rel if isinstance(e, CreditAssigned)]
    assert [c.credit for c in credits] == [baseline.get(c.episode, 0.0) for c in credits]
