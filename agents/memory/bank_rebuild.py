"""The experience bank another extractor would have written from the same episodes.

A Complementary RL run logs every request its extractor answered: the finished training
episodes (:class:`ExtractionRequested`, with the extraction prompt and its seed) and the merge
passes (:class:`MergeDue`, then one :class:`MergeRequested` per chunk of the bank). Its bank is
the fold of the answers, applied where the log has them (:class:`ExtractorCalled`). To rebuild
the bank a given extractor would write, the same requests are answered by that extractor, in
log order, and its operations applied to a fresh :class:`TipBank`:

- an extraction is applied where the run applied its own answer to it; the prompt is the
  logged one (the episode, its outcome and the entry the actor was shown), so the answer
  depends only on the extractor and the seed. An ``update`` of the shown entry names the
  rebuilt bank's entry with the same text in the same partition, and is refused as "gone"
  when the rebuilt bank has none (as the run's bank refuses an update of an evicted entry);
- a merge pass forms its chunks from the rebuilt bank at the :class:`MergeDue`, as the memory
  actor does (:func:`agents.memory.memory_actor.merge_requests`: same chunks rule, same
  seeds), asks the extractor, and applies each chunk's answer where the run applied the chunk
  with the same seed (the same step, partition and offset); chunks the run did not have are
  applied after the pass's last logged chunk, or at once when the run's pass had none.

:func:`bank_script` reads the log into the ordered actions (pure); :func:`rebuild_bank` plays
them with an ``answer`` and an ``embed`` function (the extractor's model and the run's
embedder, or fakes in tests). Given the extractor that answered the run's calls, the rebuilt
bank is the run's bank: a test checks it on a run whose extractor never trained.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from agents.events.extractor import (
    ExtractionRequested,
    ExtractorCalled,
    MergeDue,
    MergeRequested,
)
from agents.events.memory import TipEvicted, TipRejected, TipStored
from agents.memory.bank import MemorySettings, TipBank
from agents.memory.extraction import MERGE_SYSTEM
from agents.memory.extractor import call_id
from agents.memory.memory_actor import merge_requests
from engine.events import Envelope, Event

Request = ExtractionRequested | MergeRequested
Answer = Callable[[Sequence[Request], Sequence[str]], list[ExtractorCalled]]
"""Answers requests (with the call ids given) as one extractor: ``ExtractorModel.answer``."""
Embed = Callable[[Sequence[str]], list[np.ndarray]]
"""Embeds texts as the run's memory did: one (dim,) vector each."""

SHOWN = 2**62
"""The id an extraction's shown entry is answered under, replaced by the rebuilt bank's entry
when it is applied (never a real id: banks number entries from 0)."""


@dataclass(frozen=True, slots=True)
class Extract:
    """Answer the extraction request at ``seq`` and apply it (where the run applied its own).

    ``shown`` is the text of the entry the actor was shown (None: a free episode)."""

    seq: int
    request: ExtractionRequested
    shown: str | None


@dataclass(frozen=True, slots=True)
class MergePass:
    """A merge pass at step ``step``: form the chunks; ``logged`` chunks were applied by the
    run (0: apply the rebuilt ones at once)."""

    step: int
    logged: int


@dataclass(frozen=True, slots=True)
class MergeApply:
    """Apply the rebuilt chunk whose seed is ``seed``, if there is one; ``last``: the pass's
    last logged chunk, after which the pass's other rebuilt chunks are applied."""

    step: int
    seed: int
    last: bool


Action = Extract | MergePass | MergeApply


@dataclass(frozen=True)
class BankScript:
    """A run's bank-writing requests in the order its memory applied them.

    Attributes:
        actions: the actions in log order.
        extractions: extraction requests answered (and applied) in the run.
        passes: merge passes.
        merge_calls: merge chunks the run answered.
    """

    actions: tuple[Action, ...]
    extractions: int
    passes: int
    merge_calls: int


