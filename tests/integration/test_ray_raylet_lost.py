"""The raylet of a run's own Ray instance (``address = "local"``) killed mid-run: the run stops
within seconds with a message that says the cluster has no live node, instead of restarting
each env worker ``max_restarts`` times, each restart waiting ``start_timeout`` for room with a
message that blamed the placement's resources (7 minutes at the defaults).

Its own process with its own Ray instance: killing the session's instance's raylet would end
the other Ray cases. ``start_timeout`` is set to ten minutes, longer than the test allows, so a
run that waits for a placement instead of stopping fails the test.
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
import json, os, signal, sys
from pathlib import Path

import ray

sys.path.insert(0, sys.argv[2])
from ray_backend_cases import MemoryEventLog, PACED, prepare, run, scenario_file

from agents.events.episodes import StepTaken
from agents.testing.processes import children
from engine.lifecycle import ActorFailed, RunFailed

tmp = Path(sys.argv[1])
ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
path = scenario_file(tmp, "ray", world=PACED, options="{ delay_ms = 20 }", episodes=400, workers=2)
path.write_text(path.read_text().replace("num_cpus = 0.25", "num_cpus = 0.25\nstart_timeout = 600"))
raylets = [
    pid for pid in children(os.getpid())
    if b"raylet/raylet" in Path(f"/proc/{pid}/cmdline").read_bytes()
]
steps = []

def watch(batch):
    steps.extend(e for e in batch if isinstance(e.event, StepTaken))
    if len(steps) >= 40 and raylets:
        os.kill(raylets.pop(), signal.SIGKILL)

outcome, envs = run(path, MemoryEventLog(), [watch], prepare(path))
print(json.dumps({
    "outcome": outcome.reason,
    "killed": not raylets,
    "failed": [
        (e.event.error_type, e.event.action) for e in envs if isinstance(e.event, ActorFailed)
    ],
    "final": [e.event.message for e in envs if isinstance(e.event, RunFailed)],
}))
sys.stdout.flush()
os._exit(0)  # Ray's teardown with its raylet gone is not what is tested
"""


@pytest.mark.timeout(400)
def test_a_run_whose_ray_instance_lost_its_raylet_stops_saying_so(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(Path(__file__).parent)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["outcome"] == "failed" and result["killed"]
    failed = [tuple(f) for f in result["failed"]]
    # the running workers are lost (restarted); the first restart finds no node and stops
    first = failed.index(("RemoteClusterLost", "stop"))
    assert set(failed[:first]) == {("RemoteActorLost", "restart")}, failed
    assert "no live node left" in result["final"][0]
