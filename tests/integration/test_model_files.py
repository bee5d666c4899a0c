"""Model directories and checkpoints: every bad one is a one-line error, nothing is unpickled,
and a checkpoint is either complete on disk or absent."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from agents.testing.models import tiny_qwen2, tiny_tokenizer
from engine.errors import ModelUnavailable
from scenarios.cli import main
from stores import checkpoints as ckpt
from stores.checkpoints import DirCheckpoints
from stores.model_dirs import check_model_dir, load_model_dir, positions_of

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "scenarios" / "quickstart.toml")
TINY = [
    f"policy.embedded.{key}={value}"
    for key, value in {
        "steps": 20, "warmup": 2, "episodes_per_family": 6, "hidden_size": 32, "layers": 1,
        "heads": 2, "kv_heads": 1, "intermediate_size": 64, "eval_variants": 1, "eval_notes": 1,
        "note_episodes_per_family": 8, "probe_variants": 1, "probe_seeds": 1,
    }.items()
]  # fmt: skip
"""A small embedded model: the quickstart's takes about ten minutes to build on 2 cores, more
than a test's time limit on a machine without it in its cache."""


def tiny_model() -> tuple[Any, Any]:
    tokenizer = tiny_tokenizer(["look", "open", "door", "take", "key"])
    model = tiny_qwen2(len(tokenizer), hidden=16, positions=64, tie_word_embeddings=True)
    return model, tokenizer


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "good"
    model, tokenizer = tiny_model()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class Unpickled(Exception):
    pass


@pytest.fixture(autouse=True)
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any unpickling during these tests is a failure, wherever it comes from."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise Unpickled("something tried to unpickle")

    for target in ("pickle.load", "pickle.loads", "torch.load"):
        monkeypatch.setattr(target, refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)


def edit_config(path: Path, **changes: object) -> None:
    doc = json.loads((path / "config.json").read_text())
    doc.update(changes)
    (path / "config.json").write_text(json.dumps(doc))


def write_pickle_weights(path: Path, marker: Path) -> None:
    """A pytorch_model.bin that creates ``marker`` if anything ever unpickles it."""

    class Payload:
        def __reduce__(self) -> tuple[Any, tuple[str, str]]:
            return (open, (str(marker), "w"))

    (path / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))


def mutate(case: str, path: Path, marker: Path) -> None:
    weights = path / "model.safetensors"
    if case == "missing":
        shutil.rmtree(path)
    elif case == "a file":
        shutil.rmtree(path)
        path.write_text("not a directory")
    elif case == "no config":
        (path / "config.json").unlink()
    elif case == "config not json":
        (path / "config.json").write_bytes(b"\xff\xfe{")
    elif case == "not a causal lm":
        edit_config(path, model_type="vit")
    elif case == "unknown architecture":
        edit_config(path, model_type="zorblax")
    elif case == "wrong shape":
        edit_config(path, hidden_size=32)
    elif case == "wrong layer count":
        edit_config(path, num_hidden_layers=2)
    elif case == "no tokenizer":
        (path / "tokenizer.json").unlink()
    elif case in ("only a pickle", "no weights"):
        weights.unlink()
        if case == "only a pickle":
            write_pickle_weights(path, marker)
    elif case == "garbage weights":
        weights.write_bytes(os.urandom(64))
    elif case == "a tensor the model has no place for":
        _edit_weights(path, lambda w: w | {"model.layers.0.extra.weight": torch.zeros(2)})
    elif case == "truncated weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif case == "untied head missing":  # the weights store no lm_head: only a tied one may lack
        edit_config(path, tie_word_embeddings=False)
    elif case == "no chat template":
        _drop_template(path)
    elif case == "template drops the system message":
        _drop_template(path)
        (path / "chat_template.jinja").write_text(
            "{% for m in messages %}{% if m['role'] != 'system' %}{{ m['content'] }}\n"
            "{% endif %}{% endfor %}"
        )
    elif case == "template refuses a system message":
        _drop_template(path)
        (path / "chat_template.jinja").write_text(
            "{% for m in messages %}{% if m['role'] == 'system' %}"
            "{{ raise_exception('System role not supported') }}{% endif %}{% endfor %}"
        )
    elif case == "no eos token":
        doc = json.loads((path / "tokenizer_config.json").read_text())
        doc["eos_token"] = None
        (path / "tokenizer_config.json").write_text(json.dumps(doc))
    elif case == "tokenizer not json":
        (path / "tokenizer.json").write_text("garbage{")
    elif case == "a word-level tokenizer under qwen2":  # transformers rebuilds it as Qwen2's BPE
        words = ["<pad>", "<eos>", "<unk>", "you", "are", "in", "the", "kitchen", "look"]
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.save(str(path / "tokenizer.json"))
    else:
        raise AssertionError(case)


