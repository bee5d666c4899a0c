"""``coevo audit RUN whatif EPISODE``: one episode replayed from its seeds unchanged (the
control, which must give back the logged trajectory) and with one change (an entry left out
or added, or another policy version), answered through the audit index and shown turn by
turn side by side, with the effect on the score and, when the control strays, its likely
cause. :mod:`scenarios.cli.audit` hands the ``whatif`` question here."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from scenarios.cli.common import (
    InputInvalid,
    answered,
    given_path,
    naming,
    open_run,
    stdout_to_stderr,
)
from stores.rundir import find_run

__all__ = ["cmd_whatif"]


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
