"""The tracking fold on hand-made envelopes: blocks of training episodes, the training bank
only, throughput from the envelopes' times, updates by version; and the tracker writing its
points to sinks, dropping one whose disk is full."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from agents.events.episodes import EpisodeAbandoned, EpisodeFinished
from agents.events.extractor import CreditAssigned
from agents.events.memory import TipEvicted, TipsRetrieved, TipStored
from agents.testing.events import episode_finished, policy_updated
from agents.tracking.observer import Tracker, TrackingFailed
from agents.tracking.scalars import Scalar, ScalarFold, fold_scalars
from engine.events import Envelope, Event
from engine.lifecycle import RunResumed, RunStarted, RunStopped


def _env(seq: int, ev: Event, seconds: float) -> Envelope[Event]:
    return Envelope(seq=seq, run="r", t=int(seconds * 1e9), actor="a", event=ev)


def _finished(ep: int, success: bool, purpose: str = "train") -> EpisodeFinished:
    return episode_finished(
        f"ep{ep}",
        family="f",
        steps=3,
        score=1.0 if success else 0.25,
        success=success,
        total_reward=2.0 if success else 0.0,
        purpose=purpose,
    )


def _stored(tip: int, slot: str) -> TipStored:
    return TipStored(tip_id=tip, slot=slot, episode="ep0", text="t", score=1.0, key="k")


def test_blocks_bank_credit_and_throughput() -> None:
    start = RunStarted(run_id="r", scenario="s", scenario_hash="h", seed=0, coevo_version="0")
    events: list[Event] = [
        start,  # not a kind the tracker reads: the first block is timed from the next event
        _stored(0, "train/f"),
        _stored(1, "eval/f"),  # not the training bank
        _finished(0, True),
        _finished(1, False, purpose="eval"),  # not a training episode
        CreditAssigned(episode="ep0", entry=0, call="c", success=True, credit=1.0, step=0),
        _finished(2, False),
        TipEvicted(tip_id=0, slot="train/f", reason="update"),
        _finished(3, True),
        _finished(4, True),
    ]
    envs = [_env(i, ev, 10.0 + i) for i, ev in enumerate(events)]
    points = {(p.tag, p.step): p.value for p in fold_scalars(envs, block=2)}
    assert points[("train/success", 2)] == 0.5
    assert points[("train/return", 2)] == 1.0
    assert points[("train/score", 2)] == 0.625
    assert points[("bank/size", 2)] == 1.0 and points[("bank/stored", 2)] == 1.0
    assert points[("credit/mean", 2)] == 1.0 and points[("credit/count", 2)] == 1.0
    # the first block runs from seq 1 (t = 11 s) to seq 6 (t = 16 s): 2 episodes, 5 events
    assert points[("throughput/episodes_per_s", 2)] == pytest.approx(2 / 5)
    assert points[("throughput/events_per_s", 2)] == pytest.approx(5 / 5)
    assert points[("train/success", 4)] == 1.0
    assert points[("bank/size", 4)] == 0.0 and points[("bank/evicted", 4)] == 1.0
    assert points[("credit/count", 4)] == 0.0
    assert ("train/success", 6) not in points  # one episode of the third block: not written


@pytest.mark.parametrize("stopped", [True, False])  # stopped with run_stopped, or killed
def test_the_time_a_run_was_stopped_is_no_time_of_its_throughput(stopped: bool) -> None:
    """A block spanning a stop counted the hours the run was stopped: 0.31 episodes/s where
    the run played about 7."""
    events: list[tuple[Event, float]] = [(_finished(0, True), 10.0), (_finished(1, True), 11.0)]
    events += [(_finished(2, True), 12.0)]
    if stopped:
        events += [(RunStopped(reason="signal", signal="SIGINT", exit_code=130), 12.5)]
    events += [(RunResumed(after=3), 3612.5), (_finished(3, True), 3613.0)]
    envs = [_env(i, ev, t) for i, (ev, t) in enumerate(events)]
    points = {(p.tag, p.step): p.value for p in fold_scalars(envs, block=2)}
    assert points[("throughput/episodes_per_s", 2)] == pytest.approx(2 / 1)
    # the second block: 11 s to 12.5 (or 12) s, then the resume to 3613 s: 2 (or 1.5) s
    assert points[("throughput/episodes_per_s", 4)] == pytest.approx(2 / (2.0 if stopped else 1.5))


def _retrieved(ep: int, shown: int, slot: str = "train/f") -> TipsRetrieved:
    return TipsRetrieved(
        episode=f"ep{ep}", worker="w", turn=0, slot=slot, tip_ids=tuple(range(shown)),
        similarities=(0.5,) * shown, ranks=tuple(range(shown)), tips=("t",) * shown,
        similar=shown, slot_size=9,
    )  # fmt: skip


def test_a_completed_run_writes_its_open_block_and_no_mean_of_nothing() -> None:
    """What came after the last full block (the last episodes, the credits and entries made
    once training episodes had ended) was never written, and a block without credits or
    retrievals read as a mean of 0.0 (under +-1 credits: "balanced")."""
    events: list[Event] = [
        _finished(0, True),
        _finished(1, False),  # the first block: no credit, no retrieval
        _finished(2, True),  # the last block holds one episode
        CreditAssigned(episode="ep2", entry=0, call="c", success=True, credit=-1.0, step=0),
        _stored(5, "train/f"),
    ]
    stops = [
        RunStopped(reason="signal", exit_code=143),
        RunStopped(reason="completed", exit_code=0),
    ]
    envs = [_env(i, ev, 10.0 + i) for i, ev in enumerate([*events, *stops])]
    stopped = fold_scalars(envs[:-1], block=2)  # stopped by a signal: to be resumed
    assert {p.step for p in stopped} == {2}
    points = {(p.tag, p.step): p.value for p in fold_scalars(envs, block=2)}
    assert ("credit/mean", 2) not in points and ("retrieval/shown", 2) not in points
    assert points[("credit/count", 2)] == 0.0 and points[("retrieval/count", 2)] == 0.0
    assert points[("train/success", 3)] == 1.0  # over the one episode it holds
    assert points[("credit/mean", 3)] == -1.0 and points[("credit/count", 3)] == 1.0
    assert points[("bank/size", 3)] == 1.0 and points[("bank/stored", 3)] == 1.0
    idle = [_finished(0, True), _finished(1, True), RunStopped(reason="completed", exit_code=0)]
    after = fold_scalars([_env(i, ev, 1.0 + i) for i, ev in enumerate(idle)], block=2)
    assert {p.step for p in after} == {2}  # nothing after the last block: nothing more


def test_retrievals_count_in_the_block_their_episode_ended_and_not_when_abandoned() -> None:
    """A resume abandons the attempts it found running: their retrievals are not the run's
    (a block showed 17 retrievals for 16 episodes, 8 of them guided)."""
    events: list[Event] = [
        _retrieved(0, 2),
        _retrieved(1, 1),
        _retrieved(9, 3, slot="eval/f"),  # not the training bank
        EpisodeAbandoned(episode="ep1", worker="w"),
        _retrieved(1, 3),  # its next attempt
        _finished(0, True),
        _retrieved(2, 1),  # still running when the block ends
        _finished(1, True),
        _finished(2, True),
        _finished(3, True),
    ]
    points = {(p.tag, p.step): p.value for p in fold_scalars(
        [_env(i, ev, 1.0 + i) for i, ev in enumerate(events)], block=2
    )}  # fmt: skip
    assert points[("retrieval/count", 2)] == 2.0 and points[("retrieval/shown", 2)] == 2.5
    assert points[("retrieval/count", 4)] == 1.0 and points[("retrieval/shown", 4)] == 1.0


def test_an_aborted_training_episode_is_a_failure_of_its_block_as_in_the_curve() -> None:
    """The tracker (and ``coevo export``) agree with the run's train curve: an aborted
    training episode counts as a failure with return and score 0; steps are the finished
    episodes' mean; ``train/aborted`` counts them."""
    from agents.events.episodes import EpisodeAborted
    from agents.report.curves import fold_curves

    events: list[Event] = [
        _finished(0, True),
        EpisodeAborted(episode="ep1", worker="w", reason="RuntimeError: lost"),
        EpisodeAborted(episode="ep9", worker="w", reason="lost", purpose="eval"),
        _finished(2, True),
        EpisodeAborted(episode="ep3", worker="w", reason="RuntimeError: lost"),
    ]
    envs = [_env(i, ev, 10.0 + i) for i, ev in enumerate(events)]
    points = {(p.tag, p.step): p.value for p in fold_scalars(envs, block=2)}
    curve = fold_curves(events, block=2).train
    assert [points[("train/success", x)] for x in (2, 4)] == [s for _, s, _ in curve] == [0.5] * 2
    assert [points[("train/score", x)] for x in (2, 4)] == [v for _, _, v in curve] == [0.5] * 2
    assert points[("train/return", 2)] == 1.0 and points[("train/steps", 2)] == 3.0
    assert points[("train/aborted", 2)] == 1.0 and points[("train/aborted", 4)] == 1.0


