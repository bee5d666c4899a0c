"""GRPO's loss as pure functions: the clipped token-ratio loss, KL to a reference, masking.

Read top to bottom like CleanRL's PPO. The advantages that feed it are in
:mod:`agents.methods.advantages` (plain floats, re-derivable from logged rewards). The loss pieces
are torch and take padded batches:

- ``logp``, ``old_logp``, ``ref_logp``: (B, T) log-probs of the sampled response tokens under
  the current, behaviour and reference policies;
- ``mask``: (B, T), 1 for response tokens and 0 for padding (bool or 0/1 numbers);
- ``adv``: (B,), one advantage per sequence.

Values at masked positions are never read: they may be anything, NaN included, and receive a
zero gradient. Aggregation over tokens and sequences lives in one place, :func:`aggregate`.

EMPO2's low-probability masking (:func:`low_prob_mask`) is here too: it is GRPO with a
different mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"]
AGGREGATIONS: tuple[str, ...] = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum")
KLKind = Literal["k1", "k2", "k3"]
KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3")


# ---------------------------------------------------------------------------------------------
# Masked aggregation (the one place)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is true; 0 where nothing is unmasked (never NaN).

    Masked entries are replaced by 0 before summing (``torch.where``), so NaN or inf there
    neither leaks into the result nor into the gradient.

    Args:
        values: any shape.
        mask: bool, same shape as ``values``.
        dim: the dimension to reduce; None reduces everything to a scalar.

    Returns:
        The masked mean, with ``dim`` reduced.
    """
    kept = torch.where(mask, values, torch.zeros_like(values))
    count = mask.sum() if dim is None else mask.sum(dim)
    total = kept.sum() if dim is None else kept.sum(dim)
    return total / count.clamp(min=1).to(values.dtype)


def aggregate(values: torch.Tensor, mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    """Reduce per-token values (B, T) to a scalar.

    - ``"seq-mean-token-mean"``: mean over each sequence's unmasked tokens, then mean over the
      sequences that have at least one (the papers' default; every sequence weighs the same).
    - ``"token-mean"``: mean over all unmasked tokens of the batch (long sequences weigh more).
    - ``"seq-mean-token-sum"``: sum over each sequence's unmasked tokens, then mean over the
      sequences that have at least one (Dr. GRPO-style, no length normalisation).

    A sequence with an all-zero mask contributes nothing and is not counted; an all-masked
    batch gives 0 (still attached to the graph of ``values``).

    Args:
        values: (B, T) per-token values.
        mask: (B, T) bool, true for response tokens.
        aggregation: one of :data:`AGGREGATIONS`.

    Returns:
        A scalar tensor.

    Raises:
        ValueError: unknown ``aggregation``.
    """
    _check_aggregation(aggregation)
    if aggregation == "token-mean":
        return masked_mean(values, mask)
    if aggregation == "seq-mean-token-mean":
        per_seq = masked_mean(values, mask, dim=-1)  # (B,)
    else:
        per_seq = torch.where(mask, values, torch.zeros_like(values)).sum(-1)  # (B,)
    return masked_mean(per_seq, mask.any(-1))


def _check_aggregation(aggregation: str) -> None:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}, expected one of {AGGREGATIONS}")


