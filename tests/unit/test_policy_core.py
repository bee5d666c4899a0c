"""The policy's model core: packed candidate scoring equals scoring each candidate alone,
sampling does not depend on batching, and the learner's log-probs equal the sampler's."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch
from transformers import Qwen2ForCausalLM

from agents.models.policy import (
    chosen_action_logps,
    generate,
    log_softmax,
    pack,
    response_logps,
    sample_index,
    score_and_choose,
)
from agents.testing.models import tiny_qwen2

CPU = torch.device("cpu")
PROMPTS = [[3, 4, 5, 6], [7, 8], [9, 10, 11, 12, 13, 14]]
CANDIDATES = [[[5, 6], [7], [8, 9, 10]], [[11], [12, 13]], [[1, 2], [3, 4], [5], [6]]]


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    return tiny_qwen2(layers=2, heads=4, kv_heads=2, tie_word_embeddings=True)


def naive_score(model: Qwen2ForCausalLM, prompt: list[int], cand: list[int]) -> float:
    with torch.no_grad():
        logp = model(torch.tensor([prompt + cand])).logits.log_softmax(-1)[0]
    return sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(cand))


def rngs(*seeds: int) -> list[random.Random]:
    return [random.Random(s) for s in seeds]


def test_packed_scores_equal_scoring_each_candidate_alone(model: Qwen2ForCausalLM) -> None:
    choices = score_and_choose(
        model, PROMPTS, CANDIDATES, rngs(0, 1, 2), temperature=1.0, pad_id=0, device=CPU
    )
    for prompt, cands, choice in zip(PROMPTS, CANDIDATES, choices, strict=True):
        expected = [naive_score(model, prompt, c) for c in cands]
        assert choice.scores == pytest.approx(expected, abs=1e-4)
        chosen = cands[choice.index]
        assert sum(choice.token_logps) == pytest.approx(expected[choice.index], abs=1e-4)
        assert len(choice.token_logps) == len(chosen)


def test_sampling_does_not_depend_on_batching(model: Qwen2ForCausalLM) -> None:
    for seed in range(20):
        seeds = [seed * 3, seed * 3 + 1, seed * 3 + 2]
        batched = score_and_choose(
            model, PROMPTS, CANDIDATES, rngs(*seeds), temperature=1.0, pad_id=0, device=CPU
        )
        alone = [
            score_and_choose(model, [p], [c], rngs(s), temperature=1.0, pad_id=0, device=CPU)[0]
            for p, c, s in zip(PROMPTS, CANDIDATES, seeds, strict=True)
        ]
        assert [c.index for c in batched] == [c.index for c in alone]
        assert [c.logp for c in batched] == pytest.approx([c.logp for c in alone], abs=1e-6)


def test_generation_does_not_depend_on_batching(model: Qwen2ForCausalLM) -> None:
    kw = dict(temperature=1.0, max_new_tokens=6, eos_ids=frozenset({1}), pad_id=0, device=CPU)
    batched = generate(model, PROMPTS, rngs(5, 6, 7), **kw)
    alone = [
        generate(model, [p], rngs(s), **kw)[0] for p, s in zip(PROMPTS, (5, 6, 7), strict=True)
    ]
    assert [ids for ids, _ in batched] == [ids for ids, _ in alone]
    for (_, a), (_, b) in zip(batched, alone, strict=True):
        assert a == pytest.approx(b, abs=1e-5)


def test_learner_logps_equal_the_sampler_logps(model: Qwen2ForCausalLM) -> None:
    choices = score_and_choose(
        model, PROMPTS, CANDIDATES, rngs(3, 4, 5), temperature=0.7, pad_id=0, device=CPU
    )
    logp = chosen_action_logps(
        model,
        PROMPTS,
        CANDIDATES,
        [c.index for c in choices],
        temperature=0.7,
        pad_id=0,
        device=CPU,
    )  # (B, 1)
    assert logp.shape == (3, 1)
    assert logp[:, 0].tolist() == pytest.approx([c.logp for c in choices], abs=1e-5)
    drawn = generate(
        model,
        PROMPTS,
        rngs(1, 2, 3),
        temperature=1.0,
        max_new_tokens=5,
        eos_ids=frozenset({1}),
        pad_id=0,
        device=CPU,
    )
    logp, mask = response_logps(
        model, PROMPTS, [ids for ids, _ in drawn], temperature=1.0, pad_id=0, device=CPU
    )
    for b, (ids, lps) in enumerate(drawn):
        assert mask[b].sum() == len(ids)
        assert logp[b, : len(ids)].tolist() == pytest.approx(lps, abs=1e-5)


def test_generation_ends_at_the_first_of_several_eos_ids(model: Qwen2ForCausalLM) -> None:
    """A response ends at any of the model's eos ids (an instruct model's turn end and its
    ``<|endoftext|>``), as transformers' ``generate`` stops; the tokens before are the same."""
    kw: dict[str, Any] = dict(temperature=1.0, max_new_tokens=12, pad_id=0, device=CPU)
    (ids, logps), *_ = generate(model, PROMPTS[:1], rngs(9), eos_ids=frozenset({1}), **kw)
    later = next(i for i, t in enumerate(ids) if i > 0 and t not in ids[:i])
    ended = generate(model, PROMPTS[:1], rngs(9), eos_ids=frozenset({1, ids[later]}), **kw)
    assert ended == [(ids[: later + 1], logps[: later + 1])]


