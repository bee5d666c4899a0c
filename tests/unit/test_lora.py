"""LoRA, bf16 and activation checkpointing on a tiny Qwen2 (``agents.models.tuning``): the
learner's step trains the adapters only and leaves the base bit for bit; the optimiser holds
moments for the adapters only; a checkpoint is the adapters' safetensors, loads on the base model
with peft and resumes training exactly; the adapters' initialisation is a function of its seed
and leaves torch's global RNG alone; bf16 trains on CPU (with LoRA) or is refused; checkpointing
recomputes activations and gives the same gradients."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from peft import PeftModel
from test_updates import (
    CPU,
    TOKENIZER,
    calls_of,
    ext_request,
    generate_turns,
    request,
    score_turns,
    tiny_model,
)
from transformers.modeling_layers import GradientCheckpointingLayer

from agents.learning.update import Sample, Trainee, grpo_step
from agents.memory.extractor import ExtractorModel, ExtractorSettings, extractor_step
from agents.models.tuning import (
    LoraSettings,
    check_train_dtype,
    learning_mode,
    load_adapted,
    lora_seed,
    memory_use,
    prepare,
    with_lora,
)
from engine.errors import ModelUnavailable
from stores.checkpoints import (
    ADAPTER_FILE,
    OPTIMIZER_FILE,
    WEIGHTS_FILE,
    DirCheckpoints,
    MemoryCheckpoints,
    optimizer_tensors,
    param_digest,
    restore_checkpoint,
    trained_state,
)

LORA = LoraSettings(r=4, alpha=8, targets=["q_proj", "v_proj"])
# tiny_model: hidden 32, 2 layers, 4 heads of 8, 2 KV heads: q_proj 32 -> 32, v_proj 32 -> 16
ADAPTER_PARAMS = 2 * (4 * (32 + 32) + 4 * (32 + 16))


class _Tokenizer:
    pad_token_id = 0

    def save_pretrained(self, path: Path) -> None:
        (Path(path) / "tokenizer.json").write_text("{}")


def adapted(seed: int = 7, **kw: object) -> torch.nn.Module:
    settings = LoraSettings(**{**{"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]}, **kw})  # type: ignore[arg-type]
    return with_lora(tiny_model(), settings, seed)


def samples_of(model: torch.nn.Module, mode: str) -> list[Sample]:
    turns = {"score": score_turns, "generate": generate_turns}[mode](model)
    return [Sample(t, a) for t, a in zip(turns, (1.0, -0.5, 0.25), strict=True)]


def split(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(base, adapters): copies of the frozen and the trainable parameters."""
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return base, lora


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_a_step_trains_the_adapters_and_leaves_the_base_bit_for_bit(mode: str) -> None:
    model = adapted()
    base, lora = split(model)
    assert len(lora) == 8 and all("lora_" in n for n in lora)
    assert sum(p.numel() for p in lora.values()) == ADAPTER_PARAMS
    trainee = Trainee(model, TOKENIZER, CPU, reference=False)
    stats = grpo_step(trainee, samples_of(model, mode), request(), seed=0)
    assert stats.samples == 3 and stats.grad_norm > 0
    base2, lora2 = split(model)
    assert all(torch.equal(base[n], base2[n]) for n in base)
    assert any(not torch.equal(lora[n], lora2[n]) for n in lora)  # B moved off zero
    assert trainee.optimizer is not None
    state_of = trainee.optimizer.state
    assert {id(p) for p in state_of} == {id(p) for p in model.parameters() if p.requires_grad}
    used = memory_use(model, trainee.optimizer, CPU)
    total = sum(p.numel() for p in tiny_model().parameters()) + ADAPTER_PARAMS
    assert (used.trainable_params, used.total_params) == (ADAPTER_PARAMS, total)
    # AdamW: two float32 moments per adapter parameter and a float32 step per tensor
    assert used.optimizer_bytes == 2 * 4 * ADAPTER_PARAMS + 4 * 8
    assert used.peak_bytes is None  # measured on CUDA only


def test_the_initialisation_is_a_function_of_its_seed_and_leaves_the_global_rng() -> None:
    base = tiny_model()  # (which seeds torch itself)
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = with_lora(base, LoraSettings(r=4, alpha=8, targets=["q_proj", "v_proj"]), 1)
    after = torch.rand(3)  # the global stream went on as if nothing had been drawn
    assert torch.equal(before, after)
    assert param_digest(a) == param_digest(adapted(seed=1)) != param_digest(adapted(seed=2))
    assert lora_seed(5, "policy") != lora_seed(5, "extractor")
    # B starts at zero: the adapted model computes what the base does
    ids = torch.tensor([[3, 4, 5, 6]])
    assert torch.equal(a(input_ids=ids).logits, tiny_model()(input_ids=ids).logits)


