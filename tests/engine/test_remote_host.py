"""The remote side of an actor placed elsewhere (``engine.remote``), without any transport:
a :class:`RemoteHost` driven from plain threads as Ray's would drive it, and the driver's record
of what a lost host had not handled (:class:`Inflight`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from functools import partial

import msgspec
import pytest

from agents.acting.env_worker import EnvWorker
from agents.acting.scripted import Explorer
from agents.events.episodes import EpisodeAssigned, EpisodeFinished, EpisodeStarted, StepTaken
from engine.actor import Actor, Context
from engine.events import Codec, Envelope, Event
from engine.lifecycle import RunStarted, RunStopped
from engine.remote import EncodedHistory, Inflight, RemoteHost, Report, encode_history
from engine.world import TextWorld
from scenarios.worlds.minilab import MiniLab

CODEC = Codec()


def job(episode: str, seq: int, worker: str = "worker-0") -> Envelope[Event]:
    ev = EpisodeAssigned(
        episode=episode,
        index=seq,
        worker=worker,
        family="heat",
        variant=seq % 5,
        split="train",
        seed=1000 + seq,
    )
    return Envelope(seq=seq, run="r", t=0, actor="scheduler", event=ev, corr=episode)


def minilab() -> TextWorld:
    return MiniLab()


def worker_host() -> RemoteHost:
    return RemoteHost("worker-0", partial(EnvWorker, minilab, Explorer), 7, 0, mailbox=2)


def report(host: RemoteHost, timeout: float = 5.0) -> tuple[Report, list[Envelope[Event]]]:
    rep = msgspec.msgpack.decode(host.poll(timeout), type=Report)
    return rep, CODEC.decode_batch(rep.events, 0)


def until_finished(host: RemoteHost, episodes: int) -> tuple[int, list[Envelope[Event]]]:
    """Poll until ``episodes`` episodes finished: the last ``taken`` and everything emitted."""
    out: list[Envelope[Event]] = []
    taken = 0
    deadline = time.monotonic() + 30
    while sum(isinstance(e.event, EpisodeFinished) for e in out) < episodes:
        assert time.monotonic() < deadline
        rep, emitted = report(host)
        taken = rep.taken
        out += emitted
    return taken, out


def test_a_host_runs_its_actor_and_reports_with_causes() -> None:
    host = worker_host()
    try:
        host.deliver(0, CODEC.encode_batch([job("ep0", 40), job("ep1", 57)]))
        taken, out = until_finished(host, 2)
    finally:
        host.stop()
    assert taken == 2
    kinds = [type(e.event) for e in out]
    assert kinds[0] is EpisodeStarted and kinds.count(EpisodeFinished) == 2
    assert StepTaken in kinds
    # the causes and corrs are the delivered envelopes' own: the log's seqs, not positions
    by_episode = {e.event.episode: e for e in out if isinstance(e.event, EpisodeFinished)}
    assert (by_episode["ep0"].cause, by_episode["ep0"].corr) == (40, "ep0")
    assert (by_episode["ep1"].cause, by_episode["ep1"].corr) == (57, "ep1")
    assert all(e.actor == "worker-0" for e in out)


def test_deliveries_apply_in_their_order_whatever_order_they_arrive_in() -> None:
    host = worker_host()
    try:
        late = threading.Thread(target=host.deliver, args=(1, CODEC.encode_batch([job("b", 9)])))
        late.start()  # the second delivery first: it waits for the first
        time.sleep(0.2)
        host.deliver(0, CODEC.encode_batch([job("a", 3)]))
        late.join(10)
        _, out = until_finished(host, 2)
    finally:
        host.stop()
    finished = [e.event.episode for e in out if isinstance(e.event, EpisodeFinished)]
    assert finished == ["a", "b"]


def test_a_full_remote_mailbox_holds_the_delivery() -> None:
    """Back-pressure: with the actor busy and its mailbox full, ``deliver`` does not return."""
    gate = threading.Event()

    class Stuck(Actor):
        subscribes = (RunStopped,)

        async def run(self, ctx: Context) -> None:
            async for _ in ctx.events():
                await ctx.to_thread(gate.wait)

    host = RemoteHost("stuck", Stuck, 7, 0, mailbox=1)
    stopped = Envelope(seq=1, run="r", t=0, actor="x", event=RunStopped(reason="r"))
    try:
        host.deliver(0, CODEC.encode_batch([stopped]))  # taken by the actor, which blocks
        host.deliver(1, CODEC.encode_batch([stopped]))  # fills the mailbox of 1
        third = threading.Thread(target=host.deliver, args=(2, CODEC.encode_batch([stopped])))
        third.start()
        third.join(0.5)
        assert third.is_alive()  # held
        gate.set()
        third.join(10)
        assert not third.is_alive()
    finally:
        gate.set()
        host.stop()


@pytest.mark.parametrize(
    ("restart_for", "restart"),
    [((), False), ((KeyError,), True), ((LookupError,), True), ((ValueError,), False)],
)
def test_a_failing_actor_is_reported_with_its_traceback(
    restart_for: tuple[type[Exception], ...], restart: bool
) -> None:
    """... and whether its error is one its spec restarts for (judged in the host, where the
    error's class is: a subclass counts)."""

    class Failing(Actor):
        subscribes = (RunStopped,)

        async def run(self, ctx: Context) -> None:
            async for _ in ctx.events():
                raise KeyError("boom")

    host = RemoteHost("failing", Failing, 7, 0, restart_for=restart_for)
    try:
        host.deliver(
            0,
            CODEC.encode_batch(
                [Envelope(seq=4, run="r", t=0, actor="x", event=RunStopped(reason="r"))]
            ),
        )
        rep, _ = report(host)
        while rep.state == "running":
            rep, _ = report(host)
    finally:
        host.stop()
    assert rep.state == "failed" and rep.taken == 1 and rep.restart is restart
    assert "KeyError: 'boom'" in rep.error and "Traceback" in rep.error


def test_coevo_s_own_error_in_a_remote_actor_is_one_line_as_in_the_driver() -> None:
    """A world that could not be imported on a Ray worker (``ScenarioInvalid``) ended the run
    with a 20-line traceback of trio and outcome frames; in the driver it is one line."""
    from engine.errors import ScenarioInvalid

    class Failing(Actor):
        subscribes = ()

        async def run(self, ctx: Context) -> None:
            raise ScenarioInvalid("s.toml", "cannot import world module 'lab': HOME not set")

    host = RemoteHost("failing", Failing, 7, 0)
    try:
        rep, _ = report(host)
        while rep.state == "running":
            rep, _ = report(host)
    finally:
        host.stop()
    assert rep.state == "failed"
    assert rep.error == "ScenarioInvalid: s.toml: cannot import world module 'lab': HOME not set"


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (SystemExit(3), "sys.exit(3) was called"),
        (KeyboardInterrupt(), "raised KeyboardInterrupt with no signal received"),
        (GeneratorExit(), "raised GeneratorExit, a BaseException"),
    ],
)
def test_a_base_exception_in_a_remote_actor_is_its_failure(error: BaseException, says: str) -> None:
    """A remote actor raising ``sys.exit`` or another ``BaseException`` ended its host's loop
    without a report: the proxy saw a running actor that answered nothing until its
    ``stall_timeout`` (5 minutes)."""

    class Failing(Actor):
        subscribes = ()

        async def run(self, ctx: Context) -> None:
            raise error

    host = RemoteHost("failing", Failing, 7, 0)
    try:
        rep, _ = report(host)
        deadline = time.monotonic() + 10
        while rep.state == "running" and time.monotonic() < deadline:
            rep, _ = report(host)
    finally:
        host.stop()
    assert rep.state == "failed", rep
    assert says in rep.error


