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

Faults: when Ray reports the remote process or its node gone, the proxy raises
:class:`engine.remote.RemoteActorLost`; supervision records it (``ActorFailed``) and restarts the
actor, whose next proxy starts a fresh Ray actor (wherever Ray places it) and first delivers what
the lost one had not handled (:class:`engine.remote.Inflight`).

Ray is an optional dependency (``pip install -e '.[ray]'``), imported only here and only when
used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
from collections.abc import Callable, Generator
from typing import Any

import msgspec
import trio

from engine.actor import Actor, ActorSpec, Context
from engine.events import Codec, Envelope, Event
from engine.remote import Inflight, RemoteActorFailed, RemoteActorLost, RemoteHost, Report

_POLL_S = 5.0
"""Longest a poll waits remotely for something to report (then it is asked again)."""

_BATCH_MAX = 256
"""Most envelopes in one delivery."""


def available() -> bool:
    """Whether Ray is installed."""
    return importlib.util.find_spec("ray") is not None


def _ray() -> Any:
    # Ray's stubs are partial: it is used through Any, at the few calls below
    return importlib.import_module("ray")


class _Hosting:
    """The Ray actor holding a :class:`RemoteHost`. Ray makes a class with any ``async def``
    an asyncio actor, whose plain methods then run one at a time on its event loop (a poll
    waiting would hold every delivery): this class has none, so Ray runs its methods on
    threads (``max_concurrency``)."""

    def __init__(self, *args: Any) -> None:
        self._host = RemoteHost(*args)

    def pid(self) -> int:
        return self._host.pid()

    def deliver(self, n: int, data: bytes) -> None:
        self._host.deliver(n, data)

    def poll(self, timeout: float) -> bytes:
        return self._host.poll(timeout)

    def stop(self, timeout: float) -> None:
        self._host.stop(timeout)


