"""What the ``coevo`` commands share: their input error, opening a run's log to read it,
naming the log in a read error, and keeping a world's prints off a command's output.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import functools
import os
import re
import sys
import tomllib
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from engine.errors import (
    CoevoError,
    EventSchemaChanged,
    LogCorrupted,
    LogDamaged,
    LogError,
    RunNotFound,
    SchemaTooNew,
)
from stores.lmdb_env import DATA_FILE
from stores.rundir import find_run

__all__ = [
    "ESCAPE_ERRORS",
    "InputInvalid",
    "LogUnreadable",
    "keep_stderr_open",
    "naming",
    "open_run",
    "read_meta",
    "scenario_dict",
    "stdout_to_stderr",
    "to_devnull",
    "torn_copy_hint",
    "torn_hint",
    "version",
]


class InputInvalid(CoevoError):
    """Bad command-line input that no more specific error describes (exit 2)."""

    exit_code = 2


def torn_hint(seq: int | None) -> str:
    """Added to a message that says a log's file or records are damaged: a copy taken with
    ``cp -r`` while its run wrote can be torn mid-commit and reads so. ``seq``: the first
    damaged record's, before which the events still read (None: the file itself is damaged,
    and nothing reads: ``log --to SEQ`` failed as every command did)."""
    before = f"; the events before it still read: coevo log RUN --to {seq}" if seq else ""
    return (
        " (a copy taken while its run wrote, by cp -r or rsync, can be torn like this: copy a "
        f"live run with `coevo copy RUN DEST`{before})"
    )


def torn_copy_hint(exc: BaseException) -> str:
    """:func:`torn_hint` when ``exc`` says a log's file or records are damaged, else ""."""
    if isinstance(exc, EventSchemaChanged):  # the bytes are as written: no copy tore them
        return ""
    if isinstance(exc, LogCorrupted):
        return torn_hint(exc.before)
    return torn_hint(None) if isinstance(exc, LogDamaged) else ""


@contextmanager
def naming(where: Path) -> Generator[None]:
    """Prefix the log's directory to a log error that does not name it already (a corrupted
    record names its seq; this says which log)."""
    try:
        yield
    except LogError as exc:
        note = ""
        if isinstance(exc, SchemaTooNew) and "unknown event kind" in str(exc):
            from agents.methods.registry import unimported_note

            note = unimported_note()
        if str(where) in str(exc) and not note:
            raise
        said = str(exc) if str(where) in str(exc) else f"{where}: {exc}"
        said += torn_copy_hint(exc)
        raise LogUnreadable(f"{said}; {note}" if note else said) from None


class _Stderr:
    """``sys.stderr`` that outlives its reader: once a write or flush finds the pipe closed
    (``coevo run 2>&1 | head``), file descriptor 2 is pointed at ``/dev/null`` and what is
    written after is dropped. A run's progress bar and warnings go to stderr; rich ends the
    process on a broken pipe (``SystemExit(1)``), which stopped a run mid-episode with nothing
    recorded. So for any other failed write (``2>/dev/full``): the process's last flush of
    stderr failed, and Python ended it with exit 120 instead of the command's code."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self._gone()

    def _gone(self) -> None:
        to_devnull(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def to_devnull(stream: Any) -> None:
    """Point ``stream``'s file descriptor at /dev/null: its reader has gone, and what is
    written (or flushed at exit) after must not fail."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


PATH_ARGUMENTS = (
    *("run", "runs", "run_a", "run_b", "file", "dest", "out", "index", "control", "policy"),
    *("tensorboard", "wandb", "mlflow"),
)
"""The ``coevo`` arguments that name files or directories (a run, a scenario, an output)."""
POSITIONAL_PATHS = frozenset({"run", "runs", "run_a", "run_b", "file", "dest"})
"""Those given without an option (``check ""`` named "." in its error); the options say
themselves what an empty one means."""