def test_candidate_logps_carry_gradient(model: Qwen2ForCausalLM) -> None:
    logp = chosen_action_logps(
        model, PROMPTS, CANDIDATES, [0, 1, 2], temperature=1.0, pad_id=0, device=CPU
    )
    logp.sum().backward()
    norm = sum(float(p.grad.norm()) for p in model.parameters() if p.grad is not None)
    model.zero_grad(set_to_none=True)
    assert norm > 1e-3


def test_sample_index_inverts_the_cdf() -> None:
    scores = [math.log(0.2), math.log(0.3), math.log(0.5)]
    assert sample_index(scores, 1.0, 0.0)[0] == 0
    assert sample_index(scores, 1.0, 0.19)[0] == 0
    assert sample_index(scores, 1.0, 0.21)[0] == 1
    assert sample_index(scores, 1.0, 0.49)[0] == 1
    index, logp = sample_index(scores, 1.0, 0.51)
    assert index == 2 and logp == pytest.approx(math.log(0.5))
    assert sample_index(scores, 0.0, 0.99) == (2, pytest.approx(math.log(0.5)))
    # temperature 2 flattens: probabilities proportional to sqrt(p)
    flat = log_softmax(scores, 2.0)
    z = sum(math.sqrt(p) for p in (0.2, 0.3, 0.5))
    assert [math.exp(x) for x in flat] == pytest.approx([math.sqrt(p) / z for p in (0.2, 0.3, 0.5)])


def test_sample_index_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="no scores"):
        sample_index([], 1.0, 0.5)
    with pytest.raises(ValueError, match="temperature"):
        sample_index([0.0], -1.0, 0.5)
    with pytest.raises(ValueError, match="u must be"):
        sample_index([0.0], 1.0, 1.0)


def test_pack_rejects_empty_input() -> None:
    with pytest.raises(ValueError, match="prompt"):
        pack([[]], [[[1]]], 0)
    with pytest.raises(ValueError, match="candidate"):
        pack([[1]], [[]], 0)
    with pytest.raises(ValueError, match="2 prompts but 1"):
        pack([[1], [2]], [[[1]]], 0)


