"""The LMDB environment under an event log: opened once per process, shared, remapped safely,
and the writer's lock file.

py-lmdb forbids opening one environment twice in a process, so every :class:`LmdbEventLog`
handle on a directory in one process shares one :class:`SharedEnv` (reference-counted,
read-only until a writer of the process joins). Remaps (map growth, adopting a map grown by
another process) and aborts of write transactions wait until no read transaction of the
process is open.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import socket
import threading
import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import lmdb

from engine.errors import LogDamaged, LogDenied, LogError, LogLocked, LogWriteFailed, NotALog
from stores import lmdb_pages

if TYPE_CHECKING:
    from lmdb import _Database as _Db

DATA_FILE = "data.mdb"
ENV_LOCK_FILE = "lock.mdb"
LOCK_FILE = "writer.lock"
LOG_FILES = frozenset({DATA_FILE, ENV_LOCK_FILE, LOCK_FILE})
"""Every file of a log directory: LMDB's data and lock files, the writer's lock."""
DB_NAMES = (b"events", b"meta", b"snapshots")


Init = Callable[[lmdb.Transaction, list["_Db"]], None]
"""What a new log stores in the transaction that creates its databases (its metadata)."""


def is_blank(path: Path) -> bool:
    """True if ``path/data.mdb`` exists and holds no commit: a log whose creation was
    interrupted before its first transaction (nothing of a run is in it). That is LMDB's two
    meta pages of transaction 0 or, killed a moment earlier, an empty file (LMDB creates the
    file, then writes its meta pages)."""
    return lmdb_pages.is_blank(path / DATA_FILE)


def open_env(
    path: Path, create: bool, writable: bool, map_size: int, durable: bool, init: Init | None = None
) -> tuple[lmdb.Environment, list[_Db]]:
    """Open the environment and its three databases (created if ``create``, with ``init`` in
    the same transaction: a log either holds its databases and metadata or nothing).

    A reader's environment is read-only: it opens the databases without a write transaction,
    so it never waits on the writer. ``map_size`` 0 adopts the size recorded in the file.

    Raises:
        LogError: LMDB refused to open it, it holds no coevo event log, or (``create``) it
            holds one already.
    """
    flags = {"create": create, "readonly": not writable, "sync": durable, "metasync": durable}
    check_metas(path)
    if create:
        with contextlib.suppress(OSError):  # LMDB says why it cannot
            path.mkdir(parents=True, exist_ok=True)
    had_lock = (path / ENV_LOCK_FILE).exists()
    allocate_lock_file(path)
    try:
        try:
            env = lmdb.open(str(path), map_size=map_size, max_dbs=len(DB_NAMES), **flags)
        except lmdb.Error as exc:
            denied = "Permission denied" in str(exc) and (path / DATA_FILE).is_file()
            if writable or not denied:
                raise
            # another user's run, readable by all, whose lock.mdb this user may not write
            _refuse_while_written(path)
            env = lmdb.open(
                str(path), map_size=map_size, max_dbs=len(DB_NAMES), lock=False, **flags
            )
    except lmdb.Error as exc:
        if not had_lock:  # refused: the directory is left as it was (a file not LMDB's)
            with contextlib.suppress(OSError):
                (path / ENV_LOCK_FILE).unlink()
        reason = str(exc).removeprefix(f"{path}: ")  # LMDB's messages start with the path
        denied = reason == os.strerror(errno.EACCES)  # a file of the log, or lock.mdb
        raise (LogDenied if denied else LogError)(
            f"cannot open event log at {path}: {reason}"
        ) from None
    try:
        check_file_size(path, env)
        check_pages(path, env, writable)
        if writable:  # py-lmdb keeps database handles opened in a write transaction only
            with env.begin(write=True) as txn:
                if create and txn.cursor().first():
                    raise LogError(f"an event log already exists at {path}")
                dbs = [env.open_db(name, txn=txn, create=create) for name in DB_NAMES]
                if init is not None:
                    init(txn, dbs)
        else:
            dbs = [env.open_db(name, create=False) for name in DB_NAMES]
    except lmdb.NotFoundError:
        env.close()
        raise NotALog(f"no coevo event log at {path} (LMDB file without its databases)") from None
    except lmdb.Error as exc:  # MDB_CORRUPTED and friends: damaged pages
        env.close()
        if "mdb_txn_commit" in str(exc):  # a commit refused (a full disk): nothing damaged
            raise LogWriteFailed(str(path), None, str(exc)) from None
        raise LogDamaged(f"event log at {path} is damaged: LMDB cannot open it ({exc})") from None
    except BaseException:
        env.close()
        raise
    return env, dbs


def _refuse_while_written(path: Path) -> None:
    """A reader without LMDB's reader table (``lock=False``) is safe only while nobody writes
    the log, whose writer could otherwise reuse pages being read.

    Raises:
        LogError: a writer may be writing it.
    """
    if writer_alive(path):
        raise LogError(
            f"cannot open event log at {path}: reading a run while it is written needs write "
            f"access to {path / ENV_LOCK_FILE} (LMDB's table of readers); read it once it "
            "has ended"
        )


LOCK_BYTES = 8192
"""The size LMDB gives its lock file with py-lmdb's 126 reader slots (its first opener
truncates the file to it; later ones size their reader table by the file)."""


def allocate_lock_file(path: Path, what: str = "event log") -> None:
    """Create ``path/lock.mdb`` with its blocks allocated, when it is missing or empty, or
    has a length and no block at all. LMDB creates it as a sparse file and maps it; on a full
    disk, touching the map killed the process with SIGBUS (every read command, on a run
    copied to a full disk; and every later one, once a process that died so had left the
    sparse file behind). A lock file with a block is left as it is: another process may be
    using it, sized by its length (one with none has never been written: LMDB writes its
    header first).

    Raises:
        LogError: there is no room for it.
    """
    lock = path / ENV_LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only directory, no such directory: LMDB says what it says
        return
    try:
        st = os.fstat(fd)
        if st.st_size == 0:
            os.posix_fallocate(fd, 0, LOCK_BYTES)
        elif st.st_blocks == 0:  # left by a process that died touching it: never written
            os.posix_fallocate(fd, 0, st.st_size)
    except OSError as exc:
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_size == 0:
                lock.unlink()
        raise LogError(
            f"cannot open the {what} at {path}: no room for its lock file {ENV_LOCK_FILE} "
            f"({exc.strerror or exc}: a full disk?)"
        ) from None
    finally:
        os.close(fd)


def check_file_size(path: Path, env: lmdb.Environment) -> None:
    """Refuse a data file shorter than the pages its last committed transaction uses: LMDB
    maps the file, and touching a page past its end kills the process with SIGBUS.

    Raises:
        LogDamaged: the file is truncated.
    """
    need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    have = os.stat(path / DATA_FILE).st_size
    if have < need:
        raise LogDamaged(
            f"event log at {path} is damaged: {DATA_FILE} has {have} bytes but its last "
            f"commit uses {need} (the file was truncated)"
        )


def check_metas(path: Path) -> None:
    """Refuse a data file whose two meta pages do not record consecutive commits
    (``lmdb_pages.metas_disagree``): LMDB would silently read it as of an older commit, and a
    writer would go on from there, over the lost commits.

    A live writer may commit between the reads of the two pages: only a disagreement read
    twice alike counts.

    Raises:
        LogDamaged: the meta pages disagree.
    """
    seen = None
    for _ in range(50):
        metas = lmdb_pages.read_metas(path / DATA_FILE)
        problem = lmdb_pages.metas_disagree(metas)
        if problem is None:
            return
        if metas == seen:
            raise LogDamaged(f"event log at {path} is damaged: {problem}")
        seen = metas
        time.sleep(0.01)
    # 50 readings, each different: a writer commits faster than two pages are read; its
    # commits are what the pages record, so nothing was lost


def check_pages(path: Path, env: lmdb.Environment, writable: bool) -> None:
    """Check every page LMDB may walk in the newest commit (``lmdb_pages.check_tree``) before
    anything walks it: LMDB asserts on a damaged branch or leaf page (the process aborts with
    ``Assertion 'IS_LEAF(mp)' failed``), where coevo reports it. The check holds a read
    transaction, so a live writer cannot reuse the pages it reads meanwhile. A ``writable``
    environment's free database is checked too (only writers read it).

    Raises:
        LogDamaged: a page is not what the page pointing at it says it is.
    """
    file = path / DATA_FILE
    for _ in range(100):  # a live writer may commit twice while we find the meta page
        with env.begin() as txn:
            txnid = txn.id()
            meta = _meta_of(file, txnid)
            if meta is None:
                continue
            if meta.main_root == lmdb_pages.P_INVALID:
                return  # no database yet
            with open(file, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                try:
                    lmdb_pages.check_tree(data, meta, free=writable)
                except lmdb_pages.PageDamaged as exc:
                    if _meta_of(file, txnid) != meta:
                        continue  # a live writer rewrote the meta page as it was read: again
                    raise LogDamaged(
                        f"event log at {path} is damaged: {exc} (commit {txnid}; LMDB would "
                        "abort reading it)"
                    ) from None
            return
    # 100 read transactions, each outrun by two commits before its meta page could be read: a
    # live writer commits faster than this reads; the pages are left to LMDB's own checks


def _meta_of(file: Path, txnid: int) -> lmdb_pages.Meta | None:
    """The meta page of commit ``txnid``, read twice the same (None: not there, or not the
    same twice). A live writer rewrites a meta page two commits later, in place: a read that
    meets the write half done gives one commit's number with another's roots (seen under load:
    a tree naming a page past the meta's last one), and two such reads agree only by chance."""
    first = next((m for m in lmdb_pages.read_metas(file) if m and m.txnid == txnid), None)
    again = next((m for m in lmdb_pages.read_metas(file) if m and m.txnid == txnid), None)
    return first if first == again else None


class SharedEnv:
    """The process's one ``lmdb.Environment`` for a log directory, with a remap gate.

    ``reading()`` brackets every read transaction; ``exclusive()`` waits until none is open and
    keeps new ones out, so that a remap or a reopen never pulls memory from under a reader.
    Instances live in ``_ENVS`` while they have users (:meth:`acquire` / :meth:`release`).
    """

    def __init__(
        self, path: Path, key: tuple[int, int], env: lmdb.Environment, dbs: list[_Db], durable: bool
    ) -> None:
        self.path = path
        self.key = key
        self.env = env
        self.events, self.meta, self.snapshots = dbs
        self.synced = durable
        self.users = 0
        self.write_lock = threading.RLock()  # one write transaction or remap at a time
        self._cond = threading.Condition()
        self._active = 0
        self._exclusive = False

    @classmethod
    def acquire(
        cls,
        path: Path,
        create: bool,
        writable: bool,
        map_size: int,
        durable: bool,
        init: Init | None = None,
    ) -> SharedEnv:
        """The shared environment of ``path`` (opened on first use), with one more user;
        ``create`` makes a new log with ``init`` (see :func:`open_env`)."""
        with _ENVS_LOCK:
            shared = None if create else _ENVS.get(_file_key(path))
            if shared is None:
                env, dbs = open_env(path, create, writable, map_size, durable, init)
                shared = cls(path, _file_key(path), env, dbs, durable)
                _ENVS[shared.key] = shared
            elif writable and not shared.writable:
                shared.reopen(writable=True, durable=durable)
            shared.users += 1
            return shared

    def release(self) -> None:
        """Drop one user; the last one closes the environment."""
        with _ENVS_LOCK:
            self.users -= 1
            if self.users == 0:
                del _ENVS[self.key]
                self.env.close()

    @property
    def writable(self) -> bool:
        return not self.env.flags()["readonly"]

    @contextmanager
    def reading(self) -> Generator[lmdb.Environment]:
        """Bracket a read transaction (it holds off remaps and write aborts); yields the env."""
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._active += 1
        try:
            yield self.env
        finally:
            with self._cond:
                self._active -= 1
                if not self._active:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Generator[None]:
        """Hold the write lock, wait until no read transaction of this process is open, and
        keep new ones out. Needed by ``set_mapsize``, and by a write transaction's abort:
        py-lmdb's abort waits until no thread is inside LMDB, which two busy readers prevent."""
        with self.write_lock:
            with self._cond:
                self._exclusive = True
                while self._active:
                    self._cond.wait()
            try:
                yield
            finally:
                with self._cond:
                    self._exclusive = False
                    self._cond.notify_all()

    def resize(self, grow: bool) -> None:
        """Double the map (``grow``, after ``MapFullError``) or adopt the size another process
        grew it to (after ``MapResizedError``). The caller holds :meth:`exclusive`."""
        self.env.set_mapsize(self.env.info()["map_size"] * 2 if grow else 0)

    def reopen(self, writable: bool, durable: bool) -> None:
        """Reopen the environment, e.g. read-write for a writer joining this process's readers."""
        with self.exclusive():
            self.env.close()
            try:
                opened = open_env(self.path, False, writable, 0, durable)
            except BaseException:  # back to the environment as it was
                opened = open_env(self.path, False, not writable, 0, self.synced)
                self.env, (self.events, self.meta, self.snapshots) = opened
                raise
            self.env, (self.events, self.meta, self.snapshots) = opened
            self.synced = durable


_ENVS: dict[tuple[int, int], SharedEnv] = {}
_ENVS_LOCK = threading.Lock()


class WriterLock:
    """A log's writer lock, held: on ``writer.lock`` and on the log directory itself (None
    where its file system cannot lock a directory). :meth:`release` (or the process dying)
    lets them go."""

    def __init__(self, file_fd: int, dir_fd: int | None) -> None:
        self._fds = [fd for fd in (file_fd, dir_fd) if fd is not None]

    def release(self) -> None:
        """Let the lock go. Safe to call twice."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)


def lock_writer(path: Path) -> WriterLock:
    """Take the log's writer lock (exclusive, non-blocking ``flock``) and note our pid in it.

    The lock is held on the log directory itself as well as on ``writer.lock``: a lock file
    deleted (or replaced by a sync tool) while a run writes is a new file, and its lock alone
    let a second process write the same log. A file system that cannot lock a directory (some
    network ones) keeps the file's lock alone.

    Raises:
        LogLocked: another handle, in this process or another, holds it.
        LogError: the lock file cannot be opened for writing (a read-only directory).
    """
    dir_fd = _lock_directory(path)
    try:
        return WriterLock(_lock_file(path), dir_fd)
    except BaseException:
        if dir_fd is not None:
            os.close(dir_fd)
        raise


def lock_directory(path: Path) -> int | None:
    """``path``'s descriptor with an exclusive, non-blocking ``flock`` on it (released when
    it is closed or the process ends); None where ``path`` is not a directory that can be
    opened, or its file system cannot lock one (some network ones).

    Raises:
        BlockingIOError: another open descriptor, in this process or another, holds it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError:
        os.close(fd)
        return None
    return fd


