"""The tracker: an observer of the runtime (``Runtime(observers=...)``, beside the progress
bar) that folds every committed batch with :class:`~agents.tracking.scalars.ScalarFold` and
hands the points to a writing thread, which writes them to the sinks while the run goes on.

Why an observer and not an actor: an actor is cancelled when the run's driver returns, and the
events committed after its last delivery would be missing from the live series; the runtime
gives observers every committed batch, the last one included, in seq order. The tracker emits
nothing, so a run's log is the same with or without it. The fold runs on the event loop (a few
dictionary look-ups per event); the writes, which block, run in the thread.

A sink that fails to write (``OSError``: a full disk) is closed and dropped with a warning in
the run's log file; the run and the other sinks go on (the log keeps every value:
``coevo export`` writes them again). A resumed run's tracker folds the earlier sessions' events
silently and writes only what follows.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Sequence

import structlog

from agents.tracking.scalars import READ, Scalar, ScalarFold
from agents.tracking.sinks import ScalarSink
from engine.errors import CoevoError
from engine.events import Envelope, Event

__all__ = ["Tracker", "TrackingFailed"]


class TrackingFailed(CoevoError):
    """A sink raised something other than ``OSError`` while the run was tracked (exit 1); the
    run itself is complete in its log."""

    exit_code = 1


class Tracker:
    """Writes a run's scalars live.

    Args:
        sinks: where to write (closed by :meth:`close`).
        block: training episodes per point of the per-block series.
        history: a resumed run's earlier events, folded without writing.
    """

    def __init__(
        self,
        sinks: Sequence[ScalarSink],
        block: int,
        history: Iterable[Envelope[Event]] = (),
    ) -> None:
        self.fold = ScalarFold(block)
        for env in history:
            if type(env.event) in READ:
                self.fold.evolve(env)
        self.written: list[Scalar] = []
        """Every point handed to the sinks in this session, in order."""
        self._sinks = list(sinks)
        self._queue: queue.SimpleQueue[list[Scalar] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, name="coevo-tracker", daemon=True)
        self._thread.start()

    def observe(self, envelopes: list[Envelope[Event]]) -> None:
        """Fold one committed batch and queue its points (quick; never raises)."""
        points = [p for env in envelopes if type(env.event) in READ for p in self.fold.evolve(env)]
        if points:
            self.written += points
            self._queue.put(points)

    def close(self) -> None:
        """Write what is queued, close the sinks and stop the thread.

        Raises:
            TrackingFailed: a sink failed with something other than ``OSError``.
        """
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            exc = self._error
            raise TrackingFailed(f"tracking failed: {type(exc).__name__}: {exc}") from exc

    def _write(self) -> None:
        log = structlog.get_logger("coevo").bind(actor="tracker")
        try:
            while (points := self._queue.get()) is not None:
                for sink in list(self._sinks):
                    try:
                        sink.write(points)
                    except OSError as exc:  # a full or gone disk: the log keeps the values
                        log.warning(
                            "tracking sink dropped", sink=type(sink).__name__, error=str(exc)
                        )
                        self._sinks.remove(sink)
            for sink in self._sinks:
                try:
                    sink.close()
                except OSError as exc:  # its last flush, on a full disk: as a write's
                    log.warning("tracking sink dropped", sink=type(sink).__name__, error=str(exc))
        except BaseException as exc:  # handed to close(), which raises it on the caller's thread
            self._error = exc
