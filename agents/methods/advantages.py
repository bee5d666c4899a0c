"""Advantages as pure functions of outcome rewards: GRPO's group advantages and Complementary
RL's subgroup advantages and weights.

Plain Python floats (``math.fsum``, no torch), so every advantage in a log can be re-derived
exactly from the logged rewards, and importing this module costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def outcome(score: float, success: bool, reward: str) -> float:
    """An episode's outcome reward R: its final ``score``, or 1/0 for ``success``, as
    ``[grpo] reward`` says ("score" or "success")."""
    return score if reward == "score" else (1.0 if success else 0.0)


def group_stats(rewards: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1) of a group's rewards.

    The mean is ``math.fsum`` based, so the result does not depend on the order of ``rewards``.

    Args:
        rewards: the outcome rewards of one group.

    Returns:
        ``(mean, std)``; ``std`` is 0.0 for a group of one.

    Raises:
        ValueError: ``rewards`` is empty or holds a non-finite value.
    """
    if not rewards:
        raise ValueError("rewards must not be empty")
    if not all(math.isfinite(r) for r in rewards):
        raise ValueError(f"rewards must be finite, got {list(rewards)}")
    n = len(rewards)
    try:
        mean = math.fsum(rewards) / n
        if n == 1:
            return mean, 0.0
        return mean, math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (n - 1))
    except OverflowError:  # rewards past ~1e154 (a world's own scale): computed scaled down
        scale = max(abs(r) for r in rewards)
        scaled = [r / scale for r in rewards]
        mean_s = math.fsum(scaled) / n
        spread = math.sqrt(math.fsum((x - mean_s) ** 2 for x in scaled) / (n - 1))
        return mean_s * scale, spread * scale


def group_advantages(
    rewards: Sequence[float], *, std_norm: bool = True, eps: float = 1e-6
) -> list[float]:
    """GRPO advantages of one group: ``A_i = (R_i - mean) / (std + eps)``, std with ddof=1.

    A group whose rewards are all equal (a zero-std group, or a group of one) carries no signal
    and gets exactly 0.0 for every member, in both modes (no rounding residue from the mean).

    Args:
        rewards: the outcome rewards of one group, in sample order.
        std_norm: divide by ``std + eps``; if False the advantage is ``R_i - mean`` only.
        eps: added to the std before dividing.

    Returns:
        One advantage per reward, in the same order.

    Raises:
        ValueError: ``rewards`` is empty or non-finite, or ``eps`` is negative.
    """
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    mean, std = group_stats(rewards)
    if max(rewards) == min(rewards):
        return [0.0] * len(rewards)
    if std_norm and math.isinf(std):  # rewards near the float limit: normalised in their scale
        top = max(abs(r) for r in rewards)
        xs = [r / top for r in rewards]
        mean_x, std_x = group_stats(xs)
        return [(x - mean_x) / (std_x + eps / top) for x in xs]
    scale = std + eps if std_norm else 1.0
    out = [(r - mean) / scale for r in rewards]
    if not all(map(math.isfinite, out)):
        raise ValueError(f"rewards {list(rewards)} are too far apart: R - mean overflows a float")
    return out


def _check_guided(rewards: Sequence[float], guided: Sequence[bool]) -> None:
    if len(guided) != len(rewards):
        raise ValueError(f"guided has {len(guided)} flags but there are {len(rewards)} rewards")


def subgroup_advantages(
    rewards: Sequence[float],
    guided: Sequence[bool],
    *,
    std_norm: bool = True,
    eps: float = 1e-6,
) -> list[float]:
    """Complementary RL's advantages: :func:`group_advantages` within each subgroup separately.

    The experience-guided samples (``guided[i]`` true) are normalised against the guided
    subgroup's mean and std only, the free ones against the free subgroup's. An empty subgroup
    is simply absent (all guided gives the plain group advantages). The advantages are not
    weighted: the 1/2 weight of each subgroup is :func:`subgroup_weights`.

    Args:
        rewards: the outcome rewards of one group, in sample order.
        guided: one flag per reward, true for the experience-guided samples.
        std_norm: as in :func:`group_advantages` (Complementary RL's code runs mean-only).
        eps: as in :func:`group_advantages`.

    Returns:
        One advantage per reward, in the same order.

    Raises:
        ValueError: the lengths differ, or as :func:`group_advantages`.
    """
    _check_guided(rewards, guided)
    if not rewards:
        raise ValueError("rewards must not be empty")
    adv = [0.0] * len(rewards)
    for flag in (True, False):
        members = [i for i, g in enumerate(guided) if bool(g) is flag]
        if not members:
            continue
        sub = group_advantages([rewards[i] for i in members], std_norm=std_norm, eps=eps)
        for i, a in zip(members, sub, strict=True):
            adv[i] = a
    return adv


def subgroup_weights(guided: Sequence[bool]) -> list[float]:
    """Per-sample weights that give each subgroup half of its group's weight.

    Complementary RL's objective is ``J = 1/2 J_guided + 1/2 J_free``, each ``J_c`` a mean over
    its subgroup. Relative to the plain mean over the group's ``n`` samples that is the weight
    ``w_i = n / (2 n_c)`` for a sample of subgroup ``c`` of size ``n_c``: the weights average 1,
    a balanced split (K/2 + K/2) gives 1 everywhere, and a group with one empty subgroup gives
    1 everywhere (the other subgroup carries the whole group). The clipped surrogate is
    positively homogeneous in the advantage, so the caller applies the weights as ``adv * w``.

    Args:
        guided: one flag per sample of one group, true for the experience-guided samples.

    Returns:
        One weight per sample, in the same order.

    Raises:
        ValueError: ``guided`` is empty.
    """
    if not guided:
        raise ValueError("guided must not be empty")
    n = len(guided)
    n_guided = sum(1 for g in guided if g)
    if n_guided in (0, n):
        return [1.0] * n
    return [n / (2 * n_guided) if g else n / (2 * (n - n_guided)) for g in guided]
