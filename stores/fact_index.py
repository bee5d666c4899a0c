"""The fact index: an ordered byte-key store beside an event log, filled by one replay pass.

``coevo audit`` answers questions about one entry or one episode from facts a pass over the log
extracted (``agents.audit.index`` decides what they are); this module only keeps them. Keys are
bytes in lexicographic order, looked up exactly (:meth:`FactIndex.get`) or by prefix
(:meth:`FactIndex.scan`). The index remembers how far it has read (``upto``: the next seq to
index), so a second pass over a live run reads only the new tail, and which log it belongs to
(``ident``: a different one starts it afresh).

:class:`LmdbFactIndex` keeps the facts in their own LMDB environment (a directory beside the
log's, never inside it); :class:`MemoryFactIndex` is its in-memory twin, also what an audit
falls back to where the run directory is read-only.
"""

from __future__ import annotations

import bisect
import os
import shutil
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

import lmdb

from engine.errors import CoevoError, LogError
from stores import lmdb_pages
from stores.lmdb_env import (
    DATA_FILE,
    ENV_LOCK_FILE,
    LOCK_FILE,
    allocate_lock_file,
    check_file_size,
    check_metas,
    check_pages,
)

__all__ = [
    "FactIndex",
    "IndexDamaged",
    "IndexWriteFailed",
    "LmdbFactIndex",
    "MemoryFactIndex",
    "NotAnIndex",
]

Fact = tuple[bytes, bytes]

_UPTO = b"upto"
_IDENT = b"ident"
_INITIAL_MAP = 64 * 1024 * 1024
T = TypeVar("T")


class IndexDamaged(LogError):
    """A fact index's file is damaged (truncated, pages LMDB would crash on, a fact whose
    checksum does not match): the index is a cache of the log, to be rebuilt from it
    (:meth:`LmdbFactIndex.wipe`)."""


class NotAnIndex(CoevoError):
    """A directory named for a fact index holds another LMDB file (an event log: ``--index
    RUN/log``): it is neither written nor removed as an index, which would destroy what it
    holds."""

    exit_code = 2


_INDEX_DBS = frozenset({b"facts", b"meta"})


def refuse_other(root: Path) -> None:
    """Refuse ``root`` as a fact index's directory when it is an event log's (its writer lock)
    or its LMDB file holds databases an index has not (an event log's ``events``), read without
    LMDB (``lmdb_pages.database_names``). A file that cannot tell is left to the index's own
    checks (a damaged index is rebuilt).

    Raises:
        NotAnIndex: it holds something else.
    """
    if (root / LOCK_FILE).exists():  # an event log's writer lock (its file may be damaged)
        raise NotAnIndex(
            f"{root}: the directory of an event log ({LOCK_FILE}), not an audit index; name "
            "an empty directory or an index's"
        )
    try:
        others = sorted(n for n in os.listdir(root) if n not in (DATA_FILE, ENV_LOCK_FILE))
    except OSError:  # not a directory that can be listed: the index's own opening says why
        others = []
    if others:  # a directory of the user's: an index would write its files among them
        raise NotAnIndex(
            f"{root}: holds {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}, "
            "not an audit index; name an empty directory or an index's"
        )
    names = lmdb_pages.database_names(root / DATA_FILE)
    if names is None:  # no file, or one that cannot tell: a damaged index, rebuilt
        return
    if names - _INDEX_DBS:
        held = "an event log" if b"events" in names else "another LMDB file"
        raise NotAnIndex(
            f"{root}: holds {held} ({DATA_FILE} with {', '.join(sorted(map(repr, names)))}), "
            "not an audit index; name an empty directory or an index's"
        )


class IndexWriteFailed(LogError):
    """The file system refused a write to a fact index (a full disk, an I/O error): the index
    keeps what it held before. Unlike :class:`~engine.errors.LogWriteFailed`, the event log is
    untouched: the index is derived from it, and an audit can index in memory instead."""


