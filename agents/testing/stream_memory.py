"""The memory side of :class:`agents.testing.streams.StreamBuilder`: the stream being written
(each event's seq and cause, the credit actor's fold run on what it reads) and what the memory
and the extractor emit into it: retrievals answered from the bank, reflections stored as tips,
extractions and merges answered by the extractor's operations, credits and the extractor's
updates. Played by the builder's episode operations, never on its own.

Needs Hypothesis only through :mod:`agents.testing.streams`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from agents.events.episodes import EpisodeAbandoned, EpisodeFinished
from agents.events.extractor import (
    ExtractionRequested,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
    MergeDue,
    MergePlanned,
    MergeRequested,
)
from agents.events.memory import (
    ReflectionRequested,
    TipEvicted,
    TipProposed,
    TipRejected,
    TipsRetrieved,
    TipStored,
)
from agents.learning.credit_actor import CreditBook, CreditSettings
from engine.events import Envelope, Event

__all__ = ["CREDIT", "MEMORIES", "Entry", "Episode", "Memory", "StreamMemory"]

Memory = Literal["none", "tips", "extractor"]
"""What the stream's memory is: none, EMPO2-like reflections, or a Complementary RL extractor."""
MEMORIES: tuple[Memory, ...] = get_args(Memory)

CREDIT = CreditSettings(batch=1)
"""The credit actor's settings streams are made with (an extractor request per credit)."""


@dataclass
class Episode:
    """An episode being played: what the builder's operations and the memory's answers read."""

    family: str
    index: int
    worker: str  # the worker playing it (one episode at a time, as the scheduler keeps it)
    assigned: int  # the seq of its assignment
    started: bool = False
    turns: int = 0  # steps taken
    entry: int = -1  # the entry a guided episode was shown at turn 0
    round: int = -1  # the evaluation round it belongs to (-1: a training episode)
    waiting: Literal["", "tips", "action"] = ""  # what its open request asks for
    asked: int = -1  # the seq of its open request
    last: int = -1  # the seq its worker last handled (its last action, else its assignment)


@dataclass
class Entry:
    """A bank entry: its slot, text and the extractor call that wrote it ("" for a tip)."""

    slot: str
    text: str
    call: str


