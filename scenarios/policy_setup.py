"""The policy side of assembly: the inference actor, the method's actors and the learner, and
the loaders they call at start. What is checked before a run is in :mod:`scenarios.policy_checks`,
where the model directories come from in :mod:`scenarios.policy_models`.

Kept apart from :mod:`scenarios.assemble`, and importing torch and transformers (seconds) only
where a model is built or loaded: the actors' factories import their modules when the run
starts them, so checking a scenario (``coevo validate``) imports neither.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from agents.learning.trainee_host import LearnerProcessLost, TraineeProcess
from agents.methods.base import LoadedModel, Method, RunResources, base_models, method_actors
from agents.models.backend import backend_named
from agents.models.tuning import LoraSettings, lora_seed, prepare
from engine.actor import Actor, ActorSpec
from engine.errors import ModelUnavailable, ScenarioInvalid
from scenarios.loader import stored_scenario, stored_source
from scenarios.methods import checked_method, complementary_settings, empo2_settings
from scenarios.policy_checks import (
    ROLLOUT,
    check_lora_targets,
    check_policy_model,
    check_rooms,
    check_temperatures,
    check_training,
)
from scenarios.policy_models import (
    base_model_dir,
    extractor_model_dir,
    policy_model_dir,
    recorded_models,
)
from scenarios.schema import Scenario
from stores.checkpoints import (
    Checkpoints,
    DirCheckpoints,
    MemoryCheckpoints,
    check_device,
    resolve_device,
)
from stores.model_dirs import load_model_dir

if TYPE_CHECKING:
    from agents.acting.inference import PolicyRunner
    from agents.audit.reexecute import Reexecution
    from agents.learning.update import Trainee
    from agents.memory.extractor import ExtractorModel
    from engine.eventlog import RunMeta

INFERENCE = "inference"
LEARNER = "learner"


def policy_actors(
    scenario: Scenario,
    source: str,
    method: Method | None,
    run_dir: Path | None,
    prepare_model: bool,
    recorded: Mapping[str, Path] | None = None,
) -> tuple[list[ActorSpec], dict[str, Path]]:
    """The inference actor, and for a learning method its own actors and the learner; the
    model directories by role (``policy``, and the method's base models: ``extractor``).

    Args:
        scenario: the validated scenario.
        source: its file name (for error messages).
        method: its learning method (None: a rollout, which trains nothing).
        run_dir: the run directory (checkpoints go there); None keeps them in memory.
        prepare_model: build (or find in the cache) the embedded model and the method's base
            models, and set torch's threads; False only checks the settings and model
            directories (``coevo validate``) and returns no model directory.
        recorded: an existing run's embedded models, where they still are
            (:func:`recorded_models`): loaded instead of built.

    Raises:
        ScenarioInvalid: ``policy.embedded`` or the method's base-model settings are invalid.
        ModelUnavailable: a model directory holds no usable model, or a model cannot be built.
    """
    early = _early_learner(scenario, method, prepare_model)
    try:  # the device exists: refused now, not by the first actor that loads a model
        check_device(scenario.policy.device)
    except ModelUnavailable as exc:
        raise ScenarioInvalid(source, f"$.policy.device: {exc}") from None
    if scenario.policy.threads and prepare_model:
        import torch

        torch.set_num_threads(scenario.policy.threads)  # process-wide: inference and learner
    roles = _roles(method, source) if method else ()
    check_training(scenario, source, roles)
    check_temperatures(scenario, source, method, roles)
    # the base models' settings (and local paths) are checked before anything is built
    bases = {role: base_model_dir(scenario, source, role, None) for role in roles}
    check_rooms(scenario, source, method, "extractor" in roles)
    check_lora_targets(scenario, source, "extractor" in roles)
    model = policy_model_dir(scenario, source, recorded) if prepare_model else None
    if not prepare_model:
        check_policy_model(scenario, source)
    elif model is not None:
        bases = {role: base_model_dir(scenario, source, role, model, recorded) for role in roles}
    run = RunResources(
        device=scenario.policy.device,
        batch_max=scenario.policy.batch_max,
        batch_wait=scenario.policy.batch_wait_ms / 1000.0,
        checkpoints=partial(_store, run_dir, scenario.grpo.keep_checkpoints),
        base_model=partial(_base, {"policy": model, **bases}),
        load_model=partial(_load_base, scenario, {"policy": model, **bases}),
        prompts=msgspec.structs.asdict(scenario.prompt),
    )
    dirs = {role: path for role, path in {"policy": model, **bases}.items() if path is not None}
    return _policy_actors(scenario, method, model, run, early, source), dirs


def _roles(method: Method, source: str) -> tuple[str, ...]:
    try:
        return base_models(method)
    except ValueError as exc:
        raise ScenarioInvalid(source, f"$.run.method: {exc}") from None


def _store(run_dir: Path | None, keep: int, name: str) -> Checkpoints:
    """The checkpoint store ``name``: the directory ``run_dir/name``, or memory for a run
    without a directory."""
    return DirCheckpoints(run_dir / name, keep=keep) if run_dir else MemoryCheckpoints()


def _load_base(scenario: Scenario, dirs: dict[str, Path | None], role: str) -> LoadedModel:
    return load_base_for(scenario, _base(dirs, role), role)


def load_base_for(scenario: Scenario, model: Path | None, role: str) -> LoadedModel:
    """A base model as the scenario loads it for ``role`` (blocking): on its device, with its
    dtype, activation checkpointing and LoRA adapters (the policy's ``[policy] lora``, the
    extractor's ``[complementary] lora``), and its inference backend."""
    assert model is not None, "the base models are prepared before the run starts"
    device = resolve_device(scenario.policy.device)
    net, tokenizer = load_model_dir(model, device)
    from agents.models.policy import output_fault

    fault = output_fault(net, device)
    if fault is not None:
        raise ModelUnavailable(f"{model}: the {role}'s model: {fault}")
    lora = complementary_settings(scenario).lora if role == "extractor" else scenario.policy.lora
    net = _prepared(scenario, net, lora, role)
    backend = backend_named(scenario.policy.backend)(net, device)
    return LoadedModel(net=net, tokenizer=tokenizer, device=device, backend=backend)


def _prepared(scenario: Scenario, net: Any, lora: LoraSettings, name: str) -> Any:
    """A loaded model with the scenario's dtype, checkpointing and LoRA (``name``'s seed)."""
    p = scenario.policy
    return prepare(
        net,
        lora=lora.used(),
        dtype=p.dtype,
        checkpointing=p.gradient_checkpointing,
        seed=lora_seed(scenario.seed, name),
    )


def _base(dirs: dict[str, Path | None], role: str) -> Path | None:
    if role not in dirs:
        raise KeyError(f"no base model {role!r} was prepared (prepared: {sorted(dirs)})")
    return dirs[role]


def _early_learner(
    scenario: Scenario, method: Method | None, prepare_model: bool
) -> TraineeProcess | None:
    """With ``[policy] learner_threads``, the learner's process launched now (for a run whose
    learner trains in this process's runtime, not on Ray), so that it imports torch and
    transformers on another core while this process does the same and prepares the run (the
    imports take ~3 s of CPU, which would otherwise delay the first update); None otherwise.
    Dropped unused (assembly failed), it is stopped when collected."""
    threads = scenario.policy.learner_threads
    remote = scenario.runtime.backend != "local" and scenario.runtime.ray.learner is not None
    if not (threads and prepare_model and method is not None and not remote):
        return None
    process = TraineeProcess(threads, scenario.policy.learner_stall_timeout)
    process.launch()
    return process


def _policy_actors(
    scenario: Scenario,
    method: Method | None,
    model: Path | None,
    run: RunResources,
    early: TraineeProcess | None,
    source: str,
) -> list[ActorSpec]:
    checkpoints = run.checkpoints("checkpoints")
    load_runner = partial(load_runner_for, scenario, model)
    inference = partial(
        _inference,
        load_runner,
        checkpoints,
        run.batch_max,
        run.batch_wait,
        scenario.policy.batches_in_flight,
    )
    specs = [ActorSpec(name=INFERENCE, factory=inference)]
    if method is not None:
        try:
            specs += method_actors(method, run)
        except ValueError as exc:
            raise ScenarioInvalid(source, f"$.run.method: {exc}") from None
        load_trainee = partial(load_trainee_for, scenario, model)
        threads = scenario.policy.learner_threads or None
        learner = _LearnerFactory(
            load_trainee, checkpoints, threads, early, scenario.policy.learner_stall_timeout
        )
        specs.append(_learner_spec(scenario, learner, threads))
    return specs


def _learner_spec(
    scenario: Scenario, factory: Callable[[], Actor], threads: int | None
) -> ActorSpec:
    """The learner's spec. Its code raising stops the run; with a process of its own, the loss
    of that process (killed: out of memory, a signal) restarts it as ``[runtime] on_failure``
    and ``max_restarts`` say, rebuilt from the log committed so far: a new process loads the
    newest checkpoint the log names and redoes the updates the log does not hold (placed on
    Ray, the same: its host there judges the error by this spec)."""
    if threads is None:
        return ActorSpec(name=LEARNER, factory=factory)
    return ActorSpec(
        name=LEARNER,
        factory=factory,
        on_failure=scenario.runtime.on_failure,
        max_restarts=scenario.runtime.max_restarts,
        restart_for=(LearnerProcessLost,),
        recover_on_restart=True,
    )


def _inference(
    load: Callable[[], PolicyRunner],
    checkpoints: Checkpoints,
    batch_max: int,
    batch_wait: float,
    in_flight: int,
) -> Actor:
    from agents.acting.inference import InferenceActor

    return InferenceActor(
        load, checkpoints, batch_max=batch_max, batch_wait=batch_wait, in_flight=in_flight
    )


class _LearnerFactory:
    """Builds the learner (``threads``: ``[policy] learner_threads``, None: in this process;
    ``stall``: ``learner_stall_timeout``). Given the learner's process launched early
    (:func:`_early_learner`), it sends it what to load now, and the first learner built takes
    it; a restarted learner, or the first when that process died before it was sent what to
    load, starts its own."""

    def __init__(
        self,
        load: Callable[[], Trainee],
        checkpoints: Checkpoints,
        threads: int | None,
        early: TraineeProcess | None,
        stall: float,
    ) -> None:
        self.load = load
        self.checkpoints = checkpoints
        self.threads = threads
        self.stall = stall
        if early is not None:
            try:
                early.start(load, checkpoints)
            except LearnerProcessLost:  # it died while it imported: the learner starts its own
                early.close()
                early = None
        self._early = early

    def __call__(self) -> Actor:
        from agents.learning.learner import Learner

        host, self._early = self._early, None
        return Learner(self.load, self.checkpoints, self.threads, host, self.stall)


def load_runner_for(scenario: Scenario, model: Path | None) -> PolicyRunner:
    """The inference actor's model, tokenizer and settings (blocking)."""
    assert model is not None, "the model directory is prepared before the run starts"
    p = scenario.policy
    device = resolve_device(p.device)
    net, tokenizer = load_model_dir(model, device)
    from agents.models.policy import output_fault, packed_scoring_fault

    fault = output_fault(net, device)
    if fault is not None:
        raise ModelUnavailable(f"{model}: {fault}")
    if p.mode == "score":  # before the dtype and adapters: float32, to its rounding
        fault = packed_scoring_fault(net, device, tokenizer.pad_token_id or 0)
        if fault is not None:
            raise ModelUnavailable(
                f'{model}: {fault}; act with policy.mode = "generate", which uses the '
                "model's own attention"
            )
    net = _prepared(scenario, net, p.lora, "policy")
    return runner_for(scenario, net, tokenizer, device)


def runner_for(
    scenario: Scenario, net: Any, tokenizer: Any, device: Any, version: int = 0
) -> PolicyRunner:
    """The policy ``net`` acting as the run's inference actor does: the scenario's sampling
    and prompt settings and its ``[policy] backend`` (the one place they are read; ``audit
    whatif`` and ``probe`` replay and play with the same).

    Raises:
        ValueError: the scenario's backend is not in this build.
    """
    from agents.acting.inference import ActSettings, PolicyRunner

    p, e = scenario.policy, empo2_settings(scenario)
    settings = ActSettings(
        mode=p.mode,
        temperature=p.temperature,
        max_new_tokens=p.max_new_tokens,
        tip_tokens=e.tip_tokens,
        tip_temperature=e.tip_temperature,
        device=device,
        memory=scenario.prompt.memory,
    )
    backend = backend_named(p.backend)(net, device)
    return PolicyRunner(net, tokenizer, settings, version, backend=backend)


def load_trainee_for(scenario: Scenario, model: Path | None) -> Trainee:
    """The learner's model, tokenizer and optional reference (blocking)."""
    from agents.learning.update import Trainee

    assert model is not None, "the model directory is prepared before the run starts"
    device = resolve_device(scenario.policy.device)
    net, tokenizer = load_model_dir(model, device)
    net = _prepared(scenario, net, scenario.policy.lora, "policy")
    return Trainee(net, tokenizer, device, reference=scenario.grpo.kl_coef > 0)


def reexecution_for(
    run_dir: Path, meta: RunMeta | None, run_seed: int, overrides: list[str] | tuple[str, ...] = ()
) -> Reexecution:
    """What re-executes a finished run's updates: its scenario (``meta``, the log's metadata,
    with this machine's ``overrides``)'s base models at version 0, loaded as the run loaded
    them (device, torch threads, the embedded model's cache).

    Raises:
        ScenarioInvalid: the log's scenario is missing or does not validate here, or its
            method trains no model.
        ModelUnavailable: a base model cannot be found or built.
    """
    import torch

    from agents.audit.reexecute import Reexecution

    source = stored_source(str(run_dir))
    scenario = stored_scenario(meta, str(run_dir), overrides)
    if scenario.run.method == ROLLOUT or scenario.agent.kind != "policy":
        raise ScenarioInvalid(source, f"run.method = {scenario.run.method!r} trains no model")
    if scenario.policy.threads:
        torch.set_num_threads(scenario.policy.threads)
    recorded = recorded_models(scenario, meta.models, overrides) if meta is not None else {}
    model = policy_model_dir(scenario, source, recorded)
    trainee = load_trainee_for(scenario, model)
    extractor = None
    if "extractor" in _roles(checked_method(scenario, source), source):
        extractor = load_extractor_for(
            scenario, extractor_model_dir(scenario, source, model, recorded)
        )
    return Reexecution(run_dir, run_seed, trainee, extractor)


def load_extractor_for(scenario: Scenario, model: Path | None) -> ExtractorModel:
    """The extractor of a scenario's method from its starting weights (blocking)."""
    from agents.methods.actors import load_extractor

    return load_extractor(
        complementary_settings(scenario), load_base_for(scenario, model, "extractor")
    )
