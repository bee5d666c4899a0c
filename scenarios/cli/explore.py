"""The ``coevo`` commands that open a finished or live run to people and tools: ``export``
(its scalars to TensorBoard, W&B offline or MLflow), ``diff`` (two runs compared), ``serve``
(a read-only web browser of runs) and ``copy`` (a run copied whole, even while written)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import sys
import time
import tomllib
from collections.abc import Generator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from engine.errors import LogError
from scenarios.cli.common import (
    InputInvalid,
    LogUnreadable,
    answered,
    given_path,
    missing_checkpoints,
    naming,
    newest_checkpoints,
    open_run,
    openable,
    outside_lmdb,
    resolved_path,
    stdout_to_stderr,
    version,
)
from stores.rundir import RunDir, find_run, paths_under, remove_new

if TYPE_CHECKING:
    from engine.events import Envelope, Event

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    """Add ``export``, ``diff`` and ``serve`` to the ``coevo`` parser's subcommands."""
    p = sub.add_parser("export", help="write a run's scalars to TensorBoard, W&B or MLflow")
    p.add_argument("run")
    p.add_argument("--tensorboard", metavar="DIR", help="TensorBoard event files in DIR")
    p.add_argument("--wandb", metavar="DIR", help="an offline Weights & Biases run under DIR")
    p.add_argument("--mlflow", metavar="DIR", help="an MLflow file store at DIR")
    p.add_argument("--block", type=int, help="training episodes per point (default: the run's)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("diff", help="two runs' scenario differences and first diverging event")
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("serve", help="browse runs in a local, read-only web application")
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free one)")
    p.add_argument(
        "--public",
        action="store_true",
        help="allow a --host other than the loopback (the pages show everything in the runs)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="close a connection that has not sent a whole request head by then (default 10)",
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("copy", help="copy a run directory, consistently even while it is written")
    p.add_argument("run")
    p.add_argument("dest", metavar="DEST", help="a new or empty directory")
    p.set_defaults(func=cmd_copy)


COPYING = ".log.copying"
"""Where ``coevo copy`` writes the log until the run's other files are copied: a copy killed
part way is not a run directory (no ``log``), not one that reads as complete."""


def cmd_copy(args: argparse.Namespace) -> int:
    """``coevo copy RUN DEST``: the log as of its last commit (never torn, unlike a ``cp -r``
    taken while the run writes), then the run directory's other files; the log takes its
    name last (:data:`COPYING`)."""
    rd = find_run(args.run)
    openable(args.dest, "DEST")
    dest = Path(args.dest)
    src, there = rd.root.resolve(), resolved_path(outside_lmdb(dest, "DEST"), "DEST")
    if there == src or src in there.parents or there in src.parents:
        raise InputInvalid(f"{dest}: inside {rd.root} or holding it; copy to another directory")
    if (dest / COPYING).exists():
        raise InputInvalid(_COPY_UNDER_WAY.format(dest=dest))
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputInvalid(f"{dest}: not a new or empty directory for the copy")
    existed = dest.exists()
    _claim_copy(dest)
    try:
        live, copied, meta = _copy_run(rd, dest)
    except BaseException:  # a full disk, a Ctrl-C: what was copied would block a retry
        remove_new(dest, set() if existed else None)  # it was empty, or not there
        raise
    run_id = meta.run_id if meta is not None else "?"
    print(f"copied run {run_id} to {dest}: {copied:,} events", file=sys.stderr)
    if live:
        print(
            "coevo: note: the run was being written; the copy is its log as of one commit. "
            f"Resumed, the copy is a second run of id {run_id}, apart from the original",
            file=sys.stderr,
        )
    try:
        gone = _unresumable(dest)
    except (LogUnreadable, LogError) as exc:  # LMDB copies pages as they are: the run's is so
        print(
            f"coevo: error: the run's log is damaged, and its copy holds it as it is: {exc}",
            file=sys.stderr,
        )
        return 1
    if gone:
        print(
            f"coevo: error: the copy lacks {' and '.join(gone)}, the newest its log names (the "
            "run pruned it while it was copied): the copy reads, checks and audits, but coevo "
            "resume cannot continue it; copy the run again once it has stopped",
            file=sys.stderr,
        )
        return 1
    return 0


_COPY_UNDER_WAY = (
    "{dest}: holds a copy under way, or one stopped before it ended (killed); once no "
    "coevo copy writes there, remove it and copy again"
)


def _claim_copy(dest: Path) -> None:
    """Make ``dest/``:data:`COPYING` (creating ``dest``), the mark that this process copies
    into ``dest``: two copies into one DEST at once raced (tracebacks, and the loser's
    clean-up removed the winner's finished copy). Only one process creates the mark; a
    process that finds ``dest`` holding more than its own mark (a copy that ended meanwhile)
    takes its mark back and is refused.

    Raises:
        InputInvalid: another copy holds the mark, or has filled ``dest`` meanwhile.
    """
    try:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / COPYING).mkdir()
    except FileExistsError:
        raise InputInvalid(_COPY_UNDER_WAY.format(dest=dest)) from None
    except OSError as exc:
        raise InputInvalid(f"{dest}: cannot be made: {exc.strerror or exc}") from None
    if {p.name for p in dest.iterdir()} != {COPYING}:
        (dest / COPYING).rmdir()
        raise InputInvalid(f"{dest}: not a new or empty directory for the copy")


