"""Joining a Ray cluster, and whether its nodes can hold a run's actors.

:func:`connected` joins (or starts) Ray for the duration of a run, after checking that the
address answers as a Ray cluster, and keeps the process's signal handlers across ``ray.init``;
:func:`unplaceable` and :func:`short_together` say, before any actor is placed, what the live
nodes lack to hold them (Ray would leave such actors pending). The actors themselves are
:mod:`engine.ray_backend`'s.

Ray is an optional dependency (``pip install -e '.[ray]'``), imported only when used, through
:func:`ray_api` (one place to replace it in tests).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import socket
import threading
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

from engine.errors import ClusterUnavailable

if TYPE_CHECKING:
    from engine.ray_backend import Placement


def ray_api() -> Any:
    """The ``ray`` module (its stubs are partial: it is used through Any, at the few calls that
    need it)."""
    return importlib.import_module("ray")


@contextlib.contextmanager
def connected(address: str, num_cpus: int | None = None) -> Generator[None]:
    """Ray, for the duration of the block: the one this process already joined, or a new local
    instance (``address = "local"``), or an existing cluster (``"auto"``, ``"HOST:PORT"``).
    Only a connection made here is closed here.

    Args:
        address: "local", "auto" or the cluster's address.
        num_cpus: CPUs a new local instance offers (None: the machine's).
    """
    ray = ray_api()
    if ray.is_initialized():
        yield
        return
    options: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False}
    if address == "local":
        options["num_cpus"] = num_cpus
    elif address != "auto":
        _check_answers(address)
    elif (found := _auto_address()) is not None:
        _check_answers(*found)
    with _own_signals():
        try:
            ray.init(address=address, **options)
        except BaseException as exc:  # a Ctrl-C or SIGTERM as it started: what it started
            with contextlib.suppress(Exception):  # goes (left half up, the process crashed
                ray.shutdown()  # at exit)
            if isinstance(exc, Exception) and address != "local":
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                # a head that answered and still refused: Ray's own line (a "crashed" instance)
                # says nothing of the likeliest cause
                token = _AUTH_HINT if isinstance(exc, ConnectionError) else ""
                raise ClusterUnavailable(
                    f"cannot join the Ray cluster at {address!r} ([runtime.ray] address): "
                    f"{type(exc).__name__}: {first}{token}"
                ) from None
            raise
    try:
        yield
    finally:
        ray.shutdown()


_AUTH_HINT = (
    "; a cluster started with token authentication refuses a wrong or missing token so: "
    "RAY_AUTH_MODE and RAY_AUTH_TOKEN here must be the cluster's (docs/DEPLOY.md, section 2)"
)

CONNECT_TIMEOUT_S = 10.0
"""Seconds to wait for a cluster's ``HOST:PORT`` to accept a connection and answer as a
cluster before ``ray.init`` (which, with nothing there or something else there, retried for
minutes without an end in sight)."""

_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""HTTP/2's client preface and an empty SETTINGS frame: a Ray head's GCS is a gRPC server,
which must answer with a SETTINGS frame of its own (frame type 4)."""


def _auto_address() -> tuple[str, str] | None:
    """The cluster ``address = "auto"`` joins, as Ray finds it (``RAY_ADDRESS``, else the
    latest ``ray start`` on this machine, which a head that died without ``ray stop`` leaves
    behind: ``ray.init`` then waited for it without an end), and where it came from; None
    where Ray finds none (``ray.init`` says so at once) or cannot say."""
    try:
        # Ray's own lookup, private: used as far as it goes
        services: Any = importlib.import_module("ray._private.services")
        found = services.get_ray_address_from_environment("auto", None)
    except Exception:
        return None
    if not isinstance(found, str) or ":" not in found:  # "auto" itself: Ray found none
        return None
    source = "RAY_ADDRESS" if os.environ.get("RAY_ADDRESS") else "the latest `ray start` here"
    return found, f"'auto' found {found} ({source})"


def _check_answers(address: str, named: str | None = None) -> None:
    """Raise :class:`ClusterUnavailable` unless something at ``address`` (``HOST:PORT``)
    accepts a TCP connection and answers as a Ray cluster's GCS (HTTP/2, :data:`_H2_HELLO`;
    not checked with ``RAY_USE_TLS``), each within :data:`CONNECT_TIMEOUT_S`. ``named``: how
    the user named the address (``auto``), for the message."""
    said = f"cannot join the Ray cluster at {named or repr(address)} ([runtime.ray] address)"
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S)
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        stale = " (a head that ended without `ray stop`?)" if named else ""
        raise ClusterUnavailable(
            f"{said}: nothing answers there ({why}){stale}; start the cluster (ray start "
            "--head) or fix the address"
        ) from None
    with sock:
        if os.environ.get("RAY_USE_TLS", "").lower() in ("1", "true"):
            return  # a TLS handshake comes first: the plain preface proves nothing
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.sendall(_H2_HELLO)
            head = b""
            while len(head) < 9 and (chunk := sock.recv(9 - len(head))):
                head += chunk
        except TimeoutError:
            raise ClusterUnavailable(
                f"{said}: something accepts connections there but does not answer as a Ray "
                f"cluster within {CONNECT_TIMEOUT_S:g} s; fix the address"
            ) from None
        except OSError:
            head = b""
    if len(head) < 9 or head[3] != 4:
        answer = f"it answered {head[:16]!r}" if head else "it closed the connection"
        raise ClusterUnavailable(
            f"{said}: something else listens there, not a Ray cluster (which speaks gRPC: "
            f"{answer}); fix the address"
        )


