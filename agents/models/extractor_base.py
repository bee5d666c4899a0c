"""The extractor's starting weights for Complementary RL: the embedded base model, taught the
operation format of :mod:`agents.memory.extraction` (``complementary.extractor = "embedded-ops"``).

The embedded base model was pre-trained to write notes, not operations: started from it, the
extractor answers every extraction with a bare note (read as one ``add`` only through
``plain_add``) and every merge request with something malformed, so updates and merges never
happen and RL has no operation to reinforce. The papers start from an instruction-tuned model
that can follow the operation format; the honest equivalent here is a short supervised stage on
the world's own episodes, built once per (base model, :class:`OpsSpec`) and cached like the
base model.

The targets teach the *format* with a simple rule, derived from the episode's text alone (its
hindsight note, :func:`agents.acting.scripted.hindsight_note`) and the entries shown; which
operations actually help the actor is left for RL to find:

- **extraction** (the prompt of :func:`agents.memory.extraction.extract_messages`, the entry shown
  drawn from other episodes' notes of the family, or none): ``add: <note>`` when no entry was
  shown, ``return`` when the entry already says the note, ``update <id>: <note>`` after a
  success (the note of a success supersedes the entry), ``add: <note>`` after a failure (the
  entry is kept beside what failed);
- **merge** (the prompt of :func:`agents.memory.extraction.merge_messages` over a chunk of notes,
some
  duplicated on purpose): ``merge <ids>: <note>`` for each group of identical notes,
  ``discard <ids>`` for the notes that say nothing (``plan: none.``), ``return`` when neither.

Notes are written as entries (:func:`agents.models.notes.entry_text`): the plan and avoid lines on
one line (the line format reads one operation a line), without the ``found`` line, which says
where things were in one variant and rarely holds in another. What carries over between
variants is the plan's commitments and the actions to avoid (minilab's rules: which device,
key, wire or paint), and those are what an entry of a family-wide bank keeps.
The build checks greedy answers on fresh episodes of the held-back train variants before and
after the stage (valid answers, exact targets, operation mix) and writes them to ``ops.json``.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import torch

from agents.acting.scripted import hindsight_note
from agents.acting.world_calls import GuardedWorld
from agents.memory.extraction import (
    SHOWN_ID,
    extract_messages,
    merge_messages,
    parse_extraction,
    parse_merge,
    shown_ids,
)
from agents.models.embedded import EmbeddedSpec, cache_key
from agents.models.model_checks import greedy_answer
from agents.models.notes import EMPTY_NOTE, entry_text
from agents.models.pretrain import (
    Progress,
    Sample,
    cached_build,
    default_cache_root,
    reflection_steps,
    train,
)
from agents.models.pretrain_play import Episode, play_families
from agents.models.prompts import PromptEncoder, encode_response
from agents.models.specs import OpsSpec
from engine.world_registry import load_world
from stores.model_dirs import load_model_dir, quiet_transformers

__all__ = [
    "OpsSpec",
    "ensure_extractor_base",
    "extraction_target",
    "merge_target",
    "ops_key",
]

OPS_FORMAT_VERSION = 2
"""Part of the cache key: bump it when the same spec would build a different model."""
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "ops.json",  # written last
)
OP_WORDS = ("add", "update", "return", "merge", "rewrite", "discard", "entry")
"""Words of the operation format given a token each: the base tokenizer, built from the
world's text, spells them in 2-4 byte pieces, which a model this small stutters
(``mererge``)."""


def ops_key(base: EmbeddedSpec, spec: OpsSpec) -> str:
    """A short stable hash of the base model's key, :data:`OPS_FORMAT_VERSION` and ``spec``."""
    blob = f"{cache_key(base)}\n{OPS_FORMAT_VERSION}\n".encode()
    blob += msgspec.json.encode(spec, order="deterministic")
    return hashlib.blake2b(blob, digest_size=10).hexdigest()


# ---------------------------------------------------------------------------------------------
# The teaching rule (pure)


def extraction_target(note: str, *, success: bool, entry: tuple[int, str] | None) -> str:
    """The answer taught for an extraction prompt (the rule in the module docstring).

    Args:
        note: the episode's note, as an entry (:func:`agents.models.notes.entry_text`).
        success: whether the episode reached its goal.
        entry: ``(id, text)`` of the entry shown, or None.
    """
    if entry is None:
        return f"add: {note}"
    if entry[1] == note:
        return "return"
    return f"update {entry[0]}: {note}" if success else f"add: {note}"


def merge_target(entries: Sequence[tuple[int, str]]) -> str:
    """The answer taught for a merge prompt over ``entries`` (``(id, text)``, distinct ids):
    one ``merge`` line per group of identical texts (in order of first appearance), then one
    ``discard`` line for every :data:`EMPTY_NOTE`, or ``return`` when there is neither."""
    groups: dict[str, list[int]] = {}
    for i, text in entries:
        groups.setdefault(text, []).append(i)
    lines = [
        f"merge {','.join(map(str, ids))}: {text}"
        for text, ids in groups.items()
        if len(ids) > 1 and text != EMPTY_NOTE
    ]
    empty = groups.get(EMPTY_NOTE, [])
    if empty:
        lines.append(f"discard {','.join(map(str, empty))}")
    return "\n".join(lines) or "return"


