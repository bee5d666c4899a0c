"""Env workers on Ray, the log on the driver (``[runtime] backend = "ray"``, engine/ray_backend.py),
on the session's local Ray instance (``ray_address`` in tests/conftest.py).

- The same scenario and seed give the same episodes locally and on Ray (a deterministic world).
- A remote env worker's process killed mid-episode: the run goes on, the lost attempt is
  abandoned with the reason, the worker restarts in a new process and runs the episode again,
  every planned episode finishes and is the one a local run plays, and the log verifies.
- A Ray run whose driver is killed resumes (``coevo resume``) and ends with a local run's episodes.
- The inference actor on Ray (``[runtime.ray.inference]``) in a deterministic GRPO run, its
  process killed after the first update: it restarts with the newest policy version, and the
  run samples, trains and ends as a local run does.
- The learner on Ray (``[runtime.ray.learner]``), its process killed as the second update is
  requested: it restarts from the newest checkpoint the log names and the run trains as a
  local run does. The same learner training in a process of its own (``learner_threads =
  1``), that process killed alone: it restarts as in the driver, and trains as a local run.
- That GRPO run with both on Ray, its driver killed: ``coevo resume`` ends it as a local run.
- A Complementary RL run with its extractor and memory on Ray (``[runtime.ray.extractor]``,
  ``[runtime.ray.memory]``), the extractor's process killed as an episode still running asks
  for an extraction (after its first update), then the memory's as another asks for a
  retrieval or has its extraction applied: each restarts rebuilt from the log (the extractor
  from its newest checkpoint) and answers what was not answered, every planned episode
  finishes, nothing is recorded twice, and ``coevo replay --verify`` and ``coevo check`` pass.
  An EMPO2 run whose remote memory is killed as an episode asks for tips, the same. (These
  methods are not deterministic even in one process: their memory's writes race its reads,
  docs/RELIABILITY.md; so they are checked for what they owe, not against a local run.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from agents.events.extractor import (
    ExtractionRequested,
    ExtractorCalled,
    ExtractorUpdated,
    MergeRequested,
)
from agents.events.memory import (
    ReflectionRequested,
    RetrievalRequested,
    TipProposed,
    TipRejected,
    TipsRetrieved,
    TipStored,
)
from agents.events.policy import ActionRequested, ActionSampled, GradientRequested, PolicyUpdated
from agents.testing.processes import children
from engine.eventlog import MemoryEventLog, new_run_meta
from engine.events import Envelope, Event
from engine.lifecycle import ActorFailed, ActorRestarted, ActorStarted, RunStarted
from engine.replay import verify_log
from engine.runtime import RunOutcome, Runtime
from scenarios.assemble import Assembly, assemble, fact_checks
from scenarios.loader import load_scenario, resolved_toml, scenario_hash
from stores.lmdb_log import LmdbEventLog
from stores.rundir import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from resume_kit import (
    COMPLEMENTARY,
    EMPO2,
    GRPO,
    coevo,
    comparable,
    duplicates,
    final_digest,
    finish,
    read_log,
    stop_at,
)

pytest.importorskip("ray")

EXPLORE = """
name = "ray-explore"
seed = 5

[world]
name = "{world}"
options = {options}

[agent]
kind = "explorer"

[run]
episodes = {episodes}
workers = {workers}

[runtime]
backend = "{backend}"

[runtime.ray.env_workers]
num_cpus = 0.25
per_process = {per_process}

[logging]
progress = false
"""

PACED = "scenarios.worlds.paced:PacedLab"


def scenario_file(
    tmp: Path,
    backend: str,
    *,
    world: str = "minilab",
    options: str = "{}",
    episodes: int = 30,
    workers: int = 3,
    per_process: int = 1,
) -> Path:
    path = tmp / f"{backend}.toml"
    text = EXPLORE.format(
        world=world,
        options=options,
        episodes=episodes,
        workers=workers,
        backend=backend,
        per_process=per_process,
    )
    path.write_text(text, encoding="utf-8")
    return path


def prepare(path: Path) -> Assembly:
    return assemble(load_scenario(path), str(path))


def run(
    path: Path,
    log: Any,
    observers: Sequence[Callable[[list[Envelope[Event]]], None]] = (),
    assembly: Assembly | None = None,
) -> tuple[RunOutcome, list[Envelope[Event]]]:
    scenario = load_scenario(path)
    assembly = assembly or assemble(scenario, str(path))
    started = RunStarted(
        run_id="r", scenario=scenario.name, scenario_hash="", seed=scenario.seed, coevo_version=""
    )
    runtime = Runtime(
        log,
        started,
        assembly.specs,
        assembly.projections,
        seed=scenario.seed,
        config=assembly.config,
        observers=observers,
    )
    outcome = trio.run(runtime.run)
    return outcome, list(log.read(0, None))


def episodes(envs: list[Envelope[Event]]) -> dict[str, list[bytes]]:
    """Each finished episode's start, turns and end, with the worker that ran it left out."""
    turns: dict[str, list[bytes]] = {}
    for env in envs:
        ev = env.event
        if isinstance(ev, EpisodeStarted | EpisodeFinished):
            ev = msgspec.structs.replace(ev, worker="")
        if isinstance(ev, EpisodeStarted):
            turns[ev.episode] = []  # a re-run (after an abandoned attempt) starts afresh
        if isinstance(ev, EpisodeStarted | StepTaken | EpisodeFinished):
            turns[ev.episode].append(msgspec.msgpack.encode(ev))
    finished = {e.event.episode for e in envs if isinstance(e.event, EpisodeFinished)}
    return {ep: body for ep, body in turns.items() if ep in finished}


