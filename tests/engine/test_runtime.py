"""The actor runtime on the in-memory log: order, delivery, causation, supervision, stop,
back-pressure. trio's MockClock with autojump: no real sleeps."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from engine.actor import Actor, ActorSpec, Context
from engine.errors import CoevoError, LogError
from engine.eventlog import EncodedBatch, LogHistory, MemoryEventLog, Snapshot
from engine.events import Envelope, Event, event
from engine.lifecycle import (
    ActorFailed,
    ActorRestarted,
    ActorStarted,
    ProjectionChecked,
    RunFailed,
    RunResumed,
    RunStarted,
    RunStopped,
)
from engine.projection import ActorStats, Fold, tag_of
from engine.replay import replay_until, verify_log
from engine.runtime import RunOutcome, Runtime, RuntimeConfig
from engine.seeds import derive_seed

FROZEN_EPISODE_SEED = 5564015917193321374


@event
class Ping(Event, tag="test_ping", frozen=True, kw_only=True):
    n: int


@event
class Pong(Event, tag="test_pong", frozen=True, kw_only=True):
    n: int


class Source(Actor):
    def __init__(self, count: int) -> None:
        self.count = count

    async def run(self, ctx: Context) -> None:
        for i in range(self.count):
            await ctx.emit(Ping(n=i), corr=f"c{i}")


class Echo(Actor):
    """Answers every Ping with a Pong; returns (ends) after ``stop_after`` pings."""

    subscribes = (Ping,)

    def __init__(self, stop_after: int, fail_at: int | None = None, fails: list[int] | None = None):
        self.stop_after = stop_after
        self.fail_at = fail_at
        self.fails = fails if fails is not None else []

    async def run(self, ctx: Context) -> None:
        seen = 0
        async for env in ctx.events():
            assert isinstance(env.event, Ping)
            if env.event.n == self.fail_at and not self.fails:
                self.fails.append(env.event.n)
                raise RuntimeError("boom")
            await ctx.emit(Pong(n=env.event.n))
            seen += 1
            if env.event.n + 1 >= self.stop_after:
                return


def run_runtime(
    specs: Sequence[ActorSpec],
    config: RuntimeConfig | None = None,
    log: MemoryEventLog | None = None,
) -> tuple[MemoryEventLog, RunOutcome]:
    log = log or MemoryEventLog()
    started = RunStarted(run_id="r1", scenario="t", scenario_hash="h", seed=3, coevo_version="0")
    rt = Runtime(log, started, specs, [ActorStats()], seed=3, config=config, clock=lambda: 42)
    outcome = trio.run(rt.run, clock=trio.testing.MockClock(autojump_threshold=0))
    return log, outcome


def kinds(log: MemoryEventLog) -> list[str]:
    return [str(e.event.__struct_config__.tag) for e in log.read()]


def test_run_is_one_contiguous_total_order_framed_by_start_and_stop() -> None:
    specs = [
        ActorSpec(name="src", factory=lambda: Source(50)),
        ActorSpec(name="echo", factory=lambda: Echo(50), driver=True),
    ]
    log, outcome = run_runtime(specs, RuntimeConfig(batch_max=7, checksum_every=10))
    envs = list(log.read())
    assert [e.seq for e in envs] == list(range(len(envs)))
    assert isinstance(envs[0].event, RunStarted)
    assert isinstance(envs[-1].event, RunStopped) and envs[-1].event.reason == "completed"
    assert outcome.reason == "completed" and outcome.exit_code == 0
    assert outcome.events == len(envs)
    pings = [e for e in envs if isinstance(e.event, Ping)]
    pongs = [e for e in envs if isinstance(e.event, Pong)]
    assert [p.event.n for p in pings] == list(range(50))
    assert [p.event.n for p in pongs] == list(range(50))


def test_reactions_carry_cause_and_correlation_of_what_they_answer() -> None:
    specs = [
        ActorSpec(name="src", factory=lambda: Source(5)),
        ActorSpec(name="echo", factory=lambda: Echo(5), driver=True),
    ]
    log, _ = run_runtime(specs)
    by_seq = {e.seq: e for e in log.read()}
    pongs = [e for e in by_seq.values() if isinstance(e.event, Pong)]
    for pong in pongs:
        assert pong.cause is not None
        ping = by_seq[pong.cause]
        assert isinstance(ping.event, Ping) and ping.event.n == pong.event.n
        assert pong.corr == ping.corr == f"c{ping.event.n}"
        assert pong.actor == "echo" and ping.actor == "src"


def test_checksums_follow_the_event_they_cover_and_verify() -> None:
    specs = [
        ActorSpec(name="src", factory=lambda: Source(40)),
        ActorSpec(name="echo", factory=lambda: Echo(40), driver=True),
    ]
    log, _ = run_runtime(specs, RuntimeConfig(checksum_every=9, batch_max=5))
    envs = list(log.read())
    checks = [e for e in envs if isinstance(e.event, ProjectionChecked)]
    assert len(checks) >= 8
    for chk in checks:
        assert isinstance(chk.event, ProjectionChecked)
        assert chk.event.upto == chk.seq - 1
    # the final checksum sits right before the final event
    assert isinstance(envs[-2].event, ProjectionChecked)
    result = verify_log(log, [ActorStats()])
    assert result.ok, result.error
    assert result.checks == len(checks)


def test_restart_policy_records_failure_and_continues() -> None:
    fails: list[int] = []
    specs = [
        ActorSpec(name="src", factory=lambda: Source(10)),
        ActorSpec(
            name="echo",
            factory=lambda: Echo(10, fail_at=4, fails=fails),
            driver=True,
            on_failure="restart",
            max_restarts=2,
        ),
    ]
    log, outcome = run_runtime(specs)
    envs = list(log.read())
    failed = [e.event for e in envs if isinstance(e.event, ActorFailed)]
    assert len(failed) == 1 and failed[0].action == "restart" and failed[0].actor == "echo"
    assert "boom" in failed[0].message and "RuntimeError" in failed[0].traceback
    assert [e.event.attempt for e in envs if isinstance(e.event, ActorRestarted)] == [1]
    starts = [e.event for e in envs if isinstance(e.event, ActorStarted) and e.actor == "runtime"]
    assert sorted((s.actor, s.attempt) for s in starts) == [("echo", 0), ("echo", 1), ("src", 0)]
    assert outcome.reason == "completed"
    pongs = sorted(e.event.n for e in envs if isinstance(e.event, Pong))
    assert pongs == [n for n in range(10) if n != 4]  # the ping being handled is lost, no more


@pytest.mark.parametrize(
    ("restart_for", "restarted"), [((RuntimeError,), True), ((KeyError,), False)]
)
def test_restart_for_restarts_only_the_failures_it_names(
    restart_for: tuple[type[Exception], ...], restarted: bool
) -> None:
    specs = [
        ActorSpec(name="src", factory=lambda: Source(10)),
        ActorSpec(
            name="echo",
            factory=lambda: Echo(10, fail_at=4, fails=[]),
            driver=True,
            on_failure="restart",
            restart_for=restart_for,
        ),
    ]
    log, outcome = run_runtime(specs)
    failed = [e.event for e in log.read() if isinstance(e.event, ActorFailed)]
    assert [f.action for f in failed] == ["restart" if restarted else "stop"]
    assert outcome.reason == ("completed" if restarted else "failed")


class GoneForGood(CoevoError):
    restartable = False


class Unmendable(Actor):
    """Fails at once with an error no restart can mend."""

    subscribes = (Ping,)

    async def run(self, ctx: Context) -> None:
        raise GoneForGood("what it needs outside the run is gone")


def test_an_error_no_restart_can_mend_stops_the_run_whatever_the_spec_allows() -> None:
    specs = [
        ActorSpec(name="src", factory=lambda: Source(10)),
        ActorSpec(name="gone", factory=Unmendable, driver=True, on_failure="restart"),
    ]
    log, outcome = run_runtime(specs)
    failed = [e.event for e in log.read() if isinstance(e.event, ActorFailed)]
    assert [(f.error_type, f.action) for f in failed] == [("GoneForGood", "stop")]
    assert outcome.reason == "failed" and "is gone" in outcome.error


class Tally(Actor):
    """Sums the Pings it saw, a fold of the log: rebuilt from it by ``recover``. Its first life
    fails after 4 Pings; it ends once it has seen ``total`` and says what it summed."""

    subscribes = (Ping,)

    def __init__(self, total: int, lives: list[int]) -> None:
        self.total = total
        self.lives = lives
        self.seen: list[int] = []

    async def recover(self, ctx: Context, history: Sequence[Envelope[Event]]) -> None:
        self.seen = [e.event.n for e in history if isinstance(e.event, Ping)]

    async def run(self, ctx: Context) -> None:
        self.lives.append(len(self.seen))
        if len(self.seen) >= self.total:
            await ctx.emit(Pong(n=sum(self.seen)))
            return
        async for env in ctx.events():
            assert isinstance(env.event, Ping)
            self.seen.append(env.event.n)
            if len(self.lives) == 1 and len(self.seen) == 4:
                raise RuntimeError("lost")
            if len(self.seen) == self.total:
                await ctx.emit(Pong(n=sum(self.seen)))
                return


def test_an_actor_recovered_on_restart_folds_the_log_and_skips_what_it_held() -> None:
    lives: list[int] = []
    specs = [
        ActorSpec(name="src", factory=lambda: Source(30)),
        ActorSpec(
            name="tally",
            factory=lambda: Tally(30, lives),
            driver=True,
            on_failure="restart",
            recover_on_restart=True,
        ),
    ]
    log, outcome = run_runtime(specs, RuntimeConfig(batch_max=3))
    assert outcome.reason == "completed"
    assert lives[0] == 0 and lives[1] >= 4  # the second life began with what the log held
    (total,) = [e.event.n for e in log.read() if isinstance(e.event, Pong)]
    assert total == sum(range(30))  # each Ping once: none lost, none counted twice


class Answerer(Actor):
    """Answers each Ping with one Pong, rebuilt from the log by ``recover`` (the Pings it
    answered there are not answered again). Its first life raises right after answering the
    fourth, so that answer is still in the write buffer (a long ``batch_wait``) when the
    restart reads the log."""

    subscribes = (Ping,)

    def __init__(self, total: int, lives: list[int]) -> None:
        self.total = total
        self.lives = lives
        self.owed: list[Envelope[Event]] = []
        self.answered: set[int] = set()

    async def recover(self, ctx: Context, history: Sequence[Envelope[Event]]) -> None:
        self.answered = {e.event.n for e in history if isinstance(e.event, Pong)}
        pings = [e for e in history if isinstance(e.event, Ping)]
        self.owed = [e for e in pings if e.event.n not in self.answered]  # pyright: ignore[reportAttributeAccessIssue]

    async def run(self, ctx: Context) -> None:
        self.lives.append(len(self.answered))
        for env in self.owed:
            await self.answer(ctx, env)
        if len(self.answered) == self.total:
            return
        async for env in ctx.events():
            await self.answer(ctx, env)
            if len(self.lives) == 1 and len(self.answered) == 4:
                raise RuntimeError("lost")
            if len(self.answered) == self.total:
                return

    async def answer(self, ctx: Context, env: Envelope[Event]) -> None:
        assert isinstance(env.event, Ping)
        await ctx.emit(Pong(n=env.event.n), cause=env.seq)
        self.answered.add(env.event.n)


def test_an_actor_rebuilt_on_restart_sees_what_it_emitted_before_it_failed() -> None:
    lives: list[int] = []
    specs = [
        ActorSpec(name="src", factory=lambda: Source(12)),
        ActorSpec(
            name="answerer",
            factory=lambda: Answerer(12, lives),
            driver=True,
            on_failure="restart",
            recover_on_restart=True,
        ),
    ]
    log, outcome = run_runtime(specs, RuntimeConfig(batch_max=64, batch_wait=5.0))
    assert outcome.reason == "completed"
    assert lives == [0, 4]  # the fourth answer was committed before the log was read
    pongs = sorted(e.event.n for e in log.read() if isinstance(e.event, Pong))
    assert pongs == list(range(12))  # each Ping answered once


def test_wait_committed_returns_once_what_was_pushed_is_in_the_log() -> None:
    log = MemoryEventLog()
    started = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=0, coevo_version="0")
    seen: list[list[int]] = []

    class Emitter(Actor):
        async def run(self, ctx: Context) -> None:
            await ctx.emit(Pong(n=7))
            await rt.wait_committed()
            seen.append([e.event.n for e in log.read() if isinstance(e.event, Pong)])

    specs = [ActorSpec(name="e", factory=Emitter, driver=True)]
    config = RuntimeConfig(batch_wait=5.0)
    rt = Runtime(log, started, specs, [ActorStats()], seed=0, config=config)
    outcome = trio.run(rt.run, clock=trio.testing.MockClock(autojump_threshold=0))
    assert outcome.reason == "completed"
    assert seen == [[7]]


def test_stop_policy_fails_the_run_and_keeps_what_was_committed() -> None:
    specs = [
        ActorSpec(name="src", factory=lambda: Source(10)),
        ActorSpec(name="echo", factory=lambda: Echo(10, fail_at=3), driver=True),
    ]
    log, outcome = run_runtime(specs)
    envs = list(log.read())
    assert outcome.reason == "failed" and outcome.exit_code == 1
    assert "echo" in outcome.error and "boom" in outcome.error
    final = envs[-1].event
    assert isinstance(final, RunFailed) and "boom" in final.message and final.actor == "echo"
    assert [e.event.action for e in envs if isinstance(e.event, ActorFailed)] == ["stop"]
    assert sorted(e.event.n for e in envs if isinstance(e.event, Pong)) == [0, 1, 2]
    assert verify_log(log, [ActorStats()]).ok


class Forever(Actor):
    async def run(self, ctx: Context) -> None:
        i = 0
        while True:
            await ctx.emit(Ping(n=i))
            i += 1
            await trio.sleep(0)


def test_request_stop_cancels_actors_and_flushes() -> None:
    log = MemoryEventLog()
    started = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=0, coevo_version="0")
    rt = Runtime(log, started, [ActorSpec(name="f", factory=Forever)], [ActorStats()], seed=0)

    async def main() -> RunOutcome:
        result: list[RunOutcome] = []
        async with trio.open_nursery() as nursery:

            async def go() -> None:
                result.append(await rt.run())

            nursery.start_soon(go)
            while log.next_seq < 50:
                await trio.lowlevel.checkpoint()
            rt.request_stop("requested", 0)
        return result[0]

    outcome = trio.run(main)
    envs = list(log.read())
    assert outcome.reason == "requested" and outcome.exit_code == 0
    assert isinstance(envs[-1].event, RunStopped) and envs[-1].event.reason == "requested"
    pings = [e.event.n for e in envs if isinstance(e.event, Ping)]
    assert len(pings) >= 40
    assert pings == list(range(len(pings)))  # nothing emitted before the stop was lost


class Stubborn(Actor):
    """An actor whose work cannot be cancelled until ``done`` is set (a policy update in a
    thread)."""

    def __init__(self, done: trio.Event) -> None:
        self.done = done

    async def run(self, ctx: Context) -> None:
        with trio.CancelScope(shield=True):
            await self.done.wait()


Drive = Callable[[Runtime, MemoryEventLog], Awaitable[None]]


def run_beside_a_stubborn_actor(
    drive: Drive, extra: Sequence[ActorSpec] = (), handle_signals: bool = False
) -> tuple[RunOutcome, MemoryEventLog, list[dict[str, Any]]]:
    """A run of actor ``slow`` (:class:`Stubborn`) and ``extra`` on a mock clock: ``drive``
    acts on it (stops it, signals it), then slow's work ends. Returns the outcome, the log
    and the runtime's log lines (captured as it is made: it binds its logger then)."""
    import structlog

    log = MemoryEventLog()
    started = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=0, coevo_version="0")

    async def main() -> RunOutcome:
        done = trio.Event()
        specs = [ActorSpec(name="slow", factory=lambda: Stubborn(done)), *extra]
        config = RuntimeConfig(handle_signals=handle_signals)
        rt = Runtime(log, started, specs, [], seed=0, config=config)
        result: list[RunOutcome] = []
        async with trio.open_nursery() as nursery:

            async def go() -> None:
                result.append(await rt.run())

            nursery.start_soon(go)
            await drive(rt, log)
            done.set()
        return result[0]

    with structlog.testing.capture_logs() as logs:
        outcome = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return outcome, log, logs


