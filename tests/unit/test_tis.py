"""Truncated importance sampling against the sampler and the recorded gap: the maths against
hand-computed values, and the learner's step with a sampler whose log-probs differ from its own."""

from __future__ import annotations

import math

import msgspec
import pytest
import torch
from test_updates import CPU, TOKENIZER, generate_turns, request, score_turns, tiny_model

from agents.learning.update import Sample, Trainee, grpo_step
from agents.methods.grpo import clipped_policy_loss
from agents.methods.tis import sampler_gap, tis_weights

LN2, LN4 = math.log(2.0), math.log(4.0)


def test_the_gap_is_the_mean_and_largest_absolute_difference_and_the_k3_kl() -> None:
    learner = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.1)])
    sampler = torch.tensor([math.log(0.25), math.log(0.25), math.log(0.4)])
    gap = sampler_gap(learner, sampler)  # d = [ln 2, 0, -ln 4]
    assert gap.tokens == 3
    assert gap.abs_mean == pytest.approx((LN2 + LN4) / 3)
    assert gap.abs_max == pytest.approx(LN4)
    # k3 per token: exp(d) - 1 - d = (2 - 1 - ln 2), 0, (1/4 - 1 + ln 4)
    assert gap.kl == pytest.approx(((1 - LN2) + (LN4 - 0.75)) / 3)
    assert sampler_gap(torch.zeros(0), torch.zeros(0)).tokens == 0
    with pytest.raises(ValueError, match=r"two \(N,\) tensors"):
        sampler_gap(torch.zeros(2, 1), torch.zeros(2, 1))


