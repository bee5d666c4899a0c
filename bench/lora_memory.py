"""What a real policy's trained state costs with and without LoRA, computed (not measured) from
the architectures of Qwen2.5-1.5B-Instruct and Qwen2.5-7B-Instruct on torch's meta device:
nothing is downloaded or allocated. The counts are exact (the adapters peft adds to the model
transformers builds from the config); the bytes are what the weights, gradients and AdamW's two
moments take, without activations or the inference backend's caches.

    python bench/lora_memory.py [--r 64] [--alpha 128]

docs/MODEL.md ("Real models on a GPU") quotes its output.
"""

from __future__ import annotations

import argparse
import warnings

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Qwen2Config

# the config.json values of the two Hugging Face checkpoints (the fields that size the model)
QWEN = {
    "Qwen2.5-1.5B-Instruct": dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "Qwen2.5-7B-Instruct": dict(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    ),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GB = 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--r", type=int, default=64)
    parser.add_argument("--alpha", type=int, default=128)
    args = parser.parse_args()
    lora = LoraConfig(r=args.r, lora_alpha=args.alpha, target_modules=TARGETS)
    print(
        f"| model | parameters | LoRA r={args.r} (all linear layers) | full fp32 learner "
        "| LoRA learner, bf16 base |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, fields in QWEN.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(Qwen2Config(**fields))
        total = sum(p.numel() for p in model.parameters())
        with warnings.catch_warnings():  # peft reads a property transformers 5 deprecates
            warnings.simplefilter("ignore", FutureWarning)
            adapted = get_peft_model(model, lora)  # as agents.models.tuning.with_lora does
        trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
        full = 16 * total  # fp32 weights, gradients and two AdamW moments
        low = 2 * total + 16 * trainable  # bf16 frozen base; fp32 adapters, grads, moments
        print(
            f"| {name} | {total / 1e9:.2f}B | {trainable / 1e6:.1f}M "
            f"({100 * trainable / total:.1f}%) | {full / GB:.1f} GB | {low / GB:.1f} GB |"
        )


if __name__ == "__main__":
    main()
