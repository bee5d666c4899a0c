"""The policy side of assembly: the model directory, the inference and learner actors, and the
loaders they call at start.

Kept apart from :mod:`scenarios.assemble`, and importing torch and transformers (seconds) only
where a model is built or loaded: the actors' factories import their modules when the run
starts them, so checking a scenario (``coevo validate``) imports neither.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from agents.learning.trainee_host import LearnerProcessLost, TraineeProcess
from agents.methods.base import LoadedModel, Method, RunResources, base_models, method_actors
from agents.models.backend import backend_named
from agents.models.specs import EmbeddedSpec, OpsSpec
from agents.models.tuning import LoraSettings, check_train_dtype, lora_seed, prepare
from engine.actor import Actor, ActorSpec
from engine.errors import CoevoError, ModelUnavailable, ScenarioInvalid
from scenarios.loader import override_key, stored_scenario, stored_source
from scenarios.methods import (
    checked_method,
    complementary_settings,
    empo2_settings,
    section_path,
)
from scenarios.schema import Scenario
from stores.checkpoints import (
    Checkpoints,
    DirCheckpoints,
    MemoryCheckpoints,
    check_device,
    resolve_device,
)
from stores.model_dirs import check_model_dir, load_model_dir, module_names

if TYPE_CHECKING:
    from agents.acting.inference import PolicyRunner
    from agents.audit.reexecute import Reexecution
    from agents.learning.learner import Trainee
    from agents.memory.extractor import ExtractorModel
    from engine.eventlog import ModelFiles, RunMeta

INFERENCE = "inference"
LEARNER = "learner"
ROLLOUT = "rollout"


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
    _check_temperatures(scenario, source, method, roles)
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


def check_lora_targets(scenario: Scenario, source: str, extractor: bool) -> None:
    """Every LoRA target names a module of its model (read from the model's config, built on
    the meta device: no weights are read), so a run is refused before it starts; the adapters
    were added, and the name checked, only when an actor loaded the model. A model whose
    config cannot be read is left to its own check.

    Raises:
        ScenarioInvalid: a target names no module.
    """
    p, c = scenario.policy, complementary_settings(scenario)
    checks = [("$.policy.lora.targets", p.lora, p.model)]
    if extractor:
        base = p.model if c.extractor == "embedded" else c.extractor
        checks.append((f"{section_path(scenario, 'complementary')}.lora.targets", c.lora, base))
    for where, lora, model in checks:
        used = lora.used()
        if used is None:
            continue
        names = module_names(None if model in _EMBEDDED else Path(model).expanduser())
        missing = sorted(set(used.targets) - names) if names else []
        if missing:
            raise ScenarioInvalid(
                source,
                f"{where}: {missing} name no module of the model {model!r} (its modules: "
                f"{', '.join(sorted(names)[:16])})",
            )


_EMBEDDED = ("embedded", "embedded-ops")
"""Model settings that name the embedded model (a Qwen2, :mod:`agents.models.embedded`)."""


def check_rooms(scenario: Scenario, source: str, method: Method | None, extractor: bool) -> None:
    """Every response a model generates fits its positions beside a prompt: a prompt keeps at
    least half of them (it is cut in the middle to leave the response room), so a response
    may take at most the other half. Past them, a model with learned positions failed the
    run at its first long response (``IndexError``) and a rotary one computed on beyond what
    it was built for. Read from the scenario and the configs alone (``validate`` builds
    nothing): a local model's ``config.json``, the embedded model's spec.

    Args:
        extractor: the method trains an extractor (``[complementary] extractor``).

    Raises:
        ScenarioInvalid: naming the setting, the model's positions and the most it may be.
    """
    from agents.methods.builtin import Empo2

    policy = _positions(scenario, source, scenario.policy.model)
    wanted: list[tuple[int | None, str, int]] = []
    if scenario.policy.mode == "generate":
        wanted.append((policy, "$.policy.max_new_tokens", scenario.policy.max_new_tokens))
    if isinstance(method, Empo2):
        at = section_path(scenario, "empo2")
        wanted.append((policy, f"{at}.tip_tokens", empo2_settings(scenario).tip_tokens))
    if extractor:
        c, at = complementary_settings(scenario), section_path(scenario, "complementary")
        limit = policy if c.extractor == "embedded" else _positions(scenario, source, c.extractor)
        wanted.append((limit, f"{at}.max_new_tokens", c.max_new_tokens))
    for limit, setting, tokens in wanted:
        if limit is not None and tokens > limit - limit // 2:
            raise ScenarioInvalid(
                source,
                f"{setting} = {tokens}: the model is built for {limit} positions, and a "
                f"response may take at most half of them ({limit - limit // 2}) beside its "
                "prompt",
            )
    if isinstance(method, Empo2) and policy is not None:
        _warn_tips_room(scenario, source, policy)


def _warn_tips_room(scenario: Scenario, source: str, positions: int) -> None:
    """A warning when EMPO2's tips alone may fill more than the half of the policy's
    positions a prompt is sure of: a turn shown ``top_k`` tips of ``tip_tokens`` each has its
    prompt cut in the middle, where tips (or the goal) are."""
    import structlog

    e, at = empo2_settings(scenario), section_path(scenario, "empo2").removeprefix("$.")
    tips, room = e.top_k * e.tip_tokens, positions // 2
    if tips > room:
        structlog.get_logger("coevo").warning(
            f"{source}: {at}.top_k * {at}.tip_tokens = {e.top_k} * {e.tip_tokens} = {tips} "
            f"tokens of tips; the model is built for {positions} positions and a prompt is "
            f"sure of half of them ({room}): a turn shown that many tips has its prompt cut in "
            "the middle (`coevo audit RUN episode ID` says where: `prompt cut`)"
        )


def _positions(scenario: Scenario, source: str, model: str) -> int | None:
    """The positions of the model a setting names: the embedded model's (the extractor's
    ``embedded-ops`` base is built from it), a local directory's config, None unknown."""
    from stores.model_dirs import positions_of

    if model in _EMBEDDED:
        return embedded_spec(scenario, source).max_positions
    try:
        return positions_of(Path(model).expanduser())
    except RuntimeError:  # ~user of no such user: check_model_dir names it
        return None


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


