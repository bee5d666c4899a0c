"""The browser's web application (Starlette): read-only pages about one or more runs.

Addresses (``RUN`` is a run's name, as the index page lists it):

- ``/`` the runs; ``/runs/RUN`` its episodes, filtered by ``?family=&split=&purpose=&outcome=
  &version=&rollout=`` and paged by ``&page=N``;
- ``/runs/RUN/episodes/ID`` one episode turn by turn (``coevo audit RUN episode ID``);
- ``/runs/RUN/entries/ID`` one bank entry: its writer, lineage, uses, credits and updates
  (``coevo audit RUN tip ID``), every entry and episode it names a link.

Pages of a run still writing refresh themselves every :data:`REFRESH` seconds. A bad run name,
episode or entry id is a 404 page saying what was asked and what exists; an error reading a log
a 500 page of one line: never a traceback. Handlers run on the event loop one at a time (LMDB
reads of a few milliseconds), so the log and the index are never read from two threads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from agents.audit.shown import (
    number_text,
    pasteable,
    purpose_text,
    safe_line,
    score_text,
    unused_text,
    update_text,
)
from agents.browse.data import FILTERS, RunView, filter_key
from engine.errors import AuditQueryInvalid, CoevoError

__all__ = ["PAGE", "REFRESH", "ROWS", "make_app"]

PAGE = 100
"""Episodes per page of the list."""

ROWS = 500
"""Uses and credits listed on an entry's page (an entry retrieved 10,000 times lists its first
500; ``coevo audit RUN tip ID --json`` has them all)."""

REFRESH = 5
"""Seconds between reloads of a live run's pages."""


def _shown(value: object) -> object:
    """What a page shows of a value: every character a reader could not see or no HTML may
    hold raw (NUL, escape sequences, C1 controls, a right-to-left override, a zero-width
    space) as its escape (``\\x1b``, ``\\u202e``; :func:`agents.audit.shown.safe_line`), line
    breaks and tabs kept (text blocks wrap as written). A one-line value (an action, a
    goal, a family) goes through the ``line`` filter first, which escapes those too."""
    if isinstance(value, Markup):  # a macro's output (an entry's lineage): its values were
        return value  # shown as they went in; made text again, its HTML was shown escaped
    if isinstance(value, PurePath):  # a run's directory, as its name
        value = str(value)
    return safe_line(value, "\n\t") if isinstance(value, str) else value


_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    finalize=_shown,
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_TEMPLATES.filters["line"] = safe_line  # a one-line text: "go\nnorth" is not "go north"
_TEMPLATES.filters["key"] = filter_key  # a filter's value that names one family, not two
_TEMPLATES.filters["shell"] = pasteable  # a command to paste
_TEMPLATES.filters["score"] = score_text  # 1e+100, not 101 digits
_TEMPLATES.filters["num"] = number_text  # a credit of 1e15 signed in 10 characters, not 22
_TEMPLATES.filters["unused"] = unused_text  # "not yet", or why none will come
_TEMPLATES.filters["update"] = update_text  # or that a warm-up step trained nothing
_TEMPLATES.filters["purpose"] = purpose_text  # an adaptation test's episodes told apart


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
"""The names a browser on this machine reaches a loopback-bound server by."""


def _page(template: str, code: int = 200, **context: Any) -> HTMLResponse:
    body = _TEMPLATES.get_template(template).render(refresh=REFRESH, **context)
    return HTMLResponse(body, status_code=code)


