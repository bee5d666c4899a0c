"""``coevo validate`` and ``coevo run``: a scenario checked, and a new run's log created in its
directory, which claims it (the run's writer), then the run driven (:mod:`scenarios.cli.drive`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from engine.errors import LogError, LogLocked
from scenarios.cli.common import InputInvalid, out_path, stdout_to_stderr, too_long, version
from scenarios.cli.drive import TrackerNotStarted, drive
from scenarios.cli.resume import model_files_by_role
from stores.rundir import RunDir, default_run_dir, new_run_id, path_identity

__all__ = ["cmd_run", "cmd_validate"]


def cmd_validate(args: argparse.Namespace) -> int:
    from scenarios.assemble import assemble
    from scenarios.loader import read_scenario, resolved_toml, warn_settings

    scenario, unread = read_scenario(args.file, args.set)
    with stdout_to_stderr():  # a world that prints as it is built: not into the TOML
        assembly = assemble(scenario, args.file, prepare_model=False)
    warn_settings(args.file, scenario, unread, assembly.episodes, assembly.tasks)
    sys.stdout.write(resolved_toml(scenario))
    print(
        f"# valid: {len(assembly.tasks)} tasks, {assembly.episodes} episodes, "
        f"{len(assembly.specs)} actors",
        file=sys.stderr,
    )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from scenarios.loader import read_scenario

    scenario, unread = read_scenario(args.file, args.set)
    run_id = new_run_id()
    out = out_path(
        args.out, lambda: default_run_dir(Path("runs"), scenario.name, run_id), lmdb=True
    )
    rd = RunDir(out)
    foreign = rd.foreign()  # before exists(): a run writes its other files after its log's
    if rd.exists():  # first commit, so whatever foreign() saw of a run, exists() sees it
        raise InputInvalid(f"{out}: already holds a run; choose another --out")
    if foreign:
        raise InputInvalid(
            f"{out}: not empty and not a run (it holds {', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); choose a new or empty directory for --out"
        )
    _writable(out)
    return _execute(scenario, args.file, rd, run_id, quiet=args.quiet, unread=unread)


def _writable(out: Path) -> None:
    """Refuse ``out`` when this user may not create it or write in it (its nearest existing
    directory not writable): found only once the run's model was built, minutes in with a
    real model."""
    there = out
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir():  # (a file: no directory can be made under it)
        raise InputInvalid(f"{out}: cannot create it: {there} is not a directory")
    if not os.access(there, os.W_OK | os.X_OK):
        what = "write in it: it is" if there == out else f"create it: {there} is"
        raise InputInvalid(f"{out}: cannot {what} not writable by this user; choose another --out")
    if said := too_long(out):
        raise InputInvalid(f"{out}: {said}; choose a shorter --out")


def _execute(
    scenario: Any, source: str, rd: RunDir, run_id: str, *, quiet: bool, unread: list[str]
) -> int:
    from scenarios.assemble import assemble, cluster
    from scenarios.loader import warn_settings

    assembly = assemble(scenario, source, handle_signals=True, run_dir=rd.root)
    warn_settings(source, scenario, unread, assembly.episodes, assembly.tasks)
    with cluster(scenario, source):  # a placement the cluster cannot hold: refused, no run dir
        return _create(scenario, assembly, rd, run_id, quiet=quiet)


def _create(scenario: Any, assembly: Any, rd: RunDir, run_id: str, *, quiet: bool) -> int:
    """Create the run's log in ``rd`` and run it."""
    from engine.eventlog import new_run_meta
    from engine.lifecycle import RunStarted
    from scenarios.loader import resolved_toml, scenario_hash
    from stores.lmdb_log import LmdbEventLog

    text = resolved_toml(scenario)
    digest = scenario_hash(text)
    coevo_version = version()
    meta = new_run_meta(
        run_id,
        scenario_name=scenario.name,
        seed=scenario.seed,
        coevo_version=coevo_version,
        scenario_toml=text,
        scenario_hash=digest,
        created_ns=time.time_ns(),
        models=model_files_by_role(assembly.models),
    )
    started = RunStarted(
        run_id=run_id,
        scenario=scenario.name,
        scenario_hash=digest,
        seed=scenario.seed,
        coevo_version=coevo_version,
    )
    existed = rd.root.is_dir()
    try:  # the log first: creating it claims the directory (a second run is refused)
        log = LmdbEventLog.create(rd.log, meta, durable=scenario.runtime.durable)
    except OSError as exc:
        what = "cannot write in the run directory" if existed else "cannot create the run directory"
        raise InputInvalid(f"{rd.root}: {what}: {exc.strerror}") from None
    except LogLocked as exc:  # another process is creating or writing a run there
        raise InputInvalid(f"{rd.root}: already holds a run ({exc.holder})") from None
    except LogError:
        if rd.exists():  # another process created a run there after our check
            raise InputInvalid(f"{rd.root}: already holds a run; choose another --out") from None
        raise
    home = path_identity(rd.root)  # the directory the log was created in, moved or not later
    try:
        rd.scenario.write_text(text, encoding="utf-8")
    except OSError as exc:
        log.close()
        if home is None or path_identity(rd.root) != home:
            raise InputInvalid(
                f"{rd.root}: the run directory was moved or deleted as the run started: its log "
                "was created, nothing ran (coevo resume on the directory where it went runs it)"
            ) from None
        raise InputInvalid(f"{rd.scenario}: cannot write: {exc.strerror}") from None
    try:
        return drive(scenario, assembly, log, rd, started, home, quiet=quiet)
    except TrackerNotStarted as exc:  # nothing of the run was written: nothing of it is left
        _discard(rd, existed)
        raise InputInvalid(f"{exc}; nothing ran, and {rd.root} is left as it was") from None


def _discard(rd: RunDir, existed: bool) -> None:
    """Remove what creating a run in ``rd`` wrote, once it stopped before its first event (the
    directory held nothing else: ``cmd_run`` checked), and the directory itself unless it
    was there before."""
    import shutil

    from scenarios.assemble import TRACKING_DIR

    for path in (rd.root / TRACKING_DIR, rd.log):
        shutil.rmtree(path, ignore_errors=True)
    for path in (rd.scenario, rd.structlog):
        path.unlink(missing_ok=True)
    if not existed:
        with contextlib.suppress(OSError):  # not empty: something else appeared there
            rd.root.rmdir()
