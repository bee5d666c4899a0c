"""The writer's pure core: numbering a batch of emitted events, folding it, checksums and
snapshots.

:class:`Numbering` turns queued emissions into envelopes with consecutive seqs, folds them into
the run's projections, and inserts the runtime's own events: a :class:`ProjectionChecked` every
``checksum_every`` events and right before the run's final event, and a :class:`SnapshotTaken`
(with the encoded states to store in the batch's commit) every ``snapshot_every`` events. No
I/O, no clock: the wall times come with the emissions. :class:`~engine.runtime.Runtime` runs it
on the event loop between taking a batch off its write buffer and handing it to the log.

A checksum encodes and hashes every projection's whole state, and a snapshot stores it, so with
a fixed spacing their cost grows with the state (an episode table's row per episode): a run ten
times longer would spend a hundred times more on them. With a byte budget (``checksum_budget``,
``snapshot_budget``) the gap after a checksum or snapshot of ``B`` bytes of state is at least
``B / budget`` events, which bounds their cost per event however long the run; below
``budget * every`` bytes the spacing is the fixed one. The gaps depend on the states alone, not
on how the events were batched (a resumed session starts again from the fixed spacing).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.eventlog import Snapshot
from engine.events import Envelope, Event
from engine.lifecycle import ProjectionChecked, RunFailed, RunStopped, SnapshotTaken
from engine.projection import Fold, Projection, digests_of

__all__ = ["FINAL_EVENTS", "Numbering", "Pending"]

FINAL_EVENTS = frozenset({RunStopped, RunFailed})
"""The kinds of a run's final event: the last event ever queued, checksummed before it."""

Pending = tuple[str, Event, int | None, str, int, int]
"""A queued emission: (actor, event, cause, corr, wall time ns, bytes encoded)."""


class Numbering:
    """Numbers and folds the batches of one run, in order.

    Args:
        run_id: the run the envelopes belong to.
        projections: the folds checksummed and snapshotted.
        checksum_every: events between projection checksums (0: only at the end), at least.
        snapshot_every: events between projection snapshots (0: never), at least.
        checksum_budget: bytes of encoded state a checksum digests per event since the one
            before, at most (0: no bound, every ``checksum_every`` events).
        snapshot_budget: bytes of snapshot stored per event since the one before, at most
            (0: no bound, every ``snapshot_every`` events).

    Attributes:
        fold: the projections' states after the last numbered event (replaced when a resumed
            run folds its log first).
        seq: the seq the next numbered event gets.
    """

    def __init__(
        self,
        run_id: str,
        projections: Sequence[Projection],
        checksum_every: int,
        snapshot_every: int,
        checksum_budget: int = 0,
        snapshot_budget: int = 0,
    ) -> None:
        self.run_id = run_id
        self._projections = tuple(projections)
        self._checksum_every = checksum_every
        self._snapshot_every = snapshot_every
        self._checksum_budget = checksum_budget
        self._snapshot_budget = snapshot_budget
        self.fold = Fold(self._projections)
        self.seq = 0
        self._since_check = 0
        self._check_gap = checksum_every  # events before the next checksum
        self._snapshot_seq = -1
        self._snapshot_gap = snapshot_every

    def prepare(self, batch: list[Pending]) -> tuple[list[Envelope[Event]], list[Snapshot]]:
        """Number and fold one batch (the engine's hot loop); return its envelopes and the
        snapshots taken in it.

        Envelopes are built and folded a segment at a time, each segment ending where a
        :class:`ProjectionChecked` goes: after every ``checksum_every`` events, and right
        before the run's final event (the last event ever queued).
        """
        out: list[Envelope[Event]] = []
        final = batch[-1] if type(batch[-1][1]) in FINAL_EVENTS else None
        body = batch if final is None else batch[:-1]
        every = self._check_gap if self._projections else 0
        start = 0
        while start < len(body):
            stop = start + max(every - self._since_check, 1) if every else len(body)
            self._number(body[start:stop], out)
            if every and self._since_check >= every:
                self._checkpoint(out, out[-1].t)
                every = self._check_gap
            start = stop
        if final is not None:
            if self._projections and self._since_check:
                self._checkpoint(out, final[4])
            self._number([final], out)
        return out, self._maybe_snapshot(out)

    def _number(self, pending: list[Pending], out: list[Envelope[Event]]) -> None:
        """Append envelopes of ``pending`` to ``out`` with the next seqs, and fold them."""
        run_id = self.run_id
        envs = [
            Envelope(
                seq=seq, run=run_id, t=t, actor=actor, event=ev, cause=cause, corr=corr,
                v=ev.version,
            )
            for seq, (actor, ev, cause, corr, t, _) in enumerate(pending, self.seq)
        ]  # fmt: skip
        self.seq += len(envs)
        out.extend(envs)
        if self._projections:
            self.fold.apply_all(envs)
            self._since_check += len(envs)

    def _checkpoint(self, out: list[Envelope[Event]], t: int) -> None:
        """Append a :class:`ProjectionChecked` covering the events numbered so far, and fold
        it too (it is not counted towards the next one)."""
        blobs = self.fold.encoded()
        check = ProjectionChecked(upto=self.seq - 1, digests=digests_of(blobs))
        self._append_own(out, check, t)
        self._since_check = 0
        self._check_gap = _gap(self._checksum_every, self._checksum_budget, blobs)

    def _append_own(self, out: list[Envelope[Event]], ev: Event, t: int) -> None:
        """Append and fold an event of the runtime's own (checksums, snapshots)."""
        env = Envelope(seq=self.seq, run=self.run_id, t=t, actor="runtime", event=ev, v=ev.version)
        self.seq += 1
        out.append(env)
        self.fold.apply_all([env])

    def _maybe_snapshot(self, out: list[Envelope[Event]]) -> list[Snapshot]:
        """If the snapshot gap passed (``snapshot_every`` events, more for a large state):
        encode the projection states after the last numbered event and append a
        :class:`SnapshotTaken` (the states are stored in the batch's commit)."""
        every, upto = self._snapshot_gap, self.seq - 1
        if not (self._projections and every and upto - self._snapshot_seq >= every):
            return []
        if type(out[-1].event) in FINAL_EVENTS:  # the final event stays the last one
            return []
        self._snapshot_seq = upto
        blobs = self.fold.encoded()
        self._snapshot_gap = _gap(self._snapshot_every, self._snapshot_budget, blobs)
        size = sum(map(len, blobs.values()))
        taken = SnapshotTaken(upto=upto, digests=digests_of(blobs), size=size)
        self._append_own(out, taken, out[-1].t)
        self._since_check += 1
        return [(name, upto, data) for name, data in blobs.items()]


def _gap(every: int, budget: int, blobs: dict[str, bytes]) -> int:
    """Events until the next checksum or snapshot after one of ``blobs``: ``every``, or more
    if the states are over ``budget`` bytes per event of it (the ceiling of their quotient)."""
    if not (every and budget):
        return every
    size = sum(map(len, blobs.values()))
    return max(every, -(-size // budget))