def remote_types(envs: list[Envelope[Event]]) -> Counter[str]:
    return Counter(e.event.actor_type for e in envs if isinstance(e.event, ActorStarted))


@pytest.mark.parametrize("per_process", [1, 2])
def test_the_same_scenario_and_seed_play_the_same_episodes_locally_and_on_ray(
    tmp_path: Path, ray_address: str, per_process: int
) -> None:
    local = run(scenario_file(tmp_path, "local"), MemoryEventLog())
    path = scenario_file(tmp_path, "ray", per_process=per_process)
    assembly = prepare(path)
    remote = run(path, MemoryEventLog(), assembly=assembly)
    assert local[0].reason == remote[0].reason == "completed"
    assert remote_types(remote[1])["RemoteEnvWorker"] == 3  # the workers did run on Ray
    assert remote_types(local[1])["EnvWorker"] == 3
    played = episodes(local[1])
    assert len(played) == 30
    assert episodes(remote[1]) == played
    workers = {e.event.worker for e in remote[1] if isinstance(e.event, EpisodeFinished)}
    assert workers == {"worker-0", "worker-1", "worker-2"}
    # the process each worker ran in: worker-0 and worker-1 share one when two go to a process
    pids = {s.name: getattr(s.factory, "inflight").pid for s in assembly.specs[1:]}  # noqa: B009
    assert all(pids.values()) and len(pids) == 3
    assert len(set(pids.values())) == (3 if per_process == 1 else 2), pids
    assert (pids["worker-0"] == pids["worker-1"]) == (per_process == 2), pids


def signal_mid_episode(
    inflight: dict[str, Any], sig: int, sent: list[tuple[str, int]]
) -> Callable[[list[Envelope[Event]]], None]:
    """An observer that sends ``sig`` to worker-1's process at turn 2 of its first episode,
    once, noting ``(episode, pid)`` in ``sent``."""
    running: dict[str, str] = {}  # episode -> worker

    def observe(batch: list[Envelope[Event]]) -> None:
        for env in batch:
            ev = env.event
            if isinstance(ev, EpisodeStarted):
                running[ev.episode] = ev.worker
            elif (
                isinstance(ev, StepTaken)
                and ev.turn == 2
                and not sent
                and running[ev.episode] == "worker-1"
            ):
                pid = inflight["worker-1"].pid
                os.kill(pid, sig)
                sent.append((ev.episode, pid))

    return observe


