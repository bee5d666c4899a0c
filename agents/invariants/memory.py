"""``lineage`` and ``retrievals``: a memory's entries come from somewhere, and what is shown
is there.

Every entry (``tip_stored``) is written once; the entries it replaced (``parents``) were
stored before it, so the lineage is a DAG, and every path down it ends at what wrote a first
entry: an extractor call (``call``, an ``extractor_called`` recorded before) or a policy's
reflection on an episode (``episode``, its ``tip_proposed`` recorded before). EMPO2's and
Complementary RL's memories work this way; a plug-in's memory may write entries of its own
making, so ``lineage`` is registered for those two methods only, and plug-ins that subclass
one and keep its actors (``CheckContext.built_on``); ``coevo check --invariant lineage`` runs
it on any run.

A retrieval (``tips_retrieved``) is well formed (one similarity, rank and text per entry:
:meth:`TipsRetrieved.unrecordable`) and shows entries held at that seq, with their stored texts
and writer calls, and an eviction (``tip_evicted``) removes an entry held in its slot. (Which slot
a retrieval may read is the memory's business: a plug-in's may answer a variant's request
from its family's list.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from agents.events.extractor import ExtractorCalled
from agents.events.memory import TipEvicted, TipProposed, TipsRetrieved, TipStored
from engine.events import Envelope, Event
from engine.invariants import CheckContext, InvariantViolated, invariant


@invariant("lineage", methods=("empo2", "complementary"))
class Lineage:
    """Lineage is a DAG ending at a call or a reflection: each entry is stored once, after the
    entries it replaced, and every entry without parents was written by an extractor call or a
    reflection recorded before it (a call named by any entry must be too)."""

    name = "lineage"

    def __init__(self, ctx: CheckContext | None = None) -> None:
        self._stored: dict[int, int] = {}  # entry -> seq of its tip_stored
        self._calls: dict[str, int] = {}  # call -> seq of its extractor_called
        self._reflections: dict[str, int] = {}  # episode -> seq of its (first) tip_proposed

    def check_many(self, envs: Sequence[Envelope[Event]]) -> None:
        for env in envs:
            ev = env.event
            kind = type(ev)
            if kind is TipStored:
                assert isinstance(ev, TipStored)
                self._entry(env.seq, ev)
            elif kind is ExtractorCalled:
                self._calls.setdefault(getattr(ev, "call"), env.seq)  # noqa: B009
            elif kind is TipProposed:
                self._reflections.setdefault(getattr(ev, "episode"), env.seq)  # noqa: B009

    def _entry(self, seq: int, ev: TipStored) -> None:
        if ev.tip_id in self._stored:
            first = self._stored[ev.tip_id]
            self._fail(seq, f"entry {ev.tip_id} stored again (first at seq {first})", first)
        for parent in ev.parents:
            if parent not in self._stored:
                self._fail(seq, f"entry {ev.tip_id} replaces entry {parent}, never stored before")
        if ev.call:
            if ev.call not in self._calls:
                self._fail(
                    seq, f"entry {ev.tip_id} written by call {ev.call!r}, not recorded before it"
                )
        elif not ev.parents and (not ev.episode or ev.episode not in self._reflections):
            self._fail(
                seq,
                f"entry {ev.tip_id} has no parents and names no extractor call and no "
                f"reflection (episode {ev.episode!r})",
            )
        self._stored[ev.tip_id] = seq

    def _fail(self, seq: int, detail: str, *involved: int) -> NoReturn:
        raise InvariantViolated(self.name, seq, detail, involved)

    def finish(self, completed: bool) -> None:
        return None


@invariant("retrievals")
class Retrievals:
    """Every retrieval names a live entry: what a retrieval shows is held at that seq (stored,
    not evicted since), with the text and writer call it was stored with, and an eviction
    removes an entry held in its slot."""

    name = "retrievals"

    def __init__(self, ctx: CheckContext | None = None) -> None:
        self._held: dict[int, tuple[str, str, str, int]] = {}  # entry -> slot, text, call, seq
        self._gone: dict[int, int] = {}  # entry -> seq of its eviction

    def check_many(self, envs: Sequence[Envelope[Event]]) -> None:
        for env in envs:
            ev = env.event
            kind = type(ev)
            if kind is TipsRetrieved:
                assert isinstance(ev, TipsRetrieved)
                self._shown(env.seq, ev)
            elif kind is TipStored:
                assert isinstance(ev, TipStored)
                self._held[ev.tip_id] = (ev.slot, ev.text, ev.call, env.seq)
                self._gone.pop(ev.tip_id, None)
            elif kind is TipEvicted:
                assert isinstance(ev, TipEvicted)
                self._check_held(env.seq, ev.tip_id, ev.slot, "evicts")
                del self._held[ev.tip_id]
                self._gone[ev.tip_id] = env.seq

    def _shown(self, seq: int, ev: TipsRetrieved) -> None:
        if why := ev.unrecordable():  # a log written before emit refused it
            self._fail(seq, f"tips_retrieved is malformed: {why}")
        for i, entry in enumerate(ev.tip_ids):
            text, call, stored = self._check_held(seq, entry, None, "shows")
            if i < len(ev.tips) and ev.tips[i] != text:
                self._fail(seq, f"shows entry {entry} with a text it was not stored with", stored)
            if i < len(ev.calls) and ev.calls[i] != call:
                self._fail(
                    seq, f"shows entry {entry} as written by {ev.calls[i]!r}, not {call!r}", stored
                )

    def _check_held(
        self, seq: int, entry: int, slot: str | None, verb: str
    ) -> tuple[str, str, int]:
        held = self._held.get(entry)
        if held is None:
            gone = self._gone.get(entry)
            if gone is not None:
                self._fail(seq, f"{verb} entry {entry}, evicted at seq {gone}", gone)
            self._fail(seq, f"{verb} entry {entry}, never stored")
        if slot is not None and held[0] != slot:
            self._fail(seq, f"{verb} entry {entry} of slot {held[0]!r} in {slot!r}", held[3])
        return held[1:]

    def _fail(self, seq: int, detail: str, *involved: int) -> NoReturn:
        raise InvariantViolated(self.name, seq, detail, involved)

    def finish(self, completed: bool) -> None:
        return None
