"""The Ray backend's cases (``ray_backend_cases.py``) in a pytest process of their own.

In the process of a whole ``make test`` session, ``ray.init`` aborts: Ray's GCS client throws
``std::regex_error: Invalid range in brace expression``, a native-library clash with something
the full collection loads (usearch's library, loaded before ``ray.init`` joins a cluster, does
it; the tip index now loads it lazily, but whether that was the suite's only culprit is not
checked). In a fresh process every case passes, so they run there, sharing one Ray instance
(``ray_address`` in tests/conftest.py), and a test here fails with their output if any of them
fails. The learning runs (inference, learner, extractor and memory placed on Ray) are marked
slow there and run by ``make test-slow``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

HERE = Path(__file__).resolve().parent


def run_cases(marks: str) -> str:
    """Run the cases selected by ``marks`` in a fresh pytest process; its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "ray_backend_cases.py"), "-q", "-rs",
         "--tb=short", "-p", "no:cacheprovider", "-m", marks, "-o", "timeout=1200"],
        cwd=HERE.parents[1],
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=2900,
        check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    assert "skipped" not in out, out[-2000:]
    return out


@pytest.mark.timeout(1500)  # six cases, runs of the built-in world: a few minutes on 2 cores
def test_the_ray_backend_cases_pass_in_their_own_process() -> None:
    assert "6 passed" in run_cases("not slow and not faults")


@pytest.mark.slow
@pytest.mark.timeout(3000)  # six learning runs, models built in several processes
def test_the_ray_learning_cases_pass_in_their_own_process() -> None:
    assert "6 passed" in run_cases("slow")
