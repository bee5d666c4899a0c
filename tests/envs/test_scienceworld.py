"""The ScienceWorld adapter against the real simulator: a gold-path episode that must succeed,
determinism of observations and action lists, failure recorded as such, a hung JVM, and a run of
the engine whose JVM is killed mid-episode. Skipped without the ``scienceworld`` extra or Java.

At most two JVMs live at once: the module's ``world`` and one per test.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

pytest.importorskip("scienceworld")
if shutil.which("java") is None:
    pytest.skip("ScienceWorld needs Java on PATH", allow_module_level=True)

from agents.acting.env_worker import EnvWorker
from agents.acting.projections import EpisodeTable
from agents.acting.scheduler import Scheduler
from agents.acting.scripted import RandomAgent
from agents.events.episodes import EpisodeAborted, EpisodeFinished, StepTaken
from engine.actor import ActorSpec
from engine.eventlog import new_run_meta
from engine.lifecycle import RunStarted, RunStopped
from engine.projection import ActorStats
from engine.replay import verify_log
from engine.runtime import Runtime
from engine.world import Observation, Task
from engine.world_registry import load_world
from scenarios.worlds.scienceworld import REFUSED, ScienceWorld
from scenarios.worlds.scienceworld_jvm import JvmHung
from stores.lmdb_log import LmdbEventLog

BOIL = Task(family="boil", variant=0)
LIVING = Task(family="find-living-thing", variant=4)


def jvm_pids() -> set[int]:
    """The ScienceWorld JVMs running on this machine that this process started."""
    out = subprocess.run(
        ["pgrep", "-P", str(os.getpid()), "-f", "scienceworld.jar"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {int(p) for p in out.stdout.split()}


@pytest.fixture(scope="module")
def world() -> Iterator[ScienceWorld]:
    w = ScienceWorld(tasks=["boil", "find-living-thing"], max_steps=60)
    yield w
    w.close()


def play(world: ScienceWorld, task: Task, actions: list[str]) -> list[Observation]:
    obs = [world.reset(task, seed=0)]
    for action in actions:
        if obs[-1].done:
            break
        obs.append(world.step(action))
    return obs


def random_actions(world: ScienceWorld, task: Task, steps: int, seed: int) -> list[str]:
    """A random walk that avoids ``focus on`` (which ends most tasks at once)."""
    rng = random.Random(seed)
    obs = world.reset(task, seed=0)
    actions: list[str] = []
    for _ in range(steps):
        choices = [a for a in obs.admissible if not a.startswith("focus on")]
        actions.append(rng.choice(choices))
        obs = world.step(actions[-1])
        if obs.done:
            break
    return actions


def test_registry_builds_it_and_lists_its_own_splits(world: ScienceWorld) -> None:
    train = {t.variant for t in world.tasks("boil", "train")}
    dev = {t.variant for t in world.tasks("boil", "heldout")}
    assert len(train) == 14 and len(dev) == 7 and not train & dev
    with pytest.raises(ValueError, match="no variation"):
        world.reset(Task(family="boil", variant=min(dev), split="train"), seed=0)
    built = load_world("scienceworld", {"tasks": ["1-1", "find-living-thing"], "variants": 3})
    try:  # the splits are read once per process: this world starts no JVM
        assert built.families() == ("boil", "find-living-thing")
        assert [t.variant for t in built.tasks("boil", "train")] == [0, 1, 2]
    finally:
        built.close()


def test_gold_path_succeeds_with_per_step_rewards(world: ScienceWorld) -> None:
    gold = list(world.gold_actions(BOIL))
    obs = play(world, BOIL, gold)
    assert obs[0].goal.startswith("Your task is to boil water")
    last = obs[-1]
    assert last.done and last.success and last.score == 1.0
    assert sum(o.reward for o in obs) == pytest.approx(1.0)
    assert all(o.reward >= 0 for o in obs)
    assert last.admissible == ()
    with pytest.raises(RuntimeError, match="after the episode ended"):
        world.step("look around")


def test_wrong_focus_fails_the_task_with_a_negative_score(world: ScienceWorld) -> None:
    world.reset(Task(family="find-living-thing", variant=0), seed=0)
    end = world.step("focus on picture")  # a picture is not a living thing
    assert end.done and not end.success
    assert end.score < 0 and end.reward == end.score


def test_admissible_lists_are_bounded_ordered_and_exclude_reset(world: ScienceWorld) -> None:
    obs = world.reset(BOIL, seed=0)
    assert 0 < len(obs.admissible) <= world.max_actions
    assert obs.admissible[:2] == ("look around", "inventory")
    assert "reset task" not in obs.admissible
    assert len(set(obs.admissible)) == len(obs.admissible)


def test_the_reset_task_command_is_refused(world: ScienceWorld) -> None:
    """ScienceWorld's ``reset task`` resets the goal progress mid-episode; never admissible,
    but a free-text policy can type it: the turn is spent and nothing changes."""
    first = world.reset(BOIL, seed=0)
    for command in ("reset task", "  Reset   TASK "):
        obs = world.step(command)
        assert obs.text == REFUSED and obs.admissible == first.admissible and not obs.done
    assert world.step("look around").text == play(world, BOIL, ["look around"])[-1].text


def test_templates_and_simplifications_reach_the_jvm() -> None:
    w = ScienceWorld(tasks=["boil"], actions="templates", simplifications="easy")
    try:
        obs = w.reset(BOIL, seed=0)
        assert obs.admissible[:3] == ("look around", "inventory", "task")
        assert {"open OBJ", "move OBJ to OBJ", "teleport OBJ"} <= set(obs.admissible)
        assert "reset task" not in obs.admissible
        assert "connect OBJ to OBJ" not in obs.admissible  # easy: no electrical actions
        assert "A door to the kitchen (that is open)" in obs.text  # easy: doors open
        assert w.step("teleport to kitchen").text == "You teleport to the kitchen."
    finally:
        w.close()


def test_same_actions_give_the_same_turns_in_one_jvm_and_across_jvms(
    world: ScienceWorld,
) -> None:
    # find-living-thing 4 has two yellow paints: without stable hashes the names ScienceWorld
    # gives them in valid actions, and the order of room contents, change between resets
    actions = random_actions(world, LIVING, steps=9, seed=4)
    first = play(world, LIVING, actions)
    assert play(world, LIVING, actions) == first
    other = ScienceWorld(tasks=[LIVING.family], max_steps=60)
    try:
        assert play(other, LIVING, actions) == first
    finally:
        other.close()


def test_a_hung_jvm_is_killed_and_the_next_reset_starts_a_new_one(
    world: ScienceWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(world, "step_timeout", 2.0)
    world.reset(BOIL, seed=0)
    pid = world.jvm_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    # the step's own call, or (seen once in CI, under load) the valid-actions call after it
    hung = rf"pid {pid}\) did not answer (step 'look around'|valid actions) within 2s"
    with pytest.raises(JvmHung, match=hung):
        world.step("look around")
    assert pid not in jvm_pids() and world.jvm_pid is None
    with pytest.raises(RuntimeError, match="before reset"):
        world.step("look around")
    assert world.reset(BOIL, seed=0).admissible
    assert world.jvm_pid not in (None, pid)


class KillsItsJvm(ScienceWorld):
    """Kills its own JVM with SIGKILL before the third step of the first episode it plays."""

    kills = 0

    def step(self, action: str) -> Observation:
        episode = self._episode
        if KillsItsJvm.kills == 0 and episode is not None and episode.steps == 2:
            KillsItsJvm.kills += 1
            assert self.jvm_pid is not None
            os.kill(self.jvm_pid, signal.SIGKILL)
        return super().step(action)


def test_a_jvm_killed_mid_episode_aborts_only_that_episode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The episode is aborted with the world's own reason, and py4j's tracebacks about the
    lost connection stay out of the run's output."""
    caplog.set_level(logging.DEBUG)
    before = jvm_pids()
    make_world = partial(KillsItsJvm, tasks=["boil"], max_steps=5)
    tasks = [BOIL]
    names = ["w0"]
    specs = [
        ActorSpec(name="scheduler", factory=partial(Scheduler, tasks, 3, names), driver=True),
        ActorSpec(
            name="w0",
            factory=partial(EnvWorker, make_world, RandomAgent),
            accepts=lambda ev: getattr(ev, "worker", None) == "w0",
        ),
    ]
    meta = new_run_meta("sw", scenario_name="sw", seed=1, coevo_version="0")
    log = LmdbEventLog.create(tmp_path / "log", meta, durable=False)
    started = RunStarted(run_id="sw", scenario="sw", scenario_hash="h", seed=1, coevo_version="0")
    runtime = Runtime(log, started, specs, [ActorStats(), EpisodeTable()], seed=1)
    trio.run(runtime.run)
    log.close()

    reader = LmdbEventLog.open(tmp_path / "log")
    try:
        events = [env.event for env in reader.read()]
        assert verify_log(reader, [ActorStats(), EpisodeTable()]).ok
    finally:
        reader.close()
    aborted = [e for e in events if isinstance(e, EpisodeAborted)]
    finished = [e for e in events if isinstance(e, EpisodeFinished)]
    assert (
        len(aborted) == 1
        and "JvmDied" in aborted[0].reason
        and "died during step" in (aborted[0].reason)
    )
    assert len(finished) == 2 and all(f.steps >= 1 for f in finished)
    logged = [e for e in events if isinstance(e, StepTaken) and e.episode == aborted[0].episode]
    assert [s.turn for s in logged] == [0, 1]  # the turns before the kill stay in the log
    assert isinstance(events[-1], RunStopped) and events[-1].reason == "completed"
    assert jvm_pids() == before  # the dead JVM was reaped, the replacement closed
    assert [r.getMessage() for r in caplog.records if r.name.startswith("py4j")] == []


