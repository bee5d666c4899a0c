"""The learner with and without LoRA on the embedded model (CPU): the quickstart scenario cut to a
few updates, run once per setting, and what its ``PolicyUpdated`` events record: the trainable
parameters, the optimiser's bytes, the gap between the learner's and the sampler's log-probs
(the ``"hf"`` backend: the same module) and the share of tokens TIS truncated. Update times of
whole runs on a shared machine are not comparable: ``bench/lora_step.py`` times the update
itself, interleaved.

    python bench/lora_learner.py --out /tmp/lora-bench [--episodes 160]

docs/MODEL.md ("Real models on a GPU") quotes a run of it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.events.policy import PolicyUpdated  # noqa: E402
from stores.lmdb_log import LmdbEventLog  # noqa: E402

ALL = '["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]'
SETTINGS = {
    "full, float32": [],
    "LoRA r=8, float32": [f"policy.lora={{r = 8, alpha = 16, targets = {ALL}}}"],
    "LoRA r=8, bf16 base, checkpointing": [
        f"policy.lora={{r = 8, alpha = 16, targets = {ALL}}}",
        'policy.dtype="bfloat16"',
        "policy.gradient_checkpointing=true",
    ],
    "LoRA r=8, float32, TIS cap 2": [
        f"policy.lora={{r = 8, alpha = 16, targets = {ALL}}}",
        "grpo.tis_cap=2.0",
    ],
}


def updates(run: Path) -> list[PolicyUpdated]:
    log = LmdbEventLog.open(run / "log", writable=False)
    try:
        return [e.event for e in log.read(0, None) if isinstance(e.event, PolicyUpdated)]
    finally:
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--episodes", type=int, default=160)
    args = parser.parse_args()
    print(
        "| setting | trainable / total params | optimiser bytes | gap mean / max abs "
        "| TIS truncated |"
    )
    print("|---|---:|---:|---:|---:|")
    for i, (name, extra) in enumerate(SETTINGS.items()):
        run = args.out / f"run{i}"
        cmd = [
            sys.executable,
            "-m",
            "scenarios.cli",
            "run",
            str(ROOT / "scenarios" / "quickstart.toml"),
        ]
        cmd += ["--out", str(run), "--quiet", "--set", f"run.episodes={args.episodes}"]
        cmd += ["--set", "eval.every=0", "--set", "eval.episodes=8"]
        for item in extra:
            cmd += ["--set", item]
        subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        done = updates(run)
        u = done[-1]
        gaps = [x.gap_abs_mean or 0.0 for x in done]
        top = max(x.gap_abs_max or 0.0 for x in done)
        tis = [x.tis_clip_frac for x in done if x.tis_clip_frac is not None]
        print(
            f"| {name} | {u.trainable_params:,} / {u.total_params:,} | {u.optimizer_bytes:,} "
            f"| {statistics.mean(gaps):.1e} / {top:.1e} "
            f"| {statistics.mean(tis) if tis else '-'} |"
        )


if __name__ == "__main__":
    main()