def home_expanded(args: argparse.Namespace) -> None:
    """Refuse an empty path among those ``args`` holds (:data:`PATH_ARGUMENTS`), and expand
    a leading ``~`` in them, as
    ``COEVO_CACHE`` is: the shell leaves it as it is in ``--out=~/x`` or quoted, and a
    directory named ``~`` was made in the working directory (which ``rm -rf ~`` would take
    for the home directory).

    Raises:
        InputInvalid: an empty path, or a ``~`` that cannot be expanded (no home directory, an
            unknown user).
    """
    for name in PATH_ARGUMENTS:
        value: Any = getattr(args, name, None)
        values: list[Any] = list(cast("list[Any]", value)) if isinstance(value, list) else [value]
        if "" in values and name in POSITIONAL_PATHS:  # Path("") is the working directory:
            raise InputInvalid(f"{name.upper()}: an empty path; name a file or directory")
        if not any(isinstance(v, str) and v.startswith("~") for v in values):
            continue
        expanded = [os.path.expanduser(v) if isinstance(v, str) else v for v in values]
        left = [v for v in expanded if isinstance(v, str) and v.startswith("~")]
        if left:
            raise InputInvalid(
                f"{left[0]}: its ~ names no home directory here (HOME unset, or no such user); "
                "write the path out"
            )
        setattr(args, name, expanded if isinstance(value, list) else expanded[0])


def _escaped(err: UnicodeError) -> tuple[str, int]:
    """What an output stream that cannot encode a character (``PYTHONIOENCODING=ascii``, a C
    locale without UTF-8 mode) writes instead: ``\\uXXXX``, which a JSON and a TOML string
    read back as the character (Python's ``\\xfc`` made ``validate``'s TOML and ``--json``
    output unreadable); beyond the BMP a pair of them, as JSON writes it (TOML refuses it)."""
    if not isinstance(err, UnicodeEncodeError):
        raise err
    out: list[str] = []
    for ch in err.object[err.start : err.end]:
        n = ord(ch)
        if n > 0xFFFF:  # a surrogate pair, as JSON writes it
            n -= 0x10000
            out.append(f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}")
        else:
            out.append(f"\\u{n:04x}")
    return "".join(out), err.end


ESCAPE_ERRORS = "coevo-escape"
"""The error handler of coevo's output streams (:func:`_escaped`)."""
codecs.register_error(ESCAPE_ERRORS, _escaped)


_LIMITED = (
    (re.compile(r"failed to map segment from shared object(: cannot allocate memory)?$"), "m"),
    (re.compile(r"cannot allocate memory"), "m"),
    (re.compile(r"too many open files"), "f"),
)
"""What the loader says of a native library it could not load for want of memory (under
``ulimit -v`` glibc's "failed to map segment" comes with no reason, or this one; with
another, such as a ``noexec`` mount's "Operation not permitted", it is not memory) or of
file descriptors."""

TOO_MANY_FILES = "too many open files (raise the limit: ulimit -n)"
"""How the command line names a process out of file descriptors, whichever error said so."""

_SAID = {"m": "out of memory for the process (a limit: ulimit -v)", "f": TOO_MANY_FILES}


def out_of_resources(exc: BaseException) -> str:
    """A one-line error for ``exc`` when it comes from the process running out of memory or
    file descriptors (a native library torch, tokenizers or matplotlib load that cannot be
    mapped, a ``MemoryError``); empty for any other error (raised as it is)."""
    if isinstance(exc, MemoryError):
        return (
            "out of memory (a MemoryError: the process asked for more than it may have; a "
            "limit such as ulimit -v, the machine's memory, or a size gone wrong)"
        )
    first = str(exc).splitlines()[0] if str(exc) else ""
    for pattern, kind in _LIMITED:
        if pattern.search(first.lower()):
            name = getattr(exc, "name", None) or "a library"
            return f"cannot load {name}: {_SAID[kind]}: {first}"
    return ""


def answered(code: int, text: str) -> int:
    """Write ``text`` (a command's output) and return ``code``, the command's answer (``diff``:
    the logs diverge; ``check``: an invariant fails), also when the reader goes away mid-way
    (``| head -1``): a broken pipe must not turn the answer into exit 0, which reads as "the
    logs do not diverge" to a script with ``pipefail``."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        to_devnull(sys.stdout)
    return code


def keep_stderr_open() -> None:
    """Make ``sys.stderr`` survive its reader going away (:class:`_Stderr`)."""
    if not isinstance(sys.stderr, _Stderr):
        sys.stderr = _Stderr(sys.stderr)


@contextmanager
def stdout_to_stderr() -> Generator[None]:
    """While a command builds or plays a world, what anything prints to stdout goes to stderr:
    a plug-in world (or the library or JVM under it) that prints must not corrupt what the
    command writes there (``validate``'s TOML, ``--json``). Both Python's ``sys.stdout`` and
    file descriptor 1 are redirected, when stdout is a real file."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
        err = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a captured or replaced stream: no fd
        fd = err = -1
    saved = os.dup(fd) if fd >= 0 and err >= 0 else -1
    if saved >= 0:
        os.dup2(err, fd)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved >= 0:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)


