"""The policy side of assembly: the model directory, the inference and learner actors, and the
loaders they call at start.

Kept apart from :mod:`scenarios.assemble`, and importing torch and transformers (seconds) only
where a model is built or loaded: the actors' factories import their modules when the run
starts them, so checking a scenario (``coevo validate``) imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from agents.learning.credit_actor import CreditActor, credit_settings
from agents.memory.bank import MemoryActor, MemorySettings
from agents.models.embedder import Embedder, make_embedder, minilm_dir
from agents.models.specs import EmbeddedSpec, OpsSpec
from engine.actor import Actor, ActorSpec
from engine.errors import ModelUnavailable, ScenarioInvalid
from scenarios.loader import load_scenario
from scenarios.methods import method_of
from scenarios.schema import Scenario
from stores.checkpoints import (
    Checkpoints,
    DirCheckpoints,
    MemoryCheckpoints,
    check_device,
    check_model_dir,
    load_model_dir,
    resolve_device,
)

if TYPE_CHECKING:
    from agents.acting.inference import PolicyRunner
    from agents.audit.reexecute import Reexecution
    from agents.learning.learner import Trainee
    from agents.memory.extractor import ExtractorModel

INFERENCE = "inference"
LEARNER = "learner"
MEMORY = "memory"
EXTRACTOR = "extractor"
CREDIT = "credit"


def policy_actors(
    scenario: Scenario, source: str, run_dir: Path | None, prepare_model: bool
) -> tuple[list[ActorSpec], Path | None]:
    """The inference actor (and the learner, for a learning method) and the model directory.

    Args:
        scenario: the validated scenario.
        source: its file name (for error messages).
        run_dir: the run directory (checkpoints go there); None keeps them in memory.
        prepare_model: build (or find in the cache) the embedded model and set torch's threads;
            False only checks the settings and model directories (``coevo validate``) and
            returns None as the model directory.

    Raises:
        ScenarioInvalid: ``policy.embedded`` or the extractor's settings are invalid.
        ModelUnavailable: a model directory holds no usable model, or a model cannot be built.
    """
    try:  # the device exists: refused now, not by the first actor that loads a model
        check_device(scenario.policy.device)
    except ModelUnavailable as exc:
        raise ScenarioInvalid(source, f"$.policy.device: {exc}") from None
    if scenario.policy.threads and prepare_model:
        import torch

        torch.set_num_threads(scenario.policy.threads)  # process-wide: inference and learner
    extracting = scenario.run.method == "complementary"
    # the extractor's settings (and a local path) are checked before anything is built
    extractor_dir = extractor_model_dir(scenario, source, None) if extracting else None
    model = policy_model_dir(scenario, source) if prepare_model else None
    if not prepare_model:
        check_policy_model(scenario, source)
    keep = scenario.grpo.keep_checkpoints
    checkpoints: Checkpoints = (
        DirCheckpoints(run_dir / "checkpoints", keep=keep) if run_dir else MemoryCheckpoints()
    )
    extractor: Checkpoints = (
        DirCheckpoints(run_dir / "extractor", keep=keep) if run_dir else MemoryCheckpoints()
    )
    if extracting and extractor_dir is None and model is not None:
        extractor_dir = extractor_model_dir(scenario, source, model)
    return _policy_actors(scenario, model, extractor_dir, checkpoints, extractor), model


def _policy_actors(
    scenario: Scenario,
    model: Path | None,
    extractor_dir: Path | None,
    checkpoints: Checkpoints,
    extractor_checkpoints: Checkpoints,
) -> list[ActorSpec]:
    p = scenario.policy
    load_runner = partial(load_runner_for, scenario, model)
    specs = [
        ActorSpec(
            name=INFERENCE,
            factory=partial(
                _inference, load_runner, checkpoints, p.batch_max, p.batch_wait_ms / 1000.0
            ),
        )
    ]
    if scenario.run.method == "empo2":
        specs.append(memory_actor(scenario))
    if scenario.run.method == "complementary":
        specs += complementary_actors(scenario, extractor_dir, extractor_checkpoints)
    if scenario.run.method != "rollout":
        specs += method_of(scenario).actors()
        load_trainee = partial(load_trainee_for, scenario, model)
        specs.append(ActorSpec(name=LEARNER, factory=partial(_learner, load_trainee, checkpoints)))
    return specs


def _inference(
    load: Callable[[], PolicyRunner], checkpoints: Checkpoints, batch_max: int, batch_wait: float
) -> Actor:
    from agents.acting.inference import InferenceActor

    return InferenceActor(load, checkpoints, batch_max=batch_max, batch_wait=batch_wait)


def _learner(load: Callable[[], Trainee], checkpoints: Checkpoints) -> Actor:
    from agents.learning.learner import Learner

    return Learner(load, checkpoints)


def _extractor(
    load: Callable[[], ExtractorModel],
    checkpoints: Checkpoints,
    batch_max: int,
    batch_wait: float,
) -> Actor:
    from agents.memory.extractor import ExtractorActor

    return ExtractorActor(load, checkpoints, batch_max=batch_max, batch_wait=batch_wait)


def embedder_for(name: Literal["minilm", "hashing"]) -> Callable[[], Embedder]:
    """What builds the memory's embedder in its actor; a missing MiniLM package is reported
    now, as a one-line error before the run starts, not as an actor failure.

    Raises:
        ModelUnavailable: ``name`` is "minilm" and its package is missing or incomplete.
    """
    if name == "minilm":
        minilm_dir()
    return partial(make_embedder, name)


def memory_actor(scenario: Scenario) -> ActorSpec:
    """EMPO2's memory actor with the scenario's embedder and bank rules."""
    e = scenario.empo2
    settings = MemorySettings(
        capacity=e.capacity, threshold=e.threshold, top_k=e.top_k, index=e.index
    )
    return ActorSpec(
        name=MEMORY,
        factory=partial(MemoryActor, embedder_for(e.embedder), settings),
    )


def complementary_actors(
    scenario: Scenario, model: Path | None, checkpoints: Checkpoints
) -> list[ActorSpec]:
    """Complementary RL's memory (the bank), extractor and credit actors."""
    c = scenario.complementary
    bank = bank_settings(scenario)
    credit = credit_settings(c)
    memory = partial(
        MemoryActor,
        embedder_for(c.embedder),
        bank,
        merge_chunk=c.merge_chunk,
        merge_max=c.merge_max,
    )
    load = partial(load_extractor_for, scenario, model)
    p = scenario.policy
    return [
        ActorSpec(name=MEMORY, factory=memory),
        ActorSpec(
            name=EXTRACTOR,
            factory=partial(_extractor, load, checkpoints, p.batch_max, p.batch_wait_ms / 1000.0),
        ),
        ActorSpec(name=CREDIT, factory=partial(CreditActor, credit)),
    ]