def _check_tokens(mask: torch.Tensor, **tensors: torch.Tensor) -> torch.Tensor:
    """Validate (B, T) token tensors against ``mask``; return the mask as bool."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be (B, T), got shape {tuple(mask.shape)}")
    for name, t in tensors.items():
        if t.shape != mask.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but mask has shape {tuple(mask.shape)}"
            )
    if mask.dtype != torch.bool:
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must hold only 0 and 1")
        mask = mask != 0
    return mask


# ---------------------------------------------------------------------------------------------
# The clipped policy loss


@dataclass(frozen=True)
class LossOutput:
    """The clipped policy loss and its statistics.

    The statistics are detached floats over all unmasked tokens of the batch (token-weighted,
    whatever the loss aggregation); each is 0.0 when no token is unmasked.

    Attributes:
        loss: scalar tensor to minimise, with grad.
        clip_frac: fraction of tokens where the PPO clip is binding, i.e. the clipped term is
            strictly the one taken: ``A > 0 and ratio > 1 + clip_high`` or
            ``A < 0 and ratio < 1 - clip_low``. Those tokens get no gradient.
        dual_clip_frac: fraction of tokens where the dual clip is binding:
            ``A < 0 and ratio > dual_clip`` (0.0 without dual clip).
        ratio_mean: mean of ``ratio = exp(logp - old_logp)``.
        approx_kl: mean of ``(ratio - 1) - log(ratio)``, the k3 estimate of KL(old || new).
    """

    loss: torch.Tensor
    clip_frac: float
    dual_clip_frac: float
    ratio_mean: float
    approx_kl: float


def _check_loss_args(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must be (B, T), got shape {tuple(logp.shape)}")
    if old_logp.shape != logp.shape:
        raise ValueError(
            f"old_logp has shape {tuple(old_logp.shape)} but logp has shape {tuple(logp.shape)}"
        )
    if adv.shape != logp.shape[:1]:
        raise ValueError(f"adv must have shape ({logp.shape[0]},), got {tuple(adv.shape)}")
    if not 0 < clip_low < 1:
        raise ValueError(f"clip_low must be in (0, 1), got {clip_low}")
    if not clip_high > 0:
        raise ValueError(f"clip_high must be > 0, got {clip_high}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    aggregation: str = "seq-mean-token-mean",
    is_weight: torch.Tensor | None = None,
) -> LossOutput:
    """PPO/GRPO clipped surrogate on token ratios, negated to a loss.

    Per token: ``ratio = exp(logp - old_logp)``, ``surr = min(ratio*A, clip(ratio, 1-clip_low,
    1+clip_high)*A)``; with ``dual_clip = c`` the objective of a token with ``A < 0`` is
    ``max(surr, c*A)`` (dual-clip PPO; EMPO2's code uses c = 10), bounding the loss of a huge
    ratio by ``-c*A``. The loss is ``-aggregate(surr)``. ``old_logp`` is treated as constant.

    Args:
        logp: (B, T) log-probs under the current policy (with grad).
        old_logp: (B, T) log-probs under the behaviour policy.
        adv: (B,) advantage of each sequence.
        mask: (B, T), 1 for response tokens, 0 for padding.
        clip_low: the ratio's lower clip is ``1 - clip_low``.
        clip_high: the ratio's upper clip is ``1 + clip_high``.
        dual_clip: the constant c > 1 of dual clipping, or None for none.
        aggregation: see :func:`aggregate`.
        is_weight: (B, T) constant per-token weights of the clipped objective (truncated
            importance sampling against the sampler, :mod:`agents.methods.tis`); None: 1.

    Returns:
        The loss and its statistics.

    Raises:
        ValueError: mismatched shapes, a mask not 0/1, ``clip_low`` outside (0, 1),
            ``clip_high <= 0``, ``dual_clip <= 1``, or an unknown aggregation.
    """
    _check_loss_args(logp, old_logp, adv, clip_low, clip_high, dual_clip)
    mask = _check_tokens(mask, logp=logp)  # (B, T) bool
    if is_weight is not None and is_weight.shape != logp.shape:
        raise ValueError(
            f"is_weight has shape {tuple(is_weight.shape)} but logp has {tuple(logp.shape)}"
        )
    _check_aggregation(aggregation)
    adv = adv.detach().to(logp.dtype)[:, None]  # (B, 1)
    log_ratio = torch.where(mask, logp - old_logp.detach(), torch.zeros_like(logp))  # (B, T)
    ratio = log_ratio.exp()  # (B, T)
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high)  # (B, T)
    surr = torch.minimum(ratio * adv, clipped * adv)  # (B, T)
    if dual_clip is not None:
        surr = torch.where(adv < 0, torch.maximum(surr, dual_clip * adv), surr)  # (B, T)
    if is_weight is not None:
        surr = surr * is_weight.detach()  # (B, T)
    loss = -aggregate(surr, mask, aggregation)
    with torch.no_grad():
        clip_hit = ((adv > 0) & (ratio > 1 + clip_high)) | ((adv < 0) & (ratio < 1 - clip_low))
        dual_hit = torch.zeros_like(clip_hit)
        if dual_clip is not None:
            dual_hit = (adv < 0) & (ratio > dual_clip)
        return LossOutput(
            loss=loss,
            clip_frac=masked_mean(clip_hit.to(logp.dtype), mask).item(),
            dual_clip_frac=masked_mean(dual_hit.to(logp.dtype), mask).item(),
            ratio_mean=masked_mean(ratio, mask).item(),
            approx_kl=masked_mean((ratio - 1) - log_ratio, mask).item(),
        )


# ---------------------------------------------------------------------------------------------
# KL to a frozen reference


def kl_penalty(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    kind: str = "k3",
    aggregation: str = "seq-mean-token-mean",
) -> torch.Tensor:
    """Estimate of KL(current || reference) from sampled tokens, aggregated like the loss.

    Per token, with ``d = ref_logp - logp``: ``k1 = -d`` (unbiased, can be negative),
    ``k2 = d**2 / 2``, ``k3 = exp(d) - d - 1`` (unbiased, non-negative; the GRPO default).
    ``ref_logp`` is treated as constant. The caller adds ``kl_coef * kl`` to the loss.

    Args:
        logp: (B, T) log-probs under the current policy (with grad).
        ref_logp: (B, T) log-probs under the frozen reference policy.
        mask: (B, T), 1 for response tokens, 0 for padding.
        kind: ``"k1"``, ``"k2"`` or ``"k3"``.
        aggregation: see :func:`aggregate`.

    Returns:
        A scalar tensor with grad.

    Raises:
        ValueError: mismatched shapes, a mask not 0/1, an unknown kind or aggregation.
    """
    mask = _check_tokens(mask, logp=logp, ref_logp=ref_logp)  # (B, T) bool
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL kind {kind!r}, expected one of {KL_KINDS}")
    _check_aggregation(aggregation)
    d = torch.where(mask, ref_logp.detach() - logp, torch.zeros_like(logp))  # (B, T)
    if kind == "k1":
        kl = -d
    elif kind == "k2":
        kl = 0.5 * d.square()
    else:
        kl = d.exp() - d - 1
    return aggregate(kl, mask, aggregation)


# ---------------------------------------------------------------------------------------------
# EMPO2's low-probability masking


def low_prob_mask(old_logp: torch.Tensor, mask: torch.Tensor, delta: float = -5.0) -> torch.Tensor:
    """EMPO2's sequence-level keep-mask: drop a response holding a very unlikely token.

    A response whose minimum old log-prob over its unmasked tokens is below ``delta`` (strictly)
    is dropped entirely. A response with no unmasked token is kept (it contributes nothing
    anyway). Apply it as ``mask * keep[:, None]``.

    Args:
        old_logp: (B, T) log-probs under the behaviour policy.
        mask: (B, T), 1 for response tokens, 0 for padding.
        delta: the log-prob threshold (EMPO2's code: -5.0); must be negative.

    Returns:
        (B,) float keep-mask, 1.0 to keep and 0.0 to drop, in ``old_logp``'s dtype.

    Raises:
        ValueError: mismatched shapes, a mask not 0/1, or ``delta >= 0``.
    """
    mask = _check_tokens(mask, old_logp=old_logp)  # (B, T) bool
    if not delta < 0:
        raise ValueError(f"delta must be < 0, got {delta}")
    with torch.no_grad():
        inf = torch.full_like(old_logp, math.inf)
        min_logp = torch.where(mask, old_logp, inf).amin(-1)  # (B,)
        return (min_logp >= delta).to(old_logp.dtype)
