"""A tiny random Qwen2 causal LM for tests of code that runs a model: the same weights for the
same arguments on one machine kind, and small enough to run forward and backward passes in
milliseconds on a CPU."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(
    vocab_size: int = 50,
    *,
    hidden: int = 32,
    layers: int = 1,
    heads: int = 2,
    kv_heads: int = 1,
    positions: int = 128,
    seed: int = 0,
    **config: Any,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 model in eval mode (dropout off), its weights drawn after
    ``torch.manual_seed(seed)``.

    Args:
        vocab_size: the tokenizer's size (``len(tokenizer)``).
        hidden: hidden size; the MLP's is twice it.
        layers, heads, kv_heads: decoder layers, attention and key-value heads.
        positions: ``max_position_embeddings``.
        **config: any other :class:`Qwen2Config` field (``tie_word_embeddings``,
            ``pad_token_id``, ``attention_dropout``, ...).
    """
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=positions,
        **config,
    )
    return Qwen2ForCausalLM(cfg).eval()
