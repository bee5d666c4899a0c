"""``python -m scenarios.cli ARGS``: the ``coevo`` command line."""

from scenarios.cli.entry import run

run()
