"""Env workers on a two-node Ray cluster on this machine (Ray's ``ray.cluster_utils.Cluster``),
the node running them removed mid-run and another one added: the run completes, the attempts the
workers had begun are abandoned with the reason, the workers restart on the new node and run
those episodes again, and every episode finishes once and is the one a local run plays.

Its own process (a cluster cannot share the session's Ray instance), marked slow: starting three
Ray nodes on 2 cores takes tens of seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, threading
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

sys.path.insert(0, sys.argv[2])
from ray_backend_cases import MemoryEventLog, episodes, prepare, run, scenario_file

from agents.events.episodes import EpisodeAbandoned, EpisodeFinished, StepTaken
from engine.lifecycle import ActorFailed, ActorStarted

tmp = Path(sys.argv[1])
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
first = cluster.add_node(num_cpus=2, resources={"env": 2})
cluster.wait_for_nodes()
ray.init(address=cluster.address, log_to_driver=False)
paced = scenario_file(
    tmp, "ray", world="scenarios.worlds.paced:PacedLab", options="{ delay_ms = 20 }",
    episodes=12, workers=2,
)
text = paced.read_text().replace("num_cpus = 0.25", "num_cpus = 0.5\nresources = { env = 1 }")
paced.write_text(text)
assembly = prepare(paced)
steps = []
swapped = threading.Event()

def watch(batch):
    # on the driver's event loop, which it holds for the seconds a node takes to start (Ray's
    # Cluster starts nodes from the main thread only)
    steps.extend(e for e in batch if isinstance(e.event, StepTaken))
    if len(steps) >= 40 and not swapped.is_set():
        cluster.remove_node(first)  # the node both workers run on
        cluster.add_node(num_cpus=2, resources={"env": 2})
        swapped.set()

outcome, envs = run(paced, MemoryEventLog(), [watch], assembly)
local = scenario_file(
    tmp, "local", world="scenarios.worlds.paced:PacedLab", options="{ delay_ms = 0 }",
    episodes=12, workers=2,
)
expected = episodes(run(local, MemoryEventLog())[1])
abandoned = [e.event for e in envs if isinstance(e.event, EpisodeAbandoned)]
print(json.dumps({
    "outcome": outcome.reason,
    "swapped": swapped.is_set(),
    "failed": sorted(
        (e.event.actor, e.event.error_type) for e in envs if isinstance(e.event, ActorFailed)
    ),
    "abandoned": [(a.episode, a.reason) for a in abandoned],
    "finished": sorted(e.event.episode for e in envs if isinstance(e.event, EpisodeFinished)),
    "restarted_remote": sorted(
        (e.event.actor, e.event.attempt) for e in envs
        if isinstance(e.event, ActorStarted) and e.event.actor_type == "RemoteEnvWorker"
    ),
    "same_as_local": episodes(envs) == expected,
}))
ray.shutdown()
cluster.shutdown()
"""


@pytest.mark.slow
def test_a_node_lost_mid_run_reruns_its_episodes_and_the_workers_move(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(Path(__file__).parent)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["outcome"] == "completed" and result["swapped"]
    assert result["failed"] == [["worker-0", "RemoteActorLost"], ["worker-1", "RemoteActorLost"]]
    assert 1 <= len(result["abandoned"]) <= 2
    assert all(r.startswith("worker restarted (RemoteActorLost: ") for _, r in result["abandoned"])
    assert result["finished"] == [f"ep{i:06d}" for i in range(12)]  # each once
    assert result["restarted_remote"] == [
        ["worker-0", 0],
        ["worker-0", 1],
        ["worker-1", 0],
        ["worker-1", 1],
    ]
    assert result["same_as_local"]
