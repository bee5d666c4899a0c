"""Inference backends: what samples actions and text for the policy and the extractor.

A backend answers two kinds of batch, each request with its own random stream, and returns the
token ids and log-probs that the events record:

- :meth:`Backend.score`: score every admissible action after its prompt and draw one ("score"
  mode);
- :meth:`Backend.generate`: sample a response token by token ("generate" mode, the policy's
  reflections, the extractor's answers);

and takes new trained weights with :meth:`Backend.load` (a full state dict, or a LoRA adapter's,
as :func:`stores.checkpoints.trained_state` writes them).

``[policy] backend`` names one from :data:`BACKENDS`. ``"hf"`` (:class:`HfBackend`) runs the
``transformers`` model in-process through :mod:`agents.models.policy`: the same module, the same
float32 maths as the learner, so the sampler's log-probs equal the learner's up to batching
noise. Its scoring packs a batch's requests several to a row (:mod:`agents.models.packing`) and
runs the output layer at the scored places only. Torch and the model code are imported when a
backend first runs, so naming one (``coevo validate``) loads neither. A backend that samples
elsewhere (vLLM: another engine, bf16 kernels) returns log-probs that differ from the
learner's; the learner records the gap per update and corrects for it with truncated importance
sampling (``[grpo] tis_cap``, :mod:`agents.methods.tis`). The vLLM backend is not part of this
build: it needs a GPU to be tested, and an untested backend is not shipped.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from stores.checkpoints import load_weights

if TYPE_CHECKING:  # torch and the model code are imported where a backend runs: a scenario's
    import torch  # backend name is checked (coevo validate) without loading them

    from agents.models.policy import Choice

Ids = Sequence[int]


class Backend(Protocol):
    """What the inference actor and the extractor sample with (blocking; run in a thread)."""

    name: str

    def score(
        self,
        prompts: Sequence[Ids],
        candidates: Sequence[Sequence[Ids]],
        rngs: Sequence[random.Random],
        *,
        temperature: float,
        pad_id: int,
    ) -> list[Choice]:
        """Score each prompt's candidates and draw one per prompt from its own stream."""
        ...

    def generate(
        self,
        prompts: Sequence[Ids],
        rngs: Sequence[random.Random],
        *,
        temperature: float,
        max_new_tokens: int,
        eos_ids: frozenset[int],
        pad_id: int,
    ) -> list[tuple[list[int], list[float]]]:
        """Sample one response per prompt: its ids (ending at the first of ``eos_ids``, or
        cut at ``max_new_tokens``) and each token's log-prob."""
        ...

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Take new trained weights (the model's, or its adapters').

        Raises:
            ModelUnavailable: ``state`` does not fit the model.
        """
        ...


class HfBackend:
    """The ``transformers`` model in this process (``[policy] backend = "hf"``).

    Args:
        model: a causal LM in eval mode (with or without peft adapters).
        device: where it runs.
    """

    name = "hf"

    def __init__(self, model: Any, device: torch.device) -> None:
        self.model = model
        self.device = device

    def score(
        self,
        prompts: Sequence[Ids],
        candidates: Sequence[Sequence[Ids]],
        rngs: Sequence[random.Random],
        *,
        temperature: float,
        pad_id: int,
    ) -> list[Choice]:
        from agents.models.policy import score_and_choose

        return score_and_choose(
            self.model,
            prompts,
            candidates,
            rngs,
            temperature=temperature,
            pad_id=pad_id,
            device=self.device,
        )

    def generate(
        self,
        prompts: Sequence[Ids],
        rngs: Sequence[random.Random],
        *,
        temperature: float,
        max_new_tokens: int,
        eos_ids: frozenset[int],
        pad_id: int,
    ) -> list[tuple[list[int], list[float]]]:
        from agents.models.policy import generate

        return generate(
            self.model,
            prompts,
            rngs,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            eos_ids=eos_ids,
            pad_id=pad_id,
            device=self.device,
        )

    def load(self, state: dict[str, torch.Tensor]) -> None:
        load_weights(self.model, {k: v.to(self.device) for k, v in state.items()})


BACKENDS: dict[str, Callable[[Any, torch.device], Backend]] = {"hf": HfBackend}
"""Backends by the name ``[policy] backend`` gives, each built from the loaded model and its
device."""


def backend_named(name: str) -> Callable[[Any, torch.device], Backend]:
    """The backend called ``name``.

    Raises:
        ValueError: no backend of that name in this build.
    """
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"no inference backend {name!r} in this build; backends: {sorted(BACKENDS)}"
        ) from None
