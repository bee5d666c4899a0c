"""The parsers of the ``coevo`` commands that open a finished or live run to people and tools;
each command lives in its own module of this package: ``export`` (its scalars to TensorBoard,
W&B offline or MLflow) in :mod:`scenarios.cli.export`, ``diff`` (two runs compared) in
:mod:`scenarios.cli.diff`, ``serve`` (a read-only web browser of runs) in
:mod:`scenarios.cli.serve` and ``copy`` (a run copied whole, even while written) in
:mod:`scenarios.cli.copy_run`; ``audit RUN whatif`` (parsed with ``audit``) is in
:mod:`scenarios.cli.whatif`."""

from __future__ import annotations

from typing import Any

from scenarios.cli.copy_run import cmd_copy
from scenarios.cli.diff import cmd_diff
from scenarios.cli.export import cmd_export
from scenarios.cli.serve import cmd_serve

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    """Add ``export``, ``diff``, ``serve`` and ``copy`` to the ``coevo`` parser's subcommands."""
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
