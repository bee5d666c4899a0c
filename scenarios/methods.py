"""The scenario's learning method: :mod:`agents.methods.registry` given the scenario's sections."""

from __future__ import annotations

from agents.methods.base import Method
from agents.methods.registry import build_method
from scenarios.schema import Scenario


def method_of(scenario: Scenario) -> Method:
    """The scenario's learning method with its settings: a built-in's own section (``[empo2]``,
    ``[complementary]``), a plug-in's ``[method]`` table.

    Raises:
        ValueError: see :func:`agents.methods.registry.build_method`.
    """
    name = scenario.run.method
    sections: dict[str, object] = {"empo2": scenario.empo2, "complementary": scenario.complementary}
    return build_method(name, scenario.grpo, sections.get(name), scenario.method)
