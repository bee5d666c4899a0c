"""``coevo audit RUN credit``: every credit and advantage of a run re-derived from its log with
the current code, exactly as recorded or under another rule or setting.

The credits and extractor requests come from :meth:`agents.learning.credit_actor.CreditBook.decide`
folded over the log's retrievals and episode ends, the very fold the credit actor runs; the
advantages from ``agents.methods.advantages`` applied to each group's outcomes (from
:class:`EpisodeFinished`) and novelty bonus (from :class:`TipsRetrieved`), as the trainer does.
Under the run's own settings everything must equal the log, bit for bit (:attr:`CreditAudit.match`);
under another rule or setting (a counterfactual) the answer says what would change, per entry,
per extractor call and in aggregate.

One pass over the log (no index): the fold needs every episode end in order. What it reads and
under which settings is :mod:`agents.audit.inputs`; the re-derivation :mod:`agents.audit.derive`;
here, the comparison with what was recorded and the answer.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from agents.audit.derive import ScoreFailed, derive_credits, derive_group_at, too_large
from agents.audit.inputs import AuditSettings, CreditInputs, recorded_modes
from agents.events.extractor import CreditAssigned, ExtractorGradientRequested
from engine.errors import AuditQueryInvalid
from engine.events import Event


class Mismatch(msgspec.Struct, frozen=True, kw_only=True):
    """The first recorded event the re-derivation does not reproduce: its seq, the fields
    that differ, and both sides of the first of them."""

    seq: int
    fields: tuple[str, ...]
    recorded: str
    derived: str


def _mismatch(seq: int, a: Event, b: Event | None) -> Mismatch:
    if b is None:
        return Mismatch(seq=seq, fields=(), recorded=repr(a)[:300], derived="(none)")
    fields = tuple(f for f in a.__struct_fields__ if getattr(a, f) != getattr(b, f))
    first = fields[0] if fields else ""
    return Mismatch(
        seq=seq,
        fields=fields,
        recorded=repr(getattr(a, first, a))[:300],
        derived=repr(getattr(b, first, b))[:300],
    )


class Check(msgspec.Struct, frozen=True, kw_only=True):
    """Recorded events of one kind against their re-derivation, in order.

    ``pending``: re-derived past the last recorded one (a live run's credit actor has not
    written them yet); ``names_compared``: False where the re-derivation's rule has another
    name (a counterfactual rule, or advantages under other method settings), so ``equal``
    counts the events that are the same but for that name.
    """

    kind: str
    recorded: int
    derived: int
    equal: int
    pending: int
    first_mismatch: Mismatch | None = None
    names_compared: bool = True


class EntryChange(msgspec.Struct, frozen=True, kw_only=True):
    """One entry's credits: how many, and their sum recorded and re-derived; ``pending``:
    re-derived credits past the last one the log records for it (a live run's credit actor
    has not recorded them, or a counterfactual gives more), which the recorded sum lacks."""

    tip: int
    credits: int
    recorded: float
    derived: float
    pending: int = 0


class EpisodeCredit(msgspec.Struct, frozen=True, kw_only=True):
    """One episode's credit to an entry (``--entry``): recorded and re-derived, None where
    one side gives none (a counterfactual's batch may not reach it; a live run's credit actor
    has not recorded it yet)."""

    episode: str
    success: bool
    recorded: float | None
    derived: float | None
    recorded_step: int | None
    derived_step: int | None
    recorded_made: bool = True
    """Whether the extractor update ``recorded_step`` was requested (False: the run ended,
    or has not yet come, before that update)."""
    derived_made: bool = True
    """The same of ``derived_step`` among the re-derived requests."""


class CallChange(msgspec.Struct, frozen=True, kw_only=True):
    """One extractor call: its final reward r(m), its push (the sum over the updates that
    trained on it of advantage x weight, what moves its log-probs) and the updates that
    trained on it (a non-zero advantage x weight: a weight of 0, as a cooldown gives, or an
    advantage of 0 leaves its log-probs where they were), recorded and re-derived."""

    call: str
    credits: int
    recorded_reward: float | None
    derived_reward: float | None
    recorded_push: float
    derived_push: float
    recorded_updates: int
    derived_updates: int


class CreditAudit(msgspec.Struct, frozen=True, kw_only=True):
    """The re-derivation of a run's credits and advantages, and what a counterfactual changes."""

    events: int
    counterfactual: bool
    renamed: bool
    """A counterfactual under another rule: its events carry that rule's name, which the
    "equal" counts do not compare."""
    credited: bool
    """Some entry an extractor wrote guided a training episode: the run has credit (GRPO and
    EMPO2 runs have none; only their advantages are re-derived)."""
    rule: str
    batch: int
    alpha: float
    cooldown: int
    counts: str
    """Which updates count as training a call (``[complementary] reweight_counts``)."""
    std_norm: bool | None
    split: bool | None
    """Complementary RL's guided and free subgroups (``[complementary] subgroups``), the
    run's own or as ``--set`` gave them; None for a method without them."""
    weighted: bool | None
    match: bool
    checks: tuple[Check, ...]
    credits_changed: int
    credit_sign_flips: int
    requests: tuple[int, int]
    calls_flipped: int
    samples: int  # the episodes of the groups an update trained on (warm-up ones left out)
    samples_changed: int
    sample_sign_flips: int
    guided_advantage: tuple[float, float] | None
    free_advantage: tuple[float, float] | None
    entries: tuple[EntryChange, ...]
    calls: tuple[CallChange, ...]
    partial: bool = False
    """Re-derived from the log up to a seq before its end (``--until``): a credit may come
    later."""
    entry: int | None = None
    """The entry whose credits are broken down per episode (``--entry``), if asked."""
    entry_credits: tuple[EpisodeCredit, ...] = ()
    unscored: tuple[tuple[int, str], ...] = ()
    """With ``audit_credit(..., unscored=True)``: the groups a plug-in's ``score`` fails on
    now (the seq of each one's ``advantages_computed``, and why), compared as recorded (not
    re-derived); the others are re-derived."""


