"""Means with 95% bootstrap intervals, for results over seeds and episodes.

A learning claim here is a mean over several seeds' runs, each measured on many episodes. Both
vary, so the interval resamples both (a hierarchical bootstrap): draw the seeds with
replacement, then each drawn seed's episodes with replacement, and take the mean of all drawn
episodes. With one seed it is the plain percentile bootstrap over episodes. Ratios of two
methods' means (``EMPO2 / GRPO``) resample each side independently;
:func:`paired_mean` (and :func:`paired_difference`, of one seed) resamples pairs, for two
measurements of the same episodes (the same tasks and seeds played with two banks), which is
tighter than comparing two intervals.

Pure: the resampling is seeded, so the same numbers give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

Groups = Sequence[Sequence[float]]
"""Per-seed values (one list per seed: an episode's success as 0/1, or a score)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """A point estimate and its bootstrap interval.

    Attributes:
        value: the estimate on the data as observed (the mean of all values, or a ratio).
        low, high: the interval's bounds (percentiles of the bootstrap distribution).
        seeds: groups measured; episodes: values measured.
    """

    value: float
    low: float
    high: float
    seeds: int
    episodes: int

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"

    def above(self, other: Interval) -> bool:
        """Whether this interval lies entirely above ``other`` (no overlap)."""
        return self.low > other.high


ROUNDS = 4000
"""Bootstrap resamples per interval."""


def proportion_interval(rate: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a success rate measured on ``n`` episodes (one run's
    block or round: no seeds to resample), which stays inside [0, 1] at 0% and 100%.

    Raises:
        ValueError: ``n`` is not positive or ``rate`` is outside [0, 1].
    """
    if n < 1 or not 0.0 <= rate <= 1.0:
        raise ValueError(f"a rate in [0, 1] over n >= 1 episodes, got {rate} over {n}")
    denom = 1 + z * z / n
    centre = (rate + z * z / (2 * n)) / denom
    half = z * np.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if rate == 0 else max(0.0, float(centre - half))  # (rounding: 3e-17 for 0)
    return low, 1.0 if rate == 1 else min(1.0, float(centre + half))


def _check(groups: Groups) -> list[np.ndarray]:
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    if not arrays or any(a.size == 0 for a in arrays):
        raise ValueError("every group needs at least one value, and there must be a group")
    if not all(np.isfinite(a).all() for a in arrays):
        raise ValueError("values must be finite")
    return arrays


def _resampled_means(arrays: list[np.ndarray], rounds: int, rng: np.random.Generator) -> np.ndarray:
    """``rounds`` hierarchical bootstrap means: (rounds,)."""
    k = len(arrays)
    picks = rng.integers(0, k, size=(rounds, k)) if k > 1 else np.zeros((rounds, 1), dtype=int)
    totals = np.zeros(rounds)
    counts = np.zeros(rounds)
    for g, values in enumerate(arrays):
        times = (picks == g).sum(axis=1)  # (rounds,) how often seed g was drawn
        for r in np.nonzero(times)[0]:
            draws = rng.integers(0, values.size, size=(times[r], values.size))
            totals[r] += values[draws].sum()
            counts[r] += draws.size
    return totals / counts


def _all_equal_successes(arrays: list[np.ndarray]) -> bool:
    """Whether ``arrays`` (a side's groups) hold successes all equal: all 0 or all 1."""
    pooled = np.concatenate(arrays)
    return bool(pooled.min() == pooled.max() and pooled[0] in (0.0, 1.0))


def _z(level: float) -> float:
    """The standard normal quantile of a two-sided interval at ``level`` (1.96 at 0.95)."""
    return NormalDist().inv_cdf(1 - (1 - level) / 2)


def _check_settings(rounds: int, level: float) -> None:
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")


def success_rate(outcomes: Sequence[int | bool]) -> Interval:
    """The success rate of ``outcomes`` (one per episode, of one run) with its 95% Wilson
    interval (:func:`proportion_interval`): a percentile bootstrap of 0 of 20 is [0, 0], so an
    interval compared with it would claim a difference on no evidence.

    Raises:
        ValueError: no outcome.
    """
    if not outcomes:
        raise ValueError("a success rate needs at least one episode")
    rate = sum(map(int, outcomes)) / len(outcomes)
    low, high = proportion_interval(rate, len(outcomes))
    return Interval(rate, low, high, 1, len(outcomes))


def bootstrap_mean(
    groups: Groups,
    *,
    rounds: int = ROUNDS,
    level: float = 0.95,
    seed: int = 0,
    successes: bool = True,
) -> Interval:
    """The mean of every value in ``groups`` and its hierarchical bootstrap interval.

    Successes (0/1 values) that are all equal, every episode failed or every one succeeded,
    take the Wilson interval of all of them pooled (:func:`proportion_interval`) instead: the
    resamples of such data are all the same, and a percentile bootstrap of 0 of 20 is
    [0, 0], an interval that would claim a difference from any other on no evidence.
    ``successes=False``: values that are not successes (differences of pairs: all 0 is no
    proportion), always the bootstrap.

    Raises:
        ValueError: no group, an empty group, a non-finite value, ``rounds < 1`` or ``level``
            outside (0, 1).
    """
    arrays = _check(groups)
    _check_settings(rounds, level)
    pooled = np.concatenate(arrays)
    if successes and _all_equal_successes(arrays):
        low, high = proportion_interval(float(pooled[0]), pooled.size, _z(level))
        return Interval(float(pooled[0]), low, high, len(arrays), pooled.size)
    rng = np.random.default_rng(seed)
    means = _resampled_means(arrays, rounds, rng)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(pooled.mean()), float(low), float(high), len(arrays), pooled.size)


