"""``coevo audit``'s answers about one bank entry or one episode, from the log and its index.

:func:`audit_tip` follows an entry from the extractor call (or the policy's reflection) that
wrote it, through the entries it replaced, to every retrieval of it, the outcome of every
episode it guided, every credit it earned and the extractor update that consumed each credit.
:func:`audit_episode` lays an episode out turn by turn, with its rewards, the advantage its
samples received and the policy update that used them (and, in Complementary RL, its credit).

Both read the index (``agents.audit.index``) for what concerns the entry or episode and fetch
only those events from the log; the answers are msgspec Structs, printed by
``agents.audit.render`` or encoded as JSON.
"""

from __future__ import annotations

import math
import re

import msgspec

from agents.audit.episode import run_end
from agents.audit.index import (
    Child,
    Credited,
    Duplicated,
    Evicted,
    Outcome,
    Retrieved,
    Stored,
    TipRow,
    abandoned,
    applied,
    consumers,
    fetch,
    outcomes,
    purposes,
    tip_rows,
    weighed,
)
from agents.events.extractor import (
    ExtractionRequested,
    ExtractorCalled,
    MergeRequested,
)
from agents.events.memory import ReflectionRequested, TipProposed, TipRejected
from engine.errors import AuditQueryInvalid
from engine.eventlog import EventLog
from engine.events import Envelope, Event
from stores.fact_index import FactIndex

# --- answers -----------------------------------------------------------------------------------


class Origin(msgspec.Struct, frozen=True, kw_only=True):
    """What wrote an entry: an extractor call (``kind`` "extractor"), a reflection, or neither
    (``kind`` "actor": ``source`` names the actor that stored it at ``seq``, a method's own
    list; ``request_seq`` is the event it was handling).

    ``episodes`` are the episodes it was written from (extract: the one episode; merge: none, the
    merged ``entries`` say where it came from); ``op`` the operation that wrote this entry.
    """

    kind: str
    seq: int | None
    call: str = ""
    task: str = ""
    source: str = ""
    extractor_version: int = -1
    policy_version: int = -1
    op: str = ""
    ops: int = 0
    errors: tuple[str, ...] = ()
    response: str = ""
    request_seq: int | None = None
    episodes: tuple[str, ...] = ()
    episode_success: bool | None = None
    episode_score: float | None = None
    entry_used: int = -1
    merge_step: int = -1
    entries: tuple[int, ...] = ()


class Lineage(msgspec.Struct, frozen=True, kw_only=True):
    """An entry and, recursively, the entries it replaced (``parents``)."""

    tip: int
    seq: int | None
    call: str
    source: str
    text: str
    evicted: str = ""
    parents: tuple[Lineage, ...] = ()


class Use(msgspec.Struct, frozen=True, kw_only=True):
    """One retrieval of the entry and how the episode it guided ended.

    ``alive``: the entry was in the bank at that seq (stored before, not evicted before).
    ``abandoned``: the attempt it was shown in was lost and the episode run again (a resumed
    run, a restarted worker): the episode's outcome is not this retrieval's, and it is not
    counted among the episodes the entry guided.
    """

    seq: int
    episode: str
    turn: int
    position: int
    rank: int
    similarity: float
    score: float | None
    alive: bool
    purpose: str = ""
    ended: bool = False
    success: bool = False
    outcome_score: float = 0.0
    aborted: str = ""
    abandoned: bool = False


class Credit(msgspec.Struct, frozen=True, kw_only=True):
    """One credit the entry earned: the formula's inputs (outcome, rule) and its value, and the
    extractor update (``update``, -1: not yet) that consumed it."""

    seq: int
    episode: str
    call: str
    success: bool
    episode_score: float | None
    rule: str
    credit: float
    step: int
    update: int = -1
    request_seq: int | None = None


class ExtractorStep(msgspec.Struct, frozen=True, kw_only=True):
    """An extractor update that trained on the entry's call: the call's reward (its mean credit
    so far), advantage and weight in it, and what the update did (``version`` -1: not yet)."""

    update: int
    request_seq: int
    call: str
    reward: float
    advantage: float
    weight: float
    batch: int
    version: int = -1
    samples: int = 0
    loss: float = 0.0
    digest: str = ""


