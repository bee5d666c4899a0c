"""The specs of the local models, and their checks: :class:`EmbeddedSpec` (the embedded policy
model, :mod:`agents.models.embedded`) and :class:`OpsSpec` (the extractor's operation stage,
:mod:`agents.models.extractor_base`).

Kept apart from the modules that build the models, which import torch and transformers: a
scenario's settings are checked (``coevo validate``) without either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec


class TrainSpec(Protocol):
    """What :func:`batch_plan`, :func:`lr_at` and :func:`train` read of a spec: an
    :class:`agents.models.embedded.EmbeddedSpec` or an
    :class:`agents.models.extractor_base.OpsSpec`."""

    @property
    def steps(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def lr(self) -> float: ...
    @property
    def warmup(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def prompt_loss_weight(self) -> float: ...


def check_ranges(
    spec: object, ranges: Mapping[str, tuple[float, float]], shares: Sequence[str] = ()
) -> None:
    """Validate the fields of ``spec`` named in ``ranges`` (``name: (low, high)``, inclusive)
    and the ``shares`` (fractions between 0 and 1).

    Raises:
        ValueError: the first field out of its range, named with the range.
    """
    for name, (low, high) in ranges.items():
        if not low <= getattr(spec, name) <= high:
            raise ValueError(f"{name} must be between {low} and {high}, got {getattr(spec, name)}")
    for name in shares:
        if not 0.0 <= getattr(spec, name) <= 1.0:
            raise ValueError(f"{name} must be between 0 and 1, got {getattr(spec, name)}")


def check_schedule(spec: TrainSpec) -> None:
    """Validate the training fields that :class:`agents.models.embedded.EmbeddedSpec` and
    :class:`agents.models.extractor_base.OpsSpec` share (their ranges of counts are checked apart).

    Raises:
        ValueError: a bad ``lr`` (0 < lr <= 1) or ``prompt_loss_weight``, or ``warmup > steps``.
    """
    if not (math.isfinite(spec.lr) and 0 < spec.lr <= 1):  # (as the methods' lr)
        raise ValueError(f"lr must be > 0 and <= 1, got {spec.lr}")
    if spec.warmup > spec.steps:
        raise ValueError(f"warmup must be <= steps, got {spec.warmup} > {spec.steps}")
    if not (math.isfinite(spec.prompt_loss_weight) and 0 <= spec.prompt_loss_weight <= 100):
        raise ValueError(
            f"prompt_loss_weight must be >= 0 and <= 100, got {spec.prompt_loss_weight}"
        )


class EmbeddedSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything that determines the built model; with :data:`FORMAT_VERSION`, its hash is
    the cache key.

    Attributes:
        world, world_options: the world to learn, as for :func:`load_world`.
        hidden_size, layers, heads, kv_heads, intermediate_size, max_positions: the Qwen2
            shape (input embeddings tied to the output layer).
        episodes_per_family, explorer_share: pre-training play per family, and its share
            played by the Explorer (the rest by RandomAgent).
        eval_variants: the last train variants per family, kept out of pre-training and
            played for the quality checks; eval_notes: fresh episodes per family whose greedy
            notes are checked.
        steps, batch_size, lr, warmup, seed: AdamW with linear warmup and cosine decay to a
            tenth; the seed of play, batches and initial weights.
        window: the ``window`` of :func:`agents.models.prompts.turn_messages`.
        reflection_share: the share of batches (so of samples) that are reflections.
        prompt_loss_weight: the weight of the LM loss on prompt tokens.
        note_episodes_per_family: pre-training episodes per family with notes shown, played
            by the Explorer following them (:func:`agents.models.pretrain_play.note_episodes`).
        note_tries: Explorer episodes per variant searched for a success to write its note.
        entry_share: the share of those episodes showing notes as entries (one line, no
            ``found``), the rest as written.
        probe_variants, probe_seeds: the note probe (:mod:`agents.models.note_probe`): held-out
            variants per family and episodes per variant and condition (0 variants: none).
    """

    world: str = "minilab"
    world_options: dict[str, Any] = msgspec.field(default_factory=dict)
    hidden_size: int = 96
    layers: int = 3
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 192
    max_positions: int = 1024
    episodes_per_family: int = 200
    explorer_share: float = 0.8
    eval_variants: int = 4
    eval_notes: int = 4
    steps: int = 6000
    batch_size: int = 8
    lr: float = 3e-3
    warmup: int = 40
    seed: int = 0
    window: int = 4
    reflection_share: float = 0.25
    prompt_loss_weight: float = 1.0
    note_episodes_per_family: int = 200
    note_tries: int = 64
    entry_share: float = 0.5
    probe_variants: int = 20
    probe_seeds: int = 2

    def __post_init__(self) -> None:
        check_spec(self)


