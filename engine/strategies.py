"""Hypothesis strategies for every registered event type, derived from its msgspec schema.

``event_strategy(cls)`` reads the class's fields with :func:`msgspec.inspect.type_info` (types,
``Literal`` values, ``Meta`` bounds) and builds each from a strategy of its type, so a plug-in's
own events (registered with :func:`engine.events.event`, found through ``coevo.events``) get
strategies with no extra code. A field of a type with no derivation (a ``Decimal``, a custom
type) needs :func:`register_strategy`; :func:`strategy_gaps` lists the registered event types
that still lack one (coevo's tests assert it is empty, so a new event type cannot go without).

Needs Hypothesis, an optional extra: ``pip install 'coevo[testing]'``. ``coevo check`` and the
invariants do not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import msgspec
import msgspec.inspect as mi

try:
    from hypothesis import strategies as st
except ModuleNotFoundError:  # the optional extra: say how to get it, in one line
    raise ModuleNotFoundError(
        "coevo's strategies need Hypothesis: pip install 'coevo[testing]'"
    ) from None

from engine.errors import EventInvalid
from engine.events import Envelope, Event, checks_itself, event_types, unrecordable_reason

__all__ = [
    "envelopes_of",
    "event_strategy",
    "events",
    "register_strategy",
    "strategy_for",
    "strategy_gaps",
]

INT64 = (-(2**63), 2**63 - 1)
MAX_TEXT = 20
MAX_ITEMS = 4

_CLASSES: dict[type[Event], st.SearchStrategy[Any]] = {}
_FIELDS: dict[tuple[type[Event], str], st.SearchStrategy[Any]] = {}


def register_strategy(
    cls: type[Event], strategy: st.SearchStrategy[Any] | None = None, **fields: Any
) -> None:
    """Register how to draw ``cls``: a whole strategy, or strategies for some of its fields
    (the other fields keep their derived ones).

    Raises:
        TypeError: a field name ``cls`` does not have.
    """
    if strategy is not None:
        _CLASSES[cls] = strategy
    names = {f.name for f in msgspec.structs.fields(cls)}
    for name, field_strategy in fields.items():
        if name not in names:
            raise TypeError(f"{cls.__name__} has no field {name!r}")
        _FIELDS[(cls, name)] = field_strategy


def strategy_for(t: mi.Type, where: str = "a field") -> st.SearchStrategy[Any]:
    """A strategy of values of the msgspec type ``t``, within its bounds.

    Raises:
        TypeError: a type with no derivation (``where`` names it in the message).
    """
    if isinstance(t, mi.IntType):
        low = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else INT64[0])
        high = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else INT64[1])
        if t.multiple_of is not None:  # the multiples within the bounds
            m = t.multiple_of
            return st.integers(-(-low // m), high // m).map(lambda k: k * m)
        return st.integers(low, high)
    if isinstance(t, mi.FloatType):
        if t.multiple_of is not None:
            raise TypeError(
                f"{where}: no strategy for a float that must be a multiple of "
                f"{t.multiple_of}; register one with engine.strategies.register_strategy"
            )
        return st.floats(
            min_value=t.ge if t.ge is not None else t.gt,
            max_value=t.le if t.le is not None else t.lt,
            exclude_min=t.gt is not None,
            exclude_max=t.lt is not None,
            allow_nan=False,
        )
    if isinstance(t, mi.StrType):
        low = t.min_length or 0
        if t.pattern is not None:  # the pattern's strings, within the length bounds too
            high = t.max_length
            return st.from_regex(t.pattern, fullmatch=True).filter(
                lambda s: len(s) >= low and (high is None or len(s) <= high)
            )
        return st.text(min_size=low, max_size=max(low, t.max_length or MAX_TEXT))
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.BytesType):  # within its length bounds, as text is
        low = t.min_length or 0
        return st.binary(min_size=low, max_size=max(low, t.max_length or MAX_TEXT))
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.UnionType):
        return st.one_of([strategy_for(u, where) for u in t.types])
    if isinstance(t, mi.TupleType):
        return st.tuples(*(strategy_for(u, where) for u in t.item_types))
    if isinstance(t, mi.VarTupleType | mi.ListType):
        items = st.lists(
            strategy_for(t.item_type, where),
            min_size=t.min_length or 0,
            max_size=max(t.min_length or 0, t.max_length or MAX_ITEMS),
        )
        return items.map(tuple) if isinstance(t, mi.VarTupleType) else items
    if isinstance(t, mi.DictType):
        return st.dictionaries(
            strategy_for(t.key_type, where),
            strategy_for(t.value_type, where),
            min_size=t.min_length or 0,
            max_size=max(t.min_length or 0, t.max_length or MAX_ITEMS),
        )
    if isinstance(t, mi.StructType):
        return _struct(t, t.cls.__name__)
    raise TypeError(
        f"{where}: no strategy for {type(t).__name__}; register one with "
        "engine.strategies.register_strategy"
    )


def _struct(info: mi.StructType, name: str) -> st.SearchStrategy[Any]:
    cls: Any = info.cls
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in info.fields:
        own = _FIELDS.get((cls, f.name))
        fields[f.name] = own if own is not None else strategy_for(f.type, f"{name}.{f.name}")
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


def event_strategy(cls: type[Event], **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Event]:
    """Events of class ``cls``: every field drawn from its schema (or as registered), those
    named in ``fields`` from the strategies given.

    Raises:
        TypeError: fields with no derivation and no registered strategy (each named).
    """
    given = cast("object", cls)  # the signature says an event class; a user may pass anything
    if not (isinstance(given, type) and issubclass(given, Event)):
        raise TypeError(f"event_strategy takes an event class, got {cls!r}")
    if not fields and cls in _CLASSES:
        return _CLASSES[cls]
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    names = {f.name for f in info.fields}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {', '.join(map(repr, unknown))}")
    drawn: dict[str, st.SearchStrategy[Any]] = {}
    missing: list[str] = []  # every field without one, not only the first
    for f in info.fields:
        given = fields.get(f.name, _FIELDS.get((cls, f.name)))
        try:
            drawn[f.name] = (
                given if given is not None else strategy_for(f.type, f"{cls.__name__}.{f.name}")
            )
        except TypeError as exc:
            missing.append(str(exc))
    if missing:
        raise TypeError("; ".join(missing))
    made = st.fixed_dictionaries(drawn).map(lambda kw: cls(**cls.made_recordable(kw)))
    given_by = {**{n: s for (c, n), s in _FIELDS.items() if c is cls}, **fields}
    if not given_by:
        return made  # derived from the schema: of its types
    return made.map(lambda ev: _recordable_draw(ev, sorted(given_by)))


def _recordable_draw(ev: Event, given: list[str]) -> Event:
    """``ev`` if its fields decode as their types and bounds and it says nothing against
    itself (:meth:`Event.unrecordable`); a strategy given for a field drew a value of another
    type (``slot=st.just(3)`` for a str), or out of the field's bounds, without a word.

    Raises:
        ValueError: naming the fields whose strategies were given, and why.
    """
    cls = type(ev)
    try:
        msgspec.msgpack.decode(msgspec.msgpack.encode(ev), type=cls)
        why = unrecordable_reason(ev) if checks_itself(cls) else ""
    except (
        TypeError, OverflowError, msgspec.EncodeError, msgspec.ValidationError, EventInvalid
    ) as exc:  # fmt: skip
        why = str(exc)
    if why:
        raise ValueError(
            f"event_strategy({cls.__name__}, {', '.join(given)}=...) drew an event the log "
            f"cannot record: {why}"
        )
    return ev


def strategy_gaps(classes: Iterable[type[Event]] | None = None) -> dict[str, str]:
    """The event classes (default: every registered one) that no strategy can be derived or
    registered for, each with why."""
    gaps: dict[str, str] = {}
    for cls in classes if classes is not None else event_types().values():
        try:
            event_strategy(cls)
        except TypeError as exc:
            gaps[cls.__name__] = str(exc)
    return gaps


def events(kinds: Sequence[type[Event]] | None = None) -> st.SearchStrategy[Event]:
    """Any event of ``kinds`` (default: every registered event type)."""
    classes = (
        list(kinds)
        if kinds is not None
        else sorted(event_types().values(), key=lambda c: str(c.__struct_config__.tag))
    )
    return st.one_of([event_strategy(cls) for cls in classes])


def envelopes_of(
    events: Sequence[Event], *, run: str = "r", causes: Mapping[int, int] | None = None
) -> list[Envelope[Event]]:
    """``events`` as a stream numbered from 0 (``causes``: seq -> the seq it answers)."""
    causes = causes or {}
    return [
        Envelope(seq=i, run=run, t=i, actor="a", event=ev, cause=causes.get(i), v=ev.version)
        for i, ev in enumerate(events)
    ]
