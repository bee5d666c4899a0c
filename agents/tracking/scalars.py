"""The scalars of a run, folded from its events: what the tracker writes live and what
``coevo export`` writes from a finished log, by the same fold, so both are equal.

:class:`ScalarFold` is pure: :meth:`ScalarFold.evolve` takes one envelope and returns the
points it completes. Series and their steps (``x``):

- per block of ``block`` training episodes (``x`` = training episodes ended):
  ``train/success``, ``train/return`` (mean total reward), ``train/score``, ``train/steps``
  (of the finished episodes), ``train/aborted`` (episodes whose world failed: they count as
  failures with return and score 0, as in the run's train curve);
  the training bank's ``bank/size`` at the block's end and its ``bank/stored``,
  ``bank/evicted``, ``bank/rejected`` in the block; ``retrieval/count`` and
  ``retrieval/shown`` (mean entries shown) of the retrievals of the block's training
  episodes (an attempt abandoned on a resume counts none); ``credit/mean`` and
  ``credit/count`` of the block's credits; ``throughput/episodes_per_s`` and
  ``throughput/events_per_s`` over the block (from the envelopes' emission times, less the
  time between a session's last event and its resume). A mean over nothing
  (``retrieval/shown``, ``credit/mean`` of a block without any) is not written;
- per evaluation round (``x`` = training episodes at its end): ``heldout/success``,
  ``heldout/score`` (``heldout_bank/...`` for rounds played with the bank);
- per adaptation round (``x`` = policy version): ``adapt/success_attempt_N``;
- per policy update (``x`` = policy version): ``update/loss``, ``update/kl``,
  ``update/clip_frac``, ``update/grad_norm``, ``update/ratio_mean``, ``update/ref_kl``,
  ``update/samples``, ``update/stale``, ``update/seconds``;
- per extractor update (``x`` = extractor version): ``extractor/loss``,
  ``extractor/reward`` (mean reward of its batch), ``extractor/samples``,
  ``extractor/grad_norm``, ``extractor/clip_frac``.

A full block is written once it is final: when the next training episode ends or the session
ends (``run_stopped``, ``run_failed``; :meth:`ScalarFold.finish` at the end of a log that has
neither). When the run completes (``run_stopped`` with reason "completed") the block still
open is written at the training episodes ended, if anything happened in it: its episodes'
means over as many as it holds (fewer than ``block``), and what came after the last training
episode ended (the last credits and bank entries); with no training episode after the last
full block, that tail joins it (one point per series and step). A run stopped or failed
keeps its open block for its resume. Live and exported alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from agents.events.episodes import EpisodeAbandoned, EpisodeAborted, EpisodeFinished
from agents.events.extractor import CreditAssigned, ExtractorGradientRequested, ExtractorUpdated
from agents.events.memory import TipEvicted, TipRejected, TipsRetrieved, TipStored
from agents.events.policy import AdaptRoundFinished, EvalRoundFinished, PolicyUpdated
from engine.events import Envelope, Event
from engine.lifecycle import RunFailed, RunResumed, RunStopped

__all__ = ["KINDS", "READ", "Scalar", "ScalarFold", "fold_scalars"]


class Scalar(msgspec.Struct, frozen=True, array_like=True):
    """One point of one series: its tag, step, value and the wall time (seconds since the
    epoch) of the event that completed it."""

    tag: str
    step: int
    value: float
    wall_time: float


@dataclass
class _Block:
    """What the current block of training episodes has gathered so far."""

    episodes: int = 0
    aborted: int = 0
    wins: int = 0
    reward: float = 0.0
    score: float = 0.0
    steps: int = 0
    stored: int = 0
    evicted: int = 0
    rejected: int = 0
    retrievals: int = 0
    shown: int = 0
    credits: list[float] = field(default_factory=list[float])
    paused: int = 0  # ns between a session's last event and the resume's (not run time)


@dataclass
class _Held:
    """A block closed and not yet written: its counts, the training episodes ended at its end
    (``x``), the (seq, t) of its start and end, and the training bank's size at its end."""

    block: _Block
    x: int
    start: tuple[int, int]
    end: tuple[int, int]
    bank_size: int

    def absorb(self, tail: _Block, bank_size: int) -> None:
        """Take in what came after it and before the run completed, with no training episode
        (the last credits and bank changes): one point per step, not a second at the same x."""
        b = self.block
        b.stored += tail.stored
        b.evicted += tail.evicted
        b.rejected += tail.rejected
        b.retrievals += tail.retrievals
        b.shown += tail.shown
        b.credits += tail.credits
        self.bank_size = bank_size