CASES = {
    "missing": "no such directory",
    "a file": "not a directory",
    "no config": "no config.json",
    "config not json": "config.json is not JSON",
    "not a causal lm": "model_type 'vit', not a causal language model",
    "unknown architecture": "model_type 'zorblax'",
    "wrong shape": "weights do not fit config.json: model.embed_tokens.weight has shape [",
    "wrong layer count": "config.json is invalid",
    "no tokenizer": "no tokenizer",
    "only a pickle": "weights only in pickle format (pytorch_model.bin)",
    "no weights": "no weights",
    "garbage weights": "model.safetensors is not a valid safetensors file",
    "truncated weights": "model.safetensors is not a valid safetensors file",
    "a tensor the model has no place for": "unexpected tensor 'model.layers.0.extra.weight'",
    "untied head missing": "no 'lm_head.weight', and the config does not tie it",
    "no chat template": "the tokenizer has no chat template",
    "template drops the system message": "the chat template leaves the system message out",
    "template refuses a system message": "the chat template refuses a system message",
    "no eos token": "the tokenizer has no eos token",
    "tokenizer not json": "the tokenizer (tokenizer.json, tokenizer_config.json) cannot be loaded",
    "a word-level tokenizer under qwen2": (
        "keeps 0 of 17 probe words where tokenizer.json keeps 8: transformers rebuilds a qwen2"
    ),
}


def _edit_weights(path: Path, edit: Any) -> None:
    from safetensors.torch import load_file, save_file

    weights = edit(load_file(path / "model.safetensors"))
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


def test_a_base_model_s_names_and_old_buffers_in_the_weights_are_accepted(
    good: Path, tmp_path: Path
) -> None:
    """A checkpoint whose names lack the causal LM's ``model.`` prefix (a base model's save)
    was refused as "26 tensors missing", though transformers loads it whole; one holding the
    buffers older conversions stored (Llama's ``rotary_emb.inv_freq``, the hub's GPT-2
    ``attn.bias``), which transformers' load ignores, as "unexpected tensor"."""
    base = tmp_path / "base"
    shutil.copytree(good, base)
    _edit_weights(base, lambda w: {k.removeprefix("model."): v for k, v in w.items()})
    buffers = tmp_path / "buffers"
    shutil.copytree(good, buffers)
    inv_freq = "model.layers.0.self_attn.rotary_emb.inv_freq"
    _edit_weights(buffers, lambda w: w | {inv_freq: torch.ones(4)})
    reference, _ = load_model_dir(good, torch.device("cpu"))
    for path in (base, buffers):
        check_model_dir(path)
        model, _ = load_model_dir(path, torch.device("cpu"))
        want, got = reference.state_dict(), model.state_dict()
        assert all(torch.equal(want[k], got[k]) for k in want), path.name


