"""A task that blocks the event loop is named in the run's log; waiting is never a stall."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import structlog
import trio

from engine.actor import Actor, ActorSpec, Context
from engine.eventlog import MemoryEventLog
from engine.lifecycle import RunStarted
from engine.loopwatch import LoopWatch
from engine.runtime import Runtime, RuntimeConfig


class Said:
    """A logger keeping what it was told."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, message: str, **fields: Any) -> None:
        self.lines.append((message, fields))


def blocking_hook() -> None:
    time.sleep(1.0)  # what a plug-in's hook computing inside the loop does to it


def test_a_blocked_loop_is_named_once_and_its_length_told_when_it_turns_again() -> None:
    said = Said()

    async def main() -> None:
        watch = LoopWatch(0.3, said)
        watch.start()
        await trio.sleep(1.0)  # idle: waiting for I/O is no stall
        idle = list(said.lines)
        blocking_hook()
        await trio.sleep(0.6)  # the watcher sees the loop turn again
        watch.stop()
        assert idle == []

    trio.run(main)
    assert [m.split(":")[0] for m, _ in said.lines] == [
        "event loop blocked",
        "event loop ran again",
    ]
    blocked, again = said.lines[0][1], said.lines[1][1]
    assert f"{__file__}:" in blocked["where"] and "in blocking_hook" in blocked["where"]
    assert blocked["blocked_s"] >= 0.3
    assert 0.9 <= again["blocked_s"] <= 5.0  # the 1 s sleep, on however loaded a machine


class Blocks(Actor):
    async def run(self, ctx: Context) -> None:
        await trio.sleep(0)
        blocking_hook()


def test_the_runtime_watches_its_loop() -> None:
    log = MemoryEventLog()
    started = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=0, coevo_version="0")
    spec = ActorSpec(name="blocks", factory=Blocks, driver=True)
    config = RuntimeConfig(stall_warning=0.3)
    with structlog.testing.capture_logs() as logs:
        runtime = Runtime(log, started, [spec], [], seed=0, config=config)
        trio.run(runtime.run)
    blocked = [e for e in logs if e["event"].startswith("event loop blocked")]
    assert len(blocked) == 1 and "in blocking_hook" in blocked[0]["where"], logs
    with structlog.testing.capture_logs() as logs:
        runtime = Runtime(MemoryEventLog(), started, [spec], [], seed=0, config=RuntimeConfig())
        trio.run(runtime.run)
    assert not [e for e in logs if e["event"].startswith("event loop")]  # 1 s < the default


def test_a_process_that_cannot_start_the_watching_thread_runs_unwatched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a memory limit ``Thread.start`` raised "can't start new thread" out of the run as
    a traceback."""
    said = Said()

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    async def main() -> None:
        watch = LoopWatch(0.3, said)
        monkeypatch.setattr(threading.Thread, "start", refuse)
        watch.start()
        monkeypatch.undo()
        await trio.sleep(0.01)
        watch.stop()

    trio.run(main)
    assert said.lines == [
        ("the event loop is not watched for stalls", {"reason": "can't start new thread"})
    ]