class LogUnreadable(CoevoError):
    """A log error raised while reading a run, with the log's directory in its message."""

    exit_code = 1


def open_run(path: str) -> Any:
    """The event log of the run at ``path``, opened for reading."""
    from agents.methods.registry import import_run_method
    from stores.lmdb_log import LmdbEventLog

    rd = find_run(path)
    try:
        log = LmdbEventLog.open(rd.log, writable=False)
    except CoevoError:
        raise
    except UnicodeEncodeError:  # a run directory moved to a path that is not UTF-8
        raise RunNotFound(f"{shown_path(path)}: {unopenable_path(path)}") from None
    except Exception as exc:  # lmdb's own errors: the directory is there but not readable
        raise RunNotFound(f"{path}: cannot open event log ({type(exc).__name__}: {exc})") from None
    import_run_method(log)  # a plug-in method's own events decode
    return log


def read_meta(path: str) -> Any:
    """The metadata of the run at ``path`` (None: its log holds none), read without the writer
    lock: it never changes."""
    log = open_run(path)
    try:
        with naming(log.path):
            return log.read_meta()
    finally:
        log.close()


def scenario_dict(text: str) -> dict[str, Any]:
    """A run's stored scenario (its metadata's ``scenario_toml``) as a table, empty where it
    is not TOML: read by ``coevo export`` and ``coevo diff``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


@functools.cache
def version() -> str:
    """This coevo's version as installed, and, when it runs from a git checkout (an editable
    install, a clone on ``PYTHONPATH``), the commit checked out as a local label
    (``0.1.0+g1a2b3c4d5e6f``), marked ``.dirty`` when tracked files differ from it
    (:func:`uncommitted`): every session of a run records it (``run_started``,
    ``run_resumed``), so a run resumed after an upgrade says which code wrote which part of
    it, and a run made by edited code does not pass for the commit's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        base = installed("coevo")
    except PackageNotFoundError:
        base = "0+unknown"
    root = Path(__file__).resolve().parents[2]
    commit = source_commit(root)
    if not commit:
        return base
    return f"{base}+g{commit[:12]}" + (".dirty" if uncommitted(root) else "")


