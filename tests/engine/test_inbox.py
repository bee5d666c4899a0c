"""Inbox.gather: the batch of requests an actor answers with one model call."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from engine.actor import Inbox, Mailbox
from engine.events import Envelope
from engine.lifecycle import RunStopped


def env(seq: int, reason: str = "r") -> Envelope[Any]:
    return Envelope(seq=seq, run="t", t=seq, actor="a", event=RunStopped(reason=reason))


def inbox_with(
    *batches: list[Envelope[Any]], close: bool
) -> tuple[Inbox, trio.MemorySendChannel[Any]]:
    send, receive = trio.open_memory_channel[list[Envelope[Any]]](16)
    for b in batches:
        send.send_nowait(b)
    if close:
        send.close()
    return Inbox(SimpleNamespace(current=None), Mailbox(receive)), send  # type: ignore[arg-type]


def gathered(*batches: list[Envelope[Any]], close: bool, **kw: Any) -> tuple[list[int], Any]:
    async def main() -> tuple[list[int], Any]:
        inbox, _ = inbox_with(*batches, close=close)
        first = await inbox.__anext__()
        batch, held = await inbox.gather(first, **kw)
        rest = [e.seq async for e in inbox] if close else []
        return [e.seq for e in batch], (held.seq if held else None, rest)

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_batch_takes_what_is_waiting_up_to_its_size() -> None:
    seqs, (held, rest) = gathered([env(i) for i in range(5)], close=True, max_size=3, wait=1.0)
    assert seqs == [0, 1, 2] and held is None and rest == [3, 4]


def test_a_batch_ends_when_the_wait_is_over() -> None:
    seqs, (held, _) = gathered([env(0), env(1)], close=False, max_size=8, wait=0.5)
    assert seqs == [0, 1] and held is None


def test_stop_holds_back_the_envelope_it_accepts() -> None:
    items = [env(0), env(1), env(2, "update"), env(3)]
    seqs, (held, rest) = gathered(
        items, close=True, max_size=8, wait=1.0, stop=lambda ev: ev.reason == "update"
    )
    assert seqs == [0, 1] and held == 2 and rest == [3]


def test_a_closed_mailbox_ends_the_batch_and_then_the_iteration() -> None:
    seqs, (held, rest) = gathered([env(0), env(1)], close=True, max_size=8, wait=1.0)
    assert seqs == [0, 1] and held is None and rest == []
