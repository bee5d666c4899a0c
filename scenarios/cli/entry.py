"""Where the ``coevo`` process starts: the console script and ``python -m scenarios.cli``.

It imports nothing but ``sys``, ``signal`` and ``atexit`` (built in) before it guards against
a Ctrl-C and a SIGTERM: the command line's modules take a few hundred milliseconds to import,
and a stop then ends with one line and exit 130 (143 for SIGTERM) like a stop later on, not
with a traceback or a silent death. A SIGTERM is raised where the process is as
:class:`Terminated`, a kind of KeyboardInterrupt, so that every path that stops gracefully on
a Ctrl-C (closing the log, the run's closing report) does on a SIGTERM too; while a run's
actors run, the runtime turns both into a graceful stop itself (``engine.runtime``), and while
its event loop runs before or after them, a SIGTERM goes through trio's Ctrl-C handler, which
keeps it out of trio's own code (``scenarios.cli.drive``).
"""

from __future__ import annotations

import atexit
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["run"]


class Terminated(KeyboardInterrupt):
    """A SIGTERM, raised where the process is: stopped as a Ctrl-C is, and exit 143."""


class HungUp(Terminated):
    """A SIGHUP (the terminal or SSH session closed), stopped as a SIGTERM is: exit 129."""


def _terminate(signum: int, frame: object) -> NoReturn:
    raise HungUp if signum == signal.SIGHUP else Terminated


_exiting = False
"""Whether :func:`run` owns the process (it exits when the command returns)."""


def exits_after() -> bool:
    """Whether the process exits when the command returns (:func:`run`), rather than a
    program (a test, a notebook) going on after calling the command line's ``main``."""
    return _exiting


def _unraisable(unraisable: object) -> None:
    """A second stop signal that lands in a finaliser (a trio nursery's ``__del__``, an import
    lock's callback) while the first one's stop runs cannot be raised there: Python printed it
    as "Exception ignored in ..." with a traceback, and the command then stopped as the first
    signal asked. It is dropped; anything else is printed as Python does."""
    if isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt):
        return
    sys.__unraisablehook__(unraisable)  # pyright: ignore[reportArgumentType]


def run(argv: Sequence[str] | None = None) -> NoReturn:
    """Run the command line (:func:`scenarios.cli.commands.main`) and exit with its code."""
    global _exiting
    _exiting = True
    atexit.register(_ignore_stop_signals)  # first registered: the last to run
    code = 130
    sys.unraisablehook = _unraisable
    try:
        signal.signal(signal.SIGTERM, _terminate)
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # nohup: it stays ignored
            signal.signal(signal.SIGHUP, _terminate)
        if hidden := _hidden_package():
            print(f"coevo: error: {hidden}", file=sys.stderr)
            sys.exit(2)
        from scenarios.cli.commands import main

        code = main(argv)
    except KeyboardInterrupt as exc:
        code = stopped(exc)
    finally:
        for _ in range(3):  # a second Ctrl-C may land before interrupts are ignored: again
            try:
                ignore_interrupts()
                forget_escaped_interrupt()
                break
            except KeyboardInterrupt as exc:
                code = _exit_code(exc)
    if code in (129, 130, 143) and "ray" in sys.modules:
        _leave_now(code)
    _end_on_stop_signals(code)
    if "ray" not in sys.modules:  # Ray tears its own threads down
        _leave_leaked_threads(code)
    sys.exit(code)


OWN_PACKAGES = {"engine": "errors", "agents": "audit", "stores": "rundir"}
"""coevo's top-level packages besides ``scenarios`` (this one: were it hidden, this code would
not run), each with a module of its own that shows which package an import reaches (the
names of ``engine.entrypoints.COEVO_PACKAGES``, written again: this module imports nothing
of coevo's before it has checked them)."""


def _hidden_package() -> str:
    """Why one of :data:`OWN_PACKAGES` would not import as coevo's own: a module or a package
    of that name found first (a researcher's ``engine.py`` beside their rules, on
    ``PYTHONPATH``), whose import of coevo's modules then failed with a traceback. Empty when
    each imports from the directory beside ``scenarios``, or when coevo's modules are still
    reached through it (a directory without ``__init__.py`` of that name is a namespace
    Python looks past, and an editable install's import hook maps coevo's submodules)."""
    import importlib
    from importlib.util import find_spec
    from pathlib import Path

    home = Path(__file__).resolve().parents[2]
    for name, own in OWN_PACKAGES.items():
        try:
            spec = find_spec(name)
        except (ImportError, ValueError):  # a broken finder: let the import itself say
            continue
        if spec is None or spec.origin is None:  # not found (the import says), or a namespace
            continue
        places = list(spec.submodule_search_locations or ())
        if places and Path(places[0]).resolve() == (home / name).resolve():
            continue
        if places:  # a package elsewhere: an installed finder may still reach coevo's modules
            try:
                module = importlib.import_module(f"{name}.{own}")
                if Path(str(module.__file__)).resolve().is_relative_to((home / name).resolve()):
                    continue
            except (Exception, SystemExit):  # their package's own failure: it hides ours
                pass
        return (
            f"{name!r} here is {places[0] if places else spec.origin}, not coevo's {name} "
            f"package ({home / name}): a module or package by that name found first (one of "
            f"yours on PYTHONPATH or in the current directory, or another installed "
            f"distribution's) hides it; rename yours (coevo's top-level names are scenarios, "
            f"{', '.join(OWN_PACKAGES)})"
        )
    return ""


