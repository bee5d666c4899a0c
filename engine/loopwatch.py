"""A warning when something blocks the event loop: every actor of a run shares one trio
thread, so a hook that computes for a minute inside it (a plug-in's ``score``, a world's
``step`` called without ``ctx.to_thread``) stops every other actor, the log's writer included,
and the run looked hung without a word.

A trio instrument marks where each turn of the scheduler begins and ends (it waits for I/O
once per turn, for no time when tasks are ready); a watching thread reads the marks. A turn
that has run longer than the threshold, not waiting, is a task that has not yielded: the thread
logs where the loop's thread is at that moment, once per stall, and how long the stall lasted
once the loop turns again. The loop's own cost is two calls per turn (no difference measured
on 100,000 events through the runtime, 7 interleaved rounds); waiting for I/O (actors idle
while a model trains in a thread) is never a stall.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import trio

_SKIPPED = tuple(
    os.path.join(d, "") for d in (str(Path(trio.__file__).parent), sysconfig.get_paths()["stdlib"])
)
"""Frames not worth naming: the scheduler's, and the standard library's (a ``time.sleep`` or a
``socket.recv`` is named by the caller that made it)."""
_LIBRARIES = tuple({os.path.join(sysconfig.get_paths()[k], "") for k in ("purelib", "platlib")})


def where(frame: FrameType | None) -> str:
    """``file:line in function`` of the innermost frame worth naming, and of its innermost
    caller outside the installed libraries when that is another (a plug-in calling into
    torch)."""
    named = frame
    while named is not None and named.f_code.co_filename.startswith(_SKIPPED):
        named = named.f_back
    if named is None:
        return _frame(frame) if frame is not None else "unknown"
    caller = named
    while caller is not None and caller.f_code.co_filename.startswith(_LIBRARIES):
        caller = caller.f_back
    if caller is None or caller is named:
        return _frame(named)
    return f"{_frame(named)}, called from {_frame(caller)}"


def _frame(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_qualname}"


class LoopWatch(trio.abc.Instrument):
    """Watches the trio loop of the thread that :meth:`start` is called on (inside
    ``trio.run``) until :meth:`stop`.

    Args:
        threshold: seconds a turn of the scheduler may run before it is reported.
        log: a structlog logger (``warning(message, **fields)``).
    """

    def __init__(self, threshold: float, log: Any) -> None:
        self.threshold = threshold
        self._log = log
        self._turned = time.monotonic()
        self._waiting = False
        self._done = threading.Event()
        self._loop_thread = 0
        self._thread: threading.Thread | None = None

    def before_io_wait(self, timeout: float) -> None:
        self._turned = time.monotonic()  # the turn's tasks have all yielded
        self._waiting = True

    def after_io_wait(self, timeout: float) -> None:
        self._turned = time.monotonic()
        self._waiting = False

    def start(self) -> None:
        """Instrument the running loop and start watching it; a process that cannot start
        one more thread (a memory limit) runs unwatched, with a warning."""
        self._loop_thread = threading.get_ident()
        self._turned = time.monotonic()
        thread = threading.Thread(target=self._watch, name="coevo-loopwatch", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread"
            self._log.warning("the event loop is not watched for stalls", reason=str(exc))
            return
        self._thread = thread
        trio.lowlevel.add_instrument(self)

    def stop(self) -> None:
        """Stop watching (from the loop's thread, inside ``trio.run``)."""
        if self._thread is None:
            return
        self._done.set()
        trio.lowlevel.remove_instrument(self)
        self._thread.join()

    def _watch(self) -> None:
        reported: float | None = None  # the turn reported as stalled
        poll = min(1.0, self.threshold / 4)
        while True:
            done = self._done.wait(poll)
            turned, waiting = self._turned, self._waiting
            if reported is not None and turned != reported:
                self._log.warning("event loop ran again", blocked_s=round(turned - reported, 1))
                reported = None
            if reported is None and not waiting and time.monotonic() - turned >= self.threshold:
                reported = turned
                frames = sys._current_frames()  # pyright: ignore[reportPrivateUsage]
                frame = frames.get(self._loop_thread)
                self._log.warning(
                    "event loop blocked: every actor waits until this returns (run blocking "
                    "work through ctx.to_thread)",
                    blocked_s=round(time.monotonic() - turned, 1),
                    where=where(frame),
                )
            if done:
                return
