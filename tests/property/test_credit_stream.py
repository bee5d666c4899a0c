"""The credit actor's fold on generated event streams: every credit and every extractor request
re-derives from the stream by the paper's definitions."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.credit_actor import CreditBook, CreditSettings
from agents.episode_events import EpisodeFinished
from agents.extractor_events import CreditAssigned, ExtractorGradientRequested
from agents.memory_events import TipsRetrieved
from engine.events import Event

CALLS = ["", "x1", "x2", "x3", "x4", "x5"]  # "" is a reflection tip: never credited


episode_specs = st.lists(
    st.tuples(
        st.sampled_from([None, *CALLS]),  # the call behind the entry shown at turn 0, or none
        st.integers(1, 3),  # turns that retrieved
        st.booleans(),  # success
        st.sampled_from(["train", "eval"]),
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
    for i, (call, turns, _, _) in enumerate(specs):
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
    events += [_finished(f"ep{i}", specs[i][2], specs[i][3]) for i in order]
    return events


def _finished(ep: str, success: bool, purpose: str) -> EpisodeFinished:
    return EpisodeFinished(
        episode=ep,
        worker="w",
        family="heat",
        variant=1,
        split="train",
        steps=3,
        score=1.0 if success else 0.0,
        success=success,
        total_reward=0.0,
        purpose=purpose,
    )


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
        for call, weight in zip(e.calls, e.weights, strict=True):
            if weight > 0:
                trained.setdefault(call, []).append(e.update)
        since = []
    assert len(since) == len(credits) - sum(
        len(e.credits) for e in out if isinstance(e, ExtractorGradientRequested)
    )
