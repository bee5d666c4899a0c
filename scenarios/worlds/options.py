"""Checks for world options shared by the adapters of real environments.

Each check returns the value in its canonical type or raises a one-line ``ValueError`` naming the
option, which :func:`engine.world_registry.load_world` turns into a scenario error.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from engine.world import ExtraMissing as ExtraMissing  # its home before the world interface moved


def check_int(name: str, value: object, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``.

    Raises:
        ValueError: not an int (bools are refused) or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value


def check_float(name: str, value: object, low: float, high: float) -> float:
    """``value`` as a float in ``[low, high]`` (ints accepted).

    Raises:
        ValueError: not a number or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low:g} and {high:g}, got {value:g}")
    return float(value)


def check_bool(name: str, value: object) -> bool:
    """``value`` as a bool.

    Raises:
        ValueError: not a bool.
    """
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """``value`` as one of ``choices``.

    Raises:
        ValueError: not one of them.
    """
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    assert isinstance(value, str)
    return value


def check_names(name: str, value: object) -> tuple[str, ...]:
    """``value`` as a non-empty tuple of distinct strings.

    Raises:
        ValueError: not a list or tuple of strings, empty, or with repeats.
    """
    items = cast("Sequence[object]", value) if isinstance(value, list | tuple) else None
    if items is None or not all(isinstance(v, str) for v in items):
        raise ValueError(f"{name} must be a list of names, got {value!r}")
    names = tuple(str(v) for v in items)
    if not names:
        raise ValueError(f"{name} must not be empty")
    if len(set(names)) != len(names):
        raise ValueError(f"{name} must not repeat a name, got {list(names)!r}")
    return names


def cache_root() -> Path:
    """``$COEVO_CACHE``, else ``~/.cache/coevo`` (where generated games are kept)."""
    return Path(os.environ.get("COEVO_CACHE") or Path.home() / ".cache" / "coevo")


def import_extra(module: str, extra: str) -> Any:
    """Import the third-party package behind an optional extra.

    Args:
        module: the package to import (``"scienceworld"``).
        extra: the name of coevo's extra that installs it.

    Returns:
        The module, typed ``Any``: the third-party packages behind the extras have no type
        information, and their use stays inside the adapters.

    Raises:
        ExtraMissing: the package is not installed; the message says how to install it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ExtraMissing(
            f"the {module!r} package is not installed ({exc}); install coevo with the extra: "
            f"pip install 'coevo[{extra}]' (in a checkout: pip install -e '.[{extra}]')"
        ) from None