@dataclass
class StreamMemory:
    """The stream and its memory (pure: no clock, no randomness of its own).

    Attributes:
        memory: the stream's memory.
        credit: the credit actor's settings (:data:`CREDIT`: an extractor request per credit).
        envs: the stream so far (since the last :meth:`take`).
    """

    memory: Memory = "none"
    credit: CreditSettings = CREDIT
    envs: list[Envelope[Event]] = field(default_factory=list[Envelope[Event]])
    _seq: int = 0
    _policy: int = 0  # the policy's version (a tip records the one that wrote it)
    _handled: int | None = None  # the seq the trainer last handled (the cause of what it emits)
    _bank: dict[int, Entry] = field(default_factory=dict[int, Entry])
    _next_entry: int = 0
    _extractor: int = 0
    _merges: int = 0
    _credit: CreditBook = field(default_factory=CreditBook)

    def take(self) -> list[Envelope[Event]]:
        """The envelopes added since the last call (a long stream, written out as it goes)."""
        out, self.envs = self.envs, []
        return out

    def add(self, ev: Event, cause: int | None = None, actor: str = "a", corr: str = "") -> int:
        """Append ``ev``; returns its seq."""
        seq, self._seq = self._seq, self._seq + 1
        self.envs.append(
            Envelope(seq=seq, run="r", t=seq, actor=actor, event=ev, cause=cause, corr=corr)
        )
        if isinstance(ev, TipsRetrieved | EpisodeFinished | EpisodeAbandoned):
            for out in self._credit.decide(ev, self.credit):
                self._credited(out, seq)
        return seq

    def _tips(self, episode: str, e: Episode, pick: int) -> int:
        """The memory's answer to the open retrieval (an entry of the slot ``pick`` chooses,
        or none); returns its seq (the worker's action request follows it)."""
        worker, slot = e.worker, f"train/{e.family}"
        diverse = self.memory == "extractor"
        held = sorted(i for i, x in self._bank.items() if x.slot == slot)
        shown = held[pick % len(held) :][:1] if held and (pick % 3 or diverse) else []
        if diverse and shown:
            e.entry = shown[0]
        retrieved = self.add(
            TipsRetrieved(
                episode=episode,
                worker=worker,
                turn=e.turns,
                slot=slot,
                tip_ids=tuple(shown),
                similarities=tuple(0.5 for _ in shown),
                ranks=tuple(range(len(shown))),
                tips=tuple(self._bank[i].text for i in shown),
                similar=len(shown),
                slot_size=len(held),
                calls=tuple(self._bank[i].call for i in shown),
            ),
            cause=e.asked,
            actor="memory",
            corr=episode,
        )
        e.waiting = ""
        return retrieved

    def _reflect(
        self, episode: str, e: Episode, worker: str, success: bool, pick: int, cause: int
    ) -> None:
        slot = f"train/{e.family}"
        asked = self.add(
            ReflectionRequested(
                episode=episode,
                worker=worker,
                slot=slot,
                messages=(("user", "reflect"),),
                key="k",
                score=1.0 if success else 0.0,
                success=success,
                seed=e.index,
            ),
            cause=cause,
            actor=worker,
            corr=episode,
        )
        text = f"tip {pick % 4}"
        tip = TipProposed(
            episode=episode,
            slot=slot,
            key="k",
            score=1.0,
            text=text,
            prompt_ids=(1,),
            response_ids=(2,),
            token_logps=(-0.1,),
            temperature=1.0,
            policy_version=self._policy,
        )
        proposed = self.add(tip, cause=asked, actor="inference", corr=episode)
        same = [i for i, x in self._bank.items() if x.slot == slot and x.text == text]
        if same:
            rejected = TipRejected(
                episode=episode, slot=slot, reason="duplicate", duplicate_of=same[0]
            )
            self.add(rejected, cause=proposed, actor="memory", corr=episode)
        else:
            self._store(slot, text, "", episode, (), proposed)

    def _extract(
        self, episode: str, e: Episode, worker: str, success: bool, pick: int, cause: int
    ) -> None:
        slot = f"train/{e.family}"
        asked = self.add(
            ExtractionRequested(
                episode=episode,
                worker=worker,
                slot=slot,
                entry=e.entry,
                messages=(("user", "extract"),),
                success=success,
                score=1.0 if success else 0.0,
                seed=e.index,
            ),
            cause=cause,
            actor=worker,
            corr=episode,
        )
        update = e.entry in self._bank and pick % 2 == 1
        parents = (e.entry,) if update else ()
        text = f"entry from {episode}"
        op = ("update", parents, text) if update else ("add", (), text)
        self._call("extract", episode, slot, asked, (op,), episode)

    def merge(self, pick: int) -> None:
        """A merge pass (the trainer's ``merge_due``, the memory's ``merge_planned``) of at most
        one chunk: two entries of one slot, answered by one merged entry."""
        if self.memory != "extractor":
            return
        slots = sorted({x.slot for x in self._bank.values()})
        chunks = [s for s in slots if sum(x.slot == s for x in self._bank.values()) >= 2]
        step, self._merges = self._merges, self._merges + 1
        due = self.add(MergeDue(step=step), cause=self._handled, actor="trainer")
        if not chunks:
            self.add(MergePlanned(step=step, requests=0), cause=due, actor="memory")
            return
        slot = chunks[pick % len(chunks)]
        entries = tuple(sorted(i for i, x in self._bank.items() if x.slot == slot)[:2])
        asked = self.add(
            MergeRequested(
                step=step, slot=slot, entries=entries, messages=(("user", "merge"),), seed=step
            ),
            cause=due,
            actor="memory",
        )
        self.add(MergePlanned(step=step, requests=1), cause=due, actor="memory")
        op = ("merge", entries, f"merged {entries}")
        self._call("merge", f"merge{step}", slot, asked, (op,), "")

    def _call(
        self,
        task: str,
        source: str,
        slot: str,
        asked: int,
        ops: tuple[tuple[str, tuple[int, ...], str], ...],
        episode: str,
    ) -> None:
        call = f"x{asked}"
        called = self.add(
            ExtractorCalled(
                call=call,
                task=task,
                source=source,
                slot=slot,
                prompt_ids=(1,),
                response_ids=(2,),
                token_logps=(-0.2,),
                text="ops",
                temperature=1.0,
                extractor_version=self._extractor,
                ops=ops,
            ),
            cause=asked,
            actor="extractor",
        )
        for _, parents, text in ops:
            self._store(slot, text, call, episode, parents, called)
            for parent in parents:
                del self._bank[parent]
                reason = "merge" if task == "merge" else "update"
                self.add(
                    TipEvicted(tip_id=parent, slot=slot, reason=reason),
                    cause=called,
                    actor="memory",
                )

    def _store(
        self, slot: str, text: str, call: str, episode: str, parents: tuple[int, ...], cause: int
    ) -> None:
        tip_id, self._next_entry = self._next_entry, self._next_entry + 1
        self._bank[tip_id] = Entry(slot, text, call)
        self.add(
            TipStored(
                tip_id=tip_id,
                slot=slot,
                episode=episode,
                text=text,
                score=1.0,
                key="k",
                call=call,
                parents=parents,
            ),
            cause=cause,
            actor="memory",
        )

    def _credited(self, ev: Event, cause: int) -> None:
        """What the credit actor emitted after ``cause`` (a credit, an extractor request),
        with the extractor's update answering each request."""
        seq = self.add(ev, cause=cause, actor="credit")
        if isinstance(ev, ExtractorGradientRequested):
            self._extractor += 1
            self.add(
                ExtractorUpdated(
                    extractor_version=self._extractor,
                    update=ev.update,
                    samples=len(ev.calls),
                    loss=0.0,
                    grad_norm=0.0,
                    clip_frac=0.0,
                    digest=f"x{self._extractor}",
                    checkpoint="",
                    seconds=0.0,
                    parent_digest=f"x{self._extractor - 1}",
                ),
                cause=seq,
                actor="extractor",
            )
