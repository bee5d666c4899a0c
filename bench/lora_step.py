"""One learner update of the embedded default model (CPU, one torch thread), full parameters vs
LoRA vs LoRA over a bf16 base with activation checkpointing, with and without TIS: the
settings interleaved round by round so that a shared machine's load falls on all of them alike;
medians and their ratio to the full-parameter update.

    python bench/lora_step.py [--rounds 7]

The samples are fixed "generate" turns (64 prompts of 256 random token ids, responses of 4),
trained in minibatches of 16 (4 optimiser steps). docs/MODEL.md quotes a run of it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.events.policy import ActionSampled, GradientRequested  # noqa: E402
from agents.learning.update import Sample, Trainee, grpo_step  # noqa: E402
from agents.models.embedded import EmbeddedSpec, ensure_embedded  # noqa: E402
from agents.models.tuning import LoraSettings, prepare  # noqa: E402
from stores.model_dirs import load_model_dir  # noqa: E402

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = LoraSettings(r=8, alpha=16, targets=ALL)
SETTINGS: dict[str, dict[str, Any]] = {
    "full, float32": dict(lora=None, dtype="float32", checkpointing=False, tis=None),
    "full, float32, TIS": dict(lora=None, dtype="float32", checkpointing=False, tis=2.0),
    "LoRA r=8, float32": dict(lora=LORA, dtype="float32", checkpointing=False, tis=None),
    "LoRA r=8, bf16 base": dict(lora=LORA, dtype="bfloat16", checkpointing=False, tis=None),
    "LoRA r=8, bf16 base, checkpointing": dict(
        lora=LORA, dtype="bfloat16", checkpointing=True, tis=None
    ),
}


def samples(vocab: int) -> list[Sample]:
    rng = random.Random(0)
    out = []
    for i in range(64):
        prompt = tuple(rng.randrange(3, vocab) for _ in range(256))
        response = tuple(rng.randrange(3, vocab) for _ in range(4))
        turn = ActionSampled(
            episode=f"ep{i // 8}",
            worker="w",
            turn=i % 8,
            policy_version=0,
            action="a",
            prompt_ids=prompt,
            response_ids=response,
            token_logps=(-2.0,) * 4,
            logp=-8.0,
            temperature=1.0,
            mode="generate",
        )
        out.append(Sample(turn, 1.0 if i % 2 else -1.0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_dir = ensure_embedded(EmbeddedSpec())
    trainees = {}
    for name, s in SETTINGS.items():
        net, tokenizer = load_model_dir(model_dir, torch.device("cpu"))
        net = prepare(
            net, lora=s["lora"], dtype=s["dtype"], checkpointing=s["checkpointing"], seed=0
        )
        trainees[name] = Trainee(net, tokenizer, torch.device("cpu"), reference=False)
    batch = samples(len(next(iter(trainees.values())).tokenizer))
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for k in range(args.rounds):
        for name, s in SETTINGS.items():
            req = GradientRequested(
                update=k, episodes=(), advantages=(), lr=1e-4, minibatch=16, tis_cap=s["tis"]
            )
            start = time.perf_counter()
            grpo_step(trainees[name], batch, req, seed=k)
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["full, float32"])
    print("| setting | trainable params | optimiser bytes | update s (median) | vs full |")
    print("|---|---:|---:|---:|---:|")
    for name in SETTINGS:
        used = trainees[name].memory()
        med = statistics.median(times[name])
        print(
            f"| {name} | {used.trainable_params:,} / {used.total_params:,} "
            f"| {used.optimizer_bytes:,} | {med:.2f} | {med / base:.2f}x |"
        )


if __name__ == "__main__":
    main()
