"""The tracker: an observer of the runtime (``Runtime(observers=...)``, beside the progress
bar) that folds every committed batch with :class:`~agents.tracking.scalars.ScalarFold` and
hands the points to a writing thread, which writes them to the sinks while the run goes on.

Why an observer and not an actor: an actor is cancelled when the run's driver returns, and the
events committed after its last delivery would be missing from the live series; the runtime
gives observers every committed batch, the last one included, in seq order. The tracker emits
nothing, so a run's log is the same with or without it. The fold runs on the event loop (a few
dictionary look-ups per event); the writes, which block, run in the thread.

A sink that fails (a write or its close raises) is dropped with a warning in the run's log
file; the run and the other sinks go on (the log keeps every value: ``coevo export`` writes
them again). A failure other than ``OSError`` (a full or gone disk) is a fault of the sink's
library or of coevo's, so it also ends the command with one line once the run is complete. A
resumed run's tracker folds the earlier sessions' events silently and writes only what follows.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Sequence

import structlog

from agents.tracking.scalars import READ, Scalar, ScalarFold
from agents.tracking.sinks import ScalarSink
from engine.errors import CoevoError
from engine.events import Envelope, Event

__all__ = ["Tracker", "TrackingFailed"]


class TrackingFailed(CoevoError):
    """A sink raised something other than ``OSError`` while the run was tracked (exit 1); the
    run itself is complete in its log, and the other sinks have every point."""

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
        self._failed: tuple[str, Exception] | None = None  # the first sink that broke otherwise
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
        if self._failed is not None:
            name, exc = self._failed
            raise TrackingFailed(
                f"tracking failed: sink {name!r} raised {type(exc).__name__}: {exc}; it was "
                "dropped there, the other sinks have every point, and the run is complete in "
                f"its log (`coevo export RUN --{name} DIR` writes the series again)"
            ) from exc

    def _write(self) -> None:
        try:
            while (points := self._queue.get()) is not None:
                for sink in list(self._sinks):
                    self._call(sink, sink.write, points)
            for sink in list(self._sinks):
                self._call(sink, sink.close)
        except BaseException as exc:  # handed to close(), which raises it on the caller's thread
            self._error = exc

    def _call(self, sink: ScalarSink, fn: Callable[..., None], *args: object) -> None:
        """Call ``fn``, the sink's ``write`` or ``close``; a sink that raises is dropped alone
        (a full or gone disk, a library's error), so the other sinks keep every point."""
        try:
            fn(*args)
        except Exception as exc:
            name = getattr(sink, "name", type(sink).__name__)
            structlog.get_logger("coevo").bind(actor="tracker").warning(
                "tracking sink dropped", sink=name, error=f"{type(exc).__name__}: {exc}"
            )
            self._sinks.remove(sink)
            if not isinstance(exc, OSError) and self._failed is None:
                self._failed = (name, exc)