def audit_credit(
    inputs: CreditInputs,
    settings: AuditSettings,
    base: AuditSettings,
    *,
    asked: bool = False,
    partial: bool = False,
    on_call: Callable[[int], None] | None = None,
    entry: int | None = None,
    unscored: bool = False,
) -> CreditAudit:
    """Re-derive ``inputs`` under ``settings`` and compare with what the log recorded
    (``base``: the run's own settings; anything else is a counterfactual). ``asked``: the
    credit settings were given (``--rule``, a credit key), even if as the run's own values;
    ``partial``: ``inputs`` end before the log does (a credit may come later);
    ``on_call``: as :func:`derive_credits`; ``entry``: an entry whose credits to list per
    episode, recorded and re-derived; ``unscored``: a group a plug-in's ``score`` fails on
    is taken as recorded and listed in :attr:`CreditAudit.unscored` (the credit invariant's
    way: the other groups are still checked), not raised.

    Raises:
        AuditQueryInvalid: as :func:`derive_credits`; credit settings given for a run without
            extractor credit; an ``entry`` with no credit recorded or re-derived.
    """
    derived = derive_credits(inputs, settings, on_call)
    credited = any(isinstance(e, CreditAssigned) for e in (*inputs.recorded, *derived))
    if not credited and not partial and (asked or settings.credit != base.credit):
        raise AuditQueryInvalid(
            "this run has no extractor credit to re-derive (no entry an extractor wrote was "
            "shown in a training episode): --rule and --set batch/alpha/cooldown/reweight/counts "
            "change nothing here; std_norm re-derives its advantages (and split and weighted, "
            "on a run with guided and free subgroups)"
        )
    try:
        audit = _compared(inputs, derived, credited, settings, base, unscored)
    except OverflowError as exc:  # the sums of an entry's or a call's credits
        raise too_large(settings.credit.rule, exc) from None
    audit = msgspec.structs.replace(audit, partial=partial)
    if entry is None:
        return audit
    rows = _episode_credits(
        entry,
        _of(inputs.recorded, CreditAssigned),
        _of(derived, CreditAssigned),
        {r.update for r in _of(inputs.recorded, ExtractorGradientRequested)},
        {r.update for r in _of(derived, ExtractorGradientRequested)},
    )
    if not rows and not credited and not partial:
        raise AuditQueryInvalid(
            f"--entry {entry}: this run credits no entry (no entry an extractor wrote was "
            "shown in a training episode)"
        )
    until = f" up to seq {inputs.end - 1}" if partial else ""
    if not rows and entry not in inputs.stored:
        held = f"its entries are 0-{max(inputs.stored)}" if inputs.stored else "it stored none"
        raise AuditQueryInvalid(f"--entry {entry}: no entry {entry} in this run{until}: {held}")
    if not rows:
        raise AuditQueryInvalid(
            f"--entry {entry}: no credit to it{until}, recorded or re-derived (credited entries: "
            f"{len(audit.entries)}; coevo audit RUN tip {entry} shows its uses)"
        )
    return msgspec.structs.replace(audit, entry=entry, entry_credits=rows)