def bank_script(envelopes: Iterable[Envelope[Event]]) -> BankScript:
    """Read a run's log into the actions that rebuild its bank (pure).

    Requests the run never answered (it stopped first) are left out: its bank never saw them.
    """
    requests: dict[str, tuple[int, ExtractionRequested]] = {}
    merges: dict[str, MergeRequested] = {}
    texts: dict[int, str] = {}
    actions: list[Action] = []
    for env in envelopes:
        ev = env.event
        if isinstance(ev, ExtractionRequested):
            requests[call_id(env.seq)] = (env.seq, ev)
        elif isinstance(ev, MergeRequested):
            merges[call_id(env.seq)] = ev
        elif isinstance(ev, TipStored):
            texts[ev.tip_id] = ev.text
        elif isinstance(ev, MergeDue):
            actions.append(MergePass(ev.step, 0))
        elif isinstance(ev, ExtractorCalled) and ev.call in requests:
            seq, req = requests.pop(ev.call)
            actions.append(Extract(seq, req, texts.get(req.entry, "") if req.entry >= 0 else None))
        elif isinstance(ev, ExtractorCalled) and ev.call in merges:
            m = merges.pop(ev.call)
            actions.append(MergeApply(m.step, m.seed, False))
    return _marked(actions)


def _marked(actions: list[Action]) -> BankScript:
    """``actions`` with each pass's logged chunk count and its last chunk marked."""
    last: dict[int, int] = {}
    count: Counter[int] = Counter()
    for i, a in enumerate(actions):
        if isinstance(a, MergeApply):
            last[a.step] = i
            count[a.step] += 1
    out: list[Action] = []
    for i, a in enumerate(actions):
        if isinstance(a, MergePass):
            a = MergePass(a.step, count[a.step])
        elif isinstance(a, MergeApply):
            a = MergeApply(a.step, a.seed, last[a.step] == i)
        out.append(a)
    return BankScript(
        actions=tuple(out),
        extractions=sum(isinstance(a, Extract) for a in out),
        passes=sum(isinstance(a, MergePass) for a in out),
        merge_calls=sum(count.values()),
    )


@dataclass
class Rebuilt:
    """A rebuilt bank and how it came to be.

    Attributes:
        bank: the bank after every action (nothing retrieved from it yet).
        events: what applying the answers emitted (stored, evicted, rejected), in order.
        calls: every answer, in the order applied.
        vectors: the embedding of every stored entry's key.
    """

    settings: MemorySettings
    dim: int
    bank: TipBank
    events: list[Event] = field(default_factory=list[Event])
    calls: list[ExtractorCalled] = field(default_factory=list[ExtractorCalled])
    vectors: dict[str, np.ndarray] = field(default_factory=dict[str, np.ndarray])

    def copy(self) -> TipBank:
        """A fresh bank in the rebuilt state (the bank is the fold of its events), so that
        retrievals from the copy leave this one as it is."""
        bank = TipBank(self.settings, self.dim)
        for ev in self.events:
            if isinstance(ev, TipStored):
                bank.evolve(ev, self.vectors[ev.key])
            elif isinstance(ev, TipEvicted):
                bank.evolve(ev)
        return bank

    def entries(self) -> dict[str, list[str]]:
        """Every partition's entry texts, oldest first."""
        return {s: [self.bank.tips[i].text for i in self.bank.entries(s)] for s in self.slots()}

    def slots(self) -> list[str]:
        return sorted(self.bank.slots())

    def stats(self) -> BankStats:
        """Sizes and counts of what the answers did."""
        ops: Counter[str] = Counter(op for c in self.calls for op, _, _ in c.ops)
        evicted = Counter(ev.reason for ev in self.events if isinstance(ev, TipEvicted))
        rejected = Counter(ev.reason for ev in self.events if isinstance(ev, TipRejected))
        return BankStats(
            size=len(self.bank.tips),
            sizes={s: self.bank.size(s) for s in self.slots()},
            calls=Counter(c.task for c in self.calls),
            malformed=sum(c.malformed for c in self.calls),
            ops=dict(sorted(ops.items())),
            stored=sum(isinstance(ev, TipStored) for ev in self.events),
            evicted=dict(sorted(evicted.items())),
            rejected=dict(sorted(rejected.items())),
        )


class BankStats(msgspec.Struct, frozen=True, kw_only=True):
    """A rebuilt bank's size and what its writer did.

    Attributes:
        size: entries at the end; ``sizes`` per partition.
        calls: answers by task ("extract", "merge").
        malformed: answers with no usable operation.
        ops: operations parsed, by kind.
        stored: entries stored; ``evicted`` by reason; ``rejected`` (writes refused) by reason.
    """

    size: int
    sizes: dict[str, int]
    calls: dict[str, int]
    malformed: int
    ops: dict[str, int]
    stored: int
    evicted: dict[str, int]
    rejected: dict[str, int]