def test_a_source_actor_waits_when_its_outbox_is_full() -> None:
    emitted: list[int] = []

    class Source(Actor):
        async def run(self, ctx: Context) -> None:
            for i in range(10):
                await ctx.emit(RunStopped(reason=str(i)))
                emitted.append(i)

    host = RemoteHost("source", Source, 7, 0, outbox=3)
    try:
        time.sleep(0.3)
        assert len(emitted) == 3  # the fourth emit waits for a poll
        rep, out = report(host)
        assert [e.event.reason for e in out] == ["0", "1", "2", "3"][: len(out)]  # pyright: ignore[reportAttributeAccessIssue]
        got = len(out)
        while rep.state == "running":
            rep, more = report(host)
            got += len(more)
    finally:
        host.stop()
    assert got == 10 and rep.state == "ended"


def test_a_source_actor_waits_when_its_outbox_holds_its_bytes() -> None:
    emitted: list[int] = []

    class Source(Actor):
        async def run(self, ctx: Context) -> None:
            for i in range(10):
                await ctx.emit(RunStopped(reason=str(i) * 1000))
                emitted.append(i)

    host = RemoteHost("source", Source, 7, 0, outbox=100, outbox_bytes=2500)
    try:
        time.sleep(0.3)
        assert len(emitted) == 3  # ~1 KB each: the fourth emit waits for a poll
        rep, out = report(host)
        got = len(out)
        while rep.state == "running":
            rep, more = report(host)
            assert len(more) <= 4
            got += len(more)
    finally:
        host.stop()
    assert got == 10 and rep.state == "ended"


