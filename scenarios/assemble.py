"""From a validated scenario to the actors, projections and knobs of a run.

This is the one place that knows which actors a scenario means; the engine runs whatever list
it is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import random
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import structlog

from agents.acting.env_worker import EnvWorker, PromptSettings
from agents.acting.projections import EpisodeTable
from agents.acting.scheduler import Scheduler
from agents.acting.scripted import Agent, Explorer, RandomAgent
from agents.events.memory import ReflectionRequested
from agents.events.policy import ActionRequested, PolicyUpdated
from agents.learning.trainer import GrpoTrainer
from agents.methods.base import Method
from agents.report.curves import report as curves_report
from agents.tracking.observer import Tracker
from agents.tracking.sinks import SINKS, open_sink
from engine import ray_backend, ray_cluster
from engine.actor import ActorSpec
from engine.errors import ScenarioInvalid
from engine.events import Envelope, Event
from engine.invariants import CheckContext, select
from engine.projection import ActorStats, Projection
from engine.remote import RemoteActorLost, RemoteActorRestartable
from engine.replay import FactCheck
from engine.runtime import RuntimeConfig
from engine.world import Task, TextWorld
from scenarios.methods import (
    built_on_empo2,
    checked_method,
    complementary_settings,
    empo2_settings,
    section_path,
)
from scenarios.schema import RayPlacementConfig, Scenario
from scenarios.world_tasks import world_factory, world_tasks
from stores.rundir import paths_under, remove_new

SCHEDULER = "scheduler"
TRAINER = "trainer"
ROLLOUT = "rollout"


@dataclass(frozen=True)
class Assembly:
    """Everything a run needs besides its log.

    Attributes:
        specs: the actors.
        projections: what is folded, checksummed and snapshotted.
        config: the engine knobs.
        tasks: the tasks episodes are drawn from.
        episodes: the episodes the progress bar counts (training episodes of a learning run).
        model: the policy model directory (None without a policy).
        models: every model directory of the run by role (``policy``, ``extractor``): what
            a run records in its metadata and a resume compares.
        report: writes a finished run's reports into its directory from its events and
            returns lines to print (learning curves); None when there is nothing to report.
        tracking: starts the tracker (an observer of the runtime) given a resumed run's
            history; None without ``[tracking] sinks``.
    """

    specs: tuple[ActorSpec, ...]
    projections: tuple[Projection, ...]
    config: RuntimeConfig
    tasks: tuple[Task, ...]
    episodes: int = 0
    model: Path | None = None
    report: Callable[[Path, Iterable[Event]], list[str]] | None = None
    tracking: Callable[[Sequence[Envelope[Event]]], Tracker] | None = None
    models: dict[str, Path] = field(default_factory=dict[str, Path])


def projections() -> tuple[Projection, ...]:
    """The projections every run checksums, snapshots and replays."""
    return (ActorStats(), EpisodeTable())


def fact_checks(
    ctx: CheckContext | None = None, skipped: list[str] | None = None
) -> tuple[FactCheck, ...]:
    """The invariants ``coevo replay --verify`` checks besides the engine's sessions (fresh
    instances): every registered one that applies to ``ctx``'s run (none given: those that
    apply to any run; ``scenarios.checks.check_context`` makes a run's).

    Args:
        skipped: where to note an invariant that cannot be built for the run (``credit``
            when the run's plug-in method does not import), as ``coevo check`` does; None:
            raise.

    Raises:
        ValueError: an invariant cannot be built, and ``skipped`` is None.
    """
    from scenarios.checks import built_for

    ctx = ctx or CheckContext()
    chosen, _ = select(ctx)
    built, _, failed = built_for(ctx, [r for r in chosen if r.name != "sessions"])
    if failed and skipped is None:
        raise failed[0][1]
    if skipped is not None:
        skipped += [
            f"{name}: not checked: cannot be built for this run: {exc}" for name, exc in failed
        ]
    return tuple(built)


def assemble(
    scenario: Scenario,
    source: str,
    *,
    handle_signals: bool = False,
    run_dir: Path | None = None,
    prepare_model: bool = True,
    recorded: Mapping[str, Path] | None = None,
) -> Assembly:
    """Build the run described by ``scenario``.

    Args:
        scenario: the validated scenario.
        source: the scenario's file name (for error messages).
        handle_signals: let SIGINT/SIGTERM stop the run gracefully.
        run_dir: the run directory (checkpoints go to ``run_dir/checkpoints``); None keeps
            checkpoints in memory.
        prepare_model: build (or find in the cache) the embedded model now; False only checks
            the settings (``coevo validate``).
        recorded: a resumed run's embedded models where they still are
            (``scenarios.policy_models.recorded_models``): loaded, not built again.

    Raises:
        ScenarioInvalid: the world cannot be built, a family does not exist, or the settings
            do not fit together.
        ModelUnavailable: the policy model cannot be found or built.
    """
    make_world = world_factory(scenario, source)
    tasks = world_tasks(scenario, scenario.world.split, source, scenario.world.pool)
    workers = [f"worker-{i}" for i in range(scenario.run.workers)]
    config = runtime_config(scenario, handle_signals)
    if scenario.run.method == "rollout" and scenario.agent.kind != "policy":
        specs = [_scheduler(tasks, scenario.run.episodes, workers)]
        specs += _workers(
            scenario, workers, make_world, _agent_factory(scenario.agent.kind), source
        )
        tracking = tracker(scenario, source, run_dir)
        return Assembly(
            tuple(specs), projections(), config, tasks, scenario.run.episodes, tracking=tracking
        )
    _check_learning(scenario, source)
    # built once, before any model is built (a plug-in's errors first)
    method = checked_method(scenario, source) if scenario.run.method != ROLLOUT else None
    from scenarios.policy_setup import policy_actors  # torch and transformers: only here

    specs = _workers(scenario, workers, make_world, None, source)
    _check_model_placements(scenario, source, method is not None and prepare_model, run_dir)
    # every check that needs no model before any model is built (minutes for an embedded one)
    if method is not None:
        # eval.every = 0 plays no round: a world without that split is fine then
        every = scenario.eval.every
        heldout = world_tasks(scenario, scenario.eval.split, source) if every else ()
        trainer = _trainer(scenario, method, tasks, heldout, workers, source)
        episodes = trainer.episodes
        specs.insert(0, ActorSpec(name=TRAINER, factory=lambda: trainer, driver=True))
    else:
        episodes = scenario.run.episodes
        specs.insert(0, _scheduler(tasks, episodes, workers))
    tracking = tracker(scenario, source, run_dir)
    if prepare_model and scenario.runtime.backend != "local":  # names need no model
        _check_placed(scenario, policy_actors(scenario, source, method, None, False)[0], source)
    actors, models = policy_actors(scenario, source, method, run_dir, prepare_model, recorded)
    model = models.get("policy")
    specs += _placed_models(scenario, actors, source)
    names = [spec.name for spec in specs]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:  # a plug-in's actor named as another (the trainer, a worker, its own twice)
        raise ScenarioInvalid(source, f"$.run.method: two actors are named {clashes}")
    title = f"{scenario.name} (seed {scenario.seed})"
    report = partial(curves_report, title=title) if scenario.run.method != ROLLOUT else None
    return Assembly(
        tuple(specs), projections(), config, tasks, episodes, model, report, tracking, models
    )


TRACKING_DIR = "tracking"
"""The sinks' directory inside a run directory: one folder per sink, named after it
(``mlflow``'s is ``mlruns``)."""


def sink_dir(root: Path, sink: str) -> Path:
    """Where sink ``sink`` of the run at ``root`` writes."""
    return root / TRACKING_DIR / ("mlruns" if sink == "mlflow" else sink)


def tracker(
    scenario: Scenario, source: str, run_dir: Path | None
) -> Callable[[Sequence[Envelope[Event]]], Tracker] | None:
    """What starts the run's tracker, given a resumed run's history, when ``[tracking] sinks``
    names any (None without a run directory: ``coevo validate`` only checks that each sink's
    library is installed).

    Raises:
        ScenarioInvalid: a sink is named twice, or its library is not installed.
    """
    names = tuple(scenario.tracking.sinks)
    if len(set(names)) != len(names):
        raise ScenarioInvalid(source, f"$.tracking.sinks: a sink is named twice: {list(names)}")
    for name in names:
        module, extra = SINKS[name]
        if importlib.util.find_spec(module) is None:
            raise ScenarioInvalid(
                source,
                f"$.tracking.sinks: {name!r} needs the {module} package "
                f"(pip install 'coevo[{extra}]')",
            )
    if not names or run_dir is None:
        return None
    root = run_dir
    config: dict[str, Any] = msgspec.to_builtins(scenario)
    block = scenario.tracking.block

    def start(history: Sequence[Envelope[Event]]) -> Tracker:
        # every session continues what an earlier one left in the sinks' directories (a new
        # run's are empty): a session killed before its first event was committed left an
        # MLflow run and a W&B run all the same, and a resume with no history to fold opened
        # second ones beside them, the first "running" for good
        made = paths_under(root / "tracking")
        sinks: list[Any] = []
        try:
            for name in names:
                where = sink_dir(root, name)
                sinks.append(open_sink(name, where, root.name, config, continues=True))
        except BaseException:  # one cannot start: what the others began is taken back, so
            for sink in sinks:  # that nothing was written is true (a stray W&B run synced)
                with contextlib.suppress(Exception):
                    sink.close()
            remove_new(root / "tracking", made)
            raise
        return Tracker(sinks, block, history)

    return start


def _scheduler(tasks: tuple[Task, ...], episodes: int, workers: list[str]) -> ActorSpec:
    return ActorSpec(
        name=SCHEDULER,
        factory=partial(Scheduler, tasks, episodes, workers),
        on_failure="stop",
        driver=True,
    )


def _workers(
    scenario: Scenario,
    workers: list[str],
    make_world: Callable[[], TextWorld],
    make_agent: Callable[[random.Random], Agent] | None,
    source: str,
) -> list[ActorSpec]:
    prompt = PromptSettings(
        window=scenario.policy.window,
        list_actions=scenario.policy.list_actions or scenario.policy.mode == "generate",
        greedy_eval=scenario.eval.greedy,
        system=scenario.prompt.system,
        memory=scenario.prompt.memory,
        reflect=scenario.prompt.reflect,
        extract=scenario.prompt.extract,
        max_ops=complementary_settings(scenario).max_ops,
    )
    timeout = scenario.world.call_limit
    specs = [
        ActorSpec(
            name=name,
            factory=partial(
                EnvWorker, make_world, make_agent, prompt, timeout, scenario.world.max_turns
            ),
            on_failure=scenario.runtime.on_failure,
            max_restarts=scenario.runtime.max_restarts,
            accepts=partial(_addressed_to, name),
        )
        for name in workers
    ]
    return _placed(scenario, specs, source)


def _placed(scenario: Scenario, specs: list[ActorSpec], source: str) -> list[ActorSpec]:
    """The env workers' specs as the scenario's backend runs them: as they are, or each a
    proxy of an actor on Ray (``engine.ray_backend``), ``per_process`` to a Ray process."""
    rt = scenario.runtime
    if rt.backend == "local":
        return specs
    _need_ray(source)
    placement = _placement(rt.ray.env_workers)
    return ray_backend.remote_specs(specs, placement, mailbox=rt.mailbox)


def _check_model_placements(
    scenario: Scenario, source: str, learns: bool, run_dir: Path | None
) -> None:
    """Refuse, before any model is built, a learning run whose remote inference actor,
    learner or extractor, or whose learner in a process of its own, could not share the
    checkpoints (kept in memory: no run directory); a scenario placing any of them (or the
    memory) on Ray needs Ray.

    Raises:
        ScenarioInvalid: as above.
    """
    from agents.methods.actors import MEMORY

    if learns and run_dir is None and scenario.policy.learner_threads:
        raise ScenarioInvalid(
            source,
            "$.policy.learner_threads: a learner in a process of its own needs a run "
            "directory (it writes its checkpoints there, inference reads them)",
        )
    rt = scenario.runtime
    if rt.backend == "local":
        return
    for kind, placed in _model_placements(scenario).items():
        if placed is None:
            continue
        _need_ray(source)
        if learns and run_dir is None and kind != MEMORY:
            raise ScenarioInvalid(
                source,
                f"$.runtime.ray.{kind}: a learning run with a remote {kind} needs a run "
                "directory (the learner and the extractor write their checkpoints there, "
                "inference reads the learner's)",
            )


def _model_placements(scenario: Scenario) -> dict[str, RayPlacementConfig | None]:
    """The placements ``[runtime.ray]`` gives the policy's and the method's actors, by the
    actors' names (each also the name of its ``[runtime.ray]`` table)."""
    from agents.methods.actors import EXTRACTOR, MEMORY
    from scenarios.policy_setup import INFERENCE, LEARNER

    ray = scenario.runtime.ray
    return {
        INFERENCE: ray.inference,
        LEARNER: ray.learner,
        EXTRACTOR: ray.extractor,
        MEMORY: ray.memory,
    }


def _check_placed(scenario: Scenario, specs: list[ActorSpec], source: str) -> None:
    """Refuse a ``[runtime.ray]`` placement of an actor the run does not have (an extractor
    for a method without one)."""
    if scenario.runtime.backend == "local":
        return
    names = {spec.name for spec in specs}
    for kind, config in _model_placements(scenario).items():
        if config is not None and kind not in names:
            raise ScenarioInvalid(
                source,
                f"$.runtime.ray.{kind}: run.method = {scenario.run.method!r} has no {kind} "
                f"actor to place (it has: {', '.join(sorted(names))})",
            )


def _placed_models(scenario: Scenario, specs: list[ActorSpec], source: str) -> list[ActorSpec]:
    """The policy's and the method's actors, each on Ray where ``[runtime.ray]`` places it
    (inference, learner, extractor, memory). A lost process restarts them
    (``runtime.on_failure``, ``max_restarts``); their code raising does what it does in the
    driver (a learner whose training process of its own was lost restarts, any other error
    stops the run). The next inference process is given the newest ``PolicyUpdated`` first, so
    that it serves the newest version the log names, then what was not answered; the next
    learner, extractor or memory is rebuilt from the log committed so far
    (``ActorSpec.recover_on_restart``): the learner and the extractor load the newest
    checkpoint the log names with its optimiser and redo the updates the log does not hold,
    the memory folds its bank again; both answer what the log does not answer, the requests
    of episodes still running included.

    Raises:
        ScenarioInvalid: ``[runtime.ray]`` places an actor the run does not have (an
            extractor for a method without one).
    """
    from scenarios.policy_setup import INFERENCE  # imported already (policy_actors)

    rt = scenario.runtime
    if rt.backend == "local":
        return specs
    placed = _model_placements(scenario)
    _check_placed(scenario, specs, source)
    out: list[ActorSpec] = []
    for spec in specs:
        config = placed.get(spec.name)
        if config is not None:
            # inference rebuilds nothing from the log when restarted: what it had taken (a
            # batch, two in flight) and not answered is given to its next process
            inference = spec.name == INFERENCE
            remote = ray_backend.remote_spec(
                spec,
                _placement(config),
                mailbox=rt.mailbox,
                sticky=(PolicyUpdated,) if inference else (),
                answers=(ActionRequested, ReflectionRequested) if inference else (),
            )
            spec = dataclasses.replace(
                remote,
                on_failure=rt.on_failure,
                max_restarts=rt.max_restarts,
                restart_for=(RemoteActorLost, RemoteActorRestartable),
                recover_on_restart=spec.name != INFERENCE,
            )
        out.append(spec)
    return out


def _need_ray(source: str) -> None:
    if not ray_backend.available():
        raise ScenarioInvalid(
            source,
            "$.runtime.backend: \"ray\" needs Ray installed: pip install 'coevo[ray]' (in a "
            "checkout: pip install -e '.[ray]')",
        )


def _placement(p: RayPlacementConfig) -> ray_backend.Placement:
    return ray_backend.Placement(
        num_cpus=p.num_cpus,
        num_gpus=p.num_gpus,
        resources=dict(p.resources),
        in_flight=p.in_flight,
        start_timeout=p.start_timeout,
        per_process=p.per_process,
        stall_timeout=p.stall_timeout,
    )


@contextlib.contextmanager
def cluster(scenario: Scenario, source: str = "scenario") -> Generator[None]:
    """The Ray cluster a ``backend = "ray"`` scenario's run needs, joined (or started) for the
    block; nothing for a local one. A placement that no node of the cluster can hold (a GPU
    asked of a machine without one, more CPUs for a process than a node has, a custom
    resource no node offers) is refused at once on a Ray instance the run starts itself
    (``address = "local"``), whose nodes are all there is; on a cluster it joins (which an
    autoscaler may grow) it is logged as a warning, and the actors wait ``start_timeout`` for
    a node. So are placements that each fit a node but not all together (8 env workers of one
    CPU each on a 2-CPU instance: six of them waited ``start_timeout``, restarted, and failed
    the run after ``max_restarts``).

    Raises:
        ScenarioInvalid: as above, naming the placement and what it lacks.
    """
    rt = scenario.runtime
    if rt.backend == "local":
        yield
        return
    with ray_cluster.connected(rt.ray.address, rt.ray.num_cpus or None):
        placements = _placements(scenario)
        lacks = [
            (
                f"$.runtime.ray.{key}",
                "no node of the cluster can host a placement yet",
                ray_cluster.unplaceable(placement, size),
            )
            for key, placement, size, _ in placements
        ]
        together = [(placement, actors) for _, placement, _, actors in placements]
        lacks.append(
            (
                "$.runtime.ray",
                "the cluster cannot host all of the run's placements at once yet",
                ray_cluster.short_together(together),
            )
        )
        for where, warning, lacking in lacks:
            if not lacking:
                continue
            if rt.ray.address == "local":
                raise ScenarioInvalid(
                    source,
                    f"{where}: {lacking} (the Ray instance started for the run offers this "
                    "machine's CPUs, or runtime.ray.num_cpus of them, its GPUs and no custom "
                    "resource: ask for less, or join a cluster that has them with "
                    "runtime.ray.address)",
                )
            structlog.get_logger("coevo").warning(warning, placement=f"{where}: {lacking}")
            break  # one warning: the actors wait start_timeout for nodes
        yield


def _placements(scenario: Scenario) -> list[tuple[str, ray_backend.Placement, int, int]]:
    """Each ``[runtime.ray]`` placement of the run's actors, with how many actors its largest
    Ray process hosts and how many it places in all."""
    ray = scenario.runtime.ray
    workers = scenario.run.workers
    largest = min(ray.env_workers.per_process, workers)
    out = [("env_workers", _placement(ray.env_workers), largest, workers)] if workers else []
    models = _model_placements(scenario).items()
    out += [(k, _placement(p), 1, 1) for k, p in models if p is not None]
    return out


def _check_learning(scenario: Scenario, source: str) -> None:
    if scenario.agent.kind != "policy":
        raise ScenarioInvalid(
            source,
            f'$.agent.kind: run.method = {scenario.run.method!r} needs kind = "policy", '
            f"got {scenario.agent.kind!r}",
        )
    e = empo2_settings(scenario)
    on_empo2 = scenario.run.method == "empo2" or built_on_empo2(scenario)
    if on_empo2 and e.low_prob_mask and scenario.policy.mode == "score":
        raise ScenarioInvalid(
            source,
            f"{section_path(scenario, 'empo2')}.low_prob_mask: needs policy.mode = "
            '"generate" (it thresholds the log-probs of sampled tokens; a "score" '
            "action's log-prob is over the admissible actions and falls below low_prob_delta "
            "when there are many)",
        )


def _trainer(
    scenario: Scenario,
    method: Method,
    tasks: tuple[Task, ...],
    heldout: tuple[Task, ...],
    workers: list[str],
    source: str,
) -> GrpoTrainer:
    try:
        return GrpoTrainer(
            tasks,
            heldout,
            scenario.run.episodes,
            workers,
            scenario.grpo,
            scenario.eval,
            method,
        )
    except ValueError as exc:  # its message names the key: the eval table's, or the run's
        key = "$.eval" if str(exc).startswith("eval.") else "$.run"
        raise ScenarioInvalid(source, f"{key}: {exc}") from None


def runtime_config(scenario: Scenario, handle_signals: bool = False) -> RuntimeConfig:
    """The engine knobs of ``scenario``."""
    rt = scenario.runtime
    return RuntimeConfig(
        batch_max=rt.batch_max,
        batch_wait=rt.batch_wait_ms / 1000.0,
        write_buffer=rt.write_buffer,
        write_buffer_bytes=round(rt.write_buffer_mb * 2**20),
        mailbox=rt.mailbox,
        checksum_every=rt.checksum_every,
        snapshot_every=rt.snapshot_every,
        checksum_budget=rt.checksum_budget,
        snapshot_budget=rt.snapshot_budget,
        handle_signals=handle_signals,
    )


def _addressed_to(worker: str, ev: Event) -> bool:
    return getattr(ev, "worker", None) == worker


def _agent_factory(kind: str) -> Callable[[random.Random], Agent] | None:
    if kind == "random":
        return RandomAgent
    if kind == "explorer":
        return Explorer
    if kind == "policy":
        return None
    raise ValueError(f"unknown agent kind {kind!r}")