MIN_TEMPERATURE = 1e-3
"""The smallest sampling temperature but 0 (greedy). Logits divided by less lose their
log-probs' precision, and far less (1e-300) overflow float32: every log-prob NaN."""


def _check_temperatures(
    scenario: Scenario, source: str, method: Method | None, roles: tuple[str, ...]
) -> None:
    """Refuse a sampling temperature between 0 and :data:`MIN_TEMPERATURE` (a new run and a
    resume; a run's log is read whatever it holds).

    Raises:
        ScenarioInvalid: naming the setting.
    """
    temps = [("$.policy.temperature", scenario.policy.temperature)]
    from agents.methods.builtin import Empo2

    if isinstance(method, Empo2):
        at = section_path(scenario, "empo2")
        temps.append((f"{at}.tip_temperature", empo2_settings(scenario).tip_temperature))
    if "extractor" in roles:
        at = section_path(scenario, "complementary")
        temps.append((f"{at}.temperature", complementary_settings(scenario).temperature))
    for where, t in temps:
        if 0 < t < MIN_TEMPERATURE:
            raise ScenarioInvalid(
                source,
                f"{where} = {t:g}: a temperature between 0 and {MIN_TEMPERATURE:g} loses the "
                "log-probs' precision, and far below overflows float32 (NaN log-probs); 0 "
                "acts greedily",
            )


