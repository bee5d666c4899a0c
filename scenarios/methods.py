"""The scenario's learning method: :mod:`agents.methods.registry` given the scenario's sections."""

from __future__ import annotations

import msgspec

from agents.methods.base import Method
from agents.methods.registry import scenario_method
from scenarios.schema import Scenario


def method_of(scenario: Scenario) -> Method:
    """The scenario's learning method with its settings: a built-in's own section (``[empo2]``,
    ``[complementary]``), a plug-in's ``[method]`` table.

    Raises:
        ValueError: see :func:`agents.methods.registry.build_method`.
    """
    return scenario_method(scenario)


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
    grpo, comp = scenario.grpo, scenario.complementary
    if std_norm is not None:
        grpo = msgspec.structs.replace(grpo, std_norm=std_norm)
        comp = msgspec.structs.replace(comp, subgroup_std=std_norm)
    if split is not None:
        comp = msgspec.structs.replace(comp, subgroups=split)
    if weighted is not None:
        comp = msgspec.structs.replace(comp, subgroup_weights=weighted)
    return method_of(msgspec.structs.replace(scenario, grpo=grpo, complementary=comp))
