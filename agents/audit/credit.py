"""``coevo audit RUN credit``: every credit and advantage of a run re-derived from its log with
the current code, exactly as recorded or under another rule or setting.

The credits and extractor requests come from :meth:`agents.learning.credit_actor.CreditBook.decide`
folded over the log's retrievals and episode ends, the very fold the credit actor runs; the
advantages from ``agents.methods.advantages`` applied to each group's outcomes (from
:class:`EpisodeFinished`) and novelty bonus (from :class:`TipsRetrieved`), as the trainer does.
Under the run's own settings everything must equal the log, bit for bit (:attr:`CreditAudit.match`);
under another rule or setting (a counterfactual) the answer says what would change, per entry,
per extractor call and in aggregate.

One pass over the log (no index): the fold needs every episode end in order.
"""

from __future__ import annotations

import math
import numbers
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Literal, cast

import msgspec

from agents.events.episodes import EpisodeAbandoned, EpisodeFinished
from agents.events.extractor import CreditAssigned, ExtractorGradientRequested
from agents.events.memory import TipsRetrieved
from agents.events.policy import AdvantagesComputed, GradientRequested
from agents.learning.credit_actor import RULES, CreditBook, CreditSettings
from agents.methods.advantages import group_stats, outcome
from agents.methods.base import Method, RolloutMode, checked_scored, method_label, mode_of
from agents.methods.credit import relative_credit
from engine.entrypoints import import_named
from engine.errors import AuditQueryInvalid
from engine.eventlog import EventLog
from engine.events import Envelope, Event


@dataclass(frozen=True)
class AuditSettings:
    """The rules to re-derive under.

    Attributes:
        credit: the credit actor's settings (rule, batch, alpha, cooldown, loss settings).
        method: the run's learning method, whose ``score`` re-derives each group's rewards and
            advantages as the trainer computed them (None: a run without one).
        reward: the outcome of an episode: its "score" or its "success" (``[grpo] reward``).
        method_sets: the ``--set`` overrides ``method`` was built with (none: the run's own).
    """

    credit: CreditSettings
    method: Method | None
    reward: Literal["score", "success"] = "score"
    method_sets: tuple[tuple[str, bool], ...] = ()

    def setting(self, key: str, default: bool | None) -> bool | None:
        """The value ``--set`` gave the method setting ``key``, else ``default``."""
        return dict(self.method_sets).get(key, default)


SETTABLE = ("batch", "alpha", "cooldown", "reweight", "counts", "std_norm", "split", "weighted")
"""The keys ``--set`` accepts; ``reweight=false`` is ``alpha=0`` and ``cooldown=0``;
``counts`` is ``[complementary] reweight_counts``."""

METHOD_KEYS = ("std_norm", "split", "weighted")
"""The keys of ``SETTABLE`` that change the method (its scenario settings), not the credit."""


def with_overrides(
    base: AuditSettings,
    rule: str | None,
    sets: Sequence[str],
    method_for: Callable[[Mapping[str, bool]], Method | None],
    changes_method: Callable[[Mapping[str, bool]], bool] = lambda sets: bool(sets),
) -> AuditSettings:
    """``base`` under ``--rule`` and ``--set key=value`` overrides.

    Args:
        method_for: the run's method rebuilt with settings overridden (``std_norm``: the group
            and subgroup advantages' std division; ``split``: Complementary RL's subgroups;
            ``weighted``: its subgroup weights); called only when one of them is set.
        changes_method: whether those settings differ from the run's own (when they do not,
            the method is the run's, and the audit is no counterfactual).

    Raises:
        AuditQueryInvalid: an unknown rule or key, or a value of the wrong type or range.
    """
    if rule is not None and rule not in RULES:
        if ":" not in rule:
            raise AuditQueryInvalid(
                f"unknown credit rule {rule!r}; known: {', '.join(RULES)}, or a rule of your "
                "own by its import path 'package.module:function'"
            )
        rule_function(rule)  # refused here, before the log is read, when it cannot be used
    credit = replace(base.credit, rule=rule) if rule is not None else base.credit
    out = replace(base, credit=credit)
    method_sets: dict[str, bool] = {}
    given: dict[str, str] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or key not in SETTABLE:
            said = f"no setting {key!r}" if sep else "expected KEY=VALUE"
            raise AuditQueryInvalid(f"--set {item!r}: {said}, KEY one of {', '.join(SETTABLE)}")
        value = parse_setting(key, raw)
        given[key] = item
        if "reweight" in given and ("alpha" in given or "cooldown" in given):
            other = given.get("alpha") or given["cooldown"]
            raise AuditQueryInvalid(  # which won depended on their order
                f"--set {given['reweight']} and --set {other}: reweight sets alpha and "
                "cooldown (false: alpha=0, cooldown=0); set either reweight or those"
            )
        if key in ("batch", "alpha", "cooldown", "counts"):
            out = replace(out, credit=replace(out.credit, **{key: value}))
        elif key == "reweight":
            out = (
                replace(out, credit=replace(out.credit, alpha=0.0, cooldown=0))
                if not value
                else out
            )
        else:
            method_sets[key] = value
    if method_sets and changes_method(method_sets):
        out = replace(out, method=method_for(method_sets), method_sets=tuple(method_sets.items()))
    return out


