"""The ``coevo`` commands that open a finished or live run to people and tools: ``export``
(its scalars to TensorBoard, W&B offline or MLflow), ``diff`` (two runs compared) and ``serve``
(a read-only web browser of runs)."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from scenarios.cli.common import InputInvalid, naming, open_run
from stores.rundir import find_run

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


def cmd_export(args: argparse.Namespace) -> int:
    from agents.tracking.scalars import KINDS, fold_scalars
    from agents.tracking.sinks import open_sink
    from engine.replay import EventFilter, iter_events

    targets = [
        (n, getattr(args, n)) for n in ("tensorboard", "wandb", "mlflow") if getattr(args, n)
    ]
    if not targets:
        raise InputInvalid("export needs a target: --tensorboard DIR, --wandb DIR or --mlflow DIR")
    if args.block is not None and args.block < 1:
        raise InputInvalid(f"--block must be >= 1, got {args.block}")
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
    name = find_run(args.run).root.name
    for sink_name, where in targets:
        try:
            sink = open_sink(sink_name, Path(where), name, config)
            sink.write(points)
            sink.close()
        except OSError as exc:
            raise InputInvalid(f"{where}: cannot write: {exc.strerror or exc}") from None
        series = len({p.tag for p in points})
        print(f"{sink_name}: {len(points)} points of {series} series -> {where} (block {block})")
    return 0


def _scenario_dict(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


def _tracking_block(text: str) -> int:
    """The run's ``tracking.block`` (16 where its scenario predates tracking)."""
    block = _scenario_dict(text).get("tracking", {}).get("block", 16)
    return block if isinstance(block, int) and block >= 1 else 16