async def _started(log: MemoryEventLog) -> None:
    while log.next_seq < 2:  # the run started, and its actor
        await trio.sleep(0.01)


def _waiting(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"].startswith("stopping: still waiting")]


@pytest.mark.parametrize("reason", ["signal:SIGTERM", "requested"])
def test_a_stop_that_waits_on_an_actor_says_which(reason: str) -> None:
    """A SIGTERM during a four-minute update waited for it without a word (a second signal
    would have ended the process, but nothing said so)."""

    async def drive(rt: Runtime, log: MemoryEventLog) -> None:
        await _started(log)
        rt.request_stop(reason, 143)
        await trio.sleep(100)  # slow's work ends 100 s after the stop

    outcome, _, logs = run_beside_a_stubborn_actor(drive)
    assert outcome.reason == reason
    said = _waiting(logs)
    assert [e["waited_s"] for e in said] == [5, 35, 65, 95]  # then it finished, at 100 s
    assert all(e["actors"] == ["slow"] and e["log_level"] == "warning" for e in said)
    assert ("now" in said[0]) is reason.startswith("signal:")  # only a signal's second ends it


class FailsSoon(Actor):
    async def run(self, ctx: Context) -> None:
        await trio.sleep(1)
        raise RuntimeError("boom")


def test_a_stop_for_a_failure_that_waits_on_an_actor_says_which_and_hears_a_signal() -> None:
    """An actor's failure stopped the run while another's work could not be cancelled: the
    stop waited without a word (a signal's stop names what it waits on), and a Ctrl-C or
    SIGTERM during it was not even acknowledged (the task that takes signals had been
    cancelled with the actors)."""

    async def drive(rt: Runtime, log: MemoryEventLog) -> None:
        while not any(isinstance(e.event, ActorFailed) for e in log.read()):
            await trio.sleep(0.01)  # (the run starts once a thread has read the log)
        await trio.sleep(19)  # boom failed; the stop waits on slow
        assert rt._running == {"slow"}  # pyright: ignore[reportPrivateUsage]
        os.kill(os.getpid(), signal.SIGTERM)
        await trio.sleep(80)

    boom = ActorSpec(name="boom", factory=FailsSoon)
    outcome, log, logs = run_beside_a_stubborn_actor(drive, [boom], handle_signals=True)
    assert outcome.reason == "failed" and "boom" in outcome.error
    said = _waiting(logs)
    assert [e["waited_s"] for e in said] == [5, 35, 65, 95]
    assert all(e["actors"] == ["slow"] and e["stop"] == "boom failed" for e in said)
    assert ["now" in e for e in said] == [False, True, True, True]  # after the signal
    assert [e["signal"] for e in logs if e["event"] == "signal received, stopping"] == ["SIGTERM"]
    assert isinstance(list(log.read())[-1].event, RunFailed)


def test_a_signal_during_a_requested_stop_that_waits_is_taken() -> None:
    """A stop asked for without a signal (the driver's end, ``request_stop``) cancels the
    task that takes signals with the actors, as a failure's stop did: a Ctrl-C or SIGTERM while
    it waited on an update in a thread was not acknowledged, nor said to end it if repeated."""

    async def drive(rt: Runtime, log: MemoryEventLog) -> None:
        await _started(log)
        rt.request_stop("requested", 0)
        await trio.sleep(20)
        assert rt._running == {"slow"}  # pyright: ignore[reportPrivateUsage]
        os.kill(os.getpid(), signal.SIGTERM)
        await trio.sleep(80)

    outcome, _, logs = run_beside_a_stubborn_actor(drive, handle_signals=True)
    assert outcome.reason == "requested"
    assert [e["signal"] for e in logs if e["event"] == "signal received, stopping"] == ["SIGTERM"]
    assert ["now" in e for e in _waiting(logs)] == [False, True, True, True]  # after the signal


def test_stop_requested_before_actors_start_still_ends_the_run() -> None:
    log = MemoryEventLog()
    started = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=0, coevo_version="0")
    rt = Runtime(log, started, [ActorSpec(name="f", factory=Forever)], [], seed=0)
    rt.request_stop("requested", 0)
    outcome = trio.run(rt.run)
    assert outcome.reason == "requested"
    assert isinstance(list(log.read())[-1].event, RunStopped)