def _unresumable(dest: Path) -> list[str]:
    """The checkpoints a resume of the copy at ``dest`` would load that it lacks."""
    from agents.events.extractor import ExtractorUpdated
    from agents.events.policy import PolicyUpdated
    from engine.replay import EventFilter, iter_events

    kinds = frozenset(str(c.__struct_config__.tag) for c in (PolicyUpdated, ExtractorUpdated))
    log = open_run(str(dest))
    try:
        with naming(log.path):
            named = newest_checkpoints(iter_events(log, EventFilter(kinds=kinds)))
    finally:
        log.close()
    return missing_checkpoints(dest, named)


def _copy_run(rd: RunDir, dest: Path) -> tuple[bool, int, Any]:
    """:func:`cmd_copy`'s work: whether the run was live, the events copied, its metadata.

    Raises:
        InputInvalid: a file cannot be copied.
    """
    from agents.audit.index import INDEX_DIR
    from stores.lmdb_env import writer_alive

    log = open_run(str(rd.root))
    try:
        with naming(log.path):
            live = writer_alive(log.path)
            copied = log.copy_to(dest / COPYING)
            meta = log.read_meta()
    finally:
        log.close()
    skip = {"log", INDEX_DIR}  # the log copied above; the index is a cache of it
    for item in sorted(rd.root.rglob("*")):
        rel = item.relative_to(rd.root)
        if rel.parts[0] in skip or any(part.startswith(".") for part in rel.parts):
            continue  # a checkpoint still being written (.vNNNNNN.partial) is not one yet
        target = dest / rel
        try:
            if item.is_dir() and not item.is_symlink():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(item, target, follow_symlinks=False)
        except FileNotFoundError:  # the run removed it meanwhile (a pruned checkpoint)
            continue
        except OSError as exc:
            raise InputInvalid(f"cannot copy {item} to {target}: {exc.strerror or exc}") from None
    (dest / COPYING).rename(dest / "log")  # now it is a run directory
    return live, copied, meta


def cmd_export(args: argparse.Namespace) -> int:
    from agents.tracking.sinks import written_before

    targets = [
        (n, getattr(args, n)) for n in ("tensorboard", "wandb", "mlflow") if getattr(args, n)
    ]
    if not targets:
        raise InputInvalid("export needs a target: --tensorboard DIR, --wandb DIR or --mlflow DIR")
    if args.block is not None and args.block < 1:
        raise InputInvalid(f"--block must be >= 1, got {args.block}")
    name = find_run(args.run).root.name
    for sink_name, where in targets:
        outside_lmdb(Path(where), f"--{sink_name}")
        if sink_name != "mlflow":  # TensorBoard's and W&B's writers encode the path
            openable(where, f"--{sink_name}", f"the {sink_name} writer")
    before = {where: paths_under(Path(where)) for _, where in targets}
    done: list[str] = []
    with contextlib.ExitStack() as claimed:
        mine: list[str] = []  # the directories this export holds
        try:
            for sink_name, where in targets:  # two exports into one directory at once
                real = os.path.realpath(where)  # two sinks of this export may share one
                if real not in {os.path.realpath(w) for w in mine}:
                    if (fd := _claim_export(Path(where), f"--{sink_name}")) is not None:
                        claimed.callback(os.close, fd)
                    mine.append(where)
                if held := written_before(sink_name, Path(where), name):
                    raise InputInvalid(
                        f"--{sink_name} {where}: already holds {held} (an earlier export of "
                        "this run or of another run whose directory has its name, or a run's "
                        "own tracking); an export there again would show its points twice or "
                        "mix two runs under one name (choose another directory, or remove that "
                        "first)"
                    )
        except BaseException:
            for where in mine:  # a directory made for the claim, still empty
                if before[where] is None:
                    with contextlib.suppress(OSError):
                        Path(where).rmdir()
            raise
        _export(args, targets, name, before, done)
    print("\n".join(done))
    return 0