def env(seq: int) -> Envelope[Event]:
    return Envelope(seq=seq, run="r", t=0, actor="x", event=RunStopped(reason=str(seq)))


def answer(cause: int) -> Envelope[Event]:
    return Envelope(seq=0, run="", t=0, actor="w", event=RunStopped(reason="a"), cause=cause)


def test_inflight_redelivers_what_was_not_taken_and_an_unanswered_current() -> None:
    rec = Inflight()
    rec.delivered([env(1), env(2)])
    rec.delivered([env(5)])
    rec.reported(1, [answer(1)])  # took 1 and answered it
    rec.reported(2, [])  # took 2, nothing from it yet
    assert [e.seq for e in rec.redeliver()] == [2, 5]
    # recorded as delivered to the next host: lost before taking them, it passes them on
    assert [e.seq for e in rec.redeliver()] == [2, 5]
    rec.reported(2, [answer(2)])  # the next host took both, answered 2 and not 5
    assert [e.seq for e in rec.redeliver()] == [5]
    rec.reported(1, [answer(5)])
    assert rec.redeliver() == []


def test_inflight_does_not_redeliver_an_answered_or_failed_current() -> None:
    rec = Inflight()
    rec.delivered([env(1), env(2), env(3)])
    rec.reported(2, [answer(2)])
    assert [e.seq for e in rec.redeliver()] == [3]
    rec.reported(1, [answer(3)])
    rec.delivered([env(7), env(8)])
    rec.reported(2, [])
    rec.failed()  # the actor raised on 7: as locally, it is not handled again
    assert [e.seq for e in rec.redeliver()] == [8]


def test_inflight_counts_an_answer_arriving_in_a_later_report() -> None:
    rec = Inflight()
    rec.delivered([env(4)])
    rec.reported(1, [])
    rec.reported(1, [answer(4)])
    assert rec.redeliver() == []


def test_inflight_gives_a_new_host_the_newest_sticky_event_it_had_taken() -> None:
    """An inference actor's process lost: the next one is given the newest policy version its
    predecessor had loaded (a sticky kind, taken or not), then what was not handled."""
    rec = Inflight(sticky=(RunStarted,))
    version = [
        Envelope(seq=s, run="r", t=0, actor="l", event=RunStarted(run_id=str(s), scenario="",
                 scenario_hash="", seed=0, coevo_version=""))
        for s in (3, 6)
    ]  # fmt: skip
    rec.delivered([env(1), version[0], env(4)])
    rec.delivered([version[1], env(7)])
    rec.reported(5, [answer(7)])  # took everything, answered the last
    assert [e.seq for e in rec.redeliver()] == [6]  # the newest only
    rec.delivered([env(9)])
    assert [e.seq for e in rec.redeliver()] == [6, 9]  # lost before taking either


