"""``coevo serve RUN...``: a local, read-only web browser of runs on uvicorn: the address is
checked (the loopback unless ``--public``) and bound before the line naming it is printed,
the connections held at once are bounded by the open-file limit, a request head has a
deadline, asyncio's errors are one rate-limited line each, and a SIGHUP stops the server as
a Ctrl-C does (exit 129). :func:`open_views` opens the runs for the browser (benchmarks use
it too)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Generator
from typing import Any

from scenarios.cli.common import InputInvalid, naming
from stores.rundir import find_run

__all__ = ["check_bind", "cmd_serve", "open_views"]


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until stopped (a Ctrl-C: exit 130, a SIGTERM: 143, as any command), or refuse bad
    input before binding (exit 2)."""
    check_bind(args.host, args.public)
    if not 0 <= args.port <= 65535:
        raise InputInvalid(f"--port must be in 0..65535, got {args.port}")
    if not 0 < args.header_timeout <= 3600:  # NaN fails both
        raise InputInvalid(
            f"--header-timeout must be in (0, 3600] seconds, got {args.header_timeout}"
        )
    import uvicorn

    from agents.browse.app import LOOPBACK_NAMES, host_name, make_app

    views = open_views(args.runs)
    try:
        for view in views.values():
            if view.note:
                print(f"coevo: note: {view.name}: {view.note}", file=sys.stderr)
        sock = _listen(args.host, args.port)
        port = sock.getsockname()[1]  # the port the system chose for --port 0
        hosts = None if args.public else LOOPBACK_NAMES | {host_name(args.host).lower()}
        config = uvicorn.Config(  # no lifespan: the app has no start-up or shut-down work, and
            make_app(views, hosts),  # a second Ctrl-C cancelled its task with a traceback
            log_level="warning",
            limit_concurrency=_connections_allowed(),
            lifespan="off",
            http=_head_deadline(args.header_timeout),
        )
        server = uvicorn.Server(config)
        _quiet_asyncio()
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(
            f"serving {len(views)} run{'s' * (len(views) > 1)} at http://{host}:{port}/ "
            "(read-only; Ctrl-C stops)",
            flush=True,
        )
        try:
            with _hang_up_gracefully(server):
                server.run(sockets=[sock])
        finally:
            sock.close()
    finally:
        for view in views.values():
            view.close()
    return 0


@contextlib.contextmanager
def _hang_up_gracefully(server: Any) -> Generator[None]:
    """A SIGHUP (the terminal closed) stops the server as uvicorn stops on a SIGINT or a
    SIGTERM, then ends the command as a hang-up does (exit 129): raised inside the server's
    event loop, it ended with two tracebacks. A SIGHUP that is ignored (``nohup``) stays so."""
    from scenarios.cli.entry import HungUp

    previous = signal.getsignal(signal.SIGHUP)
    if previous is signal.SIG_IGN:
        yield
        return
    hung_up: list[int] = []

    def hang_up(signum: int, frame: Any) -> None:
        hung_up.append(signum)
        server.handle_exit(signum, frame)

    signal.signal(signal.SIGHUP, hang_up)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)
    if hung_up:
        raise HungUp


