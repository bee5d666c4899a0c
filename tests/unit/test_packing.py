"""Packing scoring requests several to a row, sharing the beginnings of prompts.

What holds exactly: every candidate token sees exactly its own prompt and the tokens of its own
candidate before it, at the positions they have alone (checked on the mask, for generated
requests); the output layer at the scored places only gives the same logits, bit for bit, as
the whole model's logits at those places; every request is in exactly one row, no row is over
its width. What holds to float32's rounding only: the scores equal those of one request per row
(the attention's sums are grouped by a row's places, which packing moves), and choices drawn
from them are the same.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import Qwen2ForCausalLM

from agents.models.packing import Packed, assign, pack, request_lengths
from agents.models.policy import candidate_scores, score_and_choose, scored_logits
from agents.models.tuning import LoraSettings, with_lora
from agents.testing.models import tiny_qwen2

CPU = torch.device("cpu")
BASE = [5, 6, 7]  # a beginning every generated prompt has (the system message's part)


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Prompts that begin alike (some equal, some a prefix of another) and their candidates."""
    stems = draw(st.lists(st.lists(st.integers(2, 9), max_size=6), min_size=1, max_size=3))
    n = draw(st.integers(1, 8))
    prompts = []
    for _ in range(n):
        stem = draw(st.sampled_from(stems))
        tail = draw(st.lists(st.integers(2, 9), max_size=4))
        prompts.append([*BASE, *stem, *tail])
    cands = [
        draw(st.lists(st.lists(st.integers(2, 9), min_size=1, max_size=4), min_size=1, max_size=4))
        for _ in range(n)
    ]
    return prompts, cands


def seen_by(packed: Packed, row: int, place: int) -> list[tuple[int, int]]:
    """The (position, token) of every place ``place`` attends to, in order."""
    mask = packed.attention[row, 0, place] == 0
    ids, pos = packed.input_ids[row], packed.positions[row]
    return [(int(pos[j]), int(ids[j])) for j in torch.nonzero(mask)[:, 0].tolist()]


@given(requests())
def test_each_candidate_token_sees_its_prompt_and_its_own_candidate_only(
    reqs: tuple[list[list[int]], list[list[list[int]]]],
) -> None:
    prompts, cands = reqs
    packed = pack(prompts, cands, pad_id=0)
    expected: list[tuple[int, list[tuple[int, int]]]] = []  # (token, what predicts it sees)
    for prompt, cs in zip(prompts, cands, strict=True):
        for cand in cs:
            seq = [*prompt, *cand]
            for t in range(len(cand)):
                expected.append((cand[t], list(enumerate(seq[: len(prompt) + t]))))
    order = sorted(range(len(expected)), key=lambda k: int(packed.owner[k]))  # stable
    got = [
        (int(packed.tokens[k]), seen_by(packed, int(packed.rows[k]), int(packed.at[k])))
        for k in order
    ]
    assert got == expected
    assert packed.counts == tuple(len(c) for c in cands)


@given(requests())
def test_every_request_is_in_one_row_and_no_row_overflows(
    reqs: tuple[list[list[int]], list[list[list[int]]]],
) -> None:
    prompts, cands = reqs
    lengths = request_lengths(prompts, cands)
    rows = assign(prompts, lengths, max(lengths))
    assert sorted(i for row in rows for i in row) == list(range(len(prompts)))
    packed = pack(prompts, cands, pad_id=0)
    assert packed.input_ids.shape == (len(rows), max(lengths))
    stored = sum(int((packed.attention[b, 0].diagonal() == 0).sum()) for b in range(len(rows)))
    assert stored == packed.input_ids.numel()  # every place, padding included, sees itself


def test_a_request_longer_than_a_row_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        assign([[1, 2]], [9], 8)


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    return tiny_qwen2(layers=2, heads=4, kv_heads=2, positions=512, tie_word_embeddings=True)


