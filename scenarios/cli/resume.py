"""``coevo resume``: a run's log taken over by its one writer before anything of it is read,
the models and checkpoints the run goes on from checked against what it recorded, and the run
driven on from its last event (:mod:`scenarios.cli.drive`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.audit.shown import pasteable
from engine.errors import LogError, LogLocked, NothingToResume, RunNotFound
from engine.eventlog import last_envelope
from engine.invariants import completed
from scenarios.cli.common import (
    InputInvalid,
    damaged_checkpoints,
    missing_checkpoints,
    naming,
    newest_updates,
    open_run,
    read_meta,
    too_long,
    version,
)
from scenarios.cli.drive import TrackerNotStarted, drive
from stores.rundir import RunDir, find_run, path_identity

__all__ = ["cmd_resume", "model_files_by_role", "read_history"]


def cmd_resume(args: argparse.Namespace) -> int:
    from engine.lifecycle import RunFailed, RunResumed, RunStarted, RunStopped
    from scenarios.assemble import ROLLOUT, assemble, cluster
    from scenarios.loader import stored_scenario, stored_source

    rd = find_run(args.run)
    meta = _read_meta(args.run)
    source = stored_source(args.run)
    scenario = stored_scenario(meta, args.run)
    log = _open_writer(rd, durable=scenario.runtime.durable)
    home = path_identity(rd.root)
    joined = contextlib.ExitStack()
    try:  # the history is read under the writer lock: no other session writes after it
        history, newest = read_history(
            args.run, log, rd.root if scenario.run.method != ROLLOUT else None
        )
        _models_in_place(args.run, meta.models, _embedded_roles(scenario))
        from scenarios.policy_models import recorded_models

        recorded = recorded_models(scenario, meta.models)
        assembly = assemble(
            scenario, source, handle_signals=True, run_dir=rd.root, recorded=recorded
        )
        _same_models(args.run, meta.models, assembly.models, _embedded_roles(scenario))
        _checkpoints_fit(
            args.run, rd.root, newest, assembly.models, _embedded_roles(scenario), meta.models
        )
        if args.no_tracking:
            assembly = dataclasses.replace(assembly, tracking=None)
        _keep_scenario(rd, meta.scenario_toml)
        joined.enter_context(cluster(scenario, source))
    except BaseException:
        log.close()
        raise
    started = RunStarted(
        run_id=meta.run_id,
        scenario=meta.scenario_name,
        scenario_hash=meta.scenario_hash,
        seed=meta.seed,
        coevo_version=meta.coevo_version,
    )
    with joined:
        try:
            if not history:
                return drive(scenario, assembly, log, rd, started, home, quiet=args.quiet)
            last = history[-1]
            ended = isinstance(last.event, RunStopped | RunFailed)
            previous = str(last.event.__struct_config__.tag) if ended else ""
            resumed = RunResumed(after=last.seq, previous=previous, coevo_version=version())
            return drive(
                scenario, assembly, log, rd, started, home,
                quiet=args.quiet, resumed=resumed, history=history,
            )  # fmt: skip
        except TrackerNotStarted as exc:
            raise InputInvalid(
                f"{exc}; nothing was written: `coevo resume {pasteable(args.run)} --no-tracking` "
                "continues the run without live tracking (`coevo export` writes its scalars "
                "afterwards)"
            ) from None


def model_files_by_role(models: dict[str, Path]) -> dict[str, Any]:
    """The :class:`~engine.eventlog.ModelFiles` of each model directory of a run, by role."""
    from engine.eventlog import ModelFiles
    from stores.model_dirs import model_files

    digest = functools.cache(model_files)  # an extractor on the policy's weights: read once
    return {
        role: ModelFiles(path=str(path.resolve()), files=digest(path.resolve()))
        for role, path in models.items()
    }


def _embedded_roles(scenario: Any) -> set[str]:
    """The model roles whose weights coevo builds on the machine (the embedded models)."""
    roles = {"policy"} if scenario.policy.model == "embedded" else set[str]()
    from scenarios.methods import complementary_settings

    if complementary_settings(scenario).extractor in ("embedded", "embedded-ops") and roles:
        roles.add("extractor")
    return roles


def _models_in_place(run: str, then: dict[str, Any], built: frozenset[str] | set[str]) -> None:
    """Refuse, naming the way on, to resume a run whose model directory is gone from where it
    started (moved, renamed, deleted): the scenario's check said only "no such directory", and
    ``resume`` takes no ``--set`` to point elsewhere. The ``built`` roles' models (the
    embedded ones) are built again where missing.

    Raises:
        InputInvalid: a recorded model directory is not there.
    """
    for role, was in sorted(then.items()):
        if role not in built and not Path(was.path).is_dir():
            raise InputInvalid(
                f"{run}: the {role} model directory the run started from, {was.path}, is gone "
                "(moved, renamed or deleted); resume reads its models where the run started "
                "and takes no --set: put the directory back there, or a link to where it is "
                "now (its files are checked against the run's), then resume (nothing was "
                "resumed)"
            )


def _same_models(
    run: str,
    then: dict[str, Any],
    models: dict[str, Path],
    built: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Refuse to resume on other models than the run started from: a tokenizer or weights
    replaced in the model directory, or a relative path that names another directory from
    here, went on silently (a model trained from another base, prompts in another
    tokenizer). Runs recorded before coevo kept the digests are not checked.

    Args:
        built: the roles whose models coevo builds here (the embedded ones): the remedy differs.

    Raises:
        InputInvalid: a model's files differ, or the run's model roles do.
    """
    from stores.model_dirs import files_changed

    if not then:
        return
    now = model_files_by_role(models)
    for role in sorted(then.keys() | now.keys()):
        was, got = then.get(role), now.get(role)
        if was is None or got is None:
            raise InputInvalid(
                f"{run}: the run started with models {sorted(then)}, its scenario now "
                f"prepares {sorted(now)}; nothing was resumed"
            )
        changed = files_changed(was.files, got.files)
        if changed:
            moved = f" (it was {was.path})" if was.path != got.path else ""
            remedy = (
                "the embedded model is built on each machine by its coevo's recipe, and the "
                "run's own is gone from where it was built or changed: one built on another "
                "CPU kind or by another coevo differs; resume where and with the coevo the run "
                "started with"
                if role in built
                else "resume with that model"
            )
            raise InputInvalid(
                f"{run}: the {role} model {got.path}{moved} is not the one the run started "
                f"from: {', '.join(changed)}; {remedy} (nothing was resumed)"
            )


