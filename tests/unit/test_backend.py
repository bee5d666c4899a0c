"""The inference backend interface (``agents.models.backend``): the policy's runner and the
extractor sample only through it, the ``"hf"`` backend answers what the model core does, new
weights reach a backend through ``load``, and an unknown backend is refused by name."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from agents.acting.inference import ActSettings, PolicyRunner
from agents.events.memory import ReflectionRequested
from agents.events.policy import ActionRequested
from agents.memory.extractor import ExtractorModel, ExtractorSettings
from agents.models.backend import BACKENDS, Backend, HfBackend, backend_named
from agents.models.embedded import (
    EmbeddedSpec,
    build_tokenizer,
    episode_texts,
    prompt_texts,
    word_pieces,
)
from agents.models.policy import Choice, generate, score_and_choose
from agents.models.pretrain_play import pretrain_episodes
from agents.models.prompts import turn_messages
from agents.models.tuning import LoraSettings, with_lora
from agents.testing.models import tiny_qwen2
from scenarios.worlds.minilab import MiniLab
from stores.checkpoints import trained_state

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    play = pretrain_episodes(MiniLab(), EmbeddedSpec(episodes_per_family=4, eval_variants=1))
    texts = [t for ep in play for t in episode_texts(ep)] + list(prompt_texts(play[0]))
    return build_tokenizer(*word_pieces(texts), 512)


def tiny(tokenizer: Any) -> Any:
    return tiny_qwen2(
        len(tokenizer), hidden=16, positions=2048, pad_token_id=tokenizer.pad_token_id
    )


class Recording:
    """A backend that samples through another and records what it was asked."""

    name = "recording"

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self.loaded: list[dict[str, torch.Tensor]] = []

    def score(
        self,
        prompts: Sequence[Sequence[int]],
        candidates: Sequence[Sequence[Sequence[int]]],
        rngs: Sequence[random.Random],
        *,
        temperature: float,
        pad_id: int,
    ) -> list[Choice]:
        self.calls.append(f"score {len(prompts)}")
        return self.inner.score(prompts, candidates, rngs, temperature=temperature, pad_id=pad_id)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        rngs: Sequence[random.Random],
        *,
        temperature: float,
        max_new_tokens: int,
        eos_ids: frozenset[int],
        pad_id: int,
    ) -> list[tuple[list[int], list[float]]]:
        self.calls.append(f"generate {len(prompts)}")
        return self.inner.generate(
            prompts,
            rngs,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            eos_ids=eos_ids,
            pad_id=pad_id,
        )

    def load(self, state: dict[str, torch.Tensor]) -> None:
        self.loaded.append(state)
        self.inner.load(state)


def requests() -> list[ActionRequested]:
    out = []
    for turn, obs in enumerate(["you see a box.", "you see a chest and a bin.", "it is dark."]):
        messages = turn_messages("find the apple.", [], obs)
        out.append(
            ActionRequested(
                episode="ep0",
                worker="w",
                turn=turn,
                messages=tuple((m["role"], m["content"]) for m in messages),
                admissible=("open box", "take apple", "open bin", "look"),
                seed=100 + turn,
            )
        )
    return out


def reflection(seed: int) -> ReflectionRequested:
    messages = turn_messages("find the apple.", [], "you see a box.")
    return ReflectionRequested(
        episode="ep0",
        worker="w",
        slot="train/fetch/0",
        messages=tuple((m["role"], m["content"]) for m in messages),
        key="you see a box.",
        score=0.5,
        success=False,
        seed=seed,
    )


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_the_runner_samples_only_through_its_backend(tokenizer: Any, mode: str) -> None:
    model = tiny(tokenizer)
    settings = ActSettings(mode=mode, temperature=1.0, max_new_tokens=6, tip_tokens=5)
    plain = PolicyRunner(model, tokenizer, settings)
    assert isinstance(plain.backend, HfBackend) and plain.backend.model is model
    recording = Recording(HfBackend(model, CPU))
    runner = PolicyRunner(None, tokenizer, settings, backend=recording)  # no model of its own
    assert runner.answer(requests()) == plain.answer(requests())
    assert runner.reflect([reflection(1), reflection(2)]) == plain.reflect(
        [reflection(1), reflection(2)]
    )
    assert recording.calls == [f"{mode} 3", "generate 2"]
    state = {k: v + 0.01 for k, v in model.state_dict().items()}
    runner.load(state, 4)
    assert runner.version == 4 and recording.loaded == [state]
    assert torch.equal(model.state_dict()["lm_head.weight"], state["lm_head.weight"])


def test_the_hf_backend_answers_what_the_model_core_does(tokenizer: Any) -> None:
    model = tiny(tokenizer)
    backend = HfBackend(model, CPU)
    prompts = [[5, 6, 7], [8, 9]]
    cands = [[[10], [11, 12]], [[13, 14], [15], [16]]]

    def rngs() -> list[random.Random]:
        return [random.Random(1), random.Random(2)]

    got = backend.score(prompts, cands, rngs(), temperature=1.0, pad_id=0)
    want = score_and_choose(model, prompts, cands, rngs(), temperature=1.0, pad_id=0, device=CPU)
    assert got == want
    eos = tokenizer.eos_token_id
    kw: dict[str, Any] = dict(temperature=1.0, max_new_tokens=5, eos_ids=frozenset({eos}), pad_id=0)
    assert backend.generate(prompts, [random.Random(3), random.Random(4)], **kw) == generate(
        model, prompts, [random.Random(3), random.Random(4)], device=CPU, **kw
    )


def test_the_extractor_gives_a_separate_backend_its_trained_adapters(tokenizer: Any) -> None:
    lora = LoraSettings(r=2, alpha=4, targets=["q_proj", "v_proj"])
    trained = with_lora(tiny(tokenizer), lora, 1)
    ext = ExtractorModel(trained, tokenizer, ExtractorSettings())
    ext.sync()  # the hf backend samples from the trained module itself: nothing to copy
    assert isinstance(ext.backend, HfBackend) and ext.backend.model is trained
    sampler = Recording(HfBackend(with_lora(tiny(tokenizer), lora, 1), CPU))
    ext = ExtractorModel(trained, tokenizer, ExtractorSettings(), backend=sampler)
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)  # as an update would
    ext.sync()
    (state,) = sampler.loaded
    assert set(state) == set(trained_state(trained)) and all("lora_" in k for k in state)
    ids = torch.tensor([[5, 6, 7]])
    inner = sampler.inner
    assert isinstance(inner, HfBackend)
    assert torch.equal(inner.model(input_ids=ids).logits, trained(input_ids=ids).logits)


def test_an_unknown_backend_is_refused_by_name() -> None:
    assert backend_named("hf") is HfBackend and sorted(BACKENDS) == ["hf"]
    refused = r"no inference backend 'vllm' in this build; backends: \['hf'\]"
    with pytest.raises(ValueError, match=refused):
        backend_named("vllm")


def test_actions_the_tokenizer_encodes_alike_are_found(tokenizer: Any) -> None:
    """A tokenizer that loses characters (a BPE without byte fallback, a word-level
    vocabulary) encoded "put clay jug in oven" as "put clay mug in oven" for an outside tester:
    the two score alike, and nothing said so. The runner names the first such pair (the
    inference actor logs it once)."""
    model = tiny(tokenizer)
    settings = ActSettings(mode="score", temperature=1.0, max_new_tokens=6, tip_tokens=5)
    plain = PolicyRunner(model, tokenizer, settings)
    plain.answer(requests())
    assert plain.alike is None
    lossy = PolicyRunner(model, tokenizer, settings)
    with lossy._tokenizing:
        ids = lossy._response_ids("open box")
    lossy._responses["open bin"] = list(ids)  # what a tokenizer that loses "x"/"n" gives
    lossy.answer(requests())
    assert lossy.alike == ("open box", "open bin")


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_a_policy_whose_weights_turned_nan_stops_instead_of_acting_on_nan(
    tokenizer: Any, mode: str
) -> None:
    """A NaN in the weights (a damaged checkpoint loaded mid-run) gave NaN scores that chose
    the last action, and NaN token log-probs, for a whole run that exited 0; now the answer
    and the reflection that read them fail naming the version. The load-time check refuses
    such a model before the run acts."""
    from agents.acting.inference import PolicyNotFinite
    from agents.models.policy import output_fault

    model = tiny(tokenizer)
    settings = ActSettings(mode=mode, temperature=1.0, max_new_tokens=6, tip_tokens=5)
    runner = PolicyRunner(model, tokenizer, settings)
    assert output_fault(model, CPU) is None
    state = {k: v.clone() for k, v in model.state_dict().items()}
    norm = next(k for k in state if k.endswith("norm.weight"))
    state[norm][0] = float("nan")
    runner.load(state, 3)
    with pytest.raises(PolicyNotFinite, match=r"the policy \(version 3\) gave a log-probability"):
        runner.answer(requests())
    with pytest.raises(PolicyNotFinite, match="episode ep0's tip"):
        runner.reflect([reflection(1)])
    assert "gives a logit of nan on a 16-token prompt" in (output_fault(model, CPU) or "")


def test_an_extractor_whose_weights_turned_nan_stops_instead_of_writing_entries(
    tokenizer: Any,
) -> None:
    """An extractor with a NaN weight wrote "entryentry..." entries from NaN log-probs for a
    whole run that exited 0 (the check covered the policy only)."""
    from agents.acting.inference import PolicyNotFinite
    from agents.events.extractor import ExtractionRequested

    model = tiny(tokenizer)
    ext = ExtractorModel(model, tokenizer, ExtractorSettings(max_new_tokens=5))
    messages = turn_messages("find the apple.", [], "you see a box.")
    req = ExtractionRequested(
        episode="ep0", worker="w", slot="train/fetch/0", entry=-1, success=True, score=1.0,
        seed=3, messages=tuple((m["role"], m["content"]) for m in messages),
    )  # fmt: skip
    assert len(ext.answer([req], ["x1"])) == 1
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if n.endswith("norm.weight"))[0] = float("nan")
    with pytest.raises(PolicyNotFinite, match=r"the extractor \(version 0\) gave a log-prob"):
        ext.answer([req], ["x2"])
