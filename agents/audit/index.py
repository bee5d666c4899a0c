"""The audit's index: the facts one pass over a run's log extracts, kept in a
:class:`stores.fact_index.FactIndex` beside the log.

Two kinds of facts. *Rows* hold what an audit of one entry needs about it, so that a question
about an entry retrieved ten thousand times reads ten thousand small rows, not ten thousand
events: its storing, eviction, every retrieval, every credit, the entries that replaced it, the
proposals refused as its duplicates, and every episode's outcome. *Refs* point at the events
about an episode, an extractor call or an update (seq and kind); an audit reads those events
from the log (:func:`fetch`), a few record parts per question.

Keys (bytes, ``S`` = 8-byte big-endian seq):

- ``t`` + tip id (8 bytes) + ``S`` -> a tip row (:data:`TipRow`)
- ``r`` + namespace + name + NUL + ``S`` -> :class:`Ref`; namespaces ``e`` episode, ``c``
  extractor call, ``x`` extractor update, ``u`` policy update
- ``o`` + episode -> :class:`Outcome`
- ``a`` + episode -> :class:`Assigned` (what the episode was: the browser's list and filters)
- ``p`` + episode -> the policy version of its first sampled action (8 bytes)
- ``k`` + episode -> ``S`` of the extractor request that consumed the episode's credit
- ``z`` + episode -> ``S`` of the episode's last :class:`EpisodeAbandoned` (what came before it
  about the episode belongs to attempts that were lost and run again)
- ``w`` + call + NUL + ``S`` -> :class:`Weighed` (the call in the extractor request at ``S``)
- ``v`` + update (8 bytes) -> :class:`Applied` (what extractor update ``update`` did)

:func:`refresh` indexes the log from the index's ``upto`` to the log's end when called, so a
live run costs only its new tail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, Union

import msgspec

from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from agents.events.extractor import (
    CreditAssigned,
    ExtractionRequested,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
)
from agents.events.memory import (
    ReflectionRequested,
    RetrievalRequested,
    TipEvicted,
    TipProposed,
    TipRejected,
    TipsRetrieved,
    TipStored,
)
from agents.events.policy import (
    ActionRequested,
    ActionSampled,
    AdvantagesComputed,
    GradientRequested,
    PolicyUpdated,
)
from engine.errors import LogError
from engine.eventlog import EventLog
from engine.events import Envelope, Event
from stores.fact_index import (
    Fact,
    FactIndex,
    IndexDamaged,
    IndexWriteFailed,
    LmdbFactIndex,
    MemoryFactIndex,
)

T = TypeVar("T")

INDEX_FORMAT = 6
"""Bumped when the facts change; an index of another format is rebuilt."""

REFRESH_CHUNK = 20_000
"""Events indexed per write transaction."""


class Ref(msgspec.Struct, frozen=True, array_like=True, tag="ref"):
    """An event about the key's episode, call or update: its kind (the seq is in the key)."""

    kind: str


class Stored(msgspec.Struct, frozen=True, array_like=True, tag="stored"):
    """The tip entered the bank (:class:`TipStored`); ``cause`` is the seq of the event that
    wrote it (its :class:`ExtractorCalled` or :class:`TipProposed`)."""

    slot: str
    episode: str
    call: str
    parents: tuple[int, ...]
    text: str
    score: float
    cause: int | None


class Evicted(msgspec.Struct, frozen=True, array_like=True, tag="evicted"):
    """The tip left the bank (:class:`TipEvicted`)."""

    reason: str


class Child(msgspec.Struct, frozen=True, array_like=True, tag="child"):
    """Entry ``tip`` was stored with this tip among its parents (an update or merge of it)."""

    tip: int


class Retrieved(msgspec.Struct, frozen=True, array_like=True, tag="retrieved"):
    """The tip was shown at ``position`` of one :class:`TipsRetrieved`."""

    episode: str
    turn: int
    position: int
    rank: int
    similarity: float
    score: float | None
    slot: str


class Credited(msgspec.Struct, frozen=True, array_like=True, tag="credited"):
    """A :class:`CreditAssigned` for an episode this tip guided."""

    episode: str
    call: str
    success: bool
    credit: float
    step: int
    rule: str


class Duplicated(msgspec.Struct, frozen=True, array_like=True, tag="duplicated"):
    """A later proposal (a reflection on ``episode`` or extractor ``call``) was refused as a
    duplicate of this tip."""

    episode: str
    call: str


