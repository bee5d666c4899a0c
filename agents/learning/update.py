"""One GRPO update of a model, free of actors and events: the turns it trains on
(:class:`Sample`), the model with its optimiser (:class:`Trainee`), the log-probs of the current
and behaviour policies, and :func:`grpo_step`, the update itself (minibatches over epochs, the
clipped loss, KL to a reference, truncated importance sampling, a non-finite step refused).

The learner actor (:mod:`agents.learning.learner`) calls it in a worker thread or a process of
its own; a plain synchronous loop (``bench/grpo_sync.py``) and ``coevo replay
--reexecute-learner`` run exactly the same maths.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from agents.events.policy import ActionSampled, GradientRequested
from agents.methods.grpo import clipped_policy_loss, kl_penalty, low_prob_mask
from agents.methods.tis import SamplerGap, sampler_gap, tis_weights
from agents.models.policy import chosen_action_logps, response_logps
from agents.models.tuning import (
    MemoryUse,
    deterministic_algorithms,
    learning_mode,
    memory_use,
    trainable,
)
from engine.errors import CoevoError
from stores.checkpoints import is_adapted


@dataclass(frozen=True, slots=True)
class Sample:
    """One turn to train on: what the behaviour policy did, and its advantage.

    ``distill`` (EMPO2's off-policy update): the current policy reads the prompt with the tip
    spans removed, while the old log-probs stay those of the tip-conditioned behaviour policy.
    """

    turn: ActionSampled
    adv: float
    distill: bool = False

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        """The prompt the current policy is trained on."""
        if self.distill and self.turn.bare_prompt_ids:
            return self.turn.bare_prompt_ids
        return self.turn.prompt_ids


@dataclass(frozen=True, slots=True)
class StepStats:
    """Means over an update's minibatches, and the sampler's gap (see :func:`grpo_step`).

    ``gap`` is None when no token was compared; ``tis_clip_frac`` is None when the request has
    no ``tis_cap``; ``low_prob_masked`` (None when the request has no ``low_prob_delta``) is
    how many of the samples EMPO2's low-probability mask dropped from the loss.
    """

    samples: int
    loss: float
    grad_norm: float
    clip_frac: float
    kl: float
    ratio_mean: float
    ref_kl: float
    gap: SamplerGap | None = None
    tis_clip_frac: float | None = None
    low_prob_masked: int | None = None


class Trainee:
    """The model being trained, its optimiser and (when ``kl_coef`` > 0) a frozen reference.

    Args:
        model: the causal LM (its weights are policy version 0), with or without LoRA
            adapters (:mod:`agents.models.tuning`).
        tokenizer: its tokenizer (for the pad id and for checkpoints).
        device: where the model lives.
        reference: keep the initial policy for the KL term: a frozen copy, or for an adapted
            model the same model with its adapters switched off (no copy).
    """

    def __init__(self, model: Any, tokenizer: Any, device: torch.device, reference: bool) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.adapters_off = reference and is_adapted(model)
        self.reference = (
            copy.deepcopy(model).eval() if reference and not self.adapters_off else None
        )
        self.optimizer: torch.optim.Optimizer | None = None

    @property
    def has_reference(self) -> bool:
        """A reference policy is kept for the KL term."""
        return self.reference is not None or self.adapters_off

    @contextlib.contextmanager
    def reference_model(self) -> Iterator[Any]:
        """The reference policy, for log-probs without gradient."""
        if self.adapters_off:
            with self.model.disable_adapter():
                yield self.model
        else:
            assert self.reference is not None, "no reference kept (kl_coef = 0)"
            yield self.reference

    def optimiser(self, lr: float) -> torch.optim.Optimizer:
        """The AdamW optimiser, created on first use; ``lr`` applies from this step on."""
        self.optimizer = adamw(self.model, self.optimizer, lr)
        return self.optimizer

    def memory(self) -> MemoryUse:
        """What the trained state costs now."""
        return memory_use(self.model, self.optimizer, self.device)


def adamw(model: Any, optimizer: torch.optim.Optimizer | None, lr: float) -> torch.optim.Optimizer:
    """``optimizer``, or a new AdamW without weight decay over ``model``'s trainable parameters
    (its adapters, with LoRA) if None, with ``lr`` from its next step on (the policy's and the
    extractor's optimiser)."""
    if optimizer is None:
        optimizer = torch.optim.AdamW(trainable(model), lr=lr, weight_decay=0.0)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return optimizer


def sample_logps(
    model: Any,
    batch: Sequence[Sample],
    pad_id: int,
    device: torch.device,
    scoring: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Current log-probs, behaviour log-probs and mask of a minibatch (all one mode).

    In "score" mode a sample is one action-level log-prob (the candidate softmax): (B, 1); in
    "generate" mode it is the response's token log-probs: (B, T). Either is computed in the
    layout ``scoring`` names (``agents.events.policy.LAYOUTS``; None: "packed").
    """
    turns = [s.turn for s in batch]
    prompts = [s.prompt_ids for s in batch]
    if turns[0].mode == "score":
        logp = chosen_action_logps(
            model,
            prompts,
            [t.candidates for t in turns],
            [t.choice for t in turns],
            temperature=turns[0].temperature,
            pad_id=pad_id,
            device=device,
            layout=scoring or "packed",
        )  # (B, 1)
    else:
        logp, _ = response_logps(
            model,
            prompts,
            [t.response_ids for t in turns],
            temperature=turns[0].temperature,
            pad_id=pad_id,
            device=device,
            layout=scoring or "packed",
        )  # (B, T)
    old, mask = behaviour_logps(batch, device)
    return logp, old, mask


def behaviour_logps(
    batch: Sequence[Sample], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The behaviour log-probs and mask of a minibatch (all one mode), as :func:`sample_logps`
    gives them, without a forward pass: (B, 1) in "score" mode, (B, T) in "generate" mode with
    T the longest response and the mask 1 on its tokens."""
    turns = [s.turn for s in batch]
    if turns[0].mode == "score":
        old = torch.tensor([[t.logp] for t in turns], dtype=torch.float32, device=device)
        return old, torch.ones_like(old)
    width = max(len(t.response_ids) for t in turns)
    old = torch.zeros((len(turns), width), dtype=torch.float32, device=device)
    mask = torch.zeros_like(old)
    for b, t in enumerate(turns):
        old[b, : len(t.token_logps)] = torch.tensor(t.token_logps, dtype=torch.float32)
        mask[b, : len(t.response_ids)] = 1.0
    return old, mask


def grpo_step(
    trainee: Trainee,
    samples: Sequence[Sample],
    req: GradientRequested,
    seed: int,
    version: int | None = None,
) -> StepStats:
    """Run ``req.epochs`` passes of minibatch clipped-ratio updates over ``samples``.

    Minibatches are drawn in an order shuffled by ``seed``; a minibatch never mixes "score"
    and "generate" samples or temperatures. The model stays in eval mode (dropout off, as when
    it sampled), so an on-policy ratio is exactly 1; gradients flow all the same. A minibatch
    with no signal (every advantage 0 or every token masked, and no KL term) makes no optimiser
    step: AdamW's momentum would otherwise move the weights.

    The sampler's gap (:mod:`agents.methods.tis`) is measured before the first optimiser step:
    with ``req.tis_cap`` over every sample (the learner's log-probs at the start of the update,
    which the ratio then uses, cost one forward pass without gradient); without it over the
    first minibatch's samples, from the forward pass that minibatch makes anyway. Left out:
    distill samples, whose prompts differ from the sampler's on purpose, and, given
    ``version`` (the policy version the weights are), samples an older version drew, whose
    difference is the policy's change since, not the sampler's.

    It runs with torch's deterministic algorithms (:func:`agents.models.tuning.
    deterministic_algorithms`): with more than one torch thread, the backward pass of a gather
    with repeated places (packed scoring reads a shared prompt's last place once per candidate)
    otherwise adds its gradients with atomic adds in parallel, whose order (and last bits)
    changes from run to run on a busy machine. With one thread nothing changes.

    Raises:
        ValueError: ``req.low_prob_delta`` is set and a sample is a "score" turn (EMPO2's
            low-probability masking thresholds sampled tokens' log-probs; a scenario refuses
            the combination).
    """
    if req.low_prob_delta is not None and any(s.turn.mode == "score" for s in samples):
        raise ValueError(
            'low-probability masking needs "generate" mode: a "score" action\'s log-prob is '
            "over the admissible actions, not a sampled token's"
        )
    with deterministic_algorithms():
        return _grpo_epochs(trainee, samples, req, seed, version)


def _grpo_epochs(
    trainee: Trainee,
    samples: Sequence[Sample],
    req: GradientRequested,
    seed: int,
    version: int | None,
) -> StepStats:
    learning_mode(trainee.model)
    opt = trainee.optimiser(req.lr)
    rng = random.Random(seed)
    tis_on = req.tis_cap is not None
    prox = learner_logps(trainee, samples, req.minibatch, req.scoring) if tis_on else {}
    same = [s for s in samples if version is None or s.turn.policy_version == version]
    gap = _gap(same, prox) if tis_on and same else None
    totals = dict(loss=0.0, grad_norm=0.0, clip_frac=0.0, kl=0.0, ratio_mean=0.0, ref_kl=0.0)
    tis_clipped: list[float] = []
    steps = 0
    for _ in range(req.epochs):
        for batch in _minibatches(samples, req.minibatch, rng):
            measure = steps == 0 and not tis_on
            stats, first_gap = _one_step(trainee, opt, batch, req, prox, measure, version)
            gap = first_gap or gap
            tis = stats.pop("tis_clip_frac", None)
            if tis is not None:
                tis_clipped.append(tis)
            for key, value in stats.items():
                totals[key] += value
            steps += 1
    mean = {k: v / max(steps, 1) for k, v in totals.items()}
    tis_clip_frac = sum(tis_clipped) / len(tis_clipped) if tis_clipped else None
    gap = gap if gap is not None and gap.tokens else None
    masked = None if req.low_prob_delta is None else _low_prob_masked(samples, req.low_prob_delta)
    return StepStats(
        samples=len(samples),
        gap=gap,
        tis_clip_frac=tis_clip_frac,
        low_prob_masked=masked,
        **mean,
    )


def _low_prob_masked(samples: Sequence[Sample], delta: float) -> int:
    """How many of ``samples`` the low-probability mask drops: :func:`low_prob_mask` on their
    behaviour log-probs, as the loss reads them."""
    if not samples:
        return 0
    old, mask = behaviour_logps(samples, torch.device("cpu"))
    return int((low_prob_mask(old, mask, delta) == 0).sum())


def learner_logps(
    trainee: Trainee, samples: Sequence[Sample], chunk: int, scoring: str | None = None
) -> dict[int, torch.Tensor]:
    """The learner's log-probs of what the sampler did, before the update changes anything:
    per sample (keyed by ``id``), on the prompt the sampler saw (with its tips, for a distill
    sample), without gradient, in chunks of ``chunk`` samples of one mode and temperature.

    Returns:
        ``id(sample)`` -> (n,) log-probs of its n tokens ((1,) in "score" mode).
    """
    out: dict[int, torch.Tensor] = {}
    kinds: dict[tuple[str, float], list[Sample]] = {}
    for s in samples:
        kinds.setdefault((s.turn.mode, s.turn.temperature), []).append(s)
    with torch.no_grad():
        for group in kinds.values():
            for k in range(0, len(group), chunk):
                part = group[k : k + chunk]
                seen = [replace(s, distill=False) for s in part]  # the sampler's own prompt
                logp, _, mask = sample_logps(
                    trainee.model, seen, trainee.pad_id, trainee.device, scoring
                )
                for row, s in enumerate(part):
                    out[id(s)] = logp[row, : int(mask[row].sum())].detach()
    return out


def _gap(samples: Sequence[Sample], prox: dict[int, torch.Tensor]) -> SamplerGap:
    learner = torch.cat([prox[id(s)].cpu() for s in samples])
    sampler = torch.cat(
        [
            torch.tensor(
                [s.turn.logp] if s.turn.mode == "score" else list(s.turn.token_logps),
                dtype=torch.float32,
            )
            for s in samples
        ]
    )
    return sampler_gap(learner.double(), sampler.double())


def _minibatches(samples: Sequence[Sample], size: int, rng: random.Random) -> list[list[Sample]]:
    order = list(range(len(samples)))
    rng.shuffle(order)
    by_kind: dict[tuple[str, float], list[Sample]] = {}
    for i in order:
        t = samples[i].turn
        by_kind.setdefault((t.mode, t.temperature), []).append(samples[i])
    return [group[k : k + size] for group in by_kind.values() for k in range(0, len(group), size)]


def _one_step(
    trainee: Trainee,
    opt: torch.optim.Optimizer,
    batch: list[Sample],
    req: GradientRequested,
    prox: dict[int, torch.Tensor],
    measure: bool = False,
    version: int | None = None,
) -> tuple[dict[str, float], SamplerGap | None]:
    """One optimiser step on ``batch``; with ``measure``, also the sampler's gap on its samples
    that are neither distilled nor drawn by a version other than ``version``.

    With ``req.skip_zero_advantage`` (and no KL term, and not measuring), only the turns with a
    nonzero advantage go through the forward and backward passes, when the minibatch has any:
    a turn with advantage 0 adds 0 to the surrogate whatever its ratio, so the loss is theirs
    scaled by their share of the minibatch's normaliser (:func:`_share`), the gradient the
    whole minibatch's up to float rounding. The ratio statistics are then over those turns.
    """
    with_kl = req.kl_coef > 0 and trainee.has_reference
    share = 1.0
    if req.skip_zero_advantage and not with_kl and not measure:
        keep = [s.adv != 0 for s in batch]
        if any(keep) and not all(keep):
            share = _share(batch, keep, req, trainee.device)
            batch = [s for s, k in zip(batch, keep, strict=True) if k]
    logp, old_logp, mask = sample_logps(
        trainee.model, batch, trainee.pad_id, trainee.device, req.scoring
    )
    gap = None
    if measure:
        kept = [
            not s.distill and (version is None or s.turn.policy_version == version) for s in batch
        ]
        own = torch.tensor(kept, device=mask.device)[:, None]
        keep = (mask != 0) & own  # (B, T)
        gap = sampler_gap(logp.detach()[keep].double(), old_logp[keep].double())
    if req.low_prob_delta is not None:
        mask = mask * low_prob_mask(old_logp, mask, req.low_prob_delta)[:, None]  # (B, T)
    adv = torch.tensor([s.adv for s in batch], dtype=torch.float32, device=trainee.device)
    is_weight = None
    tis: dict[str, float] = {}
    if req.tis_cap is not None:  # ratio against the learner's own start, weighted to the sampler
        start = torch.zeros_like(old_logp)  # (B, T)
        for b, s in enumerate(batch):
            start[b, : len(prox[id(s)])] = prox[id(s)]
        weights = tis_weights(start, old_logp, mask, req.tis_cap)
        old_logp, is_weight = start, weights.weights
        tis["tis_clip_frac"] = weights.clip_frac
    out = clipped_policy_loss(
        logp,
        old_logp,
        adv,
        mask,
        clip_low=req.clip_low,
        clip_high=req.clip_high,
        dual_clip=req.dual_clip,
        aggregation=req.aggregation,
        is_weight=is_weight,
    )
    loss = out.loss * share  # exact when nothing is skipped (share 1.0)
    ref_kl = 0.0
    if with_kl:
        with torch.no_grad(), trainee.reference_model() as reference:
            ref_logp, _, _ = sample_logps(
                reference, batch, trainee.pad_id, trainee.device, req.scoring
            )
        kl = kl_penalty(logp, ref_logp, mask, aggregation=req.aggregation)
        loss = loss + req.kl_coef * kl
        ref_kl = float(kl.detach())
    grad_norm = 0.0
    if with_kl or bool(((adv != 0) & (mask != 0).any(-1)).any()):  # else no signal: no step
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(trainable(trainee.model), req.max_grad_norm)
        refuse_non_finite("policy", req.update, loss, norm, logp, mask)
        opt.step()
        grad_norm = float(norm)
    stats = dict(
        loss=float(loss.detach()),
        grad_norm=grad_norm,
        clip_frac=out.clip_frac,
        kl=out.approx_kl,
        ratio_mean=out.ratio_mean,
        ref_kl=ref_kl,
        **tis,
    )
    return stats, gap


class UpdateNotFinite(CoevoError):
    """An update's loss or gradient is not finite (NaN or infinite): it is not applied and
    the run fails, rather than turning every weight into NaN while it goes on (exit 1)."""

    exit_code = 1


def refuse_non_finite(
    model: str,
    update: int,
    loss: torch.Tensor,
    norm: torch.Tensor,
    logp: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> None:
    """Raise :class:`UpdateNotFinite` before an optimiser step whose loss or gradient norm
    is not finite (advantages of 1e300 overflow float32; a NaN spreads to every weight).
    ``logp``: the model's own log-probs of the batch, when at hand (at the places ``mask``
    marks, when given; read only when the step is refused): non-finite ones mean the weights
    are at fault, not the advantages.

    Raises:
        UpdateNotFinite: so.
    """
    values = (float(loss.detach()), float(norm))
    if all(math.isfinite(v) for v in values):
        return
    own = None if logp is None else logp.detach() if mask is None else logp.detach()[mask != 0]
    if own is not None and not bool(torch.isfinite(own).all()):
        why = (
            "the model's own log-probs of the batch are not finite: its weights hold NaN or "
            "inf (a damaged model directory or checkpoint)"
        )
    else:
        why = "are the advantages finite and of a sane size? a method's score gives them"
    raise UpdateNotFinite(
        f"{model} update {update}: loss {values[0]:g}, gradient norm {values[1]:g}: not finite, "
        f"so not applied ({why})"
    )


def _share(
    batch: Sequence[Sample], keep: Sequence[bool], req: GradientRequested, device: torch.device
) -> float:
    """The share of ``batch``'s loss normaliser that its turns ``keep`` marks hold, its mask as
    the loss takes it (low-probability masking included): unmasked tokens for "token-mean",
    sequences with any for the other aggregations (:func:`agents.methods.grpo.aggregate`)."""
    old, mask = behaviour_logps(batch, device)
    if req.low_prob_delta is not None:
        mask = mask * low_prob_mask(old, mask, req.low_prob_delta)[:, None]
    live = mask != 0
    per_turn = live.sum(-1) if req.aggregation == "token-mean" else live.any(-1)  # (B,)
    total = int(per_turn.sum())
    return int(per_turn[torch.tensor(keep, device=device)].sum()) / total if total else 0.0
