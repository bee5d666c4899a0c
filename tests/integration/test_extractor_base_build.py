"""Building the extractor's starting weights (the operation stage) on a tiny base model: the
files, the op words as single tokens after an offline reload, the report, and the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_embedded_build import TINY

from agents.models.embedded import ensure_embedded
from agents.models.extractor_base import (
    OP_WORDS,
    REQUIRED_FILES,
    OpsSpec,
    ensure_extractor_base,
    ops_key,
)
from stores.model_dirs import load_model_dir

OPS = OpsSpec(episodes_per_family=4, steps=12, warmup=1, batch_size=4, checks=1, max_new_tokens=8)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list]:
    root = tmp_path_factory.mktemp("cache")
    base = ensure_embedded(TINY, root, threads=1)
    calls: list = []
    path = ensure_extractor_base(
        base, TINY, OPS, root, threads=1, progress=lambda *a: calls.append(a)
    )
    return base, path, calls


def test_the_build_lands_in_the_cache_with_every_file(built) -> None:
    base, path, calls = built
    assert path.name == ops_key(TINY, OPS) and path.parent.name == "extractor"
    assert all((path / name).is_file() for name in REQUIRED_FILES)
    assert [c[:2] for c in calls] == [(step, 12) for step in range(1, 13)]
    assert ensure_extractor_base(base, TINY, OPS, path.parent.parent) == path


def test_op_words_are_single_tokens_and_the_model_fits_the_vocabulary(built) -> None:
    base, path, _ = built
    model, tokenizer = load_model_dir(path, torch.device("cpu"))
    _, base_tokenizer = load_model_dir(base, torch.device("cpu"))
    for word in OP_WORDS:
        assert len(tokenizer.encode(word, add_special_tokens=False)) == 1, word
    text = "merge 12,7: plan: take ball."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer) > len(base_tokenizer)


def test_the_report_holds_the_data_and_both_checks(built) -> None:
    _, path, _ = built
    report = json.loads((path / "ops.json").read_text())
    assert report["key"] == path.name
    assert report["data"]["episodes"] == 2 * OPS.episodes_per_family  # 2 families
    assert report["data"]["extract"]["samples"] == report["data"]["merge"]["samples"] == 8
    for stage in ("before", "after"):
        for kind in ("extract", "merge"):
            check = report["check"][stage][kind]
            assert check["answers"] == 2 and 0 <= check["exact"] <= check["valid"] <= 2
    assert (
        report["training"]["loss"]["extract"]["steps"]
        + report["training"]["loss"]["merge"]["steps"]
        == 12
    )
