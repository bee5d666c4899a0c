"""GRPO pieces against hand-computed values: advantages (agents/methods/advantages.py), clipped
loss,
KL, masking (agents/methods/grpo.py)."""

from __future__ import annotations

import math

import pytest
import torch

from agents.methods.advantages import (
    group_advantages,
    group_stats,
    subgroup_advantages,
    subgroup_weights,
)
from agents.methods.grpo import (
    AGGREGATIONS,
    aggregate,
    clipped_policy_loss,
    kl_penalty,
    low_prob_mask,
    masked_mean,
)

LOG = math.log


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def one_token(log_ratio: float, adv: float, **kwargs: object):
    """The loss of a single token with ``log(ratio) = log_ratio``, and logp's gradient."""
    logp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    out = clipped_policy_loss(
        logp, torch.zeros(1, 1, dtype=torch.float64), t([[adv]])[0], torch.ones(1, 1), **kwargs
    )
    out.loss.backward()
    assert logp.grad is not None
    return out, logp.grad.item()


# ---------------------------------------------------------------------------------------------
# group advantages


def test_group_stats_ddof1() -> None:
    # mean = 1/4; squared deviations 0.5625 + 3 * 0.0625 = 0.75; var = 0.75 / 3 = 0.25
    assert group_stats([1.0, 0.0, 0.0, 0.0]) == (0.25, 0.5)
    assert group_stats([3.0]) == (3.0, 0.0)


def test_group_advantages_std_and_mean_only() -> None:
    rewards = [1.0, 0.0, 0.0, 0.0]  # mean 0.25, std (ddof=1) 0.5
    assert group_advantages(rewards, eps=0.0) == [1.5, -0.5, -0.5, -0.5]
    with_eps = group_advantages(rewards)  # eps = 1e-6
    assert with_eps == pytest.approx([0.75 / 0.500001, -0.25 / 0.500001, *[-0.25 / 0.500001] * 2])
    assert group_advantages(rewards, std_norm=False) == [0.75, -0.25, -0.25, -0.25]


def test_group_advantages_ddof1_not_ddof0() -> None:
    # [2, 0]: mean 1, ddof=1 std = sqrt(2) (ddof=0 would give 1 and advantages of +-1)
    assert group_advantages([2.0, 0.0], eps=0.0) == pytest.approx([1 / math.sqrt(2), -1 / 2**0.5])


def test_zero_std_and_single_member_groups_give_exact_zeros() -> None:
    # 0.1 has no exact float: a naive mean leaves a residue that eps=1e-6 would blow up
    for std_norm in (True, False):
        assert group_advantages([0.1, 0.1, 0.1], std_norm=std_norm) == [0.0, 0.0, 0.0]
        assert group_advantages([7.5], std_norm=std_norm) == [0.0]


def test_group_advantages_are_order_independent_and_reproducible() -> None:
    rewards = [0.1, 0.7, 0.2, 0.3, 0.9, 0.0, 0.4, 0.6]
    adv = group_advantages(rewards)
    order = [5, 4, 3, 6, 0, 1, 7, 2]  # a plain left-to-right sum gives 3.2000000000000006 here
    permuted = group_advantages([rewards[i] for i in order])
    assert permuted == [adv[i] for i in order]  # bit-exact, not approx
    assert group_advantages(list(rewards)) == adv


