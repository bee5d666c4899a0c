"""The ``coevo`` command line, at the top of the stack: it reads scenario files, assembles them
into actors (:mod:`scenarios.assemble`) and runs them on the engine; it reads finished runs with
the agents' audit, report and probe tools. ``python -m scenarios.cli`` runs it too.

The package imports nothing itself: ``python -m scenarios.cli`` imports it before its entry
(:mod:`scenarios.cli.entry`) can turn a Ctrl-C into one line and exit 130, so the command
line's modules load on the first use of :func:`main`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scenarios.cli.commands import main

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    if name == "main":
        from scenarios.cli.commands import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
