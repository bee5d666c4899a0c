"""Edits of an event stream for negative controls: an event inserted, dropped or replaced, with
the seqs after it renumbered and what points at a seq (an envelope's ``cause``, a resume's
``after``) moved along, every envelope's time kept, so that the edited stream breaks exactly
what the edit breaks (a time set to the seq made an edited log's throughput 1e9 events/s).
Pure; needs no Hypothesis."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from engine.events import Envelope, Event
from engine.lifecycle import RunResumed

__all__ = ["drop", "insert", "swap"]

Stream = list[Envelope[Event]]


def _moved(env: Envelope[Event], seq: int, shift: Callable[[int], int | None]) -> Envelope[Event]:
    cause = None if env.cause is None else shift(env.cause)
    ev = env.event
    if isinstance(ev, RunResumed):
        after = shift(ev.after)
        ev = msgspec.structs.replace(ev, after=after if after is not None else ev.after - 1)
    return msgspec.structs.replace(env, seq=seq, cause=cause, event=ev)  # its time kept


def insert(envs: Sequence[Envelope[Event]], at: int, ev: Event, cause: int | None = None) -> Stream:
    """``envs`` with ``ev`` at seq ``at`` (caused by ``cause``), at the time of the envelope
    before it; the later envelopes move up one seq (their times kept), and so do causes and
    resumes' ``after`` at or past ``at``."""
    run = envs[0].run if envs else "r"
    t = envs[at - 1].t if 0 < at <= len(envs) else envs[0].t if envs else 0
    new = Envelope(seq=at, run=run, t=t, actor="edit", event=ev, cause=cause, v=ev.version)
    later = [_moved(env, env.seq + 1, lambda s: s + 1 if s >= at else s) for env in envs[at:]]
    return [*envs[:at], new, *later]


def drop(envs: Sequence[Envelope[Event]], at: int) -> Stream:
    """``envs`` without seq ``at``; what named it as its cause names nothing."""

    def shift(s: int) -> int | None:
        return None if s == at else s - 1 if s > at else s

    return [*envs[:at], *(_moved(env, env.seq - 1, shift) for env in envs[at + 1 :])]


def swap(envs: Sequence[Envelope[Event]], at: int, ev: Event) -> Stream:
    """``envs`` with the event at seq ``at`` replaced by ``ev``."""
    return [*envs[:at], msgspec.structs.replace(envs[at], event=ev), *envs[at + 1 :]]
