"""A tiny GRPO run of the embedded model with LoRA adapters and truncated importance sampling,
end to end through the CLI: checkpoints are adapter safetensors that load on the base model, the
updates record the memory they cost and the sampler's gap, every update re-executes bit for bit,
and a run stopped mid-way and resumed ends as the run left alone."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from resume_kit import (
    COMPLEMENTARY,
    GRPO,
    check_consistent,
    coevo,
    comparable,
    final_digest,
    finish,
    read_log,
    stop_and_resume,
)
from test_grpo_run import run_scenario

from agents.events.extractor import ExtractorUpdated
from agents.events.policy import GradientRequested, PolicyUpdated
from agents.models.tuning import load_adapted
from engine.events import Envelope, Event
from scenarios.cli import main
from scenarios.loader import load_scenario
from scenarios.probe_setup import RunLog
from scenarios.probe_setup import _policy as probe_policy  # pyright: ignore[reportPrivateUsage]
from stores.checkpoints import ADAPTER_FILE, WEIGHTS_FILE, param_digest
from stores.model_dirs import load_model_dir

LORA = (
    GRPO.replace('name = "resume-grpo"', 'name = "lora-grpo"')
    .replace(
        "[policy]\n", '[policy]\nlora = { r = 4, alpha = 8, targets = ["q_proj", "v_proj"] }\n'
    )
    .replace("[grpo]\n", "[grpo]\ntis_cap = 2.0\n")
)
"""resume_kit's deterministic GRPO scenario (3 updates, hidden 32, one layer of 2 heads and one
KV head) with rank-4 adapters on the query and value projections, and a TIS cap."""

# q_proj 32 -> 32 and v_proj 32 -> 16 in the one layer: r * (in + out) each
ADAPTER_PARAMS = 4 * (32 + 32) + 4 * (32 + 16)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lora")
    (path / "scenario.toml").write_text(LORA)
    return path


@pytest.fixture(scope="module")
def reference(root: Path) -> list[Envelope[Event]]:
    """The scenario run without interruption."""
    finish(coevo(["run", str(root / "scenario.toml"), "--out", str(root / "ref"), "--quiet"], root))
    return read_log(root / "ref")


def updates(envs: list[Envelope[Event]]) -> list[PolicyUpdated]:
    return [env.event for env in envs if isinstance(env.event, PolicyUpdated)]


def test_checkpoints_are_adapters_that_load_on_the_base_model(
    root: Path, reference: list[Envelope[Event]]
) -> None:
    last = updates(reference)[-1]
    saved = root / "ref" / last.checkpoint
    assert (saved / ADAPTER_FILE).is_file() and (saved / "adapter_config.json").is_file()
    assert not (saved / WEIGHTS_FILE).exists()  # no copy of the frozen base
    (model_dir,) = (root / "embedded").glob("*[!k]")
    base, _ = load_model_dir(model_dir, torch.device("cpu"))
    untrained = param_digest(base)
    loaded = load_adapted(base, str(saved))
    assert param_digest(loaded) == last.digest != untrained


def test_updates_record_the_memory_they_cost_and_the_samplers_gap(
    reference: list[Envelope[Event]],
) -> None:
    done = updates(reference)
    assert len(done) == 3
    requests = [env.event for env in reference if isinstance(env.event, GradientRequested)]
    assert {r.tis_cap for r in requests} == {2.0}
    for u in done:
        assert u.trainable_params == ADAPTER_PARAMS
        assert u.total_params is not None and u.total_params > 20 * ADAPTER_PARAMS
        # AdamW's two float32 moments per adapter parameter, a float32 step per adapter tensor
        assert u.optimizer_bytes == 2 * 4 * ADAPTER_PARAMS + 4 * 4
        assert u.peak_bytes is None  # CPU
        # the hf backend samples with the learner's own float32 module: batching noise only
        assert u.gap_abs_mean is not None and u.gap_abs_max is not None and u.gap_kl is not None
        assert 0 <= u.gap_abs_mean <= u.gap_abs_max < 1e-4
        assert u.tis_clip_frac == 0.0


def test_every_adapter_update_re_executes_bit_for_bit(
    root: Path,
    reference: list[Envelope[Event]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COEVO_CACHE", str(root))
    assert main(["replay", str(root / "ref"), "--reexecute-learner"]) == 0
    out = capsys.readouterr().out
    assert "re-executed 3 policy and 0 extractor updates: every parameter digest matches" in out


def test_a_run_stopped_and_resumed_ends_as_the_run_left_alone(
    root: Path, reference: list[Envelope[Event]]
) -> None:
    half = len(reference) // 2
    chain = stop_and_resume(root, root / "scenario.toml", "stopped", [(signal.SIGINT, half)])
    assert len(chain.after) == 1, "the run ended before the stop"
    assert any(isinstance(env.event, PolicyUpdated) for env in chain.after[0])  # resumed a version
    check_consistent(root / "stopped", chain.final, chain.after)
    assert final_digest(chain.final) == final_digest(reference)
    assert comparable(chain.final) == comparable(reference)


@pytest.mark.slow
def test_a_complementary_run_with_adapters_on_both_models_re_executes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The extractor's adapters too: its checkpoints are adapters, its updates record what they
    cost, and every update of both models re-executes bit for bit (slow: ~70 s on a loaded
    2-core machine; the extractor's step with adapters is in tests/unit/test_lora.py)."""
    lora = '{ r = 4, alpha = 8, targets = ["q_proj", "v_proj"] }'
    text = COMPLEMENTARY.replace("[policy]\n", f"[policy]\nlora = {lora}\n").replace(
        "[complementary]\n", f"[complementary]\nlora = {lora}\n"
    )
    run = run_scenario(tmp_path, text)
    envs = read_log(run)
    extractor = [e.event for e in envs if isinstance(e.event, ExtractorUpdated)]
    assert len(updates(envs)) == 3 and extractor and any(u.samples > 0 for u in extractor)
    for u in extractor:
        assert u.trainable_params is not None and u.total_params is not None
        assert 0 < u.trainable_params < u.total_params / 10
        assert (run / u.checkpoint / ADAPTER_FILE).is_file() or not (run / u.checkpoint).exists()
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    assert main(["replay", str(run), "--reexecute-learner"]) == 0
    out = capsys.readouterr().out
    assert f"re-executed 3 policy and {len(extractor)} extractor updates" in out
    # the probe loads the extractor's adapter checkpoints (it failed on every LoRA extractor)
    probe = ["probe", str(run), "--episodes", "2", "--versions", "0,last"]
    assert main([*probe, "--out", str(tmp_path / "probe")]) == 0


def test_the_probe_plays_the_final_adapters_on_the_base_model(
    root: Path, reference: list[Envelope[Event]]
) -> None:
    """``coevo probe --policy final`` of a LoRA run: its adapters on the base, checked against
    the digest the log records (a mismatch is ProbeInvalid)."""
    run_dir = root / "ref"
    scenario = load_scenario(run_dir / "scenario.toml")
    run = RunLog(run_dir, scenario, str(run_dir / "scenario.toml"), scenario.seed)
    run.policy = updates(reference)
    (model_dir,) = (root / "embedded").glob("*[!k]")
    runner, what = probe_policy(run, model_dir, "final")
    assert "version 3" in what and param_digest(runner.model) == run.policy[-1].digest
