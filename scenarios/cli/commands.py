"""The ``coevo`` command line: validate, run, resume, replay (and re-execute updates), report,
probe, audit, list events and check them against the invariants.

Every error a user can cause ends as one line ``coevo: error: ...`` on stderr and a non-zero
exit code (2 for bad input); never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import io
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import msgspec
import trio
from rich.console import Console

from engine.errors import CoevoError, UpdateDiverged
from scenarios.cli.check import add_parser as add_check
from scenarios.cli.common import (
    ESCAPE_ERRORS,
    TOO_MANY_FILES,
    InputInvalid,
    answered,
    check_writable,
    given_path,
    home_expanded,
    keep_stderr_open,
    naming,
    open_run,
    out_of_resources,
    out_path,
    read_meta,
    shown_path,
    stdout_to_stderr,
    to_devnull,
    torn_copy_hint,
    torn_hint,
    unopenable_path,
    version,
)
from scenarios.cli.entry import Terminated, exits_after, stopped
from scenarios.cli.explore import add_commands
from scenarios.cli.logsetup import configure_logging
from scenarios.cli.run import cmd_resume, cmd_run, cmd_validate
from stores.rundir import find_run, replace_file

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
        elif exc.errno in _WRITE_ERRNOS:  # `> /dev/full`, a full disk under the output
            what = str(exc.filename) if exc.filename else "the output"
            said = f"cannot write {what}: {exc.strerror or exc}"
            to_devnull(sys.stdout)  # else the interpreter's last flush fails on it again
        else:
            raise
        print(f"coevo: error: {said}", file=sys.stderr)
        return 2 if exc.errno == errno.ENAMETOOLONG else 1
    except RuntimeError as exc:  # a run's own loop says more (scenarios.cli.run._run_loop)
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


class _Stdout(Console):
    """A console on stdout whose reader went away (``| head -1``) ends the command as every
    other command does, with exit 0 (rich's own answer is exit 1)."""

    def __init__(self) -> None:
        super().__init__(markup=False)  # a world's "[bold]" is its text, not a style

    def on_broken_pipe(self) -> None:
        self.quiet = True
        to_devnull(sys.stdout)  # nothing more reaches the closed pipe
        raise BrokenPipeError


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
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the answer as JSON")
    common.add_argument("--index", metavar="DIR", help="the audit index (default RUN/audit)")
    q = what.add_parser("tip", parents=[common], help="an entry's lineage, uses and credit")
    q.add_argument("id", help="the entry's id (TipStored.tip_id)")
    q = what.add_parser("episode", parents=[common], help="an episode turn by turn")
    q.add_argument("id", help="the episode's id (e.g. ep000005)")
    q = what.add_parser("credit", parents=[common], help="re-derive every credit and advantage")
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


# --- replay / log ---------------------------------------------------------------------------


def cmd_replay(args: argparse.Namespace) -> int:
    from engine.replay import replay_until, verify_log
    from scenarios.assemble import fact_checks, projections
    from scenarios.checks import check_context
    from scenarios.cli.console import actors_table, families_table

    if args.until is not None and args.until < 0:
        raise InputInvalid(f"--until must be >= 0, got {args.until}")
    if args.verify and (args.until is not None or args.json):
        raise InputInvalid("--verify checks the whole log; it takes no --until or --json")
    if args.reexecute_learner and (args.until is not None or args.json or args.verify):
        raise InputInvalid("--reexecute-learner takes no --until, --json or --verify")
    if args.set and not args.reexecute_learner:
        raise InputInvalid("--set applies to --reexecute-learner (which loads the run's models)")
    log = open_run(args.run)
    try:
        if args.reexecute_learner:
            return _reexecute(args.run, log, args.set)
        if args.verify:
            with naming(log.path):
                ctx, notes = check_context(log.read_meta(), args.run)
                result = verify_log(log, projections(), fact_checks(ctx, notes))
            left = [u.replace(": ", ": not checked: ", 1) for u in result.uncheckable]
            for note in (*notes, *left):
                print(f"coevo: note: {note}", file=sys.stderr)
            if not result.ok:
                hint = torn_hint(result.first_bad_seq) if result.damaged else ""
                if "unknown event kind" in result.error:  # the run's plug-in did not import?
                    from agents.methods.registry import unimported_note

                    hint += f"; {note}" if (note := unimported_note()) else ""
                raise _VerifyFailed(f"{log.path}: {result.error}{hint}")
            print(f"verified {result.events} events, {result.checks} checksums: ok")
            return 0
        with naming(log.path):
            fold, snap = replay_until(log, projections(), args.until)
    finally:
        log.close()
    if args.until is not None and args.until > fold.last_seq:
        print(
            f"coevo: note: {_past_end('--until', args.until, fold.last_seq + 1)}", file=sys.stderr
        )
    if args.json:
        sys.stdout.write(msgspec.json.encode(fold.states, order="deterministic").decode() + "\n")
        return 0
    console = _Stdout()
    start = f"snapshot after seq {snap}" if snap is not None else "the beginning"
    console.print(f"state after seq {fold.last_seq} (folded from {start})")
    console.print(actors_table(fold.states["actor_stats"]))
    console.print(families_table(fold.states["episodes"]))
    kinds = fold.states["actor_stats"].kinds
    console.print("events by kind: " + ", ".join(f"{k}={n}" for k, n in sorted(kinds.items())))
    return 0


def _past_end(option: str, seq: int, end: int) -> str:
    """The note for a seq past a log of ``end`` events."""
    if not end:
        return f"{option} {seq}: the log holds no event"
    return f"{option} {seq} is past the log's end: its last event is seq {end - 1}"


def _reexecute(path: str, log: Any, overrides: list[str]) -> int:
    from engine.lifecycle import RunStarted
    from engine.replay import replay_until
    from scenarios.assemble import projections
    from scenarios.cli.console import StepProgress
    from scenarios.policy_setup import reexecution_for

    first = next(iter(log.read(0, 1)), None)
    if first is None or not isinstance(first.event, RunStarted):
        raise InputInvalid(f"{path}: the log does not start with run_started")
    kinds = replay_until(log, projections())[0].states["actor_stats"].kinds
    total = kinds.get("policy_updated", 0) + kinds.get("extractor_updated", 0)
    if total == 0:
        raise InputInvalid(f"{path}: the log records no model update to re-execute")
    console = Console(stderr=True, markup=False)  # names as written
    console.print(f"loading the base models of {path} ...")
    run = reexecution_for(find_run(path).root, log.read_meta(), first.event.seed, overrides)
    try:
        with StepProgress(console, total, "updates") as progress:
            summary = run.run(
                log.read(0, None),
                lambda c: progress.advance(f"{c.model} v{c.version} {c.digest[:12]} ok"),
            )
    except UpdateDiverged as exc:
        meta = log.read_meta()
        note = _base_note(meta, overrides) if exc.start else _machine_note(meta)
        if note:
            print(f"coevo: note: {note}", file=sys.stderr)
        raise
    extra = f"; {summary.unapplied} requests never applied" if summary.unapplied else ""
    print(
        f"re-executed {summary.policy} policy and {summary.extractor} extractor updates: "
        f"every parameter digest matches the log ({summary.checkpoints} checkpoints on disk "
        f"compared){extra}"
    )
    from scenarios.loader import override_key

    if unread := [o for o in overrides if not override_key(o).startswith(LOADING)]:
        print(
            f"coevo: note: {' '.join(f'--set {o}' for o in unread)} "
            f"{'was' if len(unread) == 1 else 'were'} not read: each update re-runs as its "
            "request in the log says (learning rate, clipping, loss, samples); --set gives "
            "only how the base models load (where they lie, the device, threads, dtype, "
            "LoRA, the embedded recipe)",
            file=sys.stderr,
        )
    return 0


LOADING = (
    "policy.model",
    "policy.device",
    "policy.threads",
    "policy.dtype",
    "policy.gradient_checkpointing",
    "policy.lora",
    "policy.embedded",
    "grpo.kl_coef",
    "complementary.extractor",
    "complementary.ops",
    "complementary.lora",
)
"""The settings (key paths and their prefixes) a re-execution reads of a ``--set``: how the
base models load. The rest of an update is what its request in the log records."""


def _base_note(meta: Any, overrides: Sequence[str] = ()) -> str:
    """Why a re-execution's starting weights may not be the run's: a model named by ``--set``,
    the run's own directory gone or changed, or (a run that does not record its model
    directories) the embedded model this coevo builds is not the one an older coevo built."""
    from scenarios.policy_setup import model_overrides

    if named := model_overrides(overrides):
        return f"--set {named[0]} gives another model than the one the run started from"
    if meta is not None and meta.models:
        return (
            "the model directory the run started from is gone or changed (an embedded model "
            "built again differs when built by another coevo or on another CPU kind); --set "
            "policy.model=DIR names a directory that holds the run's"
        )
    return (
        "the run does not record the model directories it started from (made before "
        "2026-12-03); an embedded model built by this coevo differs from one an older coevo "
        "built (its recipe changed): --set policy.model=DIR names the one the run started "
        "from (a directory under the cache's embedded/, and complementary.extractor=DIR the "
        "extractor's under extractor/)"
    )


def _machine_note(meta: Any) -> str:
    """What a divergence may owe to the machine: "" if the run records this machine."""
    from engine.eventlog import machine_description

    here = machine_description()
    written = meta.machine if meta is not None else ""
    if written == here:
        return ""
    since = f"was written on {written}" if written else "does not record the machine that wrote it"
    return (
        f"the run {since}; this is {here}. An update re-executes bit for bit only on a machine "
        "whose kernels round its floating-point sums as the writer's did: on another, the "
        "first update may diverge by rounding alone."
    )


class _VerifyFailed(CoevoError):
    """``replay --verify`` found a corrupted record or a divergent checksum."""

    exit_code = 1


def cmd_report(args: argparse.Namespace) -> int:
    from agents.report.page import PAGE_HEAD, RunData, fold_run, render

    roots = [find_run(path).root for path in args.runs]
    real = [r.resolve() for r in roots]
    if twice := [str(r) for r in real if real.count(r) > 1]:  # as `serve` does
        raise InputInvalid(f"{twice[0]}: given more than once")
    runs: list[RunData] = []
    for path, root in zip(args.runs, roots, strict=True):
        log = open_run(path)
        try:
            if log.next_seq == 0:
                raise InputInvalid(f"{path}: the event log is empty")
            with naming(log.path):  # which log, and a plug-in method that did not import
                meta = log.read_meta()
                toml = meta.scenario_toml if meta else ""
                runs.append(fold_run(_label(root, roots), root, toml, log.read(0, None)))
        finally:
            log.close()
    out = None  # None: the page on stdout (`--out -`, which wrote a file named "-")
    if args.out != "-":
        out = out_path(args.out, lambda: runs[0].path / "report.html")
        if out.is_dir():
            raise InputInvalid(f"{out}: a directory; --out takes the page's file (DIR/report.html)")
        _refuse_overwrite(out, PAGE_HEAD.encode())
        check_writable(out, "" if args.out else "--out FILE")
    for run in runs:
        _draw_missing_curves(run)
    if out is None:
        return answered(0, render(runs))
    page = render(runs).encode("utf-8")
    try:
        replace_file(out, page)
    except OSError as exc:
        hint = "" if args.out else " (--out FILE writes it elsewhere)"
        raise InputInvalid(f"{out}: cannot write: {exc.strerror}{hint}") from None
    print(f"report: {out} ({len(page) // 1024} KiB, {len(runs)} run{'s' * (len(runs) > 1)})")
    return 0


def _state_of(path: str) -> str:
    """How the run at ``path`` stands (:func:`stores.rundir.run_state`)."""
    from stores.rundir import log_state

    log = open_run(path)
    try:
        with naming(log.path):
            return log_state(log, log.path)
    finally:
        log.close()


def _draw_missing_curves(run: Any) -> None:
    """Write a completed learning run's curves (CSV files and PNG) when its directory lacks
    one: the run was stopped, or the disk was full, between its end and its curves. A
    directory they cannot be written to gets a warning; the report goes on."""
    from agents.report.curves import CURVE_FILES
    from agents.report.curves import report as curves_report

    missing = [name for name in CURVE_FILES if not (run.path / name).exists()]
    if run.status != "completed" or run.method.startswith("rollout") or not missing:
        return
    log = open_run(str(run.path))
    try:
        title = f"{run.scenario} (seed {run.seed})"  # as the run titles them
        lines = curves_report(run.path, (env.event for env in log.read(0, None)), title)
    except OSError as exc:
        print(
            f"coevo: warning: cannot write the curves of {run.path} ({', '.join(missing)} "
            f"missing): {exc.strerror or exc}",
            file=sys.stderr,
        )
        return
    finally:
        log.close()
    for line in lines:
        print(line)


def _refuse_overwrite(out: Path, report_head: bytes) -> None:
    """Raise InputInvalid unless ``out`` is free or an earlier coevo report (a file that begins
    with ``report_head``): a report never replaces another file (a run's event log, a
    scenario)."""
    if not out.exists() and not out.is_symlink():
        return
    try:
        with out.open("rb") as f:
            head = f.read(len(report_head)) if out.is_file() else b""
    except OSError as exc:
        raise InputInvalid(f"{out}: cannot read: {exc.strerror}") from None
    if head != report_head:
        raise InputInvalid(f"{out}: exists and is not a coevo report; choose another --out")


def _label(root: Path, roots: list[Path]) -> str:
    """A run's name in a report: its directory's name, with as many of its parents as tell it
    apart from the other runs' (``x1/s/r`` and ``x2/s/r``, not ``s/r`` twice); the same run
    given twice is one name."""
    mine = root.resolve().parts
    others = {r.resolve().parts for r in roots} - {mine}
    for k in range(1, len(mine) + 1):
        if all(o[-k:] != mine[-k:] for o in others):
            return "/".join(mine[-k:]).removeprefix("//")
    return "/".join(mine).removeprefix("//")


def cmd_probe(args: argparse.Namespace) -> int:
    from agents.probe.coevolution import BankResult, Progress
    from agents.probe.report import line, to_json, write_probe
    from scenarios.probe_setup import ProbeOptions, probe_run, read_run

    if not args.policy.strip():  # a script's unset variable: read as the directory "."
        raise InputInvalid(f"--policy is empty ({args.policy!r}); give final, base or a PATH")

    def read(path: str) -> Iterator[Any]:
        log = open_run(path)
        try:
            with naming(log.path):
                yield from log.read(0, None)
        finally:
            log.close()

    given = None if args.out is None else out_path(args.out, Path)  # before any work
    if given is not None and given.exists() and not given.is_dir():
        raise InputInvalid(f"--out {given}: a file, not a directory for the probe's report")
    run = read_run(args.run, read_meta(args.run), read, args.set)
    if (state := _state_of(args.run)) != "completed":  # the probe is for a finished run
        print(
            f"coevo: note: {args.run} has not completed ({state}): the probe plays the "
            "extractor versions it reached",
            file=sys.stderr,
        )
    control = (
        read_run(args.control, read_meta(args.control), read, args.set) if args.control else None
    )
    options = ProbeOptions(args.episodes, args.versions, args.policy, args.greedy, args.seed)
    console = Console(stderr=True, markup=False)  # names as written
    out = given if given is not None else run.root / "probe"
    check_writable(out, "" if given else "--out DIR")  # not after every bank's episodes
    with _Stages(console) as stages:

        def done(r: BankResult) -> None:
            if not args.json:
                stages.say(line(r))

        with stdout_to_stderr():  # a world's prints: not before the --json answer
            result = probe_run(run, control, options, Progress(stages.stage, stages.advance, done))
    result = msgspec.structs.replace(result, overrides=tuple(args.set))  # recorded with it
    if args.set and not args.json:
        print(f"coevo: note: probed under --set {' '.join(args.set)}", file=sys.stderr)
    try:
        paths = write_probe(result, out)
    except OSError as exc:
        raise InputInvalid(f"{out}: cannot write: {exc.strerror}") from None
    if args.json:
        sys.stdout.write(to_json(result).decode() + "\n")
        return 0
    print(result.verdict)
    print("probe: " + ", ".join(str(p) for p in paths))
    return 0


class _Stages:
    """One progress bar per stage of a long command (on stderr)."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._bar: Any = None

    def __enter__(self) -> _Stages:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def stage(self, label: str, total: int) -> None:
        from scenarios.cli.console import StepProgress

        self._close()
        self._bar = StepProgress(self._console, max(total, 1), label).__enter__()

    def advance(self, n: int) -> None:
        for _ in range(n):
            self._bar.advance("")

    def say(self, text: str) -> None:
        """A line on stdout, after the current bar."""
        self._close()
        print(text, flush=True)

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


def cmd_log(args: argparse.Namespace) -> int:
    from engine.events import event_types
    from engine.replay import EventFilter, iter_events

    for name, value in (("--from", args.start), ("--to", args.stop), ("--limit", args.limit)):
        if value is not None and value < 0:
            raise InputInvalid(f"{name} must be >= 0, got {value}")
    if args.stop is not None and args.stop <= args.start:  # printed nothing, exit 0
        raise InputInvalid(
            f"--to {args.stop} is not after --from {args.start}: no event lies between them "
            "(--to is exclusive)"
        )
    for name, given in (("--episode", [args.episode]), ("--actor", args.actor)):
        if any(g is not None and not g.strip() for g in given):  # "" printed every event
            raise InputInvalid(f"{name}: an empty name (leave the option out for every one)")
    log = open_run(args.run)  # first: it imports a plug-in method's own event kinds
    try:
        kinds = event_types()
        for kind in args.kind:
            if kind not in kinds:
                near = difflib.get_close_matches(kind, list(kinds), n=3)
                hint = f" (did you mean {' or '.join(near)}?)" if near else ""
                known = ", ".join(kinds)
                from agents.methods.registry import unimported_note

                note = unimported_note()  # the run's own method's kinds, when it did not import
                raise InputInvalid(
                    f"--kind: no event kind {kind!r}{hint}; known: {known}"
                    + (f"; {note}" if note else "")
                )
        flt = EventFilter(
            kinds=frozenset(args.kind),
            actors=frozenset(args.actor),
            corr=args.episode or "",
            start=args.start,
            stop=args.stop,
        )
        with naming(log.path):
            if args.follow:
                return _follow(log, flt, args)
            shown = 0
            for env in iter_events(log, flt):
                if args.limit is not None and shown >= args.limit:
                    break
                _print_envelope(env, args.json, args.full)
                shown += 1
            if not shown and args.actor:
                _check_actors(log, args.actor)
            if not shown and args.episode:
                _check_episode(log, args.episode)
            if not shown and args.start >= (end := log.next_seq):
                print(f"coevo: note: {_past_end('--from', args.start, end)}", file=sys.stderr)
    finally:
        log.close()
    return 0


def _check_actors(log: Any, asked: list[str]) -> None:
    """Raise InputInvalid when an actor ``--actor`` names emitted nothing in the whole run (a
    typo, most likely): nothing shown is then no answer."""
    actors = sorted({env.actor for env in log.read(0, None)})
    missing = [a for a in asked if a not in actors]
    if missing:
        raise InputInvalid(
            f"--actor: no event of {', '.join(map(repr, missing))} in this run; "
            f"its actors: {', '.join(actors)}"
        )


def _check_episode(log: Any, asked: str) -> None:
    """Raise InputInvalid when no event of the whole run carries ``--episode`` (a typo, or a
    number without its ``ep`` prefix, most likely): nothing shown is then no answer."""
    seen = {env.corr for env in log.read(0, None)}
    if asked in seen:
        return
    ids = sorted(c for c in seen if c)
    near = difflib.get_close_matches(asked, ids, n=3)
    if near:
        hint = f" (did you mean {' or '.join(near)}?)"
    else:
        hint = f" (its {len(ids)} ids run from {ids[0]} to {ids[-1]})" if ids else ""
    raise InputInvalid(f"--episode: no event of {asked!r} in this run{hint}")


def _follow(log: Any, flt: Any, args: argparse.Namespace) -> int:
    """Print events as the run commits them, until ``--limit``, until the run's writer is
    gone and every event is shown (a run that ended or was killed: a killed one is said on
    stderr), or until a Ctrl-C (exit 0) or a SIGTERM (exit 143; taken inside trio, so it stops
    the tail where it waits)."""
    from engine.replay import follow
    from stores.lmdb_env import writer_alive
    from stores.rundir import log_state

    terminated = False
    caught_up = False  # the tail reached the end of a log no process writes

    async def on_sigterm(signals: Any, scope: trio.CancelScope) -> None:
        nonlocal terminated
        async for _ in signals:
            terminated = True
            scope.cancel()
            return

    async def tail() -> None:
        count = 0
        with trio.open_signal_receiver(signal.SIGTERM) as signals:  # from here, no Terminated
            async with trio.open_nursery() as nursery:
                nursery.start_soon(on_sigterm, signals, nursery.cancel_scope)
                async for env in follow(log, flt, writing=lambda: writer_alive(log.path)):
                    if args.limit is not None and count >= args.limit:
                        break
                    try:
                        _print_envelope(env, args.json, args.full)
                        sys.stdout.flush()
                    except BrokenPipeError:  # `| head`: the reader has what it wanted
                        to_devnull(sys.stdout)
                        break
                    count += 1
                else:
                    nonlocal caught_up
                    caught_up = flt.stop is None or log.next_seq < flt.stop
                nursery.cancel_scope.cancel()

    try:
        trio.run(tail)
    except BaseException as exc:  # a Ctrl-C is how a follow ends; a SIGTERM stops it
        stop = _interrupt(exc)
        if stop is None:
            raise
        if isinstance(stop, Terminated):
            raise Terminated from None
        return 0
    if terminated:
        raise Terminated
    if caught_up and args.start >= (end := log.next_seq):  # nothing was there to follow
        print(f"coevo: note: {_past_end('--from', args.start, end)}", file=sys.stderr)
    if caught_up and log_state(log, log.path) == "killed":
        print(
            f"coevo: {args.run}: no process writes this run any more and its log has no final "
            "event: it was killed (coevo resume continues it)",
            file=sys.stderr,
        )
    return 0


def _interrupt(exc: BaseException) -> KeyboardInterrupt | None:
    """``exc`` if it is a KeyboardInterrupt (a Ctrl-C, or a SIGTERM as ``Terminated``), or the
    first one of an exception group made only of them (as a nursery raises it); else None."""
    if isinstance(exc, KeyboardInterrupt):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        group = cast("BaseExceptionGroup[BaseException]", exc)
        found = [_interrupt(e) for e in group.exceptions]
        if found and all(f is not None for f in found):
            return found[0]
    return None


def _print_envelope(env: Any, as_json: bool, full: bool = False) -> None:
    from scenarios.cli.console import envelope_dict, envelope_line

    if as_json:
        sys.stdout.write(msgspec.json.encode(envelope_dict(env)).decode() + "\n")
    else:
        sys.stdout.write(envelope_line(env, width=None if full else 160) + "\n")


# --- audit --------------------------------------------------------------------------------------


def cmd_audit(args: argparse.Namespace) -> int:
    from agents.audit import render
    from agents.audit.shown import safe_line

    if args.what == "whatif":
        from scenarios.cli.explore import cmd_whatif

        return cmd_whatif(args)
    log = open_run(args.run)
    try:
        with naming(log.path), stdout_to_stderr():  # a plug-in's prints: not the answer
            answer = _audit_credit(log, args) if args.what == "credit" else _audit_one(log, args)
    finally:
        log.close()
    if args.what == "credit":
        lines = lambda: render.render_credit(answer, args.top)  # noqa: E731
    else:
        lines = lambda: (  # noqa: E731
            render.render_tip(answer) if args.what == "tip" else render.render_episode(answer)
        )
    code = 0 if args.what != "credit" or answer.counterfactual or answer.match else 1
    if args.json:
        return answered(code, msgspec.json.encode(answer).decode() + "\n")
    return answered(code, "\n".join(safe_line(line) for line in lines()) + "\n")


def _audit_one(log: Any, args: argparse.Namespace) -> Any:
    from agents.audit.answers import audit_tip, entry_id
    from agents.audit.episode import audit_episode
    from agents.audit.index import answer_from_index

    tip = entry_id(args.id) if args.what == "tip" else None

    def ask(index: Any) -> Any:
        if tip is not None:
            return audit_tip(log, index, tip)
        return audit_episode(log, index, args.id)

    where = None if args.index is None else given_path(args.index, "--index", lmdb=True)
    from scenarios.cli.console import indexing_lines

    root = find_run(args.run).root
    answer, note = answer_from_index(root, log, where, ask, indexing_lines())
    if note:
        print(f"coevo: note: {note}", file=sys.stderr)
    return answer


def _audit_credit(log: Any, args: argparse.Namespace) -> Any:
    from agents.audit.answers import entry_id
    from agents.audit.credit import audit_credit
    from agents.audit.inputs import gather, parse_setting, with_overrides
    from agents.invariants.credit import run_settings
    from engine.errors import AuditQueryInvalid
    from scenarios.loader import stored_scenario
    from scenarios.methods import advantages_changed, built_on_complementary

    if args.top < 0:
        raise InputInvalid(f"--top must be >= 0, got {args.top}")
    if args.until is not None and args.until < 0:
        raise InputInvalid(f"--until must be >= 0, got {args.until}")
    entry = None if args.entry is None else entry_id(args.entry)
    scenario = stored_scenario(log.read_meta(), args.run)
    subgroups = [s for s in args.set if s.partition("=")[0] in ("split", "weighted")]
    method = scenario.run.method
    if subgroups and method != "complementary" and not built_on_complementary(scenario):
        raise AuditQueryInvalid(  # a plug-in of its own: [complementary] is read by nothing
            f"--set {subgroups[0]}: run.method = {method!r} has no guided and free subgroups "
            "(split and weighted are Complementary RL's and its plug-ins'; std_norm "
            "re-derives the advantages)"
        )
    try:  # the run's own settings, as the credit invariant reads them
        base = run_settings(scenario)
    except ValueError as exc:
        raise AuditQueryInvalid(f"the run's method: {exc}") from None
    settings = with_overrides(
        base,
        args.rule,
        args.set,
        lambda sets: _method_or_none(scenario, sets),
        lambda sets: advantages_changed(scenario, **sets),
    )
    given = dict(s.partition("=")[::2] for s in args.set)
    credit_keys = {"batch", "alpha", "cooldown", "reweight", "counts"}
    asked = args.rule is not None or bool(given.keys() & credit_keys)
    inputs = gather(log, args.until)
    if args.until is not None and args.until >= inputs.end:
        print(f"coevo: note: {_past_end('--until', args.until, inputs.end)}", file=sys.stderr)
    partial = args.until is not None and args.until + 1 < log.next_seq
    with _rule_progress(args.rule) as on_call:
        audit = audit_credit(
            inputs, settings, base, asked=asked, partial=partial, on_call=on_call, entry=entry
        )
    shown: dict[str, bool | None] = {"split": None, "weighted": None}
    if method == "complementary" or built_on_complementary(scenario):
        comp = scenario.complementary  # the run's own subgroups, unless --set gave them
        shown = {"split": comp.subgroups, "weighted": comp.subgroup_weights}
        shown |= {k: parse_setting(k, v) for k, v in given.items() if k in shown}
    return msgspec.structs.replace(audit, **shown)


@contextlib.contextmanager
def _rule_progress(rule: str | None, every: float = 5.0) -> Generator[Callable[[int], None] | None]:
    """For a credit rule of the researcher's own (which may be slow, or hang in its first
    call): a line on stderr every ``every`` seconds while the audit runs, saying how many
    episodes the rule has answered so far (from a thread of its own: a line printed as a call
    returned said nothing of a call that never did). Yields what the audit tells each answer
    (None: no rule of the researcher's)."""
    from agents.audit.derive import RULE_DONE

    if rule is None or ":" not in rule:
        yield None
        return
    start, answered, done = time.monotonic(), [0], threading.Event()

    def tell() -> None:
        while not done.wait(every):
            line = (
                f"coevo: credit rule {rule!r}: called for {answered[0]} episodes so far "
                f"({time.monotonic() - start:.0f} s)\n"
            )
            sys.stderr.write(line)  # one write: a line the rule prints cannot split it
            sys.stderr.flush()

    def called(n: int) -> None:
        if n == RULE_DONE:  # the rest of the audit is not the rule's
            done.set()
        else:
            answered[0] = n

    watch = threading.Thread(target=tell, name="coevo-rule-progress", daemon=True)
    watch.start()
    try:
        yield called
    finally:
        done.set()
        watch.join()


def _method_or_none(scenario: Any, sets: Mapping[str, bool]) -> Any:
    """The run's method with ``--set`` overrides; None for a run without one.

    Raises:
        AuditQueryInvalid: the method cannot be built (a plug-in that no longer imports).
    """
    from engine.errors import AuditQueryInvalid
    from scenarios.methods import method_with

    if scenario.run.method == "rollout":
        return None
    try:
        return method_with(scenario, **sets)
    except ValueError as exc:
        raise AuditQueryInvalid(f"the run's method: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