def test_an_instruct_model_s_turn_end_is_where_responses_end(tmp_path: Path) -> None:
    """A chat template that ends turns with ``<|end|>``, named an eos in
    generation_config.json beside the tokenizer's ``<eos>`` (Gemma-it's, Phi-3's,
    Llama-3-Instruct's layout): generation never stopped at ``<|end|>`` (every response ran to
    max_new_tokens, every action invalid) and scored actions were trained to end with
    ``<eos>``. The turn's end is the responses' end now; a model that names no other eos
    keeps its tokenizer's. A response also ends at every other eos the model names, as
    transformers' ``generate`` stops at each (it ran on past ``<eos>`` to max_new_tokens)."""
    from agents.models.prompts import decode_response, encode_response, end_ids

    model, tokenizer = tiny_model()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|end|>"]})
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    model.resize_token_embeddings(len(tokenizer))
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    for name, ends in [("instruct", [end, tokenizer.eos_token_id]), ("plain", None)]:
        path = tmp_path / name
        model.generation_config.eos_token_id = ends or tokenizer.eos_token_id
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        _, loaded = load_model_dir(path, torch.device("cpu"))
        want = "<|end|>" if ends else "<eos>"
        assert loaded.eos_token == want, name
        ids = encode_response(loaded, "look")
        assert ids[-1] == loaded.convert_tokens_to_ids(want)
        assert decode_response(loaded, [*ids, 7, 8]) == "look"
        assert end_ids(loaded) == ({end, tokenizer.eos_token_id} if ends else {ids[-1]}), name
        if ends:  # the model's other eos, drawn where the turn would end
            other = tokenizer.eos_token_id
            assert decode_response(loaded, [*ids[:-1], other, *ids[:-1]]) == "look"


def _drop_template(path: Path) -> None:
    (path / "chat_template.jinja").unlink(missing_ok=True)
    doc = json.loads((path / "tokenizer_config.json").read_text())
    doc.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_model_directory_is_refused_with_one_line(
    good: Path, tmp_path: Path, case: str
) -> None:
    path = tmp_path / "model"
    shutil.copytree(good, path)
    marker = tmp_path / "unpickled"
    mutate(case, path, marker)
    for attempt in (
        lambda: check_model_dir(path, "policy.model"),
        lambda: load_model_dir(path, torch.device("cpu")),
    ):
        with pytest.raises(ModelUnavailable) as info:
            attempt()
        message = str(info.value)
        assert CASES[case] in message, message
        assert "\n" not in message and len(message) < 600
    assert not marker.exists()