def test_updates_by_version_and_the_block_checked() -> None:
    ev = policy_updated(
        3, samples=10, stale=1, loss=0.5, grad_norm=2.0, clip_frac=0.1, kl=0.01,
        checkpoint="c", seconds=1.5,
    )  # fmt: skip
    points = ScalarFold().evolve(_env(7, ev, 3.0))
    got = {p.tag: (p.step, p.value, p.wall_time) for p in points}
    assert got["update/loss"] == (3, 0.5, 3.0)
    assert got["update/kl"] == (3, 0.01, 3.0)
    assert got["update/stale"] == (3, 1.0, 3.0)
    with pytest.raises(ValueError, match="block must be >= 1, got 0"):
        ScalarFold(0)


class _Kept:
    """A sink that keeps what it is given."""

    def __init__(self) -> None:
        self.points: list[Scalar] = []
        self.closed = False

    def write(self, points: Sequence[Scalar]) -> None:
        self.points += points

    def close(self) -> None:
        self.closed = True


class _Failing(_Kept):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def write(self, points: Sequence[Scalar]) -> None:
        raise self.error


def _batch(first: int, n: int) -> list[Envelope[Event]]:
    return [_env(first + i, _finished(first + i, i % 2 == 0), 1.0 + first + i) for i in range(n)]


