"""The embedded default policy: a small Qwen2 causal LM and a word-level tokenizer, built for a
world from its own text, pre-trained locally and cached.

A tiny model trained from scratch can neither act nor write a note on day one, while the papers
start from an instruction-tuned model. The honest equivalent here is a pre-training stage on the
world's own text, run once per :class:`EmbeddedSpec` and cached:

- **Play** on train variants only: never held-out ones, and never the last ``eval_variants``
  train variants of each family, kept back for the quality checks. A share ``explorer_share``
  (default 0.8) of the episodes is played by the memoryless
  :class:`~agents.acting.scripted.Explorer` without a note, the rest by
  :class:`~agents.acting.scripted.RandomAgent` for diversity (states off
  the explorer's path, wrong commitments, repeated actions). Episodes are **not filtered by
  outcome**: the model imitates exploring play, failures included (31% of the default play
  succeeds), so it starts at or below the explorer's success and later RL still has everything
  to learn.
- **Turn samples**: the prompt of :func:`agents.models.prompts.turn_messages` (no admissible
  list, no tips, the spec's ``window``) and the action taken as the response.
- **Reflection samples**: the prompt of :func:`agents.models.prompts.reflection_messages` and, as
  the response, :func:`agents.acting.scripted.hindsight_note` of the transcript: a target
  derived from the episode's text alone (actions that earned reward, where objects turned up,
  what failed the task), never from the world's hidden state.
- **Loss**: cross-entropy on response tokens plus ``prompt_loss_weight`` (default 1) times the
  LM loss on prompt tokens, the world's own text. With the default budget it lowered the final
  response loss from 0.84 to 0.79 on turns and from 0.59 to 0.46 on reflections (against a
  weight of 0), at the same cost; the policy checks did not change.

The tokenizer is word-level in effect: a byte-level BPE with Qwen2's own normalizer and
pre-tokenizer, trained on the text of that play and the fixed strings of
:mod:`agents.models.prompts` until each of their words is one token (about 670 entries: 7
special tokens, 256 bytes, one per merge). Not a WordLevel model, because transformers 5's
``AutoTokenizer`` rebuilds the tokenizer of any ``qwen2`` checkpoint as a Qwen2 BPE from its
vocabulary and merges. A word never seen is spelled in smaller pieces (there is no ``<unk>``),
``tokenizer.decode(ids, skip_special_tokens=True)`` gives any text back exactly, and
:func:`agents.models.prompts.decode_response` also stops at the end of the message.

The default (0.31M parameters, 6,000 steps, ~7M tokens) builds in about 8-10 minutes with one
torch thread on a shared 2-core machine, checks included (docs/MODEL.md has the measured
builds).

Nothing on disk is pickled: ``AutoModelForCausalLM.from_pretrained(path)`` and
``AutoTokenizer.from_pretrained(path)`` load a cached build offline.
``python -m agents.models.embedded [--cache DIR]`` prebuilds the default.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import structlog
import tokenizers
import torch
import transformers
from tokenizers import models, pre_tokenizers, trainers
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

from agents.acting.scripted import hindsight_note
from agents.acting.world_calls import GuardedWorld
from agents.models.model_checks import note_check, policy_check
from agents.models.note_probe import note_probe
from agents.models.notes import entry_text
from agents.models.pretrain import (
    Progress,
    Sample,
    cached_build,
    default_cache_root,
    reflection_steps,
    train,
)
from agents.models.pretrain_play import (
    Episode,
    pretrain_episodes,
    reflection_conversation,
    turn_conversations,
)
from agents.models.prompts import (
    TIP_CLOSE,
    TIP_OPEN,
    PromptEncoder,
    cut_gap,
    encode_response,
    fit_sample,
    reflection_messages,
    turn_messages,
)
from agents.models.specs import EmbeddedSpec
from engine.world import TextWorld
from engine.world_registry import load_world

FORMAT_VERSION = 4
"""Part of the cache key: bump it when the same spec would build a different model."""

PAD, EOM = "<pad>", "<eom>"
ROLES = ("system", "user", "assistant")
SPECIAL_TOKENS = (PAD, EOM, *(f"<{role}>" for role in ROLES), TIP_OPEN, TIP_CLOSE)
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + m['role']) }}{% endif %}"
    "{{ '<' + m['role'] + '>' + m['content'] + '<eom>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<assistant>' }}{% endif %}"
)
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "pretrain.json",  # written last
)


def cache_key(spec: EmbeddedSpec) -> str:
    """A short stable hash of :data:`FORMAT_VERSION` and the spec (option order ignored)."""
    blob = f"{FORMAT_VERSION}\n".encode() + msgspec.json.encode(spec, order="deterministic")
    return hashlib.blake2b(blob, digest_size=10).hexdigest()


# ---------------------------------------------------------------------------------------------
# The tokenizer


_QWEN2: Any = Qwen2Tokenizer().backend_tokenizer  # Qwen2's own normalizer and pre-tokenizer


def split_words(text: str) -> list[str]:
    """The words of ``text`` as Qwen2's pre-tokenizer cuts them, in byte-level form:
    ``"open box.\n"`` -> ``["open", "Ġbox", ".Ċ"]``."""
    pieces = _QWEN2.pre_tokenizer.pre_tokenize_str(_QWEN2.normalizer.normalize_str(text))
    return [piece for piece, _ in pieces]


def episode_texts(episode: Episode) -> Iterator[str]:
    """Every text of an episode: goal, observations, actions, admissible lists, its note (also
    as a tip shows it, after a space, and as an entry) and the tips it was shown."""
    note = hindsight_note(episode.transcript)
    yield from (episode.goal, episode.first, note, f" {note} ", f" {entry_text(note)} ")
    yield from (f" {tip} " for tip in episode.tips)
    for action, text, _ in episode.transcript:
        yield from (action, text)
    for actions in episode.admissible:
        yield from actions


def prompt_texts(episode: Episode) -> Iterator[str]:
    """The prompt contents around an episode: the fixed strings of :mod:`agents.models.prompts`
    (system texts, headers, separators, both outcomes) with the episode's own text."""
    goal, first, history = episode.goal, episode.first, episode.history
    turn = turn_messages(goal, history, first, admissible=episode.admissible[0])
    reflections = [reflection_messages(goal, first, history, success=s) for s in (True, False)]
    for messages in (turn, *reflections):
        yield from (m["content"] for m in messages)