class GatedLog(MemoryEventLog):
    """A log whose appends wait for a gate (a slow disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def append_encoded(self, batch: EncodedBatch, *, snapshots: Sequence[Snapshot] = ()) -> None:
        self.gate.wait(timeout=10)
        super().append_encoded(batch, snapshots=snapshots)


def test_source_waits_when_write_buffer_is_full() -> None:
    log = GatedLog()
    started = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=0, coevo_version="0")
    cfg = RuntimeConfig(write_buffer=16, batch_max=4)
    rt = Runtime(
        log,
        started,
        [ActorSpec(name="src", factory=lambda: Source(200), driver=True)],
        [],
        seed=0,
        config=cfg,
    )
    high_water: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rt.run)
            for _ in range(50):
                await trio.lowlevel.checkpoint()
                high_water.append(rt.statistics()["pending"])
            log.gate.set()

    trio.run(main)
    assert max(high_water) <= 16 + 2  # lifecycle events of the runtime itself may add a few
    assert sum(isinstance(e.event, Ping) for e in log.read()) == 200


@event
class Blob(Event, tag="test_blob", frozen=True, kw_only=True):
    data: str


class BlobSource(Actor):
    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = sizes

    async def run(self, ctx: Context) -> None:
        for i, size in enumerate(self.sizes):
            await ctx.emit(Blob(data=str(i % 10) * size))


class CountingGatedLog(GatedLog):
    """A gated log that records the bytes of each batch it stores."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_bytes: list[int] = []

    def append_encoded(self, batch: EncodedBatch, *, snapshots: Sequence[Snapshot] = ()) -> None:
        self.batch_bytes.append(sum(map(len, batch.pieces)))
        super().append_encoded(batch, snapshots=snapshots)