def test_a_remote_worker_killed_mid_episode_restarts_and_runs_it_again(
    tmp_path: Path, ray_address: str
) -> None:
    paced = scenario_file(
        tmp_path, "ray", world=PACED, options="{ delay_ms = 15 }", episodes=9, workers=3
    )
    log = LmdbEventLog.create(
        tmp_path / "log", new_run_meta("r", scenario_name="x", seed=5, coevo_version="0")
    )
    assembly = prepare(paced)
    inflight = {spec.name: getattr(spec.factory, "inflight", None) for spec in assembly.specs}
    killed: list[tuple[str, int]] = []
    kill_mid_episode = signal_mid_episode(inflight, signal.SIGKILL, killed)
    outcome, envs = run(paced, log, [kill_mid_episode], assembly)
    assert outcome.reason == "completed"
    assert killed, "the run ended before the kill"
    assert inflight["worker-1"].pid not in (0, killed[0][1])  # pyright: ignore[reportOptionalMemberAccess]
    episode = killed[0][0]
    failed = [e.event for e in envs if isinstance(e.event, ActorFailed)]
    assert [(f.actor, f.error_type) for f in failed] == [("worker-1", "RemoteActorLost")]
    restarted = [e.event for e in envs if isinstance(e.event, ActorRestarted)]
    assert [(r.actor, r.attempt) for r in restarted] == [("worker-1", 1)]
    assert restarted[0].reason.startswith("RemoteActorLost: worker-1: ")
    abandoned = [e.event for e in envs if isinstance(e.event, EpisodeAbandoned)]
    assert [(a.episode, a.worker) for a in abandoned] == [(episode, "worker-1")]
    assert abandoned[0].reason.startswith("worker restarted (RemoteActorLost: worker-1: ")
    assert not any(isinstance(e.event, EpisodeAborted) for e in envs)
    starts = [e.event for e in envs if isinstance(e.event, ActorStarted)]
    assert ("worker-1", 1, "RemoteEnvWorker") in [
        (s.actor, s.attempt, s.actor_type) for s in starts
    ]
    assigned = Counter(e.event.episode for e in envs if isinstance(e.event, EpisodeAssigned))
    assert assigned[episode] == 2  # assigned again after the loss
    finished = Counter(e.event.episode for e in envs if isinstance(e.event, EpisodeFinished))
    assert sorted(finished) == [f"ep{i:06d}" for i in range(9)] and set(finished.values()) == {1}
    # nothing was lost or changed: every episode, the lost one included, is a local run's
    local = scenario_file(tmp_path, "local", world=PACED, options="{ delay_ms = 0 }", episodes=9)
    assert episodes(envs) == episodes(run(local, MemoryEventLog())[1])
    log.close()
    log = LmdbEventLog.open(tmp_path / "log", writable=False)
    try:
        assert log.verify().ok
        checked = verify_log(log, assembly.projections, fact_checks())
        assert checked.ok, checked.error
    finally:
        log.close()


def test_a_remote_worker_stopped_mid_episode_is_ended_and_restarts(
    tmp_path: Path, ray_address: str
) -> None:
    """A worker's process stopped (SIGSTOP) mid-episode: Ray saw nothing wrong and the run
    waited for good; past ``stall_timeout`` its proxy counts it lost, ends it (it held its
    reservation: a restart waited for room until the run failed) and restarts the worker."""
    paced = scenario_file(
        tmp_path, "ray", world=PACED, options="{ delay_ms = 15 }", episodes=9, workers=3
    )
    text = paced.read_text(encoding="utf-8")
    paced.write_text(text.replace("per_process = 1", "per_process = 1\nstall_timeout = 3"))
    assembly = prepare(paced)
    inflight = {spec.name: getattr(spec.factory, "inflight", None) for spec in assembly.specs}
    stopped: list[tuple[str, int]] = []
    stop_mid_episode = signal_mid_episode(inflight, signal.SIGSTOP, stopped)

    try:
        outcome, envs = run(paced, MemoryEventLog(), [stop_mid_episode], assembly)
        assert outcome.reason == "completed"
        assert stopped, "the run ended before the stop"
        state = _state(stopped[0][1])
        assert not state.startswith("T"), f"the stopped process was left ({state})"
    finally:
        for _, pid in stopped:  # whatever happened, nothing is left stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    failed = [e.event for e in envs if isinstance(e.event, ActorFailed)]
    assert [(f.actor, f.error_type) for f in failed] == [("worker-1", "RemoteActorStalled")]
    abandoned = [e.event for e in envs if isinstance(e.event, EpisodeAbandoned)]
    assert [(a.episode, a.worker) for a in abandoned] == [(stopped[0][0], "worker-1")]
    finished = Counter(e.event.episode for e in envs if isinstance(e.event, EpisodeFinished))
    assert sorted(finished) == [f"ep{i:06d}" for i in range(9)] and set(finished.values()) == {1}


