"""minilab at the pace of a slow simulator: every ``reset`` and ``step`` waits a fixed time.

A latency-bound world (a JVM, a browser, a remote simulator spends its time waiting, not on
this process's CPU) for measuring how a run scales in env workers, locally and on Ray
(``bench/bench_ray.py``, docs/BENCHMARKS.md), and for tests that need an episode to last long
enough to be interrupted. The episodes are minilab's, unchanged: the same task, seed and actions
give the same observations. Named by import path:
``world.name = "scenarios.worlds.paced:PacedLab"``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from engine.world import Observation, Task
from scenarios.worlds.minilab import MiniLab


class PacedLab:
    """minilab whose ``reset`` and ``step`` each sleep ``delay_ms`` first (blocking: stepped in
    a worker thread).

    Args:
        delay_ms: milliseconds each ``reset`` and ``step`` waits.
        families: minilab's families to offer (None: all).
        max_steps: minilab's step limit (None: its default).

    Raises:
        ValueError: ``delay_ms`` is negative or not a number, or minilab refuses an option.
    """

    name: str = "paced"
    blocking: bool = True

    def __init__(
        self,
        *,
        delay_ms: float = 50.0,
        families: Sequence[str] | None = None,
        max_steps: int | None = None,
    ) -> None:
        self._delay = _seconds(delay_ms)
        self._lab = MiniLab(families=families, max_steps=max_steps)

    def families(self) -> tuple[str, ...]:
        return self._lab.families()

    def tasks(self, family: str, split: str) -> Sequence[Task]:
        return self._lab.tasks(family, split)

    def reset(self, task: Task, seed: int) -> Observation:
        time.sleep(self._delay)
        return self._lab.reset(task, seed)

    def step(self, action: str) -> Observation:
        time.sleep(self._delay)
        return self._lab.step(action)

    def close(self) -> None:
        self._lab.close()


def _seconds(delay_ms: object) -> float:
    """``delay_ms`` (a scenario's TOML value) in seconds, checked."""
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int | float) or delay_ms < 0:
        raise ValueError(f"delay_ms must be a number >= 0, got {delay_ms!r}")
    return float(delay_ms) / 1000.0
