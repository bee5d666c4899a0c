"""The experience extractor's loss: CISPO (Complementary RL, ALGORITHMS.md section 3, step 8).

Unlike PPO, CISPO never drops a token's gradient: it clips the importance weight and stops its
gradient, so every token of every response keeps the REINFORCE direction ``A * grad log pi``,
scaled by a bounded weight. That suits the extractor, whose updates run severely off-policy.
Aggregation is token-mean over the extractor batch, ``sum_i sum_t ... / sum_i |m_i|``: a call
whose weighted advantage is 0 (in cooldown) adds nothing above the line but still counts below
it (``tokens``), so leaving it out of the forward pass does not scale up the others. Inputs and
the masking contract (masked positions are never read, NaN included) are those of
:mod:`agents.methods.grpo`.
"""

from __future__ import annotations

import torch

from agents.methods.grpo import LossOutput, _check_loss_args, _check_tokens, masked_mean


def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.1,
    clip_high: float = 0.1,
    tokens: int | None = None,
) -> LossOutput:
    """CISPO: ``J = sum_i sum_t sg(clip(ratio_it, 1-clip_low, 1+clip_high)) * A_i * logp_it /
    sum_i |m_i|``, negated to a loss.

    The clipped ratio is a constant, so the gradient of the loss w.r.t. an unmasked
    ``logp_it`` is ``-clip(ratio_it) * A_i / N`` (N = ``tokens``), and 0 on masked positions.
    ``old_logp`` and ``adv`` are treated as constants.

    Args:
        logp: (B, T) log-probs of the response tokens under the current extractor (with grad).
        old_logp: (B, T) log-probs under the extractor that sampled them.
        adv: (B,) advantage of each response, A(m) times its weight w(m).
        mask: (B, T), 1 for response tokens, 0 for padding.
        clip_low: the ratio's lower clip is ``1 - clip_low``.
        clip_high: the ratio's upper clip is ``1 + clip_high``.
        tokens: N, the response tokens of the whole extractor batch, these rows' and those
            left out because their advantage is 0; None: these rows' unmasked tokens.

    Returns:
        The loss and its statistics, over unmasked tokens: ``clip_frac`` is the fraction whose
        ratio lies outside ``[1 - clip_low, 1 + clip_high]`` (either side, whatever A's sign;
        unlike PPO those tokens keep their gradient), ``dual_clip_frac`` is 0.0,
        ``ratio_mean`` and ``approx_kl`` are as in :func:`agents.methods.grpo.clipped_policy_loss`.

    Raises:
        ValueError: mismatched shapes, a mask not 0/1, ``clip_low`` outside (0, 1),
            ``clip_high <= 0``, or ``tokens`` fewer than these rows' unmasked tokens.
    """
    _check_loss_args(logp, old_logp, adv, clip_low, clip_high, None)
    mask = _check_tokens(mask, logp=logp)  # (B, T) bool
    n = int(mask.sum())
    if tokens is not None and tokens < n:
        raise ValueError(f"tokens = {tokens} is fewer than the batch's {n} unmasked tokens")
    zeros = torch.zeros_like(logp)
    adv = adv.detach().to(logp.dtype)[:, None]  # (B, 1)
    log_ratio = torch.where(mask, logp.detach() - old_logp.detach(), zeros)  # (B, T)
    ratio = log_ratio.exp()  # (B, T)
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high)  # (B, T), no grad
    objective = clipped * adv * torch.where(mask, logp, zeros)  # (B, T)
    loss = -objective.sum() / max(n if tokens is None else tokens, 1)
    with torch.no_grad():
        clip_hit = (ratio < 1 - clip_low) | (ratio > 1 + clip_high)  # (B, T)
        return LossOutput(
            loss=loss,
            clip_frac=masked_mean(clip_hit.to(logp.dtype), mask).item(),
            dual_clip_frac=0.0,
            ratio_mean=masked_mean(ratio, mask).item(),
            approx_kl=masked_mean((ratio - 1) - log_ratio, mask).item(),
        )