def word_pieces(texts: Iterable[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The vocabulary and merges of a byte-level BPE over Qwen2's pre-tokenizer, trained on
    ``texts`` until every word of them is a single token: the special tokens, the 256 bytes,
    then one token per merge (the words and their prefixes)."""
    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.normalizer, bpe.pre_tokenizer = _QWEN2.normalizer, _QWEN2.pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=1 << 20,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(sorted(set(texts)), trainer)
    model = json.loads(bpe.to_str())["model"]
    merges: list[tuple[str, str]] = []
    for merge in model["merges"]:  # ["a", "b"], or "a b" in the older format
        first, second = merge.split(" ") if isinstance(merge, str) else merge
        merges.append((first, second))
    return model["vocab"], merges


def build_tokenizer(
    vocab: dict[str, int], merges: Sequence[tuple[str, str]], max_length: int
) -> Qwen2Tokenizer:
    """A Qwen2 tokenizer over ``vocab`` and ``merges`` (from :func:`word_pieces`): its
    ``eos_token`` ends a message, and its chat template is what
    :func:`agents.models.prompts.encode_prompt` renders."""
    return Qwen2Tokenizer(
        vocab=vocab,
        # transformers annotates these as list[str] and str; its BPE takes (a, b) pairs, and no
        # unknown token (every byte is in the vocabulary)
        merges=list(merges),  # pyright: ignore[reportArgumentType]
        unk_token=None,  # pyright: ignore[reportArgumentType]
        pad_token=PAD,
        eos_token=EOM,
        extra_special_tokens=list(SPECIAL_TOKENS[2:]),
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=max_length,
    )


# ---------------------------------------------------------------------------------------------
# Samples, batches and the loss (pure)


def make_samples(
    tokenizer: Any, episodes: Sequence[Episode], window: int
) -> dict[str, list[Sample]]:
    """The turn samples (prompt, action taken) and the reflection samples (prompt, hindsight
    note) of ``episodes``."""
    items = {  # (prompt, the tips it shows, response)
        "turn": [
            (c, ep.tips, action)
            for ep in episodes
            for c, (action, _, _) in zip(turn_conversations(ep, window), ep.transcript, strict=True)
        ],
        "reflection": [
            (reflection_conversation(ep), (), hindsight_note(ep.transcript)) for ep in episodes
        ],
    }
    encoder = PromptEncoder(tokenizer)
    pools = {}
    for kind, kind_items in items.items():
        prompts = encoder.encode([c for c, _, _ in kind_items], [t for _, t, _ in kind_items])
        responses = [encode_response(tokenizer, text) for _, _, text in kind_items]
        pools[kind] = [
            Sample(kind, tuple(p), tuple(r)) for p, r in zip(prompts, responses, strict=True)
        ]
    return pools


def fit_samples(pools: dict[str, list[Sample]], limit: int, gap: Sequence[int]) -> int:
    """Cut, in place, every sample longer than ``limit`` positions as inference cuts what it is
    asked (:func:`agents.models.prompts.fit_sample`): a world whose observations run to
    thousands of characters is learned from its prompts' beginnings and ends, as the model
    will read them. Returns how many were cut."""
    cut = 0
    for pool in pools.values():
        for i, sample in enumerate(pool):
            prompt, response, was_cut = fit_sample(sample.prompt, sample.response, limit, gap)
            if was_cut:
                pool[i] = Sample(sample.kind, tuple(prompt), tuple(response))
                cut += 1
    return cut


def step_kinds(spec: EmbeddedSpec) -> list[str]:
    """The kind of samples each pre-training step trains on: ``"turn"`` or ``"reflection"``."""
    return [
        "reflection" if reflect else "turn"
        for reflect in reflection_steps(spec.steps, spec.reflection_share)
    ]


def model_config(spec: EmbeddedSpec, tokenizer: Any) -> Qwen2Config:
    """The Qwen2 shape of ``spec`` over ``tokenizer``'s vocabulary, embeddings tied."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )


# ---------------------------------------------------------------------------------------------
# Building and caching (the shell)


def _rate(flags: Sequence[bool]) -> float | None:
    return round(sum(flags) / len(flags), 4) if flags else None


def _log() -> Any:
    return structlog.get_logger("coevo").bind(actor="embedded")


def _prepare(world: TextWorld, spec: EmbeddedSpec) -> tuple[Any, dict, dict]:
    """The tokenizer, the samples, and a report on the data."""
    episodes = pretrain_episodes(world, spec)
    texts = [t for ep in episodes for t in episode_texts(ep)] + list(prompt_texts(episodes[0]))
    tokenizer = build_tokenizer(*word_pieces(texts), spec.max_positions)
    pools = make_samples(tokenizer, episodes, spec.window)
    cut = fit_samples(pools, spec.max_positions, cut_gap(tokenizer))
    longest = max(len(s.prompt) + len(s.response) for pool in pools.values() for s in pool)
    noted = [ep for ep in episodes if ep.kind != "none"]
    data = {
        "episodes": len(episodes),
        "explorer_episodes": sum(ep.agent == "explorer" for ep in episodes),
        "play_success": _rate([ep.success for ep in episodes if ep.kind == "none"]),
        "note_episodes": {
            kind: {
                "episodes": sum(ep.kind == kind for ep in noted),
                "success": _rate([ep.success for ep in noted if ep.kind == kind]),
            }
            for kind in dict.fromkeys(ep.kind for ep in noted)
        },
        "turn_samples": len(pools["turn"]),
        "reflection_samples": len(pools["reflection"]),
        "vocab_size": len(tokenizer),
        "longest_sample": longest,
        "cut_samples": cut,
    }
    return tokenizer, pools, data


def build(
    spec: EmbeddedSpec,
    out: Path,
    progress: Progress | None = None,
    step_timeout: float | None = None,
) -> dict:
    """Build the model of ``spec`` into the directory ``out``, seeded from the spec (torch's
    global RNG is restored afterwards); the report, also written to ``pretrain.json``. The
    world is called behind the env worker's guards, each call given ``step_timeout`` seconds
    (None: no limit; :class:`agents.acting.world_calls.GuardedWorld`)."""
    started = time.perf_counter()

    def make_world() -> GuardedWorld:
        return GuardedWorld(partial(load_world, spec.world, spec.world_options), step_timeout)

    world = make_world()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            tokenizer, pools, data = _prepare(world, spec)
            model = Qwen2ForCausalLM(model_config(spec, tokenizer))
            _log().info("embedded.data", **data)
            wall = {"data": time.perf_counter() - started}
            training = train(model, pools, spec, step_kinds(spec), tokenizer.pad_token_id, progress)
            wall["train"] = time.perf_counter() - started - wall["data"]
            policy = policy_check(model, tokenizer, world, spec)
            notes = note_check(model, tokenizer, world, spec)
            probe = note_probe(
                model,
                tokenizer,
                make_world,
                variants=spec.probe_variants,
                seeds=spec.probe_seeds,
                tries=spec.note_tries,
                window=spec.window,
            )
            wall["checks"] = time.perf_counter() - started - wall["data"] - wall["train"]
    finally:
        world.close()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    wall["total"] = time.perf_counter() - started
    report = {
        "format_version": FORMAT_VERSION,
        "key": cache_key(spec),
        "spec": msgspec.to_builtins(spec),
        "parameters": sum(p.numel() for p in model.parameters()),
        "data": data,
        "training": training,
        "quality": {"policy": policy, "notes": notes, "note_probe": probe},
        "threads": torch.get_num_threads(),
        "wall_s": {name: round(seconds, 2) for name, seconds in wall.items()},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }
    (out / "pretrain.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def ensure_embedded(
    spec: EmbeddedSpec,
    cache_root: Path | None = None,
    *,
    threads: int | None = None,
    progress: Progress | None = None,
    step_timeout: float | None = None,
) -> Path:
    """The directory of the model built from ``spec``, built on first use
    (:func:`cached_build`).

    Args:
        spec: what to build.
        cache_root: the cache (default :func:`default_cache_root`); the build lands in
            ``<cache_root>/embedded/<cache_key(spec)>``.
        threads: torch threads while building, restored afterwards (None: torch's current).
            One is best on a small shared machine: on the 2-core dev VM under load, two
            threads trained 4-6 times slower than one (and built the same weights).
        progress: called as ``progress(step, steps, loss)`` after each training step.
        step_timeout: seconds each call of the world may take while pre-training plays it
            (the scenario's ``[world] step_timeout``; None: no limit); not part of the spec.

    Returns:
        The directory, which ``from_pretrained`` loads.

    Raises:
        ValueError: bad ``threads``.
        WorldFailed: the world could not be built, or raised, hung or answered wrongly.
    """
    root = Path(cache_root or default_cache_root()) / "embedded"
    return cached_build(
        root,
        cache_key(spec),
        REQUIRED_FILES,
        lambda tmp: build(spec, tmp, progress, step_timeout),
        threads,
    )


def summary(report: dict) -> str:
    """A few lines on a ``pretrain.json`` report."""
    data, loss, quality = report["data"], report["training"]["loss"], report["quality"]
    policy, notes = quality["policy"]["all"], quality["notes"]
    return "\n".join(
        [
            f"{report['parameters']:,} parameters, vocabulary {data['vocab_size']}, "
            f"{data['episodes']:,} episodes, {data['turn_samples']:,} turn and "
            f"{data['reflection_samples']:,} reflection samples",
            f"{report['spec']['steps']} steps in {report['wall_s']['total']} s on "
            f"{report['threads']} threads; response loss: turn {loss['turn'].get('first')} -> "
            f"{loss['turn'].get('last')}, reflection {loss['reflection'].get('first')} -> "
            f"{loss['reflection'].get('last')}",
            f"success on {policy['variants']} held-back train variants: greedy "
            f"{policy['greedy']}, sampled {policy['sampled']}, explorer {policy['explorer']}",
            f"greedy notes on {notes['notes']} fresh episodes: exact {notes['exact']}, same "
            f"plan and avoid {notes['same_plan_and_avoid']}; exact {notes['exact_with_a_plan']} "
            f"of the {notes['notes_with_a_plan']} with a plan",
            *probe_lines(quality.get("note_probe", {})),
        ]
    )


def probe_lines(probe: dict) -> list[str]:
    """The note probe's lines of :func:`summary`: success by kind of note shown (as written
    and as entries), on how many held-out variants, and the two ratios to no note."""
    every = probe.get("all", {})
    if not every.get("written"):
        return []
    lines = [f"note probe, {every['variants']} held-out variants (sampled play):"]
    for form in ("written", "entry"):
        rates = ", ".join(f"{kind} {rate}" for kind, rate in every[form].items())
        lines.append(f"  notes {form}: {rates}")
    helpful, wrong = (
        f"{every[name]}"
        + (f" {every[f'{name}_interval']}" if every.get(f"{name}_interval") else "")
        for name in ("helpful_vs_none", "wrong_vs_none")
    )  # a build cached before the probe had intervals has none
    lines.append(f"  helpful / none {helpful} (goal >= 2), wrong / none {wrong} (goal >= 0.9)")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Build (or find) the default embedded model; print its path and a summary."""
    parser = argparse.ArgumentParser(prog="python -m agents.models.embedded", description=__doc__)
    parser.add_argument("--cache", type=Path, default=None, help="cache root directory")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1, see ensure_embedded)"
    )
    args = parser.parse_args(argv)

    def show(step: int, steps: int, loss: float) -> None:
        if step % max(1, steps // 20) == 0 or step == steps:
            print(f"step {step}/{steps} loss {loss:.3f}", file=sys.stderr, flush=True)

    path = ensure_embedded(EmbeddedSpec(), args.cache, threads=args.threads, progress=show)
    print(path)
    print(summary(json.loads((path / "pretrain.json").read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
