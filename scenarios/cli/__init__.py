"""The ``coevo`` command line, at the top of the stack: it reads scenario files, assembles them
into actors (:mod:`scenarios.assemble`) and runs them on the engine; it reads finished runs with
the agents' audit, report and probe tools. ``python -m scenarios.cli`` runs it too."""

from scenarios.cli.main import main

__all__ = ["main"]
