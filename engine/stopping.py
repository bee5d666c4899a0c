"""How a run stops at a signal: SIGINT, SIGTERM and SIGHUP handed to the event loop
(:func:`stop_signals`), the exit code each ends with, and the process ended where it is when the
loop cannot take a signal or a graceful stop does not end (:func:`stop_where_it_is`).

The runtime (:mod:`engine.runtime`) installs the handlers while its actors run and begins a
graceful stop when the loop takes the first signal.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

import trio

__all__ = [
    "LOOP_BLOCKED",
    "SIGNAL_EXIT",
    "STOP_NOTICE_EVERY_S",
    "STOP_NOTICE_S",
    "stop_signals",
    "stop_where_it_is",
]

SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a run gracefully: a Ctrl-C, a kill, a terminal or SSH session that
closes (SIGHUP, unless the process ignores it: ``nohup``)."""
STOP_NOTICE_S = 5.0
"""Seconds a stop may wait on actors still running (an update in a thread, a world's close)
before the runtime says which, and again every :data:`STOP_NOTICE_EVERY_S`."""
STOP_NOTICE_EVERY_S = 30.0

LOOP_BLOCKED = 1.0
"""Seconds a stop signal may wait for the event loop before another one counts it blocked."""


def _restore(previous: dict[signal.Signals, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _pass_on(signum: int, frame: Any, previous: dict[signal.Signals, Any]) -> None:
    """Handle ``signum`` as the handler before the run's would have: call it, or (the
    default action) restore it and raise the signal again."""
    before = previous.get(signal.Signals(signum), signal.SIG_DFL)
    if callable(before):
        before(signum, frame)
        return
    if before is signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


def stop_where_it_is(signum: int, stopping: bool = False, waiting_on: Sequence[str] = ()) -> None:
    """End the process now, as a SIGKILL would (every commit stays; nothing after it is
    written), with one line: the event loop is blocked, so nothing graceful can run, or
    (``stopping``) the graceful stop the first signal began has not ended in a second (still
    ``waiting_on`` those actors, when known)."""
    sig = signal.Signals(signum)
    on = f"still waiting on {', '.join(waiting_on)}" if waiting_on else "a world call that hangs?"
    why = (
        f" while the run stops ({LOOP_BLOCKED:g} s or more since the first: {on})"
        if stopping
        else f", and the event loop has not run since the first ({LOOP_BLOCKED:g} s or more: "
        "an actor's code holds it, a world stepped on the loop that hangs or a plug-in's own?)"
    )
    os.write(
        2,
        f"coevo: {sig.name} again{why}: stopped where it was; the log keeps every commit "
        "(coevo resume continues the run)\n".encode(),
    )
    os._exit(SIGNAL_EXIT.get(sig, 1))


@contextlib.contextmanager
def stop_signals(
    arrived: Callable[[], None],
    take: Callable[[int], None],
    waiting_on: Callable[[], Sequence[str]],
) -> Generator[trio.MemoryReceiveChannel[int]]:
    """SIGINT, SIGTERM and SIGHUP handed to the event loop while the block runs: each one
    calls ``arrived`` in the handler, then ``take`` on the loop; the channel yielded receives
    each signal taken.

    Installed before any actor runs (a world stepped on the loop may block it before a
    watching task is first scheduled). A signal that arrives while an earlier one has waited
    :data:`LOOP_BLOCKED` seconds for the loop (blocked: such a world that hangs, on every
    worker in turn) ends the process where it is, as a SIGKILL would, with one line and
    exit 130 or 143: what was committed stays, and ``coevo resume`` continues the run. So
    does a signal that arrives that long after the loop took the first (the stop waits on
    something, ``waiting_on`` names what: a world's ``close``); one sooner (a double Ctrl-C)
    goes where it went before the run. A signal the process ignores stays ignored.
    """
    token = trio.lowlevel.current_trio_token()
    send, signals = trio.open_memory_channel[int](math.inf)
    waiting: list[float] = []  # when each signal the loop has not taken yet arrived
    taken: list[float] = []  # when the loop took the first: the stop began

    def on_loop(signum: int) -> None:  # the stop begins
        waiting.clear()
        taken.append(time.monotonic())
        take(signum)
        send.send_nowait(signum)

    def handler(signum: int, frame: Any) -> None:
        arrived()
        now = time.monotonic()
        if taken:  # a second signal: soon after the first, it goes where it went before
            if now - taken[0] >= LOOP_BLOCKED:  # (a double Ctrl-C); later, the stop is
                stop_where_it_is(signum, True, waiting_on())  # slow: ends here
            _pass_on(signum, frame, previous)
            return
        if waiting and now - waiting[0] >= LOOP_BLOCKED:
            stop_where_it_is(signum)
        waiting.append(now)
        token.run_sync_soon(on_loop, signum)

    previous = {
        sig: signal.signal(sig, handler)
        for sig in _STOPPING
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield signals
    finally:
        _restore(previous)
