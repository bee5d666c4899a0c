"""A world called outside a run (``audit whatif``, ``probe``) goes through
:class:`agents.acting.world_calls.GuardedWorld`: whatever it does wrong at a call (raises,
exits, hangs, answers a value coevo cannot record) is one :class:`WorldFailed` naming the call,
a world that failed is not called again, and closing never raises."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest

from agents.acting.world_calls import GuardedWorld, ObservationInvalid, WorldFailed
from engine.world import Observation, Task

TASK = Task(family="f", variant=2)


class Scripted:
    """A world whose ``step`` does what ``on_step`` says on its second call."""

    def __init__(self, on_step: Any = None, on_close: Any = None) -> None:
        self.on_step, self.on_close = on_step, on_close
        self.steps = 0
        self.threads: list[str] = []

    def reset(self, task: Task, seed: int) -> Observation:
        self.steps = 0
        return Observation(text="start", admissible=("go",), goal="g")

    def step(self, action: str) -> Observation:
        self.threads.append(threading.current_thread().name)
        self.steps += 1
        if self.steps == 2 and self.on_step is not None:
            return self.on_step()
        return Observation(text=str(self.steps), admissible=("go",), goal="g", score=self.steps)

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()


def played(world: Any, timeout: float | None = 5.0) -> tuple[GuardedWorld, WorldFailed]:
    guarded = GuardedWorld(lambda: world, timeout)
    guarded.reset(TASK, 1)
    assert guarded.step("go").score == 1.0
    with pytest.raises(WorldFailed) as caught:
        guarded.step("go")
    return guarded, caught.value


def _raise() -> Observation:
    raise RuntimeError("the simulator lost its state")


def _exit() -> Observation:
    sys.exit(3)


def _interrupt() -> Observation:
    raise KeyboardInterrupt


def _hang() -> Observation:
    time.sleep(30)
    raise AssertionError("never answered")


@pytest.mark.parametrize(
    ("on_step", "said"),
    [
        (_raise, "world.step('go') on turn 1 raised RuntimeError: the simulator lost its state"),
        (_exit, "world.step('go') on turn 1 called sys.exit(3)"),
        (_interrupt, "world.step('go') on turn 1 raised KeyboardInterrupt"),
    ],
)
def test_a_world_that_raises_or_exits_is_one_error_naming_the_call(on_step: Any, said: str) -> None:
    guarded, failed = played(Scripted(on_step))
    assert str(failed) == said
    assert guarded.broken
    with pytest.raises(WorldFailed, match="failed earlier and is not called again"):
        guarded.reset(TASK, 1)
    guarded.close()
    assert guarded.close_error == "not closed: it failed earlier"


def test_a_world_that_hangs_is_abandoned_at_its_deadline() -> None:
    start = time.monotonic()
    guarded, failed = played(Scripted(_hang), timeout=0.3)
    assert time.monotonic() - start < 5
    assert str(failed) == (
        "world.step('go') on turn 1 did not return within 0.3 s (world.step_timeout); its "
        "thread and world were abandoned"
    )
    assert guarded.broken


def test_an_answer_coevo_cannot_record_is_refused_naming_the_call() -> None:
    nan = Observation(text="t", admissible=("go",), goal="g", score=float("nan"))
    _, failed = played(Scripted(lambda: nan))
    assert isinstance(failed, ObservationInvalid)
    assert str(failed) == (
        "world.step('go') on turn 1 returned an observation whose score is nan, not a finite number"
    )
    _, failed = played(Scripted(lambda: {"text": "t"}))
    assert str(failed).startswith("world.step('go') on turn 1 returned {'text': 't'}, not an ")


def test_a_constructor_that_raises_or_hangs_is_one_error() -> None:
    def broken() -> Any:
        raise OSError("no such game file")

    with pytest.raises(WorldFailed, match=r"^the world's constructor raised OSError: no such"):
        GuardedWorld(broken, 5.0)
    with pytest.raises(WorldFailed, match=r"^the world's constructor did not return within 0.2 s"):
        GuardedWorld(lambda: _hang(), 0.2)  # type: ignore[arg-type]


def test_closing_never_raises_and_says_why_it_failed() -> None:
    guarded = GuardedWorld(lambda: Scripted(on_close=_raise), 5.0)  # type: ignore[arg-type]
    guarded.close()
    assert guarded.close_error == "world.close() raised RuntimeError: the simulator lost its state"
    sound = GuardedWorld(lambda: Scripted(), 5.0)  # type: ignore[arg-type]
    sound.close()
    assert sound.close_error == ""


def test_a_world_that_does_not_block_is_called_in_the_callers_thread() -> None:
    class Quick(Scripted):
        blocking = False

    for world, where in ((Scripted(), "coevo-world-call"), (Quick(), "MainThread")):
        guarded = GuardedWorld(lambda w=world: w, 5.0)  # type: ignore[misc]
        guarded.reset(TASK, 1)
        guarded.step("go")
        assert world.threads == [where]
    unlimited = Scripted()
    guarded = GuardedWorld(lambda: unlimited, None)  # type: ignore[arg-type]
    guarded.reset(TASK, 1)
    guarded.step("go")
    assert unlimited.threads == ["MainThread"]
