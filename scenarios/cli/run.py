"""The ``coevo`` commands that check and drive a run: ``validate``, ``run`` and ``resume``
(a run's writer: the log created, or taken over before anything of it is read)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import trio
from rich.console import Console

from agents.audit.shown import pasteable, safe_line
from engine.errors import CoevoError, LogError, LogLocked, NothingToResume, RunNotFound
from engine.eventlog import last_envelope
from engine.invariants import completed
from scenarios.cli.common import (
    TOO_MANY_FILES,
    InputInvalid,
    damaged_checkpoints,
    missing_checkpoints,
    naming,
    newest_updates,
    open_run,
    out_of_resources,
    out_path,
    read_meta,
    stdout_to_stderr,
    version,
)
from scenarios.cli.entry import stopped
from stores.rundir import RunDir, default_run_dir, find_run, new_run_id, path_identity

__all__ = ["cmd_resume", "cmd_run", "cmd_validate"]


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
    return _execute(scenario, args.file, rd, run_id, quiet=args.quiet, unread=unread)


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
        models=_model_files(assembly.models),
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
        return _drive(scenario, assembly, log, rd, started, home, quiet=quiet)
    except TrackerNotStarted as exc:  # nothing of the run was written: nothing of it is left
        _discard(rd, existed)
        raise InputInvalid(f"{exc}; nothing ran, and {rd.root} is left as it was") from None


class TrackerNotStarted(CoevoError):
    """A tracking sink could not start, so the run did not: its log holds no event (exit 2)."""

    exit_code = 2


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


def _drive(
    scenario: Any,
    assembly: Any,
    log: Any,
    rd: RunDir,
    started: Any,
    home: tuple[int, int] | None,
    *,
    quiet: bool,
    resumed: Any = None,
    history: Sequence[Any] = (),
) -> int:
    """Run the assembled actors over ``log`` (new or resumed), then print the summary. The
    caller has joined the scenario's cluster (``scenarios.assemble.cluster``); ``home`` is the
    run directory's :func:`path_identity` when the caller opened the log in it (taken here
    instead, a move between the two went unseen)."""
    from engine.runtime import Runtime
    from scenarios.cli.console import RunProgress, actors_table, families_table
    from scenarios.cli.logsetup import close_logging, configure_logging

    console = Console(stderr=True, quiet=quiet, markup=False)  # "[b]" in a path is text
    configure_logging(console, scenario.logging.level, rd.structlog)
    progress = RunProgress(console, assembly.episodes, enabled=scenario.logging.progress)
    progress.resume(history)
    from agents.tracking.sinks import SinkUnavailable

    try:
        tracker = assembly.tracking(history) if assembly.tracking is not None else None
    except BaseException as exc:
        log.close()
        close_logging()
        if isinstance(exc, SinkUnavailable):
            raise TrackerNotStarted(str(exc)) from exc
        raise
    runtime = Runtime(
        log,
        started,
        assembly.specs,
        assembly.projections,
        seed=scenario.seed,
        config=assembly.config,
        observers=[progress.observe, *([tracker.observe] if tracker is not None else [])],
        resumed=resumed,
        history=history,
        verdict=_verdict,
    )
    run_id = started.run_id
    verb = f"resumed after seq {resumed.after}" if resumed is not None else scenario.name
    console.print(safe_line(f"run {run_id}: {verb} -> {rd.root}"))
    try:
        try:
            with progress:
                outcome = _run_loop(runtime, rd)
        finally:
            log.close()
            try:
                if tracker is not None:
                    tracker.close()
            finally:
                close_logging()
        console.print(actors_table(runtime.states["actor_stats"]))
        console.print(families_table(runtime.states["episodes"]))
        moved = path_identity(rd.root) != home
        return _finish(
            console,
            None if moved else assembly.report,
            runtime.states["episodes"],
            outcome,
            run_id,
            rd,
            quiet,
            moved=moved,
            curves=assembly.report is not None,
        )
    except KeyboardInterrupt as exc:  # outside the runtime's own handling: its start or end
        code = stopped(exc)
        print(_how_it_ended(rd, run_id, assembly.report is not None), file=sys.stderr)
        return code


class OutOfResources(CoevoError):
    """The process ran out of what its event loop needs (open files, threads, memory): the run
    stopped, and its log keeps every commit."""


def _run_loop(runtime: Any, rd: RunDir) -> Any:
    """``trio.run(runtime.run)``, with the operating system refusing the loop what it needs
    (a socket pair under a low ``ulimit -n``, a thread under a memory limit) as one line.

    Raises:
        OutOfResources: naming the limit and how the run goes on.
    """
    import errno

    again = f"the log keeps every commit: `coevo resume {pasteable(rd.root)}` continues the run"
    try:
        return _trio_run_stoppable(runtime.run)
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            why = TOO_MANY_FILES
        elif exc.errno == errno.ENOMEM:
            why = "out of memory"
        else:
            raise
        raise OutOfResources(f"the run stopped: {why} ({exc}); {again}") from None
    except RuntimeError as exc:
        if "can't start new thread" not in str(exc):
            raise
        raise OutOfResources(
            f"the run stopped: the process cannot start another thread (a memory or process "
            f"limit: ulimit -v, ulimit -u); {again}"
        ) from None
    except MemoryError:
        raise OutOfResources(f"the run stopped: out of memory; {again}") from None


def _trio_run_stoppable(run: Callable[[], Awaitable[Any]]) -> Any:
    """``trio.run(run)``, a SIGTERM or SIGHUP outside the runtime's own handling (before the
    actors start, after they end) delivered as trio delivers a Ctrl-C and raised from here
    as :class:`~scenarios.cli.entry.Terminated` (or ``HungUp``).

    The command line's handler raises ``Terminated`` wherever the process is: in trio's own
    teardown (a SIGTERM as a run completed), that left the loop waiting for ever on nothing.
    Trio holds a ``KeyboardInterrupt`` off its internals (it raises it in the main task at
    its next checkpoint, or from ``trio.run`` once the run has ended), for its own SIGINT
    handler only, which these signals go through here.
    """
    import signal

    from scenarios.cli.entry import HungUp, Terminated

    others = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) != signal.SIG_IGN]
    saved = {s: signal.getsignal(s) for s in others}
    before = signal.getsignal(signal.SIGINT)
    late: list[int] = []

    async def main() -> Any:
        trio_ki = signal.getsignal(signal.SIGINT)
        if trio_ki is not before and callable(trio_ki):  # trio's own, installed by trio.run

            def as_interrupt(signum: int, frame: Any) -> None:
                late.append(signum)
                trio_ki(signal.SIGINT, frame)

            for sig in others:
                signal.signal(sig, as_interrupt)
        return await run()

    try:
        return trio.run(main)
    except KeyboardInterrupt:
        if late:
            raise (HungUp if late[-1] == signal.SIGHUP else Terminated)() from None
        raise
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _how_it_ended(rd: RunDir, run_id: str, curves: bool) -> str:
    """What a run's log says after a stop that the runtime did not handle (one at its very
    start or after its end): completed (its curves may be missing), or resumable."""
    from engine.eventlog import last_envelope
    from engine.lifecycle import RunStopped

    try:
        reader = open_run(str(rd.root))
        try:
            n = reader.next_seq
            last = last_envelope(reader)
        finally:
            reader.close()
    except (CoevoError, OSError) as exc:
        return f"coevo: run {run_id} in {rd.root}: its log cannot be read now ({exc})"
    if last is not None and isinstance(last.event, RunStopped) and last.event.reason == "completed":
        drawn = f"; its curves: coevo report {pasteable(rd.root)}" if curves else ""
        return f"coevo: run {run_id} completed before the stop ({n} events in {rd.root}){drawn}"
    again = f"coevo resume {pasteable(rd.root)} continues it"
    return f"coevo: run {run_id} stopped after {n} events: {again}"


def _finish(
    console: Console,
    report: Any,
    episodes: Any,
    outcome: Any,
    run_id: str,
    rd: RunDir,
    quiet: bool,
    *,
    moved: bool = False,
    curves: bool = True,
) -> int:
    """Write the run's reports, print how it ended, and return the exit code: the run's, or 1
    when it completed but its curves (``curves``: a run that draws some) cannot be written
    (``moved``: its directory was moved or deleted while it ran) or none of its episodes
    finished."""
    gone = f"the run directory {rd.root} was moved, deleted or replaced while the run wrote into it"
    unwritten = (
        f"coevo: error: {gone}, and its curves are not written (a moved run's log is complete "
        "where it went: coevo report draws them there)"
        if moved and curves
        else ""
    )
    if moved and not curves:  # nothing was to be written there: the log is all
        print(f"coevo: note: {gone}; its log is complete where it went", file=sys.stderr)
    updates: list[Any] = []  # the policy's updates, seen as the report reads the log
    counts: Counter[str] = Counter()  # and the kinds the end-of-run warnings count
    if report is not None:
        try:
            for line in _report(report, rd, updates, counts):
                console.print(line)
        except OSError as exc:  # a full disk: the log is complete, the plots can wait
            unwritten = (
                f"coevo: error: cannot write the run's curves in {rd.root}: "
                f"{exc.strerror or exc} (the log is complete: coevo report "
                f"{pasteable(rd.root)} draws them)"
            )
        except (ImportError, MemoryError) as exc:  # the plotting library, past a memory limit
            if not (said := out_of_resources(exc)):
                raise
            unwritten = (
                f"coevo: error: cannot draw the run's curves: {said} (the log is complete: "
                f"coevo report {pasteable(rd.root)} draws them)"
            )
    problem = unwritten
    if outcome.reason == "completed":
        problem = _all_aborted(episodes, run_id, rd) or problem
    code = (outcome.exit_code or 1) if problem else outcome.exit_code
    console.print(  # the exit code the process ends with, not only the runtime's
        safe_line(
            f"run {run_id} {outcome.reason}: {outcome.events} events in {rd.root} "
            f"(exit {code})" + (f": {outcome.error}" if outcome.error else "")
        )
    )
    if quiet and outcome.reason == "failed":  # the one line --quiet keeps
        print(
            safe_line(
                f"coevo: error: run {run_id} failed: {outcome.events} events in {rd.root}: "
                f"{outcome.error}"
            ),
            file=sys.stderr,
        )
    elif quiet and outcome.reason != "completed":  # stopped (a signal): how to go on
        how = outcome.reason.removeprefix("signal:")
        print(
            f"coevo: run {run_id} stopped ({how}) after {outcome.events} events: coevo resume "
            f"{pasteable(rd.root)} continues it",
            file=sys.stderr,
        )
    elif problem:
        print(safe_line(problem), file=sys.stderr)
    if outcome.reason == "completed" and not problem:
        warnings = (
            _some_aborted(episodes, rd),
            _policy_unchanged(updates),
            _memory_empty(counts),
            _all_cut(counts),
        )
        for warning in (*warnings, _prompts_cut(counts, rd)):
            if warning:
                print(warning, file=sys.stderr)
    return code


def _all_cut(counts: Counter[str]) -> str:
    """A warning when every finished episode was cut off at the turn limit, the world never
    having ended one (a world whose ``done`` is never true): no success could be counted."""
    n = counts["episode_finished"]
    if not n or counts["truncated"] != n:
        return ""
    return (
        f"coevo: warning: all {n} of the run's finished episodes were cut off at [world] "
        "max_turns before the world ended one (does its step ever say done?): none could "
        "succeed"
    )


def _prompts_cut(counts: Counter[str], rd: RunDir) -> str:
    """A warning when actions were chosen from prompts cut in the middle to fit the model's
    positions: the run's log said so once, at the first (in ``coevo.jsonl`` only, with
    ``--quiet``), and a model too short for its prompts kept little of them, the goal
    included."""
    cut, n = counts["prompt_cut"], counts["action_sampled"]
    if not cut:
        return ""
    return (
        f"coevo: warning: {cut:,} of the run's {n:,} actions were chosen from prompts cut in "
        "the middle to fit the model's positions (the first quarter and the end kept: a long "
        f"goal may be lost); coevo log {pasteable(rd.root)} --kind action_sampled shows "
        "prompt_cut, coevo audit RUN episode ID what an episode's turns kept"
    )


def _memory_empty(counts: Counter[str]) -> str:
    """A warning when a run's memory was asked to write (extractor calls, reflections) and
    stored nothing all run: every retrieval showed nothing, and the run was GRPO under
    another name (an extractor that never wrote an operation, with ``plain_add = false``)."""
    writes = counts["extractor_called"] + counts["tip_proposed"]
    if not writes or counts["tip_stored"]:
        return ""
    asked = " and ".join(
        f"{n} {what}{'s' * (n != 1)}"
        for n, what in (
            (counts["extractor_called"], "extractor call"),
            (counts["tip_proposed"], "reflection"),
        )
        if n
    )
    return (
        f"coevo: warning: the memory stayed empty all run: its {asked} stored no entry, so "
        f"its {counts['tips_retrieved']} retrievals showed nothing (`coevo log RUN --kind "
        "tip_rejected` says why an entry was refused; an extractor whose answers hold no "
        "operation writes none with [complementary] plain_add = false)"
    )


def _policy_unchanged(updates: list[Any]) -> str:
    """A warning when a learning run made ``updates`` (its :class:`PolicyUpdated` events)
    and none of them changed the policy's weights (every update's digest is its parent's): a
    run of a model whose episodes all score alike trains nothing, and its summary said
    "updates: N" all the same; "" otherwise."""
    changed = [u for u in updates if getattr(u, "digest", "") != getattr(u, "parent_digest", "")]
    if not updates or changed or not all(getattr(u, "parent_digest", "") for u in updates):
        return ""
    head = f"coevo: warning: none of the run's {len(updates)} policy updates changed its weights"
    tail = ": the policy is the one it started from"
    masked = [getattr(u, "low_prob_masked", None) for u in updates]
    if all(m is not None and m == u.samples for m, u in zip(masked, updates, strict=True)):
        return (
            f"{head} (EMPO2's low-probability mask dropped all "
            f"{sum(u.samples for u in updates)} of their samples: each held a token whose "
            f"log-prob was below [empo2] low_prob_delta){tail}"
        )
    return (
        f"{head} (every group's episodes scored alike, so every advantage was 0; or the "
        "learning rate is too small to move a weight"
        + (
            "; or [empo2] low_prob_mask dropped the samples that had a signal"
            if any(m for m in masked)
            else ""
        )
        + f"){tail}"
    )


def _verdict(states: dict[str, Any]) -> int:
    """A completed run's exit code as its log records it: 1 when no episode, no training or
    no evaluation episode finished (as :func:`_all_aborted` then says), 0 otherwise."""
    return 1 if _aborted_all(states["episodes"]) else 0


def _aborted_all(episodes: Any) -> tuple[int, str] | None:
    """How many of the run's episodes (or of its training or its evaluation episodes) aborted,
    and which, when some did and none of them finished: a held-out figure of 0% made of
    aborts measures nothing, as training on none does."""
    rows = list(episodes.episodes.values())
    found = _none_finished(rows, "episodes")
    for what, purpose in PURPOSES.items():
        found = found or _none_finished([r for r in rows if r.purpose == purpose], what)
    return found


def _all_aborted(episodes: Any, run_id: str, rd: RunDir) -> str:
    """The error line of a run that completed without finishing one episode, one training
    episode or one evaluation episode: every one was aborted (a world that fails every
    episode, every training one while evaluation's played on, or every held-out one); ""
    otherwise."""
    from engine.replay import EventFilter, iter_events

    found = _aborted_all(episodes)
    if not found:
        return ""
    aborted, what = found
    reader = open_run(str(rd.root))
    try:
        ends = iter_events(reader, EventFilter(kinds=frozenset({"episode_aborted"})))
        first = next(
            (
                e.event
                for e in ends
                if what == "episodes" or getattr(e.event, "purpose", "") == PURPOSES[what]
            ),
            None,
        )
    finally:
        reader.close()
    return (
        f"coevo: error: run {run_id} completed, but all {aborted} of its {what} were aborted "
        f"(the first: {getattr(first, 'reason', '?')}); coevo log "
        f"{pasteable(rd.root)} --kind episode_aborted lists them"
    )


def _some_aborted(episodes: Any, rd: RunDir) -> str:
    """A warning when some of a run's episodes were aborted (and some of each purpose
    finished: else :func:`_all_aborted`): a world that fails on some episodes, say on the
    step that wins, lowers the success rates without a sign, since an aborted evaluation
    episode counts as a failure and an aborted training episode drops out of its group."""
    rows = list(episodes.episodes.values())
    parts: list[str] = []
    for what, purpose in PURPOSES.items():
        mine = [r for r in rows if r.purpose == purpose]
        aborted = sum(r.status == "aborted" for r in mine)
        if aborted:
            ended = sum(r.status in ("finished", "aborted") for r in mine)
            parts.append(f"{aborted} of its {ended} {what}")
    if not parts:
        return ""
    return (
        f"coevo: warning: {' and '.join(parts)} were aborted (the world failed, hung or gave "
        "what the worker refuses; evaluation counts an aborted episode as a failure, training "
        f"leaves it out of its group): coevo log {pasteable(rd.root)} --kind episode_aborted "
        "says why"
    )


PURPOSES = {"training episodes": "train", "evaluation episodes": "eval"}
"""The episodes of a purpose a run must finish some of, by what its error line calls them."""


def _none_finished(rows: list[Any], what: str) -> tuple[int, str] | None:
    """How many of ``rows`` (episode table rows) aborted, when some did and none finished."""
    aborted = sum(r.status == "aborted" for r in rows)
    if aborted and not any(r.status == "finished" for r in rows):
        return aborted, what
    return None


def _report(report: Any, rd: RunDir, updates: list[Any], counts: Counter[str]) -> list[str]:
    """A finished run's reports (learning curves), written into its directory from its log;
    the policy's updates it reads are appended to ``updates``, and the events of
    :data:`COUNTED_KINDS` counted into ``counts`` (one pass over the log serves all).

    Raises:
        OSError: a file cannot be written.
    """
    from agents.events.policy import PolicyUpdated

    def events() -> Iterator[Any]:
        for env in reader.read(0, None):
            if isinstance(env.event, PolicyUpdated):
                updates.append(env.event)
            elif (tag := env.event.__struct_config__.tag) in COUNTED_KINDS:
                counts[tag] += 1
                if tag == "episode_finished" and getattr(env.event, "truncated", False):
                    counts["truncated"] += 1
                elif tag == "action_sampled" and getattr(env.event, "prompt_cut", 0):
                    counts["prompt_cut"] += 1
            yield env.event

    reader = open_run(str(rd.root))
    try:
        return report(rd.root, events())
    finally:
        reader.close()


COUNTED_KINDS = frozenset(
    {
        "extractor_called",
        "tip_proposed",
        "tip_stored",
        "tips_retrieved",
        "episode_finished",
        "action_sampled",
    }
)
"""The events a finished run counts for :func:`_memory_empty`, :func:`_all_cut` and
:func:`_prompts_cut`."""


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
        history, newest = _history(
            args.run, log, rd.root if scenario.run.method != ROLLOUT else None
        )
        _models_in_place(args.run, meta.models, _embedded_roles(scenario))
        from scenarios.policy_setup import recorded_models

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
                return _drive(scenario, assembly, log, rd, started, home, quiet=args.quiet)
            last = history[-1]
            ended = isinstance(last.event, RunStopped | RunFailed)
            previous = str(last.event.__struct_config__.tag) if ended else ""
            resumed = RunResumed(after=last.seq, previous=previous, coevo_version=version())
            return _drive(
                scenario, assembly, log, rd, started, home,
                quiet=args.quiet, resumed=resumed, history=history,
            )  # fmt: skip
        except TrackerNotStarted as exc:
            raise InputInvalid(
                f"{exc}; nothing was written: `coevo resume {pasteable(args.run)} --no-tracking` "
                "continues the run without live tracking (`coevo export` writes its scalars "
                "afterwards)"
            ) from None


def _model_files(models: dict[str, Path]) -> dict[str, Any]:
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
    now = _model_files(models)
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
        InputInvalid: another process writes the run (a run or a resume still going).
    """
    from stores.lmdb_log import LmdbEventLog

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


def _completed_run(path: str, last: Any) -> str:
    """Why the run at ``path``, whose last event ``last`` records its completion, is not
    resumed."""
    return f"{path}: the run completed (run_stopped at seq {last.seq}); nothing to resume"


def _history(
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