def test_the_write_buffer_is_bounded_in_bytes_too() -> None:
    """Events of 100 KB against a 1 MB buffer of 10,000 events: the source waits once about
    1 MB is queued, and no commit holds much more than 1 MB (the event-count bound alone
    queued all 200, 20 MB, while the disk was slow)."""
    log = CountingGatedLog()
    started = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=0, coevo_version="0")
    bound = 2**20
    cfg = RuntimeConfig(write_buffer=10_000, write_buffer_bytes=bound, batch_max=4096)
    sizes = [100_000] * 200
    rt = Runtime(
        log,
        started,
        [ActorSpec(name="src", factory=lambda: BlobSource(sizes), driver=True)],
        [],
        seed=0,
        config=cfg,
    )
    high_water: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rt.run)
            with trio.fail_after(10):
                while rt.statistics()["pending_bytes"] < bound:  # the disk is stalled
                    await trio.sleep(0.001)
            for _ in range(30):
                await trio.sleep(0.01)
                high_water.append(rt.statistics()["pending_bytes"])
            log.gate.set()

    trio.run(main)
    assert bound <= max(high_water) <= bound + 100_100
    assert max(log.batch_bytes) <= bound + 2 * 100_100  # the runtime's own small events besides
    blobs = [e.event for e in log.read() if isinstance(e.event, Blob)]
    assert [b.data[0] for b in blobs] == [str(i % 10) for i in range(200)]


