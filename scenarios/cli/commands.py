"""The ``coevo`` command line: its parser and :func:`main`, which runs one command (validate,
run, resume, replay and re-execute updates, report, probe, audit, log, check, and the readers
export, diff, serve and copy, whose parsers :mod:`scenarios.cli.explore` adds), each in its own
module of this package.

Every error a user can cause ends as one line ``coevo: error: ...`` on stderr and a non-zero
exit code (2 for bad input); never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import os
import signal
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from engine.errors import CoevoError
from scenarios.cli.audit import cmd_audit
from scenarios.cli.check import add_parser as add_check
from scenarios.cli.common import (
    ESCAPE_ERRORS,
    TOO_MANY_FILES,
    home_expanded,
    keep_stderr_open,
    out_of_resources,
    shown_path,
    to_devnull,
    torn_copy_hint,
    unopenable_path,
    version,
)
from scenarios.cli.entry import exits_after, stopped
from scenarios.cli.explore import add_commands
from scenarios.cli.log import cmd_log
from scenarios.cli.logsetup import configure_logging
from scenarios.cli.replay import cmd_replay
from scenarios.cli.report import cmd_probe, cmd_report
from scenarios.cli.resume import cmd_resume
from scenarios.cli.run import cmd_run, cmd_validate

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``coevo`` script; returns the exit code."""
    for name in ("stdout", "stderr"):  # started with the stream closed (``>&-``): Python
        if getattr(sys, name) is None:  # leaves it None, and every print failed on it
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115
        buffered(name)
        with contextlib.suppress(AttributeError, ValueError, OSError):  # an ASCII stream
            # (PYTHONIOENCODING=ascii) shows what it cannot encode escaped, never a traceback
            getattr(sys, name).reconfigure(errors=ESCAPE_ERRORS)
    keep_stderr_open()
    # a run named in a script matplotlib's font lacks (CJK): boxes in the plot, not a warning
    warnings.filterwarnings(
        "ignore", message=r"Glyph \d+ .*missing from font", category=UserWarning
    )
    columns = os.environ.get("COLUMNS", "")
    if columns and not (columns.isdigit() and int(columns) >= MIN_COLUMNS):
        del os.environ["COLUMNS"]  # COLUMNS=0 printed every table as nothing
    parser = build_parser()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help (0) or a usage error (2), printed by argparse
            return _flushed(exc.code if isinstance(exc.code, int) else 2)
        if (unreadable := _no_working_directory()) is not None:
            print(f"coevo: error: {unreadable}", file=sys.stderr)
            return 2
        # log lines (an embedded model being built, say) go to stderr, never into a command's
        # output (`--json` included); `run` and `resume` route them to their run directory
        # too; with --quiet only warnings and errors
        quiet = getattr(args, "quiet", False)
        configure_logging(Console(stderr=True, markup=False), "warning" if quiet else "info")
        home_expanded(args)
        return _flushed(int(args.func(args)))
    except CoevoError as exc:
        from agents.audit.shown import safe_line

        print(safe_line(f"coevo: error: {exc}{torn_copy_hint(exc)}"), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # a Ctrl-C or a SIGTERM (entry.Terminated)
        code = stopped(exc)  # interrupts ignored while the process exits
        if not exits_after():  # a program that goes on (a notebook) keeps its Ctrl-C
            for sig, handler in handlers.items():
                if handler is not None:  # None: not set from Python, nothing to put back
                    signal.signal(sig, handler)
        return code
    except BrokenPipeError:
        to_devnull(sys.stdout)  # what is still buffered must not fail the last flush
        return 0
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            said = f"{TOO_MANY_FILES}: {exc}"
        elif exc.errno == errno.ENAMETOOLONG:  # bad input, as a path that is not UTF-8
            said = f"a path is too long for this file system: {exc.filename!r}"
        elif isinstance(exc, PermissionError):  # a path this user may not read, enter or write
            where = f"{exc.filename}: " if exc.filename else ""
            said = (
                f"{where}{exc.strerror or exc}: this user may not read, enter or write it "
                "(or a directory above it)"
            )
        elif exc.errno in _WRITE_ERRNOS:  # `> /dev/full`, a full disk under the output
            what = str(exc.filename) if exc.filename else "the output"
            said = f"cannot write {what}: {exc.strerror or exc}"
            to_devnull(sys.stdout)  # else the interpreter's last flush fails on it again
        else:
            raise
        print(f"coevo: error: {said}", file=sys.stderr)
        return 2 if exc.errno == errno.ENAMETOOLONG or isinstance(exc, PermissionError) else 1
    except RuntimeError as exc:  # a run's own loop says more (scenarios.cli.drive._run_loop)
        if "can't start new thread" not in str(exc):
            raise
        print(
            "coevo: error: the process cannot start another thread (a process or memory "
            "limit: ulimit -u, ulimit -v)",
            file=sys.stderr,
        )
        return 1
    except UnicodeEncodeError as exc:
        if os.sep not in exc.object:
            raise
        said = unopenable_path(exc.object)
        print(f"coevo: error: {shown_path(exc.object)}: {said}", file=sys.stderr)
        return 2
    except (ImportError, MemoryError) as exc:
        said = out_of_resources(exc)
        if not said:
            raise
        print(f"coevo: error: {said}", file=sys.stderr)
        return 1


def _no_working_directory() -> str | None:
    """Why this process has no working directory (None: it has one). A directory deleted
    while a shell was in it: a run with an absolute ``--out`` was made, then failed in its
    workers with a ``FileNotFoundError`` naming no file; every command is refused instead,
    before anything is written (a relative path could not be resolved either)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return "the working directory no longer exists (deleted): cd to one that does"
    except OSError as exc:
        return f"the working directory cannot be read ({exc.strerror or exc}): cd to another"
    return None


def _flushed(code: int) -> int:
    """``code``, once stdout is flushed: here, where a full disk is one line (:func:`main`'s
    ``OSError``), not in the process's last flush (exit 120, ``--help > /dev/full``); a reader
    gone away leaves the command's answer as it is (``diff``'s 1)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        to_devnull(sys.stdout)
    return code