def test_a_py4j_connection_that_failed_to_open_is_closed_not_left_to_the_collector() -> None:
    """py4j's ``GatewayConnection.start`` raises without closing its socket (it does so when
    it retries a command after the JVM died); left to the garbage collector, the socket warned
    in whichever test ran then. ``Jvm.call`` closes such sockets before it reports the JVM."""
    import socket

    from py4j.java_gateway import GatewayConnection, GatewayParameters
    from py4j.protocol import Py4JNetworkError

    from scenarios.worlds.scienceworld_jvm import close_dropped_sockets

    with socket.socket() as free:  # a port nobody listens on once this closes
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    connection = GatewayConnection(GatewayParameters(port=port))
    try:
        connection.start()
    except Py4JNetworkError as exc:
        assert connection.socket.fileno() != -1  # py4j left it open
        close_dropped_sockets(RuntimeError("no py4j frames"))
        assert connection.socket.fileno() != -1  # nothing else is closed
        try:  # as Jvm.call sees it: py4j's error as the context of a later one
            raise RuntimeError("the JVM died") from exc
        except RuntimeError as later:
            close_dropped_sockets(later)
    assert connection.socket.fileno() == -1


def test_a_jvm_option_java_refuses_is_reported_in_javas_words() -> None:
    """A bad JVM flag was ``JvmDied: invalid literal for int() with base 10: b''`` (py4j found
    no port in the JVM's output); the JVM's own reason is lost there, so it is asked for."""
    from scenarios.worlds.scienceworld_jvm import Jvm, JvmDied

    before = jvm_pids()
    with pytest.raises(JvmDied) as caught:
        Jvm(["-Xmx512m", "-XX:+NoSuchCoevoFlag"], timeout=60)
    assert "Unrecognized VM option 'NoSuchCoevoFlag'" in str(caught.value)
    assert "invalid literal" not in str(caught.value)
    assert jvm_pids() == before


