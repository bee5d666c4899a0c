"""The layout of a run directory and how to open one.

A run directory holds ``log/`` (the LMDB event log, the source of truth), ``coevo.jsonl`` (the
structured log) and ``scenario.toml`` (the resolved scenario the run was started from).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from engine.errors import LogDamaged, RunNotFound
from engine.eventlog import EventLog, last_envelope
from engine.lifecycle import RunFailed, RunStopped
from stores.lmdb_env import DATA_FILE, LOG_FILES, is_blank, writer_alive

LOG_DIR = "log"
STRUCTLOG_FILE = "coevo.jsonl"
SCENARIO_FILE = "scenario.toml"


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory."""

    root: Path

    @property
    def log(self) -> Path:
        return self.root / LOG_DIR

    @property
    def structlog(self) -> Path:
        return self.root / STRUCTLOG_FILE

    @property
    def scenario(self) -> Path:
        return self.root / SCENARIO_FILE

    def exists(self) -> bool:
        """True if the directory holds an event log (a blank one, whose creation was
        interrupted before its first commit, is none: a new run may be created over it)."""
        return (self.log / DATA_FILE).is_file() and not is_blank(self.log)

    def foreign(self) -> list[str]:
        """What the directory holds that a run being created there does not write first (a
        ``log/`` with the event log's files only), sorted: a new run goes only where this is
        empty, so that it never overwrites or prunes files that are not its own.

        Raises:
            RunNotFound: the path exists but cannot be listed.
        """
        try:
            names = sorted(p.name for p in self.root.iterdir()) if self.root.is_dir() else []
            logs = sorted(p.name for p in self.log.iterdir()) if self.log.is_dir() else []
        except OSError as exc:
            raise RunNotFound(f"{self.root}: cannot list: {exc.strerror}") from None
        if self.log.is_dir() and not set(logs) - LOG_FILES:
            names.remove(LOG_DIR)
        return names


def path_identity(path: Path) -> tuple[int, int] | None:
    """The device and inode of what is at ``path`` (None: nothing there, or it cannot be
    read): what tells a directory or file moved, deleted or replaced since from one still in
    place."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def run_state(last: object, log_dir: Path) -> str:
    """How a run stands, from its log's ``last`` event (None: an empty log) and its writer
    lock in ``log_dir``: "completed", "stopped (REASON)", "failed (ERROR TYPE)", "live" (no
    final event yet, and the process writing it runs) or "killed" (no final event, and no
    process writes it: killed, or its machine lost; ``coevo resume`` continues it). The one
    wording of ``coevo serve``, ``coevo report`` and ``coevo log --follow``."""
    if isinstance(last, RunStopped):
        return "completed" if last.reason == "completed" else f"stopped ({last.reason})"
    if isinstance(last, RunFailed):
        return f"failed ({last.error_type})"
    return "live" if writer_alive(log_dir) else "killed"


def log_state(log: EventLog, log_dir: Path) -> str:
    """:func:`run_state` of the run whose open log (in ``log_dir``) is ``log``, from its last
    committed event."""
    last = last_envelope(log)
    return run_state(last.event if last is not None else None, log_dir)


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through ``.NAME.PID.partial`` beside it and a rename: a
    reader, or a process killed meanwhile, finds the old file or the new one, never half of
    one; two processes writing the same file at once each rename a whole one of their own
    (one partial name for both failed one of them: the other had renamed it away).

    Raises:
        OSError: it cannot be written (the partial file is removed).
    """
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        partial.write_bytes(data)
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def paths_under(root: Path) -> set[Path] | None:
    """Every path under ``root`` (None: ``root`` is not there), for :func:`remove_new`."""
    return set(root.rglob("*")) if root.is_dir() else None


def remove_new(root: Path, before: set[Path] | None) -> None:
    """Remove what is under ``root`` that was not in ``before`` (``root`` itself when it was
    not there): what a command stopped or refused part way wrote (an export, a copy, the
    tracking sinks a refused resume began). What cannot be removed stays, so the error that
    called for the clean-up is the one raised."""
    if before is None:
        shutil.rmtree(root, ignore_errors=True)
        return
    new = set(root.rglob("*")) - before
    for path in sorted(new):
        if path.parent in new:  # removed with its directory
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


def torn_tail(path: Path) -> int | None:
    """Where the last whole line of the file at ``path`` ends, if the file ends within a line
    (its writer was killed writing it; 0: no line is whole); None if it ends with a newline or
    is empty. Read from the end, a block at a time: a long file is not read through.

    Raises:
        OSError: it cannot be read.
    """
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return None
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return None
        while end > 0:
            start = max(0, end - 65_536)
            f.seek(start)
            found = f.read(end - start).rfind(b"\n")
            if found >= 0:
                return start + found + 1
            end = start
        return 0


def new_run_id() -> str:
    """A fresh, unique run id."""
    return uuid.uuid4().hex[:12]


def default_run_dir(base: Path, scenario_name: str, run_id: str) -> Path:
    """``base/<scenario>-<UTC time>-<run id>``."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    return base / f"{scenario_name}-{stamp}-{run_id[:6]}"


def _refuse_blank(rd: RunDir) -> None:
    """Refuse a run directory whose log holds no commit: a creation stopped before its first
    commit (a new run may go there), or, when the run's other files are there (a run writes
    them after its log's first commit), a log damaged or replaced since.

    Raises:
        LogDamaged: the run's other files are here (a damaged log: exit 1, as any).
        RunNotFound: they are not (no run yet: bad input).
    """
    others = rd.foreign()
    if others:
        try:
            size = (rd.log / DATA_FILE).stat().st_size
        except OSError:  # removed meanwhile
            size = 0
        raise LogDamaged(
            f"{rd.log}: event log is damaged: {DATA_FILE} holds no commit ({size} bytes), "
            f"though the run's other files are here ({', '.join(others[:3])})"
        )
    raise RunNotFound(
        f"{rd.root}: its event log holds nothing (its creation was stopped before the first "
        "commit); run the scenario again with --out pointing here"
    )


def find_run(path: str | Path) -> RunDir:
    """The run directory at ``path`` (or whose ``log/`` is ``path``).

    Raises:
        RunNotFound: no event log there.
        LogDamaged: its log holds no commit though the run's other files are there.
    """
    p = Path(path)
    if not p.exists():
        raise RunNotFound(f"{p}: no such run directory")
    for candidate in (RunDir(p), RunDir(p.parent)):
        if candidate.exists() and (candidate.root == p or p.name == LOG_DIR):
            return candidate
    for rd in (RunDir(p), RunDir(p.parent)) if p.name == LOG_DIR else (RunDir(p),):
        if is_blank(rd.log):
            _refuse_blank(rd)
    raise RunNotFound(f"{p}: not a coevo run directory (no {LOG_DIR}/{DATA_FILE} inside)")
