"""``coevo replay``: a run's projections at any seq, ``--verify`` of the whole log, and
``--reexecute-learner`` (every recorded update re-run from its checkpoint and compared).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import msgspec
from rich.console import Console

from engine.errors import CoevoError, UpdateDiverged
from scenarios.cli.common import (
    InputInvalid,
    naming,
    open_run,
    past_end,
    to_devnull,
    torn_hint,
)
from stores.rundir import find_run

__all__ = ["cmd_replay"]


def cmd_replay(args: argparse.Namespace) -> int:
    from engine.replay import replay_until, verify_log
    from scenarios.assemble import fact_checks, projections
    from scenarios.checks import check_context
    from scenarios.cli.console import actors_table, families_table

    if args.until is not None and args.until < 0:
        raise InputInvalid(f"--until must be >= 0, got {args.until}")
    if args.verify and (args.until is not None or args.json):
        raise InputInvalid("--verify checks the whole log; it takes no --until or --json")
    if args.reexecute_learner and (args.until is not None or args.json or args.verify):
        raise InputInvalid("--reexecute-learner takes no --until, --json or --verify")
    if args.set and not args.reexecute_learner:
        raise InputInvalid("--set applies to --reexecute-learner (which loads the run's models)")
    from scenarios.cli.console import reporting

    log = open_run(args.run)
    try:
        if args.reexecute_learner:
            return _reexecute(args.run, log, args.set)
        if args.verify:
            with naming(log.path):
                ctx, notes = check_context(log.read_meta(), args.run)
                watched = reporting(log, f"verifying {args.run}")
                result = verify_log(watched, projections(), fact_checks(ctx, notes))
            left = [u.replace(": ", ": not checked: ", 1) for u in result.uncheckable]
            for note in (*notes, *left):
                print(f"coevo: note: {note}", file=sys.stderr)
            if not result.ok:
                hint = torn_hint(result.readable) if result.damaged else ""
                if "unknown event kind" in result.error:  # the run's plug-in did not import?
                    from agents.methods.registry import unimported_note

                    hint += f"; {note}" if (note := unimported_note()) else ""
                raise _VerifyFailed(f"{log.path}: {result.error}{hint}")
            print(f"verified {result.events} events, {result.checks} checksums: ok")
            return 0
        with naming(log.path):
            watched = reporting(log, f"replaying {args.run}")
            fold, snap = replay_until(watched, projections(), args.until)
    finally:
        log.close()
    if args.until is not None and args.until > fold.last_seq:
        print(f"coevo: note: {past_end('--until', args.until, fold.last_seq + 1)}", file=sys.stderr)
    if args.json:
        sys.stdout.write(msgspec.json.encode(fold.states, order="deterministic").decode() + "\n")
        return 0
    console = _Stdout()
    start = f"snapshot after seq {snap}" if snap is not None else "the beginning"
    console.print(f"state after seq {fold.last_seq} (folded from {start})")
    console.print(actors_table(fold.states["actor_stats"]))
    console.print(families_table(fold.states["episodes"]))
    kinds = fold.states["actor_stats"].kinds
    console.print("events by kind: " + ", ".join(f"{k}={n}" for k, n in sorted(kinds.items())))
    return 0


def _reexecute(path: str, log: Any, overrides: list[str]) -> int:
    from engine.lifecycle import RunStarted
    from engine.replay import replay_until
    from scenarios.assemble import projections
    from scenarios.cli.console import StepProgress
    from scenarios.policy_setup import reexecution_for

    first = next(iter(log.read(0, 1)), None)
    if first is None or not isinstance(first.event, RunStarted):
        raise InputInvalid(f"{path}: the log does not start with run_started")
    kinds = replay_until(log, projections())[0].states["actor_stats"].kinds
    total = kinds.get("policy_updated", 0) + kinds.get("extractor_updated", 0)
    if total == 0:
        raise InputInvalid(f"{path}: the log records no model update to re-execute")
    console = Console(stderr=True, markup=False)  # names as written
    console.print(f"loading the base models of {path} ...")
    run = reexecution_for(find_run(path).root, log.read_meta(), first.event.seed, overrides)
    try:
        with StepProgress(console, total, "updates") as progress:
            summary = run.run(
                log.read(0, None),
                lambda c: progress.advance(f"{c.model} v{c.version} {c.digest[:12]} ok"),
            )
    except UpdateDiverged as exc:
        meta = log.read_meta()
        note = _base_note(meta, overrides) if exc.start else _machine_note(meta)
        if note:
            print(f"coevo: note: {note}", file=sys.stderr)
        raise
    extra = f"; {summary.unapplied} requests never applied" if summary.unapplied else ""
    print(
        f"re-executed {summary.policy} policy and {summary.extractor} extractor updates: "
        f"every parameter digest matches the log ({summary.checkpoints} checkpoints on disk "
        f"compared){extra}"
    )
    from scenarios.loader import override_key

    if unread := [o for o in overrides if not override_key(o).startswith(LOADING)]:
        print(
            f"coevo: note: {' '.join(f'--set {o}' for o in unread)} "
            f"{'was' if len(unread) == 1 else 'were'} not read: each update re-runs as its "
            "request in the log says (learning rate, clipping, loss, samples); --set gives "
            "only how the base models load (where they lie, the device, threads, dtype, "
            "LoRA, the embedded recipe)",
            file=sys.stderr,
        )
    return 0


LOADING = (
    "policy.model",
    "policy.device",
    "policy.threads",
    "policy.dtype",
    "policy.gradient_checkpointing",
    "policy.lora",
    "policy.embedded",
    "grpo.kl_coef",
    "complementary.extractor",
    "complementary.ops",
    "complementary.lora",
)
"""The settings (key paths and their prefixes) a re-execution reads of a ``--set``: how the
base models load. The rest of an update is what its request in the log records."""


def _base_note(meta: Any, overrides: Sequence[str] = ()) -> str:
    """Why a re-execution's starting weights may not be the run's: a model named by ``--set``,
    the run's own directory gone or changed, or (a run that does not record its model
    directories) the embedded model this coevo builds is not the one an older coevo built."""
    from scenarios.policy_models import model_overrides

    if named := model_overrides(overrides):
        return f"--set {named[0]} gives another model than the one the run started from"
    if meta is not None and meta.models:
        return (
            "the model directory the run started from is gone or changed (an embedded model "
            "built again differs when built by another coevo or on another CPU kind); --set "
            "policy.model=DIR names a directory that holds the run's"
        )
    return (
        "the run does not record the model directories it started from (made before "
        "2026-12-03); an embedded model built by this coevo differs from one an older coevo "
        "built (its recipe changed): --set policy.model=DIR names the one the run started "
        "from (a directory under the cache's embedded/, and complementary.extractor=DIR the "
        "extractor's under extractor/)"
    )


def _machine_note(meta: Any) -> str:
    """What a divergence may owe to the machine: "" if the run records this machine."""
    from engine.eventlog import machine_description

    here = machine_description()
    written = meta.machine if meta is not None else ""
    if written == here:
        return ""
    since = f"was written on {written}" if written else "does not record the machine that wrote it"
    return (
        f"the run {since}; this is {here}. An update re-executes bit for bit only on a machine "
        "whose kernels round its floating-point sums as the writer's did: on another, the "
        "first update may diverge by rounding alone."
    )


class _VerifyFailed(CoevoError):
    """``replay --verify`` found a corrupted record or a divergent checksum."""

    exit_code = 1


class _Stdout(Console):
    """A console on stdout whose reader went away (``| head -1``) ends the command as every
    other command does, with exit 0 (rich's own answer is exit 1)."""

    def __init__(self) -> None:
        super().__init__(markup=False)  # a world's "[bold]" is its text, not a style

    def on_broken_pipe(self) -> None:
        self.quiet = True
        to_devnull(sys.stdout)  # nothing more reaches the closed pipe
        raise BrokenPipeError
