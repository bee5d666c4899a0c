"""A tiny Complementary RL run shared by the modules that only read it (re-execution, report,
tracking, the browser): guided episodes trained as distills, so its log holds every kind of
update and sample. It is tracked live to every sink whose library is installed (the tracker
observes the run and leaves no trace in its log). The fault sweeps here record their figures
with ``tests/faults/fault_counts.py``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from test_complementary_run import COMPLEMENTARY
from test_grpo_run import run_scenario

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))  # fault_counts

TRACKED = [s for s in ("tensorboard", "wandb", "mlflow") if importlib.util.find_spec(s)]
DISTILL = COMPLEMENTARY.replace(
    "[complementary]\n", '[complementary]\nguided_rollout = "guided-distill"\n'
) + f"\n[tracking]\nsinks = {TRACKED!r}\nblock = 4\n".replace("'", '"')


@pytest.fixture(scope="session")
def distill_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``root/run`` is the run, ``root/cache`` the cache its embedded model was built in.
    Tests may add files beside ``run``, never change it."""
    path = tmp_path_factory.mktemp("distill")
    run_scenario(path, DISTILL)
    return path