# the highs are far beyond what a CPU build can do: a typo must not allocate terabytes
_EMBEDDED_RANGES = {
    "hidden_size": (1, 8192),
    "layers": (1, 128),
    "heads": (1, 256),
    "kv_heads": (1, 256),
    "intermediate_size": (1, 65_536),
    "max_positions": (16, 131_072),  # half of them hold a cut prompt: head, "...", end
    "episodes_per_family": (1, 1_000_000),
    "steps": (1, 10_000_000),
    "batch_size": (1, 65_536),
    "eval_variants": (0, 100_000),
    "eval_notes": (0, 100_000),
    "warmup": (0, 10_000_000),
    "seed": (0, 2**63 - 1),
    "window": (0, 100),
    "note_episodes_per_family": (0, 1_000_000),
    "note_tries": (1, 100_000),
    "probe_variants": (0, 100_000),
    "probe_seeds": (1, 1000),
}


def check_spec(spec: EmbeddedSpec) -> None:
    """Validate ``spec`` (its constructor does).

    Raises:
        ValueError: a field is out of range or the shape is inconsistent.
    """
    if not spec.world:
        raise ValueError("world must be a non-empty name")
    check_ranges(spec, _EMBEDDED_RANGES, ("explorer_share", "reflection_share", "entry_share"))
    if spec.hidden_size % (2 * spec.heads):
        raise ValueError(
            "hidden_size must be a multiple of 2 * heads (rotary heads have an even size), "
            f"got {spec.hidden_size} and {spec.heads}"
        )
    if spec.heads % spec.kv_heads:
        raise ValueError(
            f"heads must be a multiple of kv_heads, got {spec.heads} and {spec.kv_heads}"
        )
    check_schedule(spec)


class OpsSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything that determines the operation stage; with the base model's cache key and
    :data:`OPS_FORMAT_VERSION`, its hash is the cache key.

    Attributes:
        episodes_per_family: fresh episodes played per family on the base model's train
            variants (never its held-back ones); each gives one extraction and one merge sample.
        steps, batch_size, lr, warmup, seed: AdamW with linear warmup and cosine decay to a
            tenth; the seed of play, teaching prompts and batches.
        merge_share: the share of steps that train on merge samples.
        guided_share: the share of extraction prompts that show an entry.
        duplicate_share: the share of merge chunks with a note repeated under another id.
        merge_chunk: the most entries in a merge chunk (at least 2).
        max_ops: what the extraction prompt asks for (as ``complementary.max_ops``).
        checks: fresh episodes per family, on the held-back variants, whose greedy answers
            are checked before and after.
        max_new_tokens: the length of the checked answers (as ``complementary.max_new_tokens``).
        prompt_loss_weight: the weight of the LM loss on prompt tokens.
    """

    episodes_per_family: int = 150
    steps: int = 1200
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 40
    seed: int = 0
    merge_share: float = 0.3
    guided_share: float = 0.5
    duplicate_share: float = 0.5
    merge_chunk: int = 5
    max_ops: int = 3
    checks: int = 8
    max_new_tokens: int = 64
    prompt_loss_weight: float = 0.0

    def __post_init__(self) -> None:
        check_ranges(self, _OPS_RANGES, ("merge_share", "guided_share", "duplicate_share"))
        check_schedule(self)


_OPS_RANGES = {
    "episodes_per_family": (1, 100_000),
    "steps": (1, 10_000_000),
    "batch_size": (1, 4096),
    "max_ops": (1, 100),
    "max_new_tokens": (1, 4096),
    "merge_chunk": (2, 100),
    "warmup": (0, 10_000_000),
    "seed": (0, 2**63 - 1),
    "checks": (0, 100_000),
}