def check_training(scenario: Scenario, source: str, roles: tuple[str, ...]) -> None:
    """The backend, dtype and LoRA settings of ``[policy]`` (and the extractor's LoRA) fit: a
    model that trains in bf16 needs adapters (a rollout only samples: any dtype). The device
    (and so torch) is looked at only for a bf16 dtype: float32 trains anywhere.

    Raises:
        ScenarioInvalid: an unknown backend, an unavailable device, or a dtype this setup
            cannot train in.
    """
    p = scenario.policy
    try:
        backend_named(p.backend)
    except ValueError as exc:
        raise ScenarioInvalid(source, f"$.policy.backend: {exc}") from None
    if p.dtype == "float32":
        return
    import torch

    try:
        device = resolve_device(p.device)
    except ModelUnavailable as exc:
        raise ScenarioInvalid(source, f"$.policy.device: {exc}") from None
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    trained = [("policy", p.lora.used())] if scenario.run.method != ROLLOUT else []
    if "extractor" in roles:
        trained.append(("extractor", complementary_settings(scenario).lora.used()))
    for name, lora in trained:
        try:
            check_train_dtype(p.dtype, device, lora is not None, bf16)
        except ModelUnavailable as exc:
            raise ScenarioInvalid(source, f"$.policy.dtype: the {name}: {exc}") from None


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


def base_model_dir(
    scenario: Scenario,
    source: str,
    role: str,
    model: Path | None,
    recorded: Mapping[str, Path] | None = None,
) -> Path | None:
    """A method's base model by role (one of :data:`agents.methods.base.BASE_MODEL_ROLES`).

    Args:
        model: the policy's model directory, or None before it is prepared (then only the
            settings are checked, see :func:`extractor_model_dir`).
        recorded: see :func:`policy_model_dir`.

    Raises:
        ScenarioInvalid, ModelUnavailable: see :func:`extractor_model_dir`.
    """
    assert role == "extractor", f"base_models() admits only known roles, not {role!r}"
    return extractor_model_dir(scenario, source, model, recorded)


MODEL_KEYS = frozenset({"policy.model", "complementary.extractor"})
"""The settings that name a base model directory."""


def model_overrides(overrides: Sequence[str]) -> list[str]:
    """The ``--set key=value`` items of ``overrides`` that give another base model than a
    run's: one that names a model directory, or changes the recipe of an embedded model."""
    return [
        o
        for o in overrides
        if (k := override_key(o)) in MODEL_KEYS
        or k.startswith(("policy.embedded.", "complementary.ops."))
    ]


def recorded_models(
    scenario: Scenario, models: Mapping[str, ModelFiles], overrides: Sequence[str] = ()
) -> dict[str, Path]:
    """The embedded models an existing run started from (its metadata's ``models``) that are
    still where they were built, with the files the run recorded, by role: what every
    command that goes on with the run or re-runs part of it (``resume``, ``replay
    --reexecute-learner``, ``audit whatif``, ``probe``) loads, instead of building the
    embedded model by this coevo's recipe, which may differ from the one that built the
    run's (a newer recipe, or settings added since, build another model under another cache
    key, that the run's checkpoints and digests do not fit). A model directory named by a
    path is the scenario's own and is not looked up here, nor is an embedded model whose
    recipe ``overrides`` change (``policy.embedded.*``, ``complementary.ops.*``: built as
    they say)."""
    from stores.model_dirs import files_changed, model_files

    keys = [override_key(o) for o in overrides]
    embedded = any(k.startswith("policy.embedded") for k in keys)
    ops = embedded or any(k.startswith("complementary.ops") for k in keys)
    roles = {"policy"} if scenario.policy.model == "embedded" and not embedded else set[str]()
    if complementary_settings(scenario).extractor == "embedded-ops" and not ops:
        roles.add("extractor")
    found: dict[str, Path] = {}
    for role in sorted(roles & models.keys()):
        path = Path(models[role].path)
        try:
            same = path.is_dir() and not files_changed(models[role].files, model_files(path))
        except OSError:  # unreadable now: built again, and the digests say whether it fits
            same = False
        if same:
            found[role] = path
    return found


