"""The tip bank (EMPO2's memory): storing, dedup, FIFO eviction and retrieval, against
hand-computed answers."""

from __future__ import annotations

import numpy as np
import pytest

from agents.events.extractor import ExtractorCalled
from agents.events.memory import (
    RetrievalRequested,
    TipEvicted,
    TipProposed,
    TipRejected,
    TipsRetrieved,
    TipStored,
)
from agents.memory.bank import MemorySettings, TipBank

SLOT = "train/heat/3"


def unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def proposed(text: str, score: float = 0.0, slot: str = SLOT, episode: str = "ep") -> TipProposed:
    return TipProposed(
        episode=episode,
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


def query(slot: str = SLOT) -> RetrievalRequested:
    return RetrievalRequested(episode="q", worker="w", turn=2, slot=slot, query="now: ...")


@pytest.fixture(params=["exact", "usearch"])
def bank(request: pytest.FixtureRequest) -> TipBank:
    return TipBank(MemorySettings(capacity=3, threshold=0.5, top_k=2, index=request.param), dim=3)


def test_store_numbers_tips_and_records_them(bank: TipBank) -> None:
    out = bank.store(proposed(" take clay jug. ", 0.3, episode="ep1"), unit(1, 0, 0))
    assert out == [
        TipStored(
            tip_id=0,
            slot=SLOT,
            episode="ep1",
            text="take clay jug.",
            score=0.3,
            key="key of  take clay jug. ",
        )
    ]
    assert bank.store(proposed("b"), unit(0, 1, 0))[0].tip_id == 1  # type: ignore[attr-defined]
    assert bank.size(SLOT) == 2


def test_exact_duplicates_and_empty_tips_are_rejected(bank: TipBank) -> None:
    bank.store(proposed("same tip"), unit(1, 0, 0))
    assert bank.store(proposed("same tip ", episode="ep2"), unit(0, 1, 0)) == [
        TipRejected(episode="ep2", slot=SLOT, reason="duplicate", duplicate_of=0)
    ]
    assert bank.store(proposed("  \n", episode="ep3"), unit(0, 1, 0)) == [
        TipRejected(episode="ep3", slot=SLOT, reason="empty")
    ]
    # dedup is per slot: another variant may hold the same text
    other = bank.store(proposed("same tip", slot="train/heat/4"), unit(1, 0, 0))
    assert isinstance(other[0], TipStored)
    assert bank.size(SLOT) == 1


def test_a_full_slot_evicts_its_oldest_tip(bank: TipBank) -> None:
    for i, text in enumerate("abc"):
        bank.store(proposed(text), unit(1, i, 0))
    out = bank.store(proposed("d"), unit(0, 0, 1))
    assert isinstance(out[0], TipStored) and out[1:] == [TipEvicted(tip_id=0, slot=SLOT)]
    assert bank.size(SLOT) == 3
    # the evicted text is no longer a duplicate
    assert isinstance(bank.store(proposed("a"), unit(1, 0, 0))[0], TipStored)


def test_retrieval_keeps_the_top_k_above_threshold_ordered_by_score(bank: TipBank) -> None:
    bank.store(proposed("far", score=1.0), unit(0, 0, 1))  # similarity 0 to the query
    bank.store(proposed("close", score=0.1), unit(1, 0.1, 0))  # ~0.995
    bank.store(proposed("closer, better", score=0.9), unit(1, 0.5, 0))  # ~0.894
    got = bank.retrieve(query(), unit(1, 0, 0))
    assert isinstance(got, TipsRetrieved)
    assert got.tip_ids == (2, 1)  # by stored score
    assert got.ranks == (1, 0)  # by similarity
    assert got.tips == ("closer, better", "close")
    assert got.similarities == pytest.approx((2 / np.sqrt(5), 1 / np.sqrt(1.01)), abs=1e-5)
    assert (got.similar, got.slot_size) == (2, 3)


def test_the_threshold_and_top_k_bound_what_is_retrieved() -> None:
    bank = TipBank(MemorySettings(threshold=0.6, top_k=2, index="exact"), dim=2)
    for i, v in enumerate([unit(0.6, 0.8), unit(1, 0), unit(1, 0.01), unit(1, 0.02)]):
        bank.store(proposed(f"t{i}"), v)
    got = bank.retrieve(query(), unit(1, 0))
    assert got.tip_ids == (1, 2) and got.similar == 2  # capped at top_k
    half = TipBank(MemorySettings(threshold=0.5, index="exact"), dim=2)
    half.store(proposed("edge"), unit(1.0, 0.0))
    above, below = 0.5 + 1e-3, 0.5 - 1e-3
    assert half.retrieve(query(), unit(above, (1 - above**2) ** 0.5)).similar == 1
    assert half.retrieve(query(), unit(below, (1 - below**2) ** 0.5)).similar == 0


def test_slots_are_separate_and_an_empty_slot_answers_nothing(bank: TipBank) -> None:
    bank.store(proposed("x", slot="adapt0-t1/heat/1000000"), unit(1, 0, 0))
    got = bank.retrieve(query(), unit(1, 0, 0))
    assert (got.tip_ids, got.similar, got.slot_size) == ((), 0, 0)


def test_settings_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="capacity, top_k and pool"):
        MemorySettings(capacity=0)
    with pytest.raises(ValueError, match="threshold"):
        MemorySettings(threshold=1.0)


