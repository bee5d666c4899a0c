"""What a person sees on the terminal: the live progress of a run and readable tables.

Nothing here decides anything; it renders events and projection states.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, cast

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agents.audit.shown import safe_line
from engine.events import Envelope, Event


class RunProgress:
    """A progress bar over ended episodes, fed by the runtime's committed batches.

    On a terminal it is a live bar; elsewhere (CI, a pipe) it prints a line every 10%. The
    success shown is over the last :attr:`WINDOW` ended episodes (evaluation episodes of a
    learning run are left out: their rounds show as "heldout").
    """

    WINDOW = 200
    RATE_SPAN = 10.0
    """Seconds the events/s shown is measured over (the rate now, not the mean since start)."""

    def __init__(self, console: Console, total: int, *, enabled: bool = True) -> None:
        self._console = console
        self._total = total
        self._enabled = enabled
        self._done = 0
        self._recent: deque[bool] = deque(maxlen=self.WINDOW)
        self._events = 0
        self._marks: deque[tuple[float, int]] = deque([(time.monotonic(), 0)])
        self._next_line = 0.1
        self._live = enabled and console.is_terminal
        self._progress = Progress(
            TextColumn("[bold]episodes"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("success {task.fields[rate]}"),
            TextColumn("{task.fields[learning]}"),
            TextColumn("{task.fields[eps]} events/s"),
            TimeElapsedColumn(),
            console=console,
            disable=not self._live,
        )
        self._version = 0
        # this session's first update seen live and when: the rate counts this session's own
        # (a resumed run's earlier updates took the earlier sessions' time)
        self._first_update: tuple[int, float] | None = None
        self._eval = "-"
        self._task = self._progress.add_task(
            "episodes", total=total, rate="-", eps="-", learning=""
        )

    def __enter__(self) -> RunProgress:
        self._progress.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.__exit__(exc_type, exc, tb)

    def resume(self, history: Iterable[Envelope[Event]]) -> None:
        """Start from what a resumed run's earlier sessions did (episodes ended, recent
        success, policy version, held-out success), shown from the first line."""
        self._fold(history)
        while self._total and self._next_line * self._total <= self._done:
            self._next_line += 0.1
        self._render()  # not 0/N until this session's first commit

    def observe(self, batch: list[Envelope[Event]]) -> None:
        """Runtime observer: count ended episodes in a committed batch."""
        self._events += len(batch)
        self._fold(batch, live=True)
        self._render()

    def _fold(self, batch: Iterable[Envelope[Event]], live: bool = False) -> None:
        """Count ``batch`` in; ``live``: committed in this session (not a resumed run's
        history), whose first update starts the update rate's clock."""
        for env in batch:
            ev = env.event
            tag = ev.__struct_config__.tag
            if getattr(ev, "purpose", "train") != "train":
                continue  # evaluation episodes are reported by their round
            if tag == "episode_finished":
                self._done += 1
                self._recent.append(bool(getattr(ev, "success", False)))
            elif tag == "episode_aborted":
                self._done += 1
                self._recent.append(False)
            elif tag == "policy_updated":
                self._version = int(getattr(ev, "policy_version", 0))
                if live and self._first_update is None:
                    self._first_update = (self._version, time.monotonic())
            elif tag == "eval_round_finished" and not getattr(ev, "memory", False):
                self._eval = f"{getattr(ev, 'success', 0.0):.0%}"

    def _rate(self) -> float:
        """Events per second over the last :attr:`RATE_SPAN` seconds."""
        now, marks = time.monotonic(), self._marks
        marks.append((now, self._events))
        while len(marks) > 2 and now - marks[1][0] >= self.RATE_SPAN:
            marks.popleft()
        t, n = marks[0]
        return (self._events - n) / max(now - t, 1e-9)

    def _learning(self) -> str:
        if not self._version and self._eval == "-":
            return ""
        rate = "-"
        if self._first_update is not None:
            first, t0 = self._first_update
            elapsed = time.monotonic() - t0
            if elapsed > 0 and self._version > first:
                rate = f"{(self._version - first) / elapsed:.2f}"
        return f"v{self._version} ({rate} upd/s)  heldout {self._eval}"

    def _render(self) -> None:
        rate = f"{sum(self._recent) / len(self._recent):.0%}" if self._recent else "-"
        eps = f"{self._rate():,.0f}"
        learning = self._learning()
        self._progress.update(
            self._task, completed=self._done, rate=rate, eps=eps, learning=learning
        )
        if self._enabled and not self._live and self._done >= self._next_line * self._total:
            self._console.print(
                f"episodes {self._done}/{self._total}  success {rate}  {learning}  {eps} ev/s"
            )
            while self._next_line * self._total <= self._done:
                self._next_line += 0.1