def policy_model_dir(
    scenario: Scenario, source: str, recorded: Mapping[str, Path] | None = None
) -> Path:
    """The policy's model directory: a local path, or the embedded model (built on first use,
    then taken from the cache).

    Args:
        recorded: an existing run's embedded models (:func:`recorded_models`): its
            ``"policy"`` is the embedded model, not the one this coevo's recipe builds.

    Raises:
        ScenarioInvalid: ``policy.embedded`` names an unknown or invalid field.
        ModelUnavailable: the path holds no usable model (see :func:`check_model_dir`).
    """
    from agents.models.embedded import ensure_embedded

    p = scenario.policy
    if p.model != "embedded":
        return check_model_dir(Path(p.model), f"{source}: $.policy.model")
    spec = embedded_spec(scenario, source)
    if recorded and "policy" in recorded:
        return recorded["policy"]
    _check_model_world(scenario, spec, source)
    with _building(source, "$.policy.model", "the embedded model"):
        return ensure_embedded(
            spec, threads=p.threads or None, step_timeout=scenario.world.call_limit
        )


def check_policy_model(scenario: Scenario, source: str) -> None:
    """What :func:`policy_model_dir` checks, without building or loading anything.

    Raises:
        ScenarioInvalid: ``policy.embedded`` names an unknown or invalid field.
        ModelUnavailable: the path holds no usable model (see :func:`check_model_dir`).
    """
    if scenario.policy.model != "embedded":
        check_model_dir(Path(scenario.policy.model), f"{source}: $.policy.model")
    else:
        _check_model_world(scenario, embedded_spec(scenario, source), source)


def _check_model_world(scenario: Scenario, spec: EmbeddedSpec, source: str) -> None:
    """Build and close the world the embedded model learns, when it is not the run's own
    world as the run builds it (``policy.embedded.world`` or ``world_options``): a world
    that cannot be built is an error naming those keys, before any model is built, not a
    failure of the model's build blamed on ``$.policy.model``.

    Raises:
        ScenarioInvalid: the world cannot be built with those options, or not in time.
    """
    from agents.acting.world_calls import Abandoned, in_thread
    from engine.world_registry import WorldOptionsInvalid, close_world, load_world

    w = scenario.world
    if (spec.world, spec.world_options) == (w.name, dict(w.options)):
        return  # the run's world: assembly built and checked it
    at = "$.policy.embedded.world"
    limit = w.call_limit
    try:
        world, error = in_thread(
            lambda: load_world(spec.world, spec.world_options), limit, "coevo-model-world"
        )
    except Abandoned:
        raise ScenarioInvalid(
            source, f"{at}: {spec.world} did not build within {limit:g} s ([world] step_timeout)"
        ) from None
    if isinstance(error, WorldOptionsInvalid):
        raise ScenarioInvalid(source, f"{at}_options: {error}")
    if isinstance(error, ValueError):
        raise ScenarioInvalid(source, f"{at}: {error}")
    if error is not None:
        raise ScenarioInvalid(source, f"{at}: {spec.world} raised {type(error).__name__}: {error}")
    if problem := close_world(world):
        raise ScenarioInvalid(source, f"{at}: {spec.world}: {problem}")


def embedded_spec(scenario: Scenario, source: str) -> EmbeddedSpec:
    """The spec of the embedded model a scenario asks for (nothing is built): the scenario's
    world and window, and the fields of ``policy.embedded``. The run's ``[world.options]``
    apply to the model's world only when it is the run's world: a model built on another
    world (``policy.embedded.world``) has that world's defaults unless ``world_options`` says.

    Raises:
        ScenarioInvalid: ``policy.embedded`` names an unknown or invalid field.
    """
    p = scenario.policy
    given = _known_fields(p.embedded, EmbeddedSpec, "$.policy.embedded", source)
    own = given.get("world", scenario.world.name) == scenario.world.name
    fields: dict[str, Any] = {
        "world": scenario.world.name,
        "world_options": dict(scenario.world.options) if own else {},
        "window": p.window,
    }
    fields.update(given)
    try:
        return msgspec.convert(fields, EmbeddedSpec)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ScenarioInvalid(source, f"$.policy.embedded: {exc}") from None