def test_a_host_recovers_its_actor_on_the_history_before_it_runs() -> None:
    class Counting(Actor):
        subscribes = (RunStopped,)

        def __init__(self) -> None:
            self.seen = -1

        async def recover(self, ctx: Context, history: Sequence[Envelope[Event]]) -> None:
            self.seen = sum(isinstance(e.event, RunStopped) for e in history)

        async def run(self, ctx: Context) -> None:
            await ctx.emit(RunStopped(reason=f"recovered {self.seen}"))

    history = encode_history(CODEC, [env(2), env(5), env(9)], chunk=2)
    host = RemoteHost("counting", Counting, 7, 0, history=history)
    try:
        rep, emitted = report(host)
        while rep.state == "running" or not emitted:
            more_rep, more = report(host)
            rep, emitted = more_rep, emitted + more
    finally:
        host.stop()
    assert [e.event for e in emitted] == [RunStopped(reason="recovered 3")]


@pytest.mark.parametrize("mailbox", [0, -1])
def test_a_host_refuses_an_empty_mailbox(mailbox: int) -> None:
    with pytest.raises(ValueError, match="mailbox and outbox must be >= 1"):
        RemoteHost("x", partial(EnvWorker, minilab, Explorer), 1, 0, mailbox=mailbox)


@pytest.mark.parametrize("chunk", [1, 3, 4, 100])
def test_an_encoded_history_reads_as_the_list_it_was_made_from(chunk: int) -> None:
    """The history a remote actor recovers from crosses in chunks and is decoded on demand:
    length, iteration (forwards, reversed, again), indices (negative too), slices (steps,
    empty, past the end) and refusals are a list's."""
    envs = [env(s) for s in (2, 5, 9, 11, 12, 20, 31)]
    sent = encode_history(CODEC, iter(envs), chunk=chunk)  # one pass over an iterator
    assert max(sent.sizes) <= chunk and sum(sent.sizes) == len(envs)
    history = EncodedHistory(CODEC, sent)
    assert len(history) == len(envs)
    assert list(history) == envs and list(history) == envs
    assert list(reversed(history)) == envs[::-1]
    for i in range(-len(envs), len(envs)):
        assert history[i] == envs[i]
    for cut in (
        slice(None),
        slice(1, 5),
        slice(3, 4),
        slice(-3, None),
        slice(5, 2),
        slice(0, 99),
        slice(None, None, 2),
        slice(None, None, -1),
        slice(6, 0, -3),
    ):
        assert history[cut] == envs[cut], cut
    with pytest.raises(IndexError):
        history[len(envs)]
    empty = EncodedHistory(CODEC, encode_history(CODEC, [], chunk=chunk))
    assert len(empty) == 0 and list(empty) == [] and empty[:] == []


def test_inflight_redelivers_every_request_of_an_answered_kind_taken_and_not_answered() -> None:
    """An inference actor takes a batch of requests (two batches in flight) before it answers
    any: its process lost, only the last one taken was given to the next, and the episodes
    whose requests were lost waited for good (the run stopped at its staleness bound)."""
    rec = Inflight(answers=(RunStopped,), sticky=(RunStarted,))
    rec.delivered([env(1), env(2), env(3), env(4), env(5)])
    rec.reported(4, [answer(2)])  # took four, answered one of them
    assert [e.seq for e in rec.redeliver()] == [1, 3, 4, 5]
    rec.reported(4, [answer(3), answer(1)])  # the next host took them and answered two
    rec.reported(4, [answer(5)])
    assert [e.seq for e in rec.redeliver()] == [4]
    rec.reported(1, [])
    rec.failed()  # it raised on the batch: as locally, not handled again
    assert rec.redeliver() == []
