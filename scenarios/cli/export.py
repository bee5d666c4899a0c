"""``coevo export RUN``: a run's scalars (folded from its events as the live tracker folds
them) written to TensorBoard event files, an offline Weights & Biases run or an MLflow file
store. Each target directory is locked while it is written and refused when it already holds
this run's points; an export stopped or failed part way removes what it wrote."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scenarios.cli.common import (
    InputInvalid,
    naming,
    open_run,
    openable,
    outside_lmdb,
    scenario_dict,
)
from stores.rundir import find_run, paths_under, remove_new

if TYPE_CHECKING:
    from agents.tracking.scalars import Scalar
    from agents.tracking.sinks import ScalarSink

__all__ = ["cmd_export"]


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
    from agents.tracking.sinks import open_sink

    sink: ScalarSink | None = None
    try:  # (stopped while it reads, the directories it claimed go too)
        points, block, config = _points(args)
        for sink_name, where in targets:
            try:
                sink = open_sink(sink_name, Path(where), name, config)
                sink.write(points)
                sink.close()
                sink = None
            except OSError as exc:
                raise InputInvalid(f"{where}: cannot write: {exc.strerror or exc}") from None
            series = len({p.tag for p in points})
            done.append(
                f"{sink_name}: {len(points)} points of {series} series -> {where} (block {block})"
            )
    except BaseException:  # stopped or failed part way: none of it stays (a re-run is refused)
        if sink is not None:  # its writer first: TensorBoard's thread made a removed file again
            with contextlib.suppress(Exception):
                sink.close()
        if "wandb" in sys.modules:  # its service process would write on into what goes
            with contextlib.suppress(Exception):
                sys.modules["wandb"].teardown()
        for where, paths in before.items():
            remove_new(Path(where), paths)
        raise


def _points(args: argparse.Namespace) -> tuple[list[Scalar], int, dict[str, Any]]:
    """The run's scalars folded in blocks, the block, and its scenario as a table."""
    from agents.tracking.scalars import KINDS, fold_scalars
    from engine.replay import EventFilter, iter_events
    from scenarios.cli.console import reporting

    log = open_run(args.run)
    try:
        with naming(log.path):
            meta = log.read_meta()
            block = args.block or _tracking_block(meta.scenario_toml if meta else "")
            kinds = frozenset(str(k.__struct_config__.tag) for k in KINDS)
            read = iter_events(reporting(log, f"reading {args.run}"), EventFilter(kinds=kinds))
            points = fold_scalars(read, block)
    finally:
        log.close()
    return points, block, scenario_dict(meta.scenario_toml if meta else "")


def _tracking_block(text: str) -> int:
    """The run's ``tracking.block`` (16 where its scenario predates tracking)."""
    block = scenario_dict(text).get("tracking", {}).get("block", 16)
    return block if isinstance(block, int) and block >= 1 else 16