class Outcome(msgspec.Struct, frozen=True, array_like=True, tag="outcome"):
    """How an episode ended: :class:`EpisodeFinished`, or ``aborted`` with its reason."""

    seq: int
    purpose: str
    success: bool = False
    score: float = 0.0
    steps: int = 0
    total_reward: float = 0.0
    aborted: str = ""


class Assigned(msgspec.Struct, frozen=True, array_like=True, tag="assigned"):
    """What an episode is, from its :class:`EpisodeAssigned` (the last one: a resumed run
    assigns an abandoned episode again)."""

    seq: int
    index: int
    family: str
    variant: int
    split: str
    purpose: str
    rollout: str
    scope: str = ""
    """The memory the episode read and wrote: an adaptation test's episodes have their own
    (``adapt<round>-t<task>``)."""


class Weighed(msgspec.Struct, frozen=True, array_like=True, tag="weighed"):
    """An extractor call's line in one :class:`ExtractorGradientRequested`."""

    update: int
    reward: float
    advantage: float
    weight: float
    batch: int


class Applied(msgspec.Struct, frozen=True, array_like=True, tag="applied"):
    """What an :class:`ExtractorUpdated` says about its update."""

    seq: int
    version: int
    samples: int
    loss: float
    digest: str


TipRow = Stored | Evicted | Child | Retrieved | Credited | Duplicated
_ROW_DECODER = msgspec.msgpack.Decoder(Union[TipRow])  # noqa: UP007 - a runtime union
_REF_DECODER = msgspec.msgpack.Decoder(Ref)
_OUTCOME_DECODER = msgspec.msgpack.Decoder(Outcome)
_ASSIGNED_DECODER = msgspec.msgpack.Decoder(Assigned)
_WEIGHED_DECODER = msgspec.msgpack.Decoder(Weighed)
_APPLIED_DECODER = msgspec.msgpack.Decoder(Applied)
_ENCODER = msgspec.msgpack.Encoder()


def index_ident(run_id: str) -> str:
    """The ident an index of run ``run_id`` is made for (with :data:`INDEX_FORMAT`)."""
    return f"{run_id}:audit-v{INDEX_FORMAT}"


