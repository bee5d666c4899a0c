"""The extractor's CISPO loss (agents/methods/cispo.py) and its gradient against hand-computed
values."""

from __future__ import annotations

import math

import pytest
import torch

from agents.methods.cispo import cispo_loss
from agents.methods.grpo import clipped_policy_loss

LOG = math.log


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def ragged(pad: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two responses, ratios [1.5, 1.05 | pad] (A = 2) and [0.5, 1.0, 0.95] (A = -1)."""
    logp = t([[LOG(1.5), LOG(1.05), pad], [LOG(0.5), 0.0, LOG(0.95)]]).requires_grad_()
    old = t([[0.0, 0.0, pad], [0.0, 0.0, 0.0]])
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return logp, old, adv, mask


def test_loss_and_gradient_by_hand() -> None:
    logp, old, adv, mask = ragged()
    out = cispo_loss(logp, old, adv, mask)
    out.loss.backward()
    assert logp.grad is not None
    # clip to [0.9, 1.1]: weights [1.1, 1.05 | -] and [0.9, 1.0, 0.95]; N = 5 tokens
    j = (
        1.1 * 2 * LOG(1.5)
        + 1.05 * 2 * LOG(1.05)
        + 0.9 * -1 * LOG(0.5)
        + 1.0 * -1 * 0.0
        + 0.95 * -1 * LOG(0.95)
    ) / 5
    assert out.loss.item() == pytest.approx(-j)
    # d(-J)/dlogp = -clip(ratio) * A / N on unmasked tokens, 0 on padding
    expected = [[-1.1 * 2 / 5, -1.05 * 2 / 5, 0.0], [0.9 / 5, 1.0 / 5, 0.95 / 5]]
    torch.testing.assert_close(logp.grad, t(expected))
    ratios = [1.5, 1.05, 0.5, 1.0, 0.95]
    assert out.clip_frac == 2 / 5  # 1.5 and 0.5
    assert out.dual_clip_frac == 0.0
    assert out.ratio_mean == pytest.approx(sum(ratios) / 5)
    assert out.approx_kl == pytest.approx(sum((r - 1) - LOG(r) for r in ratios) / 5)


def test_the_token_mean_is_over_the_whole_batch() -> None:
    """``tokens`` counts the responses left out of these rows (weight 0) too: 5 tokens here
    of 8 in the batch, so the loss and its gradient are 5/8 of the rows' own token mean."""
    logp, old, adv, mask = ragged()
    own = cispo_loss(logp, old, adv, mask)
    whole = cispo_loss(logp, old, adv, mask, tokens=8)
    assert whole.loss.item() == pytest.approx(own.loss.item() * 5 / 8)
    whole.loss.backward()
    assert logp.grad is not None
    assert logp.grad[0, 0].item() == pytest.approx(-1.1 * 2 / 8)
    with pytest.raises(ValueError, match="tokens = 4 is fewer than the batch's 5"):
        cispo_loss(logp, old, adv, mask, tokens=4)


@pytest.mark.parametrize(
    ("ratio", "adv", "weight"),
    [
        (1.5, 1.0, 1.1),  # high side, A > 0: PPO would give no gradient here
        (0.5, -1.0, 0.9),  # low side, A < 0: PPO would give no gradient here
        (1.5, -1.0, 1.1),  # high side, A < 0: PPO would use the unclipped 1.5
        (0.5, 1.0, 0.9),  # low side, A > 0: PPO would use the unclipped 0.5
        (1.05, 1.0, 1.05),  # inside the range: the ratio itself
    ],
)
def test_weight_is_clipped_on_both_sides_whatever_the_sign(
    ratio: float, adv: float, weight: float
) -> None:
    logp = t([[LOG(ratio)]]).requires_grad_()
    out = cispo_loss(logp, t([[0.0]]), torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1))
    out.loss.backward()
    assert logp.grad is not None
    assert out.loss.item() == pytest.approx(-weight * adv * LOG(ratio))
    assert logp.grad.item() == pytest.approx(-weight * adv)  # never zero, unlike PPO
    assert out.clip_frac == (0.0 if weight == ratio else 1.0)