def _claim_export(where: Path, flag: str) -> int | None:
    """``where`` made and locked (``flock`` on the directory; released when the descriptor
    closes or the process ends) for this export: two exports into one directory at once both
    passed the check that it holds no export yet, and every point was there twice.

    Returns:
        The directory's descriptor (None where the file system cannot lock a directory:
        unguarded, as before).

    Raises:
        InputInvalid: it cannot be made, or another export holds it.
    """
    from stores.lmdb_env import lock_directory

    if where.exists() and not where.is_dir():  # mkdir said only "File exists"
        raise InputInvalid(f"{flag} {where}: a file, not a directory for the export")
    try:
        where.mkdir(parents=True, exist_ok=True)
        return lock_directory(where)
    except BlockingIOError:
        raise InputInvalid(
            f"{flag} {where}: another coevo export is writing into it now; an export there "
            "too would show its points twice (choose another directory)"
        ) from None
    except OSError as exc:
        raise InputInvalid(f"{flag} {where}: cannot write: {exc.strerror or exc}") from None


def _export(
    args: argparse.Namespace,
    targets: list[tuple[str, str]],
    name: str,
    before: dict[str, set[Path] | None],
    done: list[str],
) -> None:
    """:func:`cmd_export`'s work once its directories are claimed: fold the run's scalars and
    write them to every sink; a failure part way removes what it wrote."""
    from agents.tracking.scalars import KINDS, fold_scalars
    from agents.tracking.sinks import open_sink
    from engine.replay import EventFilter, iter_events

    log = open_run(args.run)
    try:
        with naming(log.path):
            meta = log.read_meta()
            block = args.block or _tracking_block(meta.scenario_toml if meta else "")
            kinds = frozenset(str(k.__struct_config__.tag) for k in KINDS)
            points = fold_scalars(iter_events(log, EventFilter(kinds=kinds)), block)
    finally:
        log.close()
    config = _scenario_dict(meta.scenario_toml if meta else "")
    try:
        for sink_name, where in targets:
            try:
                sink = open_sink(sink_name, Path(where), name, config)
                sink.write(points)
                sink.close()
            except OSError as exc:
                raise InputInvalid(f"{where}: cannot write: {exc.strerror or exc}") from None
            series = len({p.tag for p in points})
            done.append(
                f"{sink_name}: {len(points)} points of {series} series -> {where} (block {block})"
            )
    except BaseException:  # stopped or failed part way: none of it stays (a re-run is refused)
        if "wandb" in sys.modules:  # its service process would write on into what goes
            with contextlib.suppress(Exception):
                sys.modules["wandb"].teardown()
        for where, paths in before.items():
            remove_new(Path(where), paths)
        raise


