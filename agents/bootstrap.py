"""Bootstrap intervals of a mean (pure: numbers and a seed in, numbers out).

Percentile bootstrap: resample the values with replacement ``resamples`` times, take each
resample's mean, and report the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of those
means. :func:`paired_difference` resamples pairs, for two measurements of the same episodes (the
same tasks and seeds played with two banks), which is tighter than comparing two intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean and its bootstrap interval.

    Attributes:
        mean: the mean of the values.
        low, high: the interval's bounds (both ``mean`` for a single value).
        n: how many values.
        level: the interval's coverage (0.95: a 95% interval).
    """

    mean: float
    low: float
    high: float
    n: int
    level: float = LEVEL

    def above(self, other: Interval) -> bool:
        """Whether this interval lies entirely above ``other`` (no overlap)."""
        return self.low > other.high


def mean_interval(
    values: Sequence[float], *, seed: int, resamples: int = RESAMPLES, level: float = LEVEL
) -> Interval:
    """The mean of ``values`` with its percentile bootstrap interval.

    Raises:
        ValueError: no values, ``resamples < 1`` or ``level`` outside (0, 1).
    """
    x = _check(values, resamples, level)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)  # (resamples,)
    return _interval(float(x.mean()), means, len(x), level)


def paired_difference(
    a: Sequence[float],
    b: Sequence[float],
    *,
    seed: int,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
) -> Interval:
    """The mean of ``a[i] - b[i]`` with its percentile bootstrap interval (pairs resampled).

    Raises:
        ValueError: ``a`` and ``b`` differ in length, are empty, or the settings are invalid.
    """
    if len(a) != len(b):
        raise ValueError(f"paired values differ in length: {len(a)} and {len(b)}")
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return mean_interval(diff.tolist(), seed=seed, resamples=resamples, level=level)


def _check(values: Sequence[float], resamples: int, level: float) -> np.ndarray:
    if len(values) == 0:
        raise ValueError("no values to bootstrap")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return np.asarray(values, dtype=np.float64)


def _interval(mean: float, means: np.ndarray, n: int, level: float) -> Interval:
    low, high = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return Interval(mean=mean, low=float(low), high=float(high), n=n, level=level)
