"""Generated event streams survive both stores unchanged; a flipped stored byte never passes."""

from __future__ import annotations

import contextlib
import itertools
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import lmdb
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import LogCorrupted
from engine.eventlog import EventLog, MemoryEventLog, joined_chunks, new_run_meta
from engine.events import Envelope, Event, event_types
from stores import lmdb_log
from stores.lmdb_log import LmdbEventLog

META = new_run_meta("property", scenario_name="property", seed=0, coevo_version="0.1.0")
MSGPACK_INT = st.integers(-(2**63), 2**64 - 1)
TEXT = st.text(max_size=20) | st.sampled_from(["", "\x00", "ünïcode ✓ 🚀", "a" * 300])
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def field_strategy(tp: Any) -> st.SearchStrategy[Any]:
    """A strategy for one event field annotation (the types lifecycle events use)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return MSGPACK_INT
    if tp is float:
        return st.floats(allow_nan=False)
    if tp is str:
        return TEXT
    if origin is tuple:
        return st.lists(field_strategy(args[0]), max_size=3).map(tuple)
    if origin is dict:
        return st.dictionaries(field_strategy(args[0]), field_strategy(args[1]), max_size=3)
    if type(None) in args:
        return st.none() | field_strategy(next(a for a in args if a is not type(None)))
    raise NotImplementedError(f"no strategy for field type {tp!r}")


def event_strategy(cls: type[Event]) -> st.SearchStrategy[Event]:
    fields = {f.name: field_strategy(f.type) for f in msgspec.structs.fields(cls)}
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


LIFECYCLE = sorted(
    (cls for cls in event_types().values() if cls.__module__ == "engine.lifecycle"),
    key=lambda cls: cls.__name__,
)
EVENTS = st.one_of([event_strategy(cls) for cls in LIFECYCLE])


@st.composite
def streams(draw: st.DrawFn, max_size: int = 40) -> list[Envelope[Event]]:
    """Envelopes with seqs 0, 1, ... around generated lifecycle events."""
    evs = draw(st.lists(EVENTS, max_size=max_size))
    return [
        Envelope(
            seq=seq,
            run=draw(TEXT),
            t=draw(st.integers(0, 2**64 - 1)),
            actor=draw(TEXT),
            event=ev,
            cause=draw(st.none() | st.integers(0, 2**64 - 1)),
            corr=draw(TEXT),
            v=type(ev).version,
        )
        for seq, ev in enumerate(evs)
    ]


def batched(envs: list[Envelope[Event]], sizes: list[int]) -> Iterator[list[Envelope[Event]]]:
    """Cut ``envs`` into batches of the given sizes (the rest as one last batch)."""
    start = 0
    for size in sizes:
        yield envs[start : start + size]
        start += size
    yield envs[start:]


@pytest.fixture(autouse=True, scope="module")
def short_read_chunks() -> Iterator[None]:
    """Read in chunks of 3 records, so that streams span many read transactions."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lmdb_log, "READ_CHUNK", 3)
        yield


def fill(log: EventLog, envs: list[Envelope[Event]], sizes: list[int]) -> None:
    for batch in batched(envs, sizes):
        log.append(batch)
    assert log.next_seq == len(envs)


def in_range(envs: list[Envelope[Event]], start: int, stop: int | None) -> list[Envelope[Event]]:
    """The Protocol's reading of ``read(start, stop)``: ``start <= seq < stop``."""
    return [e for e in envs if e.seq >= start and (stop is None or e.seq < stop)]


@SETTINGS
@given(envs=streams(), sizes=st.lists(st.integers(0, 9), max_size=8), bounds=st.data())
def test_stream_round_trips_through_the_twin(
    envs: list[Envelope[Event]], sizes: list[int], bounds: st.DataObject
) -> None:
    log = MemoryEventLog()
    fill(log, envs, sizes)
    assert list(log.read()) == envs
    start, stop = bounds.draw(st.integers(-2, 45)), bounds.draw(st.none() | st.integers(-2, 45))
    assert list(log.read(start, stop)) == in_range(envs, start, stop)


