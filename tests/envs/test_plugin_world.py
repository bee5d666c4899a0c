"""The worked example of docs/ENVIRONMENTS.md is real: its world, taken from the page as it
stands, runs through ``coevo run`` by import path with no change to coevo, and its option
errors reach the user as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import doc_block

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ENVIRONMENTS.md"
COEVO = str(Path(sys.executable).parent / "coevo")


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    (tmp_path / "corridor.py").write_text(doc_block(DOC, "# corridor.py"))
    (tmp_path / "corridor.toml").write_text(doc_block(DOC, "# corridor.toml"))
    return tmp_path


def coevo(plugin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(plugin_dir)}
    return subprocess.run(
        [COEVO, *args], capture_output=True, text=True, cwd=plugin_dir, env=env, timeout=120
    )


def test_the_documented_world_runs_by_import_path(plugin_dir: Path) -> None:
    proc = coevo(plugin_dir, "run", "corridor.toml", "--out", "run")
    assert proc.returncode == 0, proc.stderr
    out = coevo(plugin_dir, "log", "run", "--kind", "episode_finished", "--json")
    finished = [json.loads(line)["event"] for line in out.stdout.splitlines()]
    assert len(finished) == 20
    assert {f["family"] for f in finished} == {"corridor"}
    assert any(f["success"] for f in finished) and not all(f["success"] for f in finished)
    assert all(f["score"] == (1.0 if f["success"] else 0.0) for f in finished)


def test_the_documented_world_reports_bad_options_on_one_line(plugin_dir: Path) -> None:
    proc = coevo(plugin_dir, "validate", "corridor.toml", "--set", "world.options.length=0")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "coevo: error: corridor.toml: $.world.options: bad options for world 'corridor:Corridor': "
        "length must be between 1 and 20, got 0"
    )


def test_check_strict_fails_where_a_plugin_of_the_run_does_not_import(
    plugin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Without the plug-in on the path, ``check`` passed (exit 0) with a note on stderr while
    the plug-in's own invariants went unchecked: ``--strict`` makes that a failure, for CI."""
    assert coevo(plugin_dir, "run", "corridor.toml", "--out", "run").returncode == 0
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [COEVO, "check", str(plugin_dir / "run"), *args],
            capture_output=True, text=True, cwd=elsewhere, env=env, timeout=120, check=False,
        )  # fmt: skip

    lenient = check()
    assert lenient.returncode == 0 and "its own invariants unknown" in lenient.stderr
    strict = check("--strict")
    assert strict.returncode == 1 and strict.stderr.count("\n") == 1, strict.stderr
    assert strict.stderr.startswith(f"coevo: error: {plugin_dir / 'run'}: --strict: world module")
    assert coevo(plugin_dir, "check", "run", "--strict").returncode == 0