def test_the_tracker_writes_what_the_fold_gives_and_drops_a_full_disk() -> None:
    kept, full = _Kept(), _Failing(OSError(28, "No space left on device"))
    history = _batch(0, 3)  # a resumed run's earlier session: folded, not written
    tracker = Tracker([full, kept], block=2, history=history)
    tracker.observe(_batch(3, 3))
    tracker.observe(_batch(6, 4))
    # a full block is written once the next training episode ends, or the session does
    assert [p.step for p in tracker.written if p.tag == "train/success"] == [4, 6, 8]
    tracker.observe([_stop(10)])
    tracker.close()
    assert kept.closed and not full.closed
    expected = [p for p in fold_scalars(history + _batch(3, 7), block=2) if p.step > 2]
    assert kept.points == tracker.written == expected
    assert [p.step for p in kept.points if p.tag == "train/success"] == [4, 6, 8, 10]


def _stop(seq: int, reason: str = "signal") -> Envelope[Event]:
    return _env(seq, RunStopped(reason=reason, exit_code=143 if reason == "signal" else 0), 99.0)


class _FullOnClose(_Kept):
    def close(self) -> None:
        raise OSError(28, "No space left on device")


def test_a_sink_whose_last_flush_meets_a_full_disk_is_dropped_as_a_write_is() -> None:
    """W&B's close on a full disk failed the run ("tracking failed: OSError", exit 1),
    while a write that met it dropped the sink with a warning."""
    full, kept = _FullOnClose(), _Kept()
    tracker = Tracker([full, kept], block=1)
    tracker.observe([*_batch(0, 1), _stop(1)])
    tracker.close()
    assert kept.closed and kept.points == full.points == tracker.written