@dataclass(frozen=True)
class RebuildSettings:
    """How the run's memory formed its merge passes, and how many requests share an answer
    batch.

    Attributes:
        run_seed: the run's seed (merge requests draw their seeds from it).
        merge_chunk: entries per merge chunk; ``merge_max``: most chunks per partition.
        batch: requests answered together.
        merge_system: the system text of a merge request's prompt (``[prompt] merge``).
    """

    run_seed: int
    merge_chunk: int = 5
    merge_max: int = 16
    batch: int = 32
    merge_system: str = MERGE_SYSTEM


def rebuild_bank(
    script: BankScript,
    answer: Answer,
    embed: Embed,
    bank: MemorySettings,
    dim: int,
    settings: RebuildSettings,
    progress: Callable[[int], None] = lambda _: None,
) -> Rebuilt:
    """The bank ``answer``'s extractor would write from the script's requests.

    Extraction answers do not depend on the bank, so they are drawn first, ``settings.batch``
    at a time; a merge pass is answered when it is reached. ``progress`` is told how many
    requests each answered batch held.
    """
    out = Rebuilt(bank, dim, TipBank(bank, dim))
    extracts = [a for a in script.actions if isinstance(a, Extract)]
    asked = [
        msgspec.structs.replace(a.request, entry=SHOWN) if a.shown else a.request for a in extracts
    ]
    answers = _answer_all(
        answer,
        asked,
        [call_id(a.seq) for a in extracts],
        settings.batch,
        progress,
    )
    of_seq = {a.seq: c for a, c in zip(extracts, answers, strict=True)}
    pending: dict[int, dict[int, ExtractorCalled]] = {}  # step -> seed -> answer
    for a in script.actions:
        if isinstance(a, Extract):
            _apply(out, embed, _shown_as(out.bank, of_seq[a.seq], a.shown))
        elif isinstance(a, MergePass):
            reqs = merge_requests(
                out.bank,
                a.step,
                settings.run_seed,
                chunk=settings.merge_chunk,
                most=settings.merge_max,
                system=settings.merge_system,
            )
            ids = [f"m{a.step}-{i}" for i in range(len(reqs))]
            calls = _answer_all(answer, reqs, ids, settings.batch, progress)
            pending[a.step] = {r.seed: c for r, c in zip(reqs, calls, strict=True)}
            if a.logged == 0:
                _flush(out, embed, pending.pop(a.step))
        else:
            chunk = pending.get(a.step, {})
            called = chunk.pop(a.seed, None)
            if called is not None:
                _apply(out, embed, called)
            if a.last:
                _flush(out, embed, pending.pop(a.step, {}))
    return out


def _answer_all(
    answer: Answer,
    requests: Sequence[Request],
    ids: Sequence[str],
    batch: int,
    progress: Callable[[int], None],
) -> list[ExtractorCalled]:
    out: list[ExtractorCalled] = []
    for k in range(0, len(requests), batch):
        out += answer(requests[k : k + batch], ids[k : k + batch])
        progress(len(requests[k : k + batch]))
    return out


def _placeheld(a: Extract) -> ExtractionRequested:
    """The request with its shown entry under the placeholder id (:data:`SHOWN`)."""
    return msgspec.structs.replace(a.request, entry=SHOWN) if a.shown is not None else a.request


def _shown_as(bank: TipBank, called: ExtractorCalled, shown: str | None) -> ExtractorCalled:
    """``called`` with the shown entry's placeholder id replaced by the id of the entry with
    the same text in its partition now (left as is when there is none: it is "gone")."""
    if shown is None:
        return called
    text = shown.strip()  # "": an entry the log never stored; it matches none
    match = [i for i in bank.entries(called.slot) if bank.tips[i].text == text]
    if not match:
        return called
    ops = tuple(
        (op, tuple(match[0] if i == SHOWN else i for i in ids), content)
        for op, ids, content in called.ops
    )
    return msgspec.structs.replace(called, ops=ops)


def _flush(out: Rebuilt, embed: Embed, chunk: dict[int, ExtractorCalled]) -> None:
    for called in chunk.values():
        _apply(out, embed, called)


def _apply(out: Rebuilt, embed: Embed, called: ExtractorCalled) -> None:
    contents = [content for op, _, content in called.ops if op not in ("discard", "return")]
    vectors = embed(contents) if contents else []
    for content, vec in zip(contents, vectors, strict=True):
        out.vectors.setdefault(content, vec)
    out.events += out.bank.apply(called, vectors)
    out.calls.append(called)