def uncommitted(root: Path) -> bool:
    """Whether the tracked files of the git checkout at ``root`` differ from its commit
    (``git status``; files git does not track, runs and caches among them, do not count).
    False when it cannot be told: no ``git`` installed, a repository git refuses to read (owned
    by another user), or git slower than two seconds."""
    import shutil
    import subprocess

    git = shutil.which("git")
    if git is None:
        return False
    # no optional locks: never the index's lock a user's own git command would then meet
    argv = [git, "--no-optional-locks", "-C", str(root), "status", "--porcelain", "-uno"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=2, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


def source_commit(root: Path) -> str:
    """The commit checked out in the git repository at ``root`` (read from its files, no
    ``git`` run), or "" when ``root`` is not a coevo checkout or the commit cannot be read."""
    try:
        if not (root / "pyproject.toml").is_file():
            return ""
        git = root / ".git"
        if git.is_file():  # a worktree or a submodule: "gitdir: <path>"
            git = (root / git.read_text().removeprefix("gitdir:").strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head if re.fullmatch(r"[0-9a-f]{40,64}", head) else ""
        ref = head.removeprefix("ref:").strip()
        common = git
        if (git / "commondir").is_file():  # a worktree's branches live in the main .git
            common = (git / (git / "commondir").read_text().strip()).resolve()
        for where in (git, common):
            if (where / ref).is_file():
                return (where / ref).read_text().strip()
        packed = common / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                sha, _, name = line.partition(" ")
                if name == ref:
                    return sha
    except (OSError, UnicodeDecodeError):
        return ""
    return ""


def out_path(value: str | None, default: Callable[[], Path], *, lmdb: bool = False) -> Path:
    """Where ``--out`` says, or ``default()`` when it is not given.

    Raises:
        InputInvalid: it was given empty (``--out ""``: a script's unset variable, most
            likely), which must not quietly mean the default; or holding bytes that are not
            UTF-8.
    """
    if value is None:
        return default()
    return outside_lmdb(given_path(value, "--out", lmdb=lmdb), "--out")


def given_path(value: str, flag: str, *, lmdb: bool = False) -> Path:
    """The path an option ``flag`` gave for something to be written there (``--out``,
    ``--index``); ``lmdb``: an event log or index, which the log's library must open.

    Raises:
        InputInvalid: it is empty, or (``lmdb``) holds bytes that are not UTF-8.
    """
    if not value.strip():
        raise InputInvalid(f"{flag} is empty ({value!r}); give a path, or leave {flag} out")
    if lmdb:
        openable(value, flag)
    return Path(value)


def too_long(out: Path) -> str:
    """Why ``out`` is too long a path for a run directory (its path and the run's own files
    below it, :data:`RUN_PATHS`, beyond what the file system's paths hold), or ""."""
    there = out.absolute()
    while not there.exists() and there != there.parent:
        there = there.parent
    longest = os.pathconf(there, "PC_PATH_MAX") - 1  # bytes, less the terminating NUL
    if len(os.fsencode(out.absolute())) + RUN_PATHS <= longest:
        return ""
    return (
        f"too long a path for the run's files below it (this file system's paths hold "
        f"{longest} bytes, and the run writes up to {RUN_PATHS} more: "
        "checkpoints/.v000001.partial/generation_config.json ...)"
    )


RUN_PATHS = 96
"""Bytes a run's own paths may add below its directory (the longest, a checkpoint's file
while it is written, takes 51), with room for a plug-in's: a run whose path left less failed
at its first checkpoint ("File name too long"), once its episodes were played."""


def openable(path: str, flag: str, reader: str = "the event log's library") -> None:
    """Refuse ``path`` (given as ``flag``) before anything is made there when ``reader`` (a
    library that encodes its paths as UTF-8) cannot open it (:func:`unopenable_path`): the
    refusal came once a run directory or a copy's mark was made, which then read as no run
    at all.

    Raises:
        InputInvalid: it does not encode as UTF-8.
    """
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        said = unopenable_path(path, reader)
        raise InputInvalid(f"{flag} {shown_path(path)}: {said}") from None


def shown_path(path: str) -> str:
    """``path`` quoted as its bytes are, a byte that is not UTF-8 as ``\\xff`` (Python's
    ``repr`` shows the ``\\udcff`` it stands for in the text)."""
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:
        return repr(path)
    return "'" + raw.decode("utf-8", "backslashreplace") + "'"


def unopenable_path(path: str, reader: str = "the event log's library") -> str:
    """Why ``reader`` cannot open ``path``, a path that does not encode as UTF-8: it holds
    bytes that are not UTF-8, or (``LC_ALL=C`` with Python's UTF-8 modes off, where file names
    are ASCII to Python) characters the file-name encoding cannot hold."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        return f"a path that holds bytes that are not UTF-8, which {reader} cannot open; rename it"
    except UnicodeEncodeError:  # not a name of this file system's encoding at all
        pass
    return (
        f"a path that the file-name encoding ({sys.getfilesystemencoding()}) cannot hold, "
        f"which {reader} cannot open; use a UTF-8 locale (LC_ALL=C.UTF-8) or rename it"
    )


def resolved_path(path: Path, what: str) -> Path:
    """``path`` made absolute, its symbolic links followed.

    Raises:
        InputInvalid: it cannot be (a loop of symbolic links, a directory that cannot be
            read), saying so for ``what`` (the option or argument that gave it).
    """
    try:
        return path.resolve()
    except RuntimeError:  # Python 3.11's word for a loop of symbolic links
        raise InputInvalid(f"{what} {path}: a loop of symbolic links") from None
    except OSError as exc:
        raise InputInvalid(f"{what} {path}: {exc.strerror or exc}") from None


def outside_lmdb(path: Path, flag: str) -> Path:
    """``path`` (an output), refused when it is or lies in a directory of an LMDB environment
    (a run's ``log/``, its ``audit/`` index): files written there sit beside ``data.mdb``,
    where no output belongs and whose directory coevo treats as the log's alone.

    Raises:
        InputInvalid: it does, or ``path`` is a symbolic link to nothing (creating the
            directory there would fail with "File exists", which tells the user nothing).
    """
    resolved = resolved_path(path, flag)  # a loop of links first: it does not exist either
    if path.is_symlink() and not path.exists():
        raise InputInvalid(
            f"{flag} {path}: a symbolic link to {os.readlink(path)}, which does not exist; "
            "create its target or name another path"
        )
    for folder in (resolved, *resolved.parents):
        if (folder / DATA_FILE).is_file():
            raise InputInvalid(
                f"{flag} {path}: inside {folder}, the directory of an event log or index "
                f"({DATA_FILE}); write somewhere else"
            )
    return path


def newest_checkpoints(events: Any) -> dict[str, str]:
    """The checkpoint a resume loads for each trained model, from a run's ``events`` in log
    order (envelopes): ``{"policy": "checkpoints/v000002", "extractor": ...}`` (a model the
    run never updated is absent)."""
    return {role: name for role, (_, name) in newest_updates(events).items()}


def newest_updates(events: Any) -> dict[str, tuple[int, str]]:
    """:func:`newest_checkpoints` with the version each checkpoint holds:
    ``{"policy": (2, "checkpoints/v000002"), ...}``."""
    from agents.events.extractor import ExtractorUpdated
    from agents.events.policy import PolicyUpdated

    newest: dict[str, tuple[int, str]] = {}
    for env in events:
        ev = env.event
        if isinstance(ev, PolicyUpdated) and ev.checkpoint:
            newest["policy"] = (ev.policy_version, ev.checkpoint)
        elif isinstance(ev, ExtractorUpdated) and ev.checkpoint:
            newest["extractor"] = (ev.extractor_version, ev.checkpoint)
    return newest


def missing_checkpoints(root: Path, named: dict[str, str]) -> list[str]:
    """Of :func:`newest_checkpoints`, those not on disk under ``root`` as a resume loads them,
    as "the policy's checkpoints/v000002": their weights, or their optimiser's state ("the
    policy's checkpoints/v000002/optimizer.safetensors"; a resume without it failed after
    it had played a session's episodes, the log growing on every try)."""
    from stores.checkpoints import OPTIMIZER_FILE, weights_file

    gone: list[str] = []
    for role, name in named.items():
        if not weights_file(root / name).is_file():
            gone.append(f"the {role}'s {name}")
        elif not (root / name / OPTIMIZER_FILE).is_file():
            gone.append(f"the {role}'s {name}/{OPTIMIZER_FILE}")
    return gone


def damaged_checkpoints(root: Path, named: dict[str, str]) -> list[str]:
    """Of :func:`newest_checkpoints` on disk under ``root``, the files a resume loads whose
    safetensors header does not read or whose tensors the file does not cover (cut short,
    emptied), as "the policy's checkpoints/v000002/optimizer.safetensors (why)": a resume
    found them after it had played a session's episodes, the log growing on each try. (The
    weights' digest is checked as they load.)"""
    from safetensors import safe_open

    from stores.checkpoints import OPTIMIZER_FILE, weights_file

    bad: list[str] = []
    for role, name in named.items():
        for file in (weights_file(root / name), root / name / OPTIMIZER_FILE):
            try:
                with safe_open(str(file), framework="numpy") as tensors:  # pyright: ignore[reportUnknownVariableType]
                    tensors.keys()  # pyright: ignore[reportUnknownMemberType]
            except FileNotFoundError:
                continue  # missing_checkpoints says so
            except Exception as exc:  # safetensors' own error: its header
                bad.append(f"the {role}'s {name}/{file.name} ({exc})")
    return bad


def check_writable(path: Path, what: str) -> None:
    """Refuse, before any work, an output ``path`` (a file or a directory, there or not) whose
    nearest existing directory this process cannot write in: a read-only run directory made a
    probe play all its episodes before it failed to write its report.

    Raises:
        InputInvalid: it cannot be written; ``what`` names the option that moves it ("": the
            user gave that option already, and is told no more than why).
    """
    there = path if path.is_dir() else path.parent
    while not there.exists() and there != there.parent:
        there = there.parent
    elsewhere = f"; {what} writes it elsewhere" if what else ""
    if not there.is_dir():  # a path under a file: "no permission" said root could not
        raise InputInvalid(f"{path}: {there} is a file, not a directory{elsewhere}")
    if not os.access(there, os.W_OK | os.X_OK):
        why = "a read-only file system" if _read_only(there) else "no permission"
        raise InputInvalid(f"{path}: cannot write in {there} ({why}){elsewhere}")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def past_end(option: str, seq: int, end: int) -> str:
    """The note for a seq past a log of ``end`` events."""
    if not end:
        return f"{option} {seq}: the log holds no event"
    return f"{option} {seq} is past the log's end: its last event is seq {end - 1}"