@pytest.mark.parametrize(
    ("rewards", "eps", "message"),
    [
        ([], 1e-6, "rewards must not be empty"),
        ([1.0, math.nan], 1e-6, "rewards must be finite"),
        ([1.0, math.inf], 1e-6, "rewards must be finite"),
        ([1.0, 0.0], -1.0, "eps must be >= 0, got -1.0"),
    ],
)
def test_group_advantages_errors(rewards: list[float], eps: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        group_advantages(rewards, eps=eps)


# ---------------------------------------------------------------------------------------------
# subgroup advantages and weights


def test_subgroup_advantages_normalise_within_each_subgroup() -> None:
    rewards = [1.0, 0.0, 1.0, 1.0]
    guided = [True, False, True, False]
    # guided [1, 1]: zero std -> 0, 0; free [0, 1]: mean 0.5, std sqrt(0.5), A = -+0.5/sqrt(0.5)
    a = 0.5 / math.sqrt(0.5)
    assert subgroup_advantages(rewards, guided, eps=0.0) == pytest.approx([0.0, -a, 0.0, a])
    assert subgroup_advantages(rewards, guided, std_norm=False) == [0.0, -0.5, 0.0, 0.5]
    # one advantage across the whole group would differ: mean 0.75, so a guided 1 gets 0.25
    assert group_advantages(rewards, std_norm=False)[0] == 0.25


def test_subgroup_advantages_with_one_empty_subgroup_are_group_advantages() -> None:
    rewards = [1.0, 0.0, 0.5]
    assert subgroup_advantages(rewards, [True] * 3) == group_advantages(rewards)
    assert subgroup_advantages(rewards, [False] * 3) == group_advantages(rewards)


def test_subgroup_advantages_errors() -> None:
    with pytest.raises(ValueError, match="guided has 1 flags but there are 2 rewards"):
        subgroup_advantages([1.0, 0.0], [True])
    with pytest.raises(ValueError, match="rewards must not be empty"):
        subgroup_advantages([], [])


def test_subgroup_weights_give_each_subgroup_half() -> None:
    assert subgroup_weights([True, True, False, False]) == [1.0, 1.0, 1.0, 1.0]
    # n = 4: the guided one weighs 4 / (2 * 1) = 2, each free one 4 / (2 * 3) = 2/3;
    # each subgroup sums to 2 = n/2, the weights average 1
    weights = subgroup_weights([False, True, False, False])
    assert weights == pytest.approx([2 / 3, 2.0, 2 / 3, 2 / 3])
    assert sum(weights) == pytest.approx(4.0)
    assert subgroup_weights([True, True, True]) == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="guided must not be empty"):
        subgroup_weights([])


def test_subgroup_weight_scales_the_loss_of_its_samples() -> None:
    # the surrogate is positively homogeneous in A, so adv * w weights each sequence by w
    logp = torch.tensor([[LOG(1.5)], [LOG(0.5)]], dtype=torch.float64)
    old = torch.zeros(2, 1, dtype=torch.float64)
    mask = torch.ones(2, 1)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    w = torch.tensor(subgroup_weights([True, False, False, False])[:2], dtype=torch.float64)
    plain = clipped_policy_loss(logp, old, adv, mask, aggregation="token-mean").loss
    weighted = clipped_policy_loss(logp, old, adv * w, mask, aggregation="token-mean").loss
    # per token: -1.2 * 1 and +0.8 * 1 (both clipped); weights 2 and 2/3
    assert plain.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert weighted.item() == pytest.approx((-1.2 * 2 + 0.8 * 2 / 3) / 2)


# ---------------------------------------------------------------------------------------------
# aggregation