def bank_settings(scenario: Scenario) -> MemorySettings:
    """Complementary RL's bank rules in a scenario."""
    c = scenario.complementary
    return MemorySettings(
        capacity=c.capacity, index=c.index, lam=c.lam, recent=c.recent, pool=c.pool
    )


def load_extractor_for(scenario: Scenario, model: Path | None) -> ExtractorModel:
    """The extractor's own copy of its starting weights (blocking)."""
    from agents.memory.extractor import ExtractorModel, ExtractorSettings

    c = scenario.complementary
    assert model is not None, "the model directory is prepared before the run starts"
    device = resolve_device(scenario.policy.device)
    net, tokenizer = load_model_dir(model, device)
    settings = ExtractorSettings(
        temperature=c.temperature,
        max_new_tokens=c.max_new_tokens,
        max_ops=c.max_ops,
        plain_add=c.plain_add,
        device=device,
    )
    return ExtractorModel(net, tokenizer, settings)


def policy_model_dir(scenario: Scenario, source: str) -> Path:
    """The policy's model directory: a local path, or the embedded model (built on first use,
    then taken from the cache).

    Raises:
        ScenarioInvalid: ``policy.embedded`` names an unknown or invalid field.
        ModelUnavailable: the path holds no usable model (see :func:`check_model_dir`).
    """
    from agents.models.embedded import ensure_embedded

    p = scenario.policy
    if p.model != "embedded":
        return check_model_dir(Path(p.model), f"{source}: $.policy.model")
    return ensure_embedded(embedded_spec(scenario, source), threads=p.threads or None)


def check_policy_model(scenario: Scenario, source: str) -> None:
    """What :func:`policy_model_dir` checks, without building or loading anything.

    Raises:
        ScenarioInvalid: ``policy.embedded`` names an unknown or invalid field.
        ModelUnavailable: the path holds no usable model (see :func:`check_model_dir`).
    """
    if scenario.policy.model != "embedded":
        check_model_dir(Path(scenario.policy.model), f"{source}: $.policy.model")
    else:
        embedded_spec(scenario, source)


