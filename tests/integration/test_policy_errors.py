"""Bad learning settings end in one line and exit 2, before anything runs or is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from scenarios.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "scenarios" / "quickstart.toml")


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["agent.kind=explorer"], 'needs kind = "policy"'),
        (["run.episodes=16"], "less than one update"),
        (["policy.model=/no/such/model"], "/no/such/model"),
        (["policy.embedded={hidden_sise = 3}"], "$.policy.embedded"),
        (["policy.embedded={layers = 0}"], "$.policy.embedded"),
        (["policy.embedded.world=nosuch"], "$.policy.embedded.world: unknown world 'nosuch'"),
        (
            ["policy.embedded.world_options.zz=1"],
            "$.policy.embedded.world_options: bad options for world 'minilab'",
        ),
        (["eval.adapt_attempts=1"], "$.eval: eval.adapt_attempts needs a memory"),
        (["grpo.dual_clip=0.5"], "dual_clip must be 0 (off) or greater than 1, got 0.5"),
        (["grpo.dual_clip=1"], "dual_clip must be 0 (off) or greater than 1, got 1"),
        (
            ['run.method="empo2"', "empo2.low_prob_mask=true"],
            '$.empo2.low_prob_mask: needs policy.mode = "generate"',
        ),
    ],
)
def test_bad_learning_settings_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], fragment: str
) -> None:
    args = ["run", QUICKSTART, "--out", str(tmp_path / "run"), "--quiet"]
    for item in overrides:
        args += ["--set", item]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("coevo: error:") and "\n" not in err
    assert fragment in err


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["complementary.ops={stepz = 3}"], "$.complementary.ops: unknown field(s) ['stepz']"),
        (["complementary.ops={merge_chunk = 1}"], "$.complementary.ops: merge_chunk must be"),
        (  # the stage taught another number of operations than the run's prompts asked for
            ["complementary.ops={max_ops = 7}"],
            "$.complementary.ops.max_ops = 7: the operation format is taught with "
            "$.complementary.max_ops (3)",
        ),
        (["policy.model=/no/such/model"], '"embedded-ops" teaches the embedded model'),
    ],
)
def test_bad_extractor_settings_are_one_line_and_exit_2_before_any_build(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    overrides: list[str],
    fragment: str,
) -> None:
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    args = ["run", str(ROOT / "scenarios" / "complementary.toml"), "--quiet"]
    args += ["--out", str(tmp_path / "run"), "--set", 'complementary.extractor="embedded-ops"']
    for item in overrides:
        args += ["--set", item]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("coevo: error:") and "\n" not in err
    assert fragment in err
    assert not (tmp_path / "cache").exists()


def test_validate_checks_learning_settings_without_building_the_model(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    assert main(["validate", QUICKSTART]) == 0
    assert 'method = "grpo"' in capsys.readouterr().out
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("scenario", ["empo2.toml", "complementary.toml"])
def test_a_missing_embedding_model_is_one_line_and_exit_2_before_the_run(
    scenario: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agents.models.embedder.MINILM_PACKAGE", "no_such_minilm_package")
    assert main(["validate", str(ROOT / "scenarios" / scenario)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("coevo: error:") and "\n" not in err
    assert "all-MiniLM-L6-v2 is not installed" in err and "hashing" in err


TEMPLATE_WORLD = """
from scenarios.worlds.minilab import MiniLab

class Templ(MiniLab):
    templates = True  # its admissible actions are for a model that writes its own
"""


@pytest.mark.parametrize(
    ("scenario", "overrides", "refused"),
    [
        ("quickstart.toml", [], 'policy.mode = "score" picks one of them'),
        ("explore.toml", [], "agent.kind = 'explorer' picks one of them"),
        ("quickstart.toml", ['policy.mode="generate"'], ""),
    ],
    ids=["score", "scripted", "generate"],
)
def test_a_world_of_action_templates_needs_a_policy_that_writes_its_actions(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    scenario: str,
    overrides: list[str],
    refused: str,
) -> None:
    """ScienceWorld's ``actions = "templates"`` (``open OBJ``) was accepted with a scripted
    agent or a "score" policy, which then played the placeholders word for word."""
    (tmp_path / "templ.py").write_text(TEMPLATE_WORLD)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["validate", str(ROOT / "scenarios" / scenario), "--set", 'world.name="templ:Templ"']
    for item in overrides:
        args += ["--set", item]
    code = main(args)
    err = capsys.readouterr().err.strip()
    if not refused:
        assert code == 0, err
        return
    assert code == 2 and err.startswith("coevo: error:") and "\n" not in err, err
    assert refused in err and "templates ('open OBJ')" in err, err


@pytest.mark.parametrize(
    "override",
    ["policy.embedded.world=nosuch", "policy.embedded.world_options.zz=1"],
    ids=["world", "options"],
)
def test_validate_builds_the_world_the_embedded_model_learns(
    capsys: pytest.CaptureFixture[str], override: str
) -> None:
    """``validate`` accepted a world (or options) for the embedded model that could not be
    built; ``run`` then failed at the model's build, blaming ``$.policy.model``."""
    assert main(["validate", QUICKSTART, "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert "$.policy.embedded.world" in err and "\n" not in err, err


NO_HELDOUT_WORLD = """
from scenarios.worlds.minilab import MiniLab

class NoHeld(MiniLab):
    def tasks(self, family, split):
        return [] if split == "heldout" else super().tasks(family, split)
"""


def test_a_world_without_heldout_tasks_learns_with_evaluation_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``eval.every = 0`` (no evaluation round) the held-out split was listed all the
    same, and a world without one was refused, the message naming neither eval key."""
    (tmp_path / "noheld.py").write_text(NO_HELDOUT_WORLD)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["validate", QUICKSTART, "--set", 'world.name="noheld:NoHeld"']
    assert main([*args, "--set", "eval.every=0"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "no heldout tasks" in err and "eval.every = 0 plays none" in err, err
