"""Events, their envelope, and the one codec that turns both into stored bytes.

An *event* is a past-tense fact: a frozen msgspec Struct in one tagged union whose tag is given
explicitly per class (``tag="episode_finished"``), so renaming a class never changes stored bytes.
Each event class carries a schema ``version``; when the meaning of a class changes, its version
is bumped and an upcaster ``dict -> dict`` from the old version is registered with
:func:`upcaster`. Old records are upcast on read, never rewritten.

A stored record is an :class:`Envelope` around one event: the sequence number, the run, the wall
time of emission, the emitting actor and the causation/correlation ids.

Event classes register themselves with :func:`event`. Modules that define events outside the
engine are found through the ``coevo.events`` entry-point group, so a log written by a plug-in
decodes wherever the plug-in is installed.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any, ClassVar, Generic, TypeVar, Union, cast

import msgspec

from engine.errors import EventInvalid, EventSchemaChanged, LogCorrupted, SchemaTooNew

__all__ = [
    "Codec",
    "Envelope",
    "Event",
    "event",
    "event_types",
    "upcaster",
]


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", gc=False):
    """Base of every event. Subclasses pass ``tag=...``, ``frozen=True``, ``kw_only=True``."""

    version: ClassVar[int] = 1

    def unrecordable(self) -> str:
        """What makes this event unfit for the log beyond its fields' types ("" when nothing):
        a subclass whose fields must agree with one another (parallel tuples of one length)
        says so here. ``Context.emit`` refuses an event that names something
        (:meth:`Codec.check`), and an invariant may ask it of a log written before. Never
        asked on decoding: a log that holds such an event stays readable."""
        return ""

    @classmethod
    def made_recordable(cls, fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` (values drawn one by one, by :func:`engine.strategies.event_strategy`)
        changed as little as needed for :meth:`unrecordable` to say nothing: a subclass that
        overrides one overrides both. As drawn by default."""
        return fields


E = TypeVar("E")


class Envelope(msgspec.Struct, Generic[E], frozen=True, kw_only=True, array_like=True, gc=False):
    """A stored record: one event and where it came from.

    Attributes:
        seq: position in the run's total order, contiguous from 0.
        run: the run id.
        t: wall-clock time of emission, ns since the epoch (informational, never folded).
        actor: name of the emitting actor ("runtime" for the engine itself).
        cause: seq of the event the actor was handling when it emitted this one, if any.
        corr: correlation id grouping related events (e.g. an episode id), "" if none.
        v: schema version of ``event``'s class when it was written.
        event: the event.
    """

    seq: int
    run: str
    t: int
    actor: str
    event: E
    cause: int | None = None
    corr: str = ""
    v: int = 1


_REGISTRY: dict[str, type[Event]] = {}
_UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}
_ENTRY_POINT_GROUP = "coevo.events"
_entry_points_loaded = False

EventT = TypeVar("EventT", bound=type[Event])


def checks_itself(cls: type[Event]) -> bool:
    """Whether events of ``cls`` say when they cannot be recorded (:meth:`Event.unrecordable`
    overridden, in any callable form: a cached method, a classmethod; a field of that name is
    no method)."""
    asked = getattr(cls, "unrecordable", None)
    return asked is not Event.unrecordable and callable(asked)


