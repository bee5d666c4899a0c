"""Two sessions on one run: a resume reads the run's history only as its one writer, so a
second resume started meanwhile is refused and nothing is recorded twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import fault_counts
import pytest
from resume_kit import ROLLOUT, ROOT, coevo, duplicates, read_log, stop_at

import scenarios.assemble
from engine.lifecycle import RunResumed, RunStopped
from engine.replay import verify_log
from scenarios.assemble import fact_checks, projections
from scenarios.cli import main
from stores.lmdb_log import LmdbEventLog


def test_a_resume_started_while_another_loads_is_refused_and_nothing_is_recorded_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = tmp_path / "rollout.toml"
    scenario.write_text(ROLLOUT)
    run = tmp_path / "run"
    killed = stop_at(
        coevo(["run", str(scenario), "--out", str(run), "--quiet"], tmp_path),
        run,
        1500,
        signal.SIGKILL,
    )
    assert killed is not None, "the run completed before it was killed"
    others: list[subprocess.CompletedProcess[str]] = []
    assemble = scenarios.assemble.assemble

    def another_resume_meanwhile(*args: Any, **kwargs: Any) -> Any:
        """While this resume loads its actors, a second one runs to its end (the attack held
        the first with SIGSTOP after it had read the history)."""
        others.append(
            subprocess.run(
                [sys.executable, "-m", "scenarios.cli", "resume", str(run), "--quiet"],
                cwd=ROOT,
                env={**os.environ, "COEVO_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)},
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        )
        return assemble(*args, **kwargs)

    monkeypatch.setattr(scenarios.assemble, "assemble", another_resume_meanwhile)
    assert main(["resume", str(run), "--quiet"]) == 0
    log = LmdbEventLog.open(run / "log", writable=False)
    try:
        result = verify_log(log, projections(), fact_checks())
    finally:
        log.close()
    assert result.ok, result.error
    final = read_log(run)
    (other,) = others
    fault_counts.record(
        stops=1,
        duplicated=len(duplicates(final)),
        resumes_refused=int(other.returncode == 2),
        tracebacks=int("Traceback" in other.stderr),
    )
    assert duplicates(final) == []
    assert sum(isinstance(env.event, RunResumed) for env in final) == 1
    last = final[-1].event
    assert isinstance(last, RunStopped) and last.reason == "completed"
    assert other.returncode == 2, other.stderr
    assert other.stderr.startswith(f"coevo: error: {run}: another process is writing this run")
    assert other.stderr.count("\n") == 1