def parse_setting(key: str, raw: str) -> Any:
    try:
        if key in ("batch", "cooldown"):
            if not re.fullmatch(r"[+-]?[0-9]+", raw.strip()):
                raise ValueError("must be a whole number")
            value: Any = int(raw)
            low = 1 if key == "batch" else 0
            if value < low:
                raise ValueError(f"must be >= {low}")
        elif key == "counts":
            value = raw.strip().strip("'\"").lower()  # as a run's --set writes text, too
            if value not in ("pushed", "weighted"):
                raise ValueError("must be pushed or weighted")
        elif key == "alpha":
            try:
                value = float(raw)
            except ValueError:
                raise ValueError("must be a number") from None
            if not (math.isfinite(value) and value >= 0):
                raise ValueError("must be finite and >= 0")
        else:
            if raw.lower() not in ("true", "false"):
                raise ValueError("must be true or false")
            value = raw.lower() == "true"
    except ValueError as exc:
        raise AuditQueryInvalid(f"--set {key}={raw}: {exc}") from None
    return value


# --- the log's inputs --------------------------------------------------------------------------


@dataclass
class CreditInputs:
    """What re-deriving credits and advantages reads from a log, gathered in one pass.

    Attributes:
        stream: every :class:`TipsRetrieved`, :class:`EpisodeFinished` and
            :class:`EpisodeAbandoned`, in log order (what the credit actor folds).
        recorded: every :class:`CreditAssigned` and :class:`ExtractorGradientRequested`.
        groups: every :class:`AdvantagesComputed`, with its seq.
        requests: every :class:`GradientRequested`, with its seq.
        seqs: the seq of every recorded credit and extractor request, in order.
        similar: per episode, the similar-tip count of each of its retrievals.
        end: the log's end when the pass started (a live run goes on after it).
    """

    stream: list[Event] = field(default_factory=list[Event])
    recorded: list[Event] = field(default_factory=list[Event])
    seqs: list[int] = field(default_factory=list[int])
    groups: list[tuple[int, AdvantagesComputed]] = field(
        default_factory=list[tuple[int, AdvantagesComputed]]
    )
    requests: list[tuple[int, GradientRequested]] = field(
        default_factory=list[tuple[int, GradientRequested]]
    )
    finished: dict[str, EpisodeFinished] = field(default_factory=dict[str, EpisodeFinished])
    similar: dict[str, list[int]] = field(default_factory=dict[str, list[int]])
    end: int = 0


def gather(log: EventLog, until: int | None = None) -> CreditInputs:
    """One pass over ``log`` up to its end as of now, or (``until``) up to and including that
    seq: the run as it stood then."""
    end = log.next_seq if until is None else min(log.next_seq, until + 1)
    return gather_chunks(log.read_chunks(0, end), end)


def gather_chunks(chunks: Iterable[Sequence[Envelope[Event]]], end: int) -> CreditInputs:
    """:func:`gather` over envelopes in seq order that are no log (a live or generated
    stream, what ``agents.invariants.credit`` kept); ``end`` is the seq after the last."""
    out = CreditInputs(end=end)
    for chunk in chunks:
        for env in chunk:
            ev = env.event
            kind = type(ev)
            if kind is TipsRetrieved or kind is EpisodeFinished or kind is EpisodeAbandoned:
                out.stream.append(ev)
                if isinstance(ev, TipsRetrieved):
                    out.similar.setdefault(ev.episode, []).append(ev.similar)
                elif isinstance(ev, EpisodeFinished):
                    out.finished[ev.episode] = ev
                elif isinstance(ev, EpisodeAbandoned):  # the attempt's retrievals no longer
                    out.similar.pop(ev.episode, None)  # count: the trainer forgets them
            elif kind is CreditAssigned or kind is ExtractorGradientRequested:
                if isinstance(ev, ExtractorGradientRequested):
                    _check_extractor_request(ev, env.seq)
                out.recorded.append(ev)
                out.seqs.append(env.seq)
            elif isinstance(ev, AdvantagesComputed):
                out.groups.append((env.seq, ev))
            elif isinstance(ev, GradientRequested):
                out.requests.append((env.seq, ev))
    return out