def _state(pid: int) -> str:
    """A process's state as /proc reads it ("T (stopped)"); "" when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    except OSError:
        return ""
    return next(
        (ln.split(":", 1)[1].strip() for ln in status.splitlines() if ln.startswith("State:")), ""
    )


def test_a_lost_process_of_two_workers_restarts_both_and_their_episodes_run_again(
    tmp_path: Path, ray_address: str
) -> None:
    paced = scenario_file(
        tmp_path, "ray", world=PACED, options="{ delay_ms = 15 }", episodes=12, workers=4,
        per_process=2,
    )  # fmt: skip
    assembly = prepare(paced)
    inflight = {spec.name: getattr(spec.factory, "inflight", None) for spec in assembly.specs}
    running: dict[str, str] = {}  # episode -> worker
    killed: list[int] = []
    before: dict[str, int] = {}

    def kill_mid_episode(batch: list[Envelope[Event]]) -> None:
        for env in batch:
            ev = env.event
            if isinstance(ev, EpisodeStarted):
                running[ev.episode] = ev.worker
            elif (
                isinstance(ev, StepTaken)
                and ev.turn == 2
                and not killed
                and running[ev.episode] == "worker-3"
                and all(i.pid for i in inflight.values() if i is not None)  # all placed
            ):
                before.update({n: i.pid for n, i in inflight.items() if i is not None})
                os.kill(before["worker-3"], signal.SIGKILL)
                killed.append(before["worker-3"])

    log = MemoryEventLog()
    outcome, envs = run(paced, log, [kill_mid_episode], assembly)
    assert outcome.reason == "completed"
    assert killed, "the run ended before the kill"
    assert before["worker-2"] == before["worker-3"] != before["worker-0"] == before["worker-1"]
    after = {n: i.pid for n, i in inflight.items() if i is not None}
    # the process's two workers restarted together in one new process; the others stayed
    assert after["worker-2"] == after["worker-3"] not in (0, killed[0])
    assert after["worker-0"] == before["worker-0"]
    failed = sorted((e.event.actor, e.event.error_type) for e in envs
                    if isinstance(e.event, ActorFailed))  # fmt: skip
    assert failed == [("worker-2", "RemoteActorLost"), ("worker-3", "RemoteActorLost")]
    abandoned = [e.event for e in envs if isinstance(e.event, EpisodeAbandoned)]
    assert 1 <= len(abandoned) <= 2 and "worker-3" in [a.worker for a in abandoned]
    finished = Counter(e.event.episode for e in envs if isinstance(e.event, EpisodeFinished))
    assert sorted(finished) == [f"ep{i:06d}" for i in range(12)] and set(finished.values()) == {1}
    local = scenario_file(
        tmp_path, "local", world=PACED, options="{ delay_ms = 0 }", episodes=12, workers=4
    )
    assert episodes(envs) == episodes(run(local, MemoryEventLog())[1])
    checked = verify_log(log, assembly.projections, fact_checks())
    assert checked.ok, checked.error


def test_a_ray_run_whose_driver_is_killed_resumes_to_a_local_runs_episodes(
    tmp_path: Path, ray_address: str
) -> None:
    paced = scenario_file(
        tmp_path, "ray", world=PACED, options="{ delay_ms = 10 }", episodes=24, workers=3
    )
    out = tmp_path / "run"
    cache = tmp_path / "cache"
    join = f'runtime.ray.address="{ray_address}"'
    first = coevo(["run", str(paced), "--out", str(out), "--set", join], cache)
    assert stop_at(first, out, 120, signal.SIGKILL, timeout=120) == -signal.SIGKILL
    before = read_log(out)
    finish(coevo(["resume", str(out)], cache), timeout=120)
    envs = read_log(out)
    assert envs[: len(before)] == before  # nothing committed was lost or rewritten
    kinds = Counter(type(e.event).__name__ for e in envs)
    assert kinds["RunResumed"] == 1 and kinds["EpisodeAbandoned"] >= 1
    assert remote_types(envs)["RemoteEnvWorker"] == 6  # 3 workers, each session
    local = scenario_file(tmp_path, "local", world=PACED, options="{ delay_ms = 0 }", episodes=24)
    assert episodes(envs) == episodes(run(local, MemoryEventLog())[1])
    verify = coevo(["replay", str(out), "--verify"], cache)
    finish(verify, timeout=120)


RAY_INFERENCE = """
[runtime]
backend = "ray"

[runtime.ray.env_workers]
num_cpus = 0.25
per_process = 3

[runtime.ray.inference]
num_cpus = 0.5