def _compared(
    inputs: CreditInputs,
    derived: list[Event],
    credited: bool,
    settings: AuditSettings,
    base: AuditSettings,
    unscored: bool = False,
) -> CreditAudit:
    counterfactual = (settings.credit, settings.method_sets) != (base.credit, base.method_sets)
    failures: list[ScoreFailed] = []
    groups = [
        (seq, g, derive_group_at(seq, g, inputs, settings, failures if unscored else None))
        for seq, g in inputs.groups
    ]
    adv = {ep: a for _, _, d in groups for ep, a in zip(d.episodes, d.advantages, strict=True)}
    grads = [
        (
            seq,
            r,
            msgspec.structs.replace(r, advantages=tuple(adv.get(e, math.nan) for e in r.episodes)),
        )
        for seq, r in inputs.requests
    ]
    rec_c, der_c = _of(inputs.recorded, CreditAssigned), _of(derived, CreditAssigned)
    rec_x, der_x = (
        _of(inputs.recorded, ExtractorGradientRequested),
        _of(derived, ExtractorGradientRequested),
    )
    seq_of = dict(zip(map(id, inputs.recorded), inputs.seqs, strict=True))
    renamed = settings.credit.rule != base.credit.rule  # another rule's events carry its name
    labels = not renamed
    same_method = settings.method_sets == base.method_sets  # so do groups of other settings
    checks = (
        _check("credit_assigned", rec_c, der_c, [seq_of[id(c)] for c in rec_c], labels),
        _check(
            "extractor_gradient_requested", rec_x, der_x, [seq_of[id(x)] for x in rec_x], labels
        ),
        _check(
            "advantages_computed",
            [g for _, g, _ in groups],
            [d for _, _, d in groups],
            [s for s, _, _ in groups],
            same_method,
        ),
        _check(
            "gradient_requested",
            [r for _, r, _ in grads],
            [d for _, _, d in grads],
            [s for s, _, _ in grads],
            same_method,
        ),
    )
    trained = {ep for _, r, _ in grads for ep in r.episodes}  # warm-up groups train nothing
    samples = [
        (mode.guided, a, b)
        for _, g, d in groups
        for ep, mode, a, b in zip(
            g.episodes, recorded_modes(g), g.advantages, d.advantages, strict=True
        )
        if ep in trained
    ]
    changed = [(a, b) for a, b in zip(rec_c, der_c, strict=False) if a.credit != b.credit]
    calls = _calls(rec_c, der_c, rec_x, der_x)
    c = settings.credit
    return CreditAudit(
        events=inputs.end,
        counterfactual=counterfactual,
        renamed=renamed,
        credited=credited,
        rule=c.rule,
        batch=c.batch,
        alpha=c.alpha,
        cooldown=c.cooldown,
        counts=c.counts,
        std_norm=settings.setting("std_norm", None),
        split=bool(settings.setting("split", True)),
        weighted=bool(settings.setting("weighted", True)),
        match=all(ch.first_mismatch is None for ch in checks),
        checks=checks,
        credits_changed=len(changed),
        credit_sign_flips=sum(1 for a, b in changed if _flipped(a.credit, b.credit)),
        requests=(len(rec_x), len(der_x)),
        calls_flipped=sum(1 for x in calls if _flipped(x.recorded_push, x.derived_push)),
        samples=len(samples),
        samples_changed=sum(1 for _, a, b in samples if a != b),
        sample_sign_flips=sum(1 for _, a, b in samples if _flipped(a, b)),
        guided_advantage=_means([(a, b) for g, a, b in samples if g]),
        free_advantage=_means([(a, b) for g, a, b in samples if not g])
        if any(g for g, _, _ in samples)
        else None,
        entries=_entries(rec_c, der_c),
        calls=tuple(calls),
        unscored=tuple((f.seq, str(f)) for f in failures),
    )