@pytest.mark.parametrize("layout", ["kept", "packed", "rows"])
def test_a_request_with_very_many_candidates_is_scored_in_passes_to_the_same_numbers(
    model: Qwen2ForCausalLM, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """Past the budget of candidate tokens a request's candidates are scored over several
    passes (a world offering thousands of actions made one row of them all, quadratic in its
    width); the scores, the draws and the learner's log-probs are those of one pass."""
    import agents.models.policy as policy

    many = [[1 + k % 40, 2 + k % 37] for k in range(60)]  # 120 candidate tokens
    prompts, candidates = [*PROMPTS, [20, 21, 22]], [*CANDIDATES, many]
    whole, tokens = policy.scores_in_passes(
        model, prompts, candidates, 0, CPU, layout=layout, budget=10**6
    )
    calls: list[int] = []
    real = policy.candidate_scores

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(policy, "candidate_scores", counted)
    split, split_tokens = policy.scores_in_passes(
        model, prompts, candidates, 0, CPU, layout=layout, budget=25
    )
    assert len(calls) == 1 + 5  # the three small requests together, the big one in 5 chunks
    assert split.shape == whole.shape == (sum(len(c) for c in candidates),)
    assert torch.allclose(split, whole, atol=1e-5)
    assert [len(t) for t in split_tokens] == [len(t) for t in tokens]
    assert all(a == pytest.approx(b, abs=1e-5) for a, b in zip(split_tokens, tokens, strict=True))
    monkeypatch.setattr(policy, "CANDIDATE_PLACES", 25)
    seeds = rngs(0, 1, 2, 3)
    passes = score_and_choose(
        model, prompts, candidates, seeds, temperature=1.0, pad_id=0, device=CPU
    )
    monkeypatch.setattr(policy, "CANDIDATE_PLACES", 10**6)
    one = score_and_choose(
        model, prompts, candidates, rngs(0, 1, 2, 3), temperature=1.0, pad_id=0, device=CPU
    )
    assert [c.index for c in passes] == [c.index for c in one]
    monkeypatch.setattr(policy, "CANDIDATE_PLACES", 25)
    chosen = [c.index for c in one]
    logp = chosen_action_logps(
        model, prompts, candidates, chosen, temperature=1.0, pad_id=0, device=CPU, layout=layout
    )
    logp.sum().backward()  # the joined softmax keeps its graph through every pass
    assert logp.shape == (4, 1)
    assert logp[3, 0].item() == pytest.approx(one[3].logp, abs=1e-4)
    model.zero_grad()


def _saved_bytes_and_grads(
    model: Qwen2ForCausalLM, prompts: list, candidates: list, budget: int
) -> tuple[int, list[torch.Tensor]]:
    """Bytes of the tensors autograd keeps for the backward pass of the candidates' scores
    (outside any checkpointed region), and the parameters' gradients of their sum."""
    import agents.models.policy as policy

    saved: list[int] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        flat, _ = policy.scores_in_passes(
            model, prompts, candidates, 0, CPU, with_tokens=False, budget=budget
        )
    flat.sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return sum(saved), grads


def test_split_passes_keep_one_pass_of_activations_and_the_same_gradient(
    model: Qwen2ForCausalLM,
) -> None:
    """A learner's request with thousands of actions kept every pass's activations until the
    backward pass (17 GB for one update on a 5,000-action world): its passes are
    checkpointed, so only their scores are kept, and the gradient is the one pass's."""
    many = [[1 + k % 40, 2 + k % 37, 3 + k % 11] for k in range(200)]  # 600 candidate tokens
    prompts, candidates = [[20, 21, 22, 23]], [many]
    one_bytes, one_grads = _saved_bytes_and_grads(model, prompts, candidates, 10**6)
    split_bytes, split_grads = _saved_bytes_and_grads(model, prompts, candidates, 60)
    assert split_bytes < one_bytes / 20  # the scores and the packed inputs, no activations
    assert len(split_grads) == len(one_grads)
    for a, b in zip(split_grads, one_grads, strict=True):
        assert float((a - b).abs().max()) <= 1e-4 * float(b.abs().max())  # float rounding


def test_split_passes_keep_no_packing_until_the_backward_pass(
    model: Qwen2ForCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint keeps its arguments until the backward pass: each pass kept its packing,
    with its (B, 1, L, L) float mask (~300 MB a request on a 3,000-action world, 7.7 GB an
    update), which no saved-tensor hook sees. The passes pack inside their checkpoint."""
    import gc
    import weakref

    import agents.models.policy as policy

    made: list[weakref.ref] = []
    real = policy.pack

    def recorded(*args, **kwargs):
        packed = real(*args, **kwargs)
        made.append(weakref.ref(packed.attention))  # the packing's big part
        return packed

    monkeypatch.setattr(policy, "pack", recorded)
    many = [[1 + k % 40, 2 + k % 37, 3 + k % 11] for k in range(200)]
    flat, _ = policy.scores_in_passes(
        model, [[20, 21, 22, 23]], [many], 0, CPU, with_tokens=False, budget=60
    )
    gc.collect()
    kept = sum(ref() is not None for ref in made)
    flat.sum().backward()
    model.zero_grad(set_to_none=True)
    assert len(made) >= 10 and kept == 0