def test_weights_are_the_ratio_to_the_sampler_truncated_at_the_cap() -> None:
    # ratios pi_old / mu: 0.5, 2, 4 (truncated to 2); the masked position holds NaN and is unread
    learner = torch.tensor([[math.log(0.2), math.log(0.6), math.log(0.8), math.nan]])
    sampler = torch.tensor([[math.log(0.4), math.log(0.3), math.log(0.2), 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    out = tis_weights(learner, sampler, mask, cap=2.0)
    assert out.weights.tolist()[0] == pytest.approx([0.5, 2.0, 2.0, 0.0])
    assert out.clip_frac == pytest.approx(1 / 3)
    assert out.mean == pytest.approx(4.5 / 3)
    assert not out.weights.requires_grad
    with pytest.raises(ValueError, match="cap must be > 0"):
        tis_weights(learner, sampler, mask, cap=0.0)


def test_the_weight_scales_each_tokens_objective_and_its_gradient() -> None:
    # on-policy against pi_old (ratio 1, no clip): loss = -mean_t(w_t * A), d loss / d logp_t =
    # -w_t * A / T for the sequence's T tokens (seq-mean-token-mean)
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = logp.detach().clone()
    weights = torch.tensor([[0.5, 2.0]])
    out = clipped_policy_loss(logp, old, torch.tensor([3.0]), torch.ones(1, 2), is_weight=weights)
    assert out.loss.item() == pytest.approx(-(0.5 * 3 + 2.0 * 3) / 2)
    out.loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx([-0.5 * 3 / 2, -2.0 * 3 / 2])
    with pytest.raises(ValueError, match="is_weight has shape"):
        clipped_policy_loss(logp, old, torch.tensor([3.0]), torch.ones(1, 2), is_weight=weights.T)


def test_a_clipped_token_stays_clipped_under_its_weight() -> None:
    # ratio 2 > 1 + 0.2 with A > 0: the clipped term 1.2 * A is taken (no gradient), then weighted
    logp = torch.tensor([[LN2]], requires_grad=True)
    out = clipped_policy_loss(
        logp,
        torch.zeros(1, 1),
        torch.tensor([1.0]),
        torch.ones(1, 1),
        is_weight=torch.tensor([[0.5]]),
    )
    assert out.loss.item() == pytest.approx(-0.5 * 1.2)
    out.loss.backward()
    assert logp.grad is not None and logp.grad.item() == 0.0


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_the_step_records_the_gap_to_a_sampler_that_differs(mode: str) -> None:
    """The sampler's recorded log-probs are the learner's minus ln 4 on one turn (the sampler
    found its tokens 4 times less likely): the gap is ln 4 there, the weights are truncated at
    the cap on that turn only."""
    model = tiny_model()
    turns = {"score": score_turns, "generate": generate_turns}[mode](model)
    shifted = turns[0]
    if mode == "score":
        shifted = msgspec.structs.replace(shifted, logp=shifted.logp - LN4)
    else:
        logps = tuple(lp - LN4 for lp in shifted.token_logps)
        shifted = msgspec.structs.replace(shifted, token_logps=logps, logp=sum(logps))
    samples = [Sample(t, 1.0) for t in [shifted, *turns[1:]]]
    trainee = Trainee(model, TOKENIZER, CPU, reference=False)
    stats = grpo_step(trainee, samples, request(tis_cap=2.0), seed=0)
    assert stats.gap is not None
    shifted_tokens = 1 if mode == "score" else len(shifted.response_ids)
    total = 3 if mode == "score" else sum(len(t.response_ids) for t in turns)
    assert stats.gap.tokens == total
    assert stats.gap.abs_max == pytest.approx(LN4, abs=1e-5)
    assert stats.gap.abs_mean == pytest.approx(LN4 * shifted_tokens / total, abs=1e-5)
    assert stats.tis_clip_frac == pytest.approx(shifted_tokens / total)
    off = grpo_step(Trainee(tiny_model(), TOKENIZER, CPU, False), samples, request(), seed=0)
    assert off.tis_clip_frac is None and off.gap is not None
    assert off.gap.abs_max == pytest.approx(LN4, abs=1e-5)  # recorded whether TIS is on or off


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_with_a_faithful_sampler_tis_changes_nothing(mode: str) -> None:
    """When the sampler's log-probs are the learner's, every weight is 1 and the ratio's
    reference is the same: the update with a cap equals the one without (to float noise)."""
    plain, capped = tiny_model(), tiny_model()
    turns = {"score": score_turns, "generate": generate_turns}[mode](plain)
    samples = [Sample(t, a) for t, a in zip(turns, (1.0, -0.5, 0.25), strict=True)]
    a = grpo_step(Trainee(plain, TOKENIZER, CPU, False), samples, request(epochs=2), seed=0)
    b = grpo_step(
        Trainee(capped, TOKENIZER, CPU, False), samples, request(epochs=2, tis_cap=2.0), seed=0
    )
    assert b.tis_clip_frac == 0.0 and a.gap is not None and a.gap.abs_max < 1e-5
    start = dict(tiny_model().named_parameters())
    moved = 0.0
    for (name, p), q in zip(plain.named_parameters(), capped.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name
        moved = max(moved, float((p - start[name]).detach().abs().max()))
    assert moved > 1e-4  # the update did move the weights


@pytest.mark.parametrize("cap", [None, 2.0])
def test_the_gap_leaves_out_what_an_older_version_drew(cap: float | None) -> None:
    """The samples of version 0 trained by version 1 differ from it by the policy's change, not
    the sampler's: only the current version's samples are compared."""
    model = tiny_model()
    turns = generate_turns(model)
    shifted = [
        msgspec.structs.replace(t, token_logps=tuple(x - LN4 for x in t.token_logps)) for t in turns
    ]
    old = [msgspec.structs.replace(t, policy_version=0) for t in shifted[:2]]
    new = [msgspec.structs.replace(shifted[2], policy_version=1)]
    samples = [Sample(t, 1.0) for t in [*old, *new]]
    stats = grpo_step(Trainee(model, TOKENIZER, CPU, False), samples, request(tis_cap=cap), 0, 1)
    assert stats.gap is not None and stats.gap.tokens == len(turns[2].response_ids)
    stale_only = [Sample(t, 1.0) for t in old]
    none = grpo_step(
        Trainee(tiny_model(), TOKENIZER, CPU, False), stale_only, request(tis_cap=cap), 0, 1
    )
    assert none.gap is None  # nothing of the current version to compare