def embedded_spec(scenario: Scenario, source: str) -> EmbeddedSpec:
    """The spec of the embedded model a scenario asks for (nothing is built): the scenario's
    world and window, and the fields of ``policy.embedded``.

    Raises:
        ScenarioInvalid: ``policy.embedded`` names an unknown or invalid field.
    """
    p = scenario.policy
    fields: dict[str, Any] = {
        "world": scenario.world.name,
        "world_options": dict(scenario.world.options),
    }
    fields["window"] = p.window
    fields.update(_known_fields(p.embedded, EmbeddedSpec, "$.policy.embedded", source))
    try:
        return msgspec.convert(fields, EmbeddedSpec)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ScenarioInvalid(source, f"$.policy.embedded: {exc}") from None


def extractor_model_dir(scenario: Scenario, source: str, model: Path | None) -> Path | None:
    """The extractor's starting weights: the policy's model directory (``"embedded"``), the
    embedded model taught the operation format (``"embedded-ops"``, built on first use, see
    :mod:`agents.models.extractor_base`), or a local path.

    Args:
        model: the policy's model directory, or None before it is prepared: then only the
            settings are checked and None is returned, except for a local path, which is
            checked and returned (it needs nothing built).

    Raises:
        ScenarioInvalid: ``"embedded-ops"`` without the embedded policy model, or
            ``complementary.ops`` names an unknown or invalid field.
        ModelUnavailable: the path holds no usable model (see :func:`check_model_dir`).
    """
    c = scenario.complementary
    if c.extractor == "embedded":
        return model
    if c.extractor != "embedded-ops":
        where = f"{source}: $.complementary.extractor"
        return check_model_dir(Path(c.extractor), where)
    if scenario.policy.model != "embedded":
        raise ScenarioInvalid(
            source,
            '$.complementary.extractor: "embedded-ops" teaches the embedded model the '
            f"operation format, but $.policy.model is {scenario.policy.model!r}",
        )
    fields: dict[str, Any] = {"max_ops": c.max_ops, "max_new_tokens": c.max_new_tokens}
    fields.update(_known_fields(c.ops, OpsSpec, "$.complementary.ops", source))
    try:
        ops = msgspec.convert(fields, OpsSpec)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ScenarioInvalid(source, f"$.complementary.ops: {exc}") from None
    base = embedded_spec(scenario, source)
    if model is None:
        return None
    from agents.models.extractor_base import ensure_extractor_base

    return ensure_extractor_base(model, base, ops, threads=scenario.policy.threads or None)


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
    from agents.acting.inference import ActSettings, PolicyRunner

    assert model is not None, "the model directory is prepared before the run starts"
    p = scenario.policy
    device = resolve_device(p.device)
    net, tokenizer = load_model_dir(model, device)
    settings = ActSettings(
        mode=p.mode,
        temperature=p.temperature,
        max_new_tokens=p.max_new_tokens,
        tip_tokens=scenario.empo2.tip_tokens,
        tip_temperature=scenario.empo2.tip_temperature,
        device=device,
        memory=scenario.prompt.memory,
    )
    return PolicyRunner(net, tokenizer, settings)


def load_trainee_for(scenario: Scenario, model: Path | None) -> Trainee:
    """The learner's model, tokenizer and optional reference (blocking)."""
    from agents.learning.learner import Trainee

    assert model is not None, "the model directory is prepared before the run starts"
    device = resolve_device(scenario.policy.device)
    net, tokenizer = load_model_dir(model, device)
    return Trainee(net, tokenizer, device, reference=scenario.grpo.kl_coef > 0)


def reexecution_for(run_dir: Path, run_seed: int) -> Reexecution:
    """What re-executes a finished run's updates: its scenario's base models at version 0,
    loaded as the run loaded them (device, torch threads, the embedded model's cache).

    Raises:
        ScenarioInvalid: the run's ``scenario.toml`` is missing or invalid, or its method
            trains no model.
        ModelUnavailable: a base model cannot be found or built.
    """
    import torch

    from agents.audit.reexecute import Reexecution

    source = str(run_dir / "scenario.toml")
    scenario = load_scenario(source)
    method = scenario.run.method
    if method == "rollout" or scenario.agent.kind != "policy":
        raise ScenarioInvalid(source, f"run.method = {method!r} trains no model")
    if scenario.policy.threads:
        torch.set_num_threads(scenario.policy.threads)
    model = policy_model_dir(scenario, source)
    trainee = load_trainee_for(scenario, model)
    extractor = None
    if method == "complementary":
        extractor = load_extractor_for(scenario, extractor_model_dir(scenario, source, model))
    return Reexecution(run_dir, run_seed, trainee, extractor)
