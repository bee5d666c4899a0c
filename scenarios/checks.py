"""Which invariants a run is checked against: its scenario, read from the log's metadata, names
its method and world, whose modules are imported so that the invariants they register are
known (``coevo check``, ``coevo replay --verify``, the stateful harness).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from agents.methods.registry import BUILTIN, method_class
from engine.eventlog import RunMeta
from engine.invariants import CheckContext, Invariant, Registered, select, unloaded
from engine.world_registry import builtin_worlds
from scenarios.loader import stored_scenario
from scenarios.schema import Scenario

__all__ = ["built_for", "check_context", "context_of", "invariants_for"]


def context_of(scenario: Scenario, meta: RunMeta | None = None) -> tuple[CheckContext, list[str]]:
    """The check context of a run of ``scenario``, with the plug-in modules it names imported.

    Returns:
        The context, and a note per plug-in module that could not be imported (its own
        invariants, if it registers any, are then not checked).
    """
    notes = unloaded()  # coevo's own invariants are among the entry points: load them first
    method, world = scenario.run.method, scenario.world.name
    built_on = ""
    if method not in BUILTIN and method != "rollout":
        try:
            cls = method_class(method)
        except ValueError as exc:
            notes.append(f"method {method!r} not loaded, its own invariants unknown: {exc}")
        else:
            built_on = _built_on(cls)
    path = builtin_worlds().get(world, world)
    module = path.partition(":")[0]
    if ":" in path:
        try:
            importlib.import_module(module)
        except Exception as exc:  # a plug-in's own failure at import: a note, never a traceback
            notes.append(f"world module {module!r} not loaded, its own invariants unknown: {exc}")
    context = CheckContext(
        meta=meta, scenario=scenario, method=method, world=world, built_on=built_on
    )
    return context, notes


def _built_on(cls: type[Any]) -> str:
    """The built-in method ``cls`` subclasses and whose actors (its memory) it keeps: an
    unchanged memory is checked as the built-in's is (``lineage``); "" for none."""
    for name, builtin in BUILTIN.items():
        if issubclass(cls, builtin) and cls.actors is builtin.actors:
            return name
    return ""


def check_context(meta: RunMeta | None, source: str = "the run") -> tuple[CheckContext, list[str]]:
    """The check context of the run whose metadata is ``meta`` (None: a bare context, as for
    a generated stream), and notes on what cannot be checked without the run's settings.

    Raises:
        ScenarioInvalid: the scenario stored in the log does not validate.
    """
    unset = "so what needs the run's settings (its method, world and credit rules) is not checked"
    if meta is None:  # its metadata lost (a log's meta removed), or a stream never a log
        return CheckContext(), [f"{source}: the log records no run metadata, {unset}"]
    if not meta.scenario_toml.strip():  # a generated or hand-made log (new_run_meta's default)
        return CheckContext(), [f"{source}: the log records no scenario, {unset}"]
    return context_of(stored_scenario(meta, source), meta)


def invariants_for(
    ctx: CheckContext, names: Sequence[str] = ()
) -> tuple[list[Invariant], list[Registered], list[str]]:
    """Fresh instances of ``names`` (every invariant that applies to ``ctx``'s run when empty).

    Returns:
        The instances, their registrations and what was left out with why (one that cannot be
        built for the run, e.g. ``credit`` when the run's plug-in method does not import).

    Raises:
        KeyError: an unknown name.
    """
    chosen, skipped = select(ctx, names)
    built, kept, failed = built_for(ctx, chosen)
    return (
        built,
        kept,
        skipped + [f"{name}: cannot be built for this run: {exc}" for name, exc in failed],
    )


def built_for(
    ctx: CheckContext, chosen: Sequence[Registered]
) -> tuple[list[Invariant], list[Registered], list[tuple[str, ValueError]]]:
    """Fresh instances of the ``chosen`` invariants for ``ctx``'s run, their registrations,
    and the name and error of each that cannot be built for it (``credit`` when the run's
    plug-in method does not import)."""
    built: list[Invariant] = []
    kept: list[Registered] = []
    failed: list[tuple[str, ValueError]] = []
    for r in chosen:
        try:
            built.append(r.factory(ctx))
            kept.append(r)
        except ValueError as exc:
            failed.append((r.name, exc))
    return built, kept, failed