def buffered(name: str) -> None:
    """Give ``sys.<name>`` a buffered binary layer where it has none (``PYTHONUNBUFFERED``,
    ``python -u``): its raw file takes as much of a write as fits and the text layer drops
    the rest without an error, so ``coevo replay RUN --json > FILE`` on a full disk wrote a
    cut output and exited 0. A buffered writer writes it all or raises. Lines still go out as
    they are written (``log --follow``)."""
    stream = getattr(sys, name)
    raw = getattr(stream, "buffer", None)
    if stream is not getattr(sys, f"__{name}__") or not isinstance(raw, io.RawIOBase):
        return  # buffered, or not the process's own stream (a test's capture)
    with contextlib.suppress(OSError, ValueError):  # closed: it stays as it is
        stream.flush()
        own = io.FileIO(raw.fileno(), "w", closefd=False)  # closing it leaves the fd open
        wrapped = io.TextIOWrapper(
            io.BufferedWriter(own),
            encoding=stream.encoding,
            errors=stream.errors,
            line_buffering=True,
        )
        setattr(sys, name, wrapped)


_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})
"""Errors of a write that failed for lack of room or a failing device (the command's output
on a full disk, say): one line, exit 1."""

MIN_COLUMNS = 20
"""A narrower ``COLUMNS`` (or one that is not a number) is ignored: the terminal's width, or
80 columns, instead."""

SET_HELP = (
    "override a scenario setting; VALUE is read as TOML (3, 0.5, true, nan, inf, [1, 2], "
    '"text") and else taken as text: quote a text that reads as TOML '
    "(--set 'world.options.mode=\"nan\"')"
)

HERE_HELP = (
    "a setting of the run's scenario on this machine, as in `coevo run` (where a base model "
    "lies, the device; VALUE is read as TOML, else taken as text); every other setting is "
    "the one the run's log stores"
)


class _StoreOnce(argparse._StoreAction):  # pyright: ignore[reportPrivateUsage]
    """argparse's ``store`` refusing an option given twice: the last one silently won
    (``log --episode A --episode B`` showed B's events only, ``export --tensorboard A
    --tensorboard B`` wrote B only)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: set[str] = namespace.__dict__.setdefault("_given_once", set())
        if option_string is not None and self.dest in given:
            parser.error(f"{option_string} given twice: give it once")
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    """``coevo``'s parsers (the subcommands' too): an option that takes one value is given
    once (:class:`_StoreOnce`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)
        self.commands: dict[str, argparse.ArgumentParser] = {}

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        """As argparse's, but an option a subcommand does not know is refused by that
        subcommand's parser, with its usage (argparse printed the top-level one)."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            command = self.commands.get(getattr(parsed, "command", None) or "", self)
            command.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


class _Version(argparse.Action):
    """``--version``: the version is read when asked for (it asks git whether the checkout
    has changes, which no other command needs to wait for)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        sys.stdout.write(f"coevo {version()}\n")  # stdout, as argparse's own action
        parser.exit()