# --- re-deriving --------------------------------------------------------------------------------


CreditRule = Callable[[EpisodeFinished, AdvantagesComputed | None], float]
"""A researcher's own credit rule: the credit of an episode an extractor entry guided, from
its end and its recorded group (None: not grouped, e.g. the run stopped first)."""


def rule_function(path: str) -> CreditRule:
    """The function ``package.module:function`` names, for ``audit credit --rule``.

    Raises:
        AuditQueryInvalid: a malformed path, a module that fails to import, or no such
            function.
    """
    try:
        fn = import_named(path, "credit rule", "function")
    except ValueError as exc:
        raise AuditQueryInvalid(str(exc)) from None
    if not callable(fn):
        raise AuditQueryInvalid(f"credit rule {path!r} is {fn!r}, not a function")
    return cast("CreditRule", fn)


def derive_credits(
    inputs: CreditInputs, settings: AuditSettings, on_call: Callable[[int], None] | None = None
) -> list[Event]:
    """The credit actor's output re-folded from the log's retrievals and episode ends;
    ``on_call`` is told how many times a rule of the researcher's own has been called, after
    each call (a slow rule's progress), and :data:`RULE_DONE` once it has been called for
    every episode.

    Raises:
        AuditQueryInvalid: a rule of the researcher's own that raises or gives no finite
            number; credits too large to add up.
    """
    book = CreditBook()
    rule = settings.credit.rule
    given: Callable[[EpisodeFinished], float] | None = None
    own = rule != "relative" and rule not in RULES  # the researcher's, by its import path
    if rule == "relative":
        baseline = _relative_credits(inputs)
        given = lambda ev: baseline.get(ev.episode, 0.0)  # noqa: E731 - 0.0: no group (yet)
    elif own:
        given = _own_rule(rule, inputs, on_call)
    out: list[Event] = []
    for ev in inputs.stream:
        try:
            out += book.decide(ev, settings.credit, given)
        except OverflowError as exc:
            raise _too_large(rule, exc) from None
    if own and on_call is not None:
        on_call(RULE_DONE)
    return out


RULE_DONE = -1
"""What ``derive_credits`` tells its ``on_call`` once a rule of the researcher's own has been
called for every episode (the audit goes on without it)."""


def _too_large(rule: str, exc: OverflowError) -> AuditQueryInvalid:
    """The error of finite credits whose sum is not (a rule's 1e308s), summed where it was."""
    return AuditQueryInvalid(f"credit rule {rule!r}: its credits are too large to add up ({exc})")


def _own_rule(
    path: str, inputs: CreditInputs, on_call: Callable[[int], None] | None = None
) -> Callable[[EpisodeFinished], float]:
    """A researcher's rule called with each credited episode's end and recorded group (a
    guided training episode), its answer checked: a real number (an int, a float, a Fraction,
    a Decimal, a NumPy one), finite; not a bool."""
    fn = rule_function(path)
    group_of = {ep: g for _, g in inputs.groups for ep in g.episodes}
    calls = 0

    def credit(ev: EpisodeFinished) -> float:
        nonlocal calls
        try:
            got = fn(ev, group_of.get(ev.episode))
        except KeyboardInterrupt:  # the user's Ctrl-C: coevo's own "interrupted"
            raise
        except BaseException as exc:  # the rule's bug, whatever it raises: one line
            raise AuditQueryInvalid(
                f"credit rule {path!r} raised {type(exc).__name__} on episode {ev.episode}: {exc}"
            ) from None
        calls += 1
        if on_call is not None:
            on_call(calls)
        value, past, real = math.nan, False, False
        if isinstance(got, numbers.Real | Decimal) and not isinstance(got, bool):
            try:
                value = float(got)
                real = True
            except OverflowError:  # 10**400, Fraction(10**400, 3)
                past = real = True
            except ValueError:  # Decimal("sNaN")
                real = True
            except TypeError:  # a class registered as a Real that float() refuses
                pass
            except Exception as exc:  # its __float__ raised: the rule's answer's own bug
                raise AuditQueryInvalid(
                    f"credit rule {path!r} gave {_short(got)} for episode {ev.episode}, whose "
                    f"float() raised {type(exc).__name__}: {exc}"
                ) from None
            if math.isinf(value) and _finite(got):
                past = True  # Decimal("1e400"), a NumPy longdouble of 1e400: inf as a float
        if not math.isfinite(value):
            said = _short(got)
            boolean = isinstance(got, bool) or type(got).__name__ in ("bool", "bool_")  # NumPy's
            what = (
                "a bool, not a number"
                if boolean
                else "too large for a float"
                if past
                else "not a finite number"
                if real
                else f"not a real number (a {type(got).__name__}: give a float)"
            )
            raise AuditQueryInvalid(
                f"credit rule {path!r} gave {said} for episode {ev.episode}: {what}"
            )
        return value

    return credit


