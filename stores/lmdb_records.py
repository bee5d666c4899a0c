"""The records of the LMDB event log: how a batch, a snapshot and the metadata are stored.

An events record (key: the batch's first seq, 8-byte big-endian) is a 4-byte big-endian CRC32
over key + count + payload, the 4-byte count of envelopes, then the payload: the batch (one
commit of the runtime's group commit) as a msgpack array of parts, each part a msgpack array of
up to :data:`RECORD_PART` envelopes (log format 2; format 1 stored the batch as one array of
envelopes, and is still read and appended to). One record per batch makes an append one put; a
read checks one CRC per record and decodes one part at a time with one msgspec call, so that a
reader holds a part's envelopes, not a whole large batch's. Meta and snapshot values are a CRC32
over key + payload, then the payload (snapshot keys: name, NUL, 8-byte big-endian ``upto``). A
flipped byte is reported as :class:`LogCorrupted` naming the first seq of its record, never
decoded into a wrong event.

Pure functions over bytes and cursors; :mod:`stores.lmdb_log` runs them in its transactions.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import lmdb
import msgspec

from engine.errors import LogCorrupted
from engine.events import Codec, Envelope, Event

__all__ = [
    "MAX_SEQ",
    "RECORD_PART",
    "SEQ",
    "encode_parts",
    "events_end",
    "find_snapshot",
    "record_count",
    "record_parts",
    "seal",
    "seal_record",
    "seek_record",
    "snapshot_prefix",
    "unseal",
]

RECORD_PART = 512
"""Most envelopes in one part of a record: what a reader decodes and hands over at a time."""

SEQ = struct.Struct(">Q")
"""An events key, and the ``upto`` of a snapshot key: a seq, 8-byte big-endian."""
MAX_SEQ = 2**64 - 1
_MAX_NAME_BYTES = 400  # LMDB's default maximum key size is 511 bytes
_HEAD = struct.Struct(">II")  # CRC32, number of envelopes in the record
_PARTS_DECODER = msgspec.msgpack.Decoder(list[msgspec.Raw])
_ONE_PART = 0x91  # the msgpack header of an array of one item: a record of one part

_View = bytes | memoryview  # a value read from either kind of transaction


def seal(key: bytes, payload: bytes) -> bytes:
    """A stored value: CRC32 over ``key + payload`` (4 bytes, big-endian), then the payload."""
    return zlib.crc32(payload, zlib.crc32(key)).to_bytes(4, "big") + payload


def unseal(key: bytes, value: bytes) -> bytes | None:
    """The payload of a sealed value, or None if its checksum does not match."""
    payload = value[4:]
    if len(value) < 4 or int.from_bytes(value[:4], "big") != zlib.crc32(payload, zlib.crc32(key)):
        return None
    return payload


def events_end(cursor: lmdb.Cursor[_View]) -> int:
    """One past the last seq of the events database (0 when empty).

    Raises:
        LogCorrupted: the last record fails its checksum (its count cannot be trusted).
    """
    if not cursor.last():
        return 0
    key = cursor.key()
    first = int.from_bytes(key, "big")
    return first + record_count(first, key, cursor.value())


def seek_record(cursor: lmdb.Cursor[_View], seq: int) -> bool:
    """Position ``cursor`` on the record holding ``seq`` (the last key ``<= seq``)."""
    key = SEQ.pack(seq)
    if cursor.set_range(key):
        return cursor.key() == key or cursor.prev()
    return cursor.last()


def find_snapshot(
    cursor: lmdb.Cursor[bytes], prefix: bytes, target: bytes
) -> tuple[bytes, bytes] | None:
    """The greatest snapshot key ``<= target`` under ``prefix`` (a :func:`snapshot_prefix`),
    with its value."""
    if cursor.set_range(target):
        if cursor.key() != target and not cursor.prev():
            return None
    elif not cursor.last():
        return None
    key: bytes = cursor.key()
    if not key.startswith(prefix) or len(key) != len(prefix) + SEQ.size:
        return None
    return key, cursor.value()


def record_count(first: int, key: _View, value: _View) -> int:
    """The count of an events record whose checksum holds.

    Raises:
        LogCorrupted: the record is shorter than its header or fails its checksum.
    """
    if len(value) < _HEAD.size:
        raise LogCorrupted(first, "record shorter than its header")
    crc, count = _HEAD.unpack_from(value)
    if crc != zlib.crc32(memoryview(value)[4:], zlib.crc32(key)):  # the count and the payload
        raise LogCorrupted(first, f"checksum mismatch in the record of seqs {first}..")
    return count


def seal_record(key: bytes, count: int, pieces: list[bytes]) -> bytearray:
    """An events value: CRC32 over key + count + payload, the count, then the payload (the
    concatenation of ``pieces``). One copy and one CRC call: ``zlib.crc32`` lets go of the GIL
    on large inputs, and each time the writing thread waits to get it back."""
    value = bytearray().join([bytes(4), count.to_bytes(4, "big"), *pieces])
    value[:4] = zlib.crc32(memoryview(value)[4:], zlib.crc32(key)).to_bytes(4, "big")
    return value


def encode_parts(
    codec: Codec, envelopes: Sequence[Envelope[Event]], log_format: int
) -> list[bytes]:
    """The payload of a record of ``envelopes`` in a log of ``log_format``, in pieces to be
    concatenated."""
    if log_format < 2:
        return [codec.encode_batch(envelopes)]
    parts = [
        codec.encode_batch(envelopes[lo : lo + RECORD_PART])
        for lo in range(0, len(envelopes), RECORD_PART)
    ]
    return [_array_header(len(parts)), *parts]


def record_parts(
    key: memoryview, value: memoryview, expected: int, log_format: int
) -> list[tuple[int, memoryview | msgspec.Raw, int]]:
    """The parts of one record of a log of ``log_format``, which must start at seq
    ``expected``: ``(first seq, part, count)`` each.

    Raises:
        LogCorrupted: a gap before the record, a checksum mismatch, parts that are not
            arrays, or counts that do not add up to the record's.
    """
    first = int.from_bytes(key, "big")
    if first != expected:
        raise LogCorrupted(expected, f"record missing: the next record starts at {first}")
    count = record_count(first, key, value)
    payload = memoryview(value)[8:]
    if log_format < 2:
        parts: list[memoryview] | list[msgspec.Raw] = [payload]
    elif len(payload) and payload[0] == _ONE_PART:  # a small batch: no array of parts to decode
        parts = [payload[1:]]
    else:
        try:
            parts = _PARTS_DECODER.decode(payload)
        except msgspec.MsgspecError:
            raise LogCorrupted(first, "record is not an array of parts") from None
    out: list[tuple[int, memoryview | msgspec.Raw, int]] = []
    seq = first
    for part in parts:
        n = _array_len(memoryview(part))
        if n is None:
            raise LogCorrupted(first, "record part is not an array of envelopes")
        out.append((seq, part, n))
        seq += n
    if seq - first != count:
        raise LogCorrupted(first, f"record holds {seq - first} events, its header says {count}")
    return out


def snapshot_prefix(name: str) -> bytes:
    """Key prefix of snapshot ``name``.

    Raises:
        ValueError: the name contains NUL or is too long for an LMDB key.
    """
    raw = name.encode()
    if b"\0" in raw:
        raise ValueError(f"snapshot name must not contain NUL: {name!r}")
    if len(raw) > _MAX_NAME_BYTES:
        raise ValueError(f"snapshot name longer than {_MAX_NAME_BYTES} bytes: {name[:40]!r}...")
    return raw + b"\0"


def _array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items (fixarray, array 16 or array 32)."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _array_len(data: memoryview) -> int | None:
    """The item count in the msgpack array header at the start of ``data`` (None: no array)."""
    tag = data[0] if len(data) else None
    if tag is not None and 0x90 <= tag <= 0x9F:
        return tag & 0x0F
    if tag == 0xDC and len(data) >= 3:
        return int.from_bytes(data[1:3], "big")
    if tag == 0xDD and len(data) >= 5:
        return int.from_bytes(data[1:5], "big")
    return None