class ScalarFold:
    """The fold from envelopes to scalar points (pure: no clock, no I/O).

    Args:
        block: training episodes per point of the per-block series.

    Raises:
        ValueError: ``block`` is not positive.
    """

    def __init__(self, block: int = 16) -> None:
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.block = block
        self.train_episodes = 0
        self.bank_size = 0
        self._open = _Block()
        self._rewards: dict[int, float] = {}
        # per running training episode: its retrievals and the entries they showed
        self._retrieved: dict[str, tuple[int, int]] = {}
        self._mark: tuple[int, int] | None = None  # (seq, t) where the open block began
        self._held: _Held | None = None  # the last full block, written once it is final
        self._on: dict[type[Event], Callable[[Any, Envelope[Event]], list[Scalar]]] = {
            EpisodeFinished: self._episode,
            EpisodeAborted: self._episode,
            EvalRoundFinished: self._eval,
            AdaptRoundFinished: self._adapt,
            PolicyUpdated: self._policy,
            ExtractorGradientRequested: self._extractor_request,
            ExtractorUpdated: self._extractor,
            TipStored: self._bank,
            TipEvicted: self._bank,
            TipRejected: self._bank,
            TipsRetrieved: self._retrieval,
            CreditAssigned: self._credit,
            EpisodeAbandoned: self._abandoned,
            RunStopped: self._stopped,
            RunFailed: lambda ev, env: self._release(),  # the held block is final
            RunResumed: self._resumed,
        }
        self._last_t: int | None = None  # the time of the last envelope folded

    def evolve(self, env: Envelope[Event]) -> list[Scalar]:
        """Fold one envelope; returns the points it completes (most events: none)."""
        if self._mark is None:
            self._mark = (env.seq, env.t)
        handle = self._on.get(type(env.event))
        out = handle(env.event, env) if handle is not None else []
        self._last_t = env.t
        return out

    def _resumed(self, ev: RunResumed, env: Envelope[Event]) -> list[Scalar]:
        """The time from the last envelope folded (a killed session's last one of the kinds
        read) to this resume is no time of the open block's: its throughput counted the time
        the run was stopped (0.3 episodes/s for a block spanning a stop)."""
        if self._last_t is not None:
            self._open.paused += max(env.t - self._last_t, 0)
        return []

    def _episode(self, ev: EpisodeFinished | EpisodeAborted, env: Envelope[Event]) -> list[Scalar]:
        if ev.purpose != "train":
            self._retrieved.pop(ev.episode, None)
            return []
        out = self._release()  # a training episode after a full block: that block is final
        self.train_episodes += 1
        b = self._open
        b.episodes += 1
        count, shown = self._retrieved.pop(ev.episode, (0, 0))
        b.retrievals += count
        b.shown += shown
        if isinstance(ev, EpisodeAborted):
            b.aborted += 1
        else:
            b.wins += int(ev.success)
            b.reward += ev.total_reward
            b.score += ev.score
            b.steps += ev.steps
        if b.episodes == self.block:
            self._held = self._take_open(env)
        return out

    def finish(self) -> list[Scalar]:
        """The points a log that ends here still holds back: its last full block, written
        live once the next training episode ends or the session ends (``run_stopped``,
        ``run_failed``). ``coevo export`` of a live or killed run writes it."""
        return self._release()

    def _release(self) -> list[Scalar]:
        """The held full block's points (none held: none)."""
        held, self._held = self._held, None
        return [] if held is None else self._block_points(held)

    def _take_open(self, env: Envelope[Event]) -> _Held:
        """Close the open block at ``env`` and start the next one there."""
        assert self._mark is not None  # set by the first envelope
        closed = _Held(
            self._open, self.train_episodes, self._mark, (env.seq, env.t), self.bank_size
        )
        self._open = _Block()
        self._mark = (env.seq, env.t)
        return closed

    def _block_points(self, held: _Held) -> list[Scalar]:
        b, n, x = held.block, held.block.episodes, held.x
        (seq0, t0), (seq1, t1) = held.start, held.end
        seconds = (t1 - t0 - b.paused) / 1e9
        values: list[tuple[str, float]] = []
        if n:  # the run's last block may hold fewer than ``block`` episodes, or none
            values += [
                ("train/success", b.wins / n),
                ("train/return", b.reward / n),
                ("train/score", b.score / n),
                ("train/steps", b.steps / max(n - b.aborted, 1)),
                ("train/aborted", float(b.aborted)),
            ]
        values += [
            ("bank/size", float(held.bank_size)),
            ("bank/stored", float(b.stored)),
            ("bank/evicted", float(b.evicted)),
            ("bank/rejected", float(b.rejected)),
            ("retrieval/count", float(b.retrievals)),
            ("credit/count", float(len(b.credits))),
        ]
        if b.retrievals:
            values.append(("retrieval/shown", b.shown / b.retrievals))
        if b.credits:
            values.append(("credit/mean", math.fsum(b.credits) / len(b.credits)))
        if seconds > 0 and n:
            values.append(("throughput/episodes_per_s", n / seconds))
            values.append(("throughput/events_per_s", (seq1 - seq0) / seconds))
        return _points(values, x, held.end[1])

    def _stopped(self, ev: RunStopped, env: Envelope[Event]) -> list[Scalar]:
        busy = replace(self._open, paused=0) != _Block()  # anything since the last block
        if ev.reason != "completed":  # the held block is final; the open one waits for resume
            return self._release()
        if self._held is not None:  # no training episode since it: the tail joins it, at its x
            if busy:
                self._held.absorb(self._open, self.bank_size)
                self._open = _Block()
            return self._release()
        return self._block_points(self._take_open(env)) if busy else []

    def _abandoned(self, ev: EpisodeAbandoned, env: Envelope[Event]) -> list[Scalar]:
        self._retrieved.pop(ev.episode, None)  # the attempt's retrievals are not the run's
        return []

    def _eval(self, ev: EvalRoundFinished, env: Envelope[Event]) -> list[Scalar]:
        prefix = "heldout_bank" if ev.memory else "heldout"
        values = [(f"{prefix}/success", ev.success), (f"{prefix}/score", ev.score)]
        return _points(values, ev.train_episodes, env.t)

    def _adapt(self, ev: AdaptRoundFinished, env: Envelope[Event]) -> list[Scalar]:
        values = [(f"adapt/success_attempt_{a + 1}", s) for a, s in enumerate(ev.success)]
        return _points(values, ev.policy_version, env.t)

    def _policy(self, ev: PolicyUpdated, env: Envelope[Event]) -> list[Scalar]:
        values = [
            ("update/loss", ev.loss),
            ("update/kl", ev.kl),
            ("update/clip_frac", ev.clip_frac),
            ("update/grad_norm", ev.grad_norm),
            ("update/ratio_mean", ev.ratio_mean),
            ("update/ref_kl", ev.ref_kl),
            ("update/samples", float(ev.samples)),
            ("update/stale", float(ev.stale)),
            ("update/seconds", ev.seconds),
        ]
        return _points(values, ev.policy_version, env.t)

    def _extractor_request(
        self, ev: ExtractorGradientRequested, env: Envelope[Event]
    ) -> list[Scalar]:
        self._rewards[ev.update] = math.fsum(ev.rewards) / max(len(ev.rewards), 1)
        return []

    def _extractor(self, ev: ExtractorUpdated, env: Envelope[Event]) -> list[Scalar]:
        values = [
            ("extractor/loss", ev.loss),
            ("extractor/reward", self._rewards.pop(ev.update, 0.0)),
            ("extractor/samples", float(ev.samples)),
            ("extractor/grad_norm", ev.grad_norm),
            ("extractor/clip_frac", ev.clip_frac),
        ]
        return _points(values, ev.extractor_version, env.t)

    def _bank(self, ev: TipStored | TipEvicted | TipRejected, env: Envelope[Event]) -> list[Scalar]:
        if ev.slot.split("/", 1)[0] != "train":  # EMPO2's adaptation memories, evaluation
            return []
        if isinstance(ev, TipStored):
            self.bank_size += 1
            self._open.stored += 1
        elif isinstance(ev, TipEvicted):
            self.bank_size -= 1
            self._open.evicted += 1
        else:
            self._open.rejected += 1
        return []

    def _retrieval(self, ev: TipsRetrieved, env: Envelope[Event]) -> list[Scalar]:
        if ev.slot.split("/", 1)[0] == "train" and not ev.read_only:
            count, shown = self._retrieved.get(ev.episode, (0, 0))
            self._retrieved[ev.episode] = (count + 1, shown + len(ev.tip_ids))
        return []

    def _credit(self, ev: CreditAssigned, env: Envelope[Event]) -> list[Scalar]:
        self._open.credits.append(ev.credit)
        return []


