"""The worked example of docs/TESTING.md is real: its world, its invariant and its stateful
test, taken from the page as they stand, pass under pytest with no change to coevo; with the
world broken as the invariant forbids, the harness fails, naming the invariant and the seq."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from doc_blocks import doc_block

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "TESTING.md"


def pytest_in(directory: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{directory}{os.pathsep}{ROOT}"}
    env.pop("HYPOTHESIS_PROFILE", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_lamp.py"],
        capture_output=True,
        text=True,
        cwd=directory,
        env=env,
        timeout=300,
    )


def test_the_documented_stateful_test_passes(tmp_path: Path) -> None:
    (tmp_path / "test_lamp.py").write_text(doc_block(DOC, "# test_lamp.py"))
    proc = pytest_in(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout


def test_the_harness_fails_a_world_that_breaks_its_promise(tmp_path: Path) -> None:
    block = doc_block(DOC, "# test_lamp.py")
    broken = block.replace("            success=lit,\n", "            success=not lit,\n")
    broken = broken.replace(
        "from hypothesis import settings", "from hypothesis import Phase, settings"
    )
    broken = broken.replace("deadline=None)", "deadline=None, phases=[Phase.generate])")
    assert broken.count("Phase") == 2 and "not lit" in broken  # no shrinking: quicker
    (tmp_path / "test_lamp.py").write_text(broken)
    proc = pytest_in(tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "invariant lamp-lit violated at seq " in proc.stdout
    assert "success=False, its last turn lit=True" in proc.stdout


def test_an_invariant_registered_for_another_name_of_the_world_is_said(tmp_path: Path) -> None:
    """Registered for ``lampbug.test_lamp:Lamp`` while the scenario says ``test_lamp:Lamp``:
    the harness left the invariant out without a word, and a planted bug passed."""
    block = doc_block(DOC, "# test_lamp.py")
    scoped = block.replace('worlds=("test_lamp:Lamp",)', 'worlds=("lampbug.test_lamp:Lamp",)')
    assert scoped != block
    (tmp_path / "test_lamp.py").write_text(scoped)
    proc = pytest_in(tmp_path)
    said = " ".join(proc.stdout.split())
    assert (
        "invariant lamp-lit: for worlds lampbug.test_lamp:Lamp, not test_lamp:Lamp (so it is "
        "not checked"
    ) in said, proc.stdout[-3000:]


def test_a_world_whose_every_episode_aborts_fails_the_harness(tmp_path: Path) -> None:
    """Every observation refused (its text a number): ``coevo run`` exits 1 saying every
    episode aborted, and the harness passed the same world."""
    block = doc_block(DOC, "# test_lamp.py")
    broken = block.replace('return self._observe("the room is dark.", lit=False)', (
        'return self._observe(7, lit=False)'
    ))  # fmt: skip
    broken = broken.replace(
        "from hypothesis import settings", "from hypothesis import Phase, settings"
    )
    broken = broken.replace("deadline=None)", "deadline=None, phases=[Phase.generate])")
    assert "self._observe(7" in broken and broken.count("Phase") == 2
    (tmp_path / "test_lamp.py").write_text(broken)
    proc = pytest_in(tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "all 16 episodes of the run were aborted (the first: ObservationInvalid" in (
        " ".join(proc.stdout.split())
    ), proc.stdout[-3000:]


def test_an_invariant_with_a_bug_is_named_as_one(tmp_path: Path) -> None:
    """A raw ``KeyError`` from the invariant's own line came out of the harness, where ``coevo
    check`` says it is a bug in the invariant, not a finding about the run."""
    block = doc_block(DOC, "# test_lamp.py")
    buggy = block.replace(
        "            elif isinstance(ev, EpisodeFinished):\n",
        "            elif isinstance(ev, EpisodeFinished):\n                {}[ev.episode]\n",
    )
    buggy = buggy.replace(
        "from hypothesis import settings", "from hypothesis import Phase, settings"
    )
    buggy = buggy.replace("deadline=None)", "deadline=None, phases=[Phase.generate])")
    assert buggy.count("{}[ev.episode]") == 1 and buggy.count("Phase") == 2
    (tmp_path / "test_lamp.py").write_text(buggy)
    proc = pytest_in(tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "invariant lamp-lit raised KeyError: 'ep0" in proc.stdout, proc.stdout[-3000:]
    assert "(a bug in the invariant, not a finding about the run)" in proc.stdout


def test_a_violation_fails_as_itself_when_hypothesis_replays_it(tmp_path: Path) -> None:
    """With the doc's settings (shrinking on) and its example database, a second run replayed
    the saved failure and ended in ``FlakyStrategyDefinition`` ("inconsistent data
    generation"): the step that reported the violation depended on thread timing."""
    block = doc_block(DOC, "# test_lamp.py")
    broken = block.replace("reward=1.0 if lit else 0.0", "reward=1.0")
    assert broken != block
    (tmp_path / "test_lamp.py").write_text(broken)
    for _ in range(6):  # the first saves the failing example; the next replay it (a flaky
        # end came in about one run of four)
        proc = pytest_in(tmp_path)
        assert proc.returncode == 1, proc.stdout[-3000:]
        assert "Flaky" not in proc.stdout, proc.stdout[-3000:]
        assert "invariant lamp-lit violated at seq " in proc.stdout
