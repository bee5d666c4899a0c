"""The credit actor's fold on generated event streams: every credit and every extractor request
re-derives from the stream by the paper's definitions."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.events.episodes import EpisodeFinished
from agents.events.extractor import CreditAssigned, ExtractorGradientRequested
from agents.events.memory import TipsRetrieved
from agents.learning.credit_actor import CreditBook, CreditSettings
from engine.events import Event

CALLS = ["", "x1", "x2", "x3", "x4", "x5"]  # "" is a reflection tip: never credited


episode_specs = st.lists(
    st.tuples(
        st.sampled_from([None, *CALLS]),  # the call behind the entry shown at turn 0, or none
        st.integers(1, 3),  # turns that retrieved
        st.booleans(),  # success
        st.sampled_from(["train", "eval"]),
        st.sampled_from([0.0, 0.3, 0.5]),  # the score of a failure (a success scores 1)
    ),
    min_size=1,
    max_size=30,
)


@st.composite
def streams(draw: st.DrawFn) -> list[Event]:
    """Episodes that may retrieve an entry at turn 0 (and later turns), then finish in any
    order."""
    specs = draw(episode_specs)
    events: list[Event] = []
    for i, (call, turns, *_) in enumerate(specs):
        if call is None:
            continue
        events += [
            TipsRetrieved(
                episode=f"ep{i}",
                worker="w",
                turn=turn,
                slot="train/heat",
                tip_ids=(CALLS.index(call),),
                similarities=(0.5,),
                ranks=(0,),
                tips=("t",),
                similar=1,
                slot_size=3,
                calls=(call,),
            )
            for turn in range(turns)
        ]
    order = draw(st.permutations(range(len(specs))))
    events += [_finished(f"ep{i}", specs[i][2], specs[i][3], specs[i][4]) for i in order]
    return events


def _finished(ep: str, success: bool, purpose: str, partial: float = 0.0) -> EpisodeFinished:
    return EpisodeFinished(
        episode=ep,
        worker="w",
        family="heat",
        variant=1,
        split="train",
        steps=3,
        score=1.0 if success else partial,
        success=success,
        total_reward=0.0,
        purpose=purpose,
    )


RULE_TAGS = {"success": "outcome-pm1", "score": "score-2x-1"}
"""The name each credit rule records (docs/AUDIT.md)."""


def oracle(stream: list[Event], s: CreditSettings) -> list[list[Event]]:
    """What the credit actor must emit for each event of ``stream``, written from
    ALGORITHMS.md section 3 (not from ``CreditBook``): a training episode shown an entry
    written by an extractor call at turn 0 credits that call (+1 / -1, or ``2 * score - 1``);
    once ``batch`` calls have new credit, one extractor request for them, in order of their
    first new credit, with r(m) the mean of all of a call's credits so far, A(m) = r(m) minus
    the batch's mean r (exactly 0 when every r is equal), and w(m) = 0 if the call was trained
    on within the last ``cooldown`` updates, else ``(1 + times trained) ** -alpha``; an update
    trains on a call it gives a weight and a non-zero advantage (``counts="pushed"``), or any
    weight (``"weighted"``, as runs before 2026-12-06 counted)."""
    shown: dict[str, tuple[int, str]] = {}
    history: dict[str, list[float]] = {}  # call -> every credit so far
    new: dict[str, None] = {}  # calls with credit since the last request, in order
    since: list[str] = []  # the episodes of those credits
    trained: dict[str, list[int]] = {}  # call -> the updates that trained on it
    updates = 0
    out: list[list[Event]] = []
    for ev in stream:
        made: list[Event] = []
        out.append(made)
        if isinstance(ev, TipsRetrieved):
            if ev.turn == 0 and ev.tip_ids and ev.calls and ev.calls[0]:
                shown[ev.episode] = (ev.tip_ids[0], ev.calls[0])
            continue
        entry_call = shown.pop(getattr(ev, "episode", ""), None)
        if not isinstance(ev, EpisodeFinished) or entry_call is None or ev.purpose != "train":
            continue
        entry, call = entry_call
        credit = (1.0 if ev.success else -1.0) if s.rule == "success" else 2.0 * ev.score - 1.0
        history.setdefault(call, []).append(credit)
        new[call] = None
        since.append(ev.episode)
        made.append(
            CreditAssigned(
                episode=ev.episode, entry=entry, call=call, success=ev.success, credit=credit,
                step=updates, rule=RULE_TAGS[s.rule],
            )
        )  # fmt: skip
        if len(new) < s.batch:
            continue
        calls = list(new)
        rewards = [math.fsum(history[c]) / len(history[c]) for c in calls]
        mean = math.fsum(rewards) / len(rewards)
        advantages = [0.0 if len(set(rewards)) == 1 else r - mean for r in rewards]
        weights = []
        for c in calls:
            past = trained.get(c, [])
            cooling = bool(past) and updates - past[-1] <= s.cooldown
            weights.append(0.0 if cooling else (1 + len(past)) ** -s.alpha)
        made.append(
            ExtractorGradientRequested(
                update=updates, step=updates, calls=tuple(calls), rewards=tuple(rewards),
                advantages=tuple(advantages), weights=tuple(weights), credits=tuple(since),
                lr=s.lr, clip_low=s.clip_low, clip_high=s.clip_high,
                max_grad_norm=s.max_grad_norm, alpha=s.alpha, cooldown=s.cooldown,
            )
        )  # fmt: skip
        for c, w, a in zip(calls, weights, advantages, strict=True):
            if w > 0 and (a != 0 or s.counts == "weighted"):
                trained.setdefault(c, []).append(updates)
        new, since, updates = {}, [], updates + 1
    return out


@settings(max_examples=150, deadline=None)
@given(
    stream=streams(),
    batch=st.integers(1, 4),
    cooldown=st.integers(0, 2),
    rule=st.sampled_from(["success", "score"]),
    counts=st.sampled_from(["pushed", "weighted"]),
)
def test_the_credit_book_emits_what_the_oracle_says(
    stream: list[Event], batch: int, cooldown: int, rule: str, counts: str
) -> None:
    s = CreditSettings(batch=batch, cooldown=cooldown, alpha=0.5, rule=rule, counts=counts)
    book = CreditBook()
    assert [book.decide(ev, s) for ev in stream] == oracle(stream, s)


@settings(max_examples=150, deadline=None)
@given(stream=streams(), batch=st.integers(1, 4), cooldown=st.integers(0, 2))
def test_credits_and_requests_re_derive_from_the_stream(
    stream: list[Event], batch: int, cooldown: int
) -> None:
    s = CreditSettings(batch=batch, cooldown=cooldown, alpha=0.5)
    book = CreditBook()
    out = [e for ev in stream for e in book.decide(ev, s)]

    # every credit: a train episode shown an extractor entry at turn 0, +1 / -1 by its outcome
    used = {
        ev.episode: ev.calls[0] for ev in stream if isinstance(ev, TipsRetrieved) and ev.turn == 0
    }
    ends = [ev for ev in stream if isinstance(ev, EpisodeFinished)]
    expected = [
        (e.episode, used[e.episode], 1.0 if e.success else -1.0)
        for e in ends
        if e.purpose == "train" and used.get(e.episode)
    ]
    credits = [e for e in out if isinstance(e, CreditAssigned)]
    assert [(c.episode, c.call, c.credit) for c in credits] == expected

    # every request consumes the credits since the last one, once each, in order
    so_far: list[CreditAssigned] = []
    since: list[CreditAssigned] = []
    trained: dict[str, list[int]] = {}
    for e in out:
        if isinstance(e, CreditAssigned):
            so_far.append(e)
            since.append(e)
            continue
        assert isinstance(e, ExtractorGradientRequested)
        assert list(e.credits) == [c.episode for c in since]
        assert list(e.calls) == list(dict.fromkeys(c.call for c in since))
        assert len(e.calls) == batch
        for call, reward, adv, weight in zip(
            e.calls, e.rewards, e.advantages, e.weights, strict=True
        ):
            mine = [c.credit for c in so_far if c.call == call]
            assert reward == math.fsum(mine) / len(mine)
            assert math.isclose(adv, reward - math.fsum(e.rewards) / len(e.rewards), abs_tol=1e-12)
            steps = trained.get(call, [])
            if steps and e.update - steps[-1] <= cooldown:
                assert weight == 0.0
            else:
                assert weight == (1 + len(steps)) ** -0.5
        for call, weight, adv in zip(e.calls, e.weights, e.advantages, strict=True):
            if weight > 0 and adv != 0:  # a push on its log-probs: trained on
                trained.setdefault(call, []).append(e.update)
        since = []
    assert len(since) == len(credits) - sum(
        len(e.credits) for e in out if isinstance(e, ExtractorGradientRequested)
    )


def _shown(ep: str, call: str) -> TipsRetrieved:
    return TipsRetrieved(
        episode=ep, worker="w", turn=0, slot="train/heat", tip_ids=(CALLS.index(call),),
        similarities=(0.5,), ranks=(0,), tips=("t",), similar=1, slot_size=3, calls=(call,),
    )  # fmt: skip


def test_a_batch_that_taught_nothing_puts_no_call_in_cooldown() -> None:
    """A first batch whose calls all failed has every advantage 0 and trains nothing; it put
    both calls in cooldown all the same, so the next batch, the first with any signal,
    weighed them 0 and taught nothing either."""
    stream: list[Event] = []
    first = [("e1", "x1", False), ("e2", "x2", False)]  # both fail: advantages 0, 0
    second = [("e3", "x1", True), ("e4", "x2", False)]
    for ep, call, success in first + second:
        stream += [_shown(ep, call), _finished(ep, success, "train")]
    for counts, weights in [("pushed", (1.0, 1.0)), ("weighted", (0.0, 0.0))]:
        book = CreditBook()
        s = CreditSettings(batch=2, cooldown=1, alpha=0.5, counts=counts)
        requests = [
            e
            for ev in stream
            for e in book.decide(ev, s)
            if isinstance(e, ExtractorGradientRequested)
        ]
        assert [r.advantages for r in requests] == [(0.0, 0.0), (0.5, -0.5)]
        assert requests[1].weights == weights, counts