def test_ppo_drops_the_gradient_cispo_keeps() -> None:
    logp = t([[LOG(1.5)]]).requires_grad_()
    args = (t([[0.0]]), torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1))
    clipped_policy_loss(logp, *args, clip_low=0.1, clip_high=0.1).loss.backward()
    assert logp.grad is not None and logp.grad.item() == 0.0
    logp.grad = None
    cispo_loss(logp, *args).loss.backward()
    assert logp.grad is not None and logp.grad.item() == pytest.approx(-1.1)


def test_asymmetric_clip() -> None:
    logp, old, adv, mask = ragged()
    cispo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.3).loss.backward()
    assert logp.grad is not None
    # weights: 1.5 -> 1.3, 0.5 -> 0.8, the others unclipped
    expected = [[-1.3 * 2 / 5, -1.05 * 2 / 5, 0.0], [0.8 / 5, 1.0 / 5, 0.95 / 5]]
    torch.testing.assert_close(logp.grad, t(expected))


def test_on_policy_it_is_reinforce_with_token_mean() -> None:
    logp = t([[-1.0, -2.0], [-0.5, -9.0]]).requires_grad_()
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    out = cispo_loss(logp, logp.detach().clone(), adv, mask)
    out.loss.backward()
    assert logp.grad is not None
    # ratio 1: -(1 * -1 + 1 * -2 + -2 * -0.5) / 3 = 2/3
    assert out.loss.item() == pytest.approx(2 / 3)
    torch.testing.assert_close(logp.grad, t([[-1 / 3, -1 / 3], [2 / 3, 0.0]]))
    assert (out.clip_frac, out.ratio_mean, out.approx_kl) == (0.0, 1.0, 0.0)


def test_padding_changes_nothing_including_gradients() -> None:
    results = []
    for pad in (0.0, 1000.0, -math.inf, math.nan):
        logp, old, adv, mask = ragged(pad)
        out = cispo_loss(logp, old, adv, mask)
        out.loss.backward()
        assert logp.grad is not None
        results.append((out.loss.item(), out.clip_frac, out.approx_kl, logp.grad.tolist()))
    assert results[0] == results[1] == results[2] == results[3]
    assert math.isfinite(results[0][0])
    assert results[0][3][0][2] == 0.0


def test_all_masked_batch_gives_zero_loss_with_zero_grad() -> None:
    logp = torch.full((2, 2), math.nan, dtype=torch.float64, requires_grad=True)
    out = cispo_loss(logp, torch.zeros(2, 2), torch.ones(2), torch.zeros(2, 2))
    out.loss.backward()
    assert logp.grad is not None
    assert out.loss.item() == 0.0
    assert logp.grad.abs().sum().item() == 0.0


def test_old_logp_and_adv_get_no_gradient() -> None:
    logp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    old = torch.full((1, 2), -0.1, dtype=torch.float64, requires_grad=True)
    adv = torch.ones(1, dtype=torch.float64, requires_grad=True)
    cispo_loss(logp, old, adv, torch.ones(1, 2)).loss.backward()
    assert old.grad is None and adv.grad is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"old_logp": torch.zeros(2, 2)}, r"old_logp has shape \(2, 2\) but logp has shape"),
        ({"mask": torch.ones(2, 2)}, r"logp has shape \(2, 3\) but mask has shape \(2, 2\)"),
        ({"mask": torch.full((2, 3), 0.5)}, "mask must hold only 0 and 1"),
        ({"adv": torch.zeros(3)}, r"adv must have shape \(2,\), got \(3,\)"),
        ({"logp": torch.zeros(6), "old_logp": torch.zeros(6)}, r"logp must be \(B, T\)"),
        ({"clip_low": 1.0}, r"clip_low must be in \(0, 1\), got 1.0"),
        ({"clip_high": 0.0}, "clip_high must be > 0, got 0.0"),
    ],
)
def test_cispo_loss_errors(change: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "logp": torch.zeros(2, 3),
        "old_logp": torch.zeros(2, 3),
        "adv": torch.zeros(2),
        "mask": torch.ones(2, 3),
    }
    args.update(change)
    with pytest.raises(ValueError, match=message):
        cispo_loss(**args)  # type: ignore[arg-type]