LEAKED_GRACE_S = 10.0
"""Seconds the command waits, once done, for threads that are not daemons and that its code
did not join (a plug-in world's ``threading.Thread``): the interpreter waits for them forever,
and a run that had said "exit 0" hung after it."""


def _leave_leaked_threads(code: int) -> None:
    """Exit with ``code`` without the interpreter's wait if threads that are not daemons are
    still running :data:`LEAKED_GRACE_S` after the command ended, naming them."""
    import threading
    import time

    main = threading.main_thread()
    alive = [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]
    deadline = time.monotonic() + LEAKED_GRACE_S
    for t in alive:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [t for t in alive if t.is_alive()]
    if alive:
        names = ", ".join(t.name for t in alive[:5]) + (", ..." if len(alive) > 5 else "")
        print(
            f"coevo: note: {len(alive)} thread{'s' * (len(alive) != 1)} that the run's code "
            f"started (a plug-in's?) still running {LEAKED_GRACE_S:g} s after the command "
            f"ended ({names}): not waiting for {'them' if len(alive) != 1 else 'it'}",
            file=sys.stderr,
        )
        _leave_now(code)


def _end_on_stop_signals(code: int) -> None:
    """From here the command is done and the interpreter tears down (a learner's process
    joined, torch's threads): a SIGTERM or SIGHUP now ends the process at once with the
    command's own ``code``, as a Ctrl-C (ignored) leaves it. The default action ended it by the
    signal, silently (exit -15) after a run had completed and written its curves."""

    def leave(signum: int, frame: object) -> None:
        _leave_now(code)

    signal.signal(signal.SIGTERM, leave)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, leave)


def _ignore_stop_signals() -> None:
    """The last exit function (:func:`run` registers it before anything else can): past the
    exit functions the interpreter resets a Python signal handler to the default action (one
    that ignores it stays) and then clears its modules, the long part with torch loaded, so a
    SIGTERM there still ended a finished command by the signal (exit -15). Ignored from here,
    the process ends with the command's code; during the exit functions before this one (a
    learner's process joined) :func:`_end_on_stop_signals`'s handler still ends it at once."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _leave_now(code: int) -> NoReturn:
    """Exit a command stopped by a signal without the interpreter's teardown, once the log
    lines and the output are flushed: a Ctrl-C that lands while Ray starts leaves its core
    worker half up, and the teardown then crashed the process (exit 139, a segmentation
    fault, after ``coevo: interrupted``). Everything of the run is closed by then (the stop
    unwound through every ``finally``)."""
    import logging
    import os

    try:  # noqa: SIM105 - this module imports only sys, signal, atexit
        logging.shutdown()
    except Exception:  # in a signal handler that interrupted a log line being written
        pass
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - this module imports only sys, signal, atexit
            stream.flush()
        except (OSError, ValueError, RuntimeError):  # closed, its reader gone, or reentrant
            pass
    os._exit(code)


def _exit_code(exc: KeyboardInterrupt) -> int:
    if isinstance(exc, HungUp):
        return 129
    return 143 if isinstance(exc, Terminated) else 130


def stopped(exc: KeyboardInterrupt) -> int:
    """Say that the command was stopped (a Ctrl-C or a SIGTERM), and return its exit code."""
    ignore_interrupts()
    said = "interrupted"
    if isinstance(exc, Terminated):
        said = "hung up (SIGHUP)" if isinstance(exc, HungUp) else "terminated"
    try:  # noqa: SIM105 - this module imports only sys, signal, atexit
        print(f"coevo: {said}", file=sys.stderr)
    except OSError:  # the terminal that hung up is gone
        pass
    return _exit_code(exc)


def ignore_interrupts() -> None:
    """The process is exiting: a second Ctrl-C (a double press) changes nothing, and must not
    land as a traceback in what is left to do; a second SIGTERM ends it at once (a teardown
    that hangs)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


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