def _of(events: Sequence[Event], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def _check(
    kind: str,
    recorded: Sequence[Event],
    derived: Sequence[Event],
    seqs: Sequence[int],
    labels: bool = True,
) -> Check:
    """How many of ``derived`` equal ``recorded``, pairwise; ``labels`` False: a ``rule``
    field (the name of the rule the numbers came from) is not compared."""
    equal = 0
    mismatch = None
    for i, (a, b) in enumerate(zip(recorded, derived, strict=False)):
        if a == b or (not labels and _unlabelled(a) == _unlabelled(b)):
            equal += 1
        elif mismatch is None:
            mismatch = _mismatch(seqs[i], a, b)
    if mismatch is None and len(recorded) > len(derived):
        mismatch = _mismatch(seqs[len(derived)], recorded[len(derived)], None)
    return Check(
        kind=kind,
        recorded=len(recorded),
        derived=len(derived),
        equal=equal,
        pending=max(len(derived) - len(recorded), 0),
        first_mismatch=mismatch,
        names_compared=labels,
    )


def _unlabelled(ev: Event) -> Event:
    return msgspec.structs.replace(ev, rule="") if hasattr(ev, "rule") else ev


def _flipped(a: float, b: float) -> bool:
    """``b`` has the opposite sign of ``a`` (a move to or from zero is no flip)."""
    return a * b < 0


def _means(pairs: list[tuple[float, float]]) -> tuple[float, float] | None:
    if not pairs:
        return None
    return math.fsum(a for a, _ in pairs) / len(pairs), math.fsum(b for _, b in pairs) / len(pairs)


def _entries(
    recorded: list[CreditAssigned], derived: list[CreditAssigned]
) -> tuple[EntryChange, ...]:
    rec: dict[int, list[float]] = defaultdict(list)
    der: dict[int, list[float]] = defaultdict(list)
    for c in recorded:
        rec[c.entry].append(c.credit)
    for c in derived:
        der[c.entry].append(c.credit)
    out = [
        EntryChange(
            tip=tip,
            credits=max(len(rec[tip]), len(der[tip])),
            recorded=math.fsum(rec[tip]),
            derived=math.fsum(der[tip]),
            pending=max(len(der[tip]) - len(rec[tip]), 0),
        )
        for tip in dict.fromkeys([*rec, *der])
    ]
    # a credit not recorded yet is no change: ranked by what both sides hold
    held = {t: math.fsum(der[t][: len(rec[t])]) - math.fsum(rec[t]) for t in dict.fromkeys(rec)}
    return tuple(sorted(out, key=lambda e: (-abs(held.get(e.tip, 0.0)), -e.credits, e.tip)))


def _episode_credits(
    entry: int,
    recorded: list[CreditAssigned],
    derived: list[CreditAssigned],
    recorded_updates: set[int],
    derived_updates: set[int],
) -> tuple[EpisodeCredit, ...]:
    """``entry``'s credits by episode, in the order they were first given; ``*_updates``:
    the extractor updates requested, recorded and re-derived (a credit's step names the
    update it waits for, which a run that ended first never made)."""
    rec = {c.episode: c for c in recorded if c.entry == entry}
    der = {c.episode: c for c in derived if c.entry == entry}
    return tuple(
        EpisodeCredit(
            episode=ep,
            success=(rec.get(ep) or der[ep]).success,
            recorded=rec[ep].credit if ep in rec else None,
            derived=der[ep].credit if ep in der else None,
            recorded_step=rec[ep].step if ep in rec else None,
            derived_step=der[ep].step if ep in der else None,
            recorded_made=ep not in rec or rec[ep].step in recorded_updates,
            derived_made=ep not in der or der[ep].step in derived_updates,
        )
        for ep in dict.fromkeys([*rec, *der])
    )


def _calls(
    rec_c: list[CreditAssigned],
    der_c: list[CreditAssigned],
    rec_x: list[ExtractorGradientRequested],
    der_x: list[ExtractorGradientRequested],
) -> list[CallChange]:
    credits: dict[str, int] = defaultdict(int)
    for c in der_c or rec_c:
        credits[c.call] += 1
    rec, der = _pushes(rec_x), _pushes(der_x)
    out = [
        CallChange(
            call=call,
            credits=credits[call],
            recorded_reward=rec[call][0] if call in rec else None,
            derived_reward=der[call][0] if call in der else None,
            recorded_push=rec[call][1] if call in rec else 0.0,
            derived_push=der[call][1] if call in der else 0.0,
            recorded_updates=rec[call][2] if call in rec else 0,
            derived_updates=der[call][2] if call in der else 0,
        )
        for call in dict.fromkeys([*credits, *rec, *der])
    ]
    return sorted(out, key=lambda x: (-abs(x.derived_push - x.recorded_push), x.call))


def _pushes(requests: list[ExtractorGradientRequested]) -> dict[str, tuple[float, float, int]]:
    """Per call: its latest reward, its summed advantage x weight, and the updates that
    trained on it (a non-zero advantage x weight)."""
    reward: dict[str, float] = {}
    push: dict[str, list[float]] = defaultdict(list)
    trained: dict[str, int] = defaultdict(int)
    for r in requests:
        for call, rw, a, w in zip(r.calls, r.rewards, r.advantages, r.weights, strict=True):
            reward[call] = rw
            push[call].append(a * w)
            trained[call] += a * w != 0
    return {call: (reward[call], math.fsum(push[call]), trained[call]) for call in reward}