@dataclass(frozen=True, slots=True)
class Item:
    """One teaching prompt: ``kind`` ``"extract"`` or ``"merge"``, the ids the answer may
    name, and the target answer."""

    kind: str
    messages: list[dict[str, str]]
    ids: tuple[int, ...]
    target: str


def extract_item(episode: Episode, notes: Sequence[str], spec: OpsSpec, rng: random.Random) -> Item:
    """The extraction prompt of ``episode``, showing an entry drawn from ``notes`` (the
    family's notes) with probability ``spec.guided_share``."""
    note = entry_text(hindsight_note(episode.transcript))
    entry = rng.choice(notes) if notes and rng.random() < spec.guided_share else None
    messages = extract_messages(
        episode.goal,
        episode.first,
        episode.history,
        success=episode.success,
        entry=entry,
        max_ops=spec.max_ops,
    )
    shown = None if entry is None else (SHOWN_ID, entry)
    target = extraction_target(note, success=episode.success, entry=shown)
    return Item("extract", messages, tuple(shown_ids(entry is not None)), target)


def merge_item(notes: Sequence[str], spec: OpsSpec, rng: random.Random) -> Item:
    """A merge prompt over 2 to ``spec.merge_chunk`` of ``notes``, one of them repeated with
    probability ``spec.duplicate_share``."""
    size = rng.randint(2, spec.merge_chunk)
    texts = [rng.choice(notes) for _ in range(size)]
    if rng.random() < spec.duplicate_share:
        source, copy = rng.sample(range(size), 2)
        texts[copy] = texts[source]
    entries = list(zip(shown_ids(size), texts, strict=True))
    return Item("merge", merge_messages(texts), tuple(shown_ids(size)), merge_target(entries))


def teaching_items(episodes: Sequence[Episode], spec: OpsSpec, rng: random.Random) -> list[Item]:
    """One extraction and one merge item per episode; entries come from the notes of the
    other episodes of the same family."""
    notes: dict[str, list[str]] = {}
    for ep in episodes:
        notes.setdefault(ep.task.family, []).append(entry_text(hindsight_note(ep.transcript)))
    items = []
    for ep in episodes:
        family = notes[ep.task.family]
        items.append(extract_item(ep, family, spec, rng))
        items.append(merge_item(family, spec, rng))
    return items


# ---------------------------------------------------------------------------------------------
# Samples and the checks


def encode_items(
    tokenizer: Any, items: Sequence[Item], max_positions: int
) -> tuple[dict[str, list[Sample]], int]:
    """The samples by kind, and how many items were dropped for not fitting ``max_positions``."""
    prompts = PromptEncoder(tokenizer).encode([it.messages for it in items])
    pools: dict[str, list[Sample]] = {"extract": [], "merge": []}
    dropped = 0
    for item, prompt in zip(items, prompts, strict=True):
        response = encode_response(tokenizer, item.target)
        if len(prompt) + len(response) > max_positions:
            dropped += 1
            continue
        pools[item.kind].append(Sample(item.kind, tuple(prompt), tuple(response)))
    return pools, dropped


def _check_pools(
    pools: dict[str, list[Sample]], kinds: Sequence[str], positions: int, items: int
) -> None:
    """Refuse a stage with no samples of a kind its steps train on: every such teaching item
    was longer than the base model's positions, and training waited forever for one.

    Raises:
        ValueError: naming the setting that gives the positions.
    """
    if empty := sorted({kind for kind in kinds if not pools.get(kind)}):
        kept = sum(len(p) for p in pools.values())
        raise ValueError(
            f"every {' and '.join(empty)} teaching item of the operation stage is longer than "
            f"the base model's {positions} positions ({kept} of {items} items fit): it needs "
            "a larger policy.embedded.max_positions"
        )


def add_op_words(model: Any, tokenizer: Any) -> int:
    """Give each of :data:`OP_WORDS` that is not one token yet its own token, with a new
    embedding row drawn from a normal distribution with the other rows' mean and covariance
    (transformers' ``mean_resizing``, whose warning saying so was printed under ``--quiet``);
    the number of tokens added."""
    new = [w for w in OP_WORDS if len(tokenizer.encode(w, add_special_tokens=False)) > 1]
    added = tokenizer.add_tokens(new)
    if added:
        with quiet_transformers():
            model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    return added


def _parse(item: Item, answer: str, max_ops: int) -> Any:
    if item.kind == "extract":
        return parse_extraction(answer, known_ids=item.ids, max_ops=max_ops)
    return parse_merge(answer, chunk_ids=item.ids)


