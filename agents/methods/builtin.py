"""coevo's own methods behind :class:`agents.methods.base.Method`: GRPO, EMPO2 and Complementary
RL. Each is a small object of pure hooks over its settings; the maths they call lives beside
them (:mod:`agents.methods.advantages`, :mod:`agents.methods.empo2`).

A method is built as ``Method(grpo, settings)``: ``grpo`` the scenario's ``[grpo]`` section,
``settings`` its own section decoded into its ``Settings`` type (None for a method without one).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from agents.events.episodes import EpisodeAssigned
from agents.events.extractor import MergeDue
from agents.events.memory import slot_of
from agents.events.policy import GradientRequested
from agents.methods.advantages import group_advantages, subgroup_advantages, subgroup_weights
from agents.methods.base import ADV_EPS, RunResources, Scored, mode_of
from agents.methods.empo2 import intrinsic_reward, rollout_of
from agents.methods.settings import ComplementaryConfig, Empo2Config, GrpoConfig
from engine.actor import ActorSpec
from engine.events import Event
from engine.world import Task


def grpo_rule(grpo: GrpoConfig) -> str:
    """GRPO's advantage formula's name, as recorded in ``AdvantagesComputed.rule``."""
    return f"grpo-{'std' if grpo.std_norm else 'mean'}-{grpo.reward}"


def complementary_rule(grpo: GrpoConfig, c: ComplementaryConfig) -> str:
    """Complementary RL's advantage formula's name (``subgroup-mean-weighted-score`` with the
    method's own settings; ``group-...`` and ``-flat-`` name the ablations)."""
    split = "subgroup" if c.subgroups else "group"
    weights = "weighted" if c.subgroup_weights else "flat"
    return f"{split}-{'std' if c.subgroup_std else 'mean'}-{weights}-{grpo.reward}"


def rule_name(grpo: GrpoConfig, comp: ComplementaryConfig | None = None) -> str:
    """The advantage formula's name, as recorded in :class:`AdvantagesComputed`."""
    return complementary_rule(grpo, comp) if comp is not None else grpo_rule(grpo)


class Grpo:
    """Outcome-only GRPO: every episode plain, group advantages, no memory."""

    Settings = None
    name = "grpo"
    warmup = 0
    memory_eval: str | None = None
    adapts = False
    records_rollouts = False
    base_models: tuple[str, ...] = ()

    def __init__(self, grpo: GrpoConfig, settings: None = None) -> None:
        self._grpo = grpo

    def rollout(self, run_seed: int, step: int, index: int, member: int) -> str:
        return "plain"

    def shape(self, job: EpisodeAssigned, task: Task) -> EpisodeAssigned:
        return job

    def score(
        self, outcomes: Sequence[float], rollouts: Sequence[str], similar: Sequence[Sequence[int]]
    ) -> Scored:
        adv = (
            group_advantages(outcomes, std_norm=self._grpo.std_norm, eps=ADV_EPS)
            if outcomes
            else []
        )
        return Scored(tuple(outcomes), tuple(adv), grpo_rule(self._grpo))

    def step_events(self, step: int) -> Sequence[Event]:
        return ()

    def loss(self, req: GradientRequested) -> GradientRequested:
        return req

    def actors(self, run: RunResources) -> Sequence[ActorSpec]:
        return ()


class Empo2(Grpo):
    """EMPO2: rollout modes drawn per update (or episode), a reflection on every training
    episode, the novelty bonus on tip-mode episodes, optional low-probability masking."""

    Settings = Empo2Config
    name = "empo2"
    adapts = True
    records_rollouts = True

    def __init__(self, grpo: GrpoConfig, settings: Empo2Config) -> None:
        super().__init__(grpo)
        self._e = settings

    def rollout(self, run_seed: int, step: int, index: int, member: int) -> str:
        e = self._e
        return rollout_of(run_seed, e.draw, step if e.draw == "update" else index, e.p, e.q)

    def shape(self, job: EpisodeAssigned, task: Task) -> EpisodeAssigned:
        slot = slot_of("train", task.family) if self._e.memory == "family" else job.slot
        return msgspec.structs.replace(job, reflect=True, slot=slot)

    def score(
        self, outcomes: Sequence[float], rollouts: Sequence[str], similar: Sequence[Sequence[int]]
    ) -> Scored:
        e = self._e
        intrinsic = [
            intrinsic_reward(s, cap=e.top_k) if e.novelty and mode_of(r).memory != "none" else 0.0
            for r, s in zip(rollouts, similar, strict=True)
        ]
        coef = e.novelty_coef if e.novelty else 0.0
        rewards = [o + coef * x for o, x in zip(outcomes, intrinsic, strict=True)]
        adv = (
            group_advantages(rewards, std_norm=self._grpo.std_norm, eps=ADV_EPS) if rewards else []
        )
        recorded = e.novelty
        return Scored(
            tuple(rewards),
            tuple(adv),
            grpo_rule(self._grpo),
            outcomes=tuple(outcomes) if recorded else (),
            intrinsic=tuple(intrinsic) if recorded else (),
            intrinsic_coef=coef,
        )

    def loss(self, req: GradientRequested) -> GradientRequested:
        if not self._e.low_prob_mask:
            return req
        return msgspec.structs.replace(req, low_prob_delta=self._e.low_prob_delta)

    def actors(self, run: RunResources) -> Sequence[ActorSpec]:
        from agents.methods.actors import empo2_actors  # the memory's imports: when run

        return empo2_actors(self._e)


class Complementary(Grpo):
    """Complementary RL: each group split into a guided subgroup (one bank entry each; half
    the group by default, ``guided_fraction``) and a free one, weighted subgroup advantages,
    every training episode sent to the extractor, warm-up steps that train nothing, a merge
    every ``merge_every`` steps, and an evaluation round with the bank."""

    Settings = ComplementaryConfig
    name = "complementary"
    records_rollouts = True
    base_models = ("extractor",)

    def __init__(self, grpo: GrpoConfig, settings: ComplementaryConfig) -> None:
        super().__init__(grpo)
        self._c = settings
        self.warmup = settings.warmup
        self.memory_eval: str | None = settings.guided_rollout
        self._guided = settings.guided_count(grpo.group_size)

    def rollout(self, run_seed: int, step: int, index: int, member: int) -> str:
        guided = step >= self.warmup and member < self._guided
        return self._c.guided_rollout if guided else "plain"

    def shape(self, job: EpisodeAssigned, task: Task) -> EpisodeAssigned:
        return msgspec.structs.replace(job, extract=True)

    def score(
        self, outcomes: Sequence[float], rollouts: Sequence[str], similar: Sequence[Sequence[int]]
    ) -> Scored:
        c = self._c
        rule = complementary_rule(self._grpo, c)
        if not outcomes:
            return Scored((), (), rule)
        guided = [mode_of(r).guided for r in rollouts]
        if c.subgroups:
            adv = subgroup_advantages(outcomes, guided, std_norm=c.subgroup_std, eps=ADV_EPS)
        else:
            adv = group_advantages(outcomes, std_norm=c.subgroup_std, eps=ADV_EPS)
        if c.subgroup_weights:
            adv = [a * w for a, w in zip(adv, subgroup_weights(guided), strict=True)]
        return Scored(tuple(outcomes), tuple(adv), rule)

    def step_events(self, step: int) -> Sequence[Event]:
        return (MergeDue(step=step),) if (step + 1) % self._c.merge_every == 0 else ()

    def actors(self, run: RunResources) -> Sequence[ActorSpec]:
        from agents.methods.actors import complementary_actors  # torch: only when run

        return complementary_actors(self._c, run)
