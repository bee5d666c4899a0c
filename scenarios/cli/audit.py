"""``coevo audit``: questions of a run's log (an entry, an episode, credit re-derived under
the run's rules or others).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any

import msgspec

from scenarios.cli.common import (
    InputInvalid,
    answered,
    given_path,
    naming,
    open_run,
    past_end,
    stdout_to_stderr,
)
from stores.rundir import find_run

__all__ = ["cmd_audit"]


def cmd_audit(args: argparse.Namespace) -> int:
    from agents.audit import render
    from agents.audit.shown import safe_line

    if args.what == "whatif":
        from scenarios.cli.whatif import cmd_whatif

        return cmd_whatif(args)
    log = open_run(args.run)
    try:
        with naming(log.path), stdout_to_stderr():  # a plug-in's prints: not the answer
            answer = _audit_credit(log, args) if args.what == "credit" else _audit_one(log, args)
    finally:
        log.close()
    if args.what == "credit":
        lines = lambda: render.render_credit(answer, args.top)  # noqa: E731
    else:
        lines = lambda: (  # noqa: E731
            render.render_tip(answer) if args.what == "tip" else render.render_episode(answer)
        )
    code = 0 if args.what != "credit" or answer.counterfactual or answer.match else 1
    if args.json:
        return answered(code, msgspec.json.encode(answer).decode() + "\n")
    return answered(code, "\n".join(safe_line(line) for line in lines()) + "\n")


def _audit_one(log: Any, args: argparse.Namespace) -> Any:
    from agents.audit.answers import audit_tip, entry_id
    from agents.audit.episode import audit_episode
    from agents.audit.index import answer_from_index

    tip = entry_id(args.id) if args.what == "tip" else None

    def ask(index: Any) -> Any:
        if tip is not None:
            return audit_tip(log, index, tip)
        return audit_episode(log, index, args.id)

    where = None if args.index is None else given_path(args.index, "--index", lmdb=True)
    from scenarios.cli.console import indexing_lines

    root = find_run(args.run).root
    answer, note = answer_from_index(root, log, where, ask, indexing_lines())
    if note:
        print(f"coevo: note: {note}", file=sys.stderr)
    return answer


def _audit_credit(log: Any, args: argparse.Namespace) -> Any:
    from agents.audit.answers import entry_id
    from agents.audit.credit import audit_credit
    from agents.audit.inputs import gather, parse_setting, with_overrides
    from agents.invariants.credit import run_settings
    from engine.errors import AuditQueryInvalid
    from scenarios.loader import stored_scenario
    from scenarios.methods import advantages_changed, built_on_complementary

    if args.top < 0:
        raise InputInvalid(f"--top must be >= 0, got {args.top}")
    if args.until is not None and args.until < 0:
        raise InputInvalid(f"--until must be >= 0, got {args.until}")
    entry = None if args.entry is None else entry_id(args.entry)
    scenario = stored_scenario(log.read_meta(), args.run)
    subgroups = [s for s in args.set if s.partition("=")[0] in ("split", "weighted")]
    method = scenario.run.method
    if subgroups and method != "complementary" and not built_on_complementary(scenario):
        raise AuditQueryInvalid(  # a plug-in of its own: [complementary] is read by nothing
            f"--set {subgroups[0]}: run.method = {method!r} has no guided and free subgroups "
            "(split and weighted are Complementary RL's and its plug-ins'; std_norm "
            "re-derives the advantages)"
        )
    try:  # the run's own settings, as the credit invariant reads them
        base = run_settings(scenario)
    except ValueError as exc:
        raise AuditQueryInvalid(f"the run's method: {exc}") from None
    settings = with_overrides(
        base,
        args.rule,
        args.set,
        lambda sets: _method_or_none(scenario, sets),
        lambda sets: advantages_changed(scenario, **sets),
    )
    given = dict(s.partition("=")[::2] for s in args.set)
    credit_keys = {"batch", "alpha", "cooldown", "reweight", "counts"}
    asked = args.rule is not None or bool(given.keys() & credit_keys)
    inputs = gather(log, args.until)
    if args.until is not None and args.until >= inputs.end:
        print(f"coevo: note: {past_end('--until', args.until, inputs.end)}", file=sys.stderr)
    partial = args.until is not None and args.until + 1 < log.next_seq
    with _rule_progress(args.rule) as on_call:
        audit = audit_credit(
            inputs, settings, base, asked=asked, partial=partial, on_call=on_call, entry=entry
        )
    shown: dict[str, bool | None] = {"split": None, "weighted": None}
    if method == "complementary" or built_on_complementary(scenario):
        comp = scenario.complementary  # the run's own subgroups, unless --set gave them
        shown = {"split": comp.subgroups, "weighted": comp.subgroup_weights}
        shown |= {k: parse_setting(k, v) for k, v in given.items() if k in shown}
    return msgspec.structs.replace(audit, **shown)


@contextlib.contextmanager
def _rule_progress(rule: str | None, every: float = 5.0) -> Generator[Callable[[int], None] | None]:
    """For a credit rule of the researcher's own (which may be slow, or hang in its first
    call): a line on stderr every ``every`` seconds while the audit runs, saying how many
    episodes the rule has answered so far (from a thread of its own: a line printed as a call
    returned said nothing of a call that never did). Yields what the audit tells each answer
    (None: no rule of the researcher's)."""
    from agents.audit.derive import RULE_DONE

    if rule is None or ":" not in rule:
        yield None
        return
    start, answered, done = time.monotonic(), [0], threading.Event()

    def tell() -> None:
        while not done.wait(every):
            line = (
                f"coevo: credit rule {rule!r}: called for {answered[0]} episodes so far "
                f"({time.monotonic() - start:.0f} s)\n"
            )
            sys.stderr.write(line)  # one write: a line the rule prints cannot split it
            sys.stderr.flush()

    def called(n: int) -> None:
        if n == RULE_DONE:  # the rest of the audit is not the rule's
            done.set()
        else:
            answered[0] = n

    watch = threading.Thread(target=tell, name="coevo-rule-progress", daemon=True)
    watch.start()
    try:
        yield called
    finally:
        done.set()
        watch.join()


def _method_or_none(scenario: Any, sets: Mapping[str, bool]) -> Any:
    """The run's method with ``--set`` overrides; None for a run without one.

    Raises:
        AuditQueryInvalid: the method cannot be built (a plug-in that no longer imports).
    """
    from engine.errors import AuditQueryInvalid
    from scenarios.methods import method_with

    if scenario.run.method == "rollout":
        return None
    try:
        return method_with(scenario, **sets)
    except ValueError as exc:
        raise AuditQueryInvalid(f"the run's method: {exc}") from None
