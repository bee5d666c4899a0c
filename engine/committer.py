"""The log's writing thread of a run (:class:`Committer`) and the batches it commits.

The runtime's writer task numbers, folds and encodes a batch on the event loop, then hands it
here as a :class:`Prepared`; the thread appends it in one transaction and reports back to the
loop, which delivers the batch's envelopes only then (see :mod:`engine.runtime`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import trio

from engine.eventlog import EncodedBatch, EventLog, Snapshot
from engine.events import Envelope, Event

__all__ = ["IN_FLIGHT", "Committer", "Prepared"]


@dataclass
class Prepared:
    """A numbered, folded and encoded batch on its way to the log, with the snapshots taken
    in it."""

    envelopes: list[Envelope[Event]]
    snapshots: list[Snapshot]
    encoded: EncodedBatch
    pushed: int = 0  # events pushed before the last one in the batch, that one included


IN_FLIGHT = 2
"""Batches between numbering and delivery: one being committed, the next one waiting for it."""


class Committer:
    """The log's writing thread: appends numbered batches in order, one transaction each (with
    the snapshots taken in the batch), and reports each one to the event loop.

    A plain thread with a queue rather than a trio worker-thread hop per batch: while it waits
    for the fsync of batch k (without the GIL), the event loop numbers, folds and encodes batch
    k+1. It does little that needs the GIL, since every time it lets go of it (each LMDB call)
    it may wait to get it back. After an error it commits nothing more.

    Args:
        log: the run's event log.
        report: called on the event loop with each batch and None, or the error that stopped
            the thread.
    """

    def __init__(
        self, log: EventLog, report: Callable[[Prepared, BaseException | None], None]
    ) -> None:
        self._log = log
        self._report = report
        self._token = trio.lowlevel.current_trio_token()
        self._jobs: queue.SimpleQueue[Prepared | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="coevo-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, prepared: Prepared) -> None:
        """Queue a batch for commit (never waits)."""
        self._jobs.put(prepared)

    def stop(self) -> None:
        """Let the thread finish what it was given and wait for it (blocking)."""
        self._jobs.put(None)
        self._thread.join()

    def _loop(self) -> None:
        log, jobs, report = self._log, self._jobs, self._report
        while (prepared := jobs.get()) is not None:
            try:
                log.append_encoded(prepared.encoded, snapshots=prepared.snapshots)
            except BaseException as exc:
                self._token.run_sync_soon(report, prepared, exc)
                return
            self._token.run_sync_soon(report, prepared, None)
