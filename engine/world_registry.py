"""Finding a world by name: the built-in ones by short name, any other by import path.

A scenario names its world either by a built-in name (``"minilab"``) or by an import path
``"package.module:Class"``; :func:`load_world` imports and constructs it with the scenario's
options. Every way this can go wrong is a one-line ``ValueError`` naming the world.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Mapping
from typing import cast

from engine.entrypoints import clash_message, named, unreadable
from engine.world import ExtraMissing, TextWorld

WORLDS_GROUP = "coevo.worlds"
"""The entry-point group that names worlds by a short name (pyproject.toml): coevo's own
(``minilab``, ``scienceworld``, ``textworld``, in ``scenarios/worlds/``) and any a plug-in
package registers. ``scienceworld`` and ``textworld`` need the extras of the same names
(``pip install -e '.[scienceworld]'``); their modules import nothing heavy until a world is
built."""


def builtin_worlds(refresh: bool = False) -> Mapping[str, str]:
    """Short names of the installed worlds, each with its ``package.module:Class``; read once
    per process, again with ``refresh`` (:func:`load_world` refreshes on a name it lacks, so
    a plug-in installed while the process runs is found)."""
    return dict(named(WORLDS_GROUP, refresh).paths)


class WorldOptionsInvalid(ValueError):
    """The world's constructor rejected the scenario's ``[world.options]`` (a ``ValueError`` like
    every other failure of :func:`load_world`; the scenario error names ``$.world.options``)."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _resolve(name_or_path: str) -> tuple[str, str]:
    """``(module, class name)`` for a built-in name or an import path.

    Raises:
        ValueError: neither a built-in name nor a well-formed ``package.module:Class``, or
            a name that installed packages register for different classes.
    """
    installed = named(WORLDS_GROUP)
    if name_or_path not in installed.paths and ":" not in name_or_path:
        installed = named(WORLDS_GROUP, refresh=True)
    if name_or_path in installed.clashes:
        raise ValueError(clash_message("world", name_or_path, installed.clashes[name_or_path]))
    known_worlds = installed.paths
    path = known_worlds.get(name_or_path, name_or_path)
    if ":" not in path:
        known = ", ".join(sorted(known_worlds))
        raise ValueError(
            f"unknown world {name_or_path!r}: use a built-in name ({known}) "
            "or an import path 'package.module:Class'"
        )
    module, _, cls = path.partition(":")
    if not all(part.isidentifier() for part in module.split(".")) or not cls.isidentifier():
        raise ValueError(f"bad world import path {path!r}: expected 'package.module:Class'")
    return module, cls


_WORLD_METHODS = ("families", "tasks", "reset", "step", "close")


def path_of(module: str, cls: str) -> str:
    """``module:Class`` as written in scenario files."""
    return f"{module}:{cls}"


def option_defaults(name_or_path: str) -> dict[str, object]:
    """The world's options a scenario may leave out, with their defaults: its constructor's
    keyword parameters whose default is a TOML value (None, which TOML cannot write, and
    objects left out). Empty for a world that cannot be imported or read (reading it must not
    fail a command that only compares runs)."""
    try:
        module_name, cls_name = _resolve(name_or_path)
        cls = getattr(importlib.import_module(module_name), cls_name)
        params = inspect.signature(cls).parameters.values()
    except (Exception, SystemExit):  # a plug-in's failure: no defaults known
        return {}
    found: dict[str, object] = {}
    for p in params:
        default: object = p.default
        if p.kind not in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) or default is p.empty:
            continue
        if isinstance(default, tuple):  # TOML gives a list
            default = list(cast("tuple[object, ...]", default))
        if isinstance(default, bool | int | float | str | list | dict):
            found[p.name] = default
    return found