def ragged() -> tuple[torch.Tensor, torch.Tensor]:
    values = t([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    return values, mask


def test_aggregations_on_a_ragged_batch() -> None:
    values, mask = ragged()  # third row is all padding: not counted anywhere
    assert aggregate(values, mask, "token-mean").item() == (1 + 2 + 3 + 4) / 4
    assert aggregate(values, mask, "seq-mean-token-mean").item() == ((1 + 2 + 3) / 3 + 4) / 2
    assert aggregate(values, mask, "seq-mean-token-sum").item() == ((1 + 2 + 3) + 4) / 2


def test_masked_mean_ignores_nan_and_empty() -> None:
    values = t([[1.0, math.nan], [math.inf, 5.0]])
    mask = torch.tensor([[True, False], [False, False]])
    assert masked_mean(values, mask).item() == 1.0
    assert masked_mean(values, mask, dim=-1).tolist() == [1.0, 0.0]


def test_all_masked_batch_gives_zero_loss_with_zero_grad() -> None:
    values = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    for aggregation in AGGREGATIONS:
        out = aggregate(values, mask, aggregation)
        assert out.item() == 0.0
        (grad,) = torch.autograd.grad(out, values)
        assert grad.abs().sum().item() == 0.0


# ---------------------------------------------------------------------------------------------
# clipped policy loss


def test_first_epoch_ratio_one() -> None:
    logp = t([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    out = clipped_policy_loss(logp, logp.clone(), adv, mask)
    # ratio 1 everywhere, so per token -A: row means -1 and +2, mean over rows 0.5
    assert out.loss.item() == 0.5
    assert (out.clip_frac, out.dual_clip_frac, out.ratio_mean, out.approx_kl) == (0, 0, 1, 0)


def test_each_aggregation_of_the_loss_on_a_ragged_batch() -> None:
    logp = t([[-1.0, -1.0, -1.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    # ratio 1: token losses -1, -1, -1 | +2
    expected = {
        "token-mean": (-1 - 1 - 1 + 2) / 4,
        "seq-mean-token-mean": (-1 + 2) / 2,
        "seq-mean-token-sum": (-3 + 2) / 2,
    }
    for aggregation, value in expected.items():
        out = clipped_policy_loss(logp, logp, adv, mask, aggregation=aggregation)
        assert out.loss.item() == value


@pytest.mark.parametrize(
    ("ratio", "adv", "loss", "clip_frac"),
    [
        (1.5, 2.0, -2.4, 1.0),  # A > 0, high side: min(1.5 * 2, 1.2 * 2) = 2.4
        (0.5, -2.0, 1.6, 1.0),  # A < 0, low side: min(0.5 * -2, 0.8 * -2) = -1.6
        (0.5, 2.0, -1.0, 0.0),  # A > 0, ratio low: min(0.5 * 2, 0.8 * 2) = 1.0, unclipped
        (1.5, -2.0, 3.0, 0.0),  # A < 0, ratio high: min(1.5 * -2, 1.2 * -2) = -3.0, unclipped
        (1.5, 0.0, 0.0, 0.0),  # A = 0: nothing to clip
    ],
)
def test_clipping_by_side(ratio: float, adv: float, loss: float, clip_frac: float) -> None:
    out, grad = one_token(LOG(ratio), adv)
    assert out.loss.item() == pytest.approx(loss)
    assert out.clip_frac == clip_frac
    assert out.ratio_mean == pytest.approx(ratio)
    assert out.approx_kl == pytest.approx((ratio - 1) - LOG(ratio))
    # unclipped: d(-ratio * A)/dlogp = -ratio * A; clipped: no gradient
    assert grad == pytest.approx(0.0 if clip_frac else -ratio * adv)


def test_asymmetric_clip() -> None:
    out, _ = one_token(LOG(1.5), 1.0, clip_low=0.2, clip_high=0.3)
    assert out.loss.item() == pytest.approx(-1.3)
    out, _ = one_token(LOG(0.5), -1.0, clip_low=0.1, clip_high=0.3)
    assert out.loss.item() == pytest.approx(0.9)


def test_clip_frac_counts_unmasked_tokens_only() -> None:
    logp = t([[LOG(1.5), LOG(1.5), 5.0], [LOG(1.1), LOG(0.5), 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    out = clipped_policy_loss(logp, torch.zeros_like(logp), adv, mask)
    # clipped: both of row 0 (A > 0, 1.5 > 1.2) and the 0.5 of row 1 (A < 0, 0.5 < 0.8)
    assert out.clip_frac == 3 / 4
    assert out.ratio_mean == pytest.approx((1.5 + 1.5 + 1.1 + 0.5) / 4)


def test_dual_clip_bounds_a_negative_advantage_term() -> None:
    # A = -1, ratio 100: min(-100, 1.2 * -1) = -100 -> loss 100; with c = 10: max(-100, -10)
    out, grad = one_token(LOG(100.0), -1.0)
    assert out.loss.item() == pytest.approx(100.0)
    assert grad == pytest.approx(100.0)
    out, grad = one_token(LOG(100.0), -1.0, dual_clip=10.0)
    assert out.loss.item() == pytest.approx(10.0)
    assert (out.dual_clip_frac, out.clip_frac, grad) == (1.0, 0.0, 0.0)


def test_dual_clip_leaves_moderate_ratios_and_positive_advantages() -> None:
    out, _ = one_token(LOG(5.0), -1.0, dual_clip=10.0)  # 5 < c: min(-5, -1.2) = -5
    assert out.loss.item() == pytest.approx(5.0)
    assert out.dual_clip_frac == 0.0
    out, _ = one_token(LOG(100.0), 1.0, dual_clip=10.0)  # A > 0: ordinary clip at 1.2
    assert out.loss.item() == pytest.approx(-1.2)
    assert out.dual_clip_frac == 0.0


def test_padding_changes_nothing_including_gradients() -> None:
    old = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([0.7, -1.3], dtype=torch.float64)
    results = []
    for pad in (0.0, 1000.0, math.nan):
        logp = t([[-0.8, -2.5, pad], [-0.2, pad, -math.inf]]).requires_grad_()
        out = clipped_policy_loss(logp, old, adv, mask, dual_clip=3.0)
        kl = kl_penalty(logp, old, mask)
        (out.loss + kl).backward()
        assert logp.grad is not None
        results.append((out.loss.item(), kl.item(), out.approx_kl, logp.grad.tolist()))
    assert results[0] == results[1] == results[2]
    assert all(math.isfinite(v) for v in results[0][:3])
    grad = results[0][3]
    assert grad[0][2] == grad[1][1] == grad[1][2] == 0.0
    assert grad[0][0] != 0.0


def test_gradient_matches_hand_derivation_and_raises_logp_of_positive_advantage() -> None:
    logp = torch.full((2, 2), -1.0, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 2)
    loss = clipped_policy_loss(logp, logp.detach().clone(), adv, mask).loss
    loss.backward()
    assert logp.grad is not None
    # d/dlogp of -(1/2) sum_rows (1/2) sum_tokens ratio * A at ratio 1 = -A / 4
    assert logp.grad.tolist() == [[-0.25, -0.25], [0.25, 0.25]]
    with torch.no_grad():
        stepped = logp - 0.1 * logp.grad
    assert (stepped[0] > -1.0).all() and (stepped[1] < -1.0).all()


def test_old_logp_and_adv_get_no_gradient() -> None:
    logp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    adv = torch.ones(1, dtype=torch.float64, requires_grad=True)
    clipped_policy_loss(logp, old, adv, torch.ones(1, 2)).loss.backward()
    assert old.grad is None and adv.grad is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"old_logp": torch.zeros(2, 2)}, r"old_logp has shape \(2, 2\) but logp has shape"),
        ({"mask": torch.ones(2, 2)}, r"logp has shape \(2, 3\) but mask has shape \(2, 2\)"),
        ({"mask": torch.ones(2, 3, 1)}, r"mask must be \(B, T\), got shape \(2, 3, 1\)"),
        ({"mask": torch.full((2, 3), 0.5)}, "mask must hold only 0 and 1"),
        ({"adv": torch.zeros(2, 1)}, r"adv must have shape \(2,\), got \(2, 1\)"),
        ({"adv": torch.zeros(3)}, r"adv must have shape \(2,\), got \(3,\)"),
        ({"logp": torch.zeros(6), "old_logp": torch.zeros(6)}, r"logp must be \(B, T\)"),
        ({"clip_low": 0.0}, r"clip_low must be in \(0, 1\), got 0.0"),
        ({"clip_low": 1.0}, r"clip_low must be in \(0, 1\), got 1.0"),
        ({"clip_high": 0.0}, "clip_high must be > 0, got 0.0"),
        ({"clip_high": -0.2}, "clip_high must be > 0, got -0.2"),
        ({"dual_clip": 1.0}, "dual_clip must be > 1, got 1.0"),
        ({"aggregation": "seq-sum"}, "unknown aggregation 'seq-sum'"),
    ],
)
def test_clipped_policy_loss_errors(change: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "logp": torch.zeros(2, 3),
        "old_logp": torch.zeros(2, 3),
        "adv": torch.zeros(2),
        "mask": torch.ones(2, 3),
    }
    args.update(change)
    with pytest.raises(ValueError, match=message):
        clipped_policy_loss(**args)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# KL penalty


def test_kl_estimators_by_hand() -> None:
    logp = t([[LOG(0.5)]])
    ref = t([[LOG(0.25)]])
    mask = torch.ones(1, 1)
    # d = ref - logp = log(1/2)
    assert kl_penalty(logp, ref, mask, kind="k1").item() == pytest.approx(LOG(2))
    assert kl_penalty(logp, ref, mask, kind="k2").item() == pytest.approx(LOG(2) ** 2 / 2)
    assert kl_penalty(logp, ref, mask).item() == pytest.approx(0.5 + LOG(2) - 1)


def test_kl_is_zero_with_zero_gradient_at_the_reference() -> None:
    logp = t([[-1.0, -2.0]]).requires_grad_()
    kl = kl_penalty(logp, logp.detach().clone(), torch.ones(1, 2))
    kl.backward()
    assert logp.grad is not None
    assert kl.item() == 0.0
    assert logp.grad.tolist() == [[0.0, 0.0]]


def test_kl_aggregates_like_the_loss() -> None:
    ref = t([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    logp = t([[1.0, 2.0, 3.0], [4.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # k1 = logp - ref: the ragged values of test_aggregations_on_a_ragged_batch
    for aggregation in AGGREGATIONS:
        kl = kl_penalty(logp, ref, mask, kind="k1", aggregation=aggregation)
        assert kl.item() == aggregate(logp, mask.bool(), aggregation).item()


def test_kl_errors() -> None:
    with pytest.raises(ValueError, match="unknown KL kind 'k4'"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), kind="k4")
    with pytest.raises(ValueError, match=r"ref_logp has shape \(1, 3\) but mask has shape"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2))
    with pytest.raises(ValueError, match="unknown aggregation 'mean'"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), aggregation="mean")


# ---------------------------------------------------------------------------------------------
# low-probability masking


def test_low_prob_mask() -> None:
    old = t(
        [
            [-0.1, -6.0, -0.2],  # min -6.0 < -5: dropped
            [-0.1, -0.2, -9.0],  # -9.0 is padding: kept
            [-4.9, -5.0, -0.3],  # min -5.0 is not below -5: kept
            [-50.0, -50.0, -50.0],  # no response token: kept (contributes nothing)
        ]
    )
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [0, 0, 0]])
    keep = low_prob_mask(old, mask)
    assert keep.tolist() == [0.0, 1.0, 1.0, 1.0]
    assert keep.dtype == torch.float64
    assert low_prob_mask(old, mask, delta=-4.95).tolist() == [0.0, 1.0, 0.0, 1.0]


def test_low_prob_mask_drops_a_sequence_from_the_loss() -> None:
    old = t([[-6.0, -0.1], [-0.1, -0.1]])
    mask = torch.ones(2, 2)
    adv = torch.tensor([5.0, 1.0], dtype=torch.float64)
    kept = mask * low_prob_mask(old, mask)[:, None]
    out = clipped_policy_loss(old, old, adv, kept)
    assert out.loss.item() == -1.0  # only the second sequence, ratio 1, A = 1


def test_low_prob_mask_errors() -> None:
    with pytest.raises(ValueError, match=r"delta must be < 0, got 0\.0"):
        low_prob_mask(torch.zeros(1, 2), torch.ones(1, 2), delta=0.0)
    with pytest.raises(ValueError, match=r"old_logp has shape \(2, 2\) but mask has shape"):
        low_prob_mask(torch.zeros(2, 2), torch.ones(1, 2))


def test_group_stats_of_rewards_too_large_to_square() -> None:
    """A reward of 1e300 is finite (a world's past ``SCORE_LIMIT`` is refused at the boundary,
    not a caller's of this function): its square is not
    (OverflowError), so the statistics are computed scaled down; ordinary rewards give the
    same bits as before."""
    mean, std = group_stats([1e300, 0.0, 0.0, 0.0])
    assert mean == pytest.approx(0.25e300) and std == pytest.approx(0.5e300)
    assert group_stats([1.7e308, 1.7e308]) == (1.7e308, 0.0)
    assert group_stats([1.0, 0.0, 0.0, 0.0]) == (0.25, 0.5)


def test_group_advantages_of_rewards_whose_spread_passes_the_float_limit() -> None:
    """Rewards near 1.7e308 have a finite mean but an infinite std: one advantage was NaN
    (-inf / inf) and two different rewards both got 0 (x / inf); the advantages are now the
    same rewards normalised in their own scale, as (R - mean) / std would be."""
    assert group_advantages([1.7e308, -1.7e308, 1.7e308]) == pytest.approx(
        group_advantages([1.0, -1.0, 1.0])
    )
    assert group_advantages([1.7e308, -1.7e308]) == pytest.approx([2**-0.5, -(2**-0.5)])
    assert group_advantages([1.7e308, -1.7e308], std_norm=False) == [1.7e308, -1.7e308]
    with pytest.raises(ValueError, match="too far apart: R - mean overflows a float"):
        group_advantages([1.7e308, -1.7e308, -1.7e308], std_norm=False)


def test_a_non_finite_update_names_the_weights_when_the_model_s_log_probs_are_nan() -> None:
    """A model whose weights hold NaN made an update fail with "are the advantages finite?"
    while the advantages were: the message now says which of the two is at fault."""
    from agents.learning.update import UpdateNotFinite, refuse_non_finite

    nan, one = torch.tensor(float("nan")), torch.tensor(1.0)
    refuse_non_finite("policy", 0, one, one, torch.tensor([float("nan")]))  # finite: applied
    with pytest.raises(UpdateNotFinite, match=r"its weights hold NaN or inf \(a damaged"):
        refuse_non_finite("policy", 2, nan, nan, torch.tensor([-1.0, float("nan")]))
    with pytest.raises(UpdateNotFinite, match="are the advantages finite and of a sane size"):
        refuse_non_finite("policy", 2, nan, nan, torch.tensor([-1.0, -2.0]))
    with pytest.raises(UpdateNotFinite, match="are the advantages finite"):
        refuse_non_finite("extractor", 2, one, nan)
