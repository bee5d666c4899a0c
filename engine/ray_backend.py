"""Actors on a Ray cluster, the log on the driver.

The trio runtime and its one writer stay in the driver. An actor placed on Ray is a
:class:`RemoteActor` there: a proxy with the actor's subscriptions, whose ``run`` starts a Ray
actor holding an :class:`engine.remote.RemoteHost` (placed with the actor kind's
:class:`Placement`), forwards the proxy's mailbox to it and emits, in the driver, what the remote
actor emitted. The events it emits go through the write buffer like any other actor's: one
total order, commit then deliver. Events cross as msgspec bytes; the actor's factory (code and
settings, no events) is pickled once per start by Ray.

Back-pressure: at most ``Placement.in_flight`` deliveries are on their way to one remote actor,
and a delivery is over only once the remote mailbox took it; beyond that the proxy's own
mailbox fills and the runtime's delivery waits, as it does for a slow local actor.

Processes: a Ray actor (one worker process) hosts ``Placement.per_process`` remote actors of a
kind, each a :class:`RemoteHost` with its own trio loop on its own thread (:class:`_Process`
keeps, in the driver, which process a group of proxies shares); one actor per process by
default.

Faults: when Ray reports the remote process or its node gone, the proxy raises
:class:`engine.remote.RemoteActorLost`; supervision records it (``ActorFailed``) and restarts the
actor. A lost process takes every actor it hosted: each of their proxies fails and restarts the
same way, and the first to restart starts a fresh process (wherever Ray places it) that the others
join. Each first delivers what its lost predecessor had not handled
(:class:`engine.remote.Inflight`).

Ray is an optional dependency (``pip install -e '.[ray]'``), imported only here and only when
used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import math
import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import msgspec
import trio

from engine import ray_cluster
from engine.actor import Actor, ActorSpec, Context, first_error
from engine.events import Codec, Envelope, Event
from engine.remote import (
    Inflight,
    RemoteActorFailed,
    RemoteActorLost,
    RemoteActorRestartable,
    RemoteActorStalled,
    RemoteClusterLost,
    RemoteHost,
    Report,
    encode_history,
)

_POLL_S = 5.0
"""Longest a poll waits remotely for something to report (then it is asked again)."""

_BATCH_MAX = 256
"""Most envelopes in one delivery."""

_NODES_EVERY_S = 5.0
"""Seconds between two looks, while a remote actor is being placed, at whether the cluster
still has a live node."""


def available() -> bool:
    """Whether Ray is installed."""
    return importlib.util.find_spec("ray") is not None


class _Hosting:
    """The Ray actor (one worker process) holding the :class:`RemoteHost` of each remote actor
    placed in it, by name. Ray makes a class with any ``async def`` an asyncio actor, whose
    plain methods then run one at a time on its event loop (a poll waiting would hold every
    delivery): this class has none, so Ray runs its methods on threads
    (``max_concurrency``)."""

    def __init__(self) -> None:
        self._hosts: dict[str, RemoteHost] = {}
        self._lock = threading.Lock()

    def add(self, name: str, *args: Any) -> tuple[int, str]:
        """Start actor ``name`` here (``RemoteHost``'s other arguments); this process's id and
        its Ray node's."""
        host = RemoteHost(name, *args)
        with self._lock:
            old, self._hosts[name] = self._hosts.get(name), host
        if old is not None:  # a predecessor never stopped (its proxy was cancelled first)
            old.stop()
        return host.pid(), ray_cluster.ray_api().get_runtime_context().get_node_id()

    def deliver(self, name: str, n: int, data: bytes) -> None:
        self._hosts[name].deliver(n, data)

    def poll(self, name: str, timeout: float) -> bytes:
        return self._hosts[name].poll(timeout)

    def stop(self, name: str, timeout: float) -> None:
        with self._lock:
            host = self._hosts.pop(name, None)
        if host is not None:
            host.stop(timeout)


@functools.cache
def _host_class() -> Any:
    """The Ray actor class of :class:`_Hosting` (made once per process)."""
    return ray_cluster.ray_api().remote(_Hosting)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where and with what a kind of actor runs on Ray.

    Attributes:
        num_cpus: CPUs each actor of the kind reserves (Ray's ``num_cpus``; may be fractional).
        num_gpus: GPUs each reserves.
        resources: custom resources each reserves (e.g. ``{"env": 1}`` to keep env workers on
            the nodes started with that resource).
        in_flight: deliveries on their way to one remote actor before the proxy waits.
        start_timeout: seconds a new remote actor may take to be placed and started before it
            counts as lost (a cluster without the resources asked for).
        per_process: actors of the kind one Ray worker process hosts (it reserves their
            resources together); a lost process takes them all.
        stall_timeout: seconds a remote actor's process may leave the proxy's poll (answered
            within 5 s when it is well) unanswered before it counts as lost, is ended and its
            actor restarts: a process stopped (SIGSTOP), hung, or whose actor's event loop
            something blocks (0: wait for good; Ray alone notices only a process that exits).
    """

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = dataclasses.field(default_factory=dict[str, float])
    in_flight: int = 2
    start_timeout: float = 120.0
    per_process: int = 1
    stall_timeout: float = 300.0

    def __post_init__(self) -> None:
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError(f"num_cpus and num_gpus must be >= 0, got {self}")
        if self.in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {self.in_flight}")
        if self.per_process < 1:
            raise ValueError(f"per_process must be >= 1, got {self.per_process}")
        if self.start_timeout <= 0:
            raise ValueError(f"start_timeout must be > 0, got {self.start_timeout}")
        if self.stall_timeout < 0:
            raise ValueError(f"stall_timeout must be >= 0, got {self.stall_timeout}")


class _Process:
    """The driver's record of the Ray worker process a group of up to ``size`` remote actors
    shares: the current one (started by the first member that needs it), how many members use
    it, and whether a member found it lost (the next member to start then starts a fresh one).
    Used from the driver's event loop only.

    Args:
        placement: what each member reserves (the process reserves ``size`` times that).
        size: the members of the group.
    """

    def __init__(self, placement: Placement, size: int) -> None:
        self._placement = placement
        self._size = size
        self._handle: Any = None
        self._generation = 0
        self._lost = False
        self._members: dict[int, int] = {}  # generation -> members using it
        self._where: dict[int, tuple[int, str]] = {}  # generation -> its pid and Ray node
        self._stalled: set[int] = set()  # generations found stalled (stopped or hung)

    def acquire(self) -> tuple[Any, int]:
        """The process for a member starting now, and its generation (a fresh process if there
        is none or the current one was lost)."""
        if self._handle is None or self._lost:
            p, n = self._placement, self._size
            self._handle = (
                _host_class()
                .options(
                    num_cpus=p.num_cpus * n,
                    num_gpus=p.num_gpus * n,
                    resources={k: v * n for k, v in p.resources.items()} or None,
                    max_concurrency=(p.in_flight + 3) * n,
                    max_restarts=0,
                )
                .remote()
            )
            self._generation += 1
            self._lost = False
        self._members[self._generation] = self._members.get(self._generation, 0) + 1
        return self._handle, self._generation

    def placed(self, generation: int, pid: int, node: str) -> None:
        """Process ``generation`` runs as ``pid`` on Ray node ``node``."""
        self._where[generation] = (pid, node)

    def reached(self, generation: int) -> bool:
        """Whether process ``generation`` was placed and answered a member (one Ray never
        placed answers nothing, a stop neither)."""
        return generation in self._where

    def lost(self, generation: int, stalled: bool = False) -> None:
        """A member found process ``generation`` gone (or never started), or ``stalled``: alive
        and answering nothing."""
        if stalled:
            self._stalled.add(generation)
        if generation == self._generation:
            self._lost = True

    def release(self, handle: Any, generation: int) -> None:
        """A member is done with its process; the last one out ends it."""
        left = self._members[generation] - 1
        if left:
            self._members[generation] = left
            return
        del self._members[generation]
        ray = ray_cluster.ray_api()
        ray.kill(handle, no_restart=True)
        where = self._where.pop(generation, None)
        if generation in self._stalled and where is not None:
            self._stalled.discard(generation)
            _end_stalled(*where, ray.get_runtime_context().get_node_id())
        if generation == self._generation:
            self._handle = None


async def _watch_nodes(name: str) -> None:
    """Raise :class:`RemoteClusterLost` when the cluster has no live node (looked at every
    :data:`_NODES_EVERY_S`); return never. Ray would keep the actor pending until its
    ``start_timeout``, each restart again: with the local instance's raylet gone that was
    ``max_restarts`` waits with a message that blamed the placement's resources."""
    while True:
        await trio.sleep(_NODES_EVERY_S)
        try:  # a GCS that is gone too may keep the call waiting: the thread is left to it
            nodes = await trio.to_thread.run_sync(
                ray_cluster.ray_api().nodes, abandon_on_cancel=True, limiter=trio.CapacityLimiter(1)
            )
        except Exception:  # not reached for now: start_timeout still bounds the wait
            continue
        if not any(node.get("Alive") for node in nodes):
            raise RemoteClusterLost(
                f"{name}: the Ray cluster has no live node left (its raylet ended: killed, or "
                "out of memory?); nothing can place the actor, so the run stops. "
                "`coevo resume RUN` continues it on a cluster that is up"
            )


async def _result(ref: Any) -> Any:
    """Wait, in trio, for a Ray object ref; its value, or the error Ray gives for it."""
    future = ref.future()
    done = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def wake(_: object) -> None:
        # a run that ended has nobody waiting for this ref any more
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    future.add_done_callback(wake)
    await done.wait()
    return future.result()


def _end_stalled(pid: int, node: str, here: str) -> None:
    """End a stalled process of this machine's Ray node (SIGKILL): Ray's kill asks the process
    to exit, which a stopped or hung one never does, and it kept its reservation (a restart
    then waited ``start_timeout`` for room, and again, until the run failed). A process on
    another node is left to Ray."""
    if node != here:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


class RemoteActor(Actor):
    """The driver's proxy of an actor running on Ray (built by :func:`remote_spec`, which gives
    each remote kind a subclass with its subscriptions).

    Args:
        factory: builds the actor in the remote process.
        placement: where it runs.
        inflight: what was delivered and not handled, shared by the proxy's restarts.
        mailbox: batches the remote mailbox holds.
        process: the process it shares with others of its kind.
    """

    def __init__(
        self,
        factory: Callable[[], Actor],
        placement: Placement,
        inflight: Inflight,
        mailbox: int,
        process: _Process,
    ) -> None:
        self._factory = factory
        self._placement = placement
        self._inflight = inflight
        self._mailbox = mailbox
        self._process = process
        self._codec = Codec()

    recovers: ClassVar[bool] = False
    """Whether the remote actor's kind rebuilds state on resume (overrides ``recover``)."""
    restart_for: ClassVar[tuple[type[Exception], ...]] = ()
    """The errors of the remote actor's code its spec restarts for (the proxy raises
    :class:`~engine.remote.RemoteActorRestartable` for them)."""
    _history: Sequence[Envelope[Event]] = ()
    _through = -1  # the last seq of the history its actor was rebuilt from

    async def recover(self, ctx: Context, history: Sequence[Envelope[Event]]) -> None:
        """Keep ``history`` for the remote actor's own :meth:`Actor.recover`, if it has one (it
        crosses once, as msgspec bytes in chunks, when the remote actor starts); what was sent
        to a lost predecessor and is in it is not sent again."""
        if self.recovers:
            self._history = history
            self._through = history[-1].seq if history else -1

    async def run(self, ctx: Context) -> None:
        process, generation = self._process.acquire()
        host = _Member(process, ctx.name)
        again = self._inflight.redeliver(after=self._through)
        try:
            await self._attend(ctx, host, again, generation)
        except BaseExceptionGroup as group:
            # its own error first, also when the run's stop cancelled the rest (the group
            # then holds a Cancelled too: the cluster lost while another actor failed)
            first = first_error(group)
            if not isinstance(first, Exception):
                raise
            raise self._translated(ctx.name, first, generation) from None
        except Exception as exc:
            raise self._translated(ctx.name, exc, generation) from None
        finally:
            with trio.CancelScope(shield=True):
                if self._process.reached(generation):  # else a stop waited 15 s for nothing
                    await _stop(host)
                self._process.release(process, generation)

    def _translated(self, name: str, exc: Exception, generation: int) -> Exception:
        out = _translated(name, exc)
        if isinstance(out, RemoteActorLost):
            self._process.lost(generation, stalled=isinstance(out, RemoteActorStalled))
        return out

    async def _attend(
        self, ctx: Context, host: _Member, again: list[Envelope[Event]], generation: int
    ) -> None:
        with trio.move_on_after(self._placement.start_timeout) as placing:
            history = encode_history(self._codec, self._history) if self._history else None
            self._history = ()
            args = (
                self._factory, ctx.run_seed, ctx.attempt, self._mailbox, 8192, history,
                self.restart_for,
            )  # fmt: skip
            async with trio.open_nursery() as watching:
                watching.start_soon(_watch_nodes, ctx.name)
                pid, node = await _result(host.add(*args))
                watching.cancel_scope.cancel()
            self._inflight.pid = pid
            self._process.placed(generation, pid, node)
        if placing.cancelled_caught:
            raise RemoteActorLost(
                f"{ctx.name}: not started within {self._placement.start_timeout:g} s "
                "(does the cluster have the resources its placement asks for?)"
            )
        ctx.log.debug("remote actor started", pid=self._inflight.pid)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._forward, ctx, host, again)
            await self._collect(ctx, host)
            nursery.cancel_scope.cancel()

    async def _forward(self, ctx: Context, host: _Member, again: list[Envelope[Event]]) -> None:
        """Deliver the mailbox to the remote actor, in order, at most ``in_flight`` batches on
        their way at once."""
        room = trio.Semaphore(self._placement.in_flight)
        n = 0
        async with trio.open_nursery() as settling:

            async def send(batch: list[Envelope[Event]]) -> None:
                nonlocal n
                await room.acquire()
                ref = host.deliver(n, self._codec.encode_batch(batch))
                n += 1
                settling.start_soon(_settle, ref, room)

            if again:  # recorded already (Inflight.redeliver)
                await send(again)
            inbox = ctx.events()
            async for first in inbox:
                batch = [first, *inbox.ready(_BATCH_MAX - 1)]
                self._inflight.delivered(batch)
                await send(batch)

    async def _collect(self, ctx: Context, host: _Member) -> None:
        """Emit what the remote actor emitted; return when it ended, raise if it failed."""
        stall = self._placement.stall_timeout
        while True:
            raw = b""
            with trio.move_on_after(_POLL_S + stall if stall else math.inf) as waiting:
                raw = await _result(host.poll(_POLL_S))
            if waiting.cancelled_caught:
                raise RemoteActorStalled(
                    f"{ctx.name}: its Ray process (pid {self._inflight.pid}) answered no poll "
                    f"for {stall:g} s (stopped, hung, or its event loop blocked): ended, and "
                    "the actor restarted (stall_timeout of its placement)"
                )
            report = msgspec.msgpack.decode(raw, type=Report)
            emitted = self._codec.decode_batch(report.events, 0)
            self._inflight.reported(report.taken, emitted)
            for env in emitted:
                await ctx.emit(env.event, corr=env.corr, cause=env.cause)
            if report.state == "ended":
                return
            if report.state == "failed":
                self._inflight.failed()
                failed = RemoteActorRestartable if report.restart else RemoteActorFailed
                sep = "\n" if "\n" in report.error.strip() else " "  # a traceback, or one line
                raise failed(f"{ctx.name} raised remotely:{sep}{report.error.strip()}")


async def _settle(ref: Any, room: trio.Semaphore) -> None:
    await _result(ref)
    room.release()


@dataclasses.dataclass(frozen=True)
class _Member:
    """One remote actor's calls to the process hosting it (Ray object refs)."""

    process: Any
    name: str

    def add(self, *args: Any) -> Any:
        return self.process.add.remote(self.name, *args)

    def deliver(self, n: int, data: bytes) -> Any:
        return self.process.deliver.remote(self.name, n, data)

    def poll(self, timeout: float) -> Any:
        return self.process.poll.remote(self.name, timeout)

    def stop(self, timeout: float) -> Any:
        return self.process.stop.remote(self.name, timeout)


async def _stop(host: _Member) -> None:
    """Let the remote actor clean up (a world's close); its process ends with its last member
    (:meth:`_Process.release`)."""
    ray = ray_cluster.ray_api()
    # a host already gone (RayError) has nothing left to stop
    with trio.move_on_after(15), contextlib.suppress(ray.exceptions.RayError):
        await _result(host.stop(10.0))


def _translated(name: str, exc: Exception) -> Exception:
    """What a proxy raises for ``exc``: Ray's word that the remote process is gone becomes
    :class:`RemoteActorLost`; an error the host's own code raised, :class:`RemoteActorFailed`;
    anything else stays itself."""
    errors = ray_cluster.ray_api().exceptions
    if isinstance(exc, errors.RayTaskError):
        return RemoteActorFailed(f"{name}: the remote host raised: {_brief(exc)}")
    if isinstance(exc, errors.RayError):
        return RemoteActorLost(f"{name}: {_brief(exc)}")
    return exc


def _brief(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


class _ProxyFactory:
    """Builds a kind's proxy; holds its :class:`Inflight` across restarts (``inflight``) and
    the process it shares with others (``process``)."""

    def __init__(
        self,
        cls: type[RemoteActor],
        factory: Callable[[], Actor],
        placement: Placement,
        mailbox: int,
        process: _Process,
        sticky: tuple[type[Event], ...] = (),
        answers: tuple[type[Event], ...] = (),
    ) -> None:
        self.cls = cls
        self.factory = factory
        self.placement = placement
        self.mailbox = mailbox
        self.process = process
        self.inflight = Inflight(sticky=sticky, answers=answers)

    def __call__(self) -> Actor:
        return self.cls(self.factory, self.placement, self.inflight, self.mailbox, self.process)


def remote_spec(
    spec: ActorSpec,
    placement: Placement,
    *,
    mailbox: int = 64,
    process: _Process | None = None,
    sticky: tuple[type[Event], ...] = (),
    answers: tuple[type[Event], ...] = (),
) -> ActorSpec:
    """``spec`` with its actor placed on Ray: the same name, supervision and filter, a proxy in
    the driver. An actor that rebuilds state on resume (``Actor.recover``) is given the
    history in its process, once, when it first starts. Its code raising an error ``spec``
    restarts for makes the proxy raise :class:`~engine.remote.RemoteActorRestartable` (a
    subclass of the :class:`~engine.remote.RemoteActorFailed` it raises for any other), and
    its process being lost :class:`~engine.remote.RemoteActorLost`: a caller that replaces the
    spec's ``restart_for`` names those.

    Args:
        spec: the actor as it would run in the driver.
        placement: where and with what it runs.
        mailbox: batches the remote mailbox holds.
        process: the process it shares with others (:func:`remote_specs`); None: its own.
        sticky: the kinds of event whose newest one the actor's next process is given first
            when its process is lost (:attr:`engine.remote.Inflight.sticky`).
        answers: the kinds of request it answers and takes several of at once: each one taken
            and not answered when its process is lost is given to the next
            (:attr:`engine.remote.Inflight.answers`).
    """
    probe = spec.factory()
    kind = type(probe)
    recovers = kind.recover is not Actor.recover
    attrs = {
        "subscribes": tuple(probe.subscribes),
        "recovers": recovers,
        "restart_for": spec.restarted_errors,
    }
    cls = type(f"Remote{kind.__name__}", (RemoteActor,), attrs)
    process = process or _Process(placement, 1)
    proxy = _ProxyFactory(cls, spec.factory, placement, mailbox, process, sticky, answers)
    return dataclasses.replace(spec, factory=proxy)


def remote_specs(
    specs: Sequence[ActorSpec], placement: Placement, *, mailbox: int = 64
) -> list[ActorSpec]:
    """``specs`` placed on Ray (:func:`remote_spec`), ``placement.per_process`` of them to a
    process, in order (the last process may host fewer).

    Raises:
        ValueError: as :func:`remote_spec`.
    """
    out: list[ActorSpec] = []
    n = placement.per_process
    for start in range(0, len(specs), n):
        group = specs[start : start + n]
        process = _Process(placement, len(group))
        out += [remote_spec(spec, placement, mailbox=mailbox, process=process) for spec in group]
    return out


__all__ = ["Placement", "RemoteActor", "available", "remote_spec", "remote_specs"]
