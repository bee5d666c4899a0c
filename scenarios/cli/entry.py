"""Where the ``coevo`` process starts: the console script and ``python -m scenarios.cli``.

It imports nothing but ``sys`` before it guards against a Ctrl-C: the command line's modules
take a few hundred milliseconds to import, and an interrupt then ends with one line and exit
130 like an interrupt later on, not with a traceback.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["run"]


def run(argv: Sequence[str] | None = None) -> NoReturn:
    """Run the command line (:func:`scenarios.cli.commands.main`) and exit with its code."""
    code = 130
    try:
        from scenarios.cli.commands import main

        code = main(argv)
    except KeyboardInterrupt:
        ignore_interrupts()
        print("coevo: interrupted", file=sys.stderr)
    finally:
        for _ in range(3):  # a second Ctrl-C may land before interrupts are ignored: again
            try:
                ignore_interrupts()
                forget_escaped_interrupt()
                break
            except KeyboardInterrupt:
                code = 130
    sys.exit(code)


def ignore_interrupts() -> None:
    """The process is exiting: a second Ctrl-C (a double press) changes nothing, and must not
    land as a traceback in what is left to do."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def forget_escaped_interrupt() -> None:
    """Clear CPython's mark of a KeyboardInterrupt that escaped an ``exec`` or ``eval``.

    CPython (3.11, checked) marks a KeyboardInterrupt that escapes the evaluation of
    a string as unhandled even when a caller catches it, and under ``python -m`` it then ends
    the process by SIGINT (exit -2) whatever exit code the program chose. ``dataclasses`` and
    ``collections.namedtuple`` build their methods from strings, so a Ctrl-C while modules
    import lands there often: a graceful stop printed ``coevo: interrupted`` and still ended
    with -2 (5 times in about 45 SIGINTs during start-up, 2026-12-02). Evaluating a string
    resets the mark.
    """
    exec("")
