"""Two runs compared (``coevo diff RUN_A RUN_B``): the differences between their resolved
scenarios, and the first event at which their logs diverge.

A run's actors are concurrent, so two runs of one deterministic scenario record the same
events in different interleavings (which worker started first, whose request the memory
answered first, which worker played an episode). The logs are therefore compared stream by
stream: a *stream* is the events one actor emitted under one correlation id (an episode's, or
none), the runtime's events per actor they name, and an episode's events on whichever worker
played it (``worker-3`` is ``worker`` within an episode). Each actor handles its mailbox in
order, so in a deterministic run each stream is the same sequence in both logs. The divergence
is the earliest event (by seq in ``A``) at which some stream differs, or the first event past
the end of the shorter one.

Two events are the same when their kinds and fields are, leaving out what records the wall
clock or where a run lives (:data:`VOLATILE`) and the ``cause`` seq (it moves with the
interleaving). The runtime's checksums and snapshots (:data:`DERIVED`) fold the interleaving
itself and are not compared, nor what a session records (:data:`SESSION`: a resume, actors
starting again); an attempt of an episode that a stop (or a worker's restart) abandoned is
left out, its re-run compared: a run stopped and resumed compares equal to the run left
alone when it did the same. An extractor call's id is the seq of its request (``x1786``), and
a bank entry's id its place in the order entries were stored across all slots: both move with
the interleaving too (no prompt shows either: entries are shown by position). Calls are
compared, and named in streams, by what they are about (``extract:ep000035:train/heat``,
:func:`agents.events.extractor.subject_of`), entries by the call (or the reflected episode)
that stored them and their place among its entries (``extract:ep000035:train/heat#0``). The
functions are pure.
"""

from __future__ import annotations

import re
import tomllib
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any, NamedTuple

import msgspec

from agents.events.extractor import ExtractorCalled, subject_of
from agents.events.memory import TipStored
from engine.events import Envelope, Event

__all__ = [
    "DERIVED",
    "SESSION",
    "SUBJECT",
    "VOLATILE",
    "Change",
    "Divergence",
    "Found",
    "Names",
    "describe",
    "diverging_seqs",
    "scenario_changes",
]

VOLATILE = frozenset({"seconds", "run_id", "coevo_version", "scenario_hash", "scenario", "worker"})
"""Event fields left out of the comparison: wall time spent, the run's id and the coevo that
wrote it, the scenario's name and hash (the scenario's differences are listed apart), and the
worker that played an episode (scheduling)."""

DERIVED = frozenset({"projection_checked", "snapshot_taken"})
"""Kinds not compared: digests of folds whose intermediate states depend on the interleaving."""

SESSION = frozenset({"run_resumed", "actor_started"})
"""Kinds not compared: what a session of the run records (a resumed run has one more
``run_resumed`` and its actors start again), not what the run did. So is how a session that
was resumed ended (its ``run_stopped`` by a signal, its ``run_failed`` and the
``actor_failed`` that stopped it): only the log's last end, the run's own, is compared."""

ENDS = frozenset({"run_stopped", "run_failed"})
"""How a session ends (with an ``actor_failed`` whose action is "stop"): compared only when
no session follows it."""

_ENCODER = msgspec.msgpack.Encoder(order="deterministic")


