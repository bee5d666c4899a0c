"""An actor in another process: its host there, what crosses the wire, and what the driver keeps.

The backend that places the process (Ray, :mod:`engine.ray_backend`) is not named here. The
driver's runtime keeps a proxy in the actor's place; the proxy forwards the actor's mailbox to a
:class:`RemoteHost` in the remote process and takes back what the actor emitted. Events cross
as msgspec bytes (:meth:`engine.events.Codec.encode_batch`), never as pickled objects:

- a delivery is ``(n, bytes)``: the n-th batch of committed envelopes for the actor (their real
  seqs, so that the actor's ``cause`` is right), applied in ``n`` order whatever order the
  transport runs them in;
- a :class:`Report` answers a poll: how many envelopes the actor has taken from its mailbox so
  far, the events it emitted since the last report (as unnumbered envelopes carrying their
  ``cause`` and ``corr``), and whether the actor is still running, ended or failed;
- the history an actor rebuilds from (``Actor.recover``: a resume, or a restart that rebuilds
  from the log) crosses once, when the host starts, as ``Codec.encode_batch`` bytes of
  :data:`HISTORY_CHUNK` envelopes each (:func:`encode_history`), and the actor reads it as
  :class:`EncodedHistory`, decoding a chunk at a time: neither side holds a long log's
  envelopes as objects.

The host runs the actor in its own trio loop on a thread of the remote process, in a real
:class:`engine.actor.Context`, so an actor runs remotely unchanged. :class:`Inflight` is the
driver's record of what was delivered and not known to be handled: when the remote process is
lost, the actor's next instance is given it again (:meth:`Inflight.redeliver`).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import trio

from engine.actor import Actor, Context, Mailbox
from engine.errors import CoevoError
from engine.events import Codec, Envelope, Event
from engine.runtime import WRITE_BUFFER_BYTES
from engine.seeds import derive_seed
from engine.supervision import actor_failure

State = Literal["running", "ended", "failed"]

HISTORY_CHUNK = 4096
"""Envelopes per encoded chunk of a history sent to a remote actor."""


@dataclass(frozen=True)
class HistoryChunks:
    """A history as ``Codec.encode_batch`` chunks (what crosses to a remote actor's process),
    with the number of envelopes in each."""

    chunks: list[bytes]
    sizes: list[int]


def encode_history(
    codec: Codec, history: Iterable[Envelope[Event]], chunk: int = HISTORY_CHUNK
) -> HistoryChunks:
    """``history`` as chunks of at most ``chunk`` envelopes, read in one pass (a
    :class:`engine.eventlog.LogHistory` is decoded a record part at a time): about the log's
    own size in bytes, where its envelopes as objects take ~1.5 KB each."""
    out = HistoryChunks([], [])
    part: list[Envelope[Event]] = []
    for env in history:
        part.append(env)
        if len(part) == chunk:
            out.chunks.append(codec.encode_batch(part))
            out.sizes.append(len(part))
            part = []
    if part:
        out.chunks.append(codec.encode_batch(part))
        out.sizes.append(len(part))
    return out


class EncodedHistory(Sequence[Envelope[Event]]):
    """A history received as :class:`HistoryChunks`, as a sequence decoded on demand: each
    pass over it decodes the chunks again, one at a time, and keeps none.

    Raises (on reading):
        LogCorrupted: a chunk is not an array of envelopes of known events.
    """

    def __init__(self, codec: Codec, history: HistoryChunks) -> None:
        if len(history.chunks) != len(history.sizes):
            raise ValueError(f"{len(history.chunks)} chunks with {len(history.sizes)} sizes")
        self._codec = codec
        self._chunks = history.chunks
        self._starts = list(itertools.accumulate(history.sizes, initial=0))

    def __len__(self) -> int:
        return self._starts[-1]

    def __iter__(self) -> Iterator[Envelope[Event]]:
        for data in self._chunks:
            yield from self._codec.decode_envelopes(data)

    def __reversed__(self) -> Iterator[Envelope[Event]]:
        for data in reversed(self._chunks):
            yield from reversed(self._codec.decode_envelopes(data))

    def __getitem__(self, at: int | slice) -> Any:
        if isinstance(at, slice):
            items = range(len(self))[at]
            if items.step != 1 or not items:
                return [self[i] for i in items]
            return self._span(items.start, items.stop)
        i = range(len(self))[at]  # IndexError as a list's, negative indices too
        k = bisect.bisect_right(self._starts, i) - 1
        return self._codec.decode_envelopes(self._chunks[k])[i - self._starts[k]]

    def _span(self, start: int, stop: int) -> list[Envelope[Event]]:
        """Items ``[start, stop)``, ``start < stop``, decoding only the chunks that hold them."""
        first = bisect.bisect_right(self._starts, start) - 1
        last = bisect.bisect_right(self._starts, stop - 1) - 1
        out: list[Envelope[Event]] = []
        for k in range(first, last + 1):
            base = self._starts[k]
            out += self._codec.decode_envelopes(self._chunks[k])[max(start - base, 0) : stop - base]
        return out


class RemoteActorLost(CoevoError):
    """The process (or machine) running a remote actor is gone: the transport reported it dead
    or unreachable. Raised by the actor's proxy in the driver, so that supervision records it
    (``ActorFailed``) and restarts the actor in a fresh process. Unlike
    :class:`RemoteActorFailed`, the actor's code did not raise: what it had emitted and not yet
    shipped is lost, and the envelope it was handling is delivered again unless something it
    emitted in answer reached the driver."""


class RemoteActorStalled(RemoteActorLost):
    """The process running a remote actor is alive and answers nothing (stopped, hung, or the
    actor's event loop blocked) past its placement's ``stall_timeout``: ended by the proxy and
    restarted as a lost one is."""


class RemoteActorFailed(CoevoError):
    """A remote actor's code raised; the message carries its error and traceback. Handled by
    supervision as a local actor's exception is: the envelope it failed on is not delivered
    again."""


class RemoteClusterLost(RemoteActorFailed):
    """The Ray cluster a remote actor was to be placed on has no live node left (the local
    instance's raylet ended, or every node of a cluster did): nothing can place it, so the run
    stops at once with this, instead of each restart waiting its ``start_timeout`` in turn."""

    restartable = False


class RemoteActorRestartable(RemoteActorFailed):
    """A remote actor's code raised an error that its own spec restarts for
    (``ActorSpec.on_failure`` and ``restart_for`` as it would run in the driver: a learner whose
    training process was killed raises ``LearnerProcessLost``). The host judges it where the
    error's class is, and the proxy raises this in the driver, so that supervision restarts the
    remote actor as it would the local one."""


class Report(msgspec.Struct, frozen=True, array_like=True):
    """A remote host's answer to a poll.

    Attributes:
        taken: envelopes the actor has taken from its mailbox since it started.
        events: what it emitted since the previous report: ``Codec.encode_batch`` of envelopes
            numbered 0, 1, .. (positions, not log seqs) with the actor's cause and corr.
        state: "running", "ended" (its ``run`` returned) or "failed" (it raised).
        error: the error when failed: its traceback too, unless coevo raised it on purpose
            (a :class:`~engine.errors.CoevoError`, whose message is one line).
        restart: when failed, the error is one the actor's spec restarts for (the host's
            ``restart_for``).
    """

    taken: int
    events: bytes
    state: State = "running"
    error: str = ""
    restart: bool = False


class _CountingMailbox(Mailbox):
    """A mailbox that counts the envelopes its actor has taken."""

    taken = 0

    async def receive(self) -> Envelope[Event]:
        env = await super().receive()
        self.taken += 1
        return env


class RemoteHost:
    """Runs one actor in this process, in a trio loop on its own thread, for a proxy elsewhere.

    Its methods are called from the transport's threads; each is thread-safe.

    Args:
        name: the actor's name.
        factory: builds the actor (called here, once).
        run_seed: the run seed (the actor's seeds derive from it as in the driver).
        attempt: the actor's attempt number (its restarts so far).
        mailbox: batches the actor's mailbox holds before a delivery waits.
        outbox: events a source actor may have emitted and not yet shipped before its ``emit``
            waits (an actor that reacts to events never waits, as in the driver).
        history: for the first start of a resumed run: the earlier sessions' events
            (:func:`encode_history`), given to the actor's :meth:`Actor.recover` before it runs
            as an :class:`EncodedHistory` (None: no recovery).
        restart_for: the errors of the actor's code that its spec restarts for (``()``: none;
            ``(Exception,)``: any); a failure with one is reported ``restart``.
        outbox_bytes: the same as ``outbox`` in bytes of the events encoded (a poll's report
            holds about this at most, or one larger event).
    """

    def __init__(
        self,
        name: str,
        factory: Callable[[], Actor],
        run_seed: int,
        attempt: int,
        mailbox: int = 64,
        outbox: int = 8192,
        history: HistoryChunks | None = None,
        restart_for: tuple[type[Exception], ...] = (),
        outbox_bytes: int = WRITE_BUFFER_BYTES,
    ) -> None:
        if mailbox < 1 or outbox < 1:
            raise ValueError(f"mailbox and outbox must be >= 1, got {mailbox} and {outbox}")
        self.name = name
        self.seed = run_seed
        self._factory = factory
        self._attempt = attempt
        self._outbox_max = outbox
        self._outbox_bytes = outbox_bytes
        self._out_bytes = 0
        self._history = history
        self._restart_for = restart_for
        self._restart = False
        self._codec = Codec()
        self.check_event = self._codec.check
        self._out: list[Envelope[Event]] = []
        self._state: State = "running"
        self._error = ""
        self._next_delivery = 0
        self._changed = trio.lowlevel.ParkingLot()
        self._send, recv = trio.open_memory_channel[list[Envelope[Event]]](mailbox)
        self._mailbox = _CountingMailbox(recv)
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"coevo-{name}", daemon=True)
        self._thread.start()
        self._ready.wait()

    # --- the Host protocol (engine.actor), on the trio thread -------------------------------

    def actor_seed(self, name: str) -> int:
        return derive_seed(self.seed, "actor", name)

    def _full(self) -> bool:
        out = self._out
        return bool(out) and (len(out) >= self._outbox_max or self._out_bytes >= self._outbox_bytes)

    def push(
        self,
        actor: str,
        ev: Event,
        cause: int | None,
        corr: str,
        bounded: bool = False,
        size: int = 0,
    ) -> bool:
        if bounded and self._full():
            return False
        env = Envelope(seq=0, run="", t=0, actor=actor, event=ev, cause=cause, corr=corr)
        self._out.append(msgspec.structs.replace(env, v=type(ev).version))
        self._out_bytes += size
        self._changed.unpark_all()
        return True

    async def wait_space(self) -> None:
        while self._full():
            await self._changed.park()

    def subscribed(self, cls: type[Event], besides: str = "") -> bool:
        return True  # the driver's subscribers are not known in this process

    def ctrl_c_possible(self) -> bool:
        return False  # the actor runs on a thread of its own, where no signal lands

    # --- called from the transport's threads ------------------------------------------------

    def pid(self) -> int:
        """This process's id."""
        return os.getpid()

    def deliver(self, n: int, data: bytes) -> None:
        """Put the ``n``-th delivery in the actor's mailbox, after the ``n - 1`` before it;
        returns once it is there (a full mailbox holds the caller: back-pressure)."""
        envelopes = self._codec.decode_envelopes(data)
        trio.from_thread.run(self._deliver, n, envelopes, trio_token=self._trio_token())

    def poll(self, timeout: float) -> bytes:
        """Wait up to ``timeout`` seconds for something to report, then report it (a msgpack
        :class:`Report`)."""
        report = trio.from_thread.run(self._poll, timeout, trio_token=self._trio_token())
        return msgspec.msgpack.encode(report)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the actor, let its cleanup run and wait for the thread (up to ``timeout``)."""
        token, scope = self._token, self._scope
        if token is not None and scope is not None and self._thread.is_alive():
            # a loop that ended on its own meanwhile has nothing to cancel
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(scope.cancel)
        self._thread.join(timeout)

    # --- the trio side ----------------------------------------------------------------------

    def _main(self) -> None:
        trio.run(self._life)

    async def _life(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:
            self._scope = scope
            self._ready.set()
            try:
                actor = self._factory()
                source = not actor.subscribes
                ctx = Context(self, self.name, self._mailbox, source=source, attempt=self._attempt)
                if self._history is not None:
                    history = EncodedHistory(self._codec, self._history)
                    self._history = None  # the actor holds it while it recovers, no longer
                    await actor.recover(ctx, history)
                    del history
                await actor.run(ctx)
                self._state = "ended"
            except BaseException as raised:  # reported to the proxy, raised in the driver
                # no Ctrl-C reaches this thread; None: stop()'s cancellation
                if (exc := actor_failure(raised, ctrl_c_possible=False)) is None:
                    raise
                self._state = "failed"
                self._error = (  # coevo's own errors are one line, as in the driver
                    f"{type(exc).__name__}: {exc}"
                    if isinstance(exc, CoevoError)
                    else "".join(traceback.format_exception(exc, limit=8))
                )
                self._restart = isinstance(exc, self._restart_for)
            finally:
                self._changed.unpark_all()
            await trio.sleep_forever()  # the loop answers polls until stop()
        if self._state == "running":  # cancelled by stop()
            self._state = "ended"

    def _trio_token(self) -> trio.lowlevel.TrioToken:
        assert self._token is not None  # set before __init__ returns
        return self._token

    async def _deliver(self, n: int, envelopes: list[Envelope[Event]]) -> None:
        while self._next_delivery != n:
            await self._changed.park()
        if self._state == "running":
            await self._send.send(envelopes)
        self._next_delivery = n + 1
        self._changed.unpark_all()

    async def _poll(self, timeout: float) -> Report:
        with trio.move_on_after(timeout):
            while not self._out and self._state == "running":
                await self._changed.park()
        out, self._out = self._out, []
        self._out_bytes = 0
        self._changed.unpark_all()  # a source actor waiting for room
        numbered = [msgspec.structs.replace(env, seq=i) for i, env in enumerate(out)]
        events = self._codec.encode_batch(numbered)
        return Report(self._mailbox.taken, events, self._state, self._error, self._restart)


@dataclass
class Inflight:
    """The driver's record, across a remote actor's restarts, of what was delivered to it and
    not known to be handled.

    Attributes:
        pending: envelopes delivered to the current host that its actor had not taken at the
            last report, in order.
        current: the envelope the actor took last (what it was handling at the last report).
        answered: something the actor emitted with ``current`` as its cause reached the driver.
        taken: envelopes the current host reported taken.
        pid: the current host's process id (0 until known).
        sticky: the kinds of event whose newest one a new host is given first, taken or not
            (those that set what the actor serves with, e.g. the policy version an inference
            actor loads).
        latest: the newest delivered envelope of each sticky kind.
        answers: the kinds of request the actor answers, each by an event whose cause is the
            request's seq, and may take several of before it answers any (an inference actor
            gathers a batch, two batches in flight): every one it took and had not answered is
            given to a new host, not only ``current``.
        open: those taken and not answered yet, by seq.
    """

    pending: list[Envelope[Event]] = field(default_factory=list[Envelope[Event]])
    current: Envelope[Event] | None = None
    answered: bool = False
    taken: int = 0
    pid: int = 0
    sticky: tuple[type[Event], ...] = ()
    latest: dict[type[Event], Envelope[Event]] = field(
        default_factory=dict[type[Event], Envelope[Event]]
    )
    answers: tuple[type[Event], ...] = ()
    open: dict[int, Envelope[Event]] = field(default_factory=dict[int, Envelope[Event]])

    def delivered(self, envelopes: list[Envelope[Event]]) -> None:
        """Record a delivery to the current host."""
        self.pending.extend(envelopes)
        for env in envelopes:
            if isinstance(env.event, self.sticky):
                self.latest[type(env.event)] = env

    def reported(self, taken: int, emitted: list[Envelope[Event]]) -> None:
        """Fold a report: ``taken`` so far and what was emitted since the last one."""
        newly = taken - self.taken
        if newly > 0:
            self.current = self.pending[newly - 1]
            if self.answers:
                self.open.update(
                    (env.seq, env)
                    for env in self.pending[:newly]
                    if isinstance(env.event, self.answers)
                )
            del self.pending[:newly]
            self.taken = taken
            self.answered = False
        causes = {env.cause for env in emitted if env.cause is not None}
        if self.current is not None:
            self.answered = self.answered or self.current.seq in causes
        for seq in causes.intersection(self.open) if self.open else ():
            del self.open[seq]

    def failed(self) -> None:
        """The actor raised on ``current`` (and on the requests it had taken with it): as in
        the driver, they are not delivered again."""
        self.current = None
        self.open.clear()

    def redeliver(self, after: int = -1) -> list[Envelope[Event]]:
        """What a new host is to be given first, its predecessor lost: the newest envelope of
        each sticky kind it had taken, then the envelope the lost actor was handling if nothing
        it emitted in answer arrived and every request of the ``answers`` kinds it took and had
        not answered (in seq order), then those it had not taken. They stay recorded as
        delivered to the new host (not yet taken), so a host lost before taking them passes
        them on again; the caller sends them without :meth:`delivered`. Those up to seq
        ``after`` are dropped: the new host's actor was rebuilt from the log up to there."""
        lost = dict(self.open)
        if self.current is not None and not self.answered:
            lost[self.current.seq] = self.current
        again = [lost[seq] for seq in sorted(lost)] + self.pending
        seqs = {env.seq for env in again}
        kept = [env for env in self.latest.values() if env.seq not in seqs]
        again = [env for env in sorted(kept, key=lambda env: env.seq) + again if env.seq > after]
        self.pending, self.current, self.answered, self.taken, self.pid = again, None, False, 0, 0
        self.open = {}
        return list(again)


__all__ = [
    "Inflight",
    "RemoteActorFailed",
    "RemoteActorLost",
    "RemoteActorRestartable",
    "RemoteHost",
    "Report",
]