def generated(seed: int, n: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    rng = random.Random(seed)
    goals = [[rng.randrange(2, 50) for _ in range(rng.randrange(2, 12))] for _ in range(4)]
    prompts = [
        [*BASE, *rng.choice(goals), *(rng.randrange(2, 50) for _ in range(rng.randrange(0, 30)))]
        for _ in range(n)
    ]
    cands = [
        [
            [rng.randrange(2, 50) for _ in range(rng.randrange(1, 5))]
            for _ in range(rng.randrange(1, 7))
        ]
        for _ in range(n)
    ]
    return prompts, cands


def test_the_head_at_the_scored_places_gives_the_whole_models_logits_bit_for_bit(
    model: Qwen2ForCausalLM,
) -> None:
    prompts, cands = generated(1, 24)
    packed = pack(prompts, cands, pad_id=0)
    with torch.no_grad():
        head_only = scored_logits(model, packed, CPU)
        whole = model(
            input_ids=packed.input_ids,
            attention_mask=packed.attention,
            position_ids=packed.positions,
        ).logits[packed.rows, packed.at]
    assert torch.equal(head_only, whole)


def one_per_row(model: Qwen2ForCausalLM, prompt: list[int], cands: list[list[int]]) -> list[float]:
    """The scores with the request alone in its row (the layout before packing)."""
    packed = pack([prompt], [cands], pad_id=0)
    assert packed.input_ids.shape[0] == 1
    with torch.no_grad():
        flat, _ = candidate_scores(model, packed, CPU)
    return flat.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_packed_scores_equal_one_request_per_row_to_float32_rounding(
    model: Qwen2ForCausalLM, seed: int
) -> None:
    prompts, cands = generated(seed, 32)
    packed = pack(prompts, cands, pad_id=0)
    assert packed.input_ids.shape[0] < len(prompts)  # requests did share rows
    with torch.no_grad():
        flat, _ = candidate_scores(model, packed, CPU)
    alone = [s for p, c in zip(prompts, cands, strict=True) for s in one_per_row(model, p, c)]
    assert flat.tolist() == pytest.approx(alone, rel=1e-5, abs=1e-5)
    rngs = [random.Random(seed * 100 + i) for i in range(len(prompts))]
    batched = score_and_choose(model, prompts, cands, rngs, temperature=1.0, pad_id=0, device=CPU)
    for i, (p, c) in enumerate(zip(prompts, cands, strict=True)):
        (single,) = score_and_choose(
            model, [p], [c], [random.Random(seed * 100 + i)], temperature=1.0, pad_id=0, device=CPU
        )
        assert batched[i].index == single.index


def test_a_lora_adapted_model_is_scored_head_only_as_its_whole_forward_pass() -> None:
    # peft wraps the causal LM: its ``.model`` is the whole LM, not the decoder, so the head-only
    # path must reach the decoder and the head through their accessors
    adapted = with_lora(
        tiny_qwen2(layers=2, heads=4, kv_heads=2, positions=512, seed=1), LoraSettings(r=4), seed=3
    )
    with torch.no_grad():  # B starts at zero (the base's output): make the adapters count
        for name, param in adapted.named_parameters():
            if ".lora_B." in name:
                param.normal_(0.0, 0.5)
    prompts, cands = generated(2, 16)
    packed = pack(prompts, cands, pad_id=0)
    with torch.no_grad():
        head_only = scored_logits(adapted, packed, CPU)
        whole = adapted(
            input_ids=packed.input_ids,
            attention_mask=packed.attention,
            position_ids=packed.positions,
        ).logits[packed.rows, packed.at]
    assert torch.equal(head_only, whole)


def test_scoring_makes_its_tensors_in_float32_whatever_torch_s_default_dtype() -> None:
    """torch's default dtype is process-wide, and building a half-precision model sets it while
    it builds (transformers does); scoring in another thread meanwhile made its mask and
    scores in that dtype and failed. Its tensors are float32 whatever the default."""
    model = tiny_qwen2(12, hidden=16)
    prompts, cands = [[5, 6, 7, 8], [5, 6, 9]], [[[2, 3], [4]], [[3], [2, 2, 2]]]
    with torch.no_grad():
        want, _ = candidate_scores(model, pack(prompts, cands, pad_id=0), CPU)
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float16)
        try:
            packed = pack(prompts, cands, pad_id=0)
            got, _ = candidate_scores(model, packed, CPU)
        finally:
            torch.set_default_dtype(old)
    assert packed.attention.dtype == torch.float32 and got.dtype == torch.float32
    assert torch.equal(got, want)