def _free_note(path: Path) -> str:
    """What is free on the disk holding ``path``, for a failed write's message (LMDB may say
    "Input/output error" where the disk is full)."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return ""
    return f" ({free / 2**20:.1f} MiB free on its disk{': full?' if free < 2**26 else ''})"


@runtime_checkable
class FactIndex(Protocol):
    """An ordered map of byte keys to byte values, extended in contiguous ranges of seqs."""

    @property
    def upto(self) -> int:
        """The next seq to index (0: nothing indexed yet)."""
        ...

    def extend(self, start: int, stop: int, facts: Sequence[Fact]) -> bool:
        """Add the facts of events ``start <= seq < stop``, atomically, and set ``upto`` to
        ``stop``. A key already present is overwritten.

        Returns:
            False, with nothing written, when ``upto`` is no longer ``start`` (another process
            indexed that range first).

        Raises:
            ValueError: ``stop < start``.
        """
        ...

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``, or None."""
        ...

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The value of each of ``keys`` (None where absent), read at one point in time."""
        ...

    def scan(self, prefix: bytes) -> list[Fact]:
        """Every ``(key, value)`` whose key starts with ``prefix``, in key order."""
        ...

    def close(self) -> None:
        """Release the index. Safe to call twice."""
        ...


_FORMAT = b"crc32/"
"""Prefixed to the ident an index is claimed for: an index written before facts carried
their checksum is emptied and built again."""


def _seal(key: bytes, value: bytes) -> bytes:
    """``value`` with the CRC-32 of ``key`` and ``value`` after it (4 bytes, big-endian)."""
    return bytes(value) + zlib.crc32(value, zlib.crc32(key)).to_bytes(4, "big")


def _check_range(start: int, stop: int) -> None:
    if stop < start:
        raise ValueError(f"stop {stop} is before start {start}")


class MemoryFactIndex:
    """The in-memory twin of :class:`LmdbFactIndex`."""

    def __init__(self) -> None:
        self._values: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []
        self._sorted = True
        self._upto = 0

    @property
    def upto(self) -> int:
        return self._upto

    def extend(self, start: int, stop: int, facts: Sequence[Fact]) -> bool:
        _check_range(start, stop)
        if start != self._upto:
            return False
        for key, value in facts:
            if key not in self._values:
                self._keys.append(key)
                self._sorted = False
            self._values[key] = bytes(value)
        self._upto = stop
        return True

    def get(self, key: bytes) -> bytes | None:
        return self._values.get(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return [self._values.get(k) for k in keys]

    def scan(self, prefix: bytes) -> list[Fact]:
        if not self._sorted:
            self._keys.sort()
            self._sorted = True
        i = bisect.bisect_left(self._keys, prefix)
        out: list[Fact] = []
        while i < len(self._keys) and self._keys[i].startswith(prefix):
            out.append((self._keys[i], self._values[self._keys[i]]))
            i += 1
        return out

    def close(self) -> None:
        pass


class LmdbFactIndex:
    """The :class:`FactIndex` in an LMDB environment of its own. Build with :meth:`open`.

    Several processes may open it at once (LMDB serialises their write transactions; the loser
    of a race to index the same range is told so by :meth:`extend`). The map doubles when full.

    The file is checked as the event log's is before LMDB reads it (its size, its meta pages,
    its page tree: LMDB crashes the process on a truncated or damaged file), and every fact is
    stored with a CRC-32 of its key and value, checked on every read: damage is
    :class:`IndexDamaged`, never a crash or a silently wrong fact. A fact whose key was
    damaged so that a lookup misses it is not found (a prefix scan that meets it does fail).
    """

    def __init__(self, path: Path, env: lmdb.Environment) -> None:
        self._path = path
        self._env = env
        self._facts = env.open_db(b"facts")
        self._meta = env.open_db(b"meta")
        self._closed = False

    @classmethod
    def open(cls, path: str | os.PathLike[str], ident: str) -> LmdbFactIndex:
        """Open (or create) the index in directory ``path`` for the log named ``ident``.

        An index made for another ident (another run, another index format) is emptied.

        Raises:
            OSError: the directory cannot be created or written.
            IndexWriteFailed: a write failed (a full disk).
            IndexDamaged: the file is damaged (:meth:`wipe` it and open again).
            NotAnIndex: ``path`` holds something else (:func:`refuse_other`).
        """
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        refuse_other(root)
        if not os.access(root, os.W_OK):
            raise PermissionError(f"{root}: not writable")
        allocate_lock_file(root, "fact index")  # LogError: no room (SIGBUS without it)
        try:
            if (root / DATA_FILE).exists():
                check_metas(root)
            env = lmdb.open(str(root), map_size=_INITIAL_MAP, max_dbs=2, sync=False)
        except lmdb.Error as exc:
            raise IndexDamaged(f"cannot open the fact index at {root}: {exc}") from None
        except LogError as exc:
            raise IndexDamaged(str(exc)) from None
        try:
            check_file_size(root, env)
            check_pages(root, env, writable=True)
        except LogError as exc:
            env.close()
            raise IndexDamaged(str(exc)) from None
        try:
            index = cls(root, env)
            index._claim(_FORMAT + ident.encode())
        except lmdb.Error as exc:  # creating its databases is a write: a full disk fails it
            env.close()
            raise IndexWriteFailed(f"cannot write the fact index at {root}: {exc}") from None
        except BaseException:
            env.close()
            raise
        return index

    @staticmethod
    def wipe(path: str | os.PathLike[str]) -> None:
        """Remove the index files in ``path`` (a damaged index, to be rebuilt). They are
        unlinked, not truncated: another process that has the file mapped keeps its pages.

        Raises:
            NotAnIndex: ``path`` holds something else (:func:`refuse_other`).
        """
        refuse_other(Path(path))
        for name in (DATA_FILE, ENV_LOCK_FILE):
            (Path(path) / name).unlink(missing_ok=True)

    def _claim(self, ident: bytes) -> None:
        """Empty the index unless it was made for ``ident``.

        Raises:
            IndexWriteFailed: the write failed (a full disk).
        """
        try:
            with self._env.begin(write=True) as txn:
                if txn.get(_IDENT, db=self._meta) != ident:
                    txn.drop(self._facts, delete=False)
                    txn.put(_IDENT, ident, db=self._meta)
                    txn.put(_UPTO, (0).to_bytes(8, "big"), db=self._meta)
        except lmdb.Error as exc:
            raise IndexWriteFailed(f"cannot write the fact index at {self._path}: {exc}") from None

    @property
    def path(self) -> Path:
        """The index directory."""
        return self._path

    @property
    def upto(self) -> int:
        return self._read(self._upto)

    def _upto(self, txn: lmdb.Transaction[bytes]) -> int:
        raw = txn.get(_UPTO, db=self._meta)
        return 0 if raw is None else int.from_bytes(raw, "big")

    def extend(self, start: int, stop: int, facts: Sequence[Fact]) -> bool:
        _check_range(start, stop)
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    if self._upto(txn) != start:
                        return False
                    cursor = txn.cursor(self._facts)
                    cursor.putmulti([(key, _seal(key, value)) for key, value in facts])
                    txn.put(_UPTO, stop.to_bytes(8, "big"), db=self._meta)
                return True
            except lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
            except lmdb.Error as exc:  # a full disk, an I/O error: nothing of it was stored
                raise IndexWriteFailed(
                    f"cannot write the fact index at {self._path}: {exc}{_free_note(self._path)}"
                ) from None

    def get(self, key: bytes) -> bytes | None:
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        raw = self._read(lambda txn: [txn.get(k, db=self._facts) for k in keys])
        return [None if v is None else self._unseal(k, v) for k, v in zip(keys, raw, strict=True)]

    def scan(self, prefix: bytes) -> list[Fact]:
        def body(txn: lmdb.Transaction[bytes]) -> list[Fact]:
            out: list[Fact] = []
            cursor = txn.cursor(self._facts)
            if not cursor.set_range(prefix):
                return out
            for key, value in cursor:
                if not key.startswith(prefix):
                    break
                out.append((key, value))
            return out

        return [(key, self._unseal(key, value)) for key, value in self._read(body)]

    def _unseal(self, key: bytes, sealed: bytes) -> bytes:
        value, crc = sealed[:-4], sealed[-4:]
        if len(sealed) < 4 or zlib.crc32(value, zlib.crc32(key)).to_bytes(4, "big") != crc:
            raise IndexDamaged(f"the fact index at {self._path} is damaged: a fact fails its CRC")
        return value

    def _read(self, body: Callable[[lmdb.Transaction[bytes]], T]) -> T:
        """Run ``body`` in a read transaction, adopting a map another process grew.

        Raises:
            IndexDamaged: LMDB found a damaged page.
        """
        while True:
            try:
                with self._env.begin() as txn:
                    return body(txn)
            except lmdb.MapResizedError:
                self._env.set_mapsize(0)
            except lmdb.CorruptedError as exc:
                raise IndexDamaged(f"the fact index at {self._path} is damaged: {exc}") from None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()

    def __enter__(self) -> LmdbFactIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