@functools.cache
def _host_class() -> Any:
    """The Ray actor class of :class:`_Hosting` (made once per process)."""
    return _ray().remote(_Hosting)


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
    """

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = dataclasses.field(default_factory=dict[str, float])
    in_flight: int = 2
    start_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError(f"num_cpus and num_gpus must be >= 0, got {self}")
        if self.in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {self.in_flight}")
        if self.start_timeout <= 0:
            raise ValueError(f"start_timeout must be > 0, got {self.start_timeout}")


@contextlib.contextmanager
def connected(address: str, num_cpus: int | None = None) -> Generator[None]:
    """Ray, for the duration of the block: the one this process already joined, or a new local
    instance (``address = "local"``), or an existing cluster (``"auto"``, ``"HOST:PORT"``).
    Only a connection made here is closed here.

    Args:
        address: "local", "auto" or the cluster's address.
        num_cpus: CPUs a new local instance offers (None: the machine's).
    """
    ray = _ray()
    if ray.is_initialized():
        yield
        return
    options: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False}
    if address == "local":
        options["num_cpus"] = num_cpus
    ray.init(address=address, **options)
    try:
        yield
    finally:
        ray.shutdown()


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


def _first_leaf(group: BaseExceptionGroup[Exception]) -> Exception:
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    assert isinstance(first, Exception)
    return first


class RemoteActor(Actor):
    """The driver's proxy of an actor running on Ray (built by :func:`remote_spec`, which gives
    each remote kind a subclass with its subscriptions).

    Args:
        factory: builds the actor in the remote process.
        placement: where it runs.
        inflight: what was delivered and not handled, shared by the proxy's restarts.
        mailbox: batches the remote mailbox holds.
    """

    def __init__(
        self,
        factory: Callable[[], Actor],
        placement: Placement,
        inflight: Inflight,
        mailbox: int,
    ) -> None:
        self._factory = factory
        self._placement = placement
        self._inflight = inflight
        self._mailbox = mailbox
        self._codec = Codec()

    async def run(self, ctx: Context) -> None:
        p = self._placement
        host = (
            _host_class()
            .options(
                num_cpus=p.num_cpus,
                num_gpus=p.num_gpus,
                resources=p.resources or None,
                max_concurrency=p.in_flight + 3,
                max_restarts=0,
            )
            .remote(ctx.name, self._factory, ctx.run_seed, ctx.attempt, self._mailbox)
        )
        again = self._inflight.redeliver()
        try:
            await self._attend(ctx, host, again)
        except BaseExceptionGroup as group:
            errors, rest = group.split(Exception)
            if rest is not None or errors is None:
                raise
            raise _translated(ctx.name, _first_leaf(errors)) from None
        except Exception as exc:
            raise _translated(ctx.name, exc) from None
        finally:
            with trio.CancelScope(shield=True):
                await _stop(host)

    async def _attend(self, ctx: Context, host: Any, again: list[Envelope[Event]]) -> None:
        with trio.move_on_after(self._placement.start_timeout) as placing:
            self._inflight.pid = await _result(host.pid.remote())
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

    async def _forward(self, ctx: Context, host: Any, again: list[Envelope[Event]]) -> None:
        """Deliver the mailbox to the remote actor, in order, at most ``in_flight`` batches on
        their way at once."""
        room = trio.Semaphore(self._placement.in_flight)
        n = 0
        async with trio.open_nursery() as settling:

            async def send(batch: list[Envelope[Event]]) -> None:
                nonlocal n
                await room.acquire()
                ref = host.deliver.remote(n, self._codec.encode_batch(batch))
                n += 1
                settling.start_soon(_settle, ref, room)

            if again:  # recorded already (Inflight.redeliver)
                await send(again)
            inbox = ctx.events()
            async for first in inbox:
                batch = [first, *inbox.ready(_BATCH_MAX - 1)]
                self._inflight.delivered(batch)
                await send(batch)

    async def _collect(self, ctx: Context, host: Any) -> None:
        """Emit what the remote actor emitted; return when it ended, raise if it failed."""
        while True:
            raw = await _result(host.poll.remote(_POLL_S))
            report = msgspec.msgpack.decode(raw, type=Report)
            emitted = self._codec.decode_batch(report.events, 0)
            self._inflight.reported(report.taken, emitted)
            for env in emitted:
                await ctx.emit(env.event, corr=env.corr, cause=env.cause)
            if report.state == "ended":
                return
            if report.state == "failed":
                self._inflight.failed()
                raise RemoteActorFailed(f"{ctx.name} raised remotely:\n{report.error}")


async def _settle(ref: Any, room: trio.Semaphore) -> None:
    await _result(ref)
    room.release()


async def _stop(host: Any) -> None:
    """Let the remote actor clean up (a world's close), then end its process."""
    ray = _ray()
    # a host already gone (RayError) has nothing left to stop
    with trio.move_on_after(15), contextlib.suppress(ray.exceptions.RayError):
        await _result(host.stop.remote(10.0))
    ray.kill(host, no_restart=True)


def _translated(name: str, exc: Exception) -> Exception:
    """What a proxy raises for ``exc``: Ray's word that the remote process is gone becomes
    :class:`RemoteActorLost`; an error the host's own code raised, :class:`RemoteActorFailed`;
    anything else stays itself."""
    errors = _ray().exceptions
    if isinstance(exc, errors.RayTaskError):
        return RemoteActorFailed(f"{name}: the remote host raised: {_brief(exc)}")
    if isinstance(exc, errors.RayError):
        return RemoteActorLost(f"{name}: {_brief(exc)}")
    return exc


def _brief(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


class _ProxyFactory:
    """Builds a kind's proxy; holds its :class:`Inflight` across restarts (``inflight``)."""

    def __init__(
        self,
        cls: type[RemoteActor],
        factory: Callable[[], Actor],
        placement: Placement,
        mailbox: int,
    ) -> None:
        self.cls = cls
        self.factory = factory
        self.placement = placement
        self.mailbox = mailbox
        self.inflight = Inflight()

    def __call__(self) -> Actor:
        return self.cls(self.factory, self.placement, self.inflight, self.mailbox)


def remote_spec(spec: ActorSpec, placement: Placement, *, mailbox: int = 64) -> ActorSpec:
    """``spec`` with its actor placed on Ray: the same name, supervision and filter, a proxy in
    the driver.

    Args:
        spec: the actor as it would run in the driver.
        placement: where and with what it runs.
        mailbox: batches the remote mailbox holds.

    Raises:
        ValueError: the actor rebuilds state on resume (``Actor.recover``): its history would
            have to cross the wire, which is not supported; run it in the driver.
    """
    probe = spec.factory()
    kind = type(probe)
    if kind.recover is not Actor.recover:
        raise ValueError(f"{spec.name}: {kind.__name__} recovers state on resume; run it locally")
    cls = type(f"Remote{kind.__name__}", (RemoteActor,), {"subscribes": tuple(probe.subscribes)})
    return dataclasses.replace(spec, factory=_ProxyFactory(cls, spec.factory, placement, mailbox))


__all__ = ["Placement", "RemoteActor", "available", "connected", "remote_spec"]