def unrecordable_reason(ev: Event) -> str:
    """``ev.unrecordable()``, its own failure named as its (a plug-in's check that raised
    read as the actor's own error; a non-str answer was taken for the reason).

    Raises:
        EventInvalid: the check raised or answered something other than a str.
    """
    tag = type(ev).__struct_config__.tag
    try:
        why = cast(object, ev.unrecordable())  # a plug-in's: any answer
    except Exception as exc:
        raise EventInvalid(f"{tag}: its unrecordable() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(why, str):
        raise EventInvalid(f'{tag}: its unrecordable() returned {why!r}, not a str ("": none)')
    return why


def event(cls: EventT) -> EventT:
    """Class decorator: register an event class in the union.

    Raises:
        TypeError: the class has no explicit tag, is not frozen, or reuses another class's tag.
    """
    config = cls.__struct_config__
    tag = config.tag
    if not isinstance(tag, str) or tag == cls.__name__:
        raise TypeError(f"event {cls.__name__} needs an explicit snake_case tag=...")
    if not config.frozen:
        raise TypeError(f"event {cls.__name__} must be frozen=True")
    other = _REGISTRY.get(tag)
    if other is not None and other is not cls:
        raise TypeError(f"event tag {tag!r} used by both {other.__name__} and {cls.__name__}")
    _REGISTRY[tag] = cls
    return cls


def upcaster(tag: str, from_version: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(dict) -> dict`` turning a ``tag`` event of ``from_version`` into the next."""

    def register(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[..., Any]:
        _UPCASTERS[(tag, from_version)] = fn
        return fn

    return register


def load_event_modules() -> None:
    """Import every module named in the ``coevo.events`` entry-point group (once)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    importlib.import_module("engine.lifecycle")
    _entry_points_loaded = True  # once, even when one fails: its warning is not repeated
    for ep in entry_points(group=_ENTRY_POINT_GROUP):
        try:
            importlib.import_module(ep.value)
        except (Exception, SystemExit) as exc:  # one broken plug-in must not stop every command
            print(
                f"coevo: warning: the {_ENTRY_POINT_GROUP} entry point {ep.name!r} "
                f"({ep.value}) could not be imported ({type(exc).__name__}: {exc}); a log "
                "holding its events cannot be read",
                file=sys.stderr,
            )


def event_types() -> dict[str, type[Event]]:
    """All registered event classes by tag (after loading the plug-in modules)."""
    load_event_modules()
    return dict(_REGISTRY)


def _recordable(cls: type) -> type[Event]:
    """``cls`` if the log can read its events back: an :class:`Event` class registered under
    its tag (the log decodes by tag; a class without ``@event`` is written, then unreadable).

    Raises:
        EventInvalid: it is not.
    """
    if not issubclass(cls, Event):
        raise EventInvalid(
            f"{cls.__qualname__} is not an event: only instances of Event classes registered "
            "with @event can be recorded"
        )
    tag = str(cls.__struct_config__.tag)
    if _REGISTRY.get(tag) is not cls:
        other = _REGISTRY.get(tag)
        why = f"tag {tag!r} belongs to {other.__qualname__}" if other else "it lacks @event"
        raise EventInvalid(
            f"{cls.__qualname__} cannot be recorded: {why} (the log reads events back by "
            "their registered tag)"
        )
    return cls


class Codec:
    """Encodes envelopes to msgpack and decodes them back, upcasting old event versions.

    One instance per process is enough (it is cheap to share and not thread-bound). The decoder
    is rebuilt when new event classes were registered since it was made.
    """

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._raw_decoder = msgspec.msgpack.Decoder(Envelope[msgspec.Raw])
        self._raw_list_decoder = msgspec.msgpack.Decoder(list[msgspec.Raw])
        self._body_decoder = msgspec.msgpack.Decoder(dict[str, Any])
        self._decoder: msgspec.msgpack.Decoder[Envelope[Event]] | None = None
        self._batch_decoder: msgspec.msgpack.Decoder[list[Envelope[Event]]] | None = None
        self._known = 0
        self._event_decoders: dict[type[Event], tuple[msgspec.msgpack.Decoder[Any], bool]] = {}

    def check(self, ev: Event) -> int:
        """Raise unless ``ev`` encodes and decodes back as its own class (about a microsecond
        for an event of a turn): what the log will be able to read.

        Returns:
            The size of ``ev`` encoded, in bytes (what the write buffer counts).

        Raises:
            EventInvalid: a field's value is not of its declared type, naming the field, or
                the event says it is malformed (:meth:`Event.unrecordable`).
        """
        cls = type(ev)
        known = self._event_decoders.get(cls)
        if known is None:
            decoder = msgspec.msgpack.Decoder(_recordable(cls))
            known = self._event_decoders[cls] = (decoder, checks_itself(cls))
        decoder, asks = known
        if asks and (why := unrecordable_reason(ev)):
            raise EventInvalid(f"{cls.__struct_config__.tag} cannot be recorded: {why}")
        try:
            encoded = self._encoder.encode(ev)
            decoder.decode(encoded)
        except (TypeError, OverflowError, msgspec.EncodeError) as exc:  # a numpy scalar, 2**70
            raise EventInvalid(f"{cls.__struct_config__.tag} cannot be recorded: {exc}") from None
        except msgspec.ValidationError as exc:
            raise EventInvalid(f"{cls.__struct_config__.tag} cannot be recorded: {exc}") from None
        return len(encoded)

    def encode(self, envelope: Envelope[Event]) -> bytes:
        """Encode one envelope (its ``v`` must already be the event class's version)."""
        return self._encoder.encode(envelope)

    def encode_batch(self, envelopes: Sequence[Envelope[Event]]) -> bytes:
        """Encode consecutive envelopes as one msgpack array (one stored record per commit)."""
        return self._encoder.encode(envelopes)

    def decode_batch(self, data: bytes | memoryview, first: int) -> list[Envelope[Event]]:
        """Decode a record written by :meth:`encode_batch` whose first envelope has seq ``first``.

        Raises:
            LogCorrupted: not an array of envelopes, or their seqs are not ``first, first+1, ..``.
            SchemaTooNew: an event kind or version newer than this code knows.
        """
        self._typed_decoder()
        assert self._batch_decoder is not None
        try:
            envs = self._batch_decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return self._decode_batch_slow(data, first)
        for offset, env in enumerate(envs):
            if env.seq != first + offset or env.v != env.event.version:
                return self._decode_batch_slow(data, first)
        return envs

    def decode_envelopes(self, data: bytes | memoryview) -> list[Envelope[Event]]:
        """Decode an array written by :meth:`encode_batch` whose seqs need not be contiguous
        (the envelopes delivered to one remote actor: a filtered part of the log).

        Raises:
            LogCorrupted: not an array of envelopes of known events.
            SchemaTooNew: an event kind or version newer than this code knows.
        """
        self._typed_decoder()
        assert self._batch_decoder is not None
        try:
            envs = self._batch_decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError):
            envs = None
        if envs is not None and all(env.v == env.event.version for env in envs):
            return envs
        try:
            raws = [bytes(raw) for raw in self._raw_list_decoder.decode(data)]
            seqs = [self._raw_decoder.decode(raw).seq for raw in raws]
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise LogCorrupted(-1, f"not an array of envelopes ({exc})") from None
        return [self.decode(raw, seq) for raw, seq in zip(raws, seqs, strict=True)]

    def _decode_batch_slow(self, data: bytes | memoryview, first: int) -> list[Envelope[Event]]:
        try:
            raws = self._raw_list_decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise LogCorrupted(first, f"record is not an array of envelopes ({exc})") from None
        return [self.decode(bytes(raw), first + i) for i, raw in enumerate(raws)]

    def decode(self, data: bytes | memoryview, seq: int) -> Envelope[Event]:
        """Decode one stored envelope whose key is ``seq``.

        Raises:
            LogCorrupted: the bytes are not an envelope of a known event, or carry another seq.
            SchemaTooNew: the event kind or version is newer than this code knows.
        """
        decoder = self._typed_decoder()
        try:
            env = decoder.decode(data)
            if env.v != env.event.version:
                env = self._decode_slow(data, seq)
        except (msgspec.ValidationError, msgspec.DecodeError):
            env = self._decode_slow(data, seq)
        if env.seq != seq:
            raise LogCorrupted(seq, f"record claims seq {env.seq}")
        return env

    def _typed_decoder(self) -> msgspec.msgpack.Decoder[Envelope[Event]]:
        if self._decoder is None or self._known != len(_REGISTRY):
            load_event_modules()
            union = Union[tuple(_REGISTRY.values())]  # noqa: UP007 - dynamic union
            self._decoder = msgspec.msgpack.Decoder(Envelope[union])  # pyright: ignore[reportInvalidTypeForm]
            self._batch_decoder = msgspec.msgpack.Decoder(list[Envelope[union]])  # pyright: ignore[reportInvalidTypeForm]
            self._known = len(_REGISTRY)
        return self._decoder

    def _decode_slow(self, data: bytes | memoryview, seq: int) -> Envelope[Event]:
        try:
            raw_env = self._raw_decoder.decode(data)
            body = self._body_decoder.decode(raw_env.event)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise LogCorrupted(seq, f"not an envelope ({exc})") from None
        kind = body.get("kind")
        if not isinstance(kind, str):
            raise LogCorrupted(seq, "event has no kind")
        cls = _REGISTRY.get(kind)
        if cls is None:
            raise SchemaTooNew(f"seq {seq}: unknown event kind {kind!r} (newer coevo or plug-in?)")
        body = upcast(kind, raw_env.v, cls.version, body, seq)
        try:
            ev = msgspec.convert(body, cls)
        except msgspec.ValidationError as exc:
            raise EventSchemaChanged(seq, f"{kind} v{raw_env.v} does not decode: {exc}") from None
        # replace keeps the type it was given, Envelope[Raw]; the event is decoded now
        return msgspec.structs.replace(raw_env, event=ev, v=cls.version)  # pyright: ignore[reportReturnType]


def upcast(kind: str, have: int, want: int, body: dict[str, Any], seq: int) -> dict[str, Any]:
    """Apply the registered upcasters to bring ``body`` from version ``have`` to ``want``.

    Raises:
        SchemaTooNew: ``have`` is newer than ``want``.
        LogCorrupted: an upcaster in the chain is missing.
    """
    if have > want:
        raise SchemaTooNew(f"seq {seq}: {kind} v{have} is newer than this coevo's v{want}")
    for version in range(have, want):
        step = _UPCASTERS.get((kind, version))
        if step is None:
            raise EventSchemaChanged(seq, f"no upcaster for {kind} v{version} -> v{version + 1}")
        try:
            body = step(body)
        except Exception as exc:  # an upcaster that cannot read this record
            raise EventSchemaChanged(
                seq, f"upcasting {kind} v{version} -> v{version + 1} failed: {exc!r}"
            ) from None
    return body
