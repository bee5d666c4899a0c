"""``credit``: credits and advantages re-derive from the events.

A thin invariant over ``coevo audit RUN credit`` (:mod:`agents.audit.credit`): it keeps the
events that audit reads and, at the stream's end, re-derives every ``credit_assigned``,
``extractor_gradient_requested``, ``advantages_computed`` and ``gradient_requested`` with the
audit's own code under the run's settings; the first one that differs is the violation. The
re-derivation itself lives in the audit (and through it the methods' code), never here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents.audit.credit import audit_credit
from agents.audit.derive import GroupNotDerived
from agents.audit.inputs import AuditSettings, gather_chunks
from agents.events.episodes import EpisodeAbandoned, EpisodeFinished
from agents.events.extractor import CreditAssigned, ExtractorGradientRequested
from agents.events.memory import TipsRetrieved
from agents.events.policy import AdvantagesComputed, GradientRequested
from agents.learning.credit_actor import credit_settings
from agents.methods.registry import method_settings, scenario_method
from agents.methods.settings import ComplementaryConfig
from engine.errors import AuditQueryInvalid
from engine.events import Envelope, Event
from engine.invariants import CheckContext, InvariantUncheckable, InvariantViolated, invariant

_READ = frozenset(
    {
        TipsRetrieved,
        EpisodeFinished,
        EpisodeAbandoned,
        CreditAssigned,
        ExtractorGradientRequested,
        AdvantagesComputed,
        GradientRequested,
    }
)
"""What :func:`agents.audit.inputs.gather` reads of a log."""


def run_settings(scenario: Any) -> AuditSettings:
    """The audit's settings for a run of ``scenario``, as ``coevo audit RUN credit`` takes
    them: the credit actor's (``[complementary]``), the run's method (built by the method
    registry from the scenario's sections, as the run built it; None for a rollout) and the
    outcome reward (``[grpo] reward``).

    Raises:
        ValueError: the run's method cannot be built (a plug-in that no longer imports).
    """
    method = None if scenario.run.method == "rollout" else scenario_method(scenario)
    c = method_settings(scenario, ComplementaryConfig)  # a plug-in built on it: its [method]
    return AuditSettings(credit_settings(c), method, scenario.grpo.reward)


@invariant("credit", needs_scenario=True)
class Credit:
    """Credits and advantages re-derive from the events: every credit, extractor update
    request, group's advantages and policy update request equals what the audit re-derives
    from the retrievals and episode ends under the run's settings and its method's own
    ``score``."""

    name = "credit"

    def __init__(self, ctx: CheckContext | None = None) -> None:
        scenario = ctx.scenario if ctx else None
        self._settings = run_settings(scenario) if scenario is not None else None
        self._kept: list[Envelope[Event]] = []
        self._end = 0

    @classmethod
    def with_settings(cls, settings: AuditSettings) -> Credit:
        """The invariant under ``settings`` rather than a run's (a generated stream's own:
        ``agents.testing.streams.AUDIT``)."""
        out = cls()
        out._settings = settings
        return out

    def check_many(self, envs: Sequence[Envelope[Event]]) -> None:
        self._kept += [env for env in envs if type(env.event) in _READ]
        if envs:
            self._end = envs[-1].seq + 1

    def finish(self, completed: bool) -> None:
        """Re-derive everything kept; raise at the first recorded event that differs."""
        if self._settings is None:  # no run, no settings: nothing to re-derive under
            raise InvariantViolated(
                self.name, 0, "no run settings to re-derive under (Credit.with_settings)"
            )
        try:
            inputs = gather_chunks([self._kept], self._end)
            audit = audit_credit(inputs, self._settings, self._settings, unscored=True)
        except GroupNotDerived as exc:  # the log's group contradicts itself: at its seq
            raise InvariantViolated(self.name, exc.seq, f"cannot re-derive: {exc}") from None
        except AuditQueryInvalid as exc:  # something else the audit cannot re-derive
            seq = self._kept[-1].seq if self._kept else 0
            raise InvariantViolated(self.name, seq, f"cannot re-derive: {exc}") from None
        bad = [c for c in audit.checks if c.first_mismatch is not None]
        if not bad and audit.unscored:  # the method's code fails now: no finding about the log
            seq, why = audit.unscored[0]
            more = len(audit.unscored) - 1
            others = f" and {more} more group{'s' * (more != 1)}" if more else ""
            many = len(inputs.groups) > len(audit.unscored)
            rest = "; every other group re-derives as recorded" if many else ""
            raise InvariantUncheckable(
                self.name,
                f"the run's method fails on its group at seq {seq}{others} ({why}); "
                f"{'those are' if more else 'it is'} taken as recorded{rest}",
            )
        if not bad:
            return
        check = min(bad, key=lambda c: c.first_mismatch.seq if c.first_mismatch else 0)
        m = check.first_mismatch
        assert m is not None
        fields = ", ".join(m.fields) or "the whole event"
        raise InvariantViolated(
            self.name,
            m.seq,
            f"{check.kind} does not re-derive ({fields}): recorded {m.recorded}, "
            f"re-derived {m.derived}",
        )