def test_a_jvm_that_exits_as_it_starts_is_reported_in_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A JVM killed (or out of memory) as it starts prints no port, and py4j says only
    ``invalid literal for int() with base 10: b''``: the world says what happened, with what
    the JVM printed last."""
    import py4j.java_gateway

    from scenarios.worlds.scienceworld_jvm import Jvm, JvmDied

    def exits(*args: object, redirect_stderr: object = None, **kwargs: object) -> object:
        assert redirect_stderr is not None
        redirect_stderr.append("Error occurred during initialization of VM\n")  # type: ignore[attr-defined]
        raise ValueError("invalid literal for int() with base 10: b''")

    monkeypatch.setattr(py4j.java_gateway, "launch_gateway", exits)
    with pytest.raises(JvmDied) as caught:
        Jvm(["-Xmx512m"], timeout=60)
    assert str(caught.value) == (
        "scienceworld JVM exited as it started, before it named its port: "
        "Error occurred during initialization of VM"
    )


@pytest.mark.parametrize("memory", [512, "512", "1k", "16m", "lots", "512mb", "0m"])
def test_a_jvm_memory_the_jvm_refuses_or_cannot_run_in_is_refused_naming_it(
    memory: object,
) -> None:
    """``jvm_memory = 512`` (bytes to the JVM), ``"512"`` and ``"1k"`` passed the option check
    and failed as the JVM started, in words that named no setting."""
    with pytest.raises(ValueError, match="jvm_memory must be ") as err:
        load_world("scienceworld", {"jvm_memory": memory})
    assert repr(memory) in str(err.value)


def test_a_jvm_whose_gateway_fails_to_close_is_still_reaped() -> None:
    """``Jvm.close`` reaped the process only after the gateway closed cleanly: a gateway that
    raised (a JVM already ended by the same Ctrl-C) left the process to outlive the run as a
    zombie where the container's init does not reap."""
    from scenarios.worlds.scienceworld_jvm import Jvm

    class Refuses:
        def close(self) -> None:
            raise OSError("the JVM already ended")

    jvm = object.__new__(Jvm)  # a process that exits when its stdin closes, as the JVM does
    jvm.gateway = Refuses()
    jvm.proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    with pytest.raises(OSError, match="already ended"):
        jvm.close()
    assert jvm.proc.returncode == 0  # reaped
