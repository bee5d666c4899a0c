"""The scenario's learning method: :mod:`agents.methods.registry` given the scenario's sections."""

from __future__ import annotations

from typing import Literal

import msgspec

from agents.methods.base import Method
from agents.methods.builtin import complementary_rule, grpo_rule
from agents.methods.registry import (
    BUILTIN,
    MethodOptionsInvalid,
    built_on,
    method_settings,
    scenario_method,
)
from agents.methods.settings import ComplementaryConfig, Empo2Config
from engine.errors import ScenarioInvalid
from scenarios.schema import Scenario


def method_of(scenario: Scenario) -> Method:
    """The scenario's learning method with its settings: a built-in's own section (``[empo2]``,
    ``[complementary]``), a plug-in's ``[method]`` table.

    Raises:
        ValueError: see :func:`agents.methods.registry.build_method`.
    """
    return scenario_method(scenario)


def complementary_settings(scenario: Scenario) -> ComplementaryConfig:
    """The Complementary RL settings the scenario's method runs with: ``[complementary]``, or
    a plug-in's ``[method]`` when it is built on Complementary RL
    (:func:`agents.methods.registry.method_settings`)."""
    return method_settings(scenario, ComplementaryConfig)


def empo2_settings(scenario: Scenario) -> Empo2Config:
    """The EMPO2 settings the scenario's method runs with: ``[empo2]``, or a plug-in's
    ``[method]`` when it is built on EMPO2."""
    return method_settings(scenario, Empo2Config)


def built_on_complementary(scenario: Scenario) -> bool:
    """Whether the scenario's method is a plug-in built on Complementary RL."""
    return built_on(scenario, ComplementaryConfig) is not None


def built_on_empo2(scenario: Scenario) -> bool:
    """Whether the scenario's method is a plug-in built on EMPO2."""
    return built_on(scenario, Empo2Config) is not None


def section_path(scenario: Scenario, section: Literal["empo2", "complementary"]) -> str:
    """Where the scenario sets the settings of ``section`` its method runs with, as an error
    names them: ``$.complementary``, or ``$.method`` for a plug-in built on that method
    (:func:`method_settings` reads them there)."""
    built = built_on_empo2 if section == "empo2" else built_on_complementary
    return "$.method" if built(scenario) else f"$.{section}"


def checked_method(scenario: Scenario, source: str) -> Method:
    """:func:`method_of`, its errors as the scenario's.

    Raises:
        ScenarioInvalid: the method cannot be built (its module does not import, its name is
            unknown, its ``[method]`` table is invalid).
    """
    try:
        return method_of(scenario)
    except MethodOptionsInvalid as exc:  # the [method] table's fault, not the method's name
        raise ScenarioInvalid(source, f"$.method: {exc}") from None
    except ValueError as exc:
        raise ScenarioInvalid(source, f"$.run.method: {exc}") from None


def method_with(
    scenario: Scenario,
    *,
    std_norm: bool | None = None,
    split: bool | None = None,
    weighted: bool | None = None,
) -> Method:
    """The scenario's method with advantage settings changed (what ``coevo audit RUN credit
    --set`` re-derives under): ``std_norm`` for ``[grpo] std_norm`` and ``[complementary]
    subgroup_std``, ``split`` for ``subgroups``, ``weighted`` for ``subgroup_weights``; None
    keeps the scenario's.

    Raises:
        ValueError: see :func:`method_of`.
    """
    return method_of(_advantages_set(scenario, std_norm, split, weighted))


def advantages_changed(
    scenario: Scenario,
    *,
    std_norm: bool | None = None,
    split: bool | None = None,
    weighted: bool | None = None,
) -> bool:
    """Whether :func:`method_with` these settings changes the scenario's method (``--set
    std_norm=true`` on a run that divides by the std already re-derives the run itself). A
    built-in's is its advantage formula's name (GRPO and EMPO2 read ``[grpo] std_norm`` and
    nothing of ``split`` or ``weighted``); a plug-in's, any change to those sections."""
    changed = _advantages_set(scenario, std_norm, split, weighted)
    method = scenario.run.method
    if method == "complementary" or built_on_complementary(scenario):
        return complementary_rule(
            scenario.grpo, complementary_settings(scenario)
        ) != complementary_rule(changed.grpo, complementary_settings(changed))
    if method in BUILTIN:
        return grpo_rule(scenario.grpo) != grpo_rule(changed.grpo)
    return changed != scenario


def _advantages_set(
    scenario: Scenario, std_norm: bool | None, split: bool | None, weighted: bool | None
) -> Scenario:
    """The scenario with those settings changed where its method reads them: ``[grpo]`` and
    ``[complementary]``, or a plug-in's ``[method]`` table when it is built on Complementary
    RL (changing ``[complementary]`` there changed nothing the method reads)."""
    grpo, comp = scenario.grpo, scenario.complementary
    changes: dict[str, bool] = {}
    if std_norm is not None:
        grpo = msgspec.structs.replace(grpo, std_norm=std_norm)
        changes["subgroup_std"] = std_norm
    if split is not None:
        changes["subgroups"] = split
    if weighted is not None:
        changes["subgroup_weights"] = weighted
    comp = msgspec.structs.replace(comp, **changes)
    options = scenario.method
    if built_on_complementary(scenario):
        options = {**options, **changes}
    return msgspec.structs.replace(scenario, grpo=grpo, complementary=comp, method=options)