def host_name(header: str) -> str:
    """The host of a ``Host`` header, without its port (``[::1]:8000`` is ``::1``)."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class _KnownHosts:
    """Answer 400 to a request naming a host this server is not (DNS rebinding: a page on
    another site points its own name at 127.0.0.1, and a browser on this machine then reads
    every run for it, the ``Host`` header still naming that site)."""

    def __init__(self, app: Any, hosts: frozenset[str]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            host = host_name(header).lower()
            if host and host not in self.hosts:
                said = (
                    f"this server answers requests for {', '.join(sorted(self.hosts))}, not "
                    f"{host!r} (coevo serve --host NAME --public serves other names)"
                )
                await _page("error.html", 400, message=said)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def make_app(runs: Mapping[str, RunView], hosts: frozenset[str] | None = None) -> Starlette:
    """The application browsing ``runs`` (by name); it never writes to them. With ``hosts``,
    a request whose ``Host`` names another host is refused (400)."""
    page = _page

    def run_of(request: Request) -> RunView:
        name = request.path_params["run"]
        if name not in runs:
            known = ", ".join(runs) or "none"
            raise HTTPException(404, f"no run named {name!r} here (runs: {known})")
        view = runs[name]
        view.refresh()
        if view.gone:  # a log that cannot be read now is the server's trouble, not the URL's
            raise HTTPException(500 if view.unreadable else 404, view.gone)
        return view

    async def index(request: Request) -> Response:
        rows = []
        for view in runs.values():
            view.refresh()
            rows.append((view, "?" if view.gone else view.log.next_seq, view.status()))
        return page("runs.html", rows=rows, live=any(s == "live" for _, _, s in rows))

    async def episodes(request: Request) -> Response:
        view = run_of(request)
        chosen = {k: request.query_params.get(k, "") for k in FILTERS}
        number = request.query_params.get("page", "1")
        if not re.fullmatch(r"[0-9]+", number) or int(number[:40]) < 1:
            raise HTTPException(400, f"page must be a positive integer, got {number[:40]!r}")
        rows = view.episodes(chosen)
        pages = max(1, -(-len(rows) // PAGE))
        if len(number) > 20 or int(number) > pages:  # no int of 5,000 digits is read
            shown = number if len(number) <= 20 else f"{number[:20]}... ({len(number):,} digits)"
            raise HTTPException(404, f"page {shown}: this list has {pages} page(s)")
        start = (int(number) - 1) * PAGE
        status = view.status()
        return page(
            "run.html",
            view=view,
            rows=rows[start : start + PAGE],
            total=len(rows),
            first=start + 1,
            page=int(number),
            pages=pages,
            chosen=chosen,
            choices=view.choices(),
            status=status,
            live=status == "live",
        )

    async def episode(request: Request) -> Response:
        view = run_of(request)
        audit, candidates = view.episode(request.path_params["episode"])
        status = view.status()
        return page(
            "episode.html",
            view=view,
            a=audit,
            candidates=candidates,
            live=status == "live" and audit.ended == "running",
            unfinished=status != "live" and audit.ended == "running",
        )

    async def entry(request: Request) -> Response:
        view = run_of(request)
        audit = view.entry(request.path_params["entry"])
        return page("entry.html", view=view, a=audit, limit=ROWS, live=view.status() == "live")

    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return page("error.html", exc.status_code, message=exc.detail)

    async def bad_query(request: Request, exc: Exception) -> Response:
        return page("error.html", 404, message=str(exc))

    async def failed(request: Request, exc: Exception) -> Response:
        return page("error.html", 500, message=f"cannot read the run: {exc}")

    async def crashed(request: Request, exc: Exception) -> Response:
        # a bug of the browser's: one line on the page (uvicorn logs the traceback)
        return page("error.html", 500, message=f"internal error: {type(exc).__name__}: {exc}")

    return Starlette(
        routes=[
            Route("/", index),
            Route("/runs/{run}", episodes),
            Route("/runs/{run}/episodes/{episode}", episode),
            Route("/runs/{run}/entries/{entry}", entry),
        ],
        exception_handlers={
            HTTPException: not_found,
            AuditQueryInvalid: bad_query,
            CoevoError: failed,
            Exception: crashed,
        },
        middleware=[] if hosts is None else [Middleware(_KnownHosts, hosts=hosts)],
    )
