"""A run driven over its log, new (``coevo run``) or resumed (``coevo resume``): its actors
run under trio, a stop outside the runtime's own handling and the operating system's refusals
met as one line each, then its tables and how it ended (:mod:`scenarios.cli.finish`).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio
from rich.console import Console

from agents.audit.shown import pasteable, safe_line
from engine.errors import CoevoError
from scenarios.cli.common import TOO_MANY_FILES
from scenarios.cli.entry import stopped
from scenarios.cli.finish import finish, how_it_ended, verdict
from stores.rundir import RunDir, path_identity

__all__ = ["OutOfResources", "TrackerNotStarted", "drive"]


class TrackerNotStarted(CoevoError):
    """A tracking sink could not start, so the run did not: its log holds no event (exit 2)."""

    exit_code = 2


def drive(
    scenario: Any,
    assembly: Any,
    log: Any,
    rd: RunDir,
    started: Any,
    home: tuple[int, int] | None,
    *,
    quiet: bool,
    resumed: Any = None,
    history: Sequence[Any] = (),
) -> int:
    """Run the assembled actors over ``log`` (new or resumed), then print the summary. The
    caller has joined the scenario's cluster (``scenarios.assemble.cluster``); ``home`` is the
    run directory's :func:`path_identity` when the caller opened the log in it (taken here
    instead, a move between the two went unseen)."""
    from engine.runtime import Runtime
    from scenarios.cli.console import RunProgress, actors_table, families_table
    from scenarios.cli.logsetup import close_logging, configure_logging

    console = Console(stderr=True, quiet=quiet, markup=False)  # "[b]" in a path is text
    configure_logging(console, scenario.logging.level, rd.structlog)
    progress = RunProgress(console, assembly.episodes, enabled=scenario.logging.progress)
    progress.resume(history)
    from agents.tracking.sinks import SinkUnavailable

    try:
        tracker = assembly.tracking(history) if assembly.tracking is not None else None
    except BaseException as exc:
        log.close()
        close_logging()
        if isinstance(exc, SinkUnavailable):
            raise TrackerNotStarted(str(exc)) from exc
        raise
    runtime = Runtime(
        log,
        started,
        assembly.specs,
        assembly.projections,
        seed=scenario.seed,
        config=assembly.config,
        observers=[progress.observe, *([tracker.observe] if tracker is not None else [])],
        resumed=resumed,
        history=history,
        verdict=verdict,
    )
    run_id = started.run_id
    verb = f"resumed after seq {resumed.after}" if resumed is not None else scenario.name
    console.print(safe_line(f"run {run_id}: {verb} -> {rd.root}"))
    try:
        try:
            with progress:
                outcome = _run_loop(runtime, rd)
        finally:
            log.close()
            try:
                if tracker is not None:
                    tracker.close()
            finally:
                close_logging()
        console.print(actors_table(runtime.states["actor_stats"]))
        console.print(families_table(runtime.states["episodes"]))
        moved = path_identity(rd.root) != home
        return finish(
            console,
            None if moved else assembly.report,
            runtime.states["episodes"],
            outcome,
            run_id,
            rd,
            quiet,
            moved=moved,
            curves=assembly.report is not None,
        )
    except KeyboardInterrupt as exc:  # outside the runtime's own handling: its start or end
        code = stopped(exc)
        print(how_it_ended(rd, run_id, assembly.report is not None), file=sys.stderr)
        return code


class OutOfResources(CoevoError):
    """The process ran out of what its event loop needs (open files, threads, memory): the run
    stopped, and its log keeps every commit."""


def _run_loop(runtime: Any, rd: RunDir) -> Any:
    """``trio.run(runtime.run)``, with the operating system refusing the loop what it needs
    (a socket pair under a low ``ulimit -n``, a thread under a memory limit) as one line.

    Raises:
        OutOfResources: naming the limit and how the run goes on.
    """
    import errno

    again = f"the log keeps every commit: `coevo resume {pasteable(rd.root)}` continues the run"
    try:
        return _trio_run_stoppable(runtime.run)
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            why = TOO_MANY_FILES
        elif exc.errno == errno.ENOMEM:
            why = "out of memory"
        else:
            raise
        raise OutOfResources(f"the run stopped: {why} ({exc}); {again}") from None
    except RuntimeError as exc:
        if "can't start new thread" not in str(exc):
            raise
        raise OutOfResources(
            f"the run stopped: the process cannot start another thread (a memory or process "
            f"limit: ulimit -v, ulimit -u); {again}"
        ) from None
    except MemoryError:
        raise OutOfResources(f"the run stopped: out of memory; {again}") from None


def _trio_run_stoppable(run: Callable[[], Awaitable[Any]]) -> Any:
    """``trio.run(run)``, a SIGTERM or SIGHUP outside the runtime's own handling (before the
    actors start, after they end) delivered as trio delivers a Ctrl-C and raised from here
    as :class:`~scenarios.cli.entry.Terminated` (or ``HungUp``).

    The command line's handler raises ``Terminated`` wherever the process is: in trio's own
    teardown (a SIGTERM as a run completed), that left the loop waiting for ever on nothing.
    Trio holds a ``KeyboardInterrupt`` off its internals (it raises it in the main task at
    its next checkpoint, or from ``trio.run`` once the run has ended), for its own SIGINT
    handler only, which these signals go through here.
    """
    import signal

    from scenarios.cli.entry import HungUp, Terminated

    others = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) != signal.SIG_IGN]
    saved = {s: signal.getsignal(s) for s in others}
    before = signal.getsignal(signal.SIGINT)
    late: list[int] = []

    async def main() -> Any:
        trio_ki = signal.getsignal(signal.SIGINT)
        if trio_ki is not before and callable(trio_ki):  # trio's own, installed by trio.run

            def as_interrupt(signum: int, frame: Any) -> None:
                late.append(signum)
                trio_ki(signal.SIGINT, frame)

            for sig in others:
                signal.signal(sig, as_interrupt)
        return await run()

    try:
        return trio.run(main)
    except KeyboardInterrupt:
        if late:
            raise (HungUp if late[-1] == signal.SIGHUP else Terminated)() from None
        raise
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
