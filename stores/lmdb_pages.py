"""LMDB's own structures in a data file, read without LMDB: its two meta pages.

LMDB trusts its file: it reads the newest meta page it finds and walks the pages it names.
What it cannot see, coevo checks here, before LMDB opens the file (the format is LMDB 0.9's,
64-bit: a 16-byte page header, then the meta record).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0xBEEFC0DE
"""LMDB's magic number, at the start of each meta record."""

_Data = bytes | memoryview | mmap.mmap
"""A data file's bytes, or a map of it."""

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
    """True if the data file ``path`` holds no commit: two meta pages of transaction 0 naming
    no database (what LMDB writes when it creates an environment), perhaps followed by pages
    of a first commit whose meta page was never written (a process killed mid-commit: 12 of 40
    kills just after the file appeared, 2026-12-03), or nothing yet (LMDB creates the file,
    then writes its meta pages).

    Such a file holds nothing of a log (a creation killed before its first commit); a
    truncated log is never blank unless nothing of it is left, and a damaged one never is
    (its pages record later transactions).
    """
    try:
        size = os.stat(path).st_size
    except OSError:
        return False
    if size == 0:
        return True
    metas = read_metas(path)
    if not all(m is not None and m.valid and m.txnid == 0 for m in metas):
        return False
    psize = metas[0].psize if metas[0] is not None else 0
    return size >= 2 * psize and all(m is not None and m.main_root == P_INVALID for m in metas)


P_BRANCH = 0x01
P_LEAF = 0x02
P_OVERFLOW = 0x04
P_LEAF2 = 0x20
_KINDS = P_BRANCH | P_LEAF | P_OVERFLOW | P_META | P_LEAF2  # a page's kind bits on disk
F_BIGDATA = 0x01
F_SUBDATA = 0x02
F_DUPDATA = 0x04
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size
_PTR = struct.Struct("<H")
_PGNO = struct.Struct("<Q")
_PAGES = struct.Struct("<I")  # an overflow page's page count (in place of lower, upper)
_SUBDB_ROOT = struct.Struct("<IHHQQQQQ")  # an MDB_db record, as in the meta page


class PageDamaged(Exception):
    """A page of the tree is not what its parent says it is (a message for the log's error)."""


def check_tree(data: _Data, meta: Meta, free: bool = True) -> int:
    """Walk every branch and leaf page of the main and free databases and of every named
    database, as LMDB would, and the first page of every overflow value, checking each before
    anything reads it: its number is the one its parent names, its kind (branch, leaf,
    overflow) and depth are the ones expected, and its pointers, nodes and overflow runs lie
    within the page and the file. LMDB asserts instead (``IS_LEAF(mp)``: the process aborts)
    when a zeroed or overwritten page is where a branch points.

    Args:
        data: the data file's bytes (a map of it).
        meta: the meta page of the transaction to check (its pages must not be reused while
            this runs: hold a read transaction of it).
        free: check the free database too (only a writer reads it).

    Returns:
        The number of pages checked.

    Raises:
        PageDamaged: the first page that is not what it should be.
    """
    walk = _Walk(data, meta)
    if free:
        record = _SUBDB_ROOT.unpack_from(data, meta.page * meta.psize + _HEADER.size + _META.size)
        walk.tree("the free database", record[7], record[2])
    main = _SUBDB_ROOT.unpack_from(
        data, meta.page * meta.psize + _HEADER.size + _META.size + _DB.size
    )
    for name, root, depth in walk.tree("the main database", main[7], main[2]):
        walk.tree(f"database {name!r}", root, depth)
    return len(walk.seen)


_MANY_LEAVES = 256
"""From this many leaf pages in one tree, they are checked in bulk first (numpy)."""


