"""The writer's numbering: where checksums and snapshots fall, with and without a byte budget.

A projection whose state grows by one entry per event stands for an episode table: with a
budget, the gap after a checksum (or snapshot) of ``B`` bytes of state is ``max(every,
ceil(B / budget))`` events; without one it is ``every``; either way the positions depend on the
events alone, not on how the writer happened to batch them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.eventlog import Snapshot
from engine.events import Envelope, Event, event
from engine.lifecycle import ProjectionChecked, RunStopped, SnapshotTaken
from engine.numbering import Numbering, Pending
from engine.projection import Fold, digest_bytes, encode_state


@event
class Tick(Event, tag="test_numbering_tick", frozen=True, kw_only=True):
    n: int


class Seen:
    """Every seq folded, in order: a state that grows with the run."""

    name = "seen"
    state_type = list[int]

    def initial(self) -> list[int]:
        return []

    def evolve_many(self, state: list[int], envs: Sequence[Envelope[Event]]) -> list[int]:
        state.extend(env.seq for env in envs)
        return state


def pending(count: int, final: bool = True) -> list[Pending]:
    items: list[Pending] = [("src", Tick(n=i), None, "", i, 0) for i in range(count)]
    if final:
        items.append(("runtime", RunStopped(reason="completed", exit_code=0), None, "", count, 0))
    return items


def number(
    items: list[Pending], batches: Sequence[int], **knobs: int
) -> tuple[list[Envelope[Event]], list[Snapshot]]:
    """Number ``items`` in batches of the sizes ``batches`` (cycled), as the writer would."""
    numbering = Numbering("r", [Seen()], **knobs)
    envs: list[Envelope[Event]] = []
    snaps: list[Snapshot] = []
    start, k = 0, 0
    while start < len(items):
        size = batches[k % len(batches)]
        out, taken = numbering.prepare(items[start : start + size])
        envs += out
        snaps += taken
        start, k = start + size, k + 1
    return envs, snaps


def state_bytes(envs: list[Envelope[Event]], upto: int) -> int:
    """Bytes of the encoded state after folding ``envs[: upto + 1]``."""
    fold = Fold([Seen()])
    fold.apply_all(envs[: upto + 1])
    return len(encode_state(fold.states["seen"]))


def counted_gaps(envs: list[Envelope[Event]], kind: type[Event]) -> list[tuple[int, int]]:
    """Per ``kind`` event but the first: (events since the one before, not counting the
    runtime's own ones, the bytes of the state the one before covered: after its ``upto``)."""
    own = (ProjectionChecked, SnapshotTaken)
    gaps, last, since = [], None, 0
    for env in envs:
        if isinstance(env.event, kind):
            if last is not None:
                gaps.append((since, state_bytes(envs, last)))
            last, since = getattr(env.event, "upto"), 0  # noqa: B009 - both kinds have it
        elif not isinstance(env.event, (*own, RunStopped)):
            since += 1
    return gaps


def test_without_a_budget_checksums_come_every_checksum_every_events() -> None:
    envs, _ = number(pending(500), [64], checksum_every=50, snapshot_every=0)
    gaps = counted_gaps(envs, ProjectionChecked)
    assert len(gaps) == 9 and all(since == 50 for since, _ in gaps)


def test_with_a_budget_a_larger_state_spaces_the_checksums() -> None:
    envs, _ = number(pending(3000), [64], checksum_every=50, snapshot_every=0, checksum_budget=2)
    gaps = counted_gaps(envs, ProjectionChecked)
    assert len(gaps) > 2, "too few checksums"
    *spaced, (last, before_last) = gaps  # the last one: the final checksum, at the run's end
    for since, size in spaced:
        assert since == max(50, -(-size // 2))
    assert last <= max(50, -(-before_last // 2))
    assert gaps[0][0] == 50 and gaps[-1][0] > 50  # small states keep the fixed spacing
    # every checksum records the digest of the state it covers
    for env in envs:
        if isinstance(env.event, ProjectionChecked):
            fold = Fold([Seen()])
            fold.apply_all(envs[: env.event.upto + 1])
            assert env.event.digests == {"seen": digest_bytes(encode_state(fold.states["seen"]))}


def test_with_a_budget_a_larger_state_spaces_the_snapshots() -> None:
    envs, snaps = number(
        pending(3000), [64], checksum_every=0, snapshot_every=40, snapshot_budget=3
    )
    taken = [env.event for env in envs if isinstance(env.event, SnapshotTaken)]
    assert [upto for _, upto, _ in snaps] == [ev.upto for ev in taken]
    assert len(taken) >= 4
    for before, after in itertools.pairwise(taken):
        # a snapshot goes at the end of the first batch (64 events here, and the snapshot)
        # after its gap has passed
        gap = max(40, -(-before.size // 3))
        assert gap <= after.upto - before.upto < gap + 65
    assert taken[-1].upto - taken[-2].upto > 40 + 65  # the gaps grew with the state


@pytest.mark.parametrize("every", [0, 25])
def test_the_final_checksum_still_precedes_the_final_event(every: int) -> None:
    envs, _ = number(pending(400), [33], checksum_every=every, snapshot_every=0, checksum_budget=1)
    assert isinstance(envs[-1].event, RunStopped)
    assert isinstance(envs[-2].event, ProjectionChecked)
    assert envs[-2].event.upto == envs[-3].seq


@settings(max_examples=30, deadline=None)
@given(
    batches=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    every=st.integers(0, 80),
    budget=st.sampled_from([0, 1, 4]),
)
def test_checksum_positions_depend_on_the_events_not_on_the_batches(
    batches: list[int], every: int, budget: int
) -> None:
    # (snapshots go at the end of a batch, so their positions do depend on the batching)
    knobs = {"checksum_every": every, "snapshot_every": 0, "checksum_budget": budget}
    one, _ = number(pending(1200), [1200 + 1], **knobs)
    many, _ = number(pending(1200), batches, **knobs)
    assert [(type(e.event), e.event) for e in one] == [(type(e.event), e.event) for e in many]
