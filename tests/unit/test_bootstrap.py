"""Bootstrap intervals (:mod:`agents.bootstrap`): against numbers worked out by hand and the
normal approximation, reproducible from the seed, paired resampling."""

from __future__ import annotations

import math

import pytest

from agents.bootstrap import Interval, mean_interval, paired_difference


def test_a_constant_has_a_zero_width_interval() -> None:
    assert mean_interval([1.0] * 20, seed=0) == Interval(1.0, 1.0, 1.0, 20)


def test_the_interval_of_a_success_rate_is_close_to_the_normal_one() -> None:
    values = [1.0] * 90 + [0.0] * 210  # p = 0.3 over 300 episodes
    got = mean_interval(values, seed=1, resamples=4000)
    half = 1.96 * math.sqrt(0.3 * 0.7 / 300)  # 0.052
    assert got.mean == pytest.approx(0.3)
    assert got.low == pytest.approx(0.3 - half, abs=0.01)
    assert got.high == pytest.approx(0.3 + half, abs=0.01)


def test_the_same_seed_gives_the_same_interval_and_another_seed_another() -> None:
    values = [(i * 7919 % 101) / 101 for i in range(50)]
    assert mean_interval(values, seed=5) == mean_interval(values, seed=5)
    assert mean_interval(values, seed=5) != mean_interval(values, seed=6)


def test_paired_resampling_sees_a_small_consistent_gain_two_intervals_do_not() -> None:
    base = [float(i % 2) for i in range(200)]  # 0.5
    better = [1.0 if i % 20 == 0 else b for i, b in enumerate(base)]  # +0.05 on the same tasks
    a, b = mean_interval(better, seed=1), mean_interval(base, seed=1)
    assert not a.above(b)  # the two intervals overlap ...
    diff = paired_difference(better, base, seed=1)
    assert diff.mean == pytest.approx(0.05) and diff.low > 0  # ... the paired one excludes 0


def test_above_means_no_overlap() -> None:
    assert Interval(0.5, 0.41, 0.6, 10).above(Interval(0.3, 0.2, 0.4, 10))
    assert not Interval(0.5, 0.4, 0.6, 10).above(Interval(0.3, 0.2, 0.4, 10))


@pytest.mark.parametrize(
    ("values", "kwargs", "message"),
    [
        ([], {}, "no values"),
        ([1.0], {"resamples": 0}, "resamples must be >= 1"),
        ([1.0], {"level": 1.0}, "level must be in"),
    ],
)
def test_bad_arguments_are_refused(values: list[float], kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mean_interval(values, seed=0, **kwargs)
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([1.0], [1.0, 0.0], seed=0)
