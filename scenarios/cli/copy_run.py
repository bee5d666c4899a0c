"""``coevo copy RUN DEST``: a run directory copied whole, consistently even while its run
writes: the log as of one commit (never torn, unlike a ``cp -r``) under a temporary name,
then the other files, then the log's own name, so that a copy stopped part way is no run
directory; two copies into one DEST at once are refused, and a copy that lacks the
checkpoints its log names (pruned meanwhile) says that it cannot be resumed. A symbolic link
in the run directory is copied as what it names: the copy shares no file with the run."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import Any

from engine.errors import LogError
from scenarios.cli.common import (
    InputInvalid,
    LogUnreadable,
    missing_checkpoints,
    naming,
    newest_checkpoints,
    open_run,
    openable,
    outside_lmdb,
    resolved_path,
    too_long,
)
from stores.rundir import RunDir, find_run, remove_new

__all__ = ["COPYING", "cmd_copy"]


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
    if said := too_long(dest):  # the copy's resume could write no checkpoint there
        raise InputInvalid(f"{dest}: {said}; choose a shorter DEST")
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


def _run_files(root: Path, skip: set[str]) -> list[tuple[Path, Path]]:
    """The run directory's files and directories below ``root`` (each with its path relative
    to ``root``), in order, less the top-level names ``skip`` and any hidden name (a
    checkpoint still being written, ``.vNNNNNN.partial``, is not one yet). A symbolic link is
    followed to what it names (a ``checkpoints`` linked to a bigger disk: copied as a link,
    the copy's resume pruned the run's own checkpoints); a link to a directory above it is
    not entered again (no loop), and a dangling link is left out."""
    found: list[tuple[Path, Path]] = []

    def walk(path: Path, rel: Path, above: frozenset[tuple[int, int]]) -> None:
        try:
            stat = path.stat()
        except OSError:  # dangling, or removed meanwhile
            return
        if not (S_ISDIR(stat.st_mode) or S_ISREG(stat.st_mode)):  # /dev/zero read forever
            raise InputInvalid(
                f"cannot copy {path}: not a file or a directory (a device, a pipe or a "
                "socket); remove it from the run directory, or the link to it"
            )
        if rel.parts:
            found.append((path, rel))
        here = (stat.st_dev, stat.st_ino)
        if not S_ISDIR(stat.st_mode) or here in above:
            return
        try:
            names = sorted(p.name for p in path.iterdir())
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith(".") or (not rel.parts and name in skip):
                continue
            walk(path / name, rel / name, above | {here})

    walk(root, Path(), frozenset())
    return found


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
    for item, rel in _run_files(rd.root, skip):
        target = dest / rel
        try:
            if item.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:  # a link's file copied, not the link: the copy shares nothing with the run
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(item, target)
        except FileNotFoundError:  # the run removed it meanwhile (a pruned checkpoint)
            continue
        except OSError as exc:
            raise InputInvalid(f"cannot copy {item} to {target}: {exc.strerror or exc}") from None
    (dest / COPYING).rename(dest / "log")  # now it is a run directory
    return live, copied, meta
