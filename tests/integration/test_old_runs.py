"""Runs written by an older coevo still read, check and re-execute with this one.

``tests/data/runs-2acbe5c.tar.xz`` holds two tiny runs written by commit 2acbe5c (2026-12-01,
the code before packed scoring; how they were made: ``tests/data/README.md``): a GRPO run and a
Complementary RL run, their logs (compacted), resolved scenarios, and the base models they
started from. Re-execution must reproduce every update bit for bit from the log alone. The
tests a run writes for itself cannot catch a change that breaks older logs: packed scoring
did, and ``replay --reexecute-learner`` reported every older run "diverged" for a day.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from scenarios.cli import main

ARCHIVE = Path(__file__).resolve().parents[1] / "data" / "runs-2acbe5c.tar.xz"


@pytest.fixture(scope="module")
def old_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive unpacked, each scenario pointed at the unpacked base models (the runs used
    the embedded models, built into a cache this machine does not have)."""
    root = tmp_path_factory.mktemp("old-runs")
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(root, filter="data")
    for run in ("grpo", "complementary"):
        scenario = root / run / "scenario.toml"
        text = scenario.read_text()
        text = text.replace('model = "embedded"', f'model = "{root / "models" / "policy"}"')
        text = text.replace(
            'extractor = "embedded-ops"', f'extractor = "{root / "models" / "extractor"}"'
        )
        scenario.write_text(text)
    return root


@pytest.mark.parametrize(
    ("run", "updates", "invariants"),
    [
        ("grpo", "re-executed 3 policy and 0 extractor updates", 7),
        ("complementary", "re-executed 3 policy and 2 extractor updates", 8),
    ],
)
def test_a_run_written_by_2acbe5c_verifies_checks_and_re_executes_bit_for_bit(
    old_runs: Path,
    run: str,
    updates: str,
    invariants: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("COEVO_CACHE", str(cache))
    path = str(old_runs / run)
    assert main(["replay", path, "--verify"]) == 0
    assert main(["check", path]) == 0
    assert f"hold {invariants} invariants" in capsys.readouterr().out
    assert main(["replay", path, "--reexecute-learner"]) == 0
    out = capsys.readouterr().out
    assert f"{updates}: every parameter digest matches the log" in out, out[-2000:]
    assert not cache.exists()  # nothing was built: the stored base models were used