class StallsAfterPing(GatedLog):
    """A disk that stalls (its gate closes) right after the commit that holds the Ping."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled = False

    def append_encoded(self, batch: EncodedBatch, *, snapshots: Sequence[Snapshot] = ()) -> None:
        super().append_encoded(batch, snapshots=snapshots)
        if not self.stalled and any(isinstance(e.event, Ping) for e in self.read()):
            self.stalled = True
            self.gate.clear()


class PacedBlobs(Actor):
    """Reacts to one Ping with many large events, pacing itself as an env worker does."""

    subscribes = (Ping,)

    async def run(self, ctx: Context) -> None:
        async for _ in ctx.events():
            for i in range(40):
                await ctx.emit(Blob(data="x" * 100_000), corr=f"b{i}")
                await ctx.pace()
            return


def test_a_reacting_actor_that_paces_waits_on_the_bytes_bound() -> None:
    """An env worker whose scripted agent awaits nothing paces itself: with a slow disk it
    waits for room in bytes too (real clock: the gate opens after 0.5 s, within PACE_WAIT_S)."""
    log = StallsAfterPing()
    started = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=0, coevo_version="0")
    bound = 2**20
    cfg = RuntimeConfig(write_buffer_bytes=bound)
    specs = [
        ActorSpec(name="src", factory=lambda: Source(1)),
        ActorSpec(name="blobs", factory=PacedBlobs, driver=True),
    ]
    rt = Runtime(log, started, specs, [], seed=0, config=cfg)
    high_water: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rt.run)
            log.gate.set()  # the Ping reaches the actor, then the disk stalls
            with trio.fail_after(30):  # (it waited for pending bytes, which a loaded machine
                while not log.stalled:  # could commit whole before it looked: for ever)
                    await trio.sleep(0.001)
            for _ in range(50):
                await trio.sleep(0.01)
                high_water.append(rt.statistics()["pending_bytes"])
            log.gate.set()

    trio.run(main)
    assert max(high_water) > 0  # the blobs waited for the disk
    assert max(high_water) <= bound + 100_100
    assert sum(isinstance(e.event, Blob) for e in log.read()) == 40


def test_an_event_larger_than_the_byte_bound_still_goes() -> None:
    log, _ = run_runtime(
        [ActorSpec(name="src", factory=lambda: BlobSource([5000, 10, 5000, 5000]), driver=True)],
        RuntimeConfig(write_buffer_bytes=1000),
    )
    assert [len(e.event.data) for e in log.read() if isinstance(e.event, Blob)] == [
        5000,
        10,
        5000,
        5000,
    ]


def test_actor_names_must_be_unique() -> None:
    started = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=0, coevo_version="0")
    specs = [ActorSpec(name="a", factory=Forever), ActorSpec(name="a", factory=Forever)]
    with pytest.raises(ValueError, match="unique"):
        Runtime(MemoryEventLog(), started, specs, [], seed=0)


def test_seeds_are_frozen_functions_of_run_seed_and_identity() -> None:
    # frozen values: a change here changes every run's outcome, so it must be deliberate
    assert derive_seed(7, "episode", 0) == FROZEN_EPISODE_SEED
    assert derive_seed(7, "episode", 1) != derive_seed(7, "episode", 0)
    assert derive_seed(8, "episode", 0) != derive_seed(7, "episode", 0)
    started = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=9, coevo_version="0")
    rt = Runtime(MemoryEventLog(), started, [], [], seed=9)
    assert rt.actor_seed("w1") == derive_seed(9, "actor", "w1")


def kinds_of(log: MemoryEventLog) -> list[str]:
    return [tag_of(type(e.event)) for e in log.read()]


@pytest.mark.parametrize("every", [0, 1, 7])
def test_final_checksum_always_precedes_the_final_event(every: int) -> None:
    specs = [
        ActorSpec(name="src", factory=lambda: Source(20)),
        ActorSpec(name="echo", factory=lambda: Echo(20), driver=True),
    ]
    log, _ = run_runtime(specs, RuntimeConfig(checksum_every=every, batch_max=5))
    names = kinds_of(log)
    assert names[-1] == "run_stopped"
    assert names[-2] == "projection_checked"
    if every == 0:
        assert names.count("projection_checked") == 1
    assert verify_log(log, [ActorStats()]).ok


def test_snapshots_replay_to_every_seq_like_a_full_fold() -> None:
    specs = [
        ActorSpec(name="src", factory=lambda: Source(120)),
        ActorSpec(name="echo", factory=lambda: Echo(120), driver=True),
    ]
    cfg = RuntimeConfig(checksum_every=13, snapshot_every=25, batch_max=8)
    log, _ = run_runtime(specs, cfg)
    assert kinds_of(log).count("snapshot_taken") >= 5
    result = verify_log(log, [ActorStats()])
    assert result.ok and result.checks > kinds_of(log).count("projection_checked")
    used_snapshot = False
    for until in range(0, log.next_seq, 7):
        fold, snap = replay_until(log, [ActorStats()], until)
        full = Fold([ActorStats()])
        full.apply_all(list(log.read(0, until + 1)))
        assert fold.digests() == full.digests() and fold.last_seq == until
        used_snapshot = used_snapshot or snap is not None
    assert used_snapshot


def test_verify_names_where_a_fold_diverges() -> None:
    specs = [
        ActorSpec(name="src", factory=lambda: Source(30)),
        ActorSpec(name="echo", factory=lambda: Echo(30), driver=True),
    ]
    log, _ = run_runtime(specs, RuntimeConfig(checksum_every=10))
    envs = list(log.read())
    target = [e for e in envs if isinstance(e.event, ProjectionChecked)][1]
    assert isinstance(target.event, ProjectionChecked)
    forged = msgspec.structs.replace(
        target, event=ProjectionChecked(upto=target.event.upto, digests={"actor_stats": "0" * 32})
    )
    tampered = MemoryEventLog()
    tampered.append([forged if e.seq == target.seq else e for e in envs])
    result = verify_log(tampered, [ActorStats()])
    assert not result.ok and result.first_bad_seq == target.event.upto
    assert "diverged" in result.error and result.checks == 1


def test_factory_failure_at_start_fails_the_run_cleanly() -> None:
    def broken() -> Actor:
        raise OSError("no such model")

    specs = [
        ActorSpec(name="src", factory=lambda: Source(3)),
        ActorSpec(name="bad", factory=broken, driver=True),
    ]
    log, outcome = run_runtime(specs)
    assert outcome.reason == "failed" and "no such model" in outcome.error
    names = kinds_of(log)
    assert names[-1] == "run_failed" and "actor_failed" in names


class WatchfulEcho(Actor):
    """Records, for every delivered Ping, whether the log already held it."""

    subscribes = (Ping,)

    def __init__(self, log: MemoryEventLog, seen: list[tuple[int, int]], count: int) -> None:
        self.log = log
        self.seen = seen
        self.count = count

    async def run(self, ctx: Context) -> None:
        async for env in ctx.events():
            self.seen.append((env.seq, self.log.next_seq))
            if len(self.seen) == self.count:
                return


class SlowLog(MemoryEventLog):
    """A log whose commits take a (real, short) while: delivery must wait for them."""

    def append_encoded(self, batch: EncodedBatch, *, snapshots: Sequence[Snapshot] = ()) -> None:
        threading.Event().wait(0.002)
        super().append_encoded(batch, snapshots=snapshots)


def test_events_are_delivered_only_once_the_log_holds_them() -> None:
    log = SlowLog()
    seen: list[tuple[int, int]] = []
    specs = [
        ActorSpec(name="src", factory=lambda: Source(300)),
        ActorSpec(name="echo", factory=lambda: WatchfulEcho(log, seen, 300), driver=True),
    ]
    run_runtime(specs, RuntimeConfig(batch_max=7, checksum_every=10), log=log)
    assert len(seen) == 300
    assert all(seq < committed for seq, committed in seen)


class FailingLog(MemoryEventLog):
    """A log whose ``fail_at``-th append fails (a full disk)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.appends = 0
        self.fail_at = fail_at

    def append_encoded(self, batch: EncodedBatch, *, snapshots: Sequence[Snapshot] = ()) -> None:
        self.appends += 1
        if self.appends == self.fail_at:
            raise LogError("disk full")
        super().append_encoded(batch, snapshots=snapshots)