_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)


@contextlib.contextmanager
def _own_signals() -> Generator[None]:
    """The process's signal handlers kept across ``ray.init``, which installs its own for
    SIGTERM (``sys.exit(15)``: a SIGTERM while Ray started ended the process with exit 15 and
    no word, and one after it in the run's closing report too); SIGINT and SIGHUP are kept as
    well, whatever a Ray version does with them. A SIGTERM that lands inside the call is
    handed to the process's own handler (the caller has closed what Ray started)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread sets handlers (Ray's too)
        return
    kept = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    try:
        yield
    except SystemExit as exc:
        if exc.code != signal.SIGTERM:
            raise
        _restore(kept)
        signal.raise_signal(signal.SIGTERM)  # the process's own handler decides
        raise  # a handler that returns (none of coevo's does)
    finally:
        _restore(kept)


def _restore(kept: dict[signal.Signals, Any]) -> None:
    for sig, handler in kept.items():
        if handler is not None:  # None: set outside Python, left as it is
            signal.signal(sig, handler)


def unplaceable(placement: Placement, size: int) -> str:
    """What keeps every live node of the Ray cluster this process joined from holding one
    process of ``size`` actors placed by ``placement`` (it reserves ``size`` times each
    resource), as a phrase; "" if a node has enough of all of them. Ray would leave such a
    process pending until a node that can hold it joins."""
    need = _reserved([(placement, size)])
    nodes = _live_nodes()
    if any(all(node.get(k, 0.0) >= v for k, v in need.items()) for node in nodes):
        return ""
    most = {k: max((node.get(k, 0.0) for node in nodes), default=0.0) for k in need}
    asked = ", ".join(f"{v:g} {k}" for k, v in need.items())
    short = [f"{most[k]:g} {k}" for k, v in need.items() if most[k] < v]
    if short:
        return f"each process reserves {asked}; the most any node has is {', '.join(short)}"
    return f"each process reserves {asked}; no node has all of them"


def short_together(placed: Sequence[tuple[Placement, int]]) -> str:
    """What the live nodes of the cluster lack, all of them together, to hold every actor of
    ``placed`` (each placement with its number of actors) at once, as a phrase; "" if they
    have enough. The actors that find no room wait ``start_timeout``, and restart, until the
    run fails (each placement alone may fit a node: :func:`unplaceable`)."""
    need = _reserved(placed)
    nodes = _live_nodes()
    have = {k: round(sum(node.get(k, 0.0) for node in nodes), 4) for k in need}
    short = [f"{have[k]:g} {k}" for k, v in need.items() if have[k] < v]
    if not short:
        return ""
    asked = ", ".join(f"{v:g} {k}" for k, v in need.items())
    return f"the run's actors reserve {asked} together; its nodes have {', '.join(short)}"


def _reserved(placed: Sequence[tuple[Placement, int]]) -> dict[str, float]:
    """The resources ``placed`` reserves: each placement's, times its number of actors."""
    total: dict[str, float] = {}
    for placement, n in placed:
        each = {"CPU": placement.num_cpus, "GPU": placement.num_gpus, **placement.resources}
        for name, amount in each.items():
            total[name] = total.get(name, 0.0) + amount * n
    # Ray counts resources in ten-thousandths: 50 x 0.14 CPU is 7, not 7.000000000000001
    return {name: round(amount, 4) for name, amount in total.items() if amount > 0}


def _live_nodes() -> list[dict[str, float]]:
    return [node.get("Resources", {}) for node in ray_api().nodes() if node.get("Alive")]


__all__ = ["CONNECT_TIMEOUT_S", "connected", "ray_api", "short_together", "unplaceable"]
