"""Where the policy's and the method's base models come from: a local directory, the embedded
model and the extractor's ``embedded-ops`` base (built on first use, then taken from the cache),
or the directories an existing run recorded; and the ``--set`` overrides that ask for another.

The builders' modules (torch, transformers) are imported only where a model is built, so a
caller that only checks the settings imports neither.
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from agents.models.specs import EmbeddedSpec, OpsSpec
from engine.errors import CoevoError, ModelUnavailable, ScenarioInvalid
from scenarios.loader import override_key
from scenarios.methods import complementary_settings, section_path
from scenarios.schema import Scenario
from stores.model_dirs import check_model_dir

if TYPE_CHECKING:
    from engine.eventlog import ModelFiles


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
    check_model_world(scenario, spec, source)
    with _building(source, "$.policy.model", "the embedded model"):
        return ensure_embedded(
            spec, threads=p.threads or None, step_timeout=scenario.world.call_limit
        )


def check_model_world(scenario: Scenario, spec: EmbeddedSpec, source: str) -> None:
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