def test_a_failing_log_ends_the_run_with_its_error_and_delivers_nothing_uncommitted() -> None:
    log = FailingLog(fail_at=6)
    seen: list[tuple[int, int]] = []
    specs = [
        ActorSpec(name="src", factory=lambda: Source(100)),
        ActorSpec(name="echo", factory=lambda: WatchfulEcho(log, seen, 100), driver=True),
    ]
    with pytest.raises(LogError, match="disk full"):
        run_runtime(specs, RuntimeConfig(batch_max=4), log=log)
    pings = [e.seq for e in log.read() if isinstance(e.event, Ping)]
    assert seen, "nothing was delivered before the failure: the check below would be vacuous"
    assert [seq for seq, _ in seen] == pings[: len(seen)]  # in order, committed ones only
    assert all(seq < committed for seq, committed in seen)
    assert log.appends == 6  # nothing is appended after the failure
    assert not any(t.name == "coevo-writer" for t in threading.enumerate())


class IntervalProbe(Actor):
    def __init__(self, seen: list[float]) -> None:
        self.seen = seen

    async def run(self, ctx: Context) -> None:
        self.seen.append(sys.getswitchinterval())


@pytest.mark.parametrize("interval", [0.0, 0.0007])
def test_switch_interval_holds_for_the_run_only(interval: float) -> None:
    before = sys.getswitchinterval()
    seen: list[float] = []
    specs = [ActorSpec(name="probe", factory=lambda: IntervalProbe(seen), driver=True)]
    run_runtime(specs, RuntimeConfig(switch_interval=interval))
    assert seen == [pytest.approx(interval or before)]
    assert sys.getswitchinterval() == before


