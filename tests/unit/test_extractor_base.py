"""The extractor's operation stage, pure parts: the teaching rule, its prompts, and that every
target parses to the operations it means."""

from __future__ import annotations

import random

import pytest

from agents.memory.extraction import (
    Add,
    Discard,
    Merge,
    Return,
    Update,
    parse_extraction,
    parse_merge,
)
from agents.models.embedded import EmbeddedSpec
from agents.models.extractor_base import (
    OpsSpec,
    extraction_target,
    merge_target,
    ops_key,
    teaching_items,
)
from agents.models.notes import EMPTY_NOTE
from agents.models.pretrain_play import pretrain_episodes
from scenarios.worlds.minilab import MiniLab

NOTE = "plan: open crate, take ball. avoid: take rock."


def test_extraction_target_follows_the_rule() -> None:
    assert extraction_target(NOTE, success=True, entry=None) == f"add: {NOTE}"
    assert extraction_target(NOTE, success=False, entry=(7, NOTE)) == "return"
    assert extraction_target(NOTE, success=True, entry=(7, "plan: none.")) == f"update 7: {NOTE}"
    assert extraction_target(NOTE, success=False, entry=(7, "plan: none.")) == f"add: {NOTE}"


def test_merge_target_merges_duplicates_and_discards_empty_notes() -> None:
    entries = [(4, "a."), (9, EMPTY_NOTE), (2, "b."), (5, "a."), (3, EMPTY_NOTE), (8, "a.")]
    assert merge_target(entries) == "merge 4,5,8: a.\ndiscard 9,3"
    assert merge_target([(1, "a."), (2, "b.")]) == "return"
    assert merge_target([(1, EMPTY_NOTE), (2, EMPTY_NOTE)]) == "discard 1,2"


@pytest.mark.parametrize(
    ("target", "ids", "expected"),
    [
        (f"add: {NOTE}", (), (Add(NOTE),)),
        (f"update 7: {NOTE}", (7,), (Update((7,), NOTE),)),
        ("return", (7,), (Return(),)),
    ],
)
def test_extraction_targets_parse_to_what_they_mean(target, ids, expected) -> None:
    parsed = parse_extraction(target, known_ids=ids, max_ops=3)
    assert parsed.ops == expected and not parsed.errors


def test_merge_targets_parse_to_what_they_mean() -> None:
    entries = [(4, "a."), (9, EMPTY_NOTE), (5, "a.")]
    parsed = parse_merge(merge_target(entries), chunk_ids=[4, 9, 5])
    assert parsed.ops == (Merge((4, 5), "a."), Discard((9,))) and not parsed.errors


def test_teaching_items_are_deterministic_and_every_target_parses() -> None:
    world = MiniLab(families=("fetch", "heat"), train_variants=12)
    episodes = pretrain_episodes(world, EmbeddedSpec(episodes_per_family=12, eval_variants=2))
    spec = OpsSpec(merge_chunk=4)
    items = teaching_items(episodes, spec, random.Random(3))
    assert items == teaching_items(episodes, spec, random.Random(3))
    assert [it.kind for it in items] == ["extract", "merge"] * len(episodes)
    kinds = set()
    for item in items:
        if item.kind == "extract":
            parsed = parse_extraction(item.target, known_ids=item.ids, max_ops=spec.max_ops)
            last = item.messages[1]["content"].rsplit("\n", 1)[1]
            assert last.startswith(f"entry {item.ids[0]}: ") if item.ids else last == "entry: none"
        else:
            parsed = parse_merge(item.target, chunk_ids=item.ids)
            assert 2 <= len(item.ids) <= 4
        assert not parsed.malformed and not parsed.errors, item.target
        kinds.update(type(op).__name__ for op in parsed.ops)
    assert {"Add", "Update", "Return", "Merge"} <= kinds


def test_the_key_changes_with_the_base_and_the_spec() -> None:
    base = EmbeddedSpec()
    assert ops_key(base, OpsSpec()) == ops_key(EmbeddedSpec(), OpsSpec())
    assert ops_key(base, OpsSpec(steps=10, warmup=1)) != ops_key(base, OpsSpec())
    assert ops_key(EmbeddedSpec(seed=1), OpsSpec()) != ops_key(base, OpsSpec())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"steps": 0}, "steps must be between 1 and 10000000"),
        ({"merge_share": 1.5}, "merge_share must be between 0 and 1"),
        ({"merge_chunk": 1}, "merge_chunk must be between 2 and 100"),
        ({"lr": float("nan")}, "lr must be > 0 and <= 1"),
        ({"lr": 2.0}, "lr must be > 0 and <= 1"),  # built an extractor of NaN
        ({"warmup": 50, "steps": 10}, "warmup must be <= steps"),
    ],
)
def test_bad_specs_are_refused(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        OpsSpec(**fields)


def test_the_op_words_tokens_are_added_without_transformers_warning() -> None:
    """The first build of the ``"embedded-ops"`` extractor printed transformers' "The new
    embeddings will be initialized from a multivariate normal distribution ..." under
    ``--quiet``."""
    import logging

    from transformers.utils import logging as hf_logging

    from agents.models.extractor_base import OP_WORDS, add_op_words

    said: list[str] = []

    class Model:
        def resize_token_embeddings(self, size: int, mean_resizing: bool) -> None:
            hf_logging.get_logger("transformers.modeling_utils").warning("new embeddings ...")

    class Tokenizer:
        def encode(self, word: str, add_special_tokens: bool) -> list[int]:
            return [1, 2]  # not one token yet

        def add_tokens(self, words: list[str]) -> int:
            return len(words)

        def __len__(self) -> int:
            return 100

    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    root = hf_logging.get_logger()
    root.addHandler(handler)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()  # as a run has it (other tests may have set it higher)
    try:
        assert add_op_words(Model(), Tokenizer()) == len(OP_WORDS)
        hf_logging.get_logger("transformers.modeling_utils").warning("after it")
    finally:
        root.removeHandler(handler)
        hf_logging.set_verbosity(level)
    assert said == ["after it"]  # transformers' warnings are on again after it


def test_a_stage_whose_teaching_items_all_exceed_the_positions_is_refused_not_hung() -> None:
    """``policy.embedded.max_positions = 16`` (up to 256 with the tiny base model) left the
    operation stage no extraction sample: the batch plan waited forever for one, with no
    output (an outside tester's run killed after 10 minutes)."""
    from agents.models.extractor_base import OpsSpec, _check_pools
    from agents.models.pretrain import Sample, batch_plan

    with pytest.raises(ValueError, match="no extract samples to train on"):
        batch_plan({"extract": [], "merge": [5, 6]}, OpsSpec(steps=10, warmup=2), ["extract"] * 3)
    merge = [Sample("merge", (1, 2), (3,))]
    with pytest.raises(ValueError) as info:
        _check_pools({"extract": [], "merge": merge}, ["extract", "merge"], 64, 40)
    assert str(info.value) == (
        "every extract teaching item of the operation stage is longer than the base model's 64 "
        "positions (1 of 40 items fit): it needs a larger policy.embedded.max_positions"
    )
    _check_pools({"extract": [], "merge": merge}, ["merge"], 64, 40)  # no step trains on it