def bootstrap_ratio(
    top: Groups, bottom: Groups, *, rounds: int = ROUNDS, level: float = 0.95, seed: int = 0
) -> Interval:
    """``mean(top) / mean(bottom)`` and its bootstrap interval (each side resampled on its
    own); ``episodes`` counts both sides. A bootstrap round whose bottom mean is 0 gives an
    infinite ratio, which the percentiles keep (an unbounded interval), unless its top mean
    is 0 too: 0/0 says nothing of the ratio, and such a round is left out (it was counted
    infinite, an upper bound of "inf" from rounds with no success on either side).
    Successes on a side that are all equal (every episode failed, or every one succeeded)
    have resamples that are all the same: the ratio then takes the quotients of the two
    sides' own intervals (:func:`bootstrap_mean`, Wilson's for such a side), ``[low(top) /
    high(bottom), high(top) / low(bottom)]``, wider than a 95% interval rather than the
    [0, 0] a top of no success gave. For measures that are never negative (success rates,
    counts): a bottom mean that crosses 0 makes the ratio's percentiles meaningless (a
    negative bottom gave the interval [inf, inf] around -1).

    Raises:
        ValueError: as :func:`bootstrap_mean`, a negative value, or ``bottom``'s mean is 0.
    """
    a, b = _check(top), _check(bottom)
    _check_settings(rounds, level)
    if any((x < 0).any() for x in (*a, *b)):
        raise ValueError("a ratio of means needs values >= 0 (success rates, counts)")
    base = float(np.concatenate(b).mean())
    if base == 0:
        raise ValueError("the bottom mean is 0: the ratio is undefined")
    value = float(np.concatenate(a).mean()) / base
    size = sum(x.size for x in a) + sum(x.size for x in b)
    if any(_all_equal_successes(x) for x in (a, b)):
        t = bootstrap_mean(top, rounds=rounds, level=level, seed=seed)
        d = bootstrap_mean(bottom, rounds=rounds, level=level, seed=seed + 1)
        high = t.high / d.low if d.low > 0 else math.inf
        return Interval(value, t.low / d.high, high, len(a), size)
    rng = np.random.default_rng(seed)
    num = _resampled_means(a, rounds, rng)
    den = _resampled_means(b, rounds, rng)
    defined = (den > 0) | (num > 0)  # (rounds,) not 0/0
    num, den = num[defined], den[defined]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(den > 0, num / np.where(den > 0, den, 1), np.inf)
    tail = (1 - level) / 2 * 100
    with np.errstate(invalid="ignore"):  # between two infinite ratios: inf - inf
        bounds = np.percentile(ratios, [tail, 100 - tail])
    low, high = np.where(np.isnan(bounds), np.inf, bounds)
    return Interval(value, float(low), float(high), len(a), size)


def paired_difference(
    a: Sequence[float],
    b: Sequence[float],
    *,
    rounds: int = ROUNDS,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """The mean of ``a[i] - b[i]`` and its bootstrap interval (the pairs resampled), by
    :func:`paired_mean` (as differences of successes when every value is 0 or 1).

    Raises:
        ValueError: ``a`` and ``b`` differ in length, or as :func:`bootstrap_mean`.
    """
    if len(a) != len(b):
        raise ValueError(f"paired values differ in length: {len(a)} and {len(b)}")
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    successes = all(np.isin(v, (0.0, 1.0)).all() for v in (x, y))
    return paired_mean(
        [(x - y).tolist()], successes=successes, rounds=rounds, level=level, seed=seed
    )


def paired_mean(
    diffs: Groups,
    *,
    successes: bool = True,
    rounds: int = ROUNDS,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """The mean of paired differences (``a - b`` of one episode measured two ways; one list
    per seed) and its hierarchical bootstrap interval (seeds, then pairs, resampled).

    ``successes``: differences of successes, each -1, 0 or +1. Where no pair went one of the
    two ways (no win for ``a``, or none for ``b``), the resamples never see that way, and the
    percentile bootstrap put a bound at exactly 0 (twelve agreeing pairs: [+0.000, +0.000], a
    certainty on no evidence; eleven and one win: [0.000, 0.250], "never worse"). Such pairs
    take the widest of the bootstrap interval and the difference of the two kinds of
    disagreeing pairs' Wilson intervals (:func:`proportion_interval`), pooled.
    ``successes=False``: differences of scores, always the bootstrap.

    Raises:
        ValueError: as :func:`bootstrap_mean`, or (``successes``) a value not -1, 0 or +1.
    """
    arrays = _check(diffs)
    _check_settings(rounds, level)
    pooled = np.concatenate(arrays)
    if successes and not np.isin(pooled, (-1.0, 0.0, 1.0)).all():
        raise ValueError("differences of successes are -1, 0 or +1")
    boot = bootstrap_mean(diffs, rounds=rounds, level=level, seed=seed, successes=False)
    won, lost = int((pooled > 0).sum()), int((pooled < 0).sum())
    if not successes or (won and lost):
        return boot
    (won_low, won_high), (lost_low, lost_high) = (
        proportion_interval(k / pooled.size, pooled.size, _z(level)) for k in (won, lost)
    )
    low, high = min(boot.low, won_low - lost_high), max(boot.high, won_high - lost_low)
    return Interval(boot.value, low, high, len(arrays), pooled.size)