def test_a_sink_that_breaks_otherwise_fails_the_tracking_on_close_and_alone() -> None:
    """MLflow's store deleted mid-run raised an ``Exception``: the writing thread ended for
    every sink, and TensorBoard and W&B silently missed the rest of the run."""
    broken, kept = _Failing(ValueError("bad value")), _Kept()
    broken.name = "mlflow"  # pyright: ignore[reportAttributeAccessIssue]
    tracker = Tracker([broken, kept], block=1)
    tracker.observe(_batch(0, 2))
    tracker.observe([*_batch(2, 2), _stop(4)])
    with pytest.raises(TrackingFailed) as err:
        tracker.close()
    assert str(err.value).startswith(
        "tracking failed: sink 'mlflow' raised ValueError: bad value; it was dropped there, "
        "the other sinks have every point"
    )
    assert "coevo export RUN --mlflow DIR" in str(err.value)
    assert kept.closed and kept.points == tracker.written and len(kept.points) > 4


def test_a_completed_run_s_tail_after_a_full_block_is_one_point_per_step() -> None:
    """With the training episodes a multiple of the block, the credits and entries that came
    after the last one were written at the same step as that block: two values at one x
    (``credit/count`` 4 then 0), and a viewer showing the latest showed the tail alone."""
    from agents.events.memory import TipRejected

    events: list[Event] = [
        _finished(0, True),
        CreditAssigned(episode="ep0", entry=0, call="c", success=True, credit=1.0, step=0),
        _finished(1, False),  # the block is full
        CreditAssigned(episode="ep1", entry=0, call="c", success=False, credit=-1.0, step=0),
        _stored(7, "train/f"),
        TipRejected(episode="ep1", slot="train/f", reason="duplicate", duplicate_of=7),
        RunStopped(reason="completed", exit_code=0),
    ]
    envs = [_env(i, ev, 10.0 + i) for i, ev in enumerate(events)]
    points = fold_scalars(envs, block=2)
    steps = [(p.tag, p.step) for p in points]
    assert len(steps) == len(set(steps)), steps  # one point per series and step
    got = {(p.tag, p.step): p.value for p in points}
    assert got[("credit/count", 2)] == 2.0 and got[("credit/mean", 2)] == 0.0
    assert got[("bank/stored", 2)] == 1.0 and got[("bank/rejected", 2)] == 1.0
    assert got[("bank/size", 2)] == 1.0 and got[("train/success", 2)] == 0.5
    # the live tracker writes the same, the block once the run completed
    tracker = Tracker([_Kept()], block=2)
    tracker.observe(envs[:-1])
    assert tracker.written == []
    tracker.observe(envs[-1:])
    tracker.close()
    assert tracker.written == points


def test_a_resume_writes_a_held_block_once() -> None:
    """A block held when the session ended: a stop wrote it (the resume must not again); a
    kill did not (the resume writes it)."""
    stopped = Tracker([_Kept()], block=2, history=[*_batch(0, 4), _stop(4)])
    stopped.observe(_batch(5, 1))
    stopped.close()
    assert [p.step for p in stopped.written if p.tag == "train/success"] == []
    killed = Tracker([_Kept()], block=2, history=_batch(0, 4))
    killed.observe(_batch(4, 1))
    killed.close()
    assert [p.step for p in killed.written if p.tag == "train/success"] == [4]


def test_a_scenario_gives_the_same_parameters_live_and_exported() -> None:
    """Live tracking flattened the scenario object (its unset ``runtime.ray.*`` logged as
    'None' strings), ``coevo export`` the resolved TOML the log stores (no None): 139
    parameters against 135."""
    import tomllib

    import msgspec

    from agents.tracking.sinks import _flat  # pyright: ignore[reportPrivateUsage]
    from scenarios.loader import load_scenario, resolved_toml

    root = Path(__file__).resolve().parents[2]
    for name in ("quickstart", "complementary", "empo2"):
        scenario = load_scenario(root / "scenarios" / f"{name}.toml")
        live = _flat(msgspec.to_builtins(scenario))
        exported = _flat(tomllib.loads(resolved_toml(scenario)))
        assert live == exported, set(live.items()) ^ set(exported.items())
