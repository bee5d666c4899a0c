"""``coevo check RUN [--invariant NAME ...] [--json] [--strict]``: a recorded run's events
against the invariants (docs/TESTING.md), in one pass over its log.

Exit 0 with what was checked, or exit 1 with the first violation: a line naming the
invariant, the seq and what is wrong, then each event involved on a line of its own. Needs
no Hypothesis.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

import msgspec

from engine.errors import CoevoError
from engine.eventlog import last_envelope
from engine.invariants import CheckReport, check_stream, completed
from scenarios.cli.common import InputInvalid, answered, naming, open_run, stdout_to_stderr

__all__ = ["add_parser", "cmd_check", "gc_paused"]


def add_parser(sub: Any) -> None:
    """Add ``check`` to the ``coevo`` subcommands ``sub``."""
    p = sub.add_parser("check", help="check a run's events against the invariants")
    p.add_argument("run")
    p.add_argument(
        "--invariant",
        action="append",
        default=[],
        metavar="NAME",
        help="only these (repeatable; default: every one that applies to the run)",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 1) when a plug-in module of the run cannot be imported here, or its "
        "code fails on the run's events now: its invariants (or credit) would go unchecked "
        "(for CI)",
    )
    p.set_defaults(func=cmd_check)


class PluginMissing(CoevoError):
    """``check --strict``: a plug-in module of the run does not import, or fails on the run's
    events now, so invariants go unchecked (exit 1)."""


def cmd_check(args: argparse.Namespace) -> int:
    """Run the invariants over the log of ``args.run``; print the report.

    Raises:
        InputInvalid: an unknown invariant name (exit 2).
        LogUnreadable: a damaged log (exit 1, one line naming the seq).
    """
    from scenarios.checks import check_context, invariants_for
    from scenarios.cli.console import reporting

    log = open_run(args.run)
    try:
        with naming(log.path), stdout_to_stderr():  # a plug-in invariant's prints: not the report
            ctx, notes = check_context(log.read_meta(), args.run)
            if args.strict and notes:
                raise PluginMissing(f"{args.run}: --strict: {notes[0]}")
            try:
                invariants, chosen, skipped = invariants_for(ctx, args.invariant)
            except KeyError as exc:
                raise InputInvalid(str(exc.args[0])) from None
            notes += [  # asked for by name, so run; but a pass here says little
                f"{r.name} was run as asked, outside its scope ({why}): its pass says little"
                for r in chosen
                if (why := r.why_not(ctx))
            ]
            with gc_paused():
                read = reporting(log, f"checking {args.run}").read_chunks(0, log.next_seq)
                report = check_stream(read, invariants, skipped=skipped)
            if report.violation is not None:  # the pass stopped there: the log's end says
                report = msgspec.structs.replace(report, completed=completed(last_envelope(log)))
            involved = _involved(log, report)
    finally:
        log.close()
    for note in notes:
        print(f"coevo: note: {note}", file=sys.stderr)
    if args.strict and report.ok and report.uncheckable:  # the run's plug-in fails here now
        raise PluginMissing(f"{args.run}: --strict: {report.uncheckable[0]}")
    if args.json:
        text = msgspec.json.encode(_as_json(report, involved)).decode()
    else:
        text = "\n".join(_lines(args.run, report, involved))
    return answered(0 if report.ok else 1, text + "\n")


@contextmanager
def gc_paused() -> Generator[None]:
    """The cyclic garbage collector off for one pass: the invariants' state (dicts and tuples
    of ids and seqs) holds no cycles, and the collector's repeated full scans of it were half
    the CPU time of a pass over a 1M-event log (docs/BENCHMARKS.md)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _involved(log: Any, report: CheckReport) -> list[Any]:
    """The envelopes of the violation's events, read back from the log."""
    if report.violation is None:
        return []
    out: list[Any] = []
    for seq in report.violation.involved:
        out += list(log.read(seq, seq + 1))
    return out


def _lines(run: str, report: CheckReport, involved: list[Any]) -> list[str]:
    from scenarios.cli.console import envelope_line

    v = report.violation
    if v is None:
        end = "completed" if report.completed else "not completed"
        held = len(report.invariants)
        lines = [
            f"{run}: {report.events} events ({end}) hold {held} invariant{'s' * (held != 1)}: "
            + ", ".join(report.invariants)
            if held
            else f"{run}: {report.events} events ({end}): no invariant was checked"
        ]
        lines += [f"  not checked: {s}" for s in (*report.uncheckable, *report.skipped)]
        return lines
    head = f"{run}: invariant {v.invariant} violated at seq {v.seq}: {v.message}"
    return [head, *(envelope_line(env, width=None) for env in involved)]  # every field shown


def _as_json(report: CheckReport, involved: list[Any]) -> dict[str, Any]:
    from scenarios.cli.console import envelope_dict

    out: dict[str, Any] = msgspec.to_builtins(report)
    out["ok"] = report.ok
    if report.violation is not None:
        out["violation"]["events"] = [envelope_dict(env) for env in involved]
    return out