def test_a_target_that_names_no_module_is_refused() -> None:
    with pytest.raises(ModelUnavailable, match=r"lora targets \['qkv'\] name no module"):
        adapted(targets=["q_proj", "qkv"])


def test_an_adapter_checkpoint_loads_on_the_base_model_and_resumes_exactly(tmp_path: Path) -> None:
    model = adapted()
    trainee = Trainee(model, _Tokenizer(), CPU, reference=False)
    samples = samples_of(model, "generate")
    grpo_step(trainee, samples, request(), seed=0)
    store = DirCheckpoints(tmp_path / "checkpoints")
    assert trainee.optimizer is not None
    name = store.save(1, model, _Tokenizer(), optimizer_tensors(model, trainee.optimizer))
    saved = tmp_path / name
    assert (saved / ADAPTER_FILE).is_file() and not (saved / WEIGHTS_FILE).exists()
    assert (saved / "adapter_config.json").is_file()
    digest = param_digest(model)

    # peft's own loader puts the adapters on a fresh base model: the same function
    loaded = load_adapted(tiny_model(), str(saved))
    assert isinstance(loaded, PeftModel)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    assert not torch.equal(loaded(input_ids=ids).logits, tiny_model()(input_ids=ids).logits)

    # a resume: a fresh adapted model takes the checkpoint and its moments, then trains on
    # exactly as the uninterrupted one does
    again = Trainee(adapted(), _Tokenizer(), CPU, reference=False)
    restore_checkpoint(store, name, again.model, again.optimiser(0.0), digest)
    assert param_digest(again.model) == digest
    grpo_step(trainee, samples, request(), seed=1)
    grpo_step(again, samples, request(), seed=1)
    assert param_digest(again.model) == param_digest(model)

    (saved / OPTIMIZER_FILE).unlink()  # the weights alone: fresh moments would train on
    again = Trainee(adapted(), _Tokenizer(), CPU, reference=False)
    with pytest.raises(ModelUnavailable, match=r"optimizer\.safetensors is missing"):
        restore_checkpoint(store, name, again.model, again.optimiser(0.0), digest)
    other = adapted(seed=99)  # another version 0: the checkpoint loads, the digest tells
    with pytest.raises(ModelUnavailable, match="the weights have digest"):
        restore_checkpoint(
            store, name, other, Trainee(other, _Tokenizer(), CPU, False).optimiser(0.0), "0" * 32
        )


def test_adapter_state_must_match_the_model_and_memory_checkpoints_keep_adapters_only() -> None:
    model = adapted()
    store = MemoryCheckpoints()
    name = store.save(1, model, None)
    assert set(store.load(name)) == set(trained_state(model))
    assert all("lora_" in k for k in store.load(name))
    with pytest.raises(ModelUnavailable, match="does not match the model's adapters"):
        from stores.checkpoints import load_weights

        load_weights(adapted(targets=["q_proj"]), store.load(name))


def test_the_probes_copy_of_an_adapted_extractor_loads_back(tmp_path: Path) -> None:
    """``coevo probe`` of a run whose extractor trains adapters copied the whole state dict,
    which an adapted model refuses, and looked for ``model.safetensors`` where its checkpoints
    hold ``adapter_model.safetensors``: every such probe failed."""
    from scenarios.probe_setup import _state  # pyright: ignore[reportPrivateUsage]
    from stores.checkpoints import load_weights, param_digest, weights_file

    model = adapted()
    before = param_digest(model)
    state = _state(model)
    with torch.no_grad():
        for _, p in (kv for kv in model.named_parameters() if "lora_" in kv[0]):
            p.add_(1.0)
    load_weights(model, state)
    assert param_digest(model) == before
    name = DirCheckpoints(tmp_path / "ckpt", keep=2).save(1, model, _Tokenizer())
    assert weights_file(tmp_path / name).name == ADAPTER_FILE


def test_the_kl_reference_of_an_adapted_model_is_the_base_with_adapters_off() -> None:
    model = adapted()
    trainee = Trainee(model, TOKENIZER, CPU, reference=True)
    assert trainee.reference is None and trainee.has_reference  # no copy of the model
    samples = samples_of(model, "generate")
    stats = grpo_step(trainee, samples, request(kl_coef=0.1, epochs=3), seed=0)
    assert stats.ref_kl > 0  # the adapters moved the policy away from the base
    ids = torch.tensor([[3, 4, 5]])
    with trainee.reference_model() as ref:
        assert torch.equal(ref(input_ids=ids).logits, tiny_model()(input_ids=ids).logits)
    assert not torch.equal(model(input_ids=ids).logits, tiny_model()(input_ids=ids).logits)


