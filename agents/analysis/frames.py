"""A run's events, or the events of some kinds, as an Arrow table or a pandas / polars data
frame (docs/ANALYSIS.md). The log is read once, read-only (a live run can be read while it
writes: the table holds what was committed when the call began).

Every table has the envelope's columns ``seq``, ``time`` (a timestamp in ns, UTC, with no time
zone attached: pyarrow's conversion of a zoned column to pandas crashed the test suite's process
once, in ``string_to_tzinfo``), ``actor``, ``corr``, ``cause`` and ``kind``. Asked for kinds, it
has one column per field of those events (a field another kind lacks is null there; tuples are
lists; a field named as an envelope column, such as ``actor_started.actor``, is
``event_actor``; a field two kinds give values of types that do not fit one column, such as
``success``, a boolean in ``episode_finished`` and a rate in ``eval_round_finished``, is JSON
text: ask for one kind at a time to keep its type); asked for every kind, it has instead
one ``event`` column holding each event's fields as JSON text, since the kinds' fields do not
fit one schema.

The frame libraries are the ``frames`` extra (``pip install 'coevo[frames]'``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from engine.events import Envelope, Event, event_types

if TYPE_CHECKING:
    import pyarrow

__all__ = ["events_frame", "events_table", "read_events"]

_JSON = msgspec.json.Encoder()


def read_events(
    run: str | Path,
    kinds: str | Sequence[str] | None = None,
    *,
    start: int = 0,
    stop: int | None = None,
) -> Iterator[Envelope[Event]]:
    """The run's committed envelopes of ``kinds`` (all: None) from seq ``start`` to ``stop``
    (exclusive; None: the log's end when reading began), in seq order.

    Raises:
        RunNotFound: ``run`` is not a run directory.
        ValueError: a kind no event type has, or a ``start`` or ``stop`` that is no seq.
    """
    from agents.methods.registry import import_run_method
    from stores.lmdb_log import LmdbEventLog
    from stores.rundir import find_run

    for name, bound in (("start", start), ("stop", stop)):
        if bound is not None and (type(bound) is not int or bound < 0):  # a bool is no seq
            raise ValueError(f"{name} must be a seq (an int >= 0), got {bound!r}")
    log = LmdbEventLog.open(find_run(run).log, writable=False)
    try:
        import_run_method(log)  # a plug-in method's own events decode, and its kinds are known
        wanted = _kinds(kinds)
        end = log.next_seq if stop is None else min(stop, log.next_seq)
        for env in log.read(start, end):
            if wanted is None or env.event.__struct_config__.tag in wanted:
                yield env
    finally:
        log.close()


def events_table(
    run: str | Path,
    kinds: str | Sequence[str] | None = None,
    *,
    start: int = 0,
    stop: int | None = None,
) -> pyarrow.Table:
    """The run's events as an Arrow table (see the module's docstring for its columns).

    Raises:
        RunNotFound: ``run`` is not a run directory.
        ValueError: a kind no event type has.
    """
    import pyarrow as pa

    flat = kinds is not None
    columns: dict[str, list[Any]] = {name: [] for name in _HEAD}
    n = -1
    for n, env in enumerate(read_events(run, kinds, start=start, stop=stop)):
        fields = msgspec.to_builtins(env.event)
        del fields["kind"]
        values: dict[str, Any] = {
            "seq": env.seq,
            "time": env.t,
            "actor": env.actor,
            "corr": env.corr,
            "cause": env.cause,
            "kind": env.event.__struct_config__.tag,
        }
        if flat:
            values.update({_column(k): v for k, v in fields.items()})
        else:
            values["event"] = _JSON.encode(fields).decode()
        for name, value in values.items():
            column = columns.setdefault(name, [None] * n)  # a field earlier kinds lacked
            column.append(value)
        for column in columns.values():
            if len(column) <= n:  # a field this kind lacks
                column.append(None)
    if flat:  # every field of the kinds asked for, with rows or none (a kind never recorded)
        known = event_types()  # read_events imported the run's plug-in method by now
        for kind in sorted(_kinds(kinds) or ()):
            for f in msgspec.structs.fields(known[kind]):
                columns.setdefault(_column(f.name), [None] * (n + 1))
    if not flat:
        columns.setdefault("event", [])
    arrays = {name: _array(pa, name, values) for name, values in columns.items()}
    return pa.table(arrays)


_HEAD = ("seq", "time", "actor", "corr", "cause", "kind")


def _column(field: str) -> str:
    """The column of an event's field: ``event_NAME`` for a name the envelope's columns hold
    (``actor_started.actor``, the actor that started, is not the envelope's ``runtime``)."""
    return f"event_{field}" if field in _HEAD else field


def _array(pa: Any, name: str, values: list[Any]) -> Any:
    """One column: the envelope's with their fixed types; a field with its inferred type, or as
    JSON text where two kinds give it values of types that do not fit one Arrow type."""
    fixed = {
        "seq": pa.int64(),
        "time": pa.timestamp("ns"),  # UTC; no zone attached (see the module's docstring)
        "actor": pa.string(),
        "corr": pa.string(),
        "cause": pa.int64(),
        "kind": pa.string(),
        "event": pa.string(),
    }
    if name in fixed:
        return pa.array(values, type=fixed[name])
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else _JSON.encode(v).decode() for v in values])


def events_frame(
    run: str | Path,
    kinds: str | Sequence[str] | None = None,
    *,
    library: Literal["pandas", "polars"] = "pandas",
    start: int = 0,
    stop: int | None = None,
) -> Any:
    """The run's events as a pandas or polars data frame, through :func:`events_table`.

    Raises:
        RunNotFound: ``run`` is not a run directory.
        ValueError: a kind no event type has, or another ``library``.
    """
    if library not in ("pandas", "polars"):
        raise ValueError(f"library must be 'pandas' or 'polars', got {library!r}")
    table = events_table(run, kinds, start=start, stop=stop)
    if library == "pandas":
        return table.to_pandas()
    import polars as pl

    return pl.from_arrow(table)


def _kinds(kinds: str | Sequence[str] | None) -> frozenset[str] | None:
    if kinds is None:
        return None
    wanted = frozenset([kinds] if isinstance(kinds, str) else kinds)
    known = event_types()
    unknown = sorted(wanted - known.keys())
    if unknown:
        raise ValueError(
            f"no event kind {', '.join(map(repr, unknown))}; kinds: {', '.join(sorted(known))}"
        )
    return wanted