def _finite(value: object) -> bool:
    """Whether a real number whose float is infinite is itself finite (it compares unequal to
    an infinity: a ``Decimal``, a NumPy ``longdouble``); False when it cannot say."""
    try:
        return bool(value != math.inf and value != -math.inf)
    except Exception:  # a plug-in's number whose comparison raises
        return False


def _short(value: object, most: int = 80) -> str:
    """``repr(value)``, cut to ``most`` characters (a rule's 10**400 has 401 digits)."""
    try:
        text = repr(value)
    except Exception:  # a plug-in's object whose repr raises
        return f"a {type(value).__name__}"
    return text if len(text) <= most else f"{text[: most - 21]}... ({len(text):,} characters)"


def _relative_credits(inputs: CreditInputs) -> dict[str, float]:
    """Each grouped episode's reward minus its group's free half's mean reward."""
    out: dict[str, float] = {}
    for _, g in inputs.groups:
        free = [r for r, mode in zip(g.rewards, _modes(g), strict=True) if not mode.guided]
        for ep, r in zip(g.episodes, g.rewards, strict=True):
            out[ep] = relative_credit(r, free)
    return out


def _modes(g: AdvantagesComputed) -> tuple[RolloutMode, ...]:
    """The rollout modes of ``g``'s episodes (all "plain" when it records none).

    Raises:
        AuditQueryInvalid: a mode this coevo does not know.
    """
    try:
        return tuple(mode_of(ro) for ro in g.rollouts or ("plain",) * len(g.episodes))
    except ValueError as exc:
        raise AuditQueryInvalid(f"group {g.group}: {exc}") from None


def _check_recorded(g: AdvantagesComputed) -> None:
    """Raise AuditQueryInvalid unless group ``g`` was recorded with one reward and one
    advantage (and one rollout mode, when recorded) per episode: a plug-in's ``score`` once
    returned fewer, which the trainer recorded before it checked them."""
    sizes = {"rewards": len(g.rewards), "advantages": len(g.advantages)}
    if g.rollouts:
        sizes["rollouts"] = len(g.rollouts)
    if shown := _unlike(len(g.episodes), sizes):
        raise AuditQueryInvalid(
            f"group {g.group}: recorded with {len(g.episodes)} episodes and {shown}"
        )


def _check_extractor_request(r: ExtractorGradientRequested, seq: int) -> None:
    """Raise AuditQueryInvalid unless extractor update request ``r`` (at ``seq``) was recorded
    with one reward, advantage and weight per call (a hand-edited log or a plug-in's credit
    actor could write fewer: the audit failed with a ``zip`` error)."""
    sizes = {"rewards": len(r.rewards), "advantages": len(r.advantages), "weights": len(r.weights)}
    if shown := _unlike(len(r.calls), sizes):
        raise AuditQueryInvalid(
            f"extractor update request {r.update} at seq {seq}: recorded with {len(r.calls)} "
            f"calls and {shown}"
        )


def _unlike(n: int, sizes: dict[str, int]) -> str:
    """The lists of ``sizes`` (name -> length) not ``n`` long, as "2 rewards, 3 weights"."""
    return ", ".join(f"{size} {name}" for name, size in sizes.items() if size != n)


def _coevo_score(method: object) -> bool:
    """Whether ``method`` scores with the ``score`` of one of coevo's own methods (itself, or
    a plug-in subclass that does not override it)."""
    from agents.methods.registry import BUILTIN

    own = getattr(type(method), "score", None)
    return any(own is getattr(cls, "score", None) for cls in BUILTIN.values())


class GroupNotDerived(AuditQueryInvalid):
    """A recorded group cannot be re-derived; ``seq`` is its ``advantages_computed``."""

    def __init__(self, message: str, seq: int = -1) -> None:
        super().__init__(message)
        self.seq = seq


class ScoreFailed(GroupNotDerived):
    """The method's ``score`` fails on a recorded group now (raises, or answers what is not
    a group's score: NaN, the wrong length or type): the code re-deriving it, not the log, is
    at fault (a plug-in edited since the run)."""