class StepProgress:
    """A progress bar over ``total`` steps of a long command (e.g. re-executed updates).

    On a terminal it is a live bar showing the last step's label; elsewhere it prints a line
    every 10%.
    """

    def __init__(self, console: Console, total: int, what: str) -> None:
        self._console = console
        self._total = total
        self._what = what
        self._done = 0
        self._next_line = 0.1
        self._live = console.is_terminal
        self._progress = Progress(
            TextColumn(f"[bold]{what}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[label]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not self._live,
        )
        self._task = self._progress.add_task(what, total=total, label="")

    def __enter__(self) -> StepProgress:
        self._progress.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.__exit__(exc_type, exc, tb)

    def advance(self, label: str) -> None:
        """One more step done; ``label`` says which."""
        self._done += 1
        self._progress.update(self._task, completed=self._done, label=label)
        if not self._live and self._done >= self._next_line * self._total:
            self._console.print(f"{self._what} {self._done}/{self._total}  {label}")
            while self._next_line * self._total <= self._done:
                self._next_line += 0.1


def families_table(episodes_state: Any) -> Table:
    """Outcomes by family and purpose (training, evaluation: held-out rounds, rounds with the
    bank, adaptation) of an ``EpisodeTable`` state's episodes: an aborted episode (its world
    failed) counts as a failure in ``success``, as held-out evaluation and the train curve
    count it; ``mean steps`` is over the finished ones. Training and evaluation episodes were
    counted together, a family's success a mix of the two."""
    table = Table(title="episodes by family")
    for col in ("family", "purpose", "finished", "aborted", "success", "mean steps"):
        table.add_column(col, justify="left" if col in ("family", "purpose") else "right")
    counts: dict[tuple[str, str], list[int]] = {}  # finished, aborted, successes, steps
    for row in episodes_state.episodes.values():
        if row.status not in ("finished", "aborted"):
            continue
        c = counts.setdefault((row.family, row.purpose), [0, 0, 0, 0])
        if row.status == "aborted":
            c[1] += 1
        else:
            c[0], c[2], c[3] = c[0] + 1, c[2] + int(row.success), c[3] + row.steps
    if any(purpose == "eval" for _, purpose in counts):  # a row that read as a round's figure
        table.caption = (
            "eval: every evaluation episode together (held-out rounds with and without the "
            "bank, adaptation attempts), not one round's figure (`coevo report` has each)"
        )
    for (family, purpose), (done, aborted, won, steps) in sorted(counts.items()):
        ended = done + aborted
        table.add_row(
            safe_line(family),  # a world's name: a newline split the row, ESC acted
            safe_line(purpose),
            str(done),
            str(aborted),
            f"{won / ended:.1%}" if ended else "-",
            f"{steps / done:.1f}" if done else "-",
        )
    return table


def actors_table(actor_state: Any) -> Table:
    """Per-actor table of an ``ActorStats`` state."""
    table = Table(title="actors")
    for col in ("actor", "emitted", "starts", "failures", "restarts", "first seq", "last seq"):
        table.add_column(col, justify="right" if col != "actor" else "left")
    for name, row in sorted(actor_state.actors.items()):
        table.add_row(
            name,
            str(row.emitted),
            str(row.starts),
            str(row.failures),
            str(row.restarts),
            str(row.first_seq) if row.first_seq >= 0 else "-",  # -1: it emitted nothing
            str(row.last_seq) if row.last_seq >= 0 else "-",
        )
    return table


def envelope_dict(env: Envelope[Event]) -> dict[str, Any]:
    """An envelope as a plain dict (the JSON-lines form of ``coevo log --json``)."""
    return {
        "seq": env.seq,
        "run": env.run,
        "t": env.t,
        "actor": env.actor,
        "cause": env.cause,
        "corr": env.corr,
        "v": env.v,
        "event": msgspec.to_builtins(env.event),
    }


def envelope_line(env: Envelope[Event], width: int | None = 160) -> str:
    """One readable line per envelope: seq, time of day (UTC, marked ``Z``), actor, kind,
    correlation, fields; each value cut at 60 characters and the line at ``width``, or both
    whole (every field named, every value as it is) when ``width`` is None."""
    fields: Mapping[str, Any] = msgspec.to_builtins(env.event)
    most = 60 if width is not None else None
    body = " ".join(f"{k}={_short(v, most)}" for k, v in fields.items() if k != "kind")
    stamp = time.strftime("%H:%M:%SZ", time.gmtime(env.t / 1e9))
    line = f"{env.seq:>8} {stamp} {env.actor:<12} {fields['kind']:<20} {env.corr:<10} {body}"
    return safe_line(line if width is None or len(line) <= width else line[: width - 1] + "…")


def _short(value: Any, most: int | None = 60) -> str:
    text = msgspec.json.encode(value).decode()
    if "null" in text and _non_finite(value):  # JSON writes inf and NaN as null: "no value"
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))  # Infinity, NaN
    return text if most is None or len(text) <= most else text[: most - 1] + "…"


