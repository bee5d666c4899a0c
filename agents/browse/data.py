"""What the browser reads of a run: its log, opened read-only, and its audit index
(``agents/audit/index.py``), brought up to the log's end before every page, so a live run's
pages show what it has committed so far.

Every query reads index rows and the handful of events a page shows, never the whole log.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from agents.audit.answers import TipAudit, audit_tip, entry_id
from agents.audit.episode import EpisodeAudit, audit_episode
from agents.audit.index import (
    Assigned,
    Outcome,
    assigned,
    fetch,
    last_attempt,
    open_index,
    outcomes,
    rebuilt_index,
    refresh,
    refs,
    versions,
)
from agents.audit.shown import safe_line
from agents.events.policy import ActionRequested, ActionSampled
from agents.methods.registry import import_run_method
from engine.errors import CoevoError
from stores.fact_index import FactIndex, IndexDamaged, LmdbFactIndex
from stores.lmdb_env import DATA_FILE
from stores.lmdb_log import LmdbEventLog
from stores.lmdb_pages import read_metas
from stores.rundir import LOG_DIR, find_run, run_state

__all__ = ["FILTERS", "Candidate", "EpisodeRow", "RunView"]

UNFINISHED = "unfinished"
"""The outcome of an episode a run stopped or killed before it ended (no process plays it)."""

FILTERS = ("family", "split", "purpose", "outcome", "version", "rollout")
"""The episode list's filters (query parameters), each matched exactly."""


@dataclass(frozen=True)
class EpisodeRow:
    """One episode in the list: what it was and how it ended ("running" while it plays)."""

    episode: str
    index: int
    family: str
    variant: int
    split: str
    purpose: str
    rollout: str
    version: str
    outcome: str
    score: float | None
    steps: int | None
    scope: str = ""
    """The memory the episode read and wrote (an adaptation test's own: ``adapt2-t5``)."""

    def value(self, name: str) -> str:
        """The row's value of filter ``name``, as text."""
        return str(getattr(self, name))


T = TypeVar("T")


@dataclass(frozen=True)
class Candidate:
    """One admissible action at a turn, with its probability under the sampling policy."""

    action: str
    probability: float
    chosen: bool


