"""``versions``: the policy's and the extractor's versions form a chain.

Update ``n`` of a model is requested once, in order (``gradient_requested`` /
``extractor_gradient_requested`` with ``update`` 0, 1, 2, ...) and makes version ``n + 1``
(``policy_updated`` / ``extractor_updated``), starting from the digest version ``n`` ended at
(``parent_digest``, where recorded). Whatever names a version that answered (a sample, a tip,
an evaluation round, an extractor call) names one the log already holds: no model answers
with weights it has not been given. In a run whose rounds hold updates
(``eval_round_started.holds_updates``), a round ends at the version it names: no other
version played in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agents.events.extractor import ExtractorCalled, ExtractorGradientRequested, ExtractorUpdated
from agents.events.memory import TipProposed
from agents.events.policy import (
    ActionSampled,
    AdaptRoundFinished,
    EvalRoundFinished,
    EvalRoundStarted,
    GradientRequested,
    PolicyUpdated,
)
from engine.events import Envelope, Event
from engine.invariants import CheckContext, InvariantViolated, invariant


@dataclass
class _Chain:
    model: str
    version: int = 0
    digest: str = ""
    seq: int = -1  # seq of the newest update
    requested: int = 0  # update requests so far
    request_seq: int = -1


_USERS_OF_POLICY = (
    ActionSampled,
    TipProposed,
    EvalRoundStarted,
    EvalRoundFinished,
    AdaptRoundFinished,
)


_READ = frozenset(
    {
        *_USERS_OF_POLICY,
        ExtractorCalled,
        GradientRequested,
        ExtractorGradientRequested,
        PolicyUpdated,
        ExtractorUpdated,
    }
)


@invariant("versions")
class Versions:
    """Policy and extractor versions form a chain: update n is requested once and in order,
    makes version n + 1 from version n's digest, and nothing answers with a version the log
    does not hold yet."""

    name = "versions"

    def __init__(self, ctx: CheckContext | None = None) -> None:
        self._policy = _Chain("policy")
        self._extractor = _Chain("extractor")
        self._holds = False  # the run's evaluation rounds hold updates

    def check_many(self, envs: Sequence[Envelope[Event]]) -> None:
        for env in envs:
            ev = env.event
            kind = type(ev)
            if kind not in _READ:  # most events (turns): one set lookup
                continue
            if kind in _USERS_OF_POLICY:
                self._used(env.seq, self._policy, getattr(ev, "policy_version"))  # noqa: B009
                if isinstance(ev, EvalRoundStarted) and ev.holds_updates:
                    self._holds = True
                elif isinstance(ev, EvalRoundFinished | AdaptRoundFinished) and self._holds:
                    self._held(env.seq, ev)
            elif isinstance(ev, ExtractorCalled):
                self._used(env.seq, self._extractor, ev.extractor_version)
            elif isinstance(ev, GradientRequested):
                self._requested(env.seq, self._policy, ev.update)
            elif isinstance(ev, ExtractorGradientRequested):
                self._requested(env.seq, self._extractor, ev.update)
            elif isinstance(ev, PolicyUpdated):
                self._updated(env.seq, self._policy, ev.policy_version, ev.update, ev)
            elif isinstance(ev, ExtractorUpdated):
                self._updated(env.seq, self._extractor, ev.extractor_version, ev.update, ev)

    def _used(self, seq: int, chain: _Chain, version: int) -> None:
        if not 0 <= version <= chain.version:
            held = f"the newest is {chain.version}" + (
                f" (seq {chain.seq})" if chain.seq >= 0 else ""
            )
            raise InvariantViolated(
                self.name,
                seq,
                f"answered by {chain.model} version {version}; {held}",
                (chain.seq,) if chain.seq >= 0 else (),
            )

    def _held(self, seq: int, ev: EvalRoundFinished | AdaptRoundFinished) -> None:
        chain = self._policy
        if ev.policy_version != chain.version:
            raise InvariantViolated(
                self.name,
                seq,
                f"round {ev.round} of policy version {ev.policy_version} ended at version "
                f"{chain.version}: an update was published while it held them",
                (chain.seq,),
            )

    def _requested(self, seq: int, chain: _Chain, update: int) -> None:
        if update != chain.requested:
            raise InvariantViolated(
                self.name,
                seq,
                f"{chain.model} update {update} requested; the next is {chain.requested}",
                (chain.request_seq,) if chain.request_seq >= 0 else (),
            )
        chain.requested += 1
        chain.request_seq = seq

    def _updated(
        self,
        seq: int,
        chain: _Chain,
        version: int,
        update: int,
        ev: PolicyUpdated | ExtractorUpdated,
    ) -> None:
        before = (chain.seq,) if chain.seq >= 0 else ()
        if version != chain.version + 1 or update != version - 1:
            raise InvariantViolated(
                self.name,
                seq,
                f"{chain.model} version {version} from update {update}; the next is version "
                f"{chain.version + 1} from update {chain.version}",
                before,
            )
        if chain.digest and ev.parent_digest and ev.parent_digest != chain.digest:
            raise InvariantViolated(
                self.name,
                seq,
                f"{chain.model} version {version} starts from digest {ev.parent_digest[:12]}, "
                f"version {chain.version} ended at {chain.digest[:12]}",
                before,
            )
        chain.version, chain.digest, chain.seq = version, ev.digest, seq

    def finish(self, completed: bool) -> None:
        return None