class Change(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One scenario key whose value differs (``None``: the key is missing on that side;
    ``default_a``/``default_b``: that side's value is the table's default, not written;
    ``before_a``/``before_b``: that side's run was recorded before the setting existed, and
    ran as this value says)."""

    key: str
    a: Any
    b: Any
    default_a: bool = False
    default_b: bool = False
    before_a: bool = False
    before_b: bool = False


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """Where the logs first differ: each side's envelope (None: that stream ended before it)
    as ``coevo log --json`` prints one, the stream, and the names of what differs."""

    seq_a: int | None
    seq_b: int | None
    stream: str
    a: dict[str, Any] | None
    b: dict[str, Any] | None
    differing: tuple[str, ...]


def scenario_changes(
    a_toml: str,
    b_toml: str,
    defaults: Mapping[str, Mapping[str, Any]] | None = None,
    before: tuple[Mapping[str, Any], Mapping[str, Any]] = ({}, {}),
) -> list[Change]:
    """The keys (dotted paths) whose values differ between two resolved scenarios, sorted.

    Args:
        defaults: tables a scenario fills only with what it changes (dotted table -> key ->
            default, ``scenarios.schema.table_defaults``): a key missing there on one side
            is compared as its default, so a key written at its default is no difference.
        before: per side, the settings its run lacks because it was recorded before they
            existed (dotted key -> the value it ran as, ``scenarios.loader.SINCE``): compared
            as that value.

    Raises:
        ValueError: a text is not TOML.
    """
    try:
        a, b = _flat(tomllib.loads(a_toml)), _flat(tomllib.loads(b_toml))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"a scenario is not TOML: {exc}") from None
    filled = _flat(defaults or {})
    a_before = {k: v for k, v in before[0].items() if k not in a}
    b_before = {k: v for k, v in before[1].items() if k not in b}
    a, b = {**a_before, **a}, {**b_before, **b}
    a_default = {k: v for k, v in filled.items() if k not in a}
    b_default = {k: v for k, v in filled.items() if k not in b}
    a, b = {**a_default, **a}, {**b_default, **b}
    return [
        Change(
            key=key,
            a=a.get(key),
            b=b.get(key),
            default_a=key in a_default,
            default_b=key in b_default,
            before_a=key in a_before,
            before_b=key in b_before,
        )
        for key in sorted(a.keys() | b.keys())
        if a.get(key) != b.get(key)
    ]


SUBJECT = (
    "episode",
    "group",
    "round",
    "update",
    "step",
    "call",
    "slot",
    "policy_version",
    "extractor_version",
)
"""The fields that say what an event is about, in the name of its stream when its correlation
id is an episode the event is not about (:func:`stream_of`)."""


@dataclass
class Names:
    """What a log's extractor calls and bank entries are compared as (see the module's
    docstring), filled as the log is read: a call's answer, and an entry's storing, come
    before anything names them."""

    calls: dict[str, str] = field(default_factory=dict[str, str])
    tips: dict[int, str] = field(default_factory=dict[int, str])
    stored: dict[str, int] = field(default_factory=dict[str, int])  # entries per call so far

    def read(self, ev: Event) -> None:
        if isinstance(ev, ExtractorCalled):
            self.calls[ev.call] = ":".join(subject_of(ev))
        elif isinstance(ev, TipStored):
            by = ev.call or f"reflect:{ev.episode}:{ev.slot}"
            k = self.stored.get(by, 0)
            self.stored[by] = k + 1
            self.tips[ev.tip_id] = f"{self.calls.get(by, by)}#{k}"


_TIP = frozenset({"tip_id", "entry", "duplicate_of"})
_TIPS = frozenset({"tip_ids", "parents", "entries"})


class Found(NamedTuple):
    """The first divergence: its stream, the seq of each side's event there (None: that
    side's stream ended), and each log's :class:`Names` (for :func:`describe`)."""

    stream: str
    seq_a: int | None
    seq_b: int | None
    names_a: Names
    names_b: Names


def stream_of(env: Envelope[Event], names: Names | None = None) -> str:
    """The stream an envelope belongs to: ``actor/corr``, the runtime's by the actor its
    event names (``runtime:worker-0/``), an actor numbered ``-N`` within an episode without its
    number (``worker/ep000005``). An event emitted under an episode's id but not about that
    episode (the trainer's group advantages, gradient request or evaluation round, emitted when
    whichever episode ended last ended; the credit actor's extractor update) is in the stream of
    its actor, kind and :data:`SUBJECT` fields instead (``trainer/advantages_computed:
    group=g00003``): which episode ended last is timing, not the run's behaviour. A ``call``
    is named by what it is about where ``names`` knows it."""
    subject = getattr(env.event, "actor", None) if env.actor == "runtime" else None
    name = f"{env.actor}:{subject}" if isinstance(subject, str) else env.actor
    if not env.corr:
        return f"{name}/"
    name = re.sub(r"-\d+$", "", name)
    if env.actor != "runtime" and getattr(env.event, "episode", None) != env.corr:
        about = ",".join(
            f"{field}={_named(getattr(env.event, field), field, names or Names())}"
            for field in SUBJECT
            if hasattr(env.event, field)
        )
        return f"{name}/{env.event.__struct_config__.tag}:{about}"
    return f"{name}/{env.corr}"


def diverging_seqs(a: Iterable[Envelope[Event]], b: Iterable[Envelope[Event]]) -> Found | None:
    """The first divergence of ``a`` and ``b`` (see the module's docstring), or None when every
    stream is the same."""
    names_a, names_b = Names(), Names()
    streams_a, streams_b = _streams(a, names_a), _streams(b, names_b)
    found: tuple[int, str, int | None, int | None] | None = None
    for name in streams_a.keys() | streams_b.keys():
        xs, ys = streams_a.get(name, _NONE), streams_b.get(name, _NONE)
        digests = zip(xs[1::2], ys[1::2], strict=False)
        i = next((i for i, (x, y) in enumerate(digests) if x != y), min(len(xs), len(ys)) // 2)
        if 2 * i == len(xs) == len(ys):
            continue
        seq_a = xs[2 * i] if 2 * i < len(xs) else None
        seq_b = ys[2 * i] if 2 * i < len(ys) else None
        order = seq_a if seq_a is not None else seq_b
        assert order is not None  # one of the two streams goes on past i
        if found is None or (order, name) < found[:2]:
            found = (order, name, seq_a, seq_b)
    return None if found is None else Found(*found[1:], names_a, names_b)


def describe(
    stream: str,
    env_a: Envelope[Event] | None,
    env_b: Envelope[Event] | None,
    names: tuple[Names, Names] | None = None,
) -> Divergence:
    """The :class:`Divergence` of two envelopes (one may be missing); ``names``: each log's
    :class:`Names` (:class:`Found`), so that two ids of one call or entry are no difference."""
    if env_a is None or env_b is None:
        differing: tuple[str, ...] = ("end of stream",)
    else:
        name_a, name_b = names or (Names(), Names())
        key_a, key_b = _comparable(env_a, name_a), _comparable(env_b, name_b)
        differing = tuple(
            name
            for name in sorted(key_a.keys() | key_b.keys())
            if key_a.get(name) != key_b.get(name)
        )
    return Divergence(
        seq_a=env_a.seq if env_a else None,
        seq_b=env_b.seq if env_b else None,
        stream=stream,
        a=_plain(env_a),
        b=_plain(env_b),
        differing=differing,
    )


_NONE: array[int] = array("Q")


def _streams(envs: Iterable[Envelope[Event]], names: Names) -> dict[str, array[int]]:
    """Each stream's events as ``seq, digest`` pairs in one flat array (the digest: 64 bits
    of BLAKE2b over the event's comparable form, so a log costs ~16 bytes per event here, not
    its events; two different events share a digest with probability 2**-64); an abandoned
    attempt's events are dropped when its ``episode_abandoned`` comes (the episode runs again
    from its assignment, as in a run that was never stopped). ``names`` is filled as the log
    is read."""
    out: dict[str, array[int]] = {}
    ending: list[tuple[str, int]] = []  # the session's end so far: streams and places
    for env in envs:
        kind = env.event.__struct_config__.tag
        names.read(env.event)
        if kind == "run_resumed":  # the end before was a session's, not the run's
            for name, at in reversed(ending):
                if name in out:
                    del out[name][at : at + 2]
            ending = []
        if kind in DERIVED or kind in SESSION:
            continue
        if kind == "episode_abandoned":
            lost = f"/{getattr(env.event, 'episode', '')}"
            for name in [n for n in out if n.endswith(lost)]:
                del out[name]
            continue
        digest = blake2b(_ENCODER.encode(_comparable(env, names)), digest_size=8).digest()
        name = stream_of(env, names)
        stream = out.setdefault(name, array("Q"))
        if kind in ENDS or (kind == "actor_failed" and getattr(env.event, "action", "") == "stop"):
            ending.append((name, len(stream)))
        stream.extend((env.seq, int.from_bytes(digest)))
    return out


def _comparable(env: Envelope[Event], names: Names) -> dict[str, Any]:
    fields: dict[str, Any] = msgspec.to_builtins(env.event)
    return {k: _named(v, k, names) for k, v in fields.items() if k not in VOLATILE}


def _named(value: Any, field: str, names: Names) -> Any:
    """``value`` (of an event's ``field``, as builtins) with the ids of extractor calls and
    bank entries named as :class:`Names` knows them (an id it does not know stays)."""
    calls, tips = names.calls, names.tips
    if field == "call" and isinstance(value, str):
        return calls.get(value, value)
    if field == "calls" and isinstance(value, list | tuple):
        return [calls.get(c, c) for c in value]
    if field in _TIP and isinstance(value, int):
        return tips.get(value, value)
    if field in _TIPS and isinstance(value, list | tuple):
        return [tips.get(t, t) for t in value]
    if field == "ops" and isinstance(value, list | tuple):  # (op, entry ids, text) each
        return [[op, [tips.get(t, t) for t in ids], text] for op, ids, text in value]
    return value


def _plain(env: Envelope[Event] | None) -> dict[str, Any] | None:
    if env is None:
        return None
    return {
        "seq": env.seq,
        "t": env.t,
        "actor": env.actor,
        "cause": env.cause,
        "corr": env.corr,
        "event": msgspec.to_builtins(env.event),
    }


def _flat(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
