"""``coevo report`` (one or several runs' page of figures) and ``coevo probe`` (the
co-evolution probe over a run's checkpoints).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console

from scenarios.cli.common import (
    InputInvalid,
    answered,
    check_writable,
    naming,
    open_run,
    out_path,
    read_meta,
    stdout_to_stderr,
)
from stores.rundir import find_run, replace_file

__all__ = ["cmd_probe", "cmd_report"]


def cmd_report(args: argparse.Namespace) -> int:
    from agents.report.page import PAGE_HEAD, RunData, fold_run, render
    from scenarios.cli.console import reporting

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
                read = reporting(log, f"reading {path}").read(0, None)
                runs.append(fold_run(_label(root, roots), root, toml, read))
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