@SETTINGS
@given(envs=streams(), sizes=st.lists(st.integers(0, 9), max_size=8), bounds=st.data())
def test_stream_round_trips_through_lmdb(
    envs: list[Envelope[Event]], sizes: list[int], bounds: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log"
        with LmdbEventLog.create(path, META, durable=False, map_size=32 * 1024) as log:
            fill(log, envs, sizes)
            assert list(log.read()) == envs
        with LmdbEventLog.open(path) as log:
            assert list(log.read()) == envs
            start = bounds.draw(st.integers(-2, 45))
            stop = bounds.draw(st.none() | st.integers(-2, 45))
            assert list(log.read(start, stop)) == in_range(envs, start, stop)
            assert log.verify().records == len(envs)


def flip_stored_byte(path: Path, first: int, position: int, mask: int) -> int:
    """XOR one byte of the stored record that starts at seq ``first`` (a raw LMDB write).

    Returns:
        The byte's index in the value (``position`` modulo the value's length).
    """
    with lmdb.open(str(path), max_dbs=3, create=False) as env:
        events = env.open_db(b"events", create=False)
        with env.begin(write=True, db=events) as txn:
            key = first.to_bytes(8, "big")
            value = bytearray(txn.get(key))
            index = position % len(value)
            value[index] ^= mask
            txn.put(key, bytes(value))
    return index


@SETTINGS
@given(
    envs=streams(max_size=12).filter(bool),
    cuts=st.lists(st.integers(1, 11), max_size=4),
    pick=st.integers(0, 11),
    position=st.integers(0, 10_000),
    mask=st.integers(1, 255),
)
def test_flipped_byte_is_reported_at_its_record(
    envs: list[Envelope[Event]], cuts: list[int], pick: int, position: int, mask: int
) -> None:
    """One record per appended batch: a flipped byte anywhere in a record is reported at the
    record's first seq; everything before it and after it still reads back."""
    bounds = sorted({0, len(envs), *(c for c in cuts if c < len(envs))})
    batches = list(itertools.pairwise(bounds))
    first, end = batches[pick % len(batches)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log"
        with LmdbEventLog.create(path, META, durable=False) as log:
            for a, b in batches:
                log.append(envs[a:b])
        flip_stored_byte(path, first, position, mask)
        with LmdbEventLog.open(path) as log:
            with pytest.raises(LogCorrupted) as info:
                list(log.read())
            assert info.value.seq == first
            report = log.verify()
            assert (report.ok, report.first_bad, report.records) == (False, first, first)
            assert list(log.read(0, first)) == envs[:first]
            assert list(log.read(end, len(envs))) == envs[end:]


def numbered(sizes: list[int]) -> list[list[int]]:
    """Chunks of consecutive numbers of the given sizes (stand-ins for envelopes)."""
    starts = itertools.accumulate(sizes, initial=0)
    return [list(range(start, start + size)) for start, size in zip(starts, sizes, strict=False)]


def failing_after(chunks: list[list[int]], count: int) -> Iterable[list[int]]:
    """The first ``count`` chunks, then the error a damaged record raises."""
    yield from chunks[:count]
    raise LogCorrupted(-1, "damaged")


@SETTINGS
@given(
    sizes=st.lists(st.integers(0, 9), max_size=30),
    most=st.integers(1, 20),
    fail=st.none() | st.integers(0, 30),
)
def test_joined_chunks_keep_the_stream_in_order(
    sizes: list[int], most: int, fail: int | None
) -> None:
    """Joined chunks hold the same envelopes in the same order, each at most ``most`` unless
    it is one chunk that was larger; after an error, exactly the chunks read before it."""
    chunks = numbered(sizes)
    source = chunks if fail is None else failing_after(chunks, fail)
    out: list[list[int]] = []
    with pytest.raises(LogCorrupted) if fail is not None else contextlib.nullcontext():
        out.extend(joined_chunks(source, most))  # type: ignore[arg-type]
    kept = chunks if fail is None else chunks[:fail]
    assert [x for part in out for x in part] == [x for chunk in kept for x in chunk]
    assert all(part and (len(part) <= most or part in kept) for part in out)


def test_joined_chunks_join_greedily() -> None:
    chunks = numbered([1, 2, 1, 1, 3, 2, 6, 1, 1])
    assert [len(part) for part in joined_chunks(chunks, 5)] == [5, 5, 6, 2]  # type: ignore[arg-type]