KINDS: tuple[type[Event], ...] = (
    EpisodeFinished,
    EpisodeAborted,
    EvalRoundFinished,
    AdaptRoundFinished,
    PolicyUpdated,
    ExtractorGradientRequested,
    ExtractorUpdated,
    TipStored,
    TipEvicted,
    TipRejected,
    TipsRetrieved,
    CreditAssigned,
    EpisodeAbandoned,
    RunStopped,
    RunFailed,
    RunResumed,
)
"""The event types the fold reads (what the tracker folds of each batch)."""

READ = frozenset(KINDS)
""":data:`KINDS` as a set, for the membership test made on every committed event."""


def _points(values: Iterable[tuple[str, float]], step: int, t: int) -> list[Scalar]:
    wall = t / 1e9
    return [Scalar(tag, step, float(v), wall) for tag, v in values]


def fold_scalars(envelopes: Iterable[Envelope[Event]], block: int = 16) -> list[Scalar]:
    """Every point of a run's envelopes, in the order the tracker writes them (pure). Only
    envelopes of :data:`KINDS` are folded, as the tracker does: the throughput of the first
    block is measured from the first of them, whichever envelopes are given."""
    fold = ScalarFold(block)
    points = [p for env in envelopes if type(env.event) in READ for p in fold.evolve(env)]
    return points + fold.finish()