class RunView:
    """A run opened for the browser.

    Args:
        name: the run's name in the browser's addresses.
        root: the run directory.
        log: its log, opened read-only.
        index: its audit index.
        note: a note about the index ("" normally; see :func:`open_index`).
    """

    def __init__(self, name: str, root: Path, log: Any, index: FactIndex, note: str) -> None:
        self.name = name
        self.root = root
        self.log = log
        self.index = index
        self.note = note
        self.gone = ""
        """Why the run cannot be shown now ("" while it can): its directory was deleted, or
        its log cannot be read (truncated, or being copied over)."""
        self.unreadable = False
        """Whether :attr:`gone` is a log that cannot be read now (its directory is there)."""
        self._file = _file_state(root / LOG_DIR / DATA_FILE)
        self._run = _run_id(log)
        self._served = self._run  # the run serve started with (a copy over it is "replaced")
        self._rows: tuple[int, list[EpisodeRow]] = (-1, [])

    @classmethod
    def open(cls, name: str, path: str | Path) -> RunView:
        """Open the run at ``path`` and bring its index up to date.

        Raises:
            RunNotFound: ``path`` is not a run directory.
            LogError: its log cannot be read.
        """
        rd = find_run(path)
        log = LmdbEventLog.open(rd.log, writable=False)
        import_run_method(log)  # a plug-in method's own events decode
        try:
            index, note = open_index(rd.root, log, option="")  # serve has no --index
        except BaseException:
            log.close()
            raise
        return cls(name, rd.root, log, index, note)

    def close(self) -> None:
        self.index.close()
        self.log.close()

    def refresh(self) -> int:
        """Index what the log committed since the last page; returns the log's length. A run
        directory deleted since it was opened sets :attr:`gone`; one holding another log now
        (deleted and run again, or copied over, in place too) is opened afresh, and
        :attr:`note` says so. A log file that no longer holds every page of its last commit
        (truncated, or half copied over) is let go before it is read (its mapped pages would
        kill the process), :attr:`gone` says why, and the next page tries it again."""
        now = _file_state(self.root / LOG_DIR / DATA_FILE)
        if not self.gone and now is not None and self._file is not None:
            if now == self._file:
                return refresh(self.log, self._whole_index())
            if _continues(self._file, now) and _run_id(self.log) == self._run:
                self._file = now  # the same log, committed further
                return refresh(self.log, self._whole_index())
        if not self.gone:
            self.close()  # before the file is read again: its map may reach past its end
        if now is None:  # its files are let go: a deleted run's disk space is freed
            self.gone = f"{self.root}: the run is gone (deleted or moved since serve started)"
            self.unreadable, self._file = False, None
            return 0
        fresh: RunView | None = None
        why = f"{DATA_FILE} does not hold every page of its last commit (cut, or written over)"
        if now.whole:
            try:
                fresh = RunView.open(self.name, self.root)
            except CoevoError as exc:
                why = str(exc)
        if fresh is None:
            self.gone = f"{self.root}: the run's log cannot be read now: {why}"
            self.unreadable, self._file = True, now
            return 0
        self.note = (
            fresh.note
            if fresh._run == self._served
            else f"{self.root} was replaced since serve started; this is the run there now "
            f"({fresh._run or '?'})"
        )
        self.log, self.index, self._file, self.gone = fresh.log, fresh.index, fresh._file, ""
        self.unreadable = False
        self._run = fresh._run
        self._rows = (-1, [])
        return refresh(self.log, self.index)

    def status(self) -> str:
        """:func:`stores.rundir.run_state`, "unreadable" (its log cannot be read now) or
        "gone" (the run's directory went away)."""
        if self.gone:
            return "unreadable" if self.unreadable else "gone"
        end = self.log.next_seq
        return run_state(fetch(self.log, [end - 1])[end - 1].event if end else None, self.log.path)

    def episodes(self, filters: Mapping[str, str]) -> list[EpisodeRow]:
        """The run's episodes in the order they were assigned, those matching ``filters``."""
        wanted = {k: v for k, v in filters.items() if k in FILTERS and v != ""}
        return [r for r in self._all() if all(_named(r.value(k), v) for k, v in wanted.items())]

    def choices(self) -> dict[str, list[str]]:
        """Each filter's values in the run (for the filter menus)."""
        rows = self._all()
        return {name: sorted({r.value(name) for r in rows}, key=_natural) for name in FILTERS}

    def _all(self) -> list[EpisodeRow]:
        """Every episode's row, read from the index once per length of the indexed log (a
        finished run's once; a live run's again after it grew). An episode without an end in
        a run no longer written is "unfinished", not "running" (a run stopped or killed)."""
        rows = self._rebuilt_if_damaged(self._rows_now)
        if self.status() == "live":
            return rows
        return [replace(r, outcome=UNFINISHED) if r.outcome == "running" else r for r in rows]

    def _rows_now(self) -> list[EpisodeRow]:
        upto = self.index.upto
        if self._rows[0] != upto:
            rows = assigned(self.index)
            names = [ep for ep, _ in rows]
            ends = outcomes(self.index, names)
            played = versions(self.index, names)
            out = [_row(ep, a, e, v) for (ep, a), e, v in zip(rows, ends, played, strict=True)]
            self._rows = (upto, sorted(out, key=lambda r: r.index))
        return self._rows[1]

    def episode(self, episode: str) -> tuple[EpisodeAudit, dict[int, list[Candidate]]]:
        """The audit of ``episode`` and, per turn of a "score" policy, its candidates.

        Raises:
            AuditQueryInvalid: the run has no such episode.
        """
        return self._rebuilt_if_damaged(
            lambda: (audit_episode(self.log, self.index, episode), self._candidates(episode))
        )

    def entry(self, tip: str) -> TipAudit:
        """The audit of bank entry ``tip``.

        Raises:
            AuditQueryInvalid: ``tip`` is not an entry id, or the run never stored it.
        """
        number = entry_id(tip)
        return self._rebuilt_if_damaged(lambda: audit_tip(self.log, self.index, number))

    def _whole_index(self) -> FactIndex:
        """The index, built again from the log first when its file no longer holds every
        page of its last commit (cut while served: its mapped pages killed the process with
        SIGBUS, as a cut log's did), or is gone."""
        index = self.index
        if isinstance(index, LmdbFactIndex):
            state = _file_state(index.path / DATA_FILE)
            if state is None or not state.whole:
                cut = IndexDamaged(f"{index.path / DATA_FILE} was cut or removed while served")
                self.index, self.note = rebuilt_index(self.root, self.log, index, cut)
                self._rows = (-1, [])
        return self.index

    def _rebuilt_if_damaged(self, ask: Callable[[], T]) -> T:
        """``ask()``; when it meets a damaged fact (:class:`IndexDamaged`), the index is
        removed and built again from the log, and ``ask()`` runs once more."""
        try:
            return ask()
        except IndexDamaged as exc:
            if not isinstance(self.index, LmdbFactIndex):
                raise
            self.index, self.note = rebuilt_index(self.root, self.log, self.index, exc)
            self._rows = (-1, [])
        return ask()

    def _candidates(self, episode: str) -> dict[int, list[Candidate]]:
        attempt, _ = last_attempt(refs(self.index, "e", episode))
        seqs = [s for s, kind in attempt if kind in _TURN_KINDS]
        asked: dict[int, ActionRequested] = {}
        out: dict[int, list[Candidate]] = {}
        for env in fetch(self.log, seqs).values():
            ev = env.event
            if isinstance(ev, ActionRequested):
                asked[ev.turn] = ev
            elif isinstance(ev, ActionSampled) and ev.candidate_scores and ev.turn in asked:
                probs = _softmax(ev.candidate_scores, ev.temperature or 1.0)
                actions = asked[ev.turn].admissible
                out[ev.turn] = [
                    Candidate(a, p, i == ev.choice)
                    for i, (a, p) in enumerate(zip(actions, probs, strict=False))
                ]
        return out


