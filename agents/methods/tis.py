"""The sampler is not the learner: the gap between their log-probs, and truncated importance
sampling (TIS) to correct for it.

The log-probs an update trains against were recorded by the sampler (``ActionSampled``): the
inference backend, which may be another engine with other kernels and precision (vLLM in bf16)
than the learner's. Three policies are then in play for a sampled token ``a``:

- ``mu``: the sampler, whose log-prob ``log mu(a)`` the event recorded;
- ``pi_old``: the learner's own model at the start of the update (the "proximal" policy of
  decoupled PPO), ``log pi_old(a)`` recomputed without gradient on the prompt the sampler saw;
- ``pi_theta``: the learner's model as it trains.

The PPO ratio is taken against ``pi_old`` (``pi_theta / pi_old``, so the clip measures how far
this update moved), and each token's loss is weighted by ``w = min(pi_old(a) / mu(a), C)``
with the weight constant (no gradient): importance sampling from the sampler's distribution to
the learner's, truncated at the cap ``C`` so that a token the sampler found far likelier than
the learner does cannot dominate the batch (verl's and slime's TIS; ``[grpo] tis_cap``).

Whatever the cap, every update records the gap ``d = log pi_old(a) - log mu(a)`` over its
tokens (:func:`sampler_gap`): its mean and largest absolute value and the k3 estimate of
``KL(mu || pi_old)`` from the sampler's own tokens, ``mean(exp(d) - 1 - d)``. With the in-process
``"hf"`` backend the two models are the same float32 module, and the gap is batching noise.

Shapes as in :mod:`agents.methods.grpo`: (B, T) log-probs and masks; masked positions are never
read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agents.methods.grpo import _check_tokens, masked_mean


@dataclass(frozen=True, slots=True)
class SamplerGap:
    """The gap between the learner's and the sampler's log-probs over an update's tokens.

    Attributes:
        tokens: tokens compared.
        abs_mean: mean of ``|log pi_old - log mu|``.
        abs_max: its largest value.
        kl: k3 estimate of ``KL(mu || pi_old)``: mean of ``exp(d) - 1 - d``, ``d = log pi_old -
            log mu`` (non-negative; 0 when the two agree).
    """

    tokens: int
    abs_mean: float
    abs_max: float
    kl: float


def sampler_gap(learner_logp: torch.Tensor, sampler_logp: torch.Tensor) -> SamplerGap:
    """The :class:`SamplerGap` of flat per-token log-probs (N,) of the same tokens.

    Raises:
        ValueError: the two differ in shape or are not flat.
    """
    if learner_logp.dim() != 1 or learner_logp.shape != sampler_logp.shape:
        raise ValueError(
            f"expected two (N,) tensors, got {tuple(learner_logp.shape)} and "
            f"{tuple(sampler_logp.shape)}"
        )
    if learner_logp.numel() == 0:
        return SamplerGap(tokens=0, abs_mean=0.0, abs_max=0.0, kl=0.0)
    d = (learner_logp.detach() - sampler_logp.detach()).double()  # (N,)
    return SamplerGap(
        tokens=int(d.numel()),
        abs_mean=float(d.abs().mean()),
        abs_max=float(d.abs().max()),
        kl=float((d.exp() - 1 - d).mean()),
    )


@dataclass(frozen=True)
class TisWeights:
    """Truncated importance weights of a batch.

    Attributes:
        weights: (B, T) ``min(exp(log pi_old - log mu), cap)``, constant (no gradient); 0 on
            masked positions.
        clip_frac: fraction of unmasked tokens whose weight the cap truncated.
        mean: mean weight over unmasked tokens.
    """

    weights: torch.Tensor
    clip_frac: float
    mean: float


def tis_weights(
    learner_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> TisWeights:
    """``w = min(pi_old / mu, cap)`` per token, for the loss (see the module docstring).

    Args:
        learner_logp: (B, T) ``log pi_old``, the learner's log-probs at the start of the update.
        sampler_logp: (B, T) ``log mu``, the sampler's recorded log-probs.
        mask: (B, T), 1 for response tokens.
        cap: the truncation C, > 0 (verl's default: 2).

    Returns:
        The weights and their statistics.

    Raises:
        ValueError: mismatched shapes, a mask not 0/1, or ``cap <= 0``.
    """
    mask = _check_tokens(mask, learner_logp=learner_logp, sampler_logp=sampler_logp)
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    with torch.no_grad():
        zeros = torch.zeros_like(learner_logp)
        log_w = torch.where(mask, learner_logp - sampler_logp, zeros)  # (B, T)
        truncated = log_w > math.log(cap)  # (B, T)
        weights = torch.where(mask, log_w.clamp(max=math.log(cap)).exp(), zeros)  # (B, T)
        return TisWeights(
            weights=weights,
            clip_frac=masked_mean(truncated.to(weights.dtype), mask).item(),
            mean=masked_mean(weights, mask).item(),
        )