def test_a_model_whose_attention_packing_cannot_stand_in_for_is_found() -> None:
    """Packing replaces the model's attention mask with a block mask: a sliding window shorter
    than the prompt (Mistral's), a recurrent model (RWKV, which ignores masks) scored wrong
    without a sign (0.03-0.6 nats here), and Bloom failed on the mask mid-run. Full causal
    attention, with or without the head at the scored places only, passes."""
    from transformers import (
        BloomConfig,
        BloomForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        RwkvConfig,
        RwkvForCausalLM,
    )

    from agents.models.policy import packed_scoring_fault

    def mistral(window: int | None) -> MistralForCausalLM:
        return MistralForCausalLM(MistralConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, sliding_window=window,
            max_position_embeddings=256,
        )).eval()  # fmt: skip

    torch.manual_seed(0)
    assert packed_scoring_fault(tiny_qwen2(100, hidden=32), CPU, 0) is None
    assert packed_scoring_fault(mistral(None), CPU, 0) is None
    # logits in the thousands round to more than 1e-4 nats in float32: full causal attention
    # still (a fixed 1e-4 refused it as a sliding window); a window still shows at that scale
    for scale in (1e4, 1e5):
        loud, slid_loud = tiny_qwen2(100, hidden=32).eval(), mistral(16)
        with torch.no_grad():
            loud.model.norm.weight.mul_(scale)
            slid_loud.model.norm.weight.mul_(scale)
        assert packed_scoring_fault(loud, CPU, 0) is None, scale
        assert "differs" in (packed_scoring_fault(slid_loud, CPU, 0) or ""), scale
    # a prompt twice the window: one only 16 places past a window of 100 changed some random
    # models' scores by less than the tolerance
    for window, length in ((16, 48), (100, 216)):
        slid = packed_scoring_fault(mistral(window), CPU, 0)
        assert slid is not None and "differs from the model's own forward pass" in slid
        assert f"(a {length}-token prompt;" in slid
    rwkv = RwkvForCausalLM(RwkvConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
        context_length=128,
    )).eval()  # fmt: skip
    assert "differs" in (packed_scoring_fault(rwkv, CPU, 0) or "")
    bloom = BloomForCausalLM(BloomConfig(vocab_size=100, hidden_size=32, n_layer=1, n_head=2))
    assert "fails on this architecture" in (packed_scoring_fault(bloom.eval(), CPU, 0) or "")


