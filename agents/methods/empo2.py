"""EMPO2's pure pieces: drawing rollout modes, the intrinsic novelty reward.

The loss side of EMPO2 lives with GRPO's (:func:`agents.methods.grpo.low_prob_mask`, the learner's
``Sample.distill``); the memory is :mod:`agents.memory.bank`; this module holds what the trainer
decides per batch or per episode, as functions of seeds and counts only.

Rollout modes (released code): with probability ``p`` a batch uses memory; given memory, with
probability ``q`` it is an off-policy ("distill") batch, otherwise on-policy with tips ("tips");
the rest is "plain" on-policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.seeds import derive_rng

ROLLOUTS = ("plain", "tips", "distill")


def draw_rollout(u_memory: float, u_offpolicy: float, p: float, q: float) -> str:
    """The rollout mode for two uniform draws in [0, 1).

    Args:
        u_memory: decides memory (``< p``) or plain.
        u_offpolicy: given memory, decides "distill" (``< q``) or "tips".
        p: probability of using memory.
        q: probability of off-policy distillation given memory.

    Raises:
        ValueError: ``p`` or ``q`` outside [0, 1].
    """
    if not (0.0 <= p <= 1.0 and 0.0 <= q <= 1.0):
        raise ValueError(f"p and q must be in [0, 1], got p={p}, q={q}")
    if u_memory >= p:
        return "plain"
    return "distill" if u_offpolicy < q else "tips"


def rollout_of(run_seed: int, draw: str, key: int, p: float, q: float) -> str:
    """The rollout mode of batch (update) or episode number ``key``: a pure function of the run
    seed, so it never depends on timing.

    Args:
        run_seed: the run's seed.
        draw: "update" (one mode per update, as the released code) or "episode".
        key: the update's number or the episode's index.
        p, q: see :func:`draw_rollout`.
    """
    rng = derive_rng(run_seed, "empo2-rollout", draw, key)
    u_memory = rng.random()
    u_offpolicy = rng.random()
    return draw_rollout(u_memory, u_offpolicy, p, q)


def intrinsic_reward(similar: Sequence[int], cap: int = 10) -> float:
    """EMPO2's novelty bonus of an episode: the mean over its turns of ``1 / (n + 1)``, where
    ``n`` is the number of stored tips similar to that turn's state (capped at ``cap``).

    A turn in a state memory has never seen earns 1; one with ``cap`` similar tips earns
    ``1 / (cap + 1)``. An episode with no retrieval (no turn) earns 0.

    Raises:
        ValueError: a negative count or ``cap < 0``.
    """
    if cap < 0 or any(n < 0 for n in similar):
        raise ValueError(f"counts and cap must be >= 0, got {list(similar)} and {cap}")
    if not similar:
        return 0.0
    return sum(1.0 / (min(n, cap) + 1) for n in similar) / len(similar)