def test_pickled_weights_are_refused_by_the_cli_before_anything_runs(
    good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model"
    shutil.copytree(good, path)
    marker = tmp_path / "unpickled"
    mutate("only a pickle", path, marker)
    for command in ("validate", "run"):
        args = [command, QUICKSTART, "--set", f"policy.model={path}"]
        if command == "run":
            args += ["--out", str(tmp_path / "run"), "--quiet"]
        assert main(args) == 2
        err = capsys.readouterr().err
        prefix = f"coevo: error: {QUICKSTART}: $.policy.model = '{path}': weights only in pickle"
        assert err.startswith(prefix)
        assert err.count("\n") == 1
    assert not (tmp_path / "run").exists()
    assert not marker.exists()


def test_a_good_directory_loads(good: Path) -> None:
    assert check_model_dir(good) == good
    model, tokenizer = load_model_dir(good, torch.device("cpu"))
    assert model.config.hidden_size == 16
    assert tokenizer.pad_token == "<pad>"


# --- checkpoints --------------------------------------------------------------------------------


def test_a_checkpoint_is_fsynced_before_it_gets_its_name(
    good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = tiny_model()
    store = DirCheckpoints(tmp_path / "checkpoints", keep=2)
    trail: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, Path.rename

    def fsync(fd: int) -> None:
        trail.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(self: Path, target: Path) -> Path:
        trail.append(("rename", str(target)))
        return real_rename(self, target)

    monkeypatch.setattr(ckpt.os, "fsync", fsync)
    monkeypatch.setattr(Path, "rename", rename)
    name = store.save(1, model, tokenizer)
    final = tmp_path / "checkpoints" / "v000001"
    assert name == "checkpoints/v000001"
    renamed = trail.index(("rename", str(final)))
    synced = {path for op, path in trail[:renamed] if op == "fsync"}
    partial = tmp_path / "checkpoints" / ".v000001.partial"
    assert {str(partial / f.name) for f in final.iterdir()} | {str(partial)} <= synced
    assert ("fsync", str(tmp_path / "checkpoints")) in trail[renamed:]
    assert set(store.load(name)) == set(model.state_dict()) - {"lm_head.weight"}


def test_a_crash_before_the_rename_leaves_no_checkpoint_to_refer_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = tiny_model()
    store = DirCheckpoints(tmp_path / "checkpoints", keep=2)

    def crash(self: Path, target: Path) -> Path:
        raise KeyboardInterrupt("killed between write and rename")

    with monkeypatch.context() as patch:
        patch.setattr(Path, "rename", crash)
        with pytest.raises(KeyboardInterrupt):
            store.save(1, model, tokenizer)
    root = tmp_path / "checkpoints"
    assert [p.name for p in root.iterdir()] == [".v000001.partial"]
    with pytest.raises(ModelUnavailable, match="no checkpoint checkpoints/v000001"):
        store.load("checkpoints/v000001")
    assert store.save(1, model, tokenizer) == "checkpoints/v000001"  # the redo of that update
    assert sorted(p.name for p in root.iterdir()) == ["v000001"]
    check_model_dir(root / "v000001")


def test_a_damaged_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    model, tokenizer = tiny_model()
    store = DirCheckpoints(tmp_path / "checkpoints")
    name = store.save(3, model, tokenizer)
    weights = tmp_path / "checkpoints" / "v000003" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelUnavailable, match=r"^checkpoint checkpoints/v000003 is damaged: "):
        store.load(name)


def test_a_bad_extractor_directory_is_refused_by_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = str(ROOT / "scenarios" / "complementary.toml")
    setting = f"complementary.extractor={tmp_path / 'nope'}"
    assert (
        main(["validate", scenario, "--set", setting, "--set", "complementary.embedder=hashing"])
        == 2
    )
    err = capsys.readouterr().err
    assert err == (
        f"coevo: error: {scenario}: $.complementary.extractor = '{tmp_path / 'nope'}': "
        "no such directory "
        "(a model is a Hugging Face model directory)\n"
    )


# --- the models a run started from ---------------------------------------------------------------


def test_a_run_whose_prompts_were_cut_to_fit_the_model_says_so_at_its_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model built for few positions had every prompt cut, its goal among what was lost;
    the run said so once in its structured log (nothing on the console with ``--quiet``)."""
    from scenarios.loader import load_scenario
    from scenarios.policy_models import policy_model_dir

    path = tmp_path / "model"
    shutil.copytree(policy_model_dir(load_scenario(QUICKSTART, TINY), QUICKSTART), path)
    edit_config(path, max_position_embeddings=96)
    sets = [f"policy.model={path}", "run.episodes=16", "grpo.groups_per_update=2"]
    sets += ["grpo.group_size=8", "eval.every=0"]
    args = [a for s in sets for a in ("--set", s)]
    run = tmp_path / "ran"
    assert main(["run", QUICKSTART, "--out", str(run), "--quiet", *args]) == 0
    err = capsys.readouterr().err
    assert "coevo: warning: " in err and " actions were chosen from prompts cut in the middle " in (
        err
    )
    assert f"coevo log {run} --kind action_sampled shows prompt_cut" in err


def test_a_run_records_its_models_and_a_resume_on_other_files_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tokenizer or weights replaced in the model directory (or a relative path naming another
    directory from where ``resume`` runs) went on silently: a model trained on another base,
    prompts in another tokenizer."""
    from engine.eventlog import ModelFiles, new_run_meta
    from scenarios.loader import load_scenario, resolved_toml, scenario_hash
    from scenarios.policy_models import policy_model_dir
    from stores.lmdb_log import LmdbEventLog
    from stores.model_dirs import model_files

    path = tmp_path / "model"  # a copy of the embedded model, as a researcher's own directory
    shutil.copytree(policy_model_dir(load_scenario(QUICKSTART, TINY), QUICKSTART), path)
    sets = [f"policy.model={path}", 'run.method="rollout"', "run.episodes=2", "run.workers=1"]
    args = [a for s in sets for a in ("--set", s)]
    assert main(["run", QUICKSTART, "--out", str(tmp_path / "ran"), "--quiet", *args]) == 0
    with LmdbEventLog.open(tmp_path / "ran" / "log") as log:
        meta = log.read_meta()
    assert meta is not None and list(meta.models) == ["policy"]
    recorded = meta.models["policy"]
    assert recorded.path == str(path.resolve())
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= set(recorded.files)

    text = resolved_toml(load_scenario(QUICKSTART, sets))  # a run made, no event yet
    run = tmp_path / "run"
    started = ModelFiles(path=str(path.resolve()), files=model_files(path))
    made = new_run_meta(
        "r", scenario_name="q", seed=0, coevo_version="t", scenario_toml=text,
        scenario_hash=scenario_hash(text), models={"policy": started},
    )  # fmt: skip
    LmdbEventLog.create(run / "log", made).close()
    tokenizer = (path / "tokenizer.json").read_bytes()
    other = json.loads(tokenizer)
    other["model"]["vocab"] = {
        w: len(other["model"]["vocab"]) - 1 - i for w, i in other["model"]["vocab"].items()
    }
    (path / "tokenizer.json").write_text(json.dumps(other))
    assert main(["resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"coevo: error: {run}: the policy model {path.resolve()} is not the")
    assert "is not the one the run started from: tokenizer.json changed" in err
    with LmdbEventLog.open(run / "log") as log:
        assert log.next_seq == 0  # nothing was written
    (path / "tokenizer.json").write_bytes(tokenizer)
    moved = tmp_path / "elsewhere"  # the directory moved: "no such directory", no way on
    path.rename(moved)
    assert main(["resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"coevo: error: {run}: the policy model directory the run started ")
    assert f"from, {path.resolve()}, is gone" in err and "put the directory back there" in err
    moved.rename(path)
    assert main(["resume", str(run), "--quiet"]) == 0


def test_a_tokenizer_without_tokens_for_the_prompts_words_is_refused(tmp_path: Path) -> None:
    """A word-level vocabulary of a few words (read back as written, under a Llama config)
    passed: the goal reached the model as ``<unk> the <unk> <unk>`` and different actions as
    the same ids. The probe of prompt words is read back whole or the model is refused."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from agents.testing.models import CHAT_TEMPLATE

    words = ["<pad>", "<eos>", "<unk>", "you", "are", "in", "the", "look", "open", "door"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    path = tmp_path / "llama"
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    with pytest.raises(
        ModelUnavailable, match=r"reads back 9 of 17 probe words .*\(lost: kitchen, around, "
    ):
        check_model_dir(path)


def test_a_tokenizer_larger_than_the_models_embedding_is_refused(tmp_path: Path) -> None:
    """Ids past the embedding were an ``IndexError: index out of range in self`` in the run's
    inference actor, naming neither the vocabulary nor the tokenizer."""
    _, tokenizer = tiny_model()
    path = tmp_path / "model"
    tiny_qwen2(50, hidden=16, positions=64, tie_word_embeddings=True).save_pretrained(path)
    tokenizer.save_pretrained(path)
    with pytest.raises(
        ModelUnavailable, match=rf"has {len(tokenizer)} tokens, the model's embedding 50"
    ) as refused:
        check_model_dir(path)
    # which tokens lie past it (a rebuilt Qwen2 tokenizer's added <|endoftext|> was refused
    # without a word of which token it was)
    past = tokenizer.convert_ids_to_tokens([50, 51, 52])
    assert f"(from id 50: {', '.join(map(repr, past))}, ...:" in str(refused.value)


def test_a_response_longer_than_half_the_models_positions_is_refused_by_validate(
    good: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``max_new_tokens = 100`` on a model of 64 positions went past them: an ``IndexError``
    mid-run for learned positions, rotary ones computed on beyond what they were built for."""
    base = ["--set", f"policy.model={good}", "--set", 'policy.mode="generate"']
    assert main(["validate", QUICKSTART, *base, "--set", "policy.max_new_tokens=33"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "$.policy.max_new_tokens = 33: the model is" in err, err
    assert "built for 64 positions, and a response may take at most half of them (32)" in err
    assert main(["validate", QUICKSTART, *base, "--set", "policy.max_new_tokens=32"]) == 0
    capsys.readouterr()
    empo2 = str(ROOT / "scenarios" / "empo2.toml")
    tips = ["--set", f"policy.model={good}", "--set", "empo2.tip_tokens=40"]
    assert main(["validate", empo2, *tips, "--set", 'empo2.embedder="hashing"']) == 2
    assert "$.empo2.tip_tokens = 40" in capsys.readouterr().err
    # the embedded model (1,024 positions) is checked from its spec, before anything is built
    generate = ["--set", 'policy.mode="generate"', "--set", "policy.max_new_tokens=513"]
    assert main(["validate", QUICKSTART, *generate]) == 2
    assert "max_new_tokens = 513: the model is built for 1024" in capsys.readouterr().err
    # an extractor on the policy's own weights (the default) is checked against them
    comp = str(ROOT / "scenarios" / "complementary.toml")
    sets = ["--set", f"policy.model={good}", "--set", "complementary.max_new_tokens=40"]
    sets += [
        "--set",
        'complementary.extractor="embedded"',
        "--set",
        "complementary.embedder=hashing",
    ]
    assert main(["validate", comp, *sets]) == 2
    assert "$.complementary.max_new_tokens = 40" in capsys.readouterr().err


def test_a_resume_on_another_build_of_the_embedded_model_says_where_to_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The embedded model is built on each machine: "resume with that model" could not be
    followed when this machine's build differs from the one the run started from."""
    from engine.eventlog import ModelFiles, new_run_meta
    from scenarios.loader import load_scenario, resolved_toml, scenario_hash
    from scenarios.policy_models import policy_model_dir
    from stores.lmdb_log import LmdbEventLog
    from stores.model_dirs import model_files

    sets = ['run.method="rollout"', "run.episodes=2", "run.workers=1", *TINY]
    scenario = load_scenario(QUICKSTART, sets)
    built = policy_model_dir(scenario, QUICKSTART)
    files = {**model_files(built), "model.safetensors": "0" * 64}  # another machine's build
    text = resolved_toml(scenario)
    made = new_run_meta(
        "r", scenario_name="q", seed=0, coevo_version="t", scenario_toml=text,
        scenario_hash=scenario_hash(text),
        models={"policy": ModelFiles(path=str(built.resolve()), files=files)},
    )  # fmt: skip
    LmdbEventLog.create(tmp_path / "run" / "log", made).close()
    assert main(["resume", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert "model.safetensors changed; the embedded model is built on each machine" in err, err


def test_checkpoints_and_cached_models_are_readable_as_the_umask_says(tmp_path: Path) -> None:
    """safetensors writes its files 0600 and the cache's build directory was made 0700: another
    user of a shared run directory or model cache could not read a checkpoint or the model."""
    from agents.models.pretrain import cached_build

    old = os.umask(0o022)
    try:
        model, tokenizer = tiny_model()
        store = DirCheckpoints(tmp_path / "checkpoints", keep=2)
        store.save(1, model, tokenizer, {"m": torch.zeros(2)})
        version = tmp_path / "checkpoints" / "v000001"

        def build(out: Path) -> None:
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)

        built = cached_build(tmp_path / "cache", "k", ("model.safetensors",), build)
        for root in (version, built):
            assert root.stat().st_mode & 0o777 == 0o755
            modes = {p.name: p.stat().st_mode & 0o777 for p in root.iterdir()}
            assert modes["model.safetensors"] == 0o644, modes
            assert set(modes.values()) == {0o644}, modes
    finally:
        os.umask(old)


def test_no_file_descriptor_left_is_not_called_a_damaged_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a low ``ulimit -n`` the learner's model check said "model.safetensors is not a
    valid safetensors file (... Too many open files (os error 24))", blaming the file."""
    import safetensors

    from engine.errors import ModelUnavailable
    from stores import model_dirs

    def no_fd(path: str, framework: str) -> None:
        raise OSError(f"unable to open file {path}: Too many open files (os error 24)")

    monkeypatch.setattr(safetensors, "safe_open", no_fd)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ModelUnavailable, match="too many open files in this process") as err:
        model_dirs.tensor_shapes(weights, "model")
    assert "not a valid safetensors file" not in str(err.value)


def test_checking_a_half_precision_model_leaves_torch_s_default_dtype_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking a checkpoint whose config says ``bfloat16`` (most real ones) built it on the
    meta device in that dtype, which set torch's default dtype for the whole process while it
    built: the run's inference thread made its attention mask in float16 meanwhile and failed
    (``Expected attn_mask dtype ...``), in 1 to 3 of 3 runs of such checkpoints."""
    path = tmp_path / "bf16"
    model, tokenizer = tiny_model()
    model.to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"
    seen: list[torch.dtype] = []
    real = torch.set_default_dtype

    def spy(dtype: torch.dtype) -> None:
        seen.append(dtype)
        real(dtype)

    monkeypatch.setattr(torch, "set_default_dtype", spy)
    check_model_dir(path)
    loaded, _ = load_model_dir(path, torch.device("cpu"))
    assert next(loaded.parameters()).dtype == torch.float32
    assert set(seen) <= {torch.float32}, seen


def test_a_model_that_names_its_positions_otherwise_is_checked_against_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GPT-2's config says ``n_positions``, not ``max_position_embeddings`` (transformers maps
    one to the other): validate read only the latter, so a response of 200 tokens on a model
    of 128 positions passed it and failed the run (``IndexError`` in the position table)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = tiny_tokenizer(["look", "open", "door", "take", "key"])
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=128, n_embd=16, n_layer=1, n_head=2,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    path = tmp_path / "gpt2"
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    assert "max_position_embeddings" not in json.loads((path / "config.json").read_text())
    assert positions_of(path) == 128
    base = ["--set", f"policy.model={path}", "--set", 'policy.mode="generate"']
    assert main(["validate", QUICKSTART, *base, "--set", "policy.max_new_tokens=65"]) == 2
    assert "built for 128 positions" in capsys.readouterr().err


def test_checkpoints_whose_weights_transformers_renames_as_it_loads_are_checked_by_the_load(
    tmp_path: Path,
) -> None:
    """transformers 5 stores GPT-NeoX's output layer as ``embed_out`` and Mixtral's experts
    one by one, and renames or fuses them as it loads: comparing the file's names with the
    built model's refused such checkpoints, written by transformers itself. Their load's own
    report is checked instead: a tensor left out is still refused."""
    from safetensors.torch import load_file, save_file
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, MixtralConfig, MixtralForCausalLM

    tokenizer = tiny_tokenizer(["look", "open", "door", "take", "key"])
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    sizes = {"vocab_size": len(tokenizer), "hidden_size": 32, "num_hidden_layers": 1}
    sizes |= {"num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 128}
    models = {
        "neox": GPTNeoXForCausalLM(GPTNeoXConfig(**sizes, **ids)),
        "mixtral": MixtralForCausalLM(
            MixtralConfig(**sizes, **ids, num_key_value_heads=1, num_local_experts=2)
        ),
    }
    for name, model in models.items():
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        check_model_dir(tmp_path / name)
        loaded, _ = load_model_dir(tmp_path / name, torch.device("cpu"))
        assert type(loaded) is type(model)
    assert "embed_out.weight" in load_file(tmp_path / "neox" / "model.safetensors")
    shutil.copytree(tmp_path / "neox", tmp_path / "short")
    weights = load_file(tmp_path / "short" / "model.safetensors")
    del weights["gpt_neox.layers.0.mlp.dense_4h_to_h.bias"]
    save_file(weights, tmp_path / "short" / "model.safetensors", metadata={"format": "pt"})
    check_model_dir(tmp_path / "short")  # the names are the load's to check
    with pytest.raises(ModelUnavailable, match=r"1 tensors missing \(first 'gpt_neox.layers.0"):
        load_model_dir(tmp_path / "short", torch.device("cpu"))


def test_a_checkpoint_of_a_renamed_architecture_loads_back_into_the_model(tmp_path: Path) -> None:
    """A run's checkpoint (``DirCheckpoints.save``) of a GPT-NeoX or Mixtral policy did not load
    back into the inference model (``load_weights``): transformers stored GPT-NeoX's
    ``lm_head`` as ``embed_out`` and Mixtral's fused experts one by one, and every such run
    failed at its first weight sync. Checkpoints keep the model's own names now, and a file in
    transformers' stored layout (an older checkpoint) is read through its renames."""
    from safetensors.torch import load_file
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, MixtralConfig, MixtralForCausalLM

    tokenizer = tiny_tokenizer(["look", "open", "door", "take", "key"])
    sizes = {"vocab_size": len(tokenizer), "hidden_size": 32, "num_hidden_layers": 1}
    sizes |= {"num_attention_heads": 2, "intermediate_size": 64}
    built = {
        "neox": lambda: GPTNeoXForCausalLM(GPTNeoXConfig(**sizes, tie_word_embeddings=False)),
        "mixtral": lambda: MixtralForCausalLM(
            MixtralConfig(**sizes, num_key_value_heads=1, num_local_experts=2)
        ),
    }
    for name, build in built.items():
        torch.manual_seed(0)
        trained = build()
        torch.manual_seed(1)
        served = build()
        store = DirCheckpoints(tmp_path / name)
        ckpt.load_weights(served, store.load(store.save(1, trained, tokenizer)))
        want, got = trained.state_dict(), served.state_dict()
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want), name
    torch.manual_seed(0)
    trained = built["neox"]()
    torch.manual_seed(1)
    served = built["neox"]()
    trained.save_pretrained(tmp_path / "original")  # transformers' stored names
    stored = load_file(tmp_path / "original" / "model.safetensors")
    assert "embed_out.weight" in stored
    ckpt.load_weights(served, stored)
    assert torch.equal(
        served.get_output_embeddings().weight, trained.get_output_embeddings().weight
    )


def test_a_reply_is_read_up_to_an_end_id_that_is_an_ordinary_token() -> None:
    """A generation config may name an ordinary token an eos: generation stopped at it, but
    the reply's text (a generated action, a tip) was decoded with it (``take door`` for the
    response ``take`` + that eos), where the response ends before it."""
    from types import SimpleNamespace

    from agents.acting.inference import write_replies
    from stores.model_dirs import END_IDS

    _, tokenizer = tiny_model()
    ids = tokenizer.encode("take door", add_special_tokens=False)
    setattr(tokenizer, END_IDS, frozenset({ids[-1]}))

    class Drawn:
        def generate(self, prompts: Any, rngs: Any, **_: Any) -> Any:
            return [(ids, [0.0] * len(ids)) for _ in prompts]

    ask = SimpleNamespace(messages=(("system", "s"), ("user", "look")), seed=1)
    (reply,) = write_replies(Drawn(), tokenizer, [ask], temperature=1.0, max_new_tokens=4)  # type: ignore[arg-type]
    assert reply.ids == ids and reply.text == "take"


def test_a_stop_while_the_embedded_model_is_built_says_what_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped during a build of minutes (a cold cache), a run said only "coevo: terminated"
    and left no run directory: what was stopped, and that the build is done again, is said."""
    import agents.models.embedded
    from scenarios.cli.entry import Terminated
    from scenarios.loader import load_scenario
    from scenarios.policy_models import policy_model_dir

    def stopped(*args: object, **kwargs: object) -> None:
        raise Terminated

    monkeypatch.setattr(agents.models.embedded, "ensure_embedded", stopped)
    with pytest.raises(Terminated):
        policy_model_dir(load_scenario(QUICKSTART, TINY), QUICKSTART)
    assert capsys.readouterr().err == (
        "coevo: note: stopped while the embedded model was being built: nothing of the build "
        "is kept, and the next run that needs it builds it again\n"
    )