def _head_deadline(seconds: float) -> type[Any]:
    """uvicorn's HTTP/1.1 protocol with a deadline on every request head: a connection that
    has not sent a whole request line and headers ``seconds`` after it opened, or after the
    first bytes of its next request on a kept-alive connection, is closed. Without it,
    connections that never finished their headers were held for good (on a kept-alive one,
    the first bytes of a second request cancel uvicorn's own keep-alive timer), and enough of
    them (the concurrency limit) kept every other client out with 503s. A request's body is
    not timed."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadDeadline(H11Protocol):
        _deadline: Any = None
        _waiting: Any = None  # the cycle (request) there was when the deadline was set

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            cycle = getattr(self, "cycle", None)
            if cycle is not self._waiting:  # a whole request head was read: a new cycle
                self._cancel_deadline()
                self._waiting = cycle
            if self._deadline is None and (cycle is None or cycle.response_complete):
                self._arm()  # bytes of the next request's head, after the last response

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_deadline()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._waiting = getattr(self, "cycle", None)
            self._deadline = self.loop.call_later(seconds, self._too_slow)

        def _cancel_deadline(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if getattr(self, "cycle", None) is self._waiting:  # no head since it was set
                self.transport.close()

    return HeadDeadline


def _connections_allowed() -> int:
    """The connections ``serve`` holds at once (more are answered 503 and closed): what the
    open-file limit leaves, raised first to its hard limit. Out of descriptors, asyncio's
    accept loop logged each failed accept and retried, in a burst per connection waiting:
    the server spun, answered nothing and did not stop on SIGTERM.

    Raises:
        InputInvalid: the limit leaves too few to serve.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            raised = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, raised), hard))
            soft = max(soft, raised)
    try:
        used = len(os.listdir("/proc/self/fd")) - 1  # less the one listing them
    except OSError:
        used = 64
    allowed = (soft - used - 16) // 2  # each connection may open a file while it is served
    if allowed < 2:
        raise InputInvalid(
            f"too few open files allowed to serve: ulimit -n is {soft}, and {used} files are "
            f"open already (the runs' logs and indexes); serving needs {used + 20} or more "
            f"(ulimit -n {max(used + 20, 256)})"
        )
    return min(allowed, 1000)


class _Once(logging.Filter):
    """Lets a message through once in ``every`` seconds (asyncio's word on a failed accept,
    repeated for every connection waiting)."""

    def __init__(self, every: float = 10.0) -> None:
        super().__init__()
        self.every = every
        self.last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        key = str(record.msg)[:80]
        if now - self.last.get(key, -math.inf) < self.every:
            return False
        self.last[key] = now
        record.exc_info = None  # one line: no traceback (rendering one may open files)
        record.exc_text = None
        return True


def _quiet_asyncio() -> None:
    """asyncio's errors in ``serve`` as plain lines on stderr, each at most once in ten
    seconds, without the run console's rich tracebacks."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("coevo serve: %(message)s"))
    handler.addFilter(_Once())
    log = logging.getLogger("asyncio")
    log.handlers[:] = [handler]
    log.propagate = False


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: one the system chooses), before the line that
    names it is printed.

    Raises:
        InputInvalid: the address cannot be bound (in use, not this machine's).
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise InputInvalid(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise InputInvalid(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def check_bind(host: str, public: bool) -> None:
    """Refuse an address off the loopback unless ``--public`` says so.

    Raises:
        InputInvalid: ``host`` is not a loopback address and ``public`` is False.
    """
    import ipaddress

    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        loopback = False
    if not loopback and not public:
        raise InputInvalid(
            f"--host {host} is not a loopback address: anyone who reaches it reads the runs; "
            "add --public to serve there"
        )


def open_views(paths: list[str]) -> dict[str, Any]:
    """Every run opened for the browser, by a name unique among them (its directory's, with
    its parent's where two share one).

    Raises:
        RunNotFound: a path is not a run directory.
    """
    import re

    from agents.browse.data import RunView

    roots = [find_run(path).root for path in paths]
    real = [r.resolve() for r in roots]
    twice = [str(r) for r in real if real.count(r) > 1]
    if twice:
        raise InputInvalid(f"{twice[0]}: given more than once")
    views: dict[str, Any] = {}
    try:
        for path, root, at in zip(paths, roots, real, strict=True):
            same = sum(r.name == at.name for r in real) > 1  # resolved: "." has no name
            name = re.sub(
                r"[^A-Za-z0-9_.-]", "-", f"{at.parent.name}-{at.name}" if same else at.name
            )
            while name in views:
                name += "-"
            with naming(root / "log"):
                views[name] = RunView.open(name, path)
    except BaseException:
        for view in views.values():
            view.close()
        raise
    return views