def derive_group(
    g: AdvantagesComputed, inputs: CreditInputs, settings: AuditSettings
) -> AdvantagesComputed:
    """Group ``g`` re-derived by the method's own ``score``, as the trainer computed it: the
    outcomes from the episodes' ends, the similar-tip counts from their retrievals, the rollout
    modes as recorded.

    Raises:
        AuditQueryInvalid: a run without a method, an unknown rollout mode, an episode without
            an end, or one of coevo's own methods whose ``score`` refuses the group.
        ScoreFailed: a plug-in method's own ``score`` (not one it inherits from coevo's
            methods) raises an ``Exception`` or ``SystemExit``, or answers what is not a
            score.
    """
    method = settings.method
    if method is None:
        raise AuditQueryInvalid(f"group {g.group}: the run has no learning method to score it")
    _check_recorded(g)
    modes = _modes(g)
    missing = [ep for ep in g.episodes if ep not in inputs.finished]
    if missing:
        raise AuditQueryInvalid(f"group {g.group}: no EpisodeFinished for {missing}")
    ends = [inputs.finished[ep] for ep in g.episodes]
    outcomes = [outcome(e.score, e.success, settings.reward) for e in ends]
    # a plug-in's own score may have changed since the run; coevo's failing (a plug-in's that
    # inherits it too) is the log's doing
    failed = AuditQueryInvalid if _coevo_score(method) else ScoreFailed
    similar = [inputs.similar.get(ep, []) for ep in g.episodes]
    try:
        scored = method.score(outcomes, [m.name for m in modes], similar)
    except ValueError as exc:  # a refusal of the recorded group
        raise failed(f"group {g.group}: {method_label(method)}: score: {exc}") from None
    except (Exception, SystemExit) as exc:  # a plug-in's bug: one line, not a traceback
        raise failed(
            f"group {g.group}: {method_label(method)}: score raised {type(exc).__name__}: {exc}"
        ) from None
    try:
        scored = checked_scored(scored, len(g.episodes), method)
    except ValueError as exc:
        raise failed(f"group {g.group}: {exc}") from None
    mean, std = group_stats(scored.rewards) if scored.rewards else (0.0, 0.0)
    return msgspec.structs.replace(
        g,
        rewards=scored.rewards,
        advantages=scored.advantages,
        rule=scored.rule,
        mean=mean,
        std=std,
        outcomes=scored.outcomes,
        intrinsic=scored.intrinsic,
        intrinsic_coef=scored.intrinsic_coef,
    )


# --- comparing ---------------------------------------------------------------------------------


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
    """One entry's credits: how many, and their sum recorded and re-derived."""

    tip: int
    credits: int
    recorded: float
    derived: float


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
    trained on it of advantage x weight, what moves its log-probs) and its updates with a
    non-zero weight, recorded and re-derived."""

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
        raise _too_large(settings.credit.rule, exc) from None
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
    if not rows:
        until = f" up to seq {inputs.end - 1}" if partial else ""
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
        (seq, g, _derived_at(seq, g, inputs, settings, failures if unscored else None))
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
        for ep, mode, a, b in zip(g.episodes, _modes(g), g.advantages, d.advantages, strict=True)
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


def _derived_at(
    seq: int,
    g: AdvantagesComputed,
    inputs: CreditInputs,
    settings: AuditSettings,
    failures: list[ScoreFailed] | None = None,
) -> AdvantagesComputed:
    """:func:`derive_group` of ``g``, recorded at ``seq``; with ``failures``, a group a
    plug-in's ``score`` fails on is noted there and taken as recorded.

    Raises:
        GroupNotDerived: naming ``seq`` (a :class:`ScoreFailed` as such, without
            ``failures``).
    """
    try:
        return derive_group(g, inputs, settings)
    except ScoreFailed as exc:
        exc.seq = seq
        if failures is None:
            raise
        failures.append(exc)
        return g
    except AuditQueryInvalid as exc:
        raise GroupNotDerived(str(exc), seq) from None


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
        )
        for tip in dict.fromkeys([*rec, *der])
    ]
    return tuple(sorted(out, key=lambda e: (-abs(e.derived - e.recorded), -e.credits, e.tip)))


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
    """Per call: its latest reward, its summed advantage x weight, its updates with weight."""
    reward: dict[str, float] = {}
    push: dict[str, list[float]] = defaultdict(list)
    trained: dict[str, int] = defaultdict(int)
    for r in requests:
        for call, rw, a, w in zip(r.calls, r.rewards, r.advantages, r.weights, strict=True):
            reward[call] = rw
            push[call].append(a * w)
            trained[call] += w > 0
    return {call: (reward[call], math.fsum(push[call]), trained[call]) for call in reward}
