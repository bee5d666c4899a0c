"""Finding a learning method by name, as worlds are found (:mod:`engine.world_registry`): the
built-in ones by short name, a plug-in package's by the ``coevo.methods`` entry points, any other
by import path ``package.module:Class``.

A method class is built as ``Class(grpo, settings)``; its ``Settings`` attribute is the msgspec
Struct its options decode into (None: it takes none).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from agents.methods.base import Method
from agents.methods.builtin import Complementary, Empo2, Grpo
from agents.methods.settings import ComplementaryConfig, Empo2Config, GrpoConfig
from engine.entrypoints import clash_message, import_named, named

METHODS_GROUP = "coevo.methods"
"""The entry-point group a plug-in package names its methods in (``[project.entry-points]``)."""

BUILTIN: Mapping[str, type[Any]] = {"grpo": Grpo, "empo2": Empo2, "complementary": Complementary}
"""coevo's own methods; their settings are the scenario's ``[empo2]`` and ``[complementary]``."""

_HOOKS = ("rollout", "shape", "score", "step_events", "loss", "actors")


def installed_methods() -> Mapping[str, str]:
    """Short names of the methods plug-in packages register, each with its import path (read
    once per process: :func:`engine.entrypoints.named`)."""
    return named(METHODS_GROUP).paths


class MethodOptionsInvalid(ValueError):
    """The scenario's ``[method]`` table does not suit the method (its keys and values)."""


def method_class(name_or_path: str) -> type[Any]:
    """The class of a built-in method, an installed one, or ``package.module:Class``.

    Raises:
        ValueError: unknown name, bad path, a module that fails to import, a missing class,
            a class lacking a hook of :class:`Method`, or a short name that installed
            packages register twice (or for a built-in too): which one is meant is unknown.
    """
    installed = named(METHODS_GROUP)
    if name_or_path not in (*installed.paths, *BUILTIN) and ":" not in name_or_path:
        installed = named(METHODS_GROUP, refresh=True)  # installed since the last read?
    if name_or_path in installed.clashes:
        raise ValueError(clash_message("method", name_or_path, installed.clashes[name_or_path]))
    if name_or_path in BUILTIN:
        if name_or_path in installed.paths:
            raise ValueError(
                f"method {name_or_path!r} is coevo's built-in, and an installed package "
                f"registers the name too ({installed.paths[name_or_path]}): rename that "
                "entry point, or uninstall the package (its method runs by its import path "
                "'package.module:Class' meanwhile)"
            )
        return BUILTIN[name_or_path]
    path = installed.paths.get(name_or_path, name_or_path)
    if ":" not in path:
        known = ", ".join(sorted({*BUILTIN, *installed.paths}))
        raise ValueError(
            f"unknown method {name_or_path!r}: use a built-in name ({known}) "
            "or an import path 'package.module:Class'"
        )
    cls = import_named(path, "method")
    if not isinstance(cls, type):
        module_name, _, cls_name = path.partition(":")
        raise ValueError(f"method module {module_name!r} has no class {cls_name!r}")
    missing = [h for h in _HOOKS if not callable(getattr(cls, h, None))]
    if missing:
        raise ValueError(f"{path} is not a Method (lacks {missing})")
    return cls


def option_defaults(name_or_path: str) -> dict[str, Any]:
    """A plug-in method's ``[method]`` options with their defaults (its ``Settings`` built
    with none); empty for a built-in, a method that takes none, or one that cannot be imported
    or built so (reading it must not fail a command that only compares runs)."""
    if name_or_path in BUILTIN:
        return {}
    try:
        struct = getattr(method_class(name_or_path), "Settings", None)
        if struct is None:
            return {}
        found = msgspec.to_builtins(msgspec.convert({}, struct))
    except KeyboardInterrupt:
        raise
    except BaseException:  # a plug-in's failure: no defaults known
        return {}
    return found if isinstance(found, dict) else {}


