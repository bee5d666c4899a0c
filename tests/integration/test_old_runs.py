"""Runs written by an older coevo still read, check and re-execute with this one.

``tests/data/runs-2acbe5c.tar.xz`` holds two tiny runs written by commit 2acbe5c (2026-12-01,
the code before packed scoring; how they were made: ``tests/data/README.md``): a GRPO run and a
Complementary RL run, their logs (compacted), resolved scenarios, and the base models they
started from; ``runs-2acbe5c-epyc.tar.xz`` the same runs written by the same code on an AMD
EPYC machine (family 25 model 17), which rounds differently (the first copy's updates diverge
there at the first; its own base models differ too). Re-execution must reproduce every update
bit for bit from the log alone, on a machine that rounds as the one that wrote the log. The
tests a run writes for itself cannot catch a change that breaks older logs: packed scoring
did, and ``replay --reexecute-learner`` reported every older run "diverged" for a day.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from engine.eventlog import machine_description
from scenarios.cli import main

ARCHIVES = {
    name: Path(__file__).resolve().parents[1] / "data" / f"runs-2acbe5c{suffix}.tar.xz"
    for name, suffix in [("first", ""), ("epyc", "-epyc")]
}
"""The same two runs written on two machines (``tests/data/README.md``): a CPU's kernels round
an update's floating-point sums their own way, so a run re-executes bit for bit on a machine
that rounds as the one that wrote it, and diverges at its first update elsewhere."""


@pytest.fixture(scope="module")
def old_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each archive unpacked, by archive."""
    out = {}
    for name, archive_path in ARCHIVES.items():
        root = out[name] = tmp_path_factory.mktemp(f"old-runs-{name}")
        with tarfile.open(archive_path) as archive:
            archive.extractall(root, filter="data")
    return out


def here(root: Path, run: str) -> list[str]:
    """The run's scenario pointed at the unpacked base models (the runs used the embedded
    models, built into a cache this machine does not have)."""
    models = ["--set", f'policy.model="{root / "models" / "policy"}"']
    if run == "complementary":
        models += ["--set", f'complementary.extractor="{root / "models" / "extractor"}"']
    return models


@pytest.mark.parametrize(
    ("run", "updates", "invariants"),
    [
        ("grpo", "re-executed 3 policy and 0 extractor updates", 7),
        ("complementary", "re-executed 3 policy and 2 extractor updates", 8),
    ],
)
def test_a_run_written_by_2acbe5c_verifies_checks_and_re_executes_bit_for_bit(
    old_runs: dict[str, Path],
    run: str,
    updates: str,
    invariants: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every copy verifies and holds its invariants; the copy written on a machine that
    rounds as this one re-executes bit for bit (a change that breaks older logs makes every
    copy diverge; a machine that rounds as neither does too, and then needs its own copy)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("COEVO_CACHE", str(cache))
    outcomes = {}
    for name, root in old_runs.items():
        path = str(root / run)
        assert main(["replay", path, "--verify"]) == 0
        assert main(["check", path]) == 0
        assert f"hold {invariants} invariants" in capsys.readouterr().out
        code = main(["replay", path, "--reexecute-learner", *here(root, run)])
        captured = capsys.readouterr()
        outcomes[name] = (code, captured.out[-600:] + captured.err[-600:])
        if code == 0:
            assert f"{updates}: every parameter digest matches the log" in captured.out
        else:  # another machine's rounding: the first update differs, said in one line
            assert code == 1 and "policy update 0 (seq" in captured.err, outcomes[name]
            assert "diverged: re-executed parameters have digest" in captured.err
            # 2acbe5c did not record its machine: the note says so, and names this one
            note = "coevo: note: the run does not record the machine that wrote it; this is "
            assert note + machine_description() in captured.err
    assert any(code == 0 for code, _ in outcomes.values()), outcomes
    assert not cache.exists()  # nothing was built: the stored base models were used