def _non_finite(value: Any) -> bool:
    """Whether ``value`` (builtins) holds a float that is inf or NaN."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list | tuple):
        return any(_non_finite(v) for v in cast("Sequence[Any]", value))
    if isinstance(value, dict):
        return any(_non_finite(v) for v in cast("dict[str, Any]", value).values())
    return False


def indexing_lines(least: int = 100_000) -> Callable[[int, int], None]:
    """A progress report for indexing a log for the audit: a line on stderr at every tenth,
    for a log of at least ``least`` events to index (a shorter one takes a second or two)."""
    return tenths_lines("indexing the log for the audit (once)", least)


def tenths_lines(doing: str, least: int) -> Callable[[int, int], None]:
    """A progress report: ``coevo: DOING: N of TOTAL events`` on stderr at every tenth of
    ``total``, when ``total`` is at least ``least`` (a shorter pass takes a second or two)."""
    shown = [0]

    def report(done: int, total: int) -> None:
        if total < least:
            return
        tenth = done * 10 // total
        if tenth > shown[0] or done == total:
            shown[0] = tenth
            print(f"coevo: {doing}: {done:,} of {total:,} events", file=sys.stderr, flush=True)

    return report


L = TypeVar("L")

READ_LINES_LEAST = 500_000
"""The shortest read of a log a command reports its progress on (about 5 s of checking)."""


def reporting(log: L, doing: str) -> L:
    """``log``, its reads of at least :data:`READ_LINES_LEAST` events saying how far they have
    come (:class:`_ReadProgress`)."""
    return cast("L", _ReadProgress(log, doing))


class _ReadProgress:
    """A run's log whose reads of at least :data:`READ_LINES_LEAST` events say how far they
    have come (:func:`tenths_lines`); everything else is the log's own. For the commands that
    read a whole log before they answer (check, replay, report, export, diff), which were
    silent for up to minutes on a log of millions of events.

    Args:
        log: the log (an :class:`engine.eventlog.EventLog`).
        doing: what the command does, for the lines ("checking RUN").
    """

    def __init__(self, log: Any, doing: str) -> None:
        self._log, self._doing = log, doing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def _total(self, start: int, stop: int | None) -> int:
        end = self._log.next_seq  # (a stop past the end reads to it: ``replay --until``)
        return (end if stop is None else min(stop, end)) - start

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Envelope[Event]]:
        total = self._total(start, stop)
        if total < READ_LINES_LEAST:
            return self._log.read(start, stop)
        return self._counted(self._log.read(start, stop), total)

    def _counted(self, envs: Iterator[Envelope[Event]], total: int) -> Iterator[Envelope[Event]]:
        report, tenth = tenths_lines(self._doing, READ_LINES_LEAST), 1
        at = -(-total // 10)  # the first event of each tenth, rounded up as the lines round
        for done, env in enumerate(envs, 1):
            yield env
            if done >= at:
                report(done, total)
                tenth += 1
                at = -(-total * tenth // 10)

    def read_chunks(
        self, start: int = 0, stop: int | None = None
    ) -> Iterator[list[Envelope[Event]]]:
        total = self._total(start, stop)
        if total < READ_LINES_LEAST:
            yield from self._log.read_chunks(start, stop)
            return
        report, done = tenths_lines(self._doing, READ_LINES_LEAST), 0
        for chunk in self._log.read_chunks(start, stop):
            yield chunk
            done += len(chunk)
            report(done, total)