class _Walk:
    def __init__(self, data: _Data, meta: Meta) -> None:
        self.data = data
        self.psize = meta.psize
        self.last = meta.last_pgno
        self.seen: set[int] = set()

    def page(self, pgno: int, what: str) -> tuple[int, int]:
        """The flags and page number field of page ``pgno`` (checked to be in the file)."""
        if not 2 <= pgno <= self.last or (pgno + 1) * self.psize > len(self.data):
            raise PageDamaged(f"{what} names page {pgno}, past the file's last page {self.last}")
        if pgno in self.seen:
            raise PageDamaged(f"{what} names page {pgno} a second time")
        self.seen.add(pgno)
        number, _, flags, _, _ = _HEADER.unpack_from(self.data, pgno * self.psize)
        if number != pgno:
            raise PageDamaged(f"page {pgno} ({what}) says it is page {number}")
        return flags, number

    def tree(self, what: str, root: int, depth: int) -> list[tuple[bytes, int, int]]:
        """Check the tree at ``root`` of ``depth`` levels; return its named databases (the
        main database's ``F_SUBDATA`` nodes: name, root, depth)."""
        if root == P_INVALID:
            return []
        if not 1 <= depth <= 32:
            raise PageDamaged(f"{what} has depth {depth}")
        leaves: list[int] = []
        stack = [(root, 1)]
        while stack:
            pgno, level = stack.pop()
            kind = P_BRANCH if level < depth else P_LEAF
            flags, _ = self.page(pgno, what)
            if flags & _KINDS != kind:
                expected = "branch" if kind == P_BRANCH else "leaf"
                raise PageDamaged(
                    f"page {pgno} of {what} should be a {expected} page, its flags are {flags:#x}"
                )
            if kind == P_LEAF:
                leaves.append(pgno)
                continue
            for node in self._nodes(pgno, what):
                lo, hi, nflags, _ = _NODE.unpack_from(self.data, node)
                stack.append((lo | hi << 16 | nflags << 32, level + 1))
        if len(leaves) >= _MANY_LEAVES:  # most pass a check in bulk; the rest one by one
            leaves = self._not_plain(leaves)
        named: list[tuple[bytes, int, int]] = []
        for pgno in leaves:
            for node in self._nodes(pgno, what):
                lo, hi, nflags, ksize = _NODE.unpack_from(self.data, node)
                named += self._leaf(pgno, what, node, lo | hi << 16, nflags, ksize)
        return named

    def _not_plain(self, leaves: list[int]) -> list[int]:
        """Those of ``leaves`` that the node by node check must see: pages whose bounds, node
        pointers, keys or values do not lie within the page, or that hold a node of another
        kind than a plain key and value (a big value, a database record). The checks are those
        of :meth:`_nodes` and :meth:`_leaf`, done on every node of every page at once."""
        import numpy as np  # only for large trees: a small log's reader does not import it

        # the file as little-endian 16-bit words: pages, headers and nodes start at even
        # offsets (LMDB aligns nodes to two bytes; an odd pointer is left to the slow check)
        words = np.frombuffer(self.data, dtype="<u2", count=len(self.data) // 2)
        psize, head = self.psize, _HEADER.size
        pages = np.asarray(leaves, dtype=np.int64)
        base = pages * (psize // 2)  # in words

        def u16(at: np.ndarray) -> np.ndarray:
            return words[at].astype(np.int64)

        lower, upper = u16(base + (head - 4) // 2), u16(base + (head - 2) // 2)
        ok = (lower > head) & (lower <= upper) & (upper <= psize) & ((lower - head) % 2 == 0)
        count = np.where(ok, (lower - head) // 2, 0)
        owner = np.repeat(np.arange(len(pages)), count)
        k = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        ptr = u16(base[owner] + head // 2 + k)
        bad = (ptr < upper[owner]) | (ptr > psize - _NODE.size) | (ptr % 2 == 1)
        node = base[owner] + np.clip(ptr, 0, psize - _NODE.size) // 2
        size = u16(node) | u16(node + 1) << 16
        flags, ksize = u16(node + 2), u16(node + 3)
        end = ptr + _NODE.size + ksize
        special = (flags & (F_BIGDATA | F_SUBDATA | F_DUPDATA)) != 0
        bad |= (end > psize) | special | (end + size > psize)
        flagged = np.bincount(owner, weights=bad, minlength=len(pages)) > 0
        return [pgno for pgno, plain in zip(leaves, ok & ~flagged, strict=True) if not plain]

    def _nodes(self, pgno: int, what: str) -> list[int]:
        """The offsets (in the file) of the nodes of page ``pgno``, each within the page."""
        base, psize = pgno * self.psize, self.psize
        _, _, _, lower, upper = _HEADER.unpack_from(self.data, base)
        if not _HEADER.size < lower <= upper <= psize or (lower - _HEADER.size) % 2:
            raise PageDamaged(f"page {pgno} of {what} has bounds {lower}..{upper}")
        nodes: list[int] = []
        for i in range((lower - _HEADER.size) // 2):
            (ptr,) = _PTR.unpack_from(self.data, base + _HEADER.size + 2 * i)
            if not upper <= ptr <= psize - _NODE.size:
                raise PageDamaged(f"page {pgno} of {what}: node {i} at {ptr}, outside {upper}..")
            (ksize,) = _PTR.unpack_from(self.data, base + ptr + 6)
            if ptr + _NODE.size + ksize > psize:
                raise PageDamaged(f"page {pgno} of {what}: node {i}'s key runs past the page")
            nodes.append(base + ptr)
        return nodes

    def _leaf(
        self, pgno: int, what: str, node: int, size: int, flags: int, ksize: int
    ) -> list[tuple[bytes, int, int]]:
        """Check a leaf node's value; return the named database it records, if any."""
        value = node + _NODE.size + ksize
        if flags & F_DUPDATA:
            raise PageDamaged(f"page {pgno} of {what}: a duplicate-data node (never written)")
        if flags & F_BIGDATA:
            if value + _PGNO.size > (pgno + 1) * self.psize:
                raise PageDamaged(f"page {pgno} of {what}: a node runs past the page")
            (first,) = _PGNO.unpack_from(self.data, value)
            oflags, _ = self.page(first, what)
            (pages,) = _PAGES.unpack_from(self.data, first * self.psize + 12)
            if oflags & _KINDS != P_OVERFLOW or not 1 <= pages <= self.last - first + 1:
                raise PageDamaged(f"page {first} of {what} should start a value of {size} bytes")
            if pages * self.psize - _HEADER.size < size:
                raise PageDamaged(f"page {first} of {what}: {pages} pages for {size} bytes")
            return []
        if value + size > (pgno + 1) * self.psize:
            raise PageDamaged(f"page {pgno} of {what}: a node's value runs past the page")
        if flags & F_SUBDATA:
            if size != _SUBDB_ROOT.size:
                raise PageDamaged(f"page {pgno} of {what}: a database record of {size} bytes")
            record = _SUBDB_ROOT.unpack_from(self.data, value)
            name = bytes(self.data[node + _NODE.size : value])
            return [(name, record[7], record[2])]
        return []


def database_names(path: Path) -> set[bytes] | None:
    """The named databases of the data file ``path`` as of its newest commit, read without
    LMDB (which a damaged or truncated file crashes), or None where the file cannot tell
    (unreadable, no valid meta page, a damaged page on the way)."""
    metas = [m for m in read_metas(path) if m is not None and m.valid]
    if not metas:
        return None
    meta = max(metas, key=lambda m: m.txnid)
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            main = _SUBDB_ROOT.unpack_from(
                data, meta.page * meta.psize + _HEADER.size + _META.size + _DB.size
            )
            return {name for name, _, _ in _Walk(data, meta).tree("main", main[7], main[2])}
    except (OSError, ValueError, struct.error, PageDamaged):
        return None


def metas_disagree(metas: tuple[Meta | None, Meta | None]) -> str | None:
    """Why two readable meta pages cannot both be right, or None.

    Each commit writes its transaction id to meta page ``txnid % 2``, so the two pages always
    record consecutive commits (both 0 before the first). LMDB reads the newer one and trusts
    it: when the newer page's id is damaged (zeroed, say), it reads the log as of the older
    commit and the commits after it are lost without a word.
    """
    first, second = metas
    if first is None or second is None or not (first.valid and second.valid):
        return None  # a meta page LMDB cannot read: LMDB refuses the file itself
    if abs(first.txnid - second.txnid) == 1 or first.txnid == second.txnid == 0:
        return None
    used = max(first, second, key=lambda m: m.txnid)
    return (
        f"its meta pages record commits {first.txnid} (page 0) and {second.txnid} (page 1), "
        f"which must be consecutive: one is damaged, and LMDB would read the log as of commit "
        f"{used.txnid}, without the commits after it"
    )
