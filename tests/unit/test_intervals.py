"""Bootstrap intervals (agents/report/intervals.py): seeded, they cover the truth at about their
level, widen with seed-to-seed spread, and refuse what has no mean."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agents.report.intervals import (
    Interval,
    bootstrap_mean,
    bootstrap_ratio,
    paired_difference,
    paired_mean,
    proportion_interval,
    success_rate,
)


def test_constant_values_have_a_point_interval() -> None:
    got = bootstrap_mean([[0.5] * 10, [0.5] * 5])
    assert (got.value, got.low, got.high, got.seeds, got.episodes) == (0.5, 0.5, 0.5, 2, 15)
    same = paired_difference([0.5] * 6, [0.5] * 6)  # scores' differences, all 0: no proportion
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0)


def test_paired_successes_that_all_agree_keep_an_interval_of_their_disagreements() -> None:
    """An outside tester: a probe's twelve pairs of episodes, each the same with either bank,
    read "paired difference +0.000 [+0.000, +0.000]", a certainty of no difference."""
    same = paired_difference([1.0, 0.0] * 6, [1.0, 0.0] * 6)
    high = proportion_interval(0.0, 12)[1]  # the share of pairs either side won: 0 of 12
    assert (same.value, same.low, same.high) == pytest.approx((0.0, -high, high))
    won = paired_difference([1.0] * 12, [0.0] * 12)  # every pair won by a
    assert won.value == 1.0 and won.high == 1.0
    assert won.low == pytest.approx(proportion_interval(1.0, 12)[0] - high) and won.low < 0.8
    mixed = paired_difference([1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0])  # not all the same
    assert mixed == bootstrap_mean([[1.0, 0.0, 0.0, -1.0]], successes=False)
    seeds = paired_mean([[0.0] * 10, [0.0] * 14])  # the results scripts': pairs of 2 seeds
    assert (seeds.value, seeds.seeds, seeds.episodes) == (0.0, 2, 24)
    assert seeds.high == pytest.approx(proportion_interval(0.0, 24)[1]) == -seeds.low
    with pytest.raises(ValueError, match="-1, 0 or"):
        paired_mean([[0.5, 0.5]])  # scores' differences: successes=False


def test_pairs_that_never_went_one_way_keep_that_way_in_their_interval() -> None:
    """An outside tester: one win among twelve pairs turned [-0.242, +0.242] into
    [0.000, 0.250] ("never worse"), and eleven wins and a tie had a higher lower bound than
    twelve wins: a bound at exactly 0 (or 1) wherever the resamples never saw one way."""
    one = paired_mean([[0.0] * 11 + [1.0]])
    won_low, won_high = proportion_interval(1 / 12, 12)
    assert (one.low, one.high) == pytest.approx(
        (won_low - proportion_interval(0.0, 12)[1], won_high)
    )
    assert one.low < 0 < one.value
    assert paired_mean([[1.0] * 11 + [0.0]]).low < paired_mean([[1.0] * 12]).low
    both = [[1.0, -1.0, 0.0, 0.0] * 3]  # both ways seen: the bootstrap, as before
    assert paired_mean(both) == bootstrap_mean(both, successes=False)
    ninety = paired_mean([[0.0] * 12], level=0.9)  # another level: its own z, still no point
    assert 0 < ninety.high < paired_mean([[0.0] * 12]).high


def test_all_failures_or_all_successes_take_the_pooled_wilson_interval() -> None:
    """An outside tester: a table's cell of 0 of 20 held-out episodes read 0.000 [0.000,
    0.000], an interval that lies below any other on no evidence."""
    for value in (0.0, 1.0):
        got = bootstrap_mean([[value] * 10, [value] * 10])
        assert (got.value, got.seeds, got.episodes) == (value, 2, 20)
        assert (got.low, got.high) == pytest.approx(proportion_interval(value, 20))
        assert got.high - got.low > 0.1


def test_the_same_data_and_seed_give_the_same_interval() -> None:
    data = [[0, 1, 1, 0, 1], [0, 0, 1]]
    assert bootstrap_mean(data) == bootstrap_mean(data)
    assert bootstrap_mean(data, seed=1) != bootstrap_mean(data, seed=2)


def test_intervals_cover_the_true_mean_at_about_their_level() -> None:
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(60):
        seeds = [rng.binomial(1, 0.3, size=300).tolist() for _ in range(5)]
        got = bootstrap_mean(seeds, rounds=1000)
        assert got.low <= got.value <= got.high
        hits += got.low <= 0.3 <= got.high
    assert hits >= 51  # 95% of 60 is 57; a bootstrap of 5 seeds is a little narrow


def test_spread_between_seeds_widens_the_interval() -> None:
    alike = [[0.0, 1.0] * 50 for _ in range(4)]
    apart = [[0.0] * 100, [1.0] * 100, [0.0] * 100, [1.0] * 100]
    narrow, wide = bootstrap_mean(alike), bootstrap_mean(apart)
    assert narrow.value == wide.value == 0.5
    assert wide.high - wide.low > 3 * (narrow.high - narrow.low)


def test_a_ratio_of_equal_sides_brackets_one_and_a_clear_gain_excludes_it() -> None:
    rng = np.random.default_rng(3)
    base = [rng.binomial(1, 0.3, size=300).tolist() for _ in range(5)]
    same = [rng.binomial(1, 0.3, size=300).tolist() for _ in range(5)]
    better = [rng.binomial(1, 0.6, size=300).tolist() for _ in range(5)]
    assert bootstrap_ratio(same, base).low < 1 < bootstrap_ratio(same, base).high
    gain = bootstrap_ratio(better, base)
    assert gain.low > 1.5 and gain.value == pytest.approx(np.mean(better) / np.mean(base))


@pytest.mark.parametrize("groups", [[], [[]], [[1.0], []], [[float("nan")]]])
def test_what_has_no_mean_is_refused(groups) -> None:
    with pytest.raises(ValueError):
        bootstrap_mean(groups)


def test_a_ratio_over_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="bottom mean is 0"):
        bootstrap_ratio([[1, 0]], [[0, 0]])
    # a negative bottom gave -1.0 [inf, inf]: an interval that excludes its own value
    with pytest.raises(ValueError, match="needs values >= 0"):
        bootstrap_ratio([[1.0, 1.0]], [[-1.0, -1.0]])


def test_a_bottom_that_often_resamples_to_zero_gives_an_infinite_upper_bound() -> None:
    got = bootstrap_ratio([[1.0, 1.0], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]])  # no warning
    assert got.value == 1.5 and 0 < got.low < 1.5 and got.high == math.inf


def test_a_ratio_with_a_side_of_equal_successes_takes_the_sides_own_intervals() -> None:
    """An outside tester: a top of no success in 10 had the ratio 0.000 [0.000, 0.000] (every
    resample 0), and a top of all successes a lower bound no resample could go below."""
    none = bootstrap_ratio([[0.0] * 10], [[1.0, 0.0] * 5])
    bottom = bootstrap_mean([[1.0, 0.0] * 5], seed=1)
    assert none.value == 0.0 and none.low == 0.0
    assert none.high == pytest.approx(proportion_interval(0.0, 10)[1] / bottom.low)
    every = bootstrap_ratio([[1.0] * 10], [[1.0, 0.0] * 5])
    assert every.value == 2.0 and every.high == pytest.approx(1.0 / bottom.low)
    assert every.low == pytest.approx(proportion_interval(1.0, 10)[0] / bottom.high)
    assert every.low < 1.0  # a top of 10 of 10 may be below a bottom of 5 of 10 by chance


def test_one_group_is_close_to_the_normal_interval_of_a_success_rate() -> None:
    got = bootstrap_mean([[1.0] * 90 + [0.0] * 210])  # p = 0.3 over 300 episodes
    half = 1.96 * math.sqrt(0.3 * 0.7 / 300)  # 0.052
    assert got.value == pytest.approx(0.3)
    assert got.low == pytest.approx(0.3 - half, abs=0.01)
    assert got.high == pytest.approx(0.3 + half, abs=0.01)


def test_paired_resampling_sees_a_small_consistent_gain_two_intervals_do_not() -> None:
    base = [float(i % 2) for i in range(200)]  # 0.5
    better = [1.0 if i % 20 == 0 else b for i, b in enumerate(base)]  # +0.05 on the same tasks
    assert not bootstrap_mean([better]).above(bootstrap_mean([base]))  # they overlap ...
    diff = paired_difference(better, base)
    assert diff.value == pytest.approx(0.05) and diff.low > 0  # ... the paired one excludes 0
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([1.0], [1.0, 0.0])


def test_above_means_no_overlap() -> None:
    assert Interval(0.5, 0.41, 0.6, 1, 10).above(Interval(0.3, 0.2, 0.4, 1, 10))
    assert not Interval(0.5, 0.4, 0.6, 1, 10).above(Interval(0.3, 0.2, 0.4, 1, 10))


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"rounds": 0}, "rounds"), ({"level": 1.0}, "level")]
)
def test_bad_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bootstrap_mean([[1.0]], **kwargs)


def test_a_success_rate_at_zero_keeps_an_interval_that_weak_evidence_does_not_clear() -> None:
    """The probe compared percentile bootstrap intervals: 0 of 40 is [0, 0], and 4 of 40 lay
    "entirely above" it, co-evolution "shown" on four successes."""
    none, four = success_rate([0] * 40), success_rate([1] * 4 + [0] * 36)
    assert none.value == 0.0 and none.low == 0.0 and none.high > 0.08
    assert not four.above(none)
    assert not bootstrap_mean([[1] * 4 + [0] * 36]).above(bootstrap_mean([[0] * 40]))  # nor now
    assert success_rate([1] * 40).above(none) and (four.seeds, four.episodes) == (1, 40)
    with pytest.raises(ValueError, match="at least one episode"):
        success_rate([])
