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


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
"""A plain chat template that keeps every message, system included (what coevo's model
checks ask of a tokenizer), for the tokenizers tests build themselves."""


def tiny_tokenizer(words: list[str], vocab_size: int = 300) -> Any:
    """A byte-level BPE tokenizer trained on ``words`` (so each is a few tokens at most), with
    ``<pad>``, ``<eos>`` and ``<unk>`` and :data:`CHAT_TEMPLATE`: a tokenizer transformers reads
    back as written under a Qwen2 config (it rebuilds a ``qwen2`` checkpoint's tokenizer as a
    Qwen2 BPE from the file's vocabulary and merges, so a word-level one loses its words)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<eos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([" ".join(words)] * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
