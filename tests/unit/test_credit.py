"""Credit to extractor calls, count-aware reweighting and diversified retrieval
(agents/methods/credit.py) against hand-computed values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.methods.credit import (
    call_rewards,
    diversified_scores,
    episode_credit,
    extractor_advantages,
    pick,
    reweight,
)

# ---------------------------------------------------------------------------------------------
# credit and rewards


def test_episode_credit() -> None:
    assert (episode_credit(True), episode_credit(False)) == (1.0, -1.0)


def test_call_rewards_are_per_call_means() -> None:
    credits = [("a", 1.0), ("b", -1.0), ("a", -1.0), ("a", 1.0), ("c", 1.0)]
    assert call_rewards(credits) == {"a": 1 / 3, "b": -1.0, "c": 1.0}
    assert list(call_rewards(credits)) == ["a", "b", "c"]  # order of first credit
    assert call_rewards([]) == {}


def test_call_rewards_accumulate_across_steps() -> None:
    step1 = [("a", 1.0), ("b", -1.0)]
    step2 = [("a", -1.0), ("a", -1.0)]
    assert call_rewards(step1) == {"a": 1.0, "b": -1.0}
    assert call_rewards(step1 + step2) == {"a": -1 / 3, "b": -1.0}


def test_call_rewards_reject_non_finite_credit() -> None:
    with pytest.raises(ValueError, match="credit of call 'a' must be finite, got nan"):
        call_rewards([("a", 1.0), ("a", math.nan)])


streams = st.lists(
    st.tuples(
        st.sampled_from(["m1", "m2", "m3", "m4"]),
        st.one_of(st.sampled_from([1.0, -1.0]), st.floats(-1.0, 1.0)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(stream=streams, data=st.data())
def test_call_rewards_is_the_per_call_mean_whatever_the_order(
    stream: list[tuple[str, float]], data: st.DataObject
) -> None:
    rewards = call_rewards(stream)
    calls = {call for call, _ in stream}
    assert set(rewards) == calls
    for call in calls:
        mine = [value for c, value in stream if c == call]
        assert rewards[call] == pytest.approx(sum(mine) / len(mine), abs=1e-12)
    # any reordering, in particular any interleaving of different calls' credits: bit-exact
    shuffled = data.draw(st.permutations(stream))
    assert call_rewards(shuffled) == rewards


# ---------------------------------------------------------------------------------------------
# extractor advantages


def test_extractor_advantages_subtract_the_batch_mean() -> None:
    rewards = {"a": 1 / 3, "b": -1.0, "c": 1.0, "unused": 100.0}
    # mean over the batch (a, b, c) = (1/3 - 1 + 1) / 3 = 1/9
    adv = extractor_advantages(rewards, ["a", "b", "c"])
    assert adv == pytest.approx([2 / 9, -10 / 9, 8 / 9])
    assert sum(adv) == pytest.approx(0.0)
    assert extractor_advantages(rewards, ["c", "b"]) == [1.0, -1.0]


def test_extractor_advantages_of_equal_rewards_are_exact_zeros() -> None:
    assert extractor_advantages({"a": 0.1, "b": 0.1, "c": 0.1}, ["a", "b", "c"]) == [0.0] * 3
    assert extractor_advantages({"a": 0.7}, ["a"]) == [0.0]


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ([], "batch must not be empty"),
        (["a", "b", "a"], "batch holds call 'a' more than once"),
        (["a", "x", "y"], r"calls without a reward: \['x', 'y'\]"),
    ],
)
def test_extractor_advantages_errors(batch: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        extractor_advantages({"a": 1.0, "b": -1.0}, batch)


# ---------------------------------------------------------------------------------------------
# count-aware reweighting


def test_reweight_never_trained() -> None:
    assert reweight(0, None, 0) == 1.0
    assert reweight(0, None, 7, alpha=2.0) == 1.0


@pytest.mark.parametrize(
    ("count", "last", "step", "cooldown", "weight"),
    [
        (1, 4, 4, 1, 0.0),  # trained this very step
        (1, 4, 5, 1, 0.0),  # step - last = 1 <= cooldown 1: cooling down
        (1, 4, 6, 1, 2**-0.5),  # step - last = 2 > 1: (1 + 1) ** -0.5
        (3, 4, 9, 1, 0.5),  # (1 + 3) ** -0.5
        (1, 4, 4, 0, 0.0),  # cooldown 0 zeroes only the step it was trained at
        (1, 4, 5, 0, 2**-0.5),
        (2, 4, 6, 2, 0.0),
        (2, 4, 7, 2, 3**-0.5),
    ],
)
def test_reweight_cooldown_edges(
    count: int, last: int, step: int, cooldown: int, weight: float
) -> None:
    assert reweight(count, last, step, cooldown=cooldown) == pytest.approx(weight)


def test_reweight_alpha() -> None:
    assert reweight(3, 0, 10, alpha=1.0) == 0.25
    assert reweight(3, 0, 10, alpha=0.0) == 1.0
    assert reweight(8, 0, 10, alpha=0.5) == pytest.approx(1 / 3)
    # more training, less weight
    weights = [reweight(c, 0, 10) for c in range(1, 6)]
    assert weights == sorted(weights, reverse=True)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((-1, None, 0), {}, "trained_count must be >= 0, got -1"),
        ((0, None, 0), {"cooldown": -1}, "cooldown must be >= 0, got -1"),
        ((0, None, 0), {"alpha": -0.5}, "alpha must be finite and >= 0, got -0.5"),
        ((0, None, 0), {"alpha": math.inf}, "alpha must be finite and >= 0, got inf"),
        ((0, 3, 5), {}, "trained_count 0 disagrees with last_trained_step 3"),
        ((2, None, 5), {}, "trained_count 2 disagrees with last_trained_step None"),
        ((1, 6, 5), {}, "last_trained_step 6 is after step 5"),
    ],
)
def test_reweight_errors(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        reweight(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# diversified retrieval


def test_diversified_scores_by_hand() -> None:
    scores = diversified_scores([0, 1, 2], [0, 3, 0], [False, False, True])
    assert scores == pytest.approx([0.0, -1 - 0.4 * math.log(4), -3.0])
    assert diversified_scores([0, 1], [3, 0], [True, False], lam=1.0) == pytest.approx(
        [-math.log(4) - 1, -1.0]
    )


def test_pick_by_score_with_ties_to_the_better_rank() -> None:
    candidates = [10, 11, 12, 13]
    counts = {10: 20}
    # scores: 10: -0.4 log 21 = -1.218, 11: -1 - 1 (recent) = -2, 12: -2, 13: -3
    kwargs = {"retrieve_counts": counts, "recently_used": {11}}
    assert pick(candidates, 1, **kwargs) == [10]
    assert pick(candidates, 3, **kwargs) == [10, 11, 12]  # 11 and 12 tie: rank 1 first
    assert pick(candidates, 10, **kwargs) == [10, 11, 12, 13]
    # a recently used top match ties with the runner-up; the top match keeps it
    assert pick([7, 8], 1, retrieve_counts={}, recently_used={7}) == [7]


def test_pick_trades_rank_for_retrieval_count() -> None:
    # rank 0 with count c against rank 1 never retrieved: 0.4 log(1 + c) vs 1
    assert pick([7, 8], 1, retrieve_counts={7: 10}, recently_used=()) == [7]  # -0.959 > -1
    assert pick([7, 8], 1, retrieve_counts={7: 12}, recently_used=()) == [8]  # -1.026 < -1
    assert pick([7, 8], 1, retrieve_counts={7: 12}, recently_used=(), lam=0.0) == [7]


def test_pick_is_deterministic_under_equal_scores() -> None:
    candidates = [5, 3, 9, 1]
    for _ in range(3):
        assert pick(candidates, 4, retrieve_counts={}, recently_used=()) == candidates


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: diversified_scores([0, 1], [0], [False, False]), "got 2, 1 and 2"),
        (lambda: diversified_scores([-1], [0], [False]), r"ranks must be >= 0, got \[-1\]"),
        (lambda: diversified_scores([0], [-2], [False]), r"retrieve_counts must be >= 0"),
        (lambda: diversified_scores([0], [0], [False], lam=-1.0), "lam must be finite and >= 0"),
        (lambda: pick([1, 2], 0, retrieve_counts={}, recently_used=()), "k must be >= 1, got 0"),
        (
            lambda: pick([1, 2, 1], 1, retrieve_counts={}, recently_used=()),
            r"candidates must be distinct, got \[1, 2, 1\]",
        ),
        (lambda: pick([1], 1, retrieve_counts={1: -1}, recently_used=()), "retrieve_counts"),
    ],
)
def test_diversification_errors(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_pick_of_no_candidates_is_empty() -> None:
    assert pick([], 1, retrieve_counts={}, recently_used=()) == []
