"""From a validated scenario to the actors, projections and knobs of a run.

This is the one place that knows which actors a scenario means; the engine runs whatever list
it is given.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from agents.env_worker import EnvWorker
from agents.projections import EpisodeTable
from agents.scheduler import Scheduler
from agents.scripted import Agent, Explorer, RandomAgent
from engine.actor import ActorSpec
from engine.errors import ScenarioInvalid
from engine.events import Event
from engine.projection import ActorStats, Projection
from engine.runtime import RuntimeConfig
from scenarios.schema import Scenario
from scenarios.worlds.base import Task, TextWorld
from scenarios.worlds.registry import load_world

SCHEDULER = "scheduler"


@dataclass(frozen=True)
class Assembly:
    """Everything a run needs besides its log."""

    specs: tuple[ActorSpec, ...]
    projections: tuple[Projection, ...]
    config: RuntimeConfig
    tasks: tuple[Task, ...]


def projections() -> tuple[Projection, ...]:
    """The projections every run checksums, snapshots and replays."""
    return (ActorStats(), EpisodeTable())


def assemble(
    scenario: Scenario,
    source: str,
    *,
    handle_signals: bool = False,
) -> Assembly:
    """Build the run described by ``scenario``.

    Args:
        scenario: the validated scenario.
        source: the scenario's file name (for error messages).
        handle_signals: let SIGINT/SIGTERM stop the run gracefully.

    Raises:
        ScenarioInvalid: the world cannot be built or a family does not exist.
    """
    make_world = partial(_make_world, scenario.world.name, dict(scenario.world.options), source)
    tasks = _tasks(make_world(), scenario, source)
    workers = [f"worker-{i}" for i in range(scenario.run.workers)]
    specs: list[ActorSpec] = [
        ActorSpec(
            name=SCHEDULER,
            factory=partial(Scheduler, tasks, scenario.run.episodes, workers),
            on_failure="stop",
            driver=True,
        )
    ]
    make_agent = _agent_factory(scenario.agent.kind)
    for name in workers:
        specs.append(
            ActorSpec(
                name=name,
                factory=partial(EnvWorker, make_world, make_agent),
                on_failure=scenario.runtime.on_failure,
                max_restarts=scenario.runtime.max_restarts,
                accepts=partial(_addressed_to, name),
            )
        )
    return Assembly(tuple(specs), projections(), runtime_config(scenario, handle_signals), tasks)


def runtime_config(scenario: Scenario, handle_signals: bool = False) -> RuntimeConfig:
    """The engine knobs of ``scenario``."""
    rt = scenario.runtime
    return RuntimeConfig(
        batch_max=rt.batch_max,
        batch_wait=rt.batch_wait_ms / 1000.0,
        write_buffer=rt.write_buffer,
        mailbox=rt.mailbox,
        checksum_every=rt.checksum_every,
        snapshot_every=rt.snapshot_every,
        handle_signals=handle_signals,
    )


def _addressed_to(worker: str, ev: Event) -> bool:
    return getattr(ev, "worker", None) == worker


def _make_world(name: str, options: dict[str, Any], source: str) -> TextWorld:
    try:
        return load_world(name, options)
    except ValueError as exc:
        raise ScenarioInvalid(source, f"$.world: {exc}") from None


def _tasks(world: TextWorld, scenario: Scenario, source: str) -> tuple[Task, ...]:
    try:
        return _list_tasks(world, scenario, source)
    except ScenarioInvalid:
        raise
    except Exception as exc:  # a plug-in world failing to list its tasks
        raise ScenarioInvalid(
            source, f"$.world: {world.name} could not list tasks: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        world.close()


def _list_tasks(world: TextWorld, scenario: Scenario, source: str) -> tuple[Task, ...]:
    offered = world.families()
    families = scenario.world.families or list(offered)
    unknown = [f for f in families if f not in offered]
    if unknown:
        raise ScenarioInvalid(
            source, f"$.world.families: unknown {unknown}; {world.name} offers {list(offered)}"
        )
    tasks = [t for fam in families for t in world.tasks(fam, scenario.world.split)]
    if not tasks:
        raise ScenarioInvalid(source, f"$.world: no {scenario.world.split} tasks in {families}")
    return tuple(tasks)


def _agent_factory(kind: str) -> Callable[[random.Random], Agent]:
    if kind == "random":
        return RandomAgent
    if kind == "explorer":
        return Explorer
    raise ValueError(f"unknown agent kind {kind!r}")
