"""The scenario's learning method: :mod:`agents.methods.registry` given the scenario's sections."""

from __future__ import annotations

import msgspec

from agents.methods.base import Method
from agents.methods.builtin import complementary_rule, grpo_rule
from agents.methods.registry import BUILTIN, MethodOptionsInvalid, scenario_method
from engine.errors import ScenarioInvalid
from scenarios.schema import Scenario


def method_of(scenario: Scenario) -> Method:
    """The scenario's learning method with its settings: a built-in's own section (``[empo2]``,
    ``[complementary]``), a plug-in's ``[method]`` table.

    Raises:
        ValueError: see :func:`agents.methods.registry.build_method`.
    """
    return scenario_method(scenario)


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
    if method == "complementary":
        return complementary_rule(scenario.grpo, scenario.complementary) != complementary_rule(
            changed.grpo, changed.complementary
        )
    if method in BUILTIN:
        return grpo_rule(scenario.grpo) != grpo_rule(changed.grpo)
    return changed != scenario


def _advantages_set(
    scenario: Scenario, std_norm: bool | None, split: bool | None, weighted: bool | None
) -> Scenario:
    grpo, comp = scenario.grpo, scenario.complementary
    if std_norm is not None:
        grpo = msgspec.structs.replace(grpo, std_norm=std_norm)
        comp = msgspec.structs.replace(comp, subgroup_std=std_norm)
    if split is not None:
        comp = msgspec.structs.replace(comp, subgroups=split)
    if weighted is not None:
        comp = msgspec.structs.replace(comp, subgroup_weights=weighted)
    return msgspec.structs.replace(scenario, grpo=grpo, complementary=comp)
