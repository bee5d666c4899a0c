"""Building the embedded model end to end with a tiny spec: the files, offline loading, the
cache, the lock, a falling loss, and that a partial build is never returned."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import agents.models.embedded as embedded
from agents.models.embedded import (
    REQUIRED_FILES,
    EmbeddedSpec,
    cache_key,
    ensure_embedded,
    split_words,
)
from agents.models.policy import score_and_choose
from agents.models.pretrain import (
    Sample,
    collate,
    next_token_losses,
)
from agents.models.prompts import encode_prompt, encode_response, turn_messages

TINY = EmbeddedSpec(
    world_options={"families": ["fetch", "heat"], "train_variants": 20, "max_steps": 6},
    hidden_size=32,
    layers=2,
    heads=2,
    kv_heads=1,
    intermediate_size=64,
    episodes_per_family=10,
    eval_variants=1,
    eval_notes=1,
    note_episodes_per_family=8,
    probe_variants=2,
    probe_seeds=1,
    steps=40,
    batch_size=4,
    lr=1e-2,
    warmup=4,
    reflection_share=0.25,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[int, int, float]]]:
    calls: list[tuple[int, int, float]] = []
    root = tmp_path_factory.mktemp("cache")
    path = ensure_embedded(TINY, root, threads=1, progress=lambda *a: calls.append(a))
    return path, calls


def test_the_build_lands_in_the_cache_with_every_file(built) -> None:
    path, calls = built
    assert path.name == cache_key(TINY) and path.parent.name == "embedded"
    assert all((path / name).is_file() for name in REQUIRED_FILES)
    assert not [p for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pkl", ".pickle")]
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []
    assert [c[:2] for c in calls] == [(step, 40) for step in range(1, 41)]


def test_the_report_describes_the_build(built) -> None:
    path, calls = built
    report = json.loads((path / "pretrain.json").read_text())
    assert report["key"] == cache_key(TINY) and report["spec"]["steps"] == 40
    assert report["data"]["episodes"] == 20 + 16  # 8 episodes per family with notes shown
    assert sum(k["episodes"] for k in report["data"]["note_episodes"].values()) == 16
    assert report["data"]["turn_samples"] > 36 and report["data"]["reflection_samples"] == 36
    assert report["threads"] == 1 and set(report["versions"]) >= {"torch", "transformers"}
    assert report["quality"]["policy"]["all"]["variants"] == 2
    assert report["quality"]["notes"]["notes"] == 2
    probe = report["quality"]["note_probe"]
    assert set(probe) == {"fetch", "heat", "all"} and probe["fetch"]["variants"] == 0  # no trap
    assert probe["all"]["variants"] == probe["heat"]["variants"] <= 2
    assert set(probe["all"]["written"]) == {"none", "variant", "wrong", "family", "unrelated"}
    assert 0 < report["parameters"] < 100_000
    turn = report["training"]["loss"]["turn"]
    assert turn["last"] < 0.7 * turn["first"]  # the loss went down
    assert all(0 < loss < 20 for _, _, loss in calls)


def test_auto_classes_load_it_offline_and_agree_with_the_build(
    built, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = built
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.tie_word_embeddings and model.config.vocab_size == len(tokenizer)
    messages = turn_messages("find the apple.", [("look", "you see a box.")], "you see a box.")
    prompt = encode_prompt(tokenizer, messages)
    assert tokenizer.decode(prompt) == tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert len(prompt) == 5 + sum(len(split_words(m["content"])) for m in messages)
    ids = torch.tensor([prompt + encode_response(tokenizer, "open box")])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_a_cache_hit_returns_the_same_directory_without_building(
    built, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = built
    stamp = (path / "model.safetensors").stat().st_mtime_ns

    def no_build(*args: object) -> dict:
        raise AssertionError("rebuilt on a cache hit")

    monkeypatch.setattr(embedded, "build", no_build)
    assert ensure_embedded(TINY, path.parent.parent) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp


def test_the_same_spec_builds_the_same_weights(built, tmp_path: Path) -> None:
    path, _ = built
    again = ensure_embedded(TINY, tmp_path, threads=1)
    assert again != path
    assert (again / "model.safetensors").read_bytes() == (path / "model.safetensors").read_bytes()


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    def fail(step: int, steps: int, loss: float) -> None:
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ensure_embedded(TINY, tmp_path, threads=1, progress=fail)
    assert sorted(p.name for p in (tmp_path / "embedded").iterdir()) == [f"{cache_key(TINY)}.lock"]


def fake_build(
    spec: EmbeddedSpec, out: Path, progress: object = None, limit: object = None
) -> dict:
    """Writes the files of a finished build, without training."""
    for name in REQUIRED_FILES:
        (out / name).write_text("{}")
    return {}


def test_a_partial_directory_is_rebuilt_not_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "build", fake_build)
    final = tmp_path / "embedded" / cache_key(TINY)
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")  # e.g. copied by hand, or an older layout
    stale = tmp_path / "embedded" / f".{cache_key(TINY)}.crashed"
    stale.mkdir()
    assert ensure_embedded(TINY, tmp_path) == final
    assert all((final / name).is_file() for name in REQUIRED_FILES)
    assert not stale.exists()


def test_two_builders_of_one_spec_build_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[Path] = []
    results: list[Path] = []
    second = threading.Thread(target=lambda: results.append(ensure_embedded(TINY, tmp_path)))

    def slow_build(
        spec: EmbeddedSpec, out: Path, progress: object = None, limit: object = None
    ) -> dict:
        builds.append(out)
        second.start()
        second.join(timeout=0.3)
        assert second.is_alive()  # it waits on the lock
        return fake_build(spec, out)

    monkeypatch.setattr(embedded, "build", slow_build)
    first = ensure_embedded(TINY, tmp_path)
    second.join()
    assert len(builds) == 1 and results == [first]


def test_threads_are_checked_and_restored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "build", fake_build)
    before = torch.get_num_threads()
    with pytest.raises(ValueError, match=r"^threads must be >= 1, got 0$"):
        ensure_embedded(TINY, tmp_path, threads=0)
    ensure_embedded(TINY, tmp_path, threads=1)
    assert torch.get_num_threads() == before


def test_packed_scoring_equals_full_forwards(built) -> None:
    path, _ = built
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    prompt = encode_prompt(tokenizer, turn_messages("heat the clay jug.", [], "you see an oven."))
    actions = ["look", "take clay jug", "put clay jug in oven", "turn on oven"]
    responses = [encode_response(tokenizer, a) for a in actions]
    (choice,) = score_and_choose(
        model,
        [prompt],
        [responses],
        [random.Random(0)],
        temperature=1.0,
        pad_id=tokenizer.pad_token_id,
        device=torch.device("cpu"),
    )
    scores = list(choice.scores)
    samples = [Sample("turn", tuple(prompt), tuple(r)) for r in responses]
    ids, attention, response, _ = collate(samples, tokenizer.pad_token_id)
    with torch.inference_mode():
        losses = next_token_losses(model(input_ids=ids, attention_mask=attention).logits, ids)
    full = (-(losses * response).sum(1)).tolist()
    assert scores == pytest.approx(full, abs=1e-4)
    assert len(set(scores)) == len(actions)


def test_the_module_entry_prints_the_path_and_a_summary(
    built, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = built
    monkeypatch.setattr(embedded, "EmbeddedSpec", lambda: TINY)  # the default takes minutes
    assert embedded.main(["--cache", str(path.parent.parent)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == str(path)
    assert "parameters" in lines[1] and "40 steps" in lines[2] and "greedy" in lines[3]