def _checkpoints_fit(
    run: str,
    root: Path,
    newest: dict[str, tuple[int, str]],
    models: dict[str, Path],
    built: set[str],
    recorded: dict[str, Any],
) -> None:
    """Refuse, before anything is written, to resume a run whose newest checkpoint of a
    model does not fit the model prepared now: a run that does not record the model
    directories it started from (made before 2026-12-03) got an embedded model built by
    this coevo's recipe, whose vocabulary may differ, and failed after writing its first
    events with torch's "size mismatch" (the log stayed sound).

    Raises:
        InputInvalid: a checkpoint's tensor has another shape than the model's.
    """
    from stores.checkpoints import checkpoint_misfit

    for role, (number, name) in sorted(newest.items()):
        model = models.get(role)
        misfit = checkpoint_misfit(model, root / name) if model is not None else None
        if misfit is None:
            continue
        if role in recorded:  # the directory is as the run recorded it (_same_models)
            why = (
                "the model directory is the one the run started from, so the checkpoint is not "
                "the one the run wrote (replaced or damaged): put that one back"
            )
        elif role in built:
            why = (
                "the run does not record the model directories it started from (made before "
                "2026-12-03), and this coevo builds the embedded model by another recipe than "
                "the coevo that made it: resume it with that coevo"
            )
        else:
            why = "the model directory is not the one the run started from"
        raise InputInvalid(
            f"{run}: the {role}'s checkpoint of version {number} ({name}) does not fit the "
            f"{role} model prepared now, {model} ({misfit}): {why} (nothing was resumed)"
        )


def _keep_scenario(rd: RunDir, text: str) -> None:
    """Write the run's resolved scenario where it is missing (a run stopped while it was being
    created, or a deleted file), and say so where the file is not the scenario the log stores:
    a resume continues the run as its log stores it, whatever the file says."""
    try:
        kept = rd.scenario.read_bytes() if rd.scenario.exists() else None
    except OSError as exc:
        kept = f"unreadable: {exc.strerror}".encode()
    if kept is None:
        try:
            rd.scenario.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InputInvalid(f"{rd.scenario}: cannot write: {exc.strerror}") from None
    elif kept != text.encode("utf-8"):
        print(
            f"coevo: warning: {rd.scenario} is not the scenario this run's log stores (changed "
            "or replaced since the run started); the run resumes as its log stores it, and a "
            "changed setting applies only to a new run (`coevo run` that file)",
            file=sys.stderr,
        )


def _read_meta(path: str) -> Any:
    """The run's metadata (its scenario)."""
    meta = read_meta(path)
    if meta is None:
        raise RunNotFound(f"{path}: the run's log holds no run metadata; nothing to resume")
    return meta


