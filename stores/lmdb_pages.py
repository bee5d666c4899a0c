"""LMDB's own structures in a data file, read without LMDB: its two meta pages.

LMDB trusts its file: it reads the newest meta page it finds and walks the pages it names.
What it cannot see, coevo checks here, before LMDB opens the file (the format is LMDB 0.9's,
64-bit: a 16-byte page header, then the meta record).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0xBEEFC0DE
"""LMDB's magic number, at the start of each meta record."""

P_META = 0x08
P_INVALID = 2**64 - 1
"""The root of an empty database."""

_HEADER = struct.Struct("<QHHHH")  # page number, pad, flags, lower, upper
_META = struct.Struct("<II8sQ")  # magic, version, address, map size
_DB = struct.Struct("<IHHQQQQQ")  # pad (page size, in the free db's), flags, depth, pages x3,
# entries, root
_TAIL = struct.Struct("<QQ")  # last page used, transaction id


@dataclass(frozen=True)
class Meta:
    """One meta page: the transaction it records and the roots it names."""

    page: int
    flags: int
    magic: int
    psize: int
    main_root: int
    last_pgno: int
    txnid: int

    @property
    def valid(self) -> bool:
        return self.flags & P_META != 0 and self.magic == MAGIC


def read_meta(data: bytes, page: int) -> Meta | None:
    """The meta record at the start of ``data`` (page ``page``), or None if it is too short."""
    end = _HEADER.size + _META.size + 2 * _DB.size + _TAIL.size
    if len(data) < end:
        return None
    _, _, flags, _, _ = _HEADER.unpack_from(data)
    magic, _, _, _ = _META.unpack_from(data, _HEADER.size)
    free = _DB.unpack_from(data, _HEADER.size + _META.size)
    main = _DB.unpack_from(data, _HEADER.size + _META.size + _DB.size)
    last, txnid = _TAIL.unpack_from(data, _HEADER.size + _META.size + 2 * _DB.size)
    return Meta(page, flags, magic, free[0], main[7], last, txnid)


def read_metas(path: Path) -> tuple[Meta | None, Meta | None]:
    """Both meta pages of ``path`` (a data file); None for one that cannot be read."""
    try:
        with open(path, "rb") as fh:
            first = read_meta(fh.read(4096), 0)
            if first is None or not first.valid or not 512 <= first.psize <= 65536:
                return first, None
            fh.seek(first.psize)
            return first, read_meta(fh.read(4096), 1)
    except OSError:
        return None, None


def is_blank(path: Path) -> bool:
    """True if the data file ``path`` is exactly what LMDB writes when it creates an
    environment, before any commit: two meta pages of transaction 0 naming no database.

    Such a file holds nothing of a log (a creation killed before its first commit); a
    truncated or damaged log is never blank (its pages record later transactions).
    """
    metas = read_metas(path)
    if not all(m is not None and m.valid and m.txnid == 0 for m in metas):
        return False
    psize = metas[0].psize if metas[0] is not None else 0
    try:
        size = os.stat(path).st_size
    except OSError:
        return False
    return size == 2 * psize and all(m is not None and m.main_root == P_INVALID for m in metas)