def outside_head_only(arch: str) -> torch.nn.Module:
    """A random model of a type outside ``HEAD_ONLY``: GPT-2, or Gemma 2 (its logits
    soft-capped after the head, which the model applies itself)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(4)
    if arch == "gpt2":
        net = GPT2LMHeadModel(GPT2Config(vocab_size=60, n_embd=16, n_layer=1, n_head=2))
    else:
        config = Gemma2Config(
            vocab_size=60,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            final_logit_softcapping=2.0,
            sliding_window=4096,
            attn_implementation="eager",
        )
        net = Gemma2ForCausalLM(config)
    return net.eval()


@pytest.mark.parametrize("arch", ["gpt2", "gemma2"])
def test_a_model_outside_the_head_only_list_runs_its_head_at_the_scored_places_only(
    arch: str,
) -> None:
    """A large vocabulary's logits at every place of every row took gigabytes (a 152k
    vocabulary on a 1-layer GPT-2: 10.6 GB): "kept" asks the model for the scored places
    (its own soft-capping applied), "packed", as logs written before it ran, did not."""
    net = outside_head_only(arch)
    prompts, cands = generated(3, 24)
    packed = pack(prompts, cands, pad_id=0)
    places = len({(int(r), int(a)) for r, a in zip(packed.rows, packed.at, strict=True)})
    assert places < len(packed.at)  # some places repeat (a prompt's last, per candidate)
    heads: list[tuple[int, ...]] = []
    hook = net.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: heads.append(tuple(args[0].shape))
    )
    with torch.no_grad():
        kept = scored_logits(net, packed, CPU)
        old = scored_logits(net, packed, CPU, layout="packed")
        whole = net(
            input_ids=packed.input_ids,
            attention_mask=packed.attention,
            position_ids=packed.positions,
        ).logits[packed.rows, packed.at]
    hook.remove()
    assert heads[0] == (places, 16)  # the head ran at the scored places, each once
    assert heads[1] == (*packed.input_ids.shape, 16)  # everywhere, as before
    assert torch.equal(old, whole)
    assert torch.allclose(kept, whole, rtol=0, atol=1e-5)
    scores, _ = candidate_scores(net, packed, CPU)
    want, _ = candidate_scores(net, packed, CPU, layout="packed")
    assert torch.allclose(scores, want, rtol=0, atol=1e-4)


def test_a_model_whose_forward_cannot_keep_logits_runs_its_head_everywhere() -> None:
    class Plain(torch.nn.Module):  # a causal LM whose forward takes no logits_to_keep
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, **kwargs: object) -> object:
            assert "logits_to_keep" not in kwargs
            return self.inner(**kwargs)

    net = outside_head_only("gpt2")
    packed = pack(*generated(5, 8), pad_id=0)
    with torch.no_grad():
        got = scored_logits(Plain(net), packed, CPU)
        want = scored_logits(net, packed, CPU, layout="packed")
    assert torch.equal(got, want)


def test_a_learner_s_gradient_through_kept_logits_is_packed_s() -> None:
    from agents.models.policy import chosen_action_logps

    net = outside_head_only("gpt2")
    prompts, cands = generated(6, 12)
    grads = []
    for layout in ("kept", "packed"):
        net.zero_grad()
        logp = chosen_action_logps(
            net,
            prompts,
            cands,
            [0] * len(prompts),
            temperature=1.0,
            pad_id=0,
            device=CPU,
            layout=layout,
        )
        logp.sum().backward()
        grads.append([p.grad.clone() for p in net.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_generation_and_its_learner_run_the_head_where_a_token_is_drawn_or_trained(
    arch: str,
) -> None:
    """A generating model's prompts took its output layer at every place, in the prefill
    and in the learner's pass (a 152k vocabulary over thousands of places: gigabytes): the
    prefill keeps the last place, "kept" the places that predict a response token."""
    from agents.models.policy import generate, response_logps

    net = outside_head_only("gpt2") if arch == "gpt2" else tiny_qwen2(60, seed=4)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    heads: list[tuple[int, ...]] = []
    hook = net.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: heads.append(tuple(args[0].shape))
    )
    rngs = [random.Random(k) for k in range(3)]
    drawn = generate(
        net,
        prompts,
        rngs,
        temperature=1.0,
        max_new_tokens=4,
        eos_ids=frozenset({1}),
        pad_id=0,
        device=CPU,
    )
    assert heads[0][:2] == (3, 1)  # the prefill: each prompt's last place
    responses = [ids for ids, _ in drawn]
    heads.clear()
    got, mask = response_logps(net, prompts, responses, temperature=1.0, pad_id=0, device=CPU)
    old, old_mask = response_logps(
        net, prompts, responses, temperature=1.0, pad_id=0, device=CPU, layout="packed"
    )
    hook.remove()
    width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    assert heads[0][0] == sum(map(len, responses)) and heads[1][:2] == (3, width)
    assert torch.equal(mask, old_mask)
    torch.testing.assert_close(got, old, rtol=0, atol=1e-5)
    for b, (ids, lps) in enumerate(drawn):  # what was drawn is what the learner reads
        assert got[b, : len(ids)].tolist() == pytest.approx(lps, abs=1e-5)