# ---------------------------------------------------------------------------------------------
# Complementary RL: extractor operations and diversified retrieval


def called(*ops: tuple[str, tuple[int, ...], str], call: str = "x9") -> ExtractorCalled:
    return ExtractorCalled(
        call=call,
        task="extract",
        source="ep7",
        slot=SLOT,
        prompt_ids=(),
        response_ids=(),
        token_logps=(),
        text="",
        temperature=1.0,
        extractor_version=0,
        ops=ops,
    )


def test_operations_add_replace_and_discard_with_their_lineage() -> None:
    bank = TipBank(MemorySettings(index="exact"), dim=3)
    out = bank.apply(
        called(("add", (), "a"), ("add", (), "b"), ("return", (), "")),
        [unit(1, 0, 0), unit(0, 1, 0)],
    )
    assert [(e.tip_id, e.call, e.parents) for e in out] == [(0, "x9", ()), (1, "x9", ())]  # type: ignore[attr-defined]
    out = bank.apply(called(("merge", (0, 1), "a and b"), call="x10"), [unit(1, 1, 0)])
    assert out[:2] == [
        TipEvicted(tip_id=0, slot=SLOT, reason="merge"),
        TipEvicted(tip_id=1, slot=SLOT, reason="merge"),
    ]
    stored = out[2]
    assert isinstance(stored, TipStored) and (stored.tip_id, stored.parents, stored.call) == (
        2,
        (0, 1),
        "x10",
    )
    out = bank.apply(called(("update", (0,), "gone"), ("discard", (2,), "")), [unit(0, 0, 1)])
    assert out == [
        TipRejected(episode="ep7", slot=SLOT, reason="gone", call="x9"),
        TipEvicted(tip_id=2, slot=SLOT, reason="discard"),
    ]
    assert bank.size(SLOT) == 0


def test_diverse_retrieval_penalises_popular_and_recent_entries() -> None:
    bank = TipBank(MemorySettings(index="exact", lam=0.4, recent=1), dim=3)
    bank.apply(called(("add", (), "best"), ("add", (), "second")), [unit(1, 0, 0), unit(1, 0.3, 0)])
    ask = RetrievalRequested(
        episode="q", worker="w", turn=0, slot=SLOT, query="", rule="diverse", k=1
    )
    first = bank.retrieve(ask, unit(1, 0, 0))
    assert first.tip_ids == (0,) and first.calls == ("x9",) and first.scores == (0.0,)
    # "best" was just picked: -0 - 0.4 log 2 - 1 < "second"'s -1
    second = bank.retrieve(ask, unit(1, 0, 0))
    assert second.tip_ids == (1,) and second.scores == (-1.0,)
    # both were picked once; only "second" was picked in the last retrieval (the window of 1)
    third = bank.retrieve(ask, unit(1, 0, 0))
    assert third.tip_ids == (0,)
    assert third.scores == pytest.approx((-0.4 * np.log(2),))


def test_an_evaluation_retrieval_leaves_what_training_retrieves_unchanged() -> None:
    """A read-only ("diverse") retrieval, an evaluation episode's, answers like a training one
    would but counts no pick: the bank's counts and recency stay, and the next training
    retrieval answers as if the evaluation never happened. The bank rebuilt from its events
    (a resumed run) agrees."""
    settings = MemorySettings(index="exact", lam=0.4, recent=1)
    ops = called(("add", (), "best"), ("add", (), "second"))
    vectors = [unit(1, 0, 0), unit(1, 0.3, 0)]

    def ask(read_only: bool) -> RetrievalRequested:
        return RetrievalRequested(
            episode="q",
            worker="w",
            turn=0,
            slot=SLOT,
            query="",
            rule="diverse",
            k=1,
            read_only=read_only,
        )

    evaluated, untouched = TipBank(settings, dim=3), TipBank(settings, dim=3)
    events = evaluated.apply(ops, vectors)
    untouched.apply(ops, vectors)
    train = [evaluated.retrieve(ask(False), unit(1, 0, 0))]
    untouched.retrieve(ask(False), unit(1, 0, 0))
    state = [(t.retrieved, t.last_pick) for t in evaluated.tips.values()]
    peeks = [evaluated.retrieve(ask(True), unit(1, 0, 0)) for _ in range(3)]
    assert all(p.read_only and p.tip_ids == (1,) for p in peeks)  # training's next pick
    assert [(t.retrieved, t.last_pick) for t in evaluated.tips.values()] == state
    after = evaluated.retrieve(ask(False), unit(1, 0, 0))
    assert after == untouched.retrieve(ask(False), unit(1, 0, 0))
    assert after.tip_ids == (1,) and not after.read_only
    rebuilt = TipBank(settings, dim=3)
    for ev in [*events, *train, *peeks, after]:
        rebuilt.evolve(ev, vectors[ev.tip_id] if isinstance(ev, TipStored) else None)
    assert rebuilt.tips == evaluated.tips
    assert rebuilt.retrieve(ask(False), unit(1, 0, 0)) == evaluated.retrieve(
        ask(False), unit(1, 0, 0)
    )