def extractor_model_dir(
    scenario: Scenario,
    source: str,
    model: Path | None,
    recorded: Mapping[str, Path] | None = None,
) -> Path | None:
    """The extractor's starting weights: the policy's model directory (``"embedded"``), the
    embedded model taught the operation format (``"embedded-ops"``, built on first use, see
    :mod:`agents.models.extractor_base`), or a local path.

    Args:
        model: the policy's model directory, or None before it is prepared: then only the
            settings are checked and None is returned, except for a local path, which is
            checked and returned (it needs nothing built).
        recorded: an existing run's embedded models (:func:`recorded_models`): its
            ``"extractor"`` is the ``"embedded-ops"`` model, not the one built now.

    Raises:
        ScenarioInvalid: ``"embedded-ops"`` without the embedded policy model, or
            ``complementary.ops`` names an unknown or invalid field.
        ModelUnavailable: the path holds no usable model (see :func:`check_model_dir`).
    """
    c, at = complementary_settings(scenario), section_path(scenario, "complementary")
    if c.extractor == "embedded":
        return model
    if c.extractor != "embedded-ops":
        where = f"{source}: {at}.extractor"
        return check_model_dir(Path(c.extractor), where)
    if scenario.policy.model != "embedded":
        raise ScenarioInvalid(
            source,
            f'{at}.extractor: "embedded-ops" teaches the embedded model the '
            f"operation format, but $.policy.model is {scenario.policy.model!r}",
        )
    fields: dict[str, Any] = {"max_ops": c.max_ops, "max_new_tokens": c.max_new_tokens}
    for key, run_value in fields.items():  # the stage teaches what the run's prompts ask
        if key in c.ops and c.ops[key] != run_value:
            raise ScenarioInvalid(
                source,
                f"{at}.ops.{key} = {c.ops[key]!r}: the operation format is taught with "
                f"{at}.{key} ({run_value!r}), what the run's extractor prompts ask; set that "
                "instead",
            )
    fields.update(_known_fields(c.ops, OpsSpec, f"{at}.ops", source))
    try:
        ops = msgspec.convert(fields, OpsSpec)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ScenarioInvalid(source, f"{at}.ops: {exc}") from None
    base = embedded_spec(scenario, source)
    if model is None:
        return None
    if recorded and "extractor" in recorded:
        return recorded["extractor"]
    from agents.models.extractor_base import ensure_extractor_base

    with _building(source, f"{at}.extractor", "the extractor's base"):
        return ensure_extractor_base(
            model,
            base,
            ops,
            threads=scenario.policy.threads or None,
            step_timeout=scenario.world.call_limit,
        )


@contextmanager
def _building(source: str, where: str, what: str) -> Generator[None]:
    """A build that fails (a plug-in world's exception or invalid observation while
    pre-training plays it, a spec the world cannot meet) is one line naming the scenario's
    setting, not a traceback: :class:`ModelUnavailable`."""
    try:
        yield
    except (ModelUnavailable, ScenarioInvalid):
        raise
    except KeyboardInterrupt:  # a stop during a build of minutes: said what is lost, then stop
        print(
            f"coevo: note: stopped while {what} was being built: nothing of the build is "
            "kept, and the next run that needs it builds it again",
            file=sys.stderr,
        )
        raise
    except Exception as exc:
        detail = str(exc) if isinstance(exc, CoevoError) else f"{type(exc).__name__}: {exc}"
        raise ModelUnavailable(
            f"{source}: {where}: {what} could not be built for this world: {detail}"
        ) from exc


def _known_fields(
    fields: dict[str, Any], struct: type[msgspec.Struct], where: str, source: str
) -> dict[str, Any]:
    unknown = sorted(set(fields) - set(struct.__struct_fields__))
    if unknown:
        raise ScenarioInvalid(
            source,
            f"{where}: unknown field(s) {unknown}; known: {sorted(struct.__struct_fields__)}",
        )
    return fields


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
    from agents.learning.learner import Trainee

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