def load_world(name_or_path: str, options: Mapping[str, object]) -> TextWorld:
    """Import and construct a world.

    Args:
        name_or_path: a key of :func:`builtin_worlds` or ``"package.module:Class"``.
        options: keyword arguments for the world's constructor.

    Returns:
        The constructed world.

    Raises:
        WorldOptionsInvalid: the constructor does not take ``options`` (they do not bind to
            its signature), or refused them with a ValueError.
        ValueError: unknown name, bad import path, module that cannot be imported, missing
            class, a missing optional extra, a constructor failing otherwise (a TypeError
            raised inside it included), or an object that is not a TextWorld.
    """
    module_name, cls_name = _resolve(name_or_path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        shut = unreadable(module_name) if isinstance(exc, ModuleNotFoundError) else ""
        hint = f" ({shut} may not be read by this user)" if shut else ""
        raise ValueError(
            f"cannot import world module {module_name!r}: {_one_line(exc)}{hint}"
        ) from exc
    except SystemExit as exc:  # a plug-in's sys.exit() must not end coevo
        raise ValueError(
            f"world module {module_name!r} called sys.exit({exc.code!r}) while importing"
        ) from None
    except Exception as exc:  # a plug-in's own failure at import: reported, never a traceback
        raise ValueError(
            f"world module {module_name!r} failed to import: {type(exc).__name__}: {_one_line(exc)}"
        ) from exc
    cls = getattr(module, cls_name, None)
    if cls is None and (shut := unreadable(module_name)):  # imported as an empty namespace
        raise ValueError(
            f"cannot import world module {module_name!r}: {shut} may not be read by this user"
        )
    if cls is None:
        raise ValueError(f"world module {module_name!r} has no class {cls_name!r}")
    if not isinstance(cls, type):
        raise ValueError(
            f"{path_of(module_name, cls_name)} is a {type(cls).__name__}, not a class (a world "
            "is named by its class)"
        )
    missing = [m for m in _WORLD_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"{path_of(module_name, cls_name)} is not a TextWorld (lacks {missing})")
    try:
        inspect.signature(cls).bind(**dict(options))
    except TypeError as exc:  # an option the constructor does not take, or one missing
        raise WorldOptionsInvalid(
            f"bad options for world {name_or_path!r}: {_one_line(exc)}"
        ) from exc
    except ValueError:  # no signature to read (a class implemented in C): the call tells
        pass
    try:
        world = cls(**dict(options))
    except ExtraMissing as exc:
        raise ValueError(f"world {name_or_path!r} is not available: {_one_line(exc)}") from exc
    except ValueError as exc:  # the contract: a constructor refuses an option value so
        if not options:  # none given: its own failure, not a refusal of one
            raise ValueError(
                f"world {name_or_path!r} failed to start: ValueError: {_one_line(exc)}"
            ) from exc
        raise WorldOptionsInvalid(
            f"bad options for world {name_or_path!r}: {_one_line(exc)}"
        ) from exc
    except SystemExit as exc:  # a plug-in's sys.exit() must not end coevo
        raise ValueError(
            f"world {name_or_path!r} called sys.exit({exc.code!r}) while starting"
        ) from None
    except Exception as exc:  # a plug-in's own failure: reported, never a traceback
        raise ValueError(
            f"world {name_or_path!r} failed to start: {type(exc).__name__}: {_one_line(exc)}"
        ) from exc
    except BaseException as exc:  # a BaseException of its own, or a KeyboardInterrupt
        if isinstance(exc, KeyboardInterrupt) and threading.current_thread() is (
            threading.main_thread()
        ):
            raise  # on the main thread it may be the user's Ctrl-C
        said = " ".join(str(exc).split())
        raise ValueError(  # in a thread, where no signal lands: the constructor's own
            f"world {name_or_path!r} failed to start: raised {type(exc).__name__}"
            + (f": {said}" if said else "")
        ) from None
    _check_name(world, name_or_path)
    if not isinstance(world, TextWorld):
        raise ValueError(f"world {name_or_path!r} does not implement TextWorld")
    return world


def _check_name(world: object, name_or_path: str) -> None:
    """A world's ``name`` must be a string (it is read in messages, and by the TextWorld check).

    Raises:
        ValueError: reading it raised, or it is not a string.
    """
    try:
        name: object = getattr(world, "name")  # noqa: B009 (an AttributeError is told apart)
    except AttributeError as exc:  # no name at all, or a property of its class that raised it
        if not any("name" in vars(cls) for cls in type(world).__mro__):
            name = None
        else:
            raise ValueError(
                f"world {name_or_path!r}: reading its name raised AttributeError: {_one_line(exc)}"
            ) from exc
    except Exception as exc:  # a plug-in's property raising: reported, never a traceback
        raise ValueError(
            f"world {name_or_path!r}: reading its name raised {type(exc).__name__}: "
            f"{_one_line(exc)}"
        ) from exc
    if not isinstance(name, str):
        raise ValueError(
            f'world {name_or_path!r}: its name is {name!r}, not a string (set name = "...")'
        )


def close_world(world: TextWorld) -> str:
    """Close ``world``; what went wrong, or "" (a world that fails to close is dropped all the
    same: its caller builds another or ends)."""
    try:
        world.close()
    except SystemExit as exc:  # a plug-in's sys.exit() must not end coevo
        return f"world.close called sys.exit({exc.code!r})"
    except Exception as exc:  # reported by the caller; the world is not used again
        return f"world.close raised {type(exc).__name__}: {_one_line(exc)}"
    return ""
