"""Rebuilding a bank from a run's logged requests with another extractor
(:mod:`agents.memory.bank_rebuild`), on hand-made logs and a scripted extractor: where extractions
and merge chunks are applied, how the shown entry is found in the rebuilt bank, and that a copy of
the rebuilt bank is its state and leaves it alone."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agents.events.extractor import (
    ExtractionRequested,
    ExtractorCalled,
    MergeDue,
    MergeRequested,
    Op,
)
from agents.events.memory import RetrievalRequested, TipEvicted, TipRejected, TipStored
from agents.memory.bank import MemorySettings
from agents.memory.bank_rebuild import (
    Extract,
    MergeApply,
    MergePass,
    RebuildSettings,
    bank_script,
    rebuild_bank,
)
from agents.models.embedder import make_embedder
from engine.events import Envelope, Event
from engine.seeds import derive_rng

SLOT = "train/heat"
RUN_SEED = 11
BANK = MemorySettings(index="exact")
EMBED = make_embedder("hashing", dim=32)


def embed(texts: Sequence[str]) -> list[np.ndarray]:
    return list(EMBED.embed(list(texts)))


def log(*events: Event) -> list[Envelope[Event]]:
    return [Envelope(seq=i, run="r", t=0, actor="a", event=ev) for i, ev in enumerate(events)]


def extraction(episode: str, entry: int = -1) -> ExtractionRequested:
    return ExtractionRequested(
        episode=episode,
        worker="w",
        slot=SLOT,
        entry=entry,
        messages=(("user", episode),),
        success=False,
        score=0.0,
        seed=len(episode),
    )


def merge(step: int, k: int, entries: tuple[int, ...] = (0, 1)) -> MergeRequested:
    seed = derive_rng(RUN_SEED, "merge", step, SLOT, k).getrandbits(63)
    return MergeRequested(step=step, slot=SLOT, entries=entries, messages=(), seed=seed)


def called(call: str, task: str = "extract", ops: tuple[Op, ...] = ()) -> ExtractorCalled:
    return ExtractorCalled(
        call=call,
        task=task,
        source="",
        slot=SLOT,
        prompt_ids=(),
        response_ids=(),
        token_logps=(),
        text="",
        temperature=1.0,
        extractor_version=0,
        ops=ops,
    )


def stored(tip_id: int, text: str) -> TipStored:
    return TipStored(tip_id=tip_id, slot=SLOT, episode="", text=text, score=0.0, key=text)


class Scripted:
    """An extractor that answers each extraction from a table (``"E"`` in an operation's ids
    names the entry it was shown) and merges the first two entries of every chunk."""

    def __init__(self, table: dict[str, list[tuple[str, str, str]]]) -> None:
        self.table = table
        self.asked: list[str] = []

    def __call__(
        self, requests: Sequence[ExtractionRequested | MergeRequested], calls: Sequence[str]
    ) -> list[ExtractorCalled]:
        out = []
        for req, call in zip(requests, calls, strict=True):
            if isinstance(req, MergeRequested):
                self.asked.append(f"merge {req.step}")
                text = "+".join(str(i) for i in req.entries[:2])
                out.append(called(call, "merge", (("merge", req.entries[:2], f"merged {text}"),)))
                continue
            self.asked.append(req.episode)
            ops = tuple(
                (op, (req.entry,) if ids == "E" else (), content)
                for op, ids, content in self.table[req.episode]
            )
            out.append(called(call, ops=ops))
        return out


def rebuild(events: list[Envelope[Event]], answer: Scripted, chunk: int = 2):
    settings = RebuildSettings(run_seed=RUN_SEED, merge_chunk=chunk, merge_max=16, batch=2)
    return rebuild_bank(bank_script(events), answer, embed, BANK, EMBED.dim, settings)


def test_the_script_follows_where_the_run_applied_each_answer() -> None:
    events = log(
        extraction("ep1"),  # 0
        extraction("ep2"),  # 1
        called("x1"),  # ep2 answered first
        called("x0"),
        MergeDue(step=1),  # 4
        merge(1, 0),  # 5
        merge(1, 2),  # 6
        called("x6", "merge"),
        extraction("ep3"),  # 8: never answered (the run stopped)
        called("x5", "merge"),
        MergeDue(step=2),  # 10: a pass with no chunk
    )
    script = bank_script(events)
    assert script.actions == (
        Extract(1, extraction("ep2"), None),
        Extract(0, extraction("ep1"), None),
        MergePass(1, 2),
        MergeApply(1, merge(1, 2).seed, False),
        MergeApply(1, merge(1, 0).seed, True),
        MergePass(2, 0),
    )
    assert (script.extractions, script.passes, script.merge_calls) == (2, 2, 2)


def test_an_update_of_the_shown_entry_names_the_rebuilt_entry_with_its_text() -> None:
    events = log(
        extraction("ep1"),
        called("x0"),
        stored(40, "take the jug"),  # the run's own bank numbered it 40
        extraction("ep2", entry=40),
        called("x3"),
        extraction("ep3", entry=41),  # shown an entry the rebuilt bank never wrote
        called("x5"),
    )
    answer = Scripted(
        {
            "ep1": [("add", "", "take the jug")],
            "ep2": [("update", "E", "take the jug, then heat it")],
            "ep3": [("update", "E", "never stored")],
        }
    )
    out = rebuild(events, answer)
    assert out.entries() == {SLOT: ["take the jug, then heat it"]}
    assert TipEvicted(tip_id=0, slot=SLOT, reason="update") in out.events
    assert [ev.reason for ev in out.events if isinstance(ev, TipRejected)] == ["gone"]
    update = next(ev for ev in out.events if isinstance(ev, TipStored) and ev.tip_id == 1)
    assert update.parents == (0,)


def test_merge_chunks_are_applied_where_the_run_applied_them() -> None:
    adds = [extraction(f"ep{i}") for i in range(3)]
    events = log(
        *adds,  # 0..2
        called("x0"),
        called("x1"),
        called("x2"),
        MergeDue(step=1),  # 6: the rebuilt bank holds a, b, c: one chunk (a, b); c alone
        merge(1, 0),  # 7
        extraction("ep3"),  # 8
        called("x8"),  # d is added before the run applied its merge
        called("x7", "merge"),
    )
    table = {f"ep{i}": [("add", "", t)] for i, t in enumerate("abcd")}
    out = rebuild(events, Scripted(table))
    assert out.entries() == {SLOT: ["c", "d", "merged 0+1"]}
    assert out.stats().calls == {"extract": 4, "merge": 1}


def test_rebuilt_chunks_the_run_lacked_follow_its_last_chunk_or_apply_at_once() -> None:
    table = {f"ep{i}": [("add", "", t)] for i, t in enumerate("abcde")}
    events = log(
        *[extraction(f"ep{i}") for i in range(4)],  # 0..3
        *[called(f"x{i}") for i in range(4)],  # a b c d: two chunks of 2 in the rebuilt bank
        MergeDue(step=1),  # 8
        merge(1, 0),  # 9: the run had one chunk only
        called("x9", "merge"),
        extraction("ep4"),  # 11
        called("x11"),
        MergeDue(step=2),  # 13: no chunk in the run: the rebuilt pass applies at once
    )
    answer = Scripted(table)
    out = rebuild(events, answer)
    assert answer.asked == ["ep0", "ep1", "ep2", "ep3", "ep4", "merge 1", "merge 1", "merge 2"]
    # pass 1 merged (a, b) then (c, d); e came after; pass 2 merged the two merged entries
    assert out.entries() == {SLOT: ["e", "merged 4+5"]}


def test_a_copy_is_the_rebuilt_bank_and_its_retrievals_leave_the_rebuilt_one_alone() -> None:
    table = {f"ep{i}": [("add", "", t)] for i, t in enumerate(["heat it", "open it", "x"])}
    events = log(*[extraction(f"ep{i}") for i in range(3)], *[called(f"x{i}") for i in range(3)])
    out = rebuild(events, Scripted(table))
    first, second = out.copy(), out.copy()
    ask = RetrievalRequested(
        episode="q", worker="w", turn=0, slot=SLOT, query="heat it", rule="diverse", k=1
    )
    vec = embed(["heat it"])[0]
    picks = [first.retrieve(ask, vec).tip_ids for _ in range(3)]
    assert picks[0] == (0,) and len(set(picks)) > 1  # the diversity penalty moves on
    assert second.retrieve(ask, vec).tip_ids == (0,)  # a fresh copy: nothing retrieved yet
    assert all(t.retrieved == 0 for t in out.bank.tips.values())
    assert first.entries(SLOT) == out.bank.entries(SLOT) == [0, 1, 2]