def test_bf16_trains_adapters_in_float32_over_a_bf16_base_on_cpu() -> None:
    model = prepare(tiny_model(), lora=LORA, dtype="bfloat16", checkpointing=False, seed=3)
    dtypes = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert dtypes == {torch.bfloat16}
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    base, lora = split(model)
    stats = grpo_step(
        Trainee(model, TOKENIZER, CPU, False), samples_of(model, "score"), request(), 0
    )
    assert stats.grad_norm > 0 and stats.gap is not None
    base2, lora2 = split(model)
    assert all(torch.equal(base[n], base2[n]) for n in base)
    assert any(not torch.equal(lora[n], lora2[n]) for n in lora)


def test_bf16_without_lora_or_on_a_gpu_without_bf16_is_refused() -> None:
    check_train_dtype("float32", CPU, lora=False, bf16_supported=False)
    check_train_dtype("bfloat16", CPU, lora=True, bf16_supported=False)  # software bf16
    with pytest.raises(ModelUnavailable, match="needs lora"):
        check_train_dtype("bfloat16", CPU, lora=False, bf16_supported=True)
    with pytest.raises(ModelUnavailable, match="does not compute in bf16"):
        check_train_dtype("bfloat16", torch.device("cuda"), lora=True, bf16_supported=False)


@pytest.mark.parametrize("lora", [None, LORA])
def test_checkpointing_recomputes_activations_and_gives_the_same_gradients(
    lora: LoraSettings | None,
) -> None:
    plain = prepare(tiny_model(), lora=lora, dtype="float32", checkpointing=False, seed=3)
    ckpt = prepare(tiny_model(), lora=lora, dtype="float32", checkpointing=True, seed=3)
    layers = [m for m in ckpt.modules() if isinstance(m, GradientCheckpointingLayer)]
    assert all(m.gradient_checkpointing for m in layers)
    assert len(layers) == 2
    calls = SimpleNamespace(n=0)
    for layer in layers:
        inner = layer._gradient_checkpointing_func

        def counted(*args: object, _inner: object = inner, **kw: object) -> object:
            calls.n += 1
            return _inner(*args, **kw)  # type: ignore[operator]

        layer._gradient_checkpointing_func = counted
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    for model in (plain, ckpt):
        learning_mode(model)
        assert not any(m.training for m in model.modules() if m not in layers)
        model(input_ids=ids).logits.float().log_softmax(-1)[0, :, 9].sum().backward()
    assert calls.n == 2  # each layer went through the checkpoint
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.allclose(p.grad, q.grad, atol=1e-6), name
    calls.n = 0
    ckpt.eval()  # the old eval-mode learner: transformers would not checkpoint at all
    ckpt(input_ids=ids).logits.sum().backward()
    assert calls.n == 0


def test_the_extractors_cispo_step_trains_its_adapters_only() -> None:
    ext = ExtractorModel(adapted(), TOKENIZER, ExtractorSettings())
    base, lora = split(ext.model)
    calls = calls_of(ext)
    stats = extractor_step(ext, calls, ext_request(calls, [1.0, -1.0, 0.5]))
    assert stats.samples == 3 and stats.grad_norm > 0
    base2, lora2 = split(ext.model)
    assert all(torch.equal(base[n], base2[n]) for n in base)
    assert any(not torch.equal(lora[n], lora2[n]) for n in lora)
    assert ext.memory().trainable_params == ADAPTER_PARAMS


def test_a_missing_target_names_the_layers_lora_can_adapt_conv1d_included() -> None:
    """GPT-2's attention and MLP are transformers' ``Conv1D``, which LoRA adapts: the message
    listed only ``nn.Linear`` (``['lm_head']``), as if nothing else could be adapted."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from agents.models.tuning import LoraSettings, with_lora
    from engine.errors import ModelUnavailable

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2))
    with pytest.raises(ModelUnavailable, match=r"'c_attn', 'c_fc', 'c_proj', 'lm_head'"):
        with_lora(gpt2, LoraSettings(r=2), seed=0)
    adapted = with_lora(gpt2, LoraSettings(r=2, targets=["c_attn", "c_proj"]), seed=0)
    assert any(".lora_" in name for name, _ in adapted.named_parameters())
