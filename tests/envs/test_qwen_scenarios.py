"""The ScienceWorld scenarios for a local Qwen2.5-Instruct directory (EMPO2, Complementary RL):
as shipped, with a model path that is not there, ``coevo validate`` says so in one line; pointed
at a local model directory they validate, with LoRA on a bf16 base or (1.5B) every parameter in
float32; the settings they cannot run with are refused in one line. Validation loads no weights,
so a tiny Qwen2 directory stands in for the real one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agents.testing.models import tiny_qwen2, tiny_tokenizer
from scenarios.cli import main
from scenarios.loader import load_scenario

pytest.importorskip("scienceworld")

ROOT = Path(__file__).resolve().parents[2]
FILES = {
    "sciworld_qwen_empo2": "empo2",
    "sciworld_qwen_complementary": "complementary",
}


@pytest.fixture(scope="module")
def local_qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 model directory, as a user's local checkpoint is laid out."""
    tokenizer = tiny_tokenizer(["look", "open", "door"])
    path = tmp_path_factory.mktemp("models") / "Qwen2.5-tiny-Instruct"
    model = tiny_qwen2(len(tokenizer), hidden=16, positions=1024)  # room for the files' responses
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def validate(
    capsys: pytest.CaptureFixture[str], name: str, overrides: list[str]
) -> tuple[int, str]:
    args = ["validate", str(ROOT / "scenarios" / f"{name}.toml")]
    for item in ['policy.device="cpu"', *overrides]:  # validation needs no GPU
        args += ["--set", item]
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.err.strip()


def pointed_at(name: str, model: Path) -> list[str]:
    out = [f'policy.model="{model}"']
    if FILES[name] == "complementary":
        out.append(f'complementary.extractor="{model}"')
    return out


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_shipped_file_names_a_path_and_says_clearly_that_it_is_missing(
    name: str,
    local_qwen: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # "~/models/..." is not there
    scenario = load_scenario(ROOT / "scenarios" / f"{name}.toml")
    assert scenario.run.method == FILES[name] and scenario.world.name == "scienceworld"
    assert scenario.policy.mode == "generate" and scenario.policy.lora.r == 64
    assert scenario.grpo.group_size == 8 and scenario.grpo.tis_cap == 2.0
    code, err = validate(capsys, name, [])
    assert code == 2 and err.count("\n") == 0, err
    assert err.startswith("coevo: error:")
    missing = {  # the extractor's directory is checked first
        "empo2": "$.policy.model = '~/models/Qwen2.5-7B-Instruct': no such directory",
        "complementary": "$.complementary.extractor = '~/models/Qwen2.5-1.5B-Instruct': no such",
    }
    assert missing[FILES[name]] in err
    if FILES[name] == "complementary":  # with the extractor there, the policy's path is named
        shutil.copytree(local_qwen, tmp_path / "models" / "Qwen2.5-1.5B-Instruct")
        code, err = validate(capsys, name, [])
        assert code == 2 and "$.policy.model = '~/models/Qwen2.5-7B-Instruct': no such" in err


@pytest.mark.parametrize("name", sorted(FILES))
def test_pointed_at_a_local_model_directory_the_file_validates(
    name: str, local_qwen: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = validate(capsys, name, pointed_at(name, local_qwen))
    assert code == 0, err
    # Qwen2.5-1.5B with every parameter trained in float32, as the file's comment says
    full = ["policy.lora.r=0", 'policy.dtype="float32"', "grpo.lr=1e-6"]
    if FILES[name] == "complementary":
        full.append("complementary.lora.r=0")
    code, err = validate(capsys, name, pointed_at(name, local_qwen) + full)
    assert code == 0, err


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (['policy.backend="vllm"'], "$.policy.backend: no inference backend 'vllm' in this build"),
        (["policy.lora.r=0"], '$.policy.dtype: the policy: dtype = "bfloat16" needs lora'),
        (["complementary.lora.r=0"], "$.policy.dtype: the extractor:"),
        (["policy.lora={r = 8, alpha = 16, targets = []}"], "$.policy.lora.targets"),
    ],
)
def test_settings_it_cannot_run_with_are_one_line(
    local_qwen: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], fragment: str
) -> None:
    name = "sciworld_qwen_complementary"
    code, err = validate(capsys, name, pointed_at(name, local_qwen) + overrides)
    assert code == 2 and err.count("\n") == 0, err
    assert fragment in err