[logging]"""


def learn(
    path: Path, run_dir: Path, observers: Sequence[Callable[[list[Envelope[Event]]], None]] = ()
) -> tuple[Assembly, RunOutcome, MemoryEventLog]:
    """A learning run of ``path`` in this process, its checkpoints in ``run_dir``."""
    scenario = load_scenario(path)
    assembly = assemble(scenario, str(path), run_dir=run_dir)
    log = MemoryEventLog()
    outcome, _ = run(path, log, observers, assembly)
    return assembly, outcome, log


@pytest.fixture(scope="module")
def grpo_local(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Envelope[Event]]]:
    """The deterministic GRPO run in the driver alone: the model cache it built, its log."""
    root = tmp_path_factory.mktemp("grpo")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COEVO_CACHE", str(root / "cache"))
        path = root / "local.toml"
        path.write_text(GRPO, encoding="utf-8")
        _, outcome, log = learn(path, root / "local")
    assert outcome.reason == "completed"
    return root / "cache", list(log.read(0, None))


def run_killing(
    tmp_path: Path,
    placed: str,
    actor: str,
    kill_at: Callable[[Event, dict[str, Any]], bool],
    *,
    scenario: str = GRPO,
    victim: Callable[[int], int] = lambda pid: pid,
) -> tuple[Assembly, RunOutcome, MemoryEventLog, int]:
    """The GRPO run (or ``scenario``) with ``placed`` added, the process of remote ``actor``
    (or the one ``victim`` picks given its pid) killed (SIGKILL) at the first committed event
    ``kill_at`` accepts (given a dict to keep state in); the pid killed."""
    path = tmp_path / "ray.toml"
    path.write_text(scenario.replace("[logging]", placed), encoding="utf-8")
    assembly = assemble(load_scenario(path), str(path), run_dir=tmp_path / "ray")
    records = {s.name: getattr(s.factory, "inflight", None) for s in assembly.specs}
    state: dict[str, Any] = {"killed": 0}

    def kill(batch: list[Envelope[Event]]) -> None:
        for env in batch:
            if not state["killed"] and kill_at(env.event, state):
                host = records[actor].pid  # pyright: ignore[reportOptionalMemberAccess]
                state["killed"] = victim(host)
                os.kill(state["killed"], signal.SIGKILL)

    log = MemoryEventLog()
    outcome, _ = run(path, log, [kill], assembly)
    assert state["killed"], "the run ended before the kill"
    assert records[actor].pid not in (0, state["killed"])  # pyright: ignore[reportOptionalMemberAccess]
    return assembly, outcome, log, state["killed"]


def after_the_first_update(kind: type[Event]) -> Callable[[Event, dict[str, Any]], bool]:
    def at(ev: Event, state: dict[str, Any]) -> bool:
        state["updated"] = state.get("updated", False) or isinstance(ev, PolicyUpdated)
        return state["updated"] and isinstance(ev, kind)

    return at


def check_as_local(
    assembly: Assembly, outcome: RunOutcome, log: MemoryEventLog, local: list[Envelope[Event]],
    actor: str, kind: str, error: str = "RemoteActorLost",
) -> None:  # fmt: skip
    """The killed run restarted ``actor`` once, after one failure of type ``error``, and
    otherwise matches the local run: the same samples, advantages, updates and final weights,
    and its log verifies."""
    envs = list(log.read(0, None))
    assert outcome.reason == "completed"
    starts = [(e.event.attempt, e.event.actor_type) for e in envs
              if isinstance(e.event, ActorStarted) and e.event.actor == actor]  # fmt: skip
    assert starts == [(0, kind), (1, kind)]
    failed = [(e.event.actor, e.event.error_type) for e in envs if isinstance(e.event, ActorFailed)]
    assert failed == [(actor, error)]
    assert comparable(envs) == comparable(local)
    assert final_digest(envs) == final_digest(local)
    assert all(e.event.stale == 0 for e in envs if isinstance(e.event, PolicyUpdated))
    checked = verify_log(log, assembly.projections, fact_checks())
    assert checked.ok, checked.error


@pytest.mark.slow  # a learning run: minutes on 2 cores (make test-slow)
def test_inference_on_ray_learns_as_a_local_run_does_and_survives_its_process(
    tmp_path: Path,
    ray_address: str,
    monkeypatch: pytest.MonkeyPatch,
    grpo_local: tuple[Path, list[Envelope[Event]]],
) -> None:
    """Killed after the first update, as it answers a request: its next process loads the
    newest version and answers what was not answered (nothing served from an old version)."""
    cache, local = grpo_local
    monkeypatch.setenv("COEVO_CACHE", str(cache))
    kill_at = after_the_first_update(ActionRequested)
    result = run_killing(tmp_path, RAY_INFERENCE, "inference", kill_at)
    check_as_local(*result[:3], local, "inference", "RemoteInferenceActor")


RAY_LEARNER = """
[runtime]
backend = "ray"

[runtime.ray.learner]
num_cpus = 0.5

