"""What a finished run says: its reports (learning curves) written from its log, how it
ended and its exit code, and the warnings that what its log counts calls for (episodes all
aborted or cut off, a policy no update changed, a memory that stayed empty, prompts cut).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

from rich.console import Console

from agents.audit.shown import pasteable, safe_line
from engine.errors import CoevoError
from scenarios.cli.common import open_run, out_of_resources
from stores.rundir import RunDir

__all__ = ["finish", "how_it_ended", "verdict"]


def how_it_ended(rd: RunDir, run_id: str, curves: bool) -> str:
    """What a run's log says after a stop that the runtime did not handle (one at its very
    start or after its end): completed (its curves may be missing), failed (its error: the
    stop did not end it, and a resume meets the same error unless it was mended), or
    resumable."""
    from engine.eventlog import last_envelope
    from engine.lifecycle import RunFailed, RunStopped

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
    if last is not None and isinstance(last.event, RunFailed):
        return safe_line(
            f"coevo: error: run {run_id} failed before the stop: {n} events in {rd.root} "
            f"(exit {last.event.exit_code}): {last.event.message}"
        )
    again = f"coevo resume {pasteable(rd.root)} continues it"
    return f"coevo: run {run_id} stopped after {n} events: {again}"


def finish(
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


def verdict(states: dict[str, Any]) -> int:
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