class TipAudit(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the log says about one bank entry."""

    tip: int
    slot: str
    text: str
    stored_seq: int
    evicted_seq: int | None
    evicted: str
    origin: Origin
    lineage: Lineage
    children: tuple[int, ...]
    duplicates: tuple[str, ...]
    duplicate_episodes: tuple[str, ...] = ()  # each duplicate's episode ("" for a merge's call)
    uses: tuple[Use, ...]
    credits: tuple[Credit, ...]
    updates: tuple[ExtractorStep, ...]
    guided: int
    """Episodes the entry was shown in, of every purpose (training, evaluation rounds with the
    bank, adaptation attempts; each use's ``purpose`` says which), an abandoned try left out."""
    guided_success: int
    """Of :attr:`guided`, those that succeeded (every purpose, as :attr:`guided`)."""
    credit_sum: float
    run_end: str = ""
    """How the run's last session ended (:func:`~agents.audit.episode.run_end`): once it has,
    a credit no update used, and an extractor update not applied, wait for a resume; once it
    completed, never."""
    evicted_by: str = ""
    """The extractor call whose update or merge took the entry out of the bank ("" for a
    FIFO eviction or none)."""
    evicted_into: tuple[int, ...] = ()
    """The entries that call's result was refused as a duplicate of (a merge whose text the
    bank already held: the entry lives on only there; :attr:`children` has none)."""


# --- one entry ---------------------------------------------------------------------------------


def entry_id(text: str) -> int:
    """An entry id as a user typed it (ASCII digits only: ``int`` also takes ``²``'s kin,
    signs, spaces and underscores, which no id is written with).

    Raises:
        AuditQueryInvalid: ``text`` is not one.
    """
    if not re.fullmatch(r"[0-9]+", text):
        raise AuditQueryInvalid(f"entry id must be a non-negative integer, got {text!r}")
    if len(text) > 40:  # Python refuses to read an int of over 4,300 digits: no id has 40
        raise AuditQueryInvalid(f"no entry {text[:20]}... ({len(text):,} digits) in this run")
    return int(text)


def _stored_count(index: FactIndex) -> int:
    """How many entries the run has stored: the bank numbers them 0, 1, 2, ... as it stores
    them, and every stored id has rows (a binary search over ids, for a query's error)."""
    if not tip_rows(index, 0):
        return 0
    held, missing = 0, 1
    while tip_rows(index, missing):
        held, missing = missing, 2 * missing
    while missing - held > 1:
        mid = (held + missing) // 2
        held, missing = (mid, missing) if tip_rows(index, mid) else (held, mid)
    return held + 1


def audit_tip(log: EventLog, index: FactIndex, tip: int) -> TipAudit:
    """The lineage, uses, credits and extractor updates of entry ``tip``.

    Raises:
        AuditQueryInvalid: the log never stored entry ``tip``.
    """
    rows = tip_rows(index, tip)
    stored = [(seq, r) for seq, r in rows if isinstance(r, Stored)]
    if not stored:
        count = _stored_count(index)
        held = f"its entries are 0-{count - 1}" if count else "it has stored no entry"
        raise AuditQueryInvalid(f"no entry {tip} in this run: {held} (ids are TipStored.tip_id)")
    stored_seq, st = stored[0]
    evicted = [(seq, r.reason) for seq, r in rows if isinstance(r, Evicted)]
    evicted_seq, reason = evicted[0] if evicted else (None, "")
    evicted_by, evicted_into = _eviction(log, evicted_seq) if evicted_seq is not None else ("", ())
    retrieved = [(seq, r) for seq, r in rows if isinstance(r, Retrieved)]
    shown_in = [r.episode for _, r in retrieved]
    ends, lost = outcomes(index, shown_in), abandoned(index, shown_in)
    uses = tuple(
        _use(seq, r, None, stored_seq, evicted_seq, purpose, abandoned=True)
        if cut is not None and seq < cut
        else _use(seq, r, end, stored_seq, evicted_seq, purpose)
        for (seq, r), end, cut, purpose in zip(
            retrieved, ends, lost, purposes(index, shown_in), strict=True
        )
    )
    credits = _credits(index, rows)
    updates = _updates(index, st.call, credits)
    number = {s.request_seq: s.update for s in updates}
    credits = tuple(
        msgspec.structs.replace(c, update=number[c.request_seq]) if c.request_seq in number else c
        for c in credits
    )
    episodes = {u.episode: u for u in uses if not u.abandoned}
    return TipAudit(
        tip=tip,
        slot=st.slot,
        text=st.text,
        stored_seq=stored_seq,
        evicted_seq=evicted_seq,
        evicted=reason,
        origin=_origin(log, st, stored_seq),
        lineage=_lineage(index, tip, frozenset(), rows),
        children=tuple(r.tip for _, r in rows if isinstance(r, Child)),
        duplicates=tuple(r.call or r.episode for _, r in rows if isinstance(r, Duplicated)),
        duplicate_episodes=tuple(r.episode for _, r in rows if isinstance(r, Duplicated)),
        uses=uses,
        credits=credits,
        updates=updates,
        guided=len(episodes),
        guided_success=sum(1 for u in episodes.values() if u.ended and u.success),
        credit_sum=math.fsum(c.credit for c in credits),
        run_end=run_end(log),
        evicted_by=evicted_by,
        evicted_into=evicted_into,
    )


def _eviction(log: EventLog, seq: int) -> tuple[str, tuple[int, ...]]:
    """The extractor call whose answer evicted an entry at ``seq`` (the eviction's cause), and
    the entries its result was refused as a duplicate of: the bank emits an answer's evictions,
    stores and refusals together, each caused by the call."""
    env = fetch(log, [seq])[seq]
    if env.cause is None:
        return "", ()
    called = fetch(log, [env.cause])[env.cause].event
    if not isinstance(called, ExtractorCalled):
        return "", ()
    into: list[int] = []
    for chunk in log.read_chunks(seq + 1, min(seq + 1 + _ANSWER_EVENTS, log.next_seq)):
        for later in chunk:
            if later.cause != env.cause:
                return called.call, tuple(into)
            ev = later.event
            if isinstance(ev, TipRejected) and ev.call == called.call and ev.duplicate_of >= 0:
                into.append(ev.duplicate_of)
    return called.call, tuple(into)


_ANSWER_EVENTS = 256
"""The most events after an eviction read for the rest of its call's answer."""


def _use(
    seq: int,
    r: Retrieved,
    end: Outcome | None,
    stored: int,
    evicted: int | None,
    purpose: str,
    *,
    abandoned: bool = False,
) -> Use:
    return Use(
        seq=seq,
        episode=r.episode,
        turn=r.turn,
        position=r.position,
        rank=r.rank,
        similarity=r.similarity,
        score=r.score,
        alive=stored < seq and (evicted is None or evicted > seq),
        purpose=end.purpose if end is not None else purpose,
        ended=end is not None,
        success=end is not None and end.success,
        outcome_score=end.score if end is not None else 0.0,
        aborted=end.aborted if end is not None else "",
        abandoned=abandoned,
    )


def _credits(index: FactIndex, rows: list[tuple[int, TipRow]]) -> tuple[Credit, ...]:
    credited = [(seq, r) for seq, r in rows if isinstance(r, Credited)]
    episodes = [r.episode for _, r in credited]
    ends, requests = outcomes(index, episodes), consumers(index, episodes)
    return tuple(
        Credit(
            seq=seq,
            episode=r.episode,
            call=r.call,
            success=r.success,
            episode_score=end.score if end is not None else None,
            rule=r.rule,
            credit=r.credit,
            step=r.step,
            request_seq=request,
        )
        for (seq, r), end, request in zip(credited, ends, requests, strict=True)
    )


def _updates(index: FactIndex, call: str, credits: tuple[Credit, ...]) -> tuple[ExtractorStep, ...]:
    """The extractor updates that consumed ``credits`` (each once), with what they did."""
    used = {c.request_seq for c in credits if c.request_seq is not None}
    lines = [(seq, w) for seq, w in weighed(index, call) if seq in used]
    done = applied(index, [w.update for _, w in lines])
    out: list[ExtractorStep] = []
    for (seq, w), upd in zip(lines, done, strict=True):
        step = ExtractorStep(
            update=w.update,
            request_seq=seq,
            call=call,
            reward=w.reward,
            advantage=w.advantage,
            weight=w.weight,
            batch=w.batch,
        )
        if upd is not None:
            step = msgspec.structs.replace(
                step, version=upd.version, samples=upd.samples, loss=upd.loss, digest=upd.digest
            )
        out.append(step)
    return tuple(out)


def _origin(log: EventLog, st: Stored, stored_seq: int) -> Origin:
    """The extractor call or reflection that wrote an entry, and what it was written from; or
    the actor that stored it, when neither did (a method's own list, docs/METHODS.md)."""
    got = fetch(log, [st.cause] if st.cause is not None else [])
    cause = got.get(st.cause) if st.cause is not None else None
    ev = cause.event if cause is not None else None
    if isinstance(ev, ExtractorCalled):
        assert cause is not None
        return _call_origin(log, st, cause, ev)
    if isinstance(ev, TipProposed):
        origin = Origin(
            kind="reflection",
            seq=st.cause,
            source=ev.episode,
            policy_version=ev.policy_version,
            response=ev.text,
            episodes=(ev.episode,),
            episode_score=ev.score,
        )
        request = fetch(log, [cause.cause] if cause and cause.cause is not None else [])
        for env in request.values():
            if isinstance(env.event, ReflectionRequested):
                origin = msgspec.structs.replace(
                    origin, request_seq=env.seq, episode_success=env.event.success
                )
        return origin
    if not st.call and not st.episode:
        env = fetch(log, [stored_seq]).get(stored_seq)
        actor = env.actor if env is not None else "?"
        return Origin(kind="actor", seq=stored_seq, source=actor, request_seq=st.cause)
    kind = "extractor" if st.call else "reflection"
    return Origin(kind=kind, seq=None, call=st.call, source=st.episode, episodes=(st.episode,))


def _call_origin(log: EventLog, st: Stored, env: Envelope[Event], ev: ExtractorCalled) -> Origin:
    op = next((o for o, ids, text in ev.ops if ids == st.parents and text.strip() == st.text), "")
    origin = Origin(
        kind="extractor",
        seq=env.seq,
        call=ev.call,
        task=ev.task,
        source=ev.source,
        extractor_version=ev.extractor_version,
        op=op,
        ops=len(ev.ops),
        errors=ev.errors,
        response=ev.text,
        request_seq=env.cause,
    )
    request = fetch(log, [env.cause] if env.cause is not None else []).get(env.cause or 0)
    req = request.event if request is not None else None
    if isinstance(req, ExtractionRequested):
        return msgspec.structs.replace(
            origin,
            episodes=(req.episode,),
            episode_success=req.success,
            episode_score=req.score,
            entry_used=req.entry,
        )
    if isinstance(req, MergeRequested):
        return msgspec.structs.replace(origin, merge_step=req.step, entries=req.entries)
    return origin


def lineage(index: FactIndex, tip: int) -> Lineage:
    """Entry ``tip`` and the entries it replaced, recursively (each entry once; a cycle, which
    the bank cannot make, would be cut where it closes)."""
    return _lineage(index, tip, frozenset())


def _lineage(
    index: FactIndex, tip: int, seen: frozenset[int], rows: list[tuple[int, TipRow]] | None = None
) -> Lineage:
    rows = tip_rows(index, tip) if rows is None else rows
    stored = next(((s, r) for s, r in rows if isinstance(r, Stored)), None)
    evicted = next((r.reason for _, r in rows if isinstance(r, Evicted)), "")
    if stored is None:
        return Lineage(tip=tip, seq=None, call="", source="", text="", evicted=evicted)
    seq, st = stored
    seen = seen | {tip}
    parents = tuple(_lineage(index, p, seen) for p in st.parents if p not in seen)
    return Lineage(
        tip=tip,
        seq=seq,
        call=st.call,
        source=st.episode,
        text=st.text,
        evicted=evicted,
        parents=parents,
    )
