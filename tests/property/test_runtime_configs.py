"""The real runtime on the LMDB log under generated ``RuntimeConfig`` values (batch caps and
lingering, write buffer and mailbox sizes, checksum and snapshot cadences, the switch interval)
and both durabilities: the log verifies (every checksum and snapshot in it equals the replay's
fold at its seq, no fact twice), each stored snapshot is the fold's state at its seq, replay to
the end equals the run's own final states, and what the run did (every episode, turn by turn)
is what it does under the default configuration."""

from __future__ import annotations

import tempfile
from collections import Counter
from functools import partial
from pathlib import Path

import msgspec
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.acting.env_worker import EnvWorker
from agents.acting.scheduler import Scheduler
from agents.acting.scripted import Explorer
from engine.actor import ActorSpec
from engine.eventlog import new_run_meta
from engine.events import Envelope, Event
from engine.lifecycle import ProjectionChecked, RunStarted, RunStopped, SnapshotTaken
from engine.projection import Fold, decode_state, encode_state
from engine.replay import replay_until, verify_log
from engine.runtime import Runtime, RuntimeConfig
from scenarios.assemble import fact_checks, projections
from scenarios.worlds.minilab import MiniLab
from stores.lmdb_log import LmdbEventLog

SEED = 13
EPISODES = 12
WORKERS = ("w0", "w1", "w2")
STARTED = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=SEED, coevo_version="0")
META = new_run_meta("r", scenario_name="t", seed=SEED, coevo_version="0")


def make_world() -> MiniLab:
    return MiniLab(families=("heat", "unlock"), train_variants=4, heldout_variants=1, max_steps=8)


def specs() -> list[ActorSpec]:
    tasks = [t for f in ("heat", "unlock") for t in make_world().tasks(f, "train")]
    return [
        ActorSpec(
            name="scheduler", factory=partial(Scheduler, tasks, EPISODES, WORKERS), driver=True
        ),
        *(
            ActorSpec(
                name=name,
                factory=partial(EnvWorker, make_world, Explorer),
                accepts=lambda ev, name=name: getattr(ev, "worker", None) == name,
            )
            for name in WORKERS
        ),
    ]


def run(path: Path, config: RuntimeConfig, durable: bool) -> tuple[list[Envelope[Event]], Fold]:
    """A run into a new log at ``path``: its events and the runtime's own final fold."""
    log = LmdbEventLog.create(path, META, durable=durable, map_size=64 * 1024)
    runtime = Runtime(log, STARTED, specs(), projections(), seed=SEED, config=config)
    try:
        outcome = trio.run(runtime.run)
        assert outcome.reason == "completed" and outcome.exit_code == 0
        assert outcome.events == log.next_seq
    finally:
        log.close()
    return read(path), Fold(projections(), runtime.states)


def read(path: Path) -> list[Envelope[Event]]:
    with LmdbEventLog.open(path) as log:
        return list(log.read())


def what_it_did(envs: list[Envelope[Event]]) -> Counter[bytes]:
    """The run's own events (not the runtime's), without the worker that ran each episode."""
    out: Counter[bytes] = Counter()
    for env in envs:
        if env.actor == "runtime":
            continue
        body = msgspec.to_builtins(env.event)
        body.pop("worker", None)
        out[msgspec.json.encode(body, order="deterministic")] += 1
    return out


REFERENCE: list[Counter[bytes]] = []


def reference() -> Counter[bytes]:
    """What the run does under the default configuration (run once)."""
    if not REFERENCE:
        with tempfile.TemporaryDirectory() as tmp:
            envs, _ = run(Path(tmp) / "log", RuntimeConfig(), durable=True)
        REFERENCE.append(what_it_did(envs))
    return REFERENCE[0]


configs = st.builds(
    RuntimeConfig,
    batch_max=st.integers(1, 64),
    batch_wait=st.sampled_from([0.0, 0.0005]),
    write_buffer=st.integers(1, 64),
    mailbox=st.integers(1, 8),
    checksum_every=st.integers(0, 60),
    snapshot_every=st.sampled_from([0, 1, 2, 7, 25, 100]),
    checksum_budget=st.sampled_from([0, 1, 256]),
    snapshot_budget=st.sampled_from([0, 1, 32]),
    switch_interval=st.sampled_from([0.0, 0.001]),
)


@settings(max_examples=25, deadline=None)
@given(config=configs, durable=st.booleans())
def test_any_runtime_config_gives_a_log_that_verifies_and_replays_to_the_live_states(
    config: RuntimeConfig, durable: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log"
        envs, live = run(path, config, durable)
        assert [e.seq for e in envs] == list(range(len(envs)))
        assert isinstance(envs[0].event, RunStarted)
        assert isinstance(envs[-1].event, RunStopped) and envs[-1].event.reason == "completed"
        assert isinstance(envs[-2].event, ProjectionChecked)  # the final checksum
        recorded = [e for e in envs if isinstance(e.event, ProjectionChecked | SnapshotTaken)]
        if config.checksum_every and not config.checksum_budget:  # a budget may space them
            body = sum(not isinstance(e.event, ProjectionChecked | SnapshotTaken) for e in envs)
            assert len(recorded) >= (body - 2) // config.checksum_every
        snapshots = [e for e in envs if isinstance(e.event, SnapshotTaken)]
        if (
            config.snapshot_every
            and not config.snapshot_budget
            and len(envs) > 2 * config.snapshot_every + 4
        ):
            assert snapshots
        with LmdbEventLog.open(path) as log:
            result = verify_log(log, projections(), fact_checks())
            assert result.ok, result.error
            assert result.checks == len(recorded)
            replayed, _ = replay_until(log, projections())
            assert replayed.digests() == live.digests()
            for snap in snapshots:  # each stored state is the fold's at its seq
                assert isinstance(snap.event, SnapshotTaken)
                upto = snap.event.upto
                fold = Fold(projections())
                fold.apply_all(envs[: upto + 1])
                for p in projections():
                    stored = log.get_snapshot(p.name, upto)
                    assert stored is not None and stored[0] == upto
                    state = decode_state(p, stored[1])
                    assert encode_state(state) == encode_state(fold.states[p.name])
    assert what_it_did(envs) == reference()
