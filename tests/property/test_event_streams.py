"""Property tests on event streams: every event round-trips, and folds compose with snapshots."""

from __future__ import annotations

import itertools
from typing import Any, get_args, get_origin

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.acting.projections import EpisodeTable
from agents.events.episodes import (
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from engine.events import Codec, Envelope, Event, event_types
from engine.lifecycle import ActorFailed, ActorRestarted, ActorStarted
from engine.projection import ActorStats, Fold, decode_state, digest_state, encode_state

CODEC = Codec()
INT64 = st.integers(-(2**63), 2**63 - 1)


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """A hypothesis strategy for an event field annotation."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is int:
        return INT64
    if tp is float:
        return st.floats(allow_nan=False)
    if tp is str:
        return st.text(max_size=30)
    if tp is bool:
        return st.booleans()
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(strategy_for(args[0]), max_size=4).map(tuple)
    if origin is tuple:  # fixed length: tuple[str, str]
        return st.tuples(*(strategy_for(a) for a in args))
    if origin is dict:
        return st.dictionaries(strategy_for(args[0]), strategy_for(args[1]), max_size=3)
    if type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return st.none() | strategy_for(inner)
    raise NotImplementedError(tp)


def event_strategy(cls: type[Event]) -> st.SearchStrategy[Event]:
    hints = msgspec.structs.fields(cls)
    return st.fixed_dictionaries({f.name: strategy_for(f.type) for f in hints}).map(
        lambda kw: cls(**kw)
    )


PROJECT_EVENTS = sorted(
    (cls for tag, cls in event_types().items() if not tag.startswith("test_")),
    key=lambda c: c.__name__,
)
ANY_EVENT = st.one_of([event_strategy(cls) for cls in PROJECT_EVENTS])


@settings(max_examples=300)
@given(ev=ANY_EVENT, seq=st.integers(0, 2**40), cause=st.none() | st.integers(0, 2**40))
def test_every_event_round_trips_through_the_codec(ev: Event, seq: int, cause: int | None) -> None:
    env = Envelope(seq=seq, run="r", t=seq, actor="a", event=ev, cause=cause, corr="c", v=1)
    assert CODEC.decode(CODEC.encode(env), seq) == env


# --- folds -------------------------------------------------------------------------------------

EPISODES = st.sampled_from([f"ep{i:06d}" for i in range(6)])
WORKERS = st.sampled_from(["w0", "w1"])
FAMILIES = st.sampled_from(["fetch", "heat"])

DOMAIN_EVENT = st.one_of(
    st.builds(
        EpisodeAssigned,
        episode=EPISODES,
        index=st.integers(0, 10),
        worker=WORKERS,
        family=FAMILIES,
        variant=st.integers(0, 5),
        split=st.just("train"),
        seed=st.integers(0, 100),
    ),
    st.builds(
        EpisodeStarted,
        episode=EPISODES,
        worker=WORKERS,
        goal=st.just("g"),
        observation=st.just("o"),
        admissible=st.just(("look",)),
    ),
    st.builds(
        StepTaken,
        episode=EPISODES,
        turn=st.integers(0, 20),
        action=st.just("look"),
        observation=st.just("o"),
        admissible=st.just(("look",)),
        reward=st.floats(0, 1),
        done=st.booleans(),
        score=st.floats(0, 1),
    ),
    st.builds(
        EpisodeFinished,
        episode=EPISODES,
        worker=WORKERS,
        family=FAMILIES,
        variant=st.integers(0, 5),
        split=st.just("train"),
        steps=st.integers(0, 20),
        score=st.floats(0, 1),
        success=st.booleans(),
        total_reward=st.floats(0, 1),
    ),
    st.builds(EpisodeAborted, episode=EPISODES, worker=WORKERS, reason=st.just("x")),
    st.builds(ActorStarted, actor=WORKERS, actor_type=st.just("T"), seed=st.integers(0, 9)),
    st.builds(
        ActorFailed,
        actor=WORKERS,
        attempt=st.integers(0, 3),
        error_type=st.just("E"),
        message=st.just("m"),
        traceback=st.just("t"),
        action=st.just("restart"),
    ),
    st.builds(ActorRestarted, actor=WORKERS, attempt=st.integers(1, 3)),
)


def envelopes(events: list[Event]) -> list[Envelope[Event]]:
    return [
        Envelope(seq=i, run="r", t=0, actor=("w0", "w1", "runtime")[i % 3], event=ev, v=1)
        for i, ev in enumerate(events)
    ]


PROJECTIONS = (ActorStats(), EpisodeTable())


@settings(max_examples=200)
@given(events=st.lists(DOMAIN_EVENT, max_size=60), data=st.data())
def test_fold_of_all_equals_fold_of_snapshot_then_rest(events: list[Event], data: Any) -> None:
    envs = envelopes(events)
    cut = data.draw(st.integers(0, len(envs)))
    whole = Fold(PROJECTIONS)
    whole.apply_all(envs)
    head = Fold(PROJECTIONS)
    head.apply_all(envs[:cut])
    restored = Fold(
        PROJECTIONS,
        {p.name: decode_state(p, encode_state(head.states[p.name])) for p in PROJECTIONS},
    )
    restored.apply_all(envs[cut:])
    assert restored.digests() == whole.digests()
    assert msgspec.to_builtins(restored.states) == msgspec.to_builtins(whole.states)


@settings(max_examples=100)
@given(events=st.lists(DOMAIN_EVENT, max_size=40))
def test_fold_is_deterministic_and_digest_ignores_dict_insertion_order(
    events: list[Event],
) -> None:
    a = Fold(PROJECTIONS)
    a.apply_all(envelopes(events))
    b = Fold(PROJECTIONS)
    b.apply_all(envelopes(events))
    assert a.digests() == b.digests()
    table = a.states["episodes"]
    reordered = dict(reversed(list(table.episodes.items())))
    table_copy = msgspec.structs.replace(table, episodes=reordered)
    assert digest_state(table_copy) == digest_state(table)


def reference_family_counts(events: list[Event]) -> dict[str, tuple[int, int, int]]:
    """(finished, successes, aborted) per family, by the plain reading of the episode rules."""
    family: dict[str, str] = {}
    ended: dict[str, bool] = {}
    counts: dict[str, list[int]] = {}
    for ev in events:
        if isinstance(ev, EpisodeAssigned):
            family[ev.episode] = ev.family
            ended[ev.episode] = False
        elif isinstance(ev, EpisodeFinished | EpisodeAborted):
            if ev.episode not in family or ended[ev.episode]:
                continue
            ended[ev.episode] = True
            row = counts.setdefault(family[ev.episode], [0, 0, 0])
            if isinstance(ev, EpisodeFinished):
                row[0] += 1
                row[1] += int(ev.success)
            else:
                row[2] += 1
    return {fam: (a, b, c) for fam, (a, b, c) in counts.items()}


@settings(max_examples=200)
@given(events=st.lists(DOMAIN_EVENT, max_size=60))
def test_episode_table_counts_each_episode_end_once(events: list[Event]) -> None:
    fold = Fold(PROJECTIONS)
    fold.apply_all(envelopes(events))
    state = fold.states["episodes"]
    got = {f: (r.episodes, r.successes, r.aborted) for f, r in state.families.items()}
    assert got == reference_family_counts(events)


ACTOR_NAMES = st.sampled_from([f"a{i}" for i in range(12)] + ["runtime"])


@settings(max_examples=200)
@given(
    events=st.lists(st.tuples(ACTOR_NAMES, DOMAIN_EVENT), max_size=80),
    cuts=st.lists(st.integers(1, 79), max_size=6),
)
def test_actor_stats_bulk_fold_equals_the_fold_one_by_one(
    events: list[tuple[str, Event]], cuts: list[int]
) -> None:
    """``evolve_many`` counts a batch in bulk; whatever the batches, it ends where the fold one
    envelope at a time ends, down to the order of the rows."""
    envs = [
        Envelope(seq=i, run="r", t=0, actor=actor, event=ev, v=1)
        for i, (actor, ev) in enumerate(events)
    ]
    stats = ActorStats()
    bounds = sorted({0, len(envs), *(c for c in cuts if c < len(envs))})
    bulk = stats.initial()
    for a, b in itertools.pairwise(bounds):
        bulk = stats.evolve_many(bulk, envs[a:b])
    each = stats.evolve_each(stats.initial(), envs)
    assert msgspec.to_builtins(bulk) == msgspec.to_builtins(each)
    assert list(bulk.actors) == list(each.actors) and list(bulk.kinds) == list(each.kinds)