[logging]"""


@pytest.mark.slow  # a learning run: minutes on 2 cores (make test-slow)
def test_a_learner_on_ray_restarts_from_its_newest_checkpoint_and_learns_as_a_local_run(
    tmp_path: Path,
    ray_address: str,
    monkeypatch: pytest.MonkeyPatch,
    grpo_local: tuple[Path, list[Envelope[Event]]],
) -> None:
    """Killed once the second update is requested: its next process folds the log's samples
    again, loads the newest checkpoint the log names (weights and optimiser) and makes the
    update the lost one owed; the run's updates and final weights are a local run's."""
    cache, local = grpo_local
    monkeypatch.setenv("COEVO_CACHE", str(cache))
    kill_at = after_the_first_update(GradientRequested)
    result = run_killing(tmp_path, RAY_LEARNER, "learner", kill_at)
    check_as_local(*result[:3], local, "learner", "RemoteLearner")
    envs = list(result[2].read(0, None))
    assert [e.event.policy_version for e in envs if isinstance(e.event, PolicyUpdated)] == [1, 2, 3]


@pytest.mark.slow  # a learning run: minutes on 2 cores (make test-slow)
def test_a_learner_on_ray_whose_training_process_is_killed_restarts_and_learns_as_a_local_run(
    tmp_path: Path,
    ray_address: str,
    monkeypatch: pytest.MonkeyPatch,
    grpo_local: tuple[Path, list[Envelope[Event]]],
) -> None:
    """The learner on Ray training in a process of its own (``learner_threads = 1``), that
    process killed alone once the second update is requested (not the Ray process hosting the
    learner): the learner's error says its training process was lost, which its spec restarts
    for as in the driver, and the run's updates and final weights are a local run's."""
    cache, local = grpo_local
    monkeypatch.setenv("COEVO_CACHE", str(cache))
    own_process = GRPO.replace("[policy]\n", "[policy]\nlearner_threads = 1\n")
    assert own_process != GRPO
    kill_at = after_the_first_update(GradientRequested)
    result = run_killing(
        tmp_path, RAY_LEARNER, "learner", kill_at, scenario=own_process, victim=trainee_of
    )
    check_as_local(*result[:3], local, "learner", "RemoteLearner", "RemoteActorRestartable")
    envs = list(result[2].read(0, None))
    failure = next(e.event for e in envs if isinstance(e.event, ActorFailed))
    assert failure.action == "restart" and "LearnerProcessLost" in failure.message
    assert [e.event.policy_version for e in envs if isinstance(e.event, PolicyUpdated)] == [1, 2, 3]


def trainee_of(pid: int) -> int:
    """The learner's training process (``agents.learning.trainee_host``) that the Ray process
    ``pid`` started."""
    trainees = [child for child in children(pid) if is_trainee(child)]
    assert len(trainees) == 1, trainees
    return trainees[0]


def is_trainee(pid: int) -> bool:
    """``pid`` runs a learner's training process (``agents.learning.trainee_host``)."""
    try:
        return b"trainee_host" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


RAY_BOTH = """
[runtime]
backend = "ray"

[runtime.ray.inference]
num_cpus = 0.5

[runtime.ray.learner]
num_cpus = 0.5

[logging]"""


@pytest.mark.slow  # a learning run: minutes on 2 cores (make test-slow)
def test_a_learning_run_with_remote_inference_and_learner_resumes_as_a_local_run(
    tmp_path: Path, ray_address: str, grpo_local: tuple[Path, list[Envelope[Event]]]
) -> None:
    """The driver killed (SIGKILL) mid-run: ``coevo resume`` gives the remote inference actor
    and learner the history in their processes (they rebuild as local ones do) and the run
    ends with the local run's samples, updates and final weights."""
    cache, local = grpo_local
    path = tmp_path / "ray.toml"
    path.write_text(GRPO.replace("[logging]", RAY_BOTH), encoding="utf-8")
    out = tmp_path / "run"
    join = f'runtime.ray.address="{ray_address}"'
    first = coevo(["run", str(path), "--out", str(out), "--set", join], cache)
    assert stop_at(first, out, 900, signal.SIGKILL, timeout=300) == -signal.SIGKILL
    before = read_log(out)
    assert any(isinstance(e.event, PolicyUpdated) for e in before)  # killed after an update
    finish(coevo(["resume", str(out)], cache), timeout=300)
    envs = read_log(out)
    assert envs[: len(before)] == before
    kinds = Counter(e.event.actor_type for e in envs if isinstance(e.event, ActorStarted))
    assert kinds["RemoteInferenceActor"] == kinds["RemoteLearner"] == 2  # each session
    assert comparable(envs) == comparable(local)
    assert final_digest(envs) == final_digest(local)
    finish(coevo(["replay", str(out), "--verify"], cache), timeout=120)
    finish(coevo(["check", str(out)], cache), timeout=120)


RAY_METHOD = """
[runtime]
backend = "ray"

[runtime.ray.env_workers]
num_cpus = 0.25
per_process = 3
{placed}
[logging]"""


Plan = list[tuple[str, Callable[[Envelope[Event], dict[str, Any]], bool]]]
"""Remote actors whose processes a run kills, in turn, each at the first committed envelope
its predicate accepts."""


