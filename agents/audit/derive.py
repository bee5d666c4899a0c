"""Re-deriving what a run recorded, with the current code: the credit actor's credits and
extractor requests (under the run's rule, the relative rule or a researcher's own) and each
group's rewards and advantages by the run's method's ``score``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from decimal import Decimal

import msgspec

from agents.audit.inputs import (
    AuditSettings,
    CreditInputs,
    check_recorded_group,
    recorded_modes,
    rule_function,
)
from agents.events.episodes import EpisodeFinished
from agents.events.policy import AdvantagesComputed
from agents.learning.credit_actor import RULES, CreditBook
from agents.methods.advantages import group_stats, outcome
from agents.methods.base import checked_scored, method_label
from agents.methods.credit import relative_credit
from engine.errors import AuditQueryInvalid
from engine.events import Event


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
            raise too_large(rule, exc) from None
    if own and on_call is not None:
        on_call(RULE_DONE)
    return out


RULE_DONE = -1
"""What ``derive_credits`` tells its ``on_call`` once a rule of the researcher's own has been
called for every episode (the audit goes on without it)."""


def too_large(rule: str, exc: OverflowError) -> AuditQueryInvalid:
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
    """Each grouped episode's reward minus its group's free subgroup's mean reward."""
    out: dict[str, float] = {}
    for _, g in inputs.groups:
        free = [r for r, mode in zip(g.rewards, recorded_modes(g), strict=True) if not mode.guided]
        for ep, r in zip(g.episodes, g.rewards, strict=True):
            out[ep] = relative_credit(r, free)
    return out


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
    check_recorded_group(g)
    modes = recorded_modes(g)
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


def derive_group_at(
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
