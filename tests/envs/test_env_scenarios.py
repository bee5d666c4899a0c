"""The ScienceWorld and TextWorld scenario files (rollout, GRPO, EMPO2, Complementary RL): they
validate against the schema (always) and run end to end with the embedded policy (``slow``,
with the extras installed)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scenarios.loader import load_scenario

ROOT = Path(__file__).resolve().parents[2]
COEVO = str(Path(sys.executable).parent / "coevo")
FILES = {
    "sciworld_rollout": "scienceworld",
    "sciworld_grpo": "scienceworld",
    "sciworld_empo2": "scienceworld",
    "textworld_rollout": "textworld",
    "textworld_grpo": "textworld",
    "textworld_empo2": "textworld",
    "textworld_complementary": "textworld",
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_scenario_validates_and_pins_the_minilab_model(name: str) -> None:
    scenario = load_scenario(ROOT / "scenarios" / f"{name}.toml")
    assert scenario.world.name == FILES[name]
    assert scenario.policy.embedded == {"world": "minilab", "world_options": {}, "window": 4}
    assert scenario.run.method == name.split("_")[1]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FILES))
def test_the_scenario_runs_end_to_end(name: str, tmp_path: Path) -> None:
    extra = FILES[name]
    if importlib.util.find_spec(extra) is None:
        pytest.skip(f"the {extra} extra is not installed")
    if extra == "scienceworld" and shutil.which("java") is None:
        pytest.skip("ScienceWorld needs Java on PATH")
    out = tmp_path / "run"
    proc = subprocess.run(
        [COEVO, "run", str(ROOT / "scenarios" / f"{name}.toml"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    log = subprocess.run(
        [COEVO, "log", str(out), "--json"], capture_output=True, text=True, check=True
    )
    kinds = [json.loads(line)["event"]["kind"] for line in log.stdout.splitlines()]
    assert "episode_aborted" not in kinds
    assert kinds.count("episode_finished") >= load_scenario(out / "scenario.toml").run.episodes
    updates = {"rollout": 0, "grpo": 2, "empo2": 2, "complementary": 1}[name.split("_")[1]]
    assert kinds.count("policy_updated") == updates
    assert kinds[-1] == "run_stopped"