def run_killing_in_dir(
    path: Path, root: Path, plan: Plan
) -> tuple[Assembly, RunOutcome, list[Envelope[Event]], dict[str, int]]:
    """A run of ``path`` in this process, into the run directory ``root`` as ``coevo run``
    writes one (its LMDB log and scenario, so that ``coevo replay`` and ``coevo check`` read
    it), killing the processes ``plan`` names; the pids killed, by actor."""
    scenario = load_scenario(path)
    text = resolved_toml(scenario)
    meta = new_run_meta(
        "r", scenario_name=scenario.name, seed=scenario.seed, coevo_version="",
        scenario_toml=text, scenario_hash=scenario_hash(text), created_ns=0,
    )  # fmt: skip
    rd = RunDir(root)
    log = LmdbEventLog.create(rd.log, meta)
    rd.scenario.write_text(text, encoding="utf-8")
    try:
        assembly = assemble(scenario, str(path), run_dir=root)
        observe, killed = killer(assembly, plan)
        outcome, envs = run(path, log, [observe], assembly)
    finally:
        log.close()
    return assembly, outcome, envs, killed


def killer(
    assembly: Assembly, plan: Plan
) -> tuple[Callable[[list[Envelope[Event]]], None], dict[str, int]]:
    """An observer that kills (SIGKILL) the process of each remote actor of ``plan`` in turn,
    at the first committed envelope its predicate accepts (given a dict to keep state in);
    the pids it killed, by actor."""
    records = {s.name: getattr(s.factory, "inflight", None) for s in assembly.specs}
    killed: dict[str, int] = {}
    state: dict[str, Any] = {}

    def observe(batch: list[Envelope[Event]]) -> None:
        for env in batch:
            state["updated"] = state.get("updated", False) or isinstance(
                env.event, PolicyUpdated | ExtractorUpdated
            )
            if isinstance(env.event, ActorStarted) and env.event.attempt:
                state.setdefault("restarted", set()).add(env.event.actor)
            if len(killed) == len(plan):
                return
            actor, at = plan[len(killed)]
            pid = records[actor].pid  # pyright: ignore[reportOptionalMemberAccess]
            if pid and at(env, state):
                os.kill(pid, signal.SIGKILL)
                killed[actor] = pid

    return observe, killed


def check_owed(
    assembly: Assembly, outcome: RunOutcome, envs: list[Envelope[Event]],
    killed: dict[str, int], kinds: dict[str, str], root: Path, cache: Path,
) -> None:  # fmt: skip
    """What a run whose remote actors were killed owes: it completed, each killed actor was
    restarted once in a new process, every planned episode finished, every request of an
    episode that finished was answered once (none twice), every update was made once and in
    order, and ``coevo replay --verify`` and ``coevo check`` pass."""
    assert outcome.reason == "completed", outcome.error
    assert set(killed) == set(kinds), f"the run ended before the kills: {killed}"
    for actor, kind in kinds.items():
        starts = [(e.event.attempt, e.event.actor_type) for e in envs
                  if isinstance(e.event, ActorStarted) and e.event.actor == actor]  # fmt: skip
        assert starts == [(0, kind), (1, kind)]
        record = next(s.factory for s in assembly.specs if s.name == actor)
        assert record.inflight.pid not in (0, killed[actor])  # pyright: ignore[reportFunctionMemberAccess]
    failed = sorted((e.event.actor, e.event.error_type) for e in envs
                    if isinstance(e.event, ActorFailed))  # fmt: skip
    assert failed == sorted((actor, "RemoteActorLost") for actor in kinds)
    trained = {e.event.episode for e in envs
               if isinstance(e.event, EpisodeFinished) and e.event.purpose == "train"}  # fmt: skip
    planned = {e.event.episode for e in envs
               if isinstance(e.event, EpisodeAssigned) and e.event.purpose == "train"}  # fmt: skip
    assert trained == planned and len(trained) >= assembly.episodes
    assert duplicates(envs) == []
    answered_once(envs)
    for updated, field in (
        (PolicyUpdated, "policy_version"),
        (ExtractorUpdated, "extractor_version"),
    ):
        versions = [getattr(e.event, field) for e in envs if isinstance(e.event, updated)]
        assert versions == list(range(1, len(versions) + 1))
    finish(coevo(["replay", str(root), "--verify"], cache), timeout=300)
    finish(coevo(["check", str(root)], cache), timeout=300)


