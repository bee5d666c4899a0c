"""minilab at a fixed pace (``scenarios.worlds.paced``): minilab's episodes, each call waiting."""

from __future__ import annotations

import time

import pytest

from scenarios.worlds.minilab import MiniLab
from scenarios.worlds.paced import PacedLab


def test_a_paced_lab_plays_minilab_s_episodes_and_waits_each_call() -> None:
    paced, lab = PacedLab(delay_ms=20), MiniLab()
    assert paced.families() == lab.families()
    task = paced.tasks("heat", "train")[3]
    assert task == lab.tasks("heat", "train")[3]
    t0 = time.perf_counter()
    first = paced.reset(task, 11)
    assert first == lab.reset(task, 11)
    action = first.admissible[0]
    assert paced.step(action) == lab.step(action)
    assert time.perf_counter() - t0 >= 0.04  # a reset and a step, 20 ms each
    assert paced.blocking  # stepped in a worker thread, never on the event loop
    paced.close()


@pytest.mark.parametrize("delay", [-1, "50", True, None])
def test_a_delay_that_is_not_a_number_of_ms_is_refused(delay: object) -> None:
    with pytest.raises(ValueError, match="delay_ms must be a number >= 0"):
        PacedLab(delay_ms=delay)  # pyright: ignore[reportArgumentType]
