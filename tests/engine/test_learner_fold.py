"""The learner actor collects a request's samples where the request stands in the event order,
as re-execution's fold does (``agents.audit.reexecute.UpdateInputs``), not when it gets to train:
it reads its mailbox while its trainee loads and trains, and a turn of the request's episode
folded after the request is not the request's."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import trio
import trio.testing

from agents.events.policy import GradientRequested, PolicyUpdated
from agents.learning.learner import Learner
from agents.learning.trainee_host import Trained
from agents.learning.update import Sample, StepStats, Trainee
from agents.models.tuning import MemoryUse
from agents.testing.events import action_sampled, episode_finished
from engine.actor import Actor, ActorSpec, Context
from engine.eventlog import MemoryEventLog
from engine.events import Envelope, Event
from engine.lifecycle import RunStarted
from engine.runtime import Runtime
from stores.checkpoints import MemoryCheckpoints

STARTED = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=9, coevo_version="0")


class Host:
    """A trainee host that records what each update was given; loading waits for ``released``."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.trained: list[tuple[int, int, list[tuple[str, int]]]] = []

    def open(self) -> None:
        assert self.released.wait(60), "the script never released the host"

    def digest(self) -> str:
        return "d0"

    def restore(self, checkpoint: str, digest: str) -> None:
        raise AssertionError("nothing to restore in a fresh run")

    def update(
        self,
        samples: Sequence[Sample],
        req: GradientRequested,
        seed: int,
        version: int,
        committed: int,
    ) -> Trained:
        self.trained.append((req.update, version, [(s.turn.episode, s.turn.turn) for s in samples]))
        stats = StepStats(len(samples), 0.0, 0.0, 0.0, 0.0, 1.0, 0.0)
        return Trained(stats, MemoryUse(1, 1, 0, None), f"v{version}", f"d{version}", 1)

    def close(self) -> None:
        pass


def request(update: int, episodes: tuple[str, ...]) -> GradientRequested:
    return GradientRequested(
        update=update, episodes=episodes, advantages=(1.0,) * len(episodes), lr=1e-3, minibatch=8
    )


SCRIPT: list[Event] = [
    action_sampled("ep0", 0),
    action_sampled("ep0", 1),
    episode_finished("ep0"),
    request(0, ("ep0",)),
    action_sampled("ep0", 2),  # after the request that names ep0: not its sample
    action_sampled("ep1", 0),
    episode_finished("ep1"),
    request(1, ("ep1",)),
]


class Script(Actor):
    """Emits :data:`SCRIPT`, lets every event reach the learner (the mock clock jumps only when
    every task waits), releases the host, and ends after the last update."""

    subscribes = (PolicyUpdated,)

    def __init__(self, host: Host) -> None:
        self.host = host

    async def run(self, ctx: Context) -> None:
        for ev in SCRIPT:
            await ctx.emit(ev)
        await trio.sleep(1.0)
        self.host.released.set()
        async for env in ctx.events():
            assert isinstance(env.event, PolicyUpdated)
            if env.event.update == 1:
                return


def no_load() -> Trainee:
    raise AssertionError("the host is given: nothing to load")


NO_STORE = MemoryCheckpoints()  # the host writes nothing


def run_learner(host: Host) -> list[Envelope[Event]]:
    specs = [
        ActorSpec(name="script", factory=lambda: Script(host), driver=True),
        ActorSpec(name="learner", factory=lambda: Learner(no_load, NO_STORE, host=host)),
    ]
    log = MemoryEventLog()
    clock = trio.testing.MockClock(autojump_threshold=0)
    trio.run(Runtime(log, STARTED, specs, [], seed=9).run, clock=clock)
    return list(log.read())


def test_a_request_trains_on_the_turns_folded_before_it_while_the_trainee_loads() -> None:
    host = Host()
    envs = run_learner(host)
    assert host.trained == [(0, 1, [("ep0", 0), ("ep0", 1)]), (1, 2, [("ep1", 0)])]
    updates = [e.event for e in envs if isinstance(e.event, PolicyUpdated)]
    assert [(u.update, u.policy_version, u.samples, u.parent_digest) for u in updates] == [
        (0, 1, 2, "d0"),
        (1, 2, 1, "d1"),
    ]