class PanicException(BaseException):
    """What pyo3 raises when a Rust library panics (its own class of this name)."""


class Panicking(Actor):
    async def run(self, ctx: Context) -> None:
        await ctx.emit(Ping(n=0))
        raise PanicException("The global thread pool has not been initialized.")


def test_a_native_panic_in_an_actor_is_its_failure_and_the_run_records_its_end() -> None:
    """pyo3's PanicException derives from BaseException: it passed supervision, escaped the
    runtime as a traceback and left the log with no final event."""
    log, outcome = run_runtime([ActorSpec(name="p", factory=Panicking, driver=True)])
    failed = [e.event for e in log.read() if isinstance(e.event, ActorFailed)]
    assert [f.error_type for f in failed] == ["NativePanic"]
    assert "a native library panicked: The global thread pool" in failed[0].message
    assert outcome.reason == "failed"
    assert isinstance(list(log.read())[-1].event, RunFailed)


class FailsWhileStopped(Actor):
    """Waits in a nursery of its own whose task fails once the run stops it: the nursery
    raises a group of that error and the stop's ``Cancelled``."""

    async def run(self, ctx: Context) -> None:
        async def watch() -> None:
            try:
                await trio.sleep_forever()
            finally:
                raise LookupError("the cluster went away")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.sleep_forever()


def test_an_error_mixed_with_the_stops_cancellation_is_the_actors_failure() -> None:
    """A Ray proxy whose cluster went away while another actor's failure stopped the run
    raised a group of its error and ``Cancelled``: not an ``Exception``, so supervision let
    it through and it escaped ``Runtime.run`` as a traceback, the log without its end."""
    specs = [
        ActorSpec(name="waits", factory=FailsWhileStopped),
        ActorSpec(name="echo", factory=lambda: Echo(10, fail_at=3), driver=True),
    ]
    log, outcome = run_runtime([*specs, ActorSpec(name="src", factory=lambda: Source(10))])
    failed = [
        (e.event.actor, e.event.error_type) for e in log.read() if isinstance(e.event, ActorFailed)
    ]
    assert failed == [("echo", "RuntimeError"), ("waits", "LookupError")]
    assert outcome.reason == "failed" and "boom" in outcome.error
    assert isinstance(list(log.read())[-1].event, RunFailed)


class PluginBase(BaseException):
    """A plug-in's error class derived from ``BaseException`` by mistake."""


class RaisesBase(Actor):
    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def run(self, ctx: Context) -> None:
        await ctx.emit(Ping(n=0))
        raise self.error


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (PluginBase("bad"), "raised PluginBase, a BaseException that is not an Exception: bad"),
        (KeyboardInterrupt(), "raised KeyboardInterrupt with no signal received"),
        (GeneratorExit(), "raised GeneratorExit, a BaseException that is not an Exception"),
    ],
    ids=["own-class", "keyboard-interrupt", "generator-exit"],
)
def test_a_base_exception_an_actor_raises_is_its_failure(error: BaseException, says: str) -> None:
    """A plug-in method's actor raising a ``BaseException`` of its own escaped the run as a
    traceback, the log with no final event; one raising ``KeyboardInterrupt`` with no signal
    received read as the user's Ctrl-C ("stopped: coevo resume continues it")."""
    log, outcome = run_runtime(
        [ActorSpec(name="m", factory=lambda: RaisesBase(error), driver=True)],
        RuntimeConfig(handle_signals=True),
    )
    failed = [e.event for e in log.read() if isinstance(e.event, ActorFailed)]
    assert [(f.error_type, f.action) for f in failed] == [("BaseExceptionRaised", "stop")]
    assert says in failed[0].message
    assert outcome.reason == "failed" and isinstance(list(log.read())[-1].event, RunFailed)