_TURN_KINDS = frozenset({"action_requested", "action_sampled"})


@dataclass(frozen=True)
class _FileState:
    """What the run's log file is, read from the file itself (not through LMDB's map)."""

    identity: tuple[int, int]  # device, inode
    size: int
    txnid: int  # the newest commit its meta pages record (-1: none readable)
    need: int  # the bytes that commit's pages take
    written: int = 0  # its mtime in ns: another log of the same size and commit copied over

    @property
    def whole(self) -> bool:
        """Whether the file holds every page of its newest commit."""
        return self.txnid >= 0 and self.size >= self.need


def _file_state(path: Path) -> _FileState | None:
    """The state of the LMDB data file at ``path`` (a log's, an index's), or None when it is
    not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    metas = [m for m in read_metas(path) if m is not None and m.valid]
    newest = max(metas, key=lambda m: m.txnid, default=None)
    if newest is None:
        return _FileState((st.st_dev, st.st_ino), st.st_size, -1, 0, st.st_mtime_ns)
    need = (newest.last_pgno + 1) * newest.psize
    return _FileState((st.st_dev, st.st_ino), st.st_size, newest.txnid, need, st.st_mtime_ns)


def _continues(before: _FileState, now: _FileState) -> bool:
    """Whether ``now`` can be the file ``before`` was, committed further: the same file,
    whole, no older, and no shorter than the pages read before."""
    return (
        now.identity == before.identity
        and now.whole
        and now.txnid >= before.txnid
        and now.size >= before.need
    )


def _run_id(log: Any) -> str:
    meta = log.read_meta()
    return meta.run_id if meta is not None else ""


def _row(ep: str, a: Assigned, end: Outcome | None, version: int | None) -> EpisodeRow:
    if end is None:
        outcome, score, steps = "running", None, None
    elif end.aborted:
        outcome, score, steps = "aborted", None, None
    else:
        outcome = "success" if end.success else "failure"
        score, steps = end.score, end.steps
    return EpisodeRow(
        episode=ep,
        index=a.index,
        family=a.family,
        variant=a.variant,
        split=a.split,
        purpose=a.purpose,
        rollout=a.rollout,
        version="-" if version is None or version < 0 else str(version),  # -1: scripted
        outcome=outcome,
        score=score,
        steps=steps,
        scope=a.scope,
    )


def _softmax(scores: tuple[float, ...], temperature: float) -> list[float]:
    """``softmax(scores / temperature)``, as the policy sampled (``agents.models.policy``)."""
    scaled = [s / temperature for s in scores]
    top = max(scaled)
    weights = [math.exp(s - top) for s in scaled]
    total = math.fsum(weights)
    return [w / total for w in weights]


def _natural(text: str) -> tuple[int, str]:
    return (int(text), "") if re.fullmatch(r"-?[0-9]+", text) else (1 << 60, text)


def filter_key(value: str) -> str:
    """What a filter's list sends for ``value``: the value itself, or, for one a page shows
    escaped (a family holding ESC or NUL), Python's ``ascii()`` of it, quotes and all, which
    no other value shares (``esc\\x1b`` written with a backslash is another family)."""
    return value if safe_line(value) == value else ascii(value)


def _named(value: str, wanted: str) -> bool:
    """Whether a filter's ``wanted`` names ``value``: as it is, or as its list sends it
    (:func:`filter_key`)."""
    return value == wanted or filter_key(value) == wanted
