"""Projections: pure folds over the event log, their digests and snapshots.

A projection turns the stream of envelopes into a state (an episode table, per-actor counts).
``evolve_many(state, envelopes) -> state`` does no I/O, reads no clock and draws no random
numbers; it takes ownership of ``state`` and may update it in place (replay folds millions
of events, and a copy per event would dominate). States are msgspec-encodable, so they can
be digested and snapshotted; the digest of a state is the BLAKE2b of its deterministic
msgpack encoding.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import msgspec

from engine.events import Envelope, Event
from engine.lifecycle import ActorFailed, ActorRestarted, ActorStarted

_ENCODER = msgspec.msgpack.Encoder(order="deterministic")
T = TypeVar("T")


class Projection(Protocol):
    """A named pure fold. ``state_type`` decodes a snapshot back into a state."""

    name: str
    state_type: type[Any]

    def initial(self) -> Any:
        """A fresh state (before any event)."""
        ...

    def evolve_many(self, state: Any, envs: Sequence[Envelope[Event]]) -> Any:
        """The state after ``envs``, folded in order (a tight loop: replay calls it with
        thousands of envelopes). May mutate and return ``state``."""
        ...


def encode_state(state: Any) -> bytes:
    """Deterministic bytes of a projection state (sorted map keys)."""
    return _ENCODER.encode(state)


def digest_bytes(data: bytes) -> str:
    """Hex BLAKE2b-128 digest of ``data``."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def digest_state(state: Any) -> str:
    """Hex digest of :func:`encode_state` (what checksums and snapshots record)."""
    return digest_bytes(encode_state(state))


def decode_state(projection: Projection, data: bytes) -> Any:
    """Decode a snapshot of ``projection``'s state."""
    return msgspec.msgpack.decode(data, type=projection.state_type)


class Fold:
    """The states of several projections folded together over one stream."""

    def __init__(self, projections: Sequence[Projection], states: dict[str, Any] | None = None):
        names = [p.name for p in projections]
        if len(set(names)) != len(names):
            raise ValueError(f"projection names must be unique, got {names}")
        self.projections = tuple(projections)
        self.states: dict[str, Any] = states or {p.name: p.initial() for p in projections}
        self.last_seq = -1

    def apply_all(self, envs: Sequence[Envelope[Event]]) -> None:
        """Fold many envelopes in order (projection by projection: they are independent)."""
        if not envs:
            return
        states = self.states
        for proj in self.projections:
            states[proj.name] = proj.evolve_many(states[proj.name], envs)
        self.last_seq = envs[-1].seq

    def encoded(self) -> dict[str, bytes]:
        """Every projection's current state encoded (what checksums digest and snapshots
        store), by name."""
        return {name: encode_state(state) for name, state in self.states.items()}

    def digests(self) -> dict[str, str]:
        """Digest of every projection's current state, by name."""
        return digests_of(self.encoded())


def digests_of(encoded: dict[str, bytes]) -> dict[str, str]:
    """The digest of each encoded state of :meth:`Fold.encoded`, by name."""
    return {name: digest_bytes(data) for name, data in encoded.items()}


# --- engine projections ---------------------------------------------------------------------


class ActorRow(msgspec.Struct, kw_only=True):
    """Per-actor statistics."""

    emitted: int = 0
    first_seq: int = -1
    last_seq: int = -1
    starts: int = 0
    failures: int = 0
    restarts: int = 0


class ActorStatsState(msgspec.Struct, kw_only=True):
    """State of :class:`ActorStats`: rows by actor name, and event counts by kind."""

    actors: dict[str, ActorRow] = msgspec.field(default_factory=dict[str, ActorRow])
    kinds: dict[str, int] = msgspec.field(default_factory=dict[str, int])


class ActorStats:
    """How many events each actor emitted, and how often it started, failed and restarted."""

    name = "actor_stats"
    state_type = ActorStatsState

    def initial(self) -> ActorStatsState:
        return ActorStatsState()

    def evolve_many(
        self, state: ActorStatsState, envs: Sequence[Envelope[Event]]
    ) -> ActorStatsState:
        classes = _tally([type(env.event) for env in envs])
        if not _ACTOR_EVENTS.isdisjoint(classes):  # rare: fold one by one, rows in stream order
            return self.evolve_each(state, envs)
        names = [env.actor for env in envs]
        backwards = names[::-1]
        actors, end = state.actors, len(envs) - 1
        for name, count in _tally(names).items():
            row = actors.get(name)
            if row is None:
                row = actors[name] = ActorRow()
            if row.emitted == 0:
                row.first_seq = envs[names.index(name)].seq
            row.emitted += count
            row.last_seq = envs[end - backwards.index(name)].seq
        kinds, tags = state.kinds, _TAGS
        for cls, count in classes.items():
            kind = tags.get(cls) or tag_of(cls)
            kinds[kind] = kinds.get(kind, 0) + count
        return state

    def evolve_each(
        self, state: ActorStatsState, envs: Sequence[Envelope[Event]]
    ) -> ActorStatsState:
        """The fold one envelope at a time (what :meth:`evolve_many` computes in bulk)."""
        actors, kinds, tags = state.actors, state.kinds, _TAGS
        for env in envs:
            row = actors.get(env.actor)
            if row is None:
                row = _row(state, env.actor)
            if row.emitted == 0:
                row.first_seq = env.seq
            row.emitted += 1
            row.last_seq = env.seq
            cls = type(env.event)
            kind = tags.get(cls) or tag_of(cls)
            kinds[kind] = kinds.get(kind, 0) + 1
            if cls in _ACTOR_EVENTS:
                self.evolve_lifecycle(state, env.event)
        return state

    def evolve_lifecycle(self, state: ActorStatsState, ev: Event) -> None:
        """Count a start, failure or restart against the actor it names."""
        if isinstance(ev, ActorStarted):
            _row(state, ev.actor).starts += 1
        elif isinstance(ev, ActorFailed):
            _row(state, ev.actor).failures += 1
        elif isinstance(ev, ActorRestarted):
            _row(state, ev.actor).restarts += 1


_ACTOR_EVENTS = frozenset({ActorStarted, ActorFailed, ActorRestarted})
_TAGS: dict[type[Event], str] = {}


def _tally(items: list[T]) -> dict[T, int]:
    """How often each item occurs, in order of first occurrence (counted in C: a batch holds
    few distinct actors and kinds, so one ``list.count`` each beats a Counter)."""
    distinct = dict.fromkeys(items)
    if len(distinct) > 8:
        return Counter(items)
    return {item: items.count(item) for item in distinct}


def tag_of(cls: type[Event]) -> str:
    """The stored tag of an event class (cached: folds call this for every event)."""
    tag = _TAGS.get(cls)
    if tag is None:
        tag = _TAGS[cls] = str(cls.__struct_config__.tag)
    return tag


def _row(state: ActorStatsState, actor: str) -> ActorRow:
    row = state.actors.get(actor)
    if row is None:
        row = state.actors[actor] = ActorRow()
    return row