def _scenario_dict(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


def _tracking_block(text: str) -> int:
    """The run's ``tracking.block`` (16 where its scenario predates tracking)."""
    block = _scenario_dict(text).get("tracking", {}).get("block", 16)
    return block if isinstance(block, int) and block >= 1 else 16


def _common(toml_a: str, toml_b: str) -> tuple[str | None, str | None]:
    """The world and the method both runs name (None where they differ): whose option
    defaults the comparison fills in."""
    a, b = _scenario_dict(toml_a), _scenario_dict(toml_b)

    def same(table: str, key: str) -> str | None:
        x, y = (_key(d, table, key) for d in (a, b))
        return x if isinstance(x, str) and x == y else None

    return same("world", "name"), same("run", "method")


def _key(doc: dict[str, Any], table: str, key: str) -> object:
    found = doc.get(table)
    return cast("dict[str, object]", found).get(key) if isinstance(found, dict) else None


def cmd_diff(args: argparse.Namespace) -> int:
    """Exit 0 when the logs do not diverge, 1 when they do."""
    import msgspec

    from agents.analysis.diff import describe, diverging_seqs, scenario_changes
    from agents.audit.index import fetch
    from scenarios.schema import table_defaults

    log_a, log_b = open_run(args.run_a), None
    try:
        log_b = open_run(args.run_b)
        with naming(log_a.path):
            meta_a = log_a.read_meta()
        with naming(log_b.path):
            meta_b = log_b.read_meta()
        toml_a = meta_a.scenario_toml if meta_a else ""
        toml_b = meta_b.scenario_toml if meta_b else ""
        changes = scenario_changes(
            toml_a,
            toml_b,
            table_defaults(*_common(toml_a, toml_b)),
            (_before(toml_a), _before(toml_b)),
        )
        versions = {m.coevo_version for m in (meta_a, meta_b) if m is not None}
        counts = (log_a.next_seq, log_b.next_seq)
        code: tuple[list[str], list[str]] = ([], [])
        with naming(log_a.path), naming(log_b.path):
            found = diverging_seqs(
                _sessions(log_a.read(0, counts[0]), code[0]),
                _sessions(log_b.read(0, counts[1]), code[1]),
            )
            divergence = None
            if found is not None:
                stream, seq_a, seq_b, names_a, names_b = found
                env_a = fetch(log_a, [seq_a])[seq_a] if seq_a is not None else None
                env_b = fetch(log_b, [seq_b])[seq_b] if seq_b is not None else None
                divergence = describe(stream, env_a, env_b, (names_a, names_b))
    finally:
        log_a.close()
        if log_b is not None:
            log_b.close()
    if args.json:
        out = {
            "scenario": changes,
            "code": {"a": code[0], "b": code[1]},
            "events": counts,
            "divergence": divergence,
        }
        return answered(1 if divergence else 0, msgspec.json.encode(out).decode() + "\n")
    note = ""
    if any(c.default_a or c.default_b for c in changes) and versions - {version()}:
        note = (
            f"  (defaults are this coevo's, {version()}; a run made by coevo "
            f"{', '.join(sorted(versions - {version()}))} may have had others)"
        )
    made = ""  # what else made them, when the code differs
    if len({*code[0], *code[1]}) > 1:
        made = f"code: A {_versions_text(code[0])}; B {_versions_text(code[1])}"
    lines = _diff_lines(args.run_a, args.run_b, changes, counts, divergence, note, made)
    return answered(1 if divergence else 0, "".join(f"{line}\n" for line in lines))


def _sessions(envs: Iterable[Envelope[Event]], versions: list[str]) -> Iterator[Envelope[Event]]:
    """``envs`` as they are, the coevo version of each session (``run_started``, then each
    ``run_resumed``) appended to ``versions`` as they pass: two runs made, or resumed, by
    other code can differ for that reason alone, which the events' comparison leaves out."""
    from engine.lifecycle import RunResumed, RunStarted

    for env in envs:
        if isinstance(env.event, RunStarted | RunResumed):
            versions.append(env.event.coevo_version)
        yield env


def _versions_text(versions: list[str]) -> str:
    """A run's sessions' versions, each once in the order they ran (``0.1.0+g1a2b, then
    0.1.0+g3c4d.dirty``); one recorded before versions were is "(not recorded)"."""
    shown = [v or "(not recorded)" for v in dict.fromkeys(versions)]
    return ", then ".join(shown) if shown else "(no session)"


def _diff_lines(
    a: str,
    b: str,
    changes: Any,
    counts: tuple[int, int],
    div: Any,
    note: str = "",
    made: str = "",
) -> list[str]:
    lines = [f"A: {a} ({counts[0]} events)", f"B: {b} ({counts[1]} events)"]
    if changes:
        lines.append(f"scenario: {len(changes)} difference{'s' * (len(changes) > 1)}")
        lines += [
            f"  {c.key}: {_value(c.a, c.default_a, c.before_a)} -> "
            f"{_value(c.b, c.default_b, c.before_b)}"
            for c in changes
        ]
        lines += [note] if note else []
    else:
        lines.append("scenario: the same")
    lines += [made] if made else []
    if div is None:
        lines.append("events: the same, stream by stream (leaving out wall-clock fields)")
        return lines
    where = div.seq_a if div.seq_a is not None else div.seq_b
    lines.append(
        f"events: first divergence at seq {where}, stream {div.stream} ({', '.join(div.differing)})"
    )
    for side, env in (("A", div.a), ("B", div.b)):
        if env is None:
            lines.append(f"  {side}: (the stream has no more events)")
        else:
            lines.append(f"  {side}: {_event_line(env, div.differing)}")
    if div.a is not None and div.b is not None:  # where in each field, past what a line shows
        for key in div.differing:
            found = _first_difference(div.a["event"].get(key), div.b["event"].get(key))
            if found:
                lines.append(f"  {key}: first differs {found}")
    return lines


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    """Where two field values first differ, and how (``at [23]: A -100.31357, B -100.31359``):
    a long list or text differs past what an event's line shows."""
    import msgspec

    from agents.audit.shown import safe_line

    def shown(x: Any) -> str:  # JSON escapes control characters, not format ones (U+200B)
        text = safe_line(msgspec.json.encode(x).decode())
        return text if len(text) <= 60 else text[:59] + "…"

    if isinstance(a, list | tuple) and isinstance(b, list | tuple):  # decoded events: tuples
        xs, ys = list(cast("Sequence[Any]", a)), list(cast("Sequence[Any]", b))
        for i, (x, y) in enumerate(zip(xs, ys, strict=False)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
        if len(xs) != len(ys):
            return f"at {path or 'its end'}: A has {len(xs)} items, B {len(ys)}"
        return ""
    if isinstance(a, dict) and isinstance(b, dict):
        da, db = cast("dict[str, Any]", a), cast("dict[str, Any]", b)
        for k in [*da, *(k for k in db if k not in da)]:
            if da.get(k) != db.get(k):
                return _first_difference(da.get(k), db.get(k), f"{path}.{k}")
        return ""
    if isinstance(a, str) and isinstance(b, str) and a != b:
        pairs = enumerate(zip(a, b, strict=False))
        i = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
        lo = max(i - 20, 0)
        where = f"{path}, character {i}" if path else f"character {i}"
        return f"at {where}: A {shown(a[lo : i + 30])}, B {shown(b[lo : i + 30])}"
    if a != b:
        return f"at {path or 'the value'}: A {shown(a)}, B {shown(b)}"
    return ""


def _value(value: Any, default: bool = False, before: bool = False) -> str:
    if value is None:
        return "(missing)"
    if before:
        return f"{value!r} (recorded before the setting)"
    return f"{value!r} (default)" if default else repr(value)


def _before(toml: str) -> dict[str, Any]:
    """The settings a run's stored scenario lacks because it was recorded before they
    existed, by dotted key, with the values it ran as (``scenarios.loader.SINCE``)."""
    from engine.errors import ScenarioInvalid
    from scenarios.loader import parse_toml, since_lacking

    try:
        doc = parse_toml(toml, "scenario")
    except ScenarioInvalid:  # not TOML: scenario_changes says so
        return {}
    return {f"{table}.{key}": value for (table, key), value in since_lacking(doc).items()}


def _event_line(env: dict[str, Any], differing: tuple[str, ...]) -> str:
    """An envelope of a divergence: where it is, and the differing fields first (a world's
    text as the terminal shows it, its control characters escaped)."""
    import msgspec

    from agents.audit.shown import safe_line

    event = dict(env["event"])
    kind = event.pop("kind")
    where = f"{env['actor']} {kind}" + (f" {env['corr']}" if env["corr"] else "")
    first = [k for k in differing if k in event] + [k for k in event if k not in differing]
    body = " ".join(f"{k}={msgspec.json.encode(event[k]).decode()[:80]}" for k in first)
    line = f"seq {env['seq']} {where} (cause {env['cause']}): {body}"
    return safe_line(line if len(line) <= 300 else line[:299] + "…")


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


def cmd_whatif(args: argparse.Namespace) -> int:
    """``coevo audit RUN whatif EPISODE``: exit 0, or 1 when the unchanged replay does not give
    back the logged trajectory (the changed one is then not the episode's counterfactual)."""
    import msgspec

    from agents.audit.index import answer_from_index
    from scenarios.cli.console import indexing_lines
    from scenarios.whatif_setup import run_whatif

    if args.without_tip is None and args.with_tip is None and args.version is None:
        raise InputInvalid("whatif needs a change: --without-tip ID, --with-tip ID or --version N")
    if args.version is not None and (args.without_tip is not None or args.with_tip is not None):
        raise InputInvalid(
            "whatif changes one thing: an entry (--without-tip, --with-tip) or --version"
        )
    for name, value in (
        ("--without-tip", args.without_tip),
        ("--with-tip", args.with_tip),
        ("--version", args.version),
    ):
        if value is not None and value < 0:
            raise InputInvalid(f"{name} must be >= 0, got {value}")
    root = find_run(args.run).root
    log = open_run(args.run)
    try:

        def ask(index: Any) -> Any:
            with naming(log.path), stdout_to_stderr():  # a world's prints: not the answer
                return run_whatif(
                    root,
                    log,
                    index,
                    args.id,
                    args.without_tip,
                    args.with_tip,
                    args.version,
                    args.set,
                )

        where = None if args.index is None else given_path(args.index, "--index", lmdb=True)
        answer, note = answer_from_index(root, log, where, ask, indexing_lines())
        if note:
            print(f"coevo: note: {note}", file=sys.stderr)
    finally:
        log.close()
    code = 0 if answer.reproduced else 1
    if args.json:
        return answered(code, msgspec.json.encode(answer).decode() + "\n")
    return answered(code, "\n".join(_whatif_lines(answer)) + "\n")


def _stray_cause(w: Any) -> str:
    """What may make a control stray, most likely first: another machine kind (its kernels
    round a model's sums another way), a world with randomness of its own, or, on the machine
    kind that wrote the log with a deterministic world, a defect of the replay; but first the
    ``--set`` given, which may have changed a setting of the run's own."""
    kernels = "a model re-executes bit for bit only on the CPU kind that wrote it"
    if w.overrides:  # asked first: it blamed the world or the replay for a --set's doing
        return (
            f"--set {' '.join(w.overrides)} may change how the run acts: --set is for what "
            "differs on this machine (where its models lie, the device), and a setting of "
            "the run's own given another value replays another run"
        )
    if not w.logged_machine:
        return f"the log does not record the machine that wrote it (this is {w.machine}); {kernels}"
    if w.logged_machine != w.machine:
        return f"the log was written on {w.logged_machine}; this is {w.machine}: {kernels}"
    return (
        f"the log was written on this machine kind ({w.machine}), so the world may have "
        "randomness of its own (its reset and steps not fixed by the seed); with a "
        "deterministic world (the built-in one) this is a defect of the replay: please report "
        "it with the run"
    )


def _num(x: float, sign: str = "") -> str:
    """A score as the other lines show one (3 decimals), or in exponent form when that would
    take more than a dozen digits (a world's 1e308)."""
    return f"{x:{sign}.3f}" if abs(x) < 1e9 else f"{x:{sign}.4g}"


def _whatif_lines(w: Any) -> list[str]:
    from agents.audit.shown import safe_line
    from agents.audit.whatif import LOGP_TOLERANCE

    def outcome(p: Any) -> str:
        return f"{'success' if p.success else 'failure'}, score {_num(p.score)}, {p.steps} steps"

    def cell(p: Any, k: int) -> str:
        if k >= len(p.turns):
            return ""
        t = p.turns[k]
        shown = f"{t.action} (p {math.exp(t.logp):.3f}, v{t.version}, {len(t.tips)} shown)"
        return safe_line(shown)  # a world's action: a CR or NUL acted on the terminal

    lines = [f"episode {w.episode}: replayed from its seeds, {w.change}"]
    if w.reproduced:
        lines.append(
            f"control: replayed unchanged, it gives back the logged trajectory "
            f"({len(w.logged.turns)} turns, every action, log-probs within {LOGP_TOLERANCE:g})"
        )
    else:
        lines.append(
            "control: replayed unchanged, it does NOT give back the logged trajectory: "
            f"{w.strayed} (logged: {outcome(w.logged)}; replayed: {outcome(w.control)}), so the "
            "changed replay is one sample, not the answer"
        )
        lines.append(f"  why: {_stray_cause(w)}")
    # the control's column: the log's own trajectory when it gave it back, else the replay's
    label = "as logged" if w.reproduced else "control (replayed unchanged)"
    width = max([len(cell(w.control, k)) for k in range(len(w.control.turns))] + [len(label)])
    lines.append(f"{'turn':>4}  {label:<{width}}  |  {w.change}")
    for k in range(max(len(w.control.turns), len(w.changed.turns))):
        mark = "*" if w.first_difference is not None and k >= w.first_difference else " "
        lines.append(f"{k:>4}{mark} {cell(w.control, k):<{width}}  |  {cell(w.changed, k)}")
    lines.append(f"{'':>4}  {outcome(w.control):<{width}}  |  {outcome(w.changed)}")
    effect = w.changed.score - w.control.score
    verdict = f"effect of the change on the episode: score {_num(effect, '+')}"
    if w.credit is not None:
        verdict += f"; the credit this episode gave the entry: {w.credit:+.3f} ({w.credit_rule})"
    lines.append(verdict)
    if w.note:
        lines.append(f"note: {w.note}")
    return lines