def answered_once(envs: list[Envelope[Event]]) -> None:
    """Every request of an attempt that finished that its episode or the bank waits on has one
    answer (an action, a retrieval, a reflection, a tip); an extraction or a merge at most one
    (nothing waits for the extractor: a run may end before it answered all)."""
    finished = {e.event.episode for e in envs if isinstance(e.event, EpisodeFinished)}
    abandoned = {e.event.episode: e.seq for e in envs if isinstance(e.event, EpisodeAbandoned)}
    answers = (ActionSampled, TipsRetrieved, TipProposed, TipStored, TipRejected, ExtractorCalled)
    causes = Counter(e.cause for e in envs if isinstance(e.event, answers))
    awaited = (ActionRequested, RetrievalRequested, ReflectionRequested, TipProposed)
    for env in envs:
        ev = env.event
        if isinstance(ev, awaited) and ev.episode in finished:
            live = abandoned.get(ev.episode, -1) < env.seq
            assert causes[env.seq] == 1 if live else causes[env.seq] <= 1, (env.seq, ev)
        elif isinstance(ev, ExtractionRequested | MergeRequested):
            assert causes[env.seq] <= 1, (env.seq, ev)


def of_a_running_episode(kind: type[Event]) -> Callable[[Envelope[Event], dict[str, Any]], bool]:
    """After the first update (of either model) and the restarts so far: a ``kind`` request of
    an episode that has not finished (it waits for the answer)."""

    def at(env: Envelope[Event], state: dict[str, Any]) -> bool:
        return state.get("updated", False) and isinstance(env.event, kind)

    return at


@pytest.mark.slow  # a learning run: minutes on 2 cores (make test-slow)
@pytest.mark.timeout(900)  # a learning run with models built in three processes
def test_a_complementary_run_with_remote_extractor_and_memory_survives_both_processes(
    tmp_path: Path, ray_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The extractor killed as a running episode asks for an extraction, after its first
    update: its next process loads the newest checkpoint the log names and answers it; then
    the memory killed as another asks for a retrieval or has its extraction applied: its next
    process folds the bank again and answers."""
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    placed = "\n[runtime.ray.extractor]\nnum_cpus = 0.5\n\n[runtime.ray.memory]\nnum_cpus = 0.5\n"
    path = tmp_path / "complementary.toml"
    text = COMPLEMENTARY.replace("[logging]", RAY_METHOD.format(placed=placed))
    # long enough for the extractor's next process to load its model and catch up
    path.write_text(text.replace("episodes = 32", "episodes = 128"), "utf-8")

    def extraction(env: Envelope[Event], state: dict[str, Any]) -> bool:
        extractor_updated = state.setdefault("extractor_updated", False)
        if isinstance(env.event, ExtractorUpdated):
            state["extractor_updated"] = True
        return extractor_updated and isinstance(env.event, ExtractionRequested)

    def for_the_bank(env: Envelope[Event], state: dict[str, Any]) -> bool:
        return "extractor" in state.get("restarted", set()) and isinstance(
            env.event, RetrievalRequested | ExtractorCalled
        )

    plan: Plan = [("extractor", extraction), ("memory", for_the_bank)]
    assembly, outcome, envs, killed = run_killing_in_dir(path, tmp_path / "run", plan)
    kinds = {"extractor": "RemoteExtractorActor", "memory": "RemoteMemoryActor"}
    check_owed(assembly, outcome, envs, killed, kinds, tmp_path / "run", tmp_path / "cache")
    restarted = next(e.seq for e in envs if isinstance(e.event, ActorStarted)
                     and e.event.actor == "extractor" and e.event.attempt == 1)  # fmt: skip
    updated = [e.seq for e in envs if isinstance(e.event, ExtractorUpdated)]
    assert updated[0] < restarted < updated[-1]  # it restarted from a checkpoint and trained on
    # what the lost process had not answered, its next one did (the request of an episode
    # still running at the kill among them)
    assert any(isinstance(e.event, ExtractorCalled) and e.seq > restarted
               and e.cause is not None and e.cause < restarted for e in envs)  # fmt: skip


@pytest.mark.slow  # a learning run: minutes on 2 cores (make test-slow)
@pytest.mark.timeout(900)  # a learning run with models built in three processes
def test_an_empo2_run_with_remote_memory_survives_its_process(
    tmp_path: Path, ray_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory killed as a running episode asks for tips, after the first update: its next
    process folds the bank again from the log and answers that retrieval."""
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    placed = "\n[runtime.ray.memory]\nnum_cpus = 0.5\n"
    path = tmp_path / "empo2.toml"
    path.write_text(EMPO2.replace("[logging]", RAY_METHOD.format(placed=placed)), "utf-8")
    plan: Plan = [("memory", of_a_running_episode(RetrievalRequested))]
    assembly, outcome, envs, killed = run_killing_in_dir(path, tmp_path / "run", plan)
    kinds = {"memory": "RemoteMemoryActor"}
    check_owed(assembly, outcome, envs, killed, kinds, tmp_path / "run", tmp_path / "cache")
    assert any(isinstance(e.event, TipStored) for e in envs)