def _seq(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def tip_prefix(tip: int) -> bytes:
    """The key prefix of tip ``tip``'s rows."""
    return b"t" + tip.to_bytes(8, "big")


def ref_prefix(namespace: str, name: str) -> bytes:
    """The key prefix of the refs of ``name`` in ``namespace`` ("e", "c", "x" or "u")."""
    return b"r" + namespace.encode() + name.encode() + b"\0"


def _row(tip: int, seq: int, row: TipRow) -> Fact:
    return tip_prefix(tip) + _seq(seq), _ENCODER.encode(row)


def _refs(namespace: str, names: Iterable[str], seq: int, kind: str) -> list[Fact]:
    value = _ENCODER.encode(Ref(kind))
    return [(ref_prefix(namespace, n) + _seq(seq), value) for n in dict.fromkeys(names) if n]


# --- facts of one event ----------------------------------------------------------------------


def _tip_stored(ev: TipStored, env: Envelope[Event]) -> list[Fact]:
    row = Stored(ev.slot, ev.episode, ev.call, ev.parents, ev.text, ev.score, env.cause)
    out = [_row(ev.tip_id, env.seq, row)]
    out += [_row(p, env.seq, Child(ev.tip_id)) for p in ev.parents]
    if ev.call:
        out += _refs("c", [ev.call], env.seq, "tip_stored")
    else:
        out += _refs("e", [ev.episode], env.seq, "tip_stored")
    return out


def _tip_rejected(ev: TipRejected, env: Envelope[Event]) -> list[Fact]:
    out = _refs("c", [ev.call], env.seq, "tip_rejected") if ev.call else []
    if not ev.call:
        out += _refs("e", [ev.episode], env.seq, "tip_rejected")
    if ev.duplicate_of >= 0:
        out.append(_row(ev.duplicate_of, env.seq, Duplicated(ev.episode, ev.call)))
    return out


def _tips_retrieved(ev: TipsRetrieved, env: Envelope[Event]) -> list[Fact]:
    out = _refs("e", [ev.episode], env.seq, "tips_retrieved")
    for i, (tip, rank, similarity, score, _, _) in enumerate(ev.entries()):
        row = Retrieved(ev.episode, ev.turn, i, rank, similarity, score, ev.slot)
        out.append(_row(tip, env.seq, row))
    return out


def _credit(ev: CreditAssigned, env: Envelope[Event]) -> list[Fact]:
    row = Credited(ev.episode, ev.call, ev.success, ev.credit, ev.step, ev.rule)
    return [
        _row(ev.entry, env.seq, row),
        *_refs("e", [ev.episode], env.seq, "credit_assigned"),
        *_refs("c", [ev.call], env.seq, "credit_assigned"),
    ]


def _extractor_request(ev: ExtractorGradientRequested, env: Envelope[Event]) -> list[Fact]:
    kind = "extractor_gradient_requested"
    return [
        *_refs("e", ev.credits, env.seq, kind),
        *_refs("c", ev.calls, env.seq, kind),
        *_refs("x", [str(ev.update)], env.seq, kind),
        *[(b"k" + ep.encode(), _seq(env.seq)) for ep in ev.credits],
        *[
            (
                b"w" + call.encode() + b"\0" + _seq(env.seq),
                _ENCODER.encode(Weighed(ev.update, r, a, w, len(ev.calls))),
            )
            for call, r, a, w in zip(ev.calls, ev.rewards, ev.advantages, ev.weights, strict=True)
        ],
    ]


def _extractor_updated(ev: ExtractorUpdated, env: Envelope[Event]) -> list[Fact]:
    row = Applied(env.seq, ev.extractor_version, ev.samples, ev.loss, ev.digest)
    return [
        (b"v" + ev.update.to_bytes(8, "big"), _ENCODER.encode(row)),
        *_refs("x", [str(ev.update)], env.seq, "extractor_updated"),
    ]


def _outcome(ev: EpisodeFinished | EpisodeAborted, env: Envelope[Event]) -> list[Fact]:
    if isinstance(ev, EpisodeFinished):
        row = Outcome(env.seq, ev.purpose, ev.success, ev.score, ev.steps, ev.total_reward)
    else:
        row = Outcome(env.seq, ev.purpose, aborted=ev.reason)
    kind = type(ev).__struct_config__.tag
    assert isinstance(kind, str)
    return [
        (b"o" + ev.episode.encode(), _ENCODER.encode(row)),
        *_refs("e", [ev.episode], env.seq, kind),
    ]


def _assigned(ev: EpisodeAssigned, env: Envelope[Event]) -> list[Fact]:
    row = Assigned(
        env.seq, ev.index, ev.family, ev.variant, ev.split, ev.purpose, ev.rollout, ev.scope
    )
    return [(b"a" + ev.episode.encode(), _ENCODER.encode(row)), *_episode_ref(ev, env)]


def _abandoned(ev: EpisodeAbandoned, env: Envelope[Event]) -> list[Fact]:
    return [(b"z" + ev.episode.encode(), _seq(env.seq)), *_episode_ref(ev, env)]


def _sampled(ev: ActionSampled, env: Envelope[Event]) -> list[Fact]:
    out = _episode_ref(ev, env)
    if ev.turn == 0:
        out.append((b"p" + ev.episode.encode(), ev.policy_version.to_bytes(8, "big", signed=True)))
    return out


def _episode_ref(ev: Any, env: Envelope[Event]) -> list[Fact]:
    kind = type(ev).__struct_config__.tag
    return _refs("e", [ev.episode], env.seq, kind)


def _extractor_called(ev: ExtractorCalled, env: Envelope[Event]) -> list[Fact]:
    out = _refs("c", [ev.call], env.seq, "extractor_called")
    if ev.task == "extract":
        out += _refs("e", [ev.source], env.seq, "extractor_called")
    return out


_FACTS: dict[type[Event], Callable[[Any, Envelope[Event]], list[Fact]]] = {
    TipStored: _tip_stored,
    TipRejected: _tip_rejected,
    TipsRetrieved: _tips_retrieved,
    TipEvicted: lambda ev, env: [_row(ev.tip_id, env.seq, Evicted(ev.reason))],
    CreditAssigned: _credit,
    ExtractorGradientRequested: _extractor_request,
    ExtractorUpdated: _extractor_updated,
    ExtractorCalled: _extractor_called,
    EpisodeFinished: _outcome,
    EpisodeAborted: _outcome,
    AdvantagesComputed: lambda ev, env: _refs("e", ev.episodes, env.seq, "advantages_computed"),
    GradientRequested: lambda ev, env: [
        *_refs("e", ev.episodes, env.seq, "gradient_requested"),
        *_refs("u", [str(ev.update)], env.seq, "gradient_requested"),
    ],
    PolicyUpdated: lambda ev, env: _refs("u", [str(ev.update)], env.seq, "policy_updated"),
    EpisodeAssigned: _assigned,
    EpisodeAbandoned: _abandoned,
    ActionSampled: _sampled,
    **{
        cls: _episode_ref
        for cls in (
            EpisodeStarted,
            StepTaken,
            ActionRequested,
            RetrievalRequested,
            ReflectionRequested,
            TipProposed,
            ExtractionRequested,
        )
    },
}


def facts_of(env: Envelope[Event]) -> list[Fact]:
    """The facts one envelope contributes to the index (none for most engine events)."""
    make = _FACTS.get(type(env.event))
    return make(env.event, env) if make is not None else []


# --- building and reading ----------------------------------------------------------------------


Progress = Callable[[int, int], None]
"""Told, after each chunk an index was extended by, the events indexed so far and how many
there were to index."""


def refresh(
    log: EventLog, index: FactIndex, *, chunk: int = REFRESH_CHUNK, progress: Progress | None = None
) -> int:
    """Index ``log`` from ``index.upto`` to the log's end as of now (a live run's later events
    wait for the next call).

    Returns:
        The seq the index now reaches (the log's end when the call started).
    """
    end = log.next_seq
    first = index.upto
    while index.upto < end:
        start = index.upto
        stop = min(end, start + chunk)
        facts: list[Fact] = []
        last = None
        for part in log.read_chunks(start, stop):
            for env in part:
                facts += facts_of(env)
            last = part[-1] if part else last
        if last is not None:  # which log it read, with the range (see _from_this_log)
            facts.append((MARK, _mark(last.seq, last.t, log.log_id)))
        index.extend(start, stop, facts)  # False: another process indexed it; go on from there
        if progress is not None:
            progress(index.upto - first, end - first)
    return end


def tip_rows(index: FactIndex, tip: int) -> list[tuple[int, TipRow]]:
    """Every row of tip ``tip`` as ``(seq, row)``, in log order (none for an id no log can
    hold: the log's integers are 64-bit)."""
    if not 0 <= tip < 1 << 64:
        return []
    return [
        (int.from_bytes(k[-8:], "big"), _ROW_DECODER.decode(v))
        for k, v in index.scan(tip_prefix(tip))
    ]


def refs(index: FactIndex, namespace: str, name: str) -> list[tuple[int, str]]:
    """The ``(seq, kind)`` of every event indexed under ``name`` in ``namespace`` (a key is
    the prefix and a seq of 8 bytes: a name ending in NULs matched another's keys by their
    seq's leading zero bytes, and ``ep000300\\0`` read as ``ep000300``)."""
    prefix = ref_prefix(namespace, name)
    return [
        (int.from_bytes(k[-8:], "big"), _REF_DECODER.decode(v).kind)
        for k, v in index.scan(prefix)
        if len(k) == len(prefix) + 8
    ]


def last_attempt(found: Sequence[tuple[int, str]]) -> tuple[list[tuple[int, str]], int]:
    """Of an episode's refs (:func:`refs`), those of its last attempt, the one after its last
    :class:`EpisodeAbandoned` (a run resumed, or a worker restarted, ran it again with the same
    id: what the lost attempts recorded is not the episode's), and how many were abandoned."""
    cuts = [i for i, (_, kind) in enumerate(found) if kind == "episode_abandoned"]
    return (list(found[cuts[-1] + 1 :]) if cuts else list(found)), len(cuts)


def abandoned(index: FactIndex, episodes: Sequence[str]) -> list[int | None]:
    """The seq of each of ``episodes``' last abandoned attempt (None: none), in one read: an
    event about the episode before it belongs to a lost attempt."""
    raws = index.get_many([b"z" + ep.encode() for ep in episodes])
    return [None if raw is None else int.from_bytes(raw, "big") for raw in raws]


def outcome(index: FactIndex, episode: str) -> Outcome | None:
    """How ``episode`` ended, or None (unknown, or still running)."""
    return outcomes(index, [episode])[0]


def outcomes(index: FactIndex, episodes: Sequence[str]) -> list[Outcome | None]:
    """How each of ``episodes`` ended (None: unknown, or still running), in one read."""
    raws = index.get_many([b"o" + ep.encode() for ep in episodes])
    return [None if raw is None else _OUTCOME_DECODER.decode(raw) for raw in raws]


def assigned(index: FactIndex) -> list[tuple[str, Assigned]]:
    """Every episode the log assigned, as ``(episode, what it is)``, by episode id."""
    return [(k[1:].decode(), _ASSIGNED_DECODER.decode(v)) for k, v in index.scan(b"a")]


def purposes(index: FactIndex, episodes: Sequence[str]) -> list[str]:
    """What each of ``episodes`` was assigned for ("train", "eval"; "" if never assigned),
    in one read: known also of an attempt that did not end."""
    raws = index.get_many([b"a" + ep.encode() for ep in episodes])
    return ["" if raw is None else _ASSIGNED_DECODER.decode(raw).purpose for raw in raws]


def versions(index: FactIndex, episodes: Sequence[str]) -> list[int | None]:
    """The policy version of each episode's first sampled action (None: no policy action)."""
    raws = index.get_many([b"p" + ep.encode() for ep in episodes])
    return [None if raw is None else int.from_bytes(raw, "big", signed=True) for raw in raws]


def consumer(index: FactIndex, episode: str) -> int | None:
    """The seq of the extractor request that consumed ``episode``'s credit, or None."""
    return consumers(index, [episode])[0]


def consumers(index: FactIndex, episodes: Sequence[str]) -> list[int | None]:
    """:func:`consumer` of each of ``episodes``, in one read."""
    raws = index.get_many([b"k" + ep.encode() for ep in episodes])
    return [None if raw is None else int.from_bytes(raw, "big") for raw in raws]


def weighed(index: FactIndex, call: str) -> list[tuple[int, Weighed]]:
    """Every extractor request that named ``call``, as ``(request seq, its line)``."""
    prefix = b"w" + call.encode() + b"\0"
    return [
        (int.from_bytes(k[-8:], "big"), _WEIGHED_DECODER.decode(v)) for k, v in index.scan(prefix)
    ]


def applied(index: FactIndex, updates: Sequence[int]) -> list[Applied | None]:
    """What each extractor update of ``updates`` did (None: not applied yet), in one read."""
    raws = index.get_many([b"v" + u.to_bytes(8, "big") for u in updates])
    return [None if raw is None else _APPLIED_DECODER.decode(raw) for raw in raws]


def fetch(log: EventLog, seqs: Iterable[int]) -> dict[int, Envelope[Event]]:
    """The envelopes at ``seqs``, read one record part per run of nearby seqs.

    Raises:
        LogCorrupted: a record holding one of them is damaged.
    """
    want = sorted(set(seqs))
    out: dict[int, Envelope[Event]] = {}
    i = 0
    while i < len(want):
        chunks: Iterator[list[Envelope[Event]]] = log.read_chunks(want[i], want[-1] + 1)
        try:
            chunk = next(chunks, [])
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        if not chunk:
            break
        last = chunk[-1].seq
        while i < len(want) and want[i] <= last:
            out[want[i]] = chunk[want[i] - chunk[0].seq]
            i += 1
    return out


INDEX_DIR = "audit"
"""The index's directory inside a run directory (beside ``log/``)."""


def open_index(
    run_root: Path,
    log: EventLog,
    where: Path | None = None,
    progress: Progress | None = None,
    option: str = "--index DIR",
) -> tuple[FactIndex, str]:
    """The run's persisted index, brought up to the log's end.

    Args:
        run_root: the run directory.
        log: its event log, open for reading.
        where: the index directory (default ``run_root / "audit"``).
        progress: told how the indexing goes (a long log's first question indexes it whole).
        option: the command's option that puts the index elsewhere, named in the note when
            the directory cannot be written ("": the command has none, ``serve``).

    Returns:
        The index, and a note for the user ("" normally): where the directory cannot be
        written, the index is built in memory for this question only.
    """
    meta = log.read_meta()
    ident = index_ident(meta.run_id if meta is not None else "")
    path = where if where is not None else run_root / INDEX_DIR
    index: FactIndex
    note = ""
    try:
        try:
            index = LmdbFactIndex.open(path, ident)
        except IndexDamaged as exc:  # a cache: built again from the log
            LmdbFactIndex.wipe(path)
            index = LmdbFactIndex.open(path, ident)
            note = _damaged(path, exc)
    except (OSError, LogError) as exc:
        index = MemoryFactIndex()
        note = _in_memory(path, exc, option)
    try:
        said = _from_this_log(log, index)
    except IndexDamaged as exc:  # its mark fails its checksum
        said = f"was damaged ({exc}); rebuilt it from the log"
    if said and isinstance(index, LmdbFactIndex):  # a cache: built again from this log
        index.close()
        LmdbFactIndex.wipe(path)
        index = LmdbFactIndex.open(path, ident)
        note = f"the audit index in {path} {said}"
    try:
        refresh(log, index, progress=progress)
    except IndexWriteFailed as exc:  # a full disk: the index is a cache, the log is intact
        index.close()
        index = MemoryFactIndex()
        note = _in_memory(path, exc, option)
        refresh(log, index, progress=progress)
    except BaseException:
        index.close()
        raise
    return index, note


def _in_memory(path: Path, exc: Exception, option: str) -> str:
    where = f" ({option})" if option else ""
    if path.exists() and not path.is_dir():  # mkdir's "[Errno 17] File exists: ..."
        why = "a file, not a directory"
    else:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return f"cannot keep the audit index in {path} ({why}); indexing in memory{where}"


MARK = b"\xffmark"
"""The key of the index's last indexed event (seq, commit time) and the log's id: a log
copied and resumed apart keeps its run id but not its later events, and an index read further
than the log (or from the other copy) would answer from events this log does not hold; a log
written anew (an edited copy of the run's events, its metadata copied too) has another id."""


def _mark(seq: int, t: int, log_id: str) -> bytes:
    return seq.to_bytes(8, "big") + t.to_bytes(8, "big", signed=True) + log_id.encode()


def _from_this_log(log: EventLog, index: FactIndex) -> str:
    """Why ``index`` is not taken as made from ``log``, as the note says it ("" when it is,
    or is empty)."""
    upto = index.upto
    if upto == 0:
        return ""
    rebuilt = "rebuilt it from this log"
    if upto > log.next_seq:
        why = f"it reaches seq {upto - 1}, the log ends at seq {log.next_seq - 1}"
        return f"was made from another copy of this run's log ({why}); {rebuilt}"
    env = next(iter(log.read(upto - 1, upto)), None)
    mark = index.get(MARK)
    if env is None or mark is None or mark[:16] != _mark(env.seq, env.t, ""):
        why = f"its event {upto - 1} is not the log's"
        return f"was made from another copy of this run's log ({why}); {rebuilt}"
    if mark[16:] == log.log_id.encode():
        return ""
    if len(mark) == 16:  # the index holds no id: made by a coevo before 2026-12-07
        return f"was made by an older coevo, which did not record which log it read; {rebuilt}"
    why = "this log was written anew after it: an edited or rebuilt copy has its own id"
    return f"was made from another copy of this run's log ({why}); {rebuilt}"


def _damaged(path: Path, exc: Exception) -> str:
    return f"the audit index in {path} was damaged ({exc}); rebuilt it from the log"


def rebuilt_index(
    run_root: Path, log: EventLog, damaged: LmdbFactIndex, exc: IndexDamaged
) -> tuple[FactIndex, str]:
    """The index ``damaged`` closed, removed and built again from the log (:func:`open_index`
    in the same place), and the note that says so."""
    path = damaged.path
    damaged.close()
    LmdbFactIndex.wipe(path)
    index, _ = open_index(run_root, log, path)
    return index, _damaged(path, exc)


def answer_from_index(
    run_root: Path,
    log: EventLog,
    where: Path | None,
    ask: Callable[[FactIndex], T],
    progress: Progress | None = None,
) -> tuple[T, str]:
    """``ask(index)`` on the run's index (:func:`open_index`), and the note about the index.
    A damaged fact met while answering (:class:`IndexDamaged`) rebuilds the index from the
    log (:func:`rebuilt_index`) and the question is asked once more."""
    index, note = open_index(run_root, log, where, progress)
    try:
        try:
            return ask(index), note
        except IndexDamaged as exc:
            if not isinstance(index, LmdbFactIndex):
                raise
            index, note = rebuilt_index(run_root, log, index, exc)
        return ask(index), note
    finally:
        index.close()
