"""The quickstart learns: held-out success after GRPO is clearly above the untrained policy's.

Slow (the embedded model build on first use, then several minutes of training on 2 cores):
``make test-slow``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.report.curves import fold_curves
from scenarios.cli import main
from stores.lmdb_log import LmdbEventLog

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_quickstart_heldout_success_rises(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["run", str(ROOT / "scenarios" / "quickstart.toml"), "--out", str(out)]) == 0
    log = LmdbEventLog.open(out / "log", writable=False)
    try:
        curves = fold_curves(env.event for env in log.read(0, None))
    finally:
        log.close()
    before = curves.heldout[0][2]
    best_late = max(row[2] for row in curves.heldout[-2:])
    assert best_late >= before + 0.15, curves.heldout
    assert curves.train[-1][1] > curves.train[0][1]
