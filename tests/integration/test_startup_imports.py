"""Commands that read a run or check a scenario import no model code: ``coevo log``, ``coevo
replay`` (and ``--verify``), and ``coevo validate`` of every built-in scenario of the built-in
world, policy scenarios included, finish without torch, transformers or safetensors in
``sys.modules`` (each in a fresh interpreter, as a user runs them). Reading a
log loads every event family's module (the policy's and the memory's included, through the
``coevo.events`` entry points), so what holds for this run's log holds for a learning run's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPLORE = str(ROOT / "scenarios" / "explore.toml")
HEAVY = ("torch", "transformers", "safetensors")

# runs the CLI in process, then prints which heavy modules it imported
PROBE = """
import contextlib, io, sys
from scenarios.cli.commands import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
assert "agents.events.policy" in sys.modules or sys.argv[1] == "validate"
print(code, [m for m in {heavy!r} if m in sys.modules])
"""


def imported(*args: str) -> tuple[str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    code, _, modules = proc.stdout.strip().partition(" ")
    return code, modules


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "explore"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scenarios.cli",
            "run",
            EXPLORE,
            "--out",
            str(out),
            "--quiet",
            "--set",
            "run.episodes=20",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize(
    "args",
    [("log",), ("log", "--json"), ("replay",), ("replay", "--verify"), ("replay", "--json")],
    ids=" ".join,
)
def test_reading_a_run_imports_no_model_code(run_dir: Path, args: tuple[str, ...]) -> None:
    assert imported(args[0], str(run_dir), *args[1:]) == ("0", "[]")


@pytest.mark.parametrize(
    "name", ["explore", "quickstart", "grpo", "empo2", "empo2_family", "complementary"]
)
def test_validating_a_scenario_imports_no_model_code(name: str) -> None:
    assert imported("validate", str(ROOT / "scenarios" / f"{name}.toml")) == ("0", "[]")


def test_the_probe_sees_model_code_when_a_command_loads_it() -> None:
    # a cuda device is checked with torch (whether or not this machine has one)
    quickstart = str(ROOT / "scenarios" / "quickstart.toml")
    _, modules = imported("validate", quickstart, "--set", "policy.device=cuda")
    assert "torch" in modules


def test_the_memory_and_assembly_load_no_usearch_until_an_index_is_made() -> None:
    # usearch's native library, loaded before ray.init joins a cluster, aborts Ray's GCS client
    # (std::regex_error): a driver imports the bank and assembly first, and makes its index later
    probe = (
        "import sys, numpy as np, agents.memory.memory_actor, scenarios.assemble\n"
        "from stores.tip_index import UsearchIndex\n"
        "before = 'usearch' in sys.modules\n"
        "index = UsearchIndex(4, exact_below=1)\n"
        "index.add([0, 1], np.eye(2, 4, dtype=np.float32))\n"
        "index.search(np.eye(1, 4, dtype=np.float32), 1)  # past exact_below: the graph\n"
        "print(before, 'usearch' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]