def test_a_factory_raising_a_base_exception_fails_the_run_cleanly() -> None:
    def factory() -> Actor:
        raise PluginBase("cannot build")

    log, outcome = run_runtime([ActorSpec(name="m", factory=factory, driver=True)])
    failed = [e.event for e in log.read() if isinstance(e.event, ActorFailed)]
    assert [f.error_type for f in failed] == ["BaseExceptionRaised"]
    assert outcome.reason == "failed" and isinstance(list(log.read())[-1].event, RunFailed)


def test_a_keyboard_interrupt_where_signals_are_not_handled_stays_a_ctrl_c() -> None:
    """Without the runtime's own signal handling (a test, a notebook) a Ctrl-C arrives as
    ``KeyboardInterrupt`` wherever the loop is: it ends the run as before, not as a failure."""
    with pytest.raises(KeyboardInterrupt):
        run_runtime([ActorSpec(name="m", factory=lambda: RaisesBase(KeyboardInterrupt()))])


def test_a_second_signal_into_a_slow_stop_names_what_it_waits_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The line guessed "a world call that hangs?" while the stop waited on the learner."""
    import signal

    from engine import stopping

    written: list[bytes] = []
    monkeypatch.setattr(stopping.os, "write", lambda fd, data: written.append(data))

    def end(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(stopping.os, "_exit", end)
    with pytest.raises(SystemExit, match="130"):
        stopping.stop_where_it_is(signal.SIGINT, True, ["learner"])
    assert (
        b"while the run stops (1 s or more since the first: still waiting on learner)"
        in (written[0])
    )
    with pytest.raises(SystemExit):
        stopping.stop_where_it_is(signal.SIGINT, True)
    assert b"a world call that hangs?" in written[1]


def test_a_live_tail_reads_a_long_backlog_a_chunk_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``coevo log --follow`` read every event from its start to the log's head in one list
    before printing the first: 1.2 GB of memory on a 600k-event run. It reads a chunk at a
    time and yields every event once, in order."""
    from engine import replay

    monkeypatch.setattr(replay, "FOLLOW_CHUNK", 7)
    log = MemoryEventLog()
    log.append([Envelope(seq=i, run="r", t=0, actor="a", event=Ping(n=i)) for i in range(50)])
    spans: list[int] = []
    read = log.read

    def counted(start: int = 0, stop: int | None = None) -> Any:
        spans.append((stop if stop is not None else log.next_seq) - start)
        return read(start, stop)

    monkeypatch.setattr(log, "read", counted)

    async def tail() -> list[int]:
        flt = replay.EventFilter()
        return [e.seq async for e in replay.follow(log, flt, writing=lambda: False)]

    assert trio.run(tail) == list(range(50))
    assert max(spans) == 7


class Rebuilding(Actor):
    """An actor that rebuilds its state from a long history on resume, as a trainer does: a
    synchronous pass that holds the event loop. It interrupts itself (the user's Ctrl-C)
    as it reaches event ``ctrl_c_at``."""

    def __init__(self, ctrl_c_at: int, read: list[int]) -> None:
        self.ctrl_c_at = ctrl_c_at
        self.read = read

    async def recover(self, ctx: Context, history: Sequence[Envelope[Event]]) -> None:
        for env in history:
            if env.seq == self.ctrl_c_at:
                signal.raise_signal(signal.SIGINT)
            self.read.append(env.seq)

    async def run(self, ctx: Context) -> None:
        await trio.sleep_forever()


def test_a_ctrl_c_during_a_resumes_recovery_stops_it_without_reading_the_whole_log() -> None:
    """A resume's recovery reads the history on the event loop, so a Ctrl-C was taken only
    once every actor had read it all (11-32 s for a 137k-event log on a loaded machine)."""
    log, _ = run_runtime([ActorSpec(name="src", factory=lambda: Source(5_000))])
    end = log.next_seq
    started = RunStarted(run_id="r1", scenario="t", scenario_hash="h", seed=3, coevo_version="0")
    read: list[int] = []
    spec = ActorSpec(name="rebuilt", factory=lambda: Rebuilding(100, read))
    rt = Runtime(
        log,
        started,
        [spec],
        [ActorStats()],
        seed=3,
        config=RuntimeConfig(handle_signals=True),
        resumed=RunResumed(after=end - 1, previous="run_stopped"),
        history=LogHistory(log, end),
    )
    outcome = trio.run(rt.run)
    assert (outcome.reason, outcome.exit_code) == ("signal:SIGINT", 130)
    assert 100 < len(read) < 1_000  # stopped within a check's span of events, not at the end
    last = list(log.read())[-1].event
    assert isinstance(last, RunStopped) and last.signal == "SIGINT"