def _open_writer(rd: RunDir, durable: bool) -> Any:
    """The run's log opened as its one writer, before anything of it is read for a resume.

    Raises:
        InputInvalid: another process writes the run (a run or a resume still going), or its
            log's file is shared with another directory (a hard-linked copy, which a resume
            changed in silence: it read as completed, with no checkpoint of its own).
    """
    from stores.lmdb_log import LmdbEventLog

    if shared := _shared_files(rd):
        raise InputInvalid(
            f"{rd.root}: {shared} (a copy made with cp -al, cp -as or rsync --link-dest "
            "shares it): a resume would write into the other run too; resume an independent "
            "copy (coevo copy RUN DEST) or remove the other links"
        )
    _room_for_files(rd.root)
    try:
        return LmdbEventLog.open(rd.log, writable=True, durable=durable)
    except LogLocked as exc:
        raise InputInvalid(
            f"{rd.root}: another process is writing this run ({exc.holder}); "
            "wait for it to end or stop it first"
        ) from None
    except LogError:  # a read-only disk: a run that completed says so, as on a writable one
        reader = open_run(str(rd.root))
        try:
            last = last_envelope(reader)
        finally:
            reader.close()
        if completed(last):
            raise NothingToResume(_completed_run(str(rd.root), last)) from None
        raise


def _shared_files(rd: RunDir) -> str:
    """How a file a resume writes in place (the log's two, the run's own log of lines) is
    shared with another directory: a symbolic link, or more than one hard link ("" when none
    is). A resume through a twin made of links changed the other run in silence (it read as
    completed, its checkpoints in the twin)."""
    for path in (rd.log / "data.mdb", rd.log / "lock.mdb", rd.root / "coevo.jsonl"):
        try:
            if path.is_symlink():
                return f"{path.relative_to(rd.root)} is a symbolic link to {path.resolve()}"
            if (links := path.stat().st_nlink) > 1:
                return f"{path.relative_to(rd.root)} has {links} hard links"
        except OSError:  # (no such file: the log's open says what is wrong)
            continue
    return ""


def _room_for_files(root: Path) -> None:
    """Refuse a run directory whose path leaves no room for the run's files below it (as
    ``run --out`` does): a resume played its episodes, then failed at its first checkpoint
    ("File name too long")."""
    if said := too_long(root):
        raise InputInvalid(f"{root}: {said}; move it to a shorter path (coevo copy RUN DEST)")


def _completed_run(path: str, last: Any) -> str:
    """Why the run at ``path``, whose last event ``last`` records its completion, is not
    resumed."""
    return f"{path}: the run completed (run_stopped at seq {last.seq}); nothing to resume"


def read_history(
    path: str, log: Any, curves: Path | None
) -> tuple[Sequence[Any], dict[str, tuple[int, str]]]:
    """Every event of the run, read by its writer (none: the run was stopped as it was
    created, before its first event), as a :class:`~engine.eventlog.LogHistory` (read again
    on each pass, not held); read through once here, so that a damaged record is met now and
    named, and the newest checkpoint of each model found (:func:`newest_updates`, returned
    beside the history); ``curves``: where the run draws its learning curves (None: it draws
    none).

    Raises:
        NothingToResume: the run completed (saying how to draw its curves if they are
            missing: it was stopped between its end and its curves).
    """
    from agents.report.curves import CURVE_FILES
    from engine.eventlog import LogHistory

    end, last = log.next_seq, None
    newest: dict[str, tuple[int, str]] = {}
    with naming(log.path):
        for chunk in log.read_chunks(0, end):
            last = chunk[-1]
            newest.update(newest_updates(chunk))
    named = {role: name for role, (_, name) in newest.items()}
    history = LogHistory(log, end)
    if completed(last):
        missing = curves is not None and not all((curves / n).exists() for n in CURVE_FILES)
        raise NothingToResume(
            _completed_run(path, last)
            + (
                f"; its curves are missing: coevo report {pasteable(path)} draws them"
                if missing
                else ""
            )
        )
    if gone := missing_checkpoints(Path(log.path).parent, named):  # before any episode plays
        raise InputInvalid(
            f"{path}: cannot be resumed: {' and '.join(gone)} (the newest its log names, "
            "which a resume continues from) is not on disk; restore it from a copy of the run. "
            "Reading the run needs none: replay, check, report and audit work as they are"
        )
    if bad := damaged_checkpoints(Path(log.path).parent, named):
        raise InputInvalid(
            f"{path}: cannot be resumed: {' and '.join(bad)} is damaged (the newest checkpoint "
            "its log names, which a resume continues from); restore it from a copy of the "
            "run. Reading the run needs none: replay, check, report and audit work as they are"
        )
    return history, newest
