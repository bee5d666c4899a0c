"""The note probe (agents/models/note_probe.py): lockstep play draws from each episode's own seed
only, and every condition plays the same variants."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch
from transformers import Qwen2ForCausalLM

from agents.models.embedded import (
    EmbeddedSpec,
    build_tokenizer,
    episode_texts,
    model_config,
    prompt_texts,
    word_pieces,
)
from agents.models.note_probe import PROBE_KINDS, Job, note_probe, play_batch, probe_notes
from agents.models.notes import follows_to_success
from agents.models.pretrain_play import play_families
from scenarios.worlds.minilab import MiniLab

SPEC = EmbeddedSpec(
    world_options={"families": ["heat", "unlock"], "train_variants": 30, "heldout_variants": 6},
    hidden_size=32,
    layers=1,
    heads=2,
    kv_heads=1,
    intermediate_size=64,
    episodes_per_family=6,
    eval_variants=2,
)


def make_world() -> MiniLab:
    return MiniLab(**SPEC.world_options)


@pytest.fixture(scope="module")
def policy() -> Iterator[tuple[Qwen2ForCausalLM, object]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on a loaded 2-core machine are many times slower
    world = make_world()
    episodes = play_families(world, SPEC, 6, False, "t")
    texts = [t for ep in episodes for t in episode_texts(ep)] + list(prompt_texts(episodes[0]))
    tokenizer = build_tokenizer(*word_pieces(texts), SPEC.max_positions)
    torch.manual_seed(0)
    yield Qwen2ForCausalLM(model_config(SPEC, tokenizer)).eval(), tokenizer
    torch.set_num_threads(threads)


def test_what_an_episode_plays_does_not_depend_on_its_batch(policy) -> None:
    model, tokenizer = policy
    world = make_world()
    tasks = [t for f in world.families() for t in world.tasks(f, "heldout")[:3]]
    jobs = [
        Job(t, ("plan: take key.",) if i % 2 else (), seed)
        for i, t in enumerate(tasks)
        for seed in range(2)
    ]
    one = play_batch(model, tokenizer, make_world, jobs, window=4, batch=1)
    many = play_batch(model, tokenizer, make_world, jobs, window=4, batch=5)
    assert one == many and len(one) == len(jobs)
    shuffled = list(range(len(jobs)))
    random.Random(1).shuffle(shuffled)
    again = play_batch(model, tokenizer, make_world, [jobs[i] for i in shuffled], window=4, batch=4)
    assert again == [one[i] for i in shuffled]


def test_every_condition_plays_the_same_variants_with_the_right_notes() -> None:
    world = make_world()
    held = list(world.tasks("heat", "heldout"))
    library = list(world.tasks("heat", "train")) + list(world.tasks("unlock", "train"))[:5]
    shown, covered = probe_notes(world, held, library, tries=64, key="t")
    assert set(shown) == set(PROBE_KINDS) and covered == len(shown["none"]) > 0
    for kind in PROBE_KINDS:
        assert [task for task, _ in shown[kind]] == [task for task, _ in shown["none"]]
    for (task, helpful), (_, wrong) in zip(shown["variant"], shown["wrong"], strict=True):
        assert follows_to_success(world, task, helpful)
        assert not follows_to_success(world, task, wrong)
    assert all(tips == () for _, tips in shown["none"])


def test_the_probe_reports_every_kind_and_the_two_ratios(policy) -> None:
    model, tokenizer = policy
    report = note_probe(model, tokenizer, make_world, variants=3, seeds=1, tries=32, window=4)
    assert set(report) == {"heat", "unlock", "all"}
    assert report["all"]["variants"] == report["heat"]["variants"] + report["unlock"]["variants"]
    for form in ("written", "entry"):
        assert set(report["all"][form]) == set(PROBE_KINDS)
    assert "helpful_vs_none" in report["all"] and "wrong_vs_none" in report["all"]
    for name in ("helpful", "wrong"):
        interval = report["all"][f"{name}_vs_none_interval"]
        ratio = report["all"][f"{name}_vs_none"]
        assert interval is None or interval[0] <= ratio <= interval[1]


def test_an_unbounded_ratio_interval_is_written_as_json_holds_it() -> None:
    """``pretrain.json`` could hold ``Infinity`` (not JSON): a ratio's bound where the "none"
    side resampled to no success."""
    import json

    from agents.models.note_probe import _ratio_interval  # pyright: ignore[reportPrivateUsage]

    got = _ratio_interval([False] * 8, [True] + [False] * 7)
    assert got is not None and got[1] is None
    assert json.loads(json.dumps({"x": got}, allow_nan=False)) == {"x": got}
