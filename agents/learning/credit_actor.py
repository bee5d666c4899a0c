"""The credit actor: turns guided episodes' outcomes into credit for the extractor calls that
wrote the entries they used, and asks for extractor updates.

Every training episode that was shown a bank entry written by an extractor call earns that call
a :class:`CreditAssigned` (+1 success, -1 failure). A call's reward is the mean of all its
credits so far (:func:`agents.methods.credit.call_rewards`). Once ``batch`` distinct calls have new
credit, the actor emits :class:`ExtractorGradientRequested` with their rewards, advantages
(reward minus the batch mean) and count-aware weights (:func:`agents.methods.credit.reweight`),
naming
the credits it consumed. Everything it emits is a function of the events it folded, so
``coevo audit`` can re-derive it from the log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agents.events.episodes import EpisodeAbandoned, EpisodeFinished
from agents.events.extractor import (
    CreditAssigned,
    CreditsDue,
    CreditsSettled,
    ExtractorGradientRequested,
)
from agents.events.memory import TipsRetrieved
from agents.methods.credit import call_rewards, episode_credit, extractor_advantages, reweight
from agents.methods.settings import ComplementaryConfig
from engine.actor import Context
from engine.events import Event
from engine.recovery import Replayed


@dataclass(frozen=True)
class CreditSettings:
    """Complementary RL's extractor-training knobs.

    Attributes:
        batch: credited calls per extractor update.
        lr: the extractor's learning rate.
        clip_low, clip_high: CISPO's ratio clip.
        max_grad_norm: gradient clipping.
        alpha: the count exponent of the reweighting.
        cooldown: updates after training on a call during which its weight is 0.
        counts: which updates count as training a call (its count and cooldown): "pushed",
            one that gave it a weight and a non-zero advantage; "weighted", any that gave it
            a weight (before 2026-12-06: a batch whose calls all had the same reward trained
            nothing, yet put every call in cooldown, and the next batch, often the first with
            any signal, weighed them 0).
        rule: "success" (+1 / -1, the paper's) or "score" (``2 * score - 1``: a world's partial
            score, in [-1, 1] when the score is in [0, 1]); "relative" (the episode's reward
            minus its group's free subgroup's mean,
            :func:`agents.methods.credit.relative_credit`) only in ``coevo audit``, which
            passes each credit to :meth:`CreditBook.decide`; so is a researcher's own rule,
            ``package.module:function`` (recorded under that name).
    """

    batch: int = 64
    lr: float = 1e-4
    clip_low: float = 0.1
    clip_high: float = 0.1
    max_grad_norm: float = 1.0
    alpha: float = 0.5
    cooldown: int = 1
    rule: str = "success"
    counts: str = "pushed"


@dataclass
class CreditBook:
    """The credit actor's state, a pure fold of retrievals and episode ends.

    Attributes:
        used: episode -> (entry, call) of the extractor-written entry it was shown.
        credits: per call, every credit it received so far, in order (calls in order of their
            first credit).
        pending: calls with credit since the last update, in order, with their episodes.
        consumed: the episodes of those credits, in credit order.
        trained: call -> (times trained on, last update) for the reweighting.
        updates: extractor updates requested so far.
    """

    used: dict[str, tuple[int, str]] = field(default_factory=dict[str, tuple[int, str]])
    credits: dict[str, list[float]] = field(default_factory=dict[str, list[float]])
    pending: dict[str, list[str]] = field(default_factory=dict[str, list[str]])
    consumed: list[str] = field(default_factory=list[str])
    trained: dict[str, tuple[int, int]] = field(default_factory=dict[str, tuple[int, int]])
    updates: int = 0

    def decide(
        self,
        ev: Event,
        settings: CreditSettings,
        credit_for: Callable[[EpisodeFinished], float] | None = None,
    ) -> list[Event]:
        """The events that ``ev`` causes (and the state change it brings).

        Args:
            ev: a :class:`TipsRetrieved`, :class:`EpisodeFinished` or :class:`EpisodeAbandoned`
                (the attempt's retrieval no longer counts: the episode is played again).
            settings: the batch size, rule and loss settings.
            credit_for: the credit of an episode by the caller's rule (one that needs more
                than the episode, e.g. "relative", or a researcher's own), asked only for an
                episode that is credited; None: :func:`credit_of` under ``settings.rule``.
        """
        if isinstance(ev, TipsRetrieved):
            if ev.turn == 0 and ev.tip_ids and ev.calls and ev.calls[0]:
                self.used[ev.episode] = (ev.tip_ids[0], ev.calls[0])
            return []
        assert isinstance(ev, EpisodeFinished | EpisodeAbandoned)
        used = self.used.pop(ev.episode, None)
        if isinstance(ev, EpisodeAbandoned) or used is None or ev.purpose != "train":
            return []
        entry, call = used
        credit = credit_of(ev, settings.rule) if credit_for is None else credit_for(ev)
        self.credits.setdefault(call, []).append(credit)
        self.pending.setdefault(call, []).append(ev.episode)
        self.consumed.append(ev.episode)
        out: list[Event] = [
            CreditAssigned(
                episode=ev.episode,
                entry=entry,
                call=call,
                success=ev.success,
                credit=credit,
                step=self.updates,
                rule=RULES.get(settings.rule, settings.rule),
            )
        ]
        if len(self.pending) >= settings.batch:
            out.append(self._request(settings))
        return out

    def _request(self, s: CreditSettings) -> ExtractorGradientRequested:
        calls = list(self.pending)
        # r(m) of the batch's calls only: each is the mean of all its credits so far, so a
        # request costs the batch's credits, not every credit of the run
        rewards = call_rewards((c, x) for c in calls for x in self.credits[c])
        step = self.updates
        weights = []
        for call in calls:
            count, last = self.trained.get(call, (0, None))
            weights.append(reweight(count, last, step, cooldown=s.cooldown, alpha=s.alpha))
        req = ExtractorGradientRequested(
            update=step,
            step=step,
            calls=tuple(calls),
            rewards=tuple(rewards[c] for c in calls),
            advantages=tuple(extractor_advantages(rewards, calls)),
            weights=tuple(weights),
            credits=tuple(self.consumed),
            lr=s.lr,
            clip_low=s.clip_low,
            clip_high=s.clip_high,
            max_grad_norm=s.max_grad_norm,
            alpha=s.alpha,
            cooldown=s.cooldown,
        )
        pushed = s.counts != "weighted"
        for call, w, a in zip(calls, weights, req.advantages, strict=True):
            if w > 0 and (a != 0 or not pushed):
                count, _ = self.trained.get(call, (0, None))
                self.trained[call] = (count + 1, step)
        self.pending.clear()
        self.consumed.clear()
        self.updates += 1
        return req


RULES = {"success": "outcome-pm1", "score": "score-2x-1", "relative": "reward-minus-free-mean"}
"""Credit rules by name, with the name each records in :class:`CreditAssigned`."""


def credit_settings(c: ComplementaryConfig) -> CreditSettings:
    """The credit actor's settings from a scenario's ``[complementary]`` table."""
    return CreditSettings(
        batch=c.batch,
        lr=c.lr,
        clip_low=c.clip_low,
        clip_high=c.clip_high,
        max_grad_norm=c.max_grad_norm,
        alpha=c.alpha,
        cooldown=c.cooldown,
        rule=c.credit,
        counts=c.reweight_counts,
    )


def credit_of(ev: EpisodeFinished, rule: str) -> float:
    """An episode's credit under ``rule`` (see :class:`CreditSettings`).

    Raises:
        ValueError: an unknown rule.
    """
    if rule == "success":
        return episode_credit(ev.success)
    if rule == "score":
        return 2.0 * ev.score - 1.0
    if rule == "relative":
        raise ValueError("the relative rule needs the episode's group: pass its credit")
    raise ValueError(f"unknown credit rule {rule!r}; known: {sorted(RULES)}")


class CreditActor(Replayed):
    """Credits extractor calls with the outcomes of the episodes their entries guided.

    Its state is the :class:`CreditBook`, a fold of what it receives, so a resumed run
    replays it on the log (:meth:`Replayed.recover`).

    Args:
        settings: batch size and the extractor's loss settings.
    """

    subscribes = (TipsRetrieved, EpisodeFinished, EpisodeAbandoned, CreditsDue)

    def __init__(self, settings: CreditSettings) -> None:
        self._settings = settings
        self._book = CreditBook()

    async def handle(self, ctx: Context, ev: Event) -> bool:
        if isinstance(ev, CreditsDue):  # every end before it is folded: say so, and how far
            await ctx.emit(CreditsSettled(updates=self._book.updates))
            return False
        for out in self._book.decide(ev, self._settings):
            await ctx.emit(out)
        return False