def _lock_directory(path: Path) -> int | None:
    """The log directory, locked (:func:`lock_directory`; None: the lock file's lock alone,
    whose open says what is wrong with a path that is no directory).

    Raises:
        LogLocked: another process holds it.
    """
    try:
        return lock_directory(path)
    except BlockingIOError:
        try:
            noted = (path / LOCK_FILE).read_text(errors="replace")
        except OSError:
            noted = ""  # the lock file deleted under its writer
        raise _locked(path, noted) from None


def _lock_file(path: Path) -> int:
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:  # a read-only directory or file system, a full disk
        raise (LogDenied if isinstance(exc, PermissionError) else LogError)(
            f"cannot open the event log at {path} for writing: {exc.strerror or exc}"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        noted = os.pread(fd, 300, 0).decode(errors="replace")
        os.close(fd)
        raise _locked(path, noted) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {_HOST}\n".encode(), 0)
    except OSError as exc:  # a full disk: the lock holds, but say who holds it or nothing
        os.close(fd)
        raise LogError(f"cannot write the writer lock of {path}: {exc.strerror or exc}") from None
    return fd


def _locked(path: Path, noted: str) -> LogLocked:
    """The error for a writer lock held by another handle, naming the pid it noted."""
    words = noted.split()
    holder = f"{words[0]} on {words[1]}" if len(words) > 1 else "".join(words) or "unknown"
    return LogLocked(
        f"event log at {path} already has a writer (pid {holder}); "
        "open it with writable=False to read",
        holder=f"written by pid {holder}",
    )


_HOST = socket.gethostname().replace(" ", "_") or "unknown-host"
"""This machine's name, noted beside the writer's pid: a pid means nothing on another one."""


def writer_alive(path: Path) -> bool:
    """Whether the process that last took the log's writer lock at ``path`` may still be
    running: the pid it noted, asked with signal 0 when it noted this machine's name (the lock
    itself is not touched, so a writer starting now is never refused), and on Linux whether
    that process holds the lock file open (:func:`_holds_open`). A run killed with SIGKILL
    leaves its pid behind, not its process. A writer on another machine (a run
    directory on a shared file system) cannot be asked: it counts as running. Where the lock
    file tells of no live writer (deleted or replaced while a run writes), the lock a writer
    holds on the log directory itself does (:func:`_directory_locked`)."""
    return _noted_writer_alive(path) or _directory_locked(path)


def _noted_writer_alive(path: Path) -> bool:
    """Whether the writer noted in the lock file at ``path`` may still be running."""
    try:
        noted = (path / LOCK_FILE).read_text().split()
        pid = int(noted[0]) if noted else 0
    except (OSError, ValueError):
        return False
    if len(noted) > 1 and noted[1] != _HOST:
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return _holds_open(pid, path / LOCK_FILE) is not False


def _directory_locked(path: Path) -> bool:
    """Whether some process holds a ``flock`` on the directory ``path`` (a log's writer holds
    one: :func:`lock_writer`), from Linux's ``/proc/locks``, which lists every lock by its
    file's device and inode without touching it; False where that cannot be read."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as lines:
            table = lines.read()
    except OSError:
        return False
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if "FLOCK" in fields and want in fields and "->" not in fields:
            return True
    return False


def _holds_open(pid: int, file: Path) -> bool | None:
    """Whether process ``pid`` of this machine has ``file`` open (the writer holds its lock
    file open while it writes), from ``/proc/PID/fd``; None where that cannot be read (not
    Linux, another user's process). A process that merely has the noted pid (pids are reused:
    a container's pid 1 always exists) is not the writer."""
    try:
        want = os.stat(file)
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile, or not a file
            continue
        if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
            return True
    return False


def _file_key(path: Path) -> tuple[int, int]:
    st = os.stat(path / DATA_FILE)
    return st.st_dev, st.st_ino
