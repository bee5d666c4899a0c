"""Invariants: named, reusable checks over any event stream (a live run's, a recorded log, a
generated one), and the registry that plug-ins add theirs to.

An invariant is a pure fold over envelopes in seq order that raises :class:`InvariantViolated`
at the first event breaking it, naming the events involved. One instance checks one pass over
one stream: :meth:`Invariant.check_many` takes the next envelopes (a log's chunks, a generated
list, what a live run committed so far), :meth:`Invariant.finish` says the stream ended (what
must be answered by the end of a completed run is owed only then). Every invariant is also a
fact check of ``coevo replay --verify`` (:func:`engine.replay.verify_log`).

Invariants register by name with :func:`invariant`: the engine's own here (``sessions``), the
domain's in ``agents.invariants``, a plug-in's in its own module, found through the
``coevo.invariants`` entry-point group or imported with the method or world that defines it.
A registration may be scoped to runs of some methods or worlds (an invariant of EMPO2's
memory means nothing for a rollout), or need the run's scenario (``credit`` re-derives under
the run's settings); :func:`select` picks what applies to a run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol

import msgspec

from engine.errors import CoevoError, LogInconsistent
from engine.eventlog import EventLog, RunMeta, joined_chunks
from engine.events import Envelope, Event, load_event_modules
from engine.lifecycle import RunFailed, RunResumed, RunStarted, RunStopped

__all__ = [
    "CheckContext",
    "CheckReport",
    "Invariant",
    "InvariantBroken",
    "InvariantUncheckable",
    "InvariantViolated",
    "Registered",
    "Sessions",
    "Violation",
    "check_log",
    "check_stream",
    "completed",
    "invariant",
    "registered",
    "select",
]


class InvariantBroken(CoevoError):
    """An invariant raised something other than a violation (a plug-in's invariant with a
    bug): nothing is known about the run from it, and the check stops in one line that names
    it (exit 1)."""

    exit_code = 1

    def __init__(self, invariant: str, exc: BaseException) -> None:
        self.invariant = invariant
        super().__init__(
            f"invariant {invariant} raised {type(exc).__name__}: {exc} (a bug in the "
            "invariant, not a finding about the run)"
        )


class InvariantUncheckable(InvariantBroken):
    """An invariant found, as it checked, that it cannot judge this run: code the run's events
    are re-derived with fails on them now (a plug-in method's ``score`` that raises or answers
    NaN). Not a finding about the log, nor a bug in the invariant (its message is its own,
    not its parent's): ``coevo check`` and ``replay --verify`` leave the invariant out with
    why (:func:`check_all`'s ``uncheckable``); where nothing can be left out (the stateful
    harness), it stops the check as its parent does."""

    def __init__(self, invariant: str, why: str) -> None:
        self.invariant = invariant
        self.why = why
        CoevoError.__init__(self, f"invariant {invariant}: not checked: {why}")


def check_all(
    invariants: Sequence[Any],
    chunk: Sequence[Envelope[Event]] | None,
    done: bool,
    uncheckable: list[tuple[str, str]] | None = None,
) -> Sequence[Any]:
    """``check_many(chunk)`` of each of ``invariants`` (None: ``finish(done)``). A violation
    (or another inconsistency of the log) goes on as it is; anything else an invariant raises
    is :class:`InvariantBroken` naming it (a ``try`` costs nothing until it catches). With
    ``uncheckable``, an invariant that finds it cannot judge the run
    (:class:`InvariantUncheckable`) is noted there (its name, and why) and the others go on.

    Returns:
        The invariants to go on with: ``invariants`` less those noted in ``uncheckable``.

    Raises:
        InvariantBroken: so (or :class:`InvariantUncheckable`, without ``uncheckable``).
    """
    dropped: list[Any] = []
    for inv in invariants:
        try:
            if chunk is None:
                inv.finish(done)
            else:
                inv.check_many(chunk)
        except LogInconsistent:
            raise
        except InvariantUncheckable as exc:
            if uncheckable is None:
                raise
            uncheckable.append((exc.invariant, exc.why))
            dropped.append(inv)
        except (Exception, SystemExit) as exc:
            raise InvariantBroken(str(getattr(inv, "name", type(inv).__name__)), exc) from exc
    return [i for i in invariants if all(i is not d for d in dropped)] if dropped else invariants


class InvariantViolated(LogInconsistent):
    """An invariant does not hold at ``seq``: the log's records are intact and may verify, but
    its events contradict what the invariant says (a fact twice, a request never answered, a
    version chain broken). ``involved`` are the seqs of the events that show it, ``seq`` among
    them; ``detail`` is the message without the invariant's name. Unlike its parent
    :class:`LogInconsistent`, it names the invariant, so ``coevo check`` can say which."""

    def __init__(self, invariant: str, seq: int, detail: str, involved: Iterable[int] = ()) -> None:
        self.invariant = invariant
        self.detail = detail
        self.involved = tuple(sorted({seq, *involved}))
        super().__init__(seq, f"{invariant}: {detail}")


class Invariant(Protocol):
    """A check over a stream's envelopes in seq order. Pure: no I/O, no clock."""

    name: str

    def check_many(self, envs: Sequence[Envelope[Event]]) -> None:
        """Take the next envelopes, in order.

        Raises:
            InvariantViolated: one of them breaks the invariant.
        """
        ...

    def finish(self, completed: bool) -> None:
        """The stream ended; ``completed``: it ends with ``run_stopped(completed)``, so whatever
        a run owes by its end must be there.

        Raises:
            InvariantViolated: something owed is missing.
        """
        ...


@dataclass(frozen=True)
class CheckContext:
    """What an invariant may know of the run besides its events.

    Attributes:
        meta: the run's metadata (None: a generated stream).
        scenario: the run's validated scenario (the scenario layer's ``Scenario``; None when
            there is none). Typed loosely: the engine does not know the schema.
        method: the scenario's ``run.method`` ("" when unknown).
        world: the scenario's ``world.name`` ("" when unknown).
        built_on: the built-in method a plug-in ``method`` subclasses without replacing its
            actors (its memory; "" for none): invariants for that method apply to it too.
    """

    meta: RunMeta | None = None
    scenario: Any = None
    method: str = ""
    world: str = ""
    built_on: str = ""


Factory = Callable[[CheckContext], Invariant]


@dataclass(frozen=True)
class Registered:
    """A registered invariant: its name, what builds a fresh instance, what it is about, and
    the methods and worlds whose runs it applies to (empty: every run)."""

    name: str
    factory: Factory
    doc: str
    methods: frozenset[str] = frozenset()
    worlds: frozenset[str] = frozenset()
    needs_scenario: bool = False

    def why_not(self, ctx: CheckContext) -> str:
        """Why it does not apply to ``ctx``'s run (one short phrase; empty when it does)."""
        if self.needs_scenario and ctx.scenario is None:
            return "needs the run's scenario (its settings)"
        unknown = "unknown: its log records no scenario"  # (a log written through the API)
        if self.methods and ctx.method not in self.methods and ctx.built_on not in self.methods:
            method = f", not {ctx.method}" if ctx.method else f"; the run's method is {unknown}"
            return f"for methods {', '.join(sorted(self.methods))}{method}"
        if self.worlds and ctx.world not in self.worlds:
            world = f", not {ctx.world}" if ctx.world else f"; the run's world is {unknown}"
            return f"for worlds {', '.join(sorted(self.worlds))}{world}"
        return ""


_REGISTRY: dict[str, Registered] = {}
_ENTRY_POINT_GROUP = "coevo.invariants"
_loaded = False


def invariant(
    name: str,
    *,
    methods: Iterable[str] = (),
    worlds: Iterable[str] = (),
    needs_scenario: bool = False,
) -> Callable[[Any], Any]:
    """Decorator: register ``name``, built by the decorated callable from a
    :class:`CheckContext` (a class whose ``__init__`` takes the context works as is).

    Args:
        name: what ``coevo check --invariant`` calls it.
        methods: apply only to runs of these ``run.method`` values (empty: any).
        worlds: apply only to runs of these ``world.name`` values (empty: any).
        needs_scenario: apply only where the run's scenario is known (its settings).

    Raises:
        ValueError: another callable already registered ``name``.
    """

    def register(factory: Any) -> Any:
        other = _REGISTRY.get(name)
        if other is not None and _origin(other.factory) != _origin(factory):
            raise ValueError(f"invariant {name!r} registered twice")
        doc = (getattr(factory, "__doc__", None) or "").strip().split("\n\n")[0]
        _REGISTRY[name] = Registered(
            name,
            factory,
            " ".join(doc.split()),
            frozenset(methods),
            frozenset(worlds),
            needs_scenario,
        )
        return factory

    return register


def _origin(factory: Any) -> tuple[str, str]:
    """Where ``factory`` was defined: a module imported again registers again, and is the same."""
    return (getattr(factory, "__module__", ""), getattr(factory, "__qualname__", repr(factory)))


def registered() -> Mapping[str, Registered]:
    """Every registered invariant by name, after importing the ``coevo.invariants`` entry points
    (once; coevo's own domain invariants are one of them). One that does not import is left
    out, said by :func:`unloaded`."""
    global _loaded
    if not _loaded:
        load_event_modules()
        _loaded = True  # once, even when one fails: its note is not repeated
        for ep in entry_points(group=_ENTRY_POINT_GROUP):
            try:
                importlib.import_module(ep.value)
            except (Exception, SystemExit) as exc:  # a broken plug-in must not stop every check
                _UNLOADED.append(
                    f"the {_ENTRY_POINT_GROUP} entry point {ep.name!r} ({ep.value}) could not "
                    f"be imported ({type(exc).__name__}: {exc}): its invariants are not checked"
                )
    return dict(_REGISTRY)


_UNLOADED: list[str] = []


def unloaded() -> list[str]:
    """A line per ``coevo.invariants`` entry point that :func:`registered` could not import."""
    registered()
    return list(_UNLOADED)


def select(ctx: CheckContext, names: Sequence[str] = ()) -> tuple[list[Registered], list[str]]:
    """The invariants to run on ``ctx``'s run: ``names`` exactly when given, else every
    registered one that applies.

    Returns:
        The invariants, and one line per registered invariant left out, saying why.

    Raises:
        KeyError: a name that is not registered (the message lists the known ones).
    """
    known = registered()
    if names:
        missing = [n for n in names if n not in known]
        if missing:
            raise KeyError(f"unknown invariant {missing[0]!r}; known: {', '.join(sorted(known))}")
        return [known[n] for n in dict.fromkeys(names)], []
    chosen = [r for r in known.values() if not r.why_not(ctx)]
    skipped = [f"{r.name}: {r.why_not(ctx)}" for r in known.values() if r.why_not(ctx)]
    return chosen, skipped


# --- running them ------------------------------------------------------------------------------


class Violation(msgspec.Struct, frozen=True, kw_only=True):
    """The first event of a stream that breaks an invariant, and the events that show it."""

    invariant: str
    seq: int
    message: str
    involved: tuple[int, ...]


class CheckReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a pass checked: the events (up to the violation, if any), the invariants run (and
    those left out, with why), whether the stream ends with its run's completion, and the
    first violation (None: every invariant held)."""

    events: int
    invariants: tuple[str, ...]
    skipped: tuple[str, ...] = ()
    completed: bool = False
    violation: Violation | None = None
    uncheckable: tuple[str, ...] = ()
    """Invariants that found, as they checked, that they cannot judge this stream ("NAME:
    why", :class:`InvariantUncheckable`); not among :attr:`invariants`."""

    @property
    def ok(self) -> bool:
        return self.violation is None


def completed(env: Envelope[Event] | None) -> bool:
    """Whether ``env``, a stream's last envelope, records its run's completion."""
    ev = None if env is None else env.event
    return isinstance(ev, RunStopped) and ev.reason == "completed"


def check_stream(
    chunks: Iterable[Sequence[Envelope[Event]]],
    invariants: Sequence[Invariant],
    *,
    skipped: Sequence[str] = (),
    ended: bool = True,
) -> CheckReport:
    """Run ``invariants`` (fresh instances) over ``chunks`` in order; stop at the first
    violation.

    Args:
        chunks: the stream, in seq order, in pieces of any size (a list of envelopes is one).
        invariants: what to check.
        skipped: what was left out, reported as is.
        ended: call :meth:`Invariant.finish` after the last chunk (False: a live stream that
            goes on; only what its events so far contradict is reported).
    """
    names = tuple(i.name for i in invariants)
    count, last, first = 0, None, 0
    late: list[tuple[str, str]] = []  # invariants that found they cannot judge the run
    active = invariants
    try:
        for chunk in joined_chunks(chunks):
            if not chunk:
                continue
            if last is None:
                first = chunk[0].seq
            _check_numbering(chunk, first if last is None else last.seq + 1)
            active = check_all(active, chunk, False, late)
            count += len(chunk)
            last = chunk[-1]
        done = completed(last)
        if ended:
            check_all(active, None, done, late)
    except InvariantViolated as exc:
        violation = Violation(
            invariant=exc.invariant, seq=exc.seq, message=exc.detail, involved=exc.involved
        )
        read = max(count, exc.seq + 1 - first)  # up to the violation (or the stream's end)
        return _report(read, names, skipped, late, violation=violation)
    return _report(count, names, skipped, late, completed=done)


def _report(
    events: int,
    names: Sequence[str],
    skipped: Sequence[str],
    late: list[tuple[str, str]],
    **outcome: Any,
) -> CheckReport:
    """A pass's report: the invariants that found they cannot judge the stream (``late``)
    are listed apart from those checked."""
    return CheckReport(
        events=events,
        invariants=tuple(n for n in names if n not in dict(late)),
        skipped=tuple(skipped),
        uncheckable=tuple(f"{n}: {why}" for n, why in late),
        **outcome,
    )


def _check_numbering(chunk: Sequence[Envelope[Event]], expected: int) -> None:
    """The stream's own order, whatever the invariants: consecutive seqs, and each cause an
    earlier event (a log's reader refuses seqs out of order; a stream built in memory may hold
    them, and an envelope written through the API any cause).

    Raises:
        InvariantViolated: as ``numbering``, at the first envelope out of order.
    """
    for seq, env in enumerate(chunk, expected):
        if env.seq != seq:
            raise InvariantViolated(
                "numbering", env.seq, f"seq {env.seq} where seq {seq} comes next (seqs follow "
                "one another in a stream)", (env.seq,),
            )  # fmt: skip
        if env.cause is not None and not 0 <= env.cause < seq:
            raise _not_earlier(seq, env.cause)


def check_causes(chunk: Sequence[Envelope[Event]]) -> None:
    """Each envelope's cause an earlier event: what ``numbering`` checks beyond the seqs a
    log's reader already holds in order (``replay --verify``).

    Raises:
        InvariantViolated: as ``numbering``, at the first envelope whose cause is not.
    """
    for env in chunk:
        if (cause := env.cause) is not None and not 0 <= cause < env.seq:
            raise _not_earlier(env.seq, cause)


def _not_earlier(seq: int, cause: int) -> InvariantViolated:
    return InvariantViolated(
        "numbering", seq, f"its cause is seq {cause}, not an earlier event", (seq, cause)
    )


def check_log(
    log: EventLog, ctx: CheckContext | None = None, names: Sequence[str] = ()
) -> CheckReport:
    """Check ``log`` (up to its end as of now) against ``names``, or every invariant that
    applies to ``ctx``'s run (:func:`select`; without ``ctx``, the engine knows no scenario,
    so the invariants scoped to methods or worlds are left out: ``coevo check`` and
    ``scenarios.checks.check_context`` make a run's context from its scenario).

    Raises:
        KeyError: an unknown name.
        LogCorrupted: a damaged record (the records before it were checked).
    """
    ctx = ctx or CheckContext(meta=log.read_meta())
    chosen, skipped = select(ctx, names)
    return check_stream(
        log.read_chunks(0, log.next_seq), [r.factory(ctx) for r in chosen], skipped=skipped
    )


# --- the engine's own --------------------------------------------------------------------------


@invariant("sessions")
@dataclass
class Sessions:
    """Sessions follow one another: ``run_started`` only at seq 0; a session ends with
    ``run_stopped`` or ``run_failed`` and only a ``run_resumed`` right after it (``after`` its
    seq, ``previous`` its kind) may follow; nothing follows ``run_stopped(completed)``; each
    ``run_resumed`` is the first event of its session, right after the previous session's last
    event (so no two resume after one seq). A second writer that read a stale log breaks this.
    """

    ctx: CheckContext | None = None
    name: str = "sessions"
    _completed: int | None = None
    _ended: Envelope[Event] | None = None
    _resumed: dict[int, int] = field(default_factory=dict[int, int])

    def check_many(self, envs: Sequence[Envelope[Event]]) -> None:
        for env in envs:
            if self._completed is not None:
                raise InvariantViolated(
                    self.name,
                    env.seq,
                    f"an event after the run completed (run_stopped at seq {self._completed})",
                    (self._completed,),
                )
            ev = env.event
            kind = type(ev)
            if self._ended is not None and kind is not RunResumed:
                raise InvariantViolated(
                    self.name,
                    env.seq,
                    f"{_tag(ev)} after the session ended at seq {self._ended.seq} (only a "
                    "run_resumed may follow)",
                    (self._ended.seq,),
                )
            if kind not in _SESSION_EVENTS:  # the common case, by exact type
                continue
            if kind is RunStarted and env.seq != 0:
                raise InvariantViolated(
                    self.name, env.seq, "run_started again (the run started at seq 0)"
                )
            if isinstance(ev, RunResumed):
                self._resumed_at(env, ev)
            elif isinstance(ev, RunStopped) and ev.reason == "completed":
                self._completed = env.seq
            elif isinstance(ev, RunStopped | RunFailed):
                self._ended = env

    def _resumed_at(self, env: Envelope[Event], ev: RunResumed) -> None:
        seq, after = env.seq, ev.after
        if after in self._resumed:
            first = self._resumed[after]
            raise InvariantViolated(
                self.name,
                seq,
                f"a second run_resumed after seq {after} (the first at seq {first}): two "
                "sessions wrote from the same state",
                (first,),
            )
        if after + 1 != seq:
            raise InvariantViolated(
                self.name,
                seq,
                f"run_resumed after seq {after} is not the first event of its session (the "
                "session read a log that had changed since)",
            )
        ended = self._ended
        previous = _tag(ended.event) if ended is not None else ""
        if ev.previous and ev.previous != previous:
            raise InvariantViolated(
                self.name,
                seq,
                f"run_resumed says the session before ended with {ev.previous!r}, the log "
                f"with {previous or 'no final event'!r}",
                (after,),
            )
        self._resumed[after] = seq
        self._ended = None

    def finish(self, completed: bool) -> None:
        return None


_SESSION_EVENTS = frozenset({RunStarted, RunResumed, RunStopped, RunFailed})


def _tag(ev: Event) -> str:
    return str(ev.__struct_config__.tag)
