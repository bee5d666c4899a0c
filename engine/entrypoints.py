"""Plug-ins found by short name: the entry points of one group (``coevo.worlds``,
``coevo.methods``), with a name that installed packages register twice, for different classes,
refused rather than one of them taken in silence.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import EntryPoint, entry_points
from typing import NamedTuple


class Named(NamedTuple):
    """The short names of one entry-point group."""

    paths: dict[str, str]
    """Each name with the ``package.module:Class`` it names (one of them for a clash)."""
    clashes: dict[str, list[str]]
    """Each name registered for several different classes, with every registration
    (``package.module:Class`` (distribution))."""


def _dist(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", None) or "an unknown package"


_read: dict[str, Named] = {}
"""Each group as last read. Reading the installed packages' entry points takes 5-50 ms (every
distribution's metadata; longer while other threads run), and a run builds a world per worker:
reading them once took a 32-worker, 32-episode quickstart rollout from 5.51 to 5.10 s (medians
of 5 interleaved runs, 2026-12-02)."""


def named(group: str, refresh: bool = False) -> Named:
    """The entry points of ``group`` by name, read once per process and again with
    ``refresh`` (a caller refreshes on a name it lacks, so a plug-in installed while the
    process runs is found). One package seen twice (an editable install next to its metadata)
    is one registration: only different classes clash."""
    if refresh or group not in _read:
        _read[group] = _scan(group)
    return _read[group]


def _scan(group: str) -> Named:
    found: dict[str, dict[str, str]] = {}
    for ep in entry_points(group=group):
        found.setdefault(ep.name, {}).setdefault(ep.value, _dist(ep))
    paths = {name: next(iter(values)) for name, values in found.items()}
    clashes = {
        name: [f"{path} ({dist})" for path, dist in values.items()]
        for name, values in found.items()
        if len(values) > 1
    }
    return Named(paths, clashes)


def clash_message(kind: str, name: str, registrations: list[str]) -> str:
    """One line refusing ``name``, which several installed packages register."""
    return (
        f"{kind} {name!r} is registered by several installed packages: "
        f"{'; '.join(registrations)}; name the one meant by its import path "
        "'package.module:Class', or uninstall or rename the other"
    )


COEVO_PACKAGES = frozenset({"agents", "engine", "scenarios", "stores"})
"""coevo's own top-level packages: a researcher's module of one of these names is not the one
imported (``scenarios.cli.entry.OWN_PACKAGES``, which must not import this module, refuses a
command whose imports it would break)."""


def import_named(path: str, kind: str, what: str = "class") -> object:
    """The object ``package.module:Name`` names (a plug-in's method class, a credit rule).

    Args:
        kind: what it is, for the messages ("method", "credit rule").
        what: what ``Name`` should be ("class", "function").

    Raises:
        ValueError: a malformed path, a module that fails to import (its exception, or its
            ``sys.exit``, in one line), or no such name in it.
    """
    module_name, _, name = path.partition(":")
    if not all(p.isidentifier() for p in module_name.split(".")) or not name.isidentifier():
        raise ValueError(
            f"bad {kind} import path {path!r}: expected 'package.module:{what.title()}'"
        )
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # a plug-in's failure at import: one line
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and module_name.endswith(".py"):
            hint = f" (a module's name, not its file: '{module_name[:-3]}:{name}')"
        elif isinstance(exc, ModuleNotFoundError) and exc.name == module_name.partition(".")[0]:
            hint = (  # the coevo script, unlike python -m, does not search where it runs
                f" (is its directory on PYTHONPATH? {_cwd_note()})"
            )
        if isinstance(exc, ModuleNotFoundError) and (shut := unreadable(module_name)):
            hint = f" ({shut} may not be read by this user)"
        raise ValueError(
            f"cannot import {kind} module {module_name!r}: {type(exc).__name__}: {exc}{hint}"
        ) from exc
    found = getattr(module, name, None)
    if found is None and (shut := unreadable(module_name)):  # imported as an empty namespace
        raise ValueError(
            f"cannot import {kind} module {module_name!r}: {shut} may not be read by this user"
        )
    if found is None:
        own = (  # the researcher's engine.py, behind coevo's engine package
            f" ({module_name!r} is coevo's own package, at "
            f"{next(iter(getattr(module, '__path__', ())), '?')}: a module of yours by that "
            "name is never the one imported; rename it)"
            if module_name in COEVO_PACKAGES
            else ""
        )
        raise ValueError(f"{kind} module {module_name!r} has no {what} {name!r}{own}")
    return found


def unreadable(module_name: str) -> str:
    """The first directory of ``module_name``'s packages on the search path that this user may
    not list or enter, "" when none: Python reads such a package as missing, or as an empty
    namespace package (its module then "has no class")."""
    parts = module_name.split(".")
    for entry in sys.path:
        base = entry or os.curdir
        if entry and os.path.exists(entry) and not os.access(entry, os.R_OK | os.X_OK):
            return entry  # a search-path directory itself (its packages cannot be seen)
        for depth in range(1, len(parts) + 1):
            there = os.path.join(base, *parts[:depth])
            if not os.path.isdir(there):
                break
            if not os.access(there, os.R_OK | os.X_OK):
                return there
    return ""


def _cwd_note() -> str:
    """Whether the current directory is searched for modules, said for an import hint."""
    try:
        here = os.getcwd()
    except OSError:  # deleted under us
        here = ""
    if "" in sys.path or (here and here in sys.path):
        return "the current directory is searched"
    return "the current directory is not searched: PYTHONPATH=. adds it"
