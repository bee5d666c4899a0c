"""What ``coevo audit RUN credit`` re-derives under and from: the rules and settings
(``--rule``, ``--set``) and what one pass over a run's log gathers for them, each record checked
as it is read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from agents.events.episodes import EpisodeAbandoned, EpisodeFinished
from agents.events.extractor import CreditAssigned, ExtractorGradientRequested
from agents.events.memory import TipsRetrieved, TipStored
from agents.events.policy import AdvantagesComputed, GradientRequested
from agents.learning.credit_actor import RULES, CreditSettings
from agents.methods.base import Method, RolloutMode, mode_of
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
        stored: the id of every entry stored (:class:`TipStored`).
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
    stored: set[int] = field(default_factory=set[int])
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
                    check_extractor_request(ev, env.seq)
                out.recorded.append(ev)
                out.seqs.append(env.seq)
            elif isinstance(ev, AdvantagesComputed):
                out.groups.append((env.seq, ev))
            elif isinstance(ev, GradientRequested):
                out.requests.append((env.seq, ev))
            elif kind is TipStored:  # by exact type: most events reach this test and fail it
                out.stored.add(cast(TipStored, ev).tip_id)
    return out


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


def recorded_modes(g: AdvantagesComputed) -> tuple[RolloutMode, ...]:
    """The rollout modes of ``g``'s episodes (all "plain" when it records none).

    Raises:
        AuditQueryInvalid: a mode this coevo does not know.
    """
    try:
        return tuple(mode_of(ro) for ro in g.rollouts or ("plain",) * len(g.episodes))
    except ValueError as exc:
        raise AuditQueryInvalid(f"group {g.group}: {exc}") from None


def check_recorded_group(g: AdvantagesComputed) -> None:
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


def check_extractor_request(r: ExtractorGradientRequested, seq: int) -> None:
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