def answer_check(
    model: Any, tokenizer: Any, items: Sequence[Item], spec: OpsSpec, max_positions: int
) -> dict:
    """Greedy answers to ``items``, by kind: how many are valid (not malformed), exactly the
    target, and the operations they hold."""
    report: dict[str, Any] = {}
    for kind in ("extract", "merge"):
        chosen = [it for it in items if it.kind == kind]
        prompts = PromptEncoder(tokenizer).encode([it.messages for it in chosen])
        fits = [(it, p) for it, p in zip(chosen, prompts, strict=True) if len(p) < max_positions]
        valid, exact, ops = 0, 0, Counter[str]()
        for item, prompt in fits:
            room = min(spec.max_new_tokens, max_positions - len(prompt))
            answer = greedy_answer(model, tokenizer, prompt, room)
            parsed = _parse(item, answer, spec.max_ops)
            valid += not parsed.malformed
            exact += answer.strip() == item.target
            ops.update(type(op).__name__.lower() for op in parsed.ops)
        report[kind] = {"answers": len(fits), "valid": valid, "exact": exact, "ops": dict(ops)}
    return report


# ---------------------------------------------------------------------------------------------
# Building and caching (the shell)


def _lengths(pools: dict[str, list[Sample]]) -> dict:
    return {
        kind: {
            "samples": len(pool),
            "longest_prompt": max((len(s.prompt) for s in pool), default=0),
            "longest_answer": max((len(s.response) for s in pool), default=0),
        }
        for kind, pool in pools.items()
    }


def build_ops(
    base_dir: Path,
    base: EmbeddedSpec,
    spec: OpsSpec,
    out: Path,
    progress: Progress | None,
    step_timeout: float | None = None,
) -> dict:
    """Teach the base model in ``base_dir`` the operation format and save it to ``out``; the
    report, also written to ``ops.json`` (last). The world is called as
    :func:`agents.models.embedded.build` calls it."""
    started = time.perf_counter()
    world = GuardedWorld(partial(load_world, base.world, base.world_options), step_timeout)
    rng = random.Random(f"coevo.extractor-ops/{spec.seed}")
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            model, tokenizer = load_model_dir(base_dir, torch.device("cpu"))
            add_op_words(model, tokenizer)
            limit = model.config.max_position_embeddings
            taught = play_families(world, base, spec.episodes_per_family, False, f"ops/{spec.seed}")
            items = teaching_items(taught, spec, rng)
            pools, dropped = encode_items(tokenizer, items, limit)
            kinds = [
                "merge" if m else "extract" for m in reflection_steps(spec.steps, spec.merge_share)
            ]
            _check_pools(pools, kinds, limit, len(items))
            held = play_families(world, base, spec.checks, True, f"ops-check/{spec.seed}")
            checks = teaching_items(held, spec, rng)
            before = answer_check(model, tokenizer, checks, spec, limit)
            training = train(model, pools, spec, kinds, tokenizer.pad_token_id, progress)
            after = answer_check(model, tokenizer, checks, spec, limit)
    finally:
        world.close()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    targets = Counter(it.target.split(" ", 1)[0].rstrip(":") for it in items)
    report = {
        "format_version": OPS_FORMAT_VERSION,
        "key": ops_key(base, spec),
        "base_key": cache_key(base),
        "spec": msgspec.to_builtins(spec),
        "data": {
            "episodes": len(taught),
            "dropped_too_long": dropped,
            "targets": dict(targets),
            **_lengths(pools),
        },
        "training": training,
        "check": {"before": before, "after": after},
        "wall_s": round(time.perf_counter() - started, 2),
    }
    (out / "ops.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def ensure_extractor_base(
    base_dir: Path,
    base: EmbeddedSpec,
    spec: OpsSpec | None = None,
    cache_root: Path | None = None,
    *,
    threads: int | None = None,
    progress: Progress | None = None,
    step_timeout: float | None = None,
) -> Path:
    """The directory of the base model taught the operation format, built on first use
    under ``<cache_root>/extractor/<ops_key(base, spec)>`` (as :func:`ensure_embedded`).

    Args:
        base_dir: the embedded base model built from ``base``.
        base: its spec (the world, and which train variants are held back).
        spec: the operation stage (default :class:`OpsSpec`).
        cache_root: the cache (default :func:`agents.models.pretrain.default_cache_root`).
        threads, progress, step_timeout: as for
            :func:`agents.models.embedded.ensure_embedded`.

    Raises:
        ValueError: bad ``threads``.
        ModelUnavailable: ``base_dir`` holds no loadable model.
    """
    spec = spec or OpsSpec()
    root = Path(cache_root or default_cache_root()) / "extractor"
    return cached_build(
        root,
        ops_key(base, spec),
        REQUIRED_FILES,
        lambda tmp: build_ops(base_dir, base, spec, tmp, progress, step_timeout),
        threads,
    )


def ops_summary(report: dict) -> str:
    """One line per check kind of an ``ops.json`` report: valid and exact answers, before ->
    after the stage."""
    lines = []
    for kind in ("extract", "merge"):
        b, a = report["check"]["before"][kind], report["check"]["after"][kind]
        lines.append(
            f"{kind}: valid {b['valid']}/{b['answers']} -> {a['valid']}/{a['answers']}, "
            f"exact {b['exact']} -> {a['exact']}, operations after: {a['ops']}"
        )
    return "\n".join(lines)