def build_parser() -> _Parser:
    """The argument parser with every subcommand."""
    parser = _Parser(prog="coevo", description="Event-sourced engine for co-evolving LLM agents.")
    parser.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a scenario file and print it resolved")
    p.add_argument("file")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", help=SET_HELP)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("run", help="run a scenario into a new run directory")
    p.add_argument("file")
    p.add_argument("--out", help="run directory (default: runs/<name>-<time>-<id>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", help=SET_HELP)
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("resume", help="continue a stopped, failed or killed run from its log")
    p.add_argument("run")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument(
        "--no-tracking",
        action="store_true",
        help="no live tracking this session, whatever [tracking] says (coevo export writes "
        "the scalars afterwards)",
    )
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("replay", help="rebuild state from a run's log, or verify it")
    p.add_argument("run")
    p.add_argument("--until", type=int, metavar="SEQ", help="state after event SEQ")
    p.add_argument("--verify", action="store_true", help="re-fold and check every checksum")
    p.add_argument("--json", action="store_true", help="print the state as JSON")
    p.add_argument(
        "--reexecute-learner",
        action="store_true",
        help="re-run every recorded model update from the base weights; check every digest",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", help=HERE_HELP)
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("report", help="one self-contained HTML page of plots about runs")
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument("--out", help="the HTML file (default: report.html in the first RUN; -: stdout)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("probe", help="did the extractor's RL make its bank better? (see docs)")
    p.add_argument("run")
    p.add_argument("--control", metavar="RUN", help="the frozen control's run, its extractor too")
    p.add_argument("--episodes", type=int, default=300, help="held-out episodes per bank")
    p.add_argument("--versions", default="0,mid,last", help="extractor versions (N, mid, last)")
    p.add_argument("--policy", default="final", help="the fixed policy: final, base or a PATH")
    p.add_argument("--greedy", action="store_true", help="extractors answer greedily")
    p.add_argument("--seed", type=int, default=0, help="the probe's seed (episodes, bootstrap)")
    p.add_argument("--out", metavar="DIR", help="report, JSON and plot (default: RUN/probe)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", help=HERE_HELP)
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("log", help="list a run's events")
    p.add_argument("run")
    p.add_argument("--kind", action="append", default=[], help="event kind (repeatable)")
    p.add_argument(
        "--actor",
        action="append",
        default=[],
        help="emitting actor (repeatable); an actor's start, failure, restart: the runtime's",
    )
    p.add_argument("--episode", default=None, help="correlation / episode id")
    p.add_argument("--from", dest="start", type=int, default=0, metavar="SEQ")
    p.add_argument("--to", dest="stop", type=int, default=None, metavar="SEQ", help="exclusive")
    p.add_argument("--limit", type=int, default=None, help="at most this many events")
    p.add_argument("--json", action="store_true", help="JSON lines")
    p.add_argument(
        "--full",
        action="store_true",
        help="every value whole on each line (a line is cut at 160 characters otherwise)",
    )
    p.add_argument("--follow", action="store_true", help="keep printing new events (live run)")
    p.set_defaults(func=cmd_log)

    p = sub.add_parser("audit", help="explain an entry, an episode or the credit from the log")
    p.add_argument("run")
    what = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    json_only = _Parser(add_help=False)
    json_only.add_argument("--json", action="store_true", help="print the answer as JSON")
    common = _Parser(add_help=False, parents=[json_only])  # (credit reads no index)
    common.add_argument("--index", metavar="DIR", help="the audit index (default RUN/audit)")
    q = what.add_parser("tip", parents=[common], help="an entry's lineage, uses and credit")
    q.add_argument("id", help="the entry's id (TipStored.tip_id)")
    q = what.add_parser("episode", parents=[common], help="an episode turn by turn")
    q.add_argument("id", help="the episode's id (e.g. ep000005)")
    q = what.add_parser("credit", parents=[json_only], help="re-derive every credit and advantage")
    q.add_argument(
        "--rule",
        help="credit rule: success, score, relative, or your own as package.module:function "
        "(counterfactual)",
    )
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    q.add_argument("--top", type=int, default=10, help="rows of the per-entry and per-call tables")
    q.add_argument("--until", type=int, metavar="SEQ", help="the run as it stood after event SEQ")
    q.add_argument(
        "--entry",
        metavar="ID",
        help="list one entry's credits per episode, recorded and re-derived",
    )
    q = what.add_parser("whatif", parents=[common], help="replay an episode with one change")
    q.add_argument("id", help="the episode's id (e.g. ep000005)")
    q.add_argument("--without-tip", type=int, metavar="ID", help="the entry removed from it")
    q.add_argument("--with-tip", type=int, metavar="ID", help="an entry shown (in its place)")
    q.add_argument("--version", type=int, metavar="N", help="another policy version acting")
    q.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", help=HERE_HELP)
    p.set_defaults(func=cmd_audit)

    add_check(sub)
    add_commands(sub)
    parser.commands = dict(sub.choices)
    return parser


if __name__ == "__main__":
    sys.exit(main())
