"""The policy's settings checked before a run builds anything (``coevo validate`` and ``coevo
run`` alike): LoRA targets that name modules of their model, responses that fit their model's
positions, sampling temperatures, the backend and the dtype a model trains in, and the policy's
model directory.

No weights are loaded and nothing is built for the run here: what is read is the scenario, a
local model's config and files (a skeleton on the meta device names its modules), the embedded
model's spec, the world it learns when that is not the run's, and, for a bf16 dtype, the device.
"""

from __future__ import annotations

from pathlib import Path

from agents.methods.base import Method
from agents.models.backend import backend_named
from agents.models.tuning import check_train_dtype
from engine.errors import ModelUnavailable, ScenarioInvalid
from scenarios.methods import complementary_settings, empo2_settings, section_path
from scenarios.policy_models import check_model_world, embedded_spec
from scenarios.schema import Scenario
from stores.checkpoints import resolve_device
from stores.model_dirs import check_model_dir, module_names

ROLLOUT = "rollout"


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


MIN_TEMPERATURE = 1e-3
"""The smallest sampling temperature but 0 (greedy). Logits divided by less lose their
log-probs' precision, and far less (1e-300) overflow float32: every log-prob NaN."""


def check_temperatures(
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


def check_policy_model(scenario: Scenario, source: str) -> None:
    """What :func:`policy_model_dir` checks, without building or loading anything.

    Raises:
        ScenarioInvalid: ``policy.embedded`` names an unknown or invalid field.
        ModelUnavailable: the path holds no usable model (see :func:`check_model_dir`).
    """
    if scenario.policy.model != "embedded":
        check_model_dir(Path(scenario.policy.model), f"{source}: $.policy.model")
    else:
        check_model_world(scenario, embedded_spec(scenario, source), source)
