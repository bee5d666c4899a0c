"""Stored bytes of every event type, frozen when the type was introduced: a log written by an
older coevo must keep decoding to the same facts after any change to the code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from engine.errors import LogCorrupted, SchemaTooNew
from engine.events import Codec, Envelope, Event, event, event_types, upcaster

FROZEN = json.loads((Path(__file__).parent.parent / "data" / "frozen_events_v1.json").read_text())
CODEC = Codec()


def project_event_tags() -> set[str]:
    return {tag for tag in event_types() if not tag.startswith("test_")}


def test_every_event_type_has_frozen_bytes() -> None:
    missing = project_event_tags() - set(FROZEN)
    assert not missing, f"add frozen samples for new event types: {sorted(missing)}"


def test_every_frozen_event_type_is_registered_by_the_entry_points() -> None:
    """A module missing from ``[project.entry-points."coevo.events"]`` (or stale install
    metadata) would make its logs unreadable by the CLI."""
    unregistered = set(FROZEN) - project_event_tags()
    assert not unregistered, f"not registered through coevo.events: {sorted(unregistered)}"


@pytest.mark.parametrize("tag", sorted(FROZEN))
def test_frozen_bytes_decode_to_the_same_facts(tag: str) -> None:
    sample = FROZEN[tag]
    env = CODEC.decode(bytes.fromhex(sample["hex"]), sample["seq"])
    assert env.event.__struct_config__.tag == tag
    decoded = json.loads(msgspec.json.encode(env.event))
    added = set(decoded) - set(sample["event"])
    assert {k: decoded[k] for k in sample["event"]} == sample["event"]
    # fields added since the bytes were frozen take their defaults
    info = {f.encode_name: f for f in msgspec.structs.fields(type(env.event))}
    for name in added:
        default = info[name].default
        assert default is not msgspec.NODEFAULT, f"{tag}.{name} was added without a default"
        assert decoded[name] == json.loads(msgspec.json.encode(default))
    assert env.run == "abc123" and env.corr == "ep000001" and env.actor == "runtime"
    if not added:  # re-encoding today gives the same bytes: the format did not drift silently
        assert CODEC.encode(env).hex() == sample["hex"]


def test_record_with_wrong_seq_is_corruption() -> None:
    sample = FROZEN["run_stopped"]
    with pytest.raises(LogCorrupted, match="claims seq"):
        CODEC.decode(bytes.fromhex(sample["hex"]), sample["seq"] + 1)


def test_garbage_is_corruption_not_a_crash() -> None:
    with pytest.raises(LogCorrupted):
        CODEC.decode(b"\x93\x01\x02", 5)
    with pytest.raises(LogCorrupted):
        CODEC.decode(b"\xff\xff\xff", 5)


# --- schema evolution: version bump + upcaster ----------------------------------------------


@event
class Measured(Event, tag="test_measured", frozen=True, kw_only=True):
    """v2 renamed ``value`` to ``amount`` and made it a float in [0, 1] (was percent)."""

    version: ClassVar[int] = 2
    amount: float
    unit: str = "fraction"


@upcaster("test_measured", 1)
def _measured_v1_v2(body: dict[str, Any]) -> dict[str, Any]:
    body = dict(body)
    body["amount"] = body.pop("value") / 100.0
    return body


def v1_bytes(seq: int, value: int, version: int = 1, kind: str = "test_measured") -> bytes:
    """Bytes an older coevo wrote for ``Measured`` v1 (``value`` in percent)."""
    raw = [seq, "r", 0, "a", {"kind": kind, "value": value}, None, "", version]
    return msgspec.msgpack.encode(raw)


def test_old_version_is_upcast_on_read() -> None:
    env = CODEC.decode(v1_bytes(3, 40), 3)
    assert env.event == Measured(amount=0.4)
    assert env.v == 2


def test_current_version_round_trips_directly() -> None:
    ev = Measured(amount=0.25)
    data = CODEC.encode(Envelope(seq=0, run="r", t=0, actor="a", event=ev, v=ev.version))
    assert CODEC.decode(data, 0).event == ev


def test_newer_version_or_unknown_kind_is_refused() -> None:
    with pytest.raises(SchemaTooNew, match="newer"):
        CODEC.decode(v1_bytes(1, 40, version=3), 1)
    with pytest.raises(SchemaTooNew, match="unknown event kind 'from_the_future'"):
        CODEC.decode(v1_bytes(1, 40, kind="from_the_future"), 1)


@event
class Remeasured(Event, tag="test_remeasured", frozen=True, kw_only=True):
    """v2, with no upcaster from v1 (a plug-in that bumped its version and forgot one)."""

    version: ClassVar[int] = 2
    amount: float


def test_a_changed_event_class_is_said_to_be_one_not_a_torn_copy() -> None:
    """A record of an event whose class changed (a new version without an upcaster, a field's
    type) read as corruption, with the hint that a cp -r copy can be torn like this: its
    bytes are as written, and the message now says what to do."""
    from engine.errors import EventSchemaChanged
    from scenarios.cli.common import torn_copy_hint

    with pytest.raises(EventSchemaChanged, match=r"no upcaster for test_remeasured v1 -> v2") as e:
        CODEC.decode(v1_bytes(1, 40, kind="test_remeasured"), 1)
    assert "@engine.events.upcaster(tag, version)" in str(e.value)
    assert torn_copy_hint(e.value) == ""
    raw = [2, "r", 0, "a", {"kind": "test_remeasured", "amount": "a lot"}, None, "", 2]
    with pytest.raises(EventSchemaChanged, match="does not decode"):
        CODEC.decode(msgspec.msgpack.encode(raw), 2)
    with pytest.raises(LogCorrupted) as garbage:  # bytes that are no envelope: damage
        CODEC.decode(b"\xff\xff\xff", 5)
    assert torn_copy_hint(garbage.value) != ""


def test_event_registration_rules() -> None:
    with pytest.raises(TypeError, match="explicit"):

        @event
        class NoTag(Event, frozen=True, kw_only=True):  # pyright: ignore[reportUnusedClass]
            x: int

    with pytest.raises(TypeError, match="frozen"):

        @event
        class Thawed(Event, tag="test_thawed", frozen=False, kw_only=True):  # pyright: ignore[reportUnusedClass]
            x: int

    with pytest.raises(TypeError, match="used by both"):

        @event
        class Twin(Event, tag="test_measured", frozen=True, kw_only=True):  # pyright: ignore[reportUnusedClass]
            x: int
