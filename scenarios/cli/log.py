"""``coevo log``: a run's events, filtered, as lines or JSON, and followed live (``--follow``)."""

from __future__ import annotations

import argparse
import difflib
import signal
import sys
from typing import Any, cast

import msgspec
import trio

from scenarios.cli.common import (
    InputInvalid,
    naming,
    open_run,
    past_end,
    to_devnull,
)
from scenarios.cli.entry import Terminated

__all__ = ["cmd_log"]


def cmd_log(args: argparse.Namespace) -> int:
    from engine.events import event_types
    from engine.replay import EventFilter, iter_events

    for name, value in (("--from", args.start), ("--to", args.stop), ("--limit", args.limit)):
        if value is not None and value < 0:
            raise InputInvalid(f"{name} must be >= 0, got {value}")
    if args.stop is not None and args.stop <= args.start:  # printed nothing, exit 0
        raise InputInvalid(
            f"--to {args.stop} is not after --from {args.start}: no event lies between them "
            "(--to is exclusive)"
        )
    for name, given in (("--episode", [args.episode]), ("--actor", args.actor)):
        if any(g is not None and not g.strip() for g in given):  # "" printed every event
            raise InputInvalid(f"{name}: an empty name (leave the option out for every one)")
    log = open_run(args.run)  # first: it imports a plug-in method's own event kinds
    try:
        kinds = event_types()
        for kind in args.kind:
            if kind not in kinds:
                near = difflib.get_close_matches(kind, list(kinds), n=3)
                hint = f" (did you mean {' or '.join(near)}?)" if near else ""
                known = ", ".join(kinds)
                from agents.methods.registry import unimported_note

                note = unimported_note()  # the run's own method's kinds, when it did not import
                raise InputInvalid(
                    f"--kind: no event kind {kind!r}{hint}; known: {known}"
                    + (f"; {note}" if note else "")
                )
        flt = EventFilter(
            kinds=frozenset(args.kind),
            actors=frozenset(args.actor),
            corr=args.episode or "",
            start=args.start,
            stop=args.stop,
        )
        with naming(log.path):
            if args.follow:
                return _follow(log, flt, args)
            shown = 0
            for env in iter_events(log, flt):
                if args.limit is not None and shown >= args.limit:
                    break
                _print_envelope(env, args.json, args.full)
                shown += 1
            if not shown and args.actor:
                _check_actors(log, args.actor)
            if not shown and args.episode:
                _check_episode(log, args.episode)
            if not shown and args.start >= (end := log.next_seq):
                print(f"coevo: note: {past_end('--from', args.start, end)}", file=sys.stderr)
    finally:
        log.close()
    return 0


def _check_actors(log: Any, asked: list[str]) -> None:
    """Raise InputInvalid when an actor ``--actor`` names emitted nothing in the whole run (a
    typo, most likely): nothing shown is then no answer."""
    actors = sorted({env.actor for env in log.read(0, None)})
    missing = [a for a in asked if a not in actors]
    if missing:
        raise InputInvalid(
            f"--actor: no event of {', '.join(map(repr, missing))} in this run; "
            f"its actors: {', '.join(actors)}"
        )


def _check_episode(log: Any, asked: str) -> None:
    """Raise InputInvalid when no event of the whole run carries ``--episode`` (a typo, or a
    number without its ``ep`` prefix, most likely): nothing shown is then no answer."""
    seen = {env.corr for env in log.read(0, None)}
    if asked in seen:
        return
    ids = sorted(c for c in seen if c)
    near = difflib.get_close_matches(asked, ids, n=3)
    if near:
        hint = f" (did you mean {' or '.join(near)}?)"
    else:
        hint = f" (its {len(ids)} ids run from {ids[0]} to {ids[-1]})" if ids else ""
    raise InputInvalid(f"--episode: no event of {asked!r} in this run{hint}")


def _follow(log: Any, flt: Any, args: argparse.Namespace) -> int:
    """Print events as the run commits them, until ``--limit``, until the run's writer is
    gone and every event is shown (a run that ended or was killed: a killed one is said on
    stderr), or until a Ctrl-C (exit 0) or a SIGTERM (exit 143; taken inside trio, so it stops
    the tail where it waits)."""
    from engine.replay import follow
    from stores.lmdb_env import writer_alive
    from stores.rundir import log_state

    terminated = False
    caught_up = False  # the tail reached the end of a log no process writes

    async def on_sigterm(signals: Any, scope: trio.CancelScope) -> None:
        nonlocal terminated
        async for _ in signals:
            terminated = True
            scope.cancel()
            return

    async def tail() -> None:
        count = 0
        with trio.open_signal_receiver(signal.SIGTERM) as signals:  # from here, no Terminated
            async with trio.open_nursery() as nursery:
                nursery.start_soon(on_sigterm, signals, nursery.cancel_scope)
                async for env in follow(log, flt, writing=lambda: writer_alive(log.path)):
                    if args.limit is not None and count >= args.limit:
                        break
                    try:
                        _print_envelope(env, args.json, args.full)
                        sys.stdout.flush()
                    except BrokenPipeError:  # `| head`: the reader has what it wanted
                        to_devnull(sys.stdout)
                        break
                    count += 1
                else:
                    nonlocal caught_up
                    caught_up = flt.stop is None or log.next_seq < flt.stop
                nursery.cancel_scope.cancel()

    try:
        trio.run(tail)
    except BaseException as exc:  # a Ctrl-C is how a follow ends; a SIGTERM stops it
        stop = _interrupt(exc)
        if stop is None:
            raise
        if isinstance(stop, Terminated):
            raise Terminated from None
        return 0
    if terminated:
        raise Terminated
    if caught_up and args.start >= (end := log.next_seq):  # nothing was there to follow
        print(f"coevo: note: {past_end('--from', args.start, end)}", file=sys.stderr)
    if caught_up and log_state(log, log.path) == "killed":
        print(
            f"coevo: {args.run}: no process writes this run any more and its log has no final "
            "event: it was killed (coevo resume continues it)",
            file=sys.stderr,
        )
    return 0


def _interrupt(exc: BaseException) -> KeyboardInterrupt | None:
    """``exc`` if it is a KeyboardInterrupt (a Ctrl-C, or a SIGTERM as ``Terminated``), or the
    first one of an exception group made only of them (as a nursery raises it); else None."""
    if isinstance(exc, KeyboardInterrupt):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        group = cast("BaseExceptionGroup[BaseException]", exc)
        found = [_interrupt(e) for e in group.exceptions]
        if found and all(f is not None for f in found):
            return found[0]
    return None


def _print_envelope(env: Any, as_json: bool, full: bool = False) -> None:
    from scenarios.cli.console import envelope_dict, envelope_line

    if as_json:
        sys.stdout.write(msgspec.json.encode(envelope_dict(env)).decode() + "\n")
    else:
        sys.stdout.write(envelope_line(env, width=None if full else 160) + "\n")