def build_method(
    name_or_path: str, grpo: GrpoConfig, settings: object = None, options: Mapping[str, Any] = {}
) -> Method:
    """Build a method: ``settings`` for a built-in (its scenario section), ``options`` (the
    scenario's ``[method]`` table) decoded into a plug-in's ``Settings``.

    Raises:
        ValueError: see :func:`method_class`, or options its ``Settings`` rejects.
    """
    cls = method_class(name_or_path)
    if name_or_path in BUILTIN and options:
        raise MethodOptionsInvalid(
            f"method {name_or_path!r} takes no [method] options (got {sorted(options)}): a "
            "built-in's settings are its own section, [grpo], [empo2] or [complementary]"
        )
    if name_or_path not in BUILTIN:
        struct = getattr(cls, "Settings", None)
        if struct is None:
            if options:
                raise MethodOptionsInvalid(
                    f"method {name_or_path!r} takes no options, got {dict(options)}"
                )
        else:
            try:
                settings = msgspec.convert(dict(options), struct)
            except msgspec.ValidationError as exc:  # its path as the scenario file's
                said = str(exc).replace("- at `$", "- at `$.method", 1)
                raise MethodOptionsInvalid(
                    f"bad options for method {name_or_path!r}: {said}"
                ) from None
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # Settings is not a Struct msgspec can fill
                raise ValueError(
                    f"method {name_or_path!r}: its Settings ({struct!r}) cannot take the options: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
    try:
        method = cls(grpo, settings)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a plug-in's constructor: one line, not a traceback
        raise ValueError(
            f"method {name_or_path!r} could not be built: {cls.__qualname__}(grpo, settings) "
            f"raised {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(method, Method):
        raise ValueError(f"method {name_or_path!r} does not implement Method")
    return method


def scenario_method(scenario: Any) -> Method:
    """The learning method a scenario names, with its settings: a built-in's own section
    (``[empo2]``, ``[complementary]``), a plug-in's ``[method]`` table. ``scenario`` is a
    :class:`scenarios.schema.Scenario` (typed there: :func:`scenarios.methods.method_of`); the
    agents read a run's stored scenario through this too.

    Raises:
        ValueError: see :func:`build_method` (a rollout names no method).
    """
    name = scenario.run.method
    sections: dict[str, object] = {"empo2": scenario.empo2, "complementary": scenario.complementary}
    return build_method(name, scenario.grpo, sections.get(name), scenario.method)


S = TypeVar("S", Empo2Config, ComplementaryConfig)


def method_settings(scenario: Any, kind: type[S]) -> S:
    """The EMPO2 or Complementary RL settings (``kind``) the scenario's method runs with: a
    plug-in built on that method (its ``Settings`` is ``kind`` or a subclass) takes them from
    its ``[method]`` table, as the run built it; any other method from the scenario's own
    section (``[empo2]``, ``[complementary]``: the built-in's settings, or their defaults).
    Whatever reads a method's settings outside the method (the models a run prepares, the
    audit's re-derivation, the probe's banks) reads them here, or a plug-in's run would be
    prepared and audited under the defaults."""
    struct = built_on(scenario, kind)
    if struct is not None:
        try:
            return msgspec.convert(dict(scenario.method), struct)
        except msgspec.ValidationError:  # its own error is said where the method is built
            pass
    return scenario.empo2 if kind is Empo2Config else scenario.complementary


def built_on(scenario: Any, kind: type[S]) -> type[S] | None:
    """The ``Settings`` of the scenario's method when it is a plug-in built on EMPO2 or
    Complementary RL (``kind``, or a subclass of it), else None (a built-in, another
    plug-in, or one that does not import here)."""
    name = scenario.run.method
    if name in BUILTIN or name == "rollout":
        return None
    try:
        struct = getattr(method_class(name), "Settings", None)
    except ValueError:
        return None
    return struct if isinstance(struct, type) and issubclass(struct, kind) else None


def import_run_method(log: Any) -> None:
    """Import the plug-in module of the method the run in ``log`` names, if it is one and can
    be imported (:func:`method_class`), so that the events its actors recorded decode (a
    reader process imports only what the ``coevo.events`` entry points name). A run of a
    built-in method: nothing; a module that is not on the path or fails: noted in
    :data:`UNIMPORTED` (reading such events then says their kind is unknown, and why).
    """
    import tomllib

    try:
        meta = log.read_meta()
        method = tomllib.loads(meta.scenario_toml).get("run", {}).get("method", "")
    except Exception:  # no metadata, a damaged scenario text: the log's own errors say so
        return
    if isinstance(method, str) and method not in BUILTIN and method != "rollout":
        try:
            method_class(method)
        except ValueError as exc:  # a plug-in that is not importable here
            UNIMPORTED[method] = str(exc)


UNIMPORTED: dict[str, str] = {}
"""The plug-in methods of runs read in this process whose module did not import, and why
(:func:`import_run_method`): an event kind the log cannot decode is most likely theirs."""


def unimported_note() -> str:
    """What to add to an "unknown event kind" error: the run's plug-in method that did not
    import here ("" when none)."""
    return "; ".join(
        f"the run's method {name!r} did not import here ({why}): put its module on PYTHONPATH"
        for name, why in UNIMPORTED.items()
    )
