"""Faults a run meets without being resumed, with real processes: a full disk under the log, a
second process writing the same run, a world that raises mid-episode and an actor that keeps
failing. Each ends in a clear message; the log stays valid."""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import fault_counts
import pytest

ROOT = Path(__file__).resolve().parents[2]
COEVO = str(Path(sys.executable).parent / "coevo")
EXPLORE = str(ROOT / "scenarios" / "explore.toml")
LONG_RUN = ("--set", "run.episodes=10000000", "--set", "run.workers=1")


def coevo(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COEVO, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
        **kwargs,  # type: ignore[arg-type]
    )


def test_too_few_open_files_is_one_line_and_the_run_resumes(tmp_path: Path) -> None:
    """Under ``ulimit -n 10`` the event loop's socket pair failed as a traceback (``run`` and
    ``resume``); under 8, opening the log for a resume did."""

    def few_files(limit: int) -> Callable[[], None]:
        return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    run = tmp_path / "run"
    args = ("--quiet", "--set", "run.episodes=20")
    proc = coevo("run", EXPLORE, "--out", str(run), *args, preexec_fn=few_files(10))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("coevo: error: the run stopped: too many open files")
    assert f"`coevo resume {run}` continues the run" in proc.stderr
    proc = coevo("resume", str(run), "--quiet", preexec_fn=few_files(8))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("coevo: error: too many open files (raise the limit")
    assert coevo("resume", str(run), "--quiet").returncode == 0
    assert verified(run) > 0


def test_a_path_too_long_or_not_utf8_is_one_line(tmp_path: Path) -> None:
    """A run directory name over 255 bytes, or with a byte that is not UTF-8, was a traceback
    in ``run``, ``log`` and ``replay``."""
    long = tmp_path / ("n" * 256)
    for args in (("run", EXPLORE, "--out", str(long), "--quiet"), ("log", str(long))):
        proc = coevo(*args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("coevo: error: a path is too long for this file system")
    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b"/bad\xffname")
    proc = coevo("run", EXPLORE, "--out", odd, "--quiet", "--set", "run.episodes=2")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "bad\\xffname': a path that holds bytes that are not UTF-8" in proc.stderr
    assert not os.path.lexists(odd)  # refused before the run directory was made
    proc = coevo(
        "run", EXPLORE, "--out", str(tmp_path / "good"), "--quiet", "--set", "run.episodes=2"
    )
    assert proc.returncode == 0, proc.stderr
    proc = coevo("copy", str(tmp_path / "good"), odd)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("coevo: error: DEST '") and "bad\\xffname': a path" in proc.stderr
    assert not os.path.lexists(odd)
    page = os.fsdecode(os.fsencode(str(tmp_path)) + b"/r\xff.html")  # no event log: written
    proc = coevo("report", str(tmp_path / "good"), "--out", page)
    assert proc.returncode == 0 and os.path.isfile(page), proc.stderr
    os.rename(tmp_path / "good", odd)  # a run moved there: read by every command, as named
    for args in (("replay", odd, "--verify"), ("log", odd), ("resume", odd)):
        proc = coevo(*args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert "bad\\xffname': a path that holds bytes that are not UTF-8" in proc.stderr


def test_a_path_an_ascii_file_name_encoding_cannot_hold_is_one_line(tmp_path: Path) -> None:
    """Under ``LC_ALL=C`` with Python's UTF-8 modes off, file names are ASCII to Python: a
    run directory named in Japanese was a traceback (the log's library encodes the path)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG"))}
    env |= {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    proc = coevo("run", EXPLORE, "--out", str(tmp_path / "r 日本"), "--quiet", env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "a path that the file-name encoding (ascii) cannot hold" in proc.stderr


def test_a_full_disk_as_the_log_is_created_is_a_refused_write_not_damage(
    tmp_path: Path,
) -> None:
    """A file-size limit hit by the log's first commit read "event log ... is damaged: LMDB
    cannot open it"; nothing was damaged, and a run may be created there once there is room."""

    def tiny_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, resource.RLIM_INFINITY))

    run = tmp_path / "run"
    proc = coevo("run", EXPLORE, "--out", str(run), "--quiet", preexec_fn=tiny_files)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"coevo: error: cannot write the event log at {run / 'log'}")
    assert "(disk full, or a file-size limit?); metadata not stored" in proc.stderr
    args = ("--quiet", "--set", "run.episodes=4")
    assert coevo("run", EXPLORE, "--out", str(run), *args).returncode == 0


def test_a_refused_write_names_its_likely_cause() -> None:
    from engine.errors import LogWriteFailed

    said = {
        reason: str(LogWriteFailed("log", 3, reason))
        for reason in (
            "mdb_put: Cannot allocate memory",
            "mdb_txn_commit: Input/output error",
            "mdb_txn_commit: File too large",
            "mdb_txn_commit: Operation not permitted",
        )
    }
    # an immutable file (chattr +i) was told "disk full, or a file-size limit?"
    assert (
        "(a file made immutable or append-only: lsattr?)"
        in said["mdb_txn_commit: Operation not permitted"]
    )
    assert "(out of memory?)" in said["mdb_put: Cannot allocate memory"]
    assert "(disk full, or a file-size limit?)" in said["mdb_txn_commit: Input/output error"]
    assert "(a file-size limit: ulimit -f?)" in said["mdb_txn_commit: File too large"]
    from engine.errors import CheckpointNotWritten  # a too-long path was told "disk full"

    long = str(CheckpointNotWritten("c/.v1.partial", "[Errno 36] File name too long: 'c'"))
    assert "(a path longer than the file system holds: a shorter run path)" in long
    assert long.endswith(
        "coevo copy RUN DEST to a shorter path, and coevo resume DEST, continue the run"
    )


def output_envs() -> list[dict[str, str]]:
    """The environment with stdout buffered and without (``PYTHONUNBUFFERED``, which this
    machine and many containers set: the tests passed under it while a buffered stdout's
    last flush failed at exit, exit 120 and a traceback)."""
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return [plain, {**plain, "PYTHONUNBUFFERED": "1"}]


def test_a_command_started_with_its_output_closed_is_no_traceback(tmp_path: Path) -> None:
    """``coevo log RUN >&-`` (and ``check``, ``audit``) failed on ``sys.stdout`` being None."""
    run = tmp_path / "run"
    args = ("--quiet", "--set", "run.episodes=4")
    assert coevo("run", EXPLORE, "--out", str(run), *args).returncode == 0
    for command in (["log", str(run)], ["check", str(run)]):
        proc = coevo(*command, preexec_fn=lambda: os.close(1))
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_a_reader_gone_from_the_pipe_ends_every_command_with_0(tmp_path: Path) -> None:
    """``coevo replay RUN | head -1`` exited 1 (rich's broken-pipe handling) where ``log`` and
    ``check`` exit 0, which broke ``set -o pipefail`` scripts."""
    run = tmp_path / "run"
    args = ("--quiet", "--set", "run.episodes=4")
    assert coevo("run", EXPLORE, "--out", str(run), *args).returncode == 0
    commands = (["replay", str(run)], ["log", str(run)], ["check", str(run)])
    for command, env in itertools.product(commands, output_envs()):
        gone, out = os.pipe()
        os.close(gone)  # every write to the pipe fails: its reader has gone
        try:
            proc = subprocess.run(
                [COEVO, *command], stdout=out, stderr=subprocess.PIPE, text=True,
                cwd=ROOT, timeout=120, check=False, env=env,
            )  # fmt: skip
        finally:
            os.close(out)
        assert proc.returncode == 0 and proc.stderr == "", (command, proc.stderr)


def test_output_onto_a_full_disk_is_one_line(tmp_path: Path) -> None:
    """``coevo log RUN > /dev/full`` (a full disk under the output) was a traceback in most
    read commands."""
    run = tmp_path / "run"
    args = ("--quiet", "--set", "run.episodes=4")
    assert coevo("run", EXPLORE, "--out", str(run), *args).returncode == 0
    commands = (["log", str(run), "--json"], ["replay", str(run)], ["check", str(run)])
    commands = (*commands, ["audit", str(run), "episode", "ep000000"])
    for command, env in itertools.product(commands, output_envs()):
        with open("/dev/full", "w") as full:
            proc = subprocess.run(
                [COEVO, *command], stdout=full, stderr=subprocess.PIPE, text=True,
                cwd=ROOT, timeout=120, check=False, env=env,
            )  # fmt: skip
        said = "coevo: error: cannot write the output: No space left on device\n"
        assert proc.returncode == 1 and proc.stderr == said, (command, proc.stderr)


def test_help_onto_a_full_disk_and_an_error_onto_a_full_stderr_keep_their_exit_codes() -> None:
    """``coevo --help > /dev/full`` printed "Exception ignored in ..." and exited 120 (the
    process's last flush failed), and so did bad input with ``2> /dev/full``, whose
    documented exit code is 2."""
    for command, into, code, said in (
        (["--help"], "stdout", 1, "coevo: error: cannot write the output: No space left"),
        (["log", "--help"], "stdout", 1, "coevo: error: cannot write the output: No space left"),
        (["check", "/nonexistent"], "stderr", 2, ""),
        (["log", "--no-such-option"], "stderr", 2, ""),
    ):
        for env in output_envs():
            with open("/dev/full", "w") as full:
                streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, into: full}
                proc = subprocess.run(
                    [COEVO, *command], **streams, text=True, cwd=ROOT, timeout=120,
                    check=False, env=env,
                )  # fmt: skip
            err = proc.stderr or ""
            assert (proc.returncode, "Traceback" in err) == (code, False), (command, err)
            assert err.startswith(said) and err.count("\n") == bool(said), (command, err)


def test_an_output_cut_short_by_a_full_disk_is_an_error_without_a_buffer(
    tmp_path: Path,
) -> None:
    """Under ``PYTHONUNBUFFERED`` (containers set it) stdout has no buffer: a write larger than
    the room left was cut short and the rest dropped without an error, so ``replay --json``
    onto a full disk exited 0 with a cut output. A file-size limit cuts it here as a full
    disk does."""
    run = tmp_path / "run"
    args = ("--quiet", "--set", "run.episodes=64")
    assert coevo("run", EXPLORE, "--out", str(run), *args).returncode == 0
    limit = 16_384

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    commands = (["replay", str(run), "--json"], ["log", str(run)])
    for command, env in itertools.product(commands, output_envs()):
        target = tmp_path / "out"
        with target.open("w") as out:
            proc = subprocess.run(
                [COEVO, *command], stdout=out, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                timeout=120, check=False, preexec_fn=small_files, env=env,
            )  # fmt: skip
        assert target.stat().st_size == limit  # the output did not fit
        said = "coevo: error: cannot write the output: File too large\n"
        assert proc.returncode == 1 and proc.stderr == said, (command, proc.stderr)


def test_an_output_path_through_a_bad_symbolic_link_is_one_line(tmp_path: Path) -> None:
    """``--out`` through a loop of symbolic links was a traceback (``Path.resolve``'s
    RuntimeError) in ``run``, ``report``, ``export`` and ``copy``; a link to nothing was
    "File exists" (``run``, ``copy``) or "cannot read: No such file or directory"
    (``report``)."""
    run = tmp_path / "run"
    args = ("--quiet", "--set", "run.episodes=4")
    assert coevo("run", EXPLORE, "--out", str(run), *args).returncode == 0
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    loop, dangling = str(tmp_path / "loop1"), str(tmp_path / "dangling")
    for where, why in (
        (loop, "a loop of symbolic links"),
        (dangling, f"a symbolic link to {tmp_path / 'nowhere'}, which does not exist; "
         "create its target or name another path"),
    ):  # fmt: skip
        for command, flag in (
            (["run", EXPLORE, "--out", where], "--out"),
            (["report", str(run), "--out", where], "--out"),
            (["export", str(run), "--tensorboard", where], "--tensorboard"),
            (["copy", str(run), where], "DEST"),
        ):
            proc = coevo(*command)
            said = f"coevo: error: {flag} {where}: {why}\n"
            assert proc.returncode == 2 and proc.stderr == said, (command, proc.stderr)
    assert not (tmp_path / "nowhere").exists()


def test_a_run_whose_stderr_reader_has_gone_completes(tmp_path: Path) -> None:
    """``coevo run ... 2>&1 | head -2`` ended the run after a few seconds with exit 1 and
    nothing recorded (rich ends the process on a broken pipe, and the progress bar writes to
    stderr); ``log --follow | head -1`` was a traceback."""
    run = tmp_path / "run"
    gone, err = os.pipe()
    os.close(gone)  # every write to stderr fails: its reader has gone
    try:
        proc = subprocess.run(
            [COEVO, "run", EXPLORE, "--out", str(run), "--set", "run.episodes=60"],
            stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT, timeout=300, check=False,
            env={**os.environ, "COLUMNS": "80"},
        )  # fmt: skip
    finally:
        os.close(err)
    assert proc.returncode == 0
    log = coevo("log", str(run), "--json")
    last = json.loads(log.stdout.splitlines()[-1])["event"]
    assert last["kind"] == "run_stopped" and last["reason"] == "completed", last
    assert verified(run) > 0
    gone, out = os.pipe()
    os.close(gone)
    try:
        proc = subprocess.run(
            [COEVO, "log", str(run), "--follow"], stdout=out, stderr=subprocess.PIPE, text=True,
            cwd=ROOT, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(out)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def verified(run: Path) -> int:
    """The event count ``coevo replay --verify`` reports (it must pass)."""
    proc = coevo("replay", str(run), "--verify")
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[1])


def test_a_full_disk_is_one_line_and_the_log_still_verifies(tmp_path: Path) -> None:
    """The log's file cannot grow past 512 KiB (RLIMIT_FSIZE: the writes fail as on a full disk,
    and LMDB reports an I/O error): the run stops with one line naming the log and the first
    seq not stored, and everything committed before verifies."""

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (512 * 1024, resource.RLIM_INFINITY))

    run = tmp_path / "run"
    proc = coevo(
        "run", EXPLORE, "--out", str(run), "--quiet", "--set", "run.episodes=2000",
        preexec_fn=small_disk,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    prefix = f"coevo: error: cannot write the event log at {run / 'log'}: "
    assert lines[0].startswith(prefix), lines[0]
    seq = int(lines[0].split("events from seq ")[1].split()[0])
    assert lines[0].endswith(f"events from seq {seq} not stored, the log keeps every commit before")
    assert verified(run) == seq > 0
    tail = coevo("log", str(run), "--from", str(seq - 1), "--json")
    assert tail.returncode == 0 and len(tail.stdout.splitlines()) == 1


def test_resume_in_a_read_only_directory_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The writer lock cannot be opened (a read-only file system; as root, chmod would not
    stop the test): one line, not the OSError's traceback."""
    from scenarios.cli import main

    run = tmp_path / "run"
    assert main(["run", EXPLORE, "--out", str(run), "--quiet", "--set", "run.episodes=5"]) == 0
    capsys.readouterr()
    real = os.open

    def read_only(path: object, flags: int, *args: object) -> int:
        if str(path).endswith("writer.lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", read_only)
    assert main(["resume", str(run)]) == 2  # it completed: as on a writable disk
    err = capsys.readouterr().err
    assert err.startswith(f"coevo: error: {run}: the run completed (run_stopped at seq ")
    assert err.endswith("); nothing to resume\n")  # (one that did not: test_resume.py)


def another_user() -> list[str]:
    """The prefix that runs a command as a user the test's chmod stops: none for a user that
    is not root; as root (whom chmod stops not), ``setpriv`` to nobody (skipped without it,
    or where nobody cannot run this Python)."""
    if os.geteuid() != 0:
        return []
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: chmod stops no one")
    if subprocess.run([*nobody, sys.executable, "-c", ""], check=False).returncode != 0:
        pytest.skip("nobody cannot run this Python")
    return nobody


def test_a_path_this_user_may_not_enter_is_one_line(tmp_path: Path) -> None:
    """A run directory, or the parent of an output, this user may not enter: every command
    that opened a run (Python's ``is_file`` raises on EACCES) or checked its output path
    showed the PermissionError's traceback. One line naming the path, exit 2."""
    from engine.eventlog import new_run_meta
    from stores.lmdb_log import LmdbEventLog

    run, locked = tmp_path / "run", tmp_path / "locked"
    # (nobody cannot pass pytest's own temporary directory, 0700: this one it can)
    reachable = Path(tempfile.mkdtemp(prefix="coevo-test-"))
    reachable.chmod(0o755)
    unwritable = reachable / "unwritable"
    meta = new_run_meta("r", scenario_name="s", seed=0, coevo_version="test")
    LmdbEventLog.create(run / "log", meta).close()
    (locked / "sub").mkdir(parents=True)
    unwritable.mkdir()
    prefix = another_user()
    tmp_path.chmod(0o755)  # (nobody must reach what is not locked)
    run.chmod(0o000)
    locked.chmod(0o000)
    unwritable.chmod(0o555)
    try:
        # refused before the run's model is built (minutes, with a real one), not after
        proc = subprocess.run(
            [*prefix, COEVO, "run", EXPLORE, "--out", str(unwritable / "sub" / "new")],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (
            f"coevo: error: {unwritable}/sub/new: cannot create it: {unwritable} is not "
            "writable by this user; choose another --out\n"
        )
        for args in (
            ["log", str(run)],
            ["check", str(run)],
            ["run", EXPLORE, "--out", str(locked / "sub" / "new")],
        ):
            proc = subprocess.run(
                [*prefix, COEVO, *args], capture_output=True, text=True, timeout=300, check=False
            )
            assert proc.returncode == 2, (args, proc.stderr)
            assert proc.stderr.startswith("coevo: error: "), (args, proc.stderr)
            assert "Permission denied" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    finally:
        run.chmod(0o755)
        locked.chmod(0o755)
        unwritable.chmod(0o755)
        shutil.rmtree(reachable)


@pytest.mark.parametrize("limit", ["disk", "memory"])
def test_curves_that_cannot_be_written_are_one_line_and_the_log_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], limit: str
) -> None:
    """The disk fills up after the log's last commit: the curves cannot be written. One line
    and exit 1 (the run itself completed), not a traceback. So too when the plotting library
    cannot be loaded under a memory limit (ulimit -v): a traceback, and a failed run's own
    line never came."""
    import dataclasses

    import scenarios.assemble
    from scenarios.cli import main

    def full_disk(root: Path, events: object) -> list[str]:
        if limit == "memory":
            raise ImportError(
                "/x/_backend_agg.so: failed to map segment from shared object", name="_backend_agg"
            )
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(root / "curves.png"))

    assemble = scenarios.assemble.assemble
    monkeypatch.setattr(
        scenarios.assemble,
        "assemble",
        lambda *a, **k: dataclasses.replace(assemble(*a, **k), report=full_disk),
    )
    run = tmp_path / "run"
    assert main(["run", EXPLORE, "--out", str(run), "--quiet", "--set", "run.episodes=5"]) == 1
    said = (
        f"cannot write the run's curves in {run}: No space left on device"
        if limit == "disk"
        else "cannot draw the run's curves: cannot load _backend_agg: out of memory for the "
        "process (a limit: ulimit -v): /x/_backend_agg.so: failed to map segment from shared "
        "object"
    )
    assert capsys.readouterr().err == (
        f"coevo: error: {said} (the log is complete: coevo report {run} draws them)\n"
    )
    assert verified(run) > 0


def test_audit_on_a_full_disk_indexes_in_memory(tmp_path: Path) -> None:
    """The audit index cannot be written (RLIMIT_FSIZE: as on a full disk), when it is created
    or when it is filled: the answer comes from an index in memory, with a note."""
    run = tmp_path / "run"
    assert (
        coevo("run", EXPLORE, "--out", str(run), "--quiet", "--set", "run.episodes=20").returncode
        == 0
    )
    for limit in (12 * 1024, 40 * 1024):  # its databases, then its facts do not fit

        def small_disk(limit: int = limit) -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

        shutil.rmtree(run / "audit", ignore_errors=True)
        proc = coevo("audit", str(run), "episode", "ep000001", preexec_fn=small_disk)
        assert proc.returncode == 0, proc.stderr
        assert "ended: " in proc.stdout
        assert proc.stderr.startswith(
            f"coevo: note: cannot keep the audit index in {run / 'audit'}"
        )
        assert proc.stderr.count("\n") == 1 and "indexing in memory" in proc.stderr


def wait_for_writer(run: Path, proc: subprocess.Popen[str]) -> int:
    lock = run / "log" / "writer.lock"
    for _ in range(600):
        if lock.is_file() and lock.read_text().strip():
            return int(lock.read_text().split()[0])  # "PID HOST"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    pytest.fail("the first run never took the writer lock")


def wait_for_a_commit(run: Path, proc: subprocess.Popen[str]) -> None:
    """Wait until the run's log holds a commit (it took its writer lock before creating it)."""
    from stores.lmdb_env import is_blank

    data = run / "log" / "data.mdb"
    for _ in range(600):
        if data.is_file() and data.stat().st_size > 0 and not is_blank(run / "log"):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    pytest.fail("the run never committed")


def test_a_second_process_writing_the_same_run_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = subprocess.Popen(
        [COEVO, "run", EXPLORE, "--out", str(run), "--quiet", *LONG_RUN],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        pid = wait_for_writer(run, first)
        assert pid == first.pid
        second = coevo("run", EXPLORE, "--out", str(run), "--quiet")
        assert second.returncode == 2
        assert second.stderr == f"coevo: error: {run}: already holds a run; choose another --out\n"
        code = (
            "import sys\n"
            "from engine.errors import LogLocked\n"
            "from stores.lmdb_log import LmdbEventLog\n"
            "try:\n"
            "    LmdbEventLog.open(sys.argv[1], writable=True)\n"
            "except LogLocked as exc:\n"
            "    print(exc)\n"
            "    sys.exit(3)\n"
        )
        writer = subprocess.run(
            [sys.executable, "-c", code, str(run / "log")],
            capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
        )  # fmt: skip
        assert writer.returncode == 3, writer.stderr
        assert f"already has a writer (pid {first.pid} on {socket.gethostname()})" in writer.stdout
        reader = coevo("log", str(run), "--limit", "3", "--json")  # readers are never refused
        assert reader.returncode == 0 and len(reader.stdout.splitlines()) == 3
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 143
    events = verified(run)
    last = json.loads(coevo("log", str(run), "--from", str(events - 1), "--json").stdout)
    assert last["event"]["kind"] == "run_stopped"


@pytest.mark.faults
def test_two_runs_started_at_once_on_one_directory_leave_one_run(tmp_path: Path) -> None:
    """Whatever the timing, one run writes and the other is refused: creating the log claims
    the directory (the writer lock, then a log that is no longer blank), and a run that
    finished before the other looked leaves a directory that holds a run. Two exits 0 would
    mean two writers on one log."""
    run = tmp_path / "run"
    args = [COEVO, "run", EXPLORE, "--out", str(run), "--quiet", "--set", "run.episodes=40"]
    procs = [
        subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(2)
    ]
    outcomes = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    fault_counts.record(
        runs_at_once=2,
        writers=sum(code == 0 for code, _ in outcomes),
        tracebacks=sum("Traceback" in err for _, err in outcomes),
    )
    assert sorted(code for code, _ in outcomes) == [0, 2], outcomes
    [(_, refused)] = [(code, err) for code, err in outcomes if code == 2]
    assert refused.startswith(f"coevo: error: {run}: already holds a run"), refused
    assert refused.count("\n") == 1
    assert verified(run) > 0
    log = coevo("log", str(run), "--json").stdout.splitlines()
    kinds = [json.loads(line)["event"]["kind"] for line in log]
    assert kinds.count("run_started") == 1 and "run_resumed" not in kinds
    assert kinds[-1] == "run_stopped"


PLUGIN = '''
from scenarios.worlds.minilab import MiniLab

BUILT = []
PLAYED = []


class Boom(MiniLab):
    """MiniLab whose step raises on turn 3 of every 4th episode the process plays (a rebuilt
    world goes on counting); with ``builds``, building more worlds than that in the process
    raises (assembly builds one, each worker one: a third fails when a worker rebuilds its
    world after an abort)."""

    def __init__(self, builds=0, **options):
        if builds and len(BUILT) >= builds:
            raise RuntimeError("the world cannot be rebuilt")
        BUILT.append(self)
        super().__init__(**options)
        self.episode = 0
        self.turn = 0

    def reset(self, task, seed):
        PLAYED.append(task)
        self.episode = len(PLAYED)
        self.turn = 0
        return super().reset(task, seed)

    def step(self, action):
        self.turn += 1
        if self.episode % 4 == 1 and self.turn == 3:
            raise RuntimeError(f"boom in {action!r}")
        return super().step(action)
'''


def world_scenario(
    tmp_path: Path, module: str, code: str, toml: str
) -> tuple[Path, dict[str, str]]:
    """A plug-in world's module (``code``) and a scenario (``toml``) in ``tmp_path``, and the
    environment that imports it."""
    (tmp_path / f"{module}.py").write_text(code)
    scenario = tmp_path / f"{module}.toml"
    scenario.write_text(toml)
    return scenario, {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}


def plugin_scenario(tmp_path: Path, **runtime: object) -> tuple[Path, dict[str, str]]:
    (tmp_path / "boomworld.py").write_text(PLUGIN)
    scenario = tmp_path / "boom.toml"
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in runtime.items())
    scenario.write_text(
        'name = "boom"\n[world]\nname = "boomworld:Boom"\nfamilies = ["fetch"]\n'
        "[world.options]\ntrain_variants = 50\n"
        + ("builds = 3\n" if runtime else "")
        + '[agent]\nkind = "explorer"\n[run]\nepisodes = 12\nworkers = 2\n'
        + ("[runtime]\n" + extra if runtime else "")
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    return scenario, env


def test_a_world_raising_mid_episode_aborts_that_episode_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    scenario, env = plugin_scenario(tmp_path)
    run = tmp_path / "run"
    proc = coevo("run", str(scenario), "--out", str(run), "--quiet", env=env)
    assert proc.returncode == 0, proc.stderr
    log = coevo("log", str(run), "--json", env=env)
    events = [json.loads(line) for line in log.stdout.splitlines()]
    aborted = [e["event"] for e in events if e["event"]["kind"] == "episode_aborted"]
    finished = [e["event"] for e in events if e["event"]["kind"] == "episode_finished"]
    assert aborted and all(a["reason"].startswith("RuntimeError: boom in ") for a in aborted)
    assert finished and len(aborted) + len(finished) == 12
    verified(run)


def test_a_world_that_fails_the_embedded_models_play_is_one_line_before_the_run(
    tmp_path: Path,
) -> None:
    """The embedded model is pre-trained on scripted play of the run's world: a plug-in world
    that raises there (or returns a lone surrogate, or has too few variants) ended ``run``
    with a traceback from the build; it is one line naming the setting, exit 2, no run."""
    scenario, env = plugin_scenario(tmp_path)
    text = scenario.read_text().replace('kind = "explorer"', 'kind = "policy"')
    scenario.write_text(text + '[policy]\nmodel = "embedded"\n')
    run = tmp_path / "run"
    proc = coevo("run", str(scenario), "--out", str(run), "--quiet", env=env)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("coevo: error: ") and "Traceback" not in proc.stderr, proc.stderr
    assert "$.policy.model: the embedded model could not be built for this world: " in line
    assert "world.step(" in line and "raised RuntimeError: boom in " in line, line
    assert not run.exists()


def test_a_failed_run_or_resume_says_so_in_one_line_even_with_quiet(tmp_path: Path) -> None:
    """``--quiet`` drops the progress bar and the summary, never the failure: before, a
    failed run or resume exited 1 and printed nothing."""
    scenario, env = plugin_scenario(tmp_path, on_failure="stop", max_restarts=0)
    run = tmp_path / "run"
    for args in (["run", str(scenario), "--out", str(run)], ["resume", str(run)]):
        proc = coevo(*args, "--quiet", env=env)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("coevo: error: run ")
        assert " failed: " in proc.stderr and f" events in {run}: actor 'worker-" in proc.stderr
        assert proc.stderr.endswith("RuntimeError: the world cannot be rebuilt\n")


def test_a_stop_just_after_a_run_failed_says_it_failed_not_that_it_stopped(
    tmp_path: Path,
) -> None:
    """A Ctrl-C or SIGTERM landing after the runtime ended a failed run (its closing report)
    read the log and said "stopped after N events: coevo resume continues it", as if the stop
    had ended a healthy run: the failure, which a resume meets again, went unsaid."""
    from scenarios.cli.finish import how_it_ended
    from stores.rundir import RunDir

    scenario, env = plugin_scenario(tmp_path, on_failure="stop", max_restarts=0)
    run = tmp_path / "run"
    proc = coevo("run", str(scenario), "--out", str(run), "--quiet", env=env)
    assert proc.returncode == 1, proc.stderr
    said = how_it_ended(RunDir(run), "r1", curves=False)
    assert said.startswith(f"coevo: error: run r1 failed before the stop: {verified(run)} ")
    assert f" events in {run} (exit 1): actor 'worker-" in said, said
    assert said.endswith("RuntimeError: the world cannot be rebuilt") and "resume" not in said


NONE_TEXT = """
import msgspec
from scenarios.worlds.minilab import MiniLab


class NoText(MiniLab):
    \"\"\"A plug-in world whose every step observes text=None (a library's missing
    description), which msgspec Structs do not refuse on construction.\"\"\"

    def step(self, action):
        return msgspec.structs.replace(super().step(action), text=None)
"""


def test_a_run_whose_every_episode_aborted_says_so_and_its_log_reads(tmp_path: Path) -> None:
    """A world's bad observations never reach the log (before: the run completed with exit 0
    and every later ``log``, ``replay``, ``report`` and ``audit`` said the log was corrupted),
    and a run that finished no episode does not exit 0 as if all were well."""
    scenario, env = world_scenario(
        tmp_path, "notext", NONE_TEXT,
        'name = "notext"\n[world]\nname = "notext:NoText"\nfamilies = ["fetch"]\n'
        '[agent]\nkind = "explorer"\n[run]\nepisodes = 6\nworkers = 2\n',
    )  # fmt: skip
    run = tmp_path / "run"
    proc = coevo("run", str(scenario), "--out", str(run), "--quiet", env=env)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("coevo: error: run ")
    assert "completed, but all 6 of its episodes were aborted (the first: ObservationInvalid: " in (
        proc.stderr
    )
    assert "returned an observation whose text is None, not a string)" in proc.stderr
    log = coevo("log", str(run), "--json", env=env)
    assert log.returncode == 0, log.stderr
    events = [json.loads(line)["event"] for line in log.stdout.splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds.count("episode_aborted") == 6 and "step_taken" not in kinds
    stop = events[-1]  # the log records the exit code the process ended with, not 0
    assert (stop["kind"], stop["reason"], stop["exit_code"]) == ("run_stopped", "completed", 1)
    verified(run)
    loud = coevo("run", str(scenario), "--out", str(tmp_path / "loud"), env=env)
    assert loud.returncode == 1 and "completed: " in loud.stderr
    assert "(exit 1)" in loud.stderr and "(exit 0)" not in loud.stderr  # said 0, exited 1
    assert "exit_code=1" in loud.stderr and "exit_code=0" not in loud.stderr  # "run ended"


def test_an_actor_that_keeps_failing_stops_the_run_with_its_error(tmp_path: Path) -> None:
    scenario, env = plugin_scenario(tmp_path, on_failure="stop", max_restarts=0)
    run = tmp_path / "run"
    proc = coevo("run", str(scenario), "--out", str(run), env=env)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    said = " ".join(proc.stderr.split())  # the console wraps long lines
    assert f"events in {run} (exit 1): actor 'worker-" in said
    assert said.endswith("failed to start: RuntimeError: the world cannot be rebuilt")
    log = coevo("log", str(run), "--json", env=env)
    events = [json.loads(line) for line in log.stdout.splitlines()]
    failed = [e["event"] for e in events if e["event"]["kind"] == "actor_failed"]
    assert failed and all(f["action"] == "stop" for f in failed)  # every worker rebuilds
    assert all(f["message"].endswith("RuntimeError: the world cannot be rebuilt") for f in failed)
    assert all("Traceback" in f["traceback"] for f in failed)  # in the log, not on the console
    aborted = {e["event"]["worker"] for e in events if e["event"]["kind"] == "episode_aborted"}
    # an aborted episode made its worker build a world again, one build more than the world
    # allows: that worker fails, or, when it rebuilt before the other had started, the other
    # fails to build its first world
    assert aborted
    final = events[-1]["event"]
    assert final["kind"] == "run_failed"
    reports = [f"actor {f['actor']!r} failed: {f['error_type']}: {f['message']}" for f in failed]
    assert final["message"] in reports
    verified(run)


SPIN = '''
from engine.world import Observation, Task


class Spin:
    """Stepped on the event loop, never ends."""

    name = "spin"
    blocking = False

    def families(self):
        return ("spin",)

    def tasks(self, family, split):
        first = 0 if split == "train" else 1000
        return [Task(family=family, variant=first + v, split=split) for v in range(4)]

    def reset(self, task, seed):
        return self._obs()

    def step(self, action):
        return self._obs()

    def close(self):
        pass

    def _obs(self):
        return Observation(text="spinning.", admissible=("wait",), goal="never ends.")
'''


def test_an_endless_episode_on_the_event_loop_is_committed_as_it_goes_and_stops_at_once(
    tmp_path: Path,
) -> None:
    """A scripted agent in a world stepped on the event loop awaits nothing between turns: the
    writer never ran during an episode (the log kept its first events, memory grew until the
    kernel killed the process) and SIGTERM was not taken until a second one."""
    scenario, env = world_scenario(
        tmp_path, "spinworld", SPIN,
        'name = "spin"\n[world]\nname = "spinworld:Spin"\nmax_turns = 0\n'
        '[agent]\nkind = "random"\n[run]\nepisodes = 4\nworkers = 2\n',
    )  # fmt: skip
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [COEVO, "run", str(scenario), "--out", str(run), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        wait_for_writer(run, proc)
        deadline = time.monotonic() + 60
        steps = 0
        while time.monotonic() < deadline and steps < 5000:
            time.sleep(0.5)
            reader = coevo("log", str(run), "--kind", "step_taken", "--json", env=env)
            steps = reader.stdout.count("\n")
        assert steps >= 5000, "the episodes' turns were not committed while they were played"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    log = coevo("log", str(run), "--json", "--from", "0", env=env)
    last = json.loads(log.stdout.splitlines()[-1])["event"]
    assert last["kind"] == "run_stopped" and last["reason"] == "signal", last
    assert verified(run) > steps


def test_a_run_whose_directory_is_moved_mid_run_says_so(tmp_path: Path) -> None:
    """A run directory renamed (or deleted) while the run writes: the run ended saying it
    completed in a directory that no longer held it (exit 0), or failed reading its curves
    from the old path ("not a coevo run directory"). It says what happened and creates
    nothing at the old path; the moved log is whole."""
    code, err = moved_mid_run(tmp_path, LONG_RUN, stop=True)
    assert code == 143, err
    assert "was moved, deleted or replaced while the run wrote into it" in err, err
    assert "Traceback" not in err


def committed_explore(run: Path, *args: str) -> subprocess.Popen[str]:
    """``coevo run`` of the explore scenario into ``run`` (``--quiet``), once its log has a
    commit (killed if it never gets one)."""
    proc = subprocess.Popen(
        [COEVO, "run", EXPLORE, "--out", str(run), "--quiet", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        wait_for_writer(run, proc)
        wait_for_a_commit(run, proc)
    except BaseException:
        proc.kill()
        raise
    return proc


def moved_mid_run(tmp_path: Path, args: Sequence[str], stop: bool) -> tuple[int, str]:
    """An explore run into ``tmp_path/run``, renamed to ``tmp_path/moved`` once it has
    committed, then (``stop``) sent SIGTERM a second later: its exit code and stderr, once
    nothing is left at the old path and the moved log verifies."""
    run, moved = tmp_path / "run", tmp_path / "moved"
    proc = committed_explore(run, *args)  # moved while its log was created: another story
    try:
        for _ in range(600):  # and moved as it starts (before scenario.toml): the next test
            if (run / "scenario.toml").is_file():
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        run.rename(moved)
        if stop:
            time.sleep(1)
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert not run.exists()
    assert verified(moved) > 0
    return proc.returncode, err


def test_a_quiet_run_stopped_by_a_signal_says_how_to_go_on_in_one_line(tmp_path: Path) -> None:
    """``--quiet`` keeps the line that says how a run ended when it did not complete: a run
    stopped by SIGTERM printed nothing at all (exit 143), a failed one its error."""
    run = tmp_path / "run"
    proc = committed_explore(run, "--set", "run.episodes=100000")
    try:
        time.sleep(1)  # the actors run (before, a stop is "coevo: terminated")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert (proc.returncode, out, err.count("\n")) == (143, "", 1), err
    assert re.fullmatch(
        rf"coevo: run \w+ stopped \(SIGTERM\) after (\d+) events: coevo resume "
        rf"{re.escape(str(run))} continues it\n",
        err,
    ), err
    assert verified(run) == int(err.split(" after ")[1].split()[0])


def test_a_moved_run_that_draws_no_curves_completes_with_a_note(tmp_path: Path) -> None:
    """A rollout (no curves to write) whose directory moved while it ran exited 1 for
    "curves not written". It completes (exit 0), says where its log went, and verifies."""
    args = ("--set", "run.episodes=5000", "--set", "run.workers=1")
    code, err = moved_mid_run(tmp_path, args, stop=False)
    assert code == 0, err
    assert "coevo: note: the run directory" in err and "its log is complete where it" in err
    assert "error" not in err


def test_a_run_moved_as_it_starts_says_so_and_resumes_where_it_went(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run directory renamed right after the log was created, before the run wrote its
    scenario there: "scenario.toml: cannot write: No such file or directory" (a CI run's
    moved-run test saw the log it left, with no events). It says what happened, and the log
    where the directory went runs to the end when resumed."""
    import scenarios.cli.run
    from scenarios.cli import main

    run, moved = tmp_path / "run", tmp_path / "moved"
    identity = scenarios.cli.run.path_identity

    def moved_first(path: Path) -> tuple[int, int] | None:
        if path == run and run.exists():
            run.rename(moved)
        return identity(path)

    monkeypatch.setattr(scenarios.cli.run, "path_identity", moved_first)
    args = ["--quiet", "--set", "run.episodes=5"]
    assert main(["run", EXPLORE, "--out", str(run), *args]) == 2
    assert capsys.readouterr().err == (
        f"coevo: error: {run}: the run directory was moved or deleted as the run started: its "
        "log was created, nothing ran (coevo resume on the directory where it went runs it)\n"
    )
    assert not run.exists() and verified(moved) == 0
    monkeypatch.setattr(scenarios.cli.run, "path_identity", identity)
    assert main(["resume", str(moved), "--quiet"]) == 0
    assert verified(moved) > 0


def test_a_copy_that_fails_leaves_nothing_in_the_way_of_its_retry(tmp_path: Path) -> None:
    """``coevo copy`` onto a full disk said so in one line but left ``DEST/log/``: the retry,
    once there was room, was refused ("not a new or empty directory")."""
    import resource

    run, dest, empty = tmp_path / "run", tmp_path / "copy", tmp_path / "empty"
    assert coevo("run", EXPLORE, "--out", str(run), "--quiet").returncode == 0
    empty.mkdir()

    def tiny_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, resource.RLIM_INFINITY))

    for target, stays in ((dest, False), (empty, True)):
        proc = coevo("copy", str(run), str(target), preexec_fn=tiny_files)
        assert proc.returncode != 0 and proc.stderr.startswith("coevo: error: "), proc.stderr
        assert "Traceback" not in proc.stderr
        assert target.exists() == stays and (not stays or not any(target.iterdir()))
        again = coevo("copy", str(run), str(target))
        assert again.returncode == 0, again.stderr
        assert verified(target) == verified(run)


def test_a_run_path_that_leaves_no_room_for_its_files_is_refused_at_once(tmp_path: Path) -> None:
    """A ``--out`` of 4,070 bytes was made and its episodes played; its first checkpoint then
    failed ("File name too long", said as a full disk), and so did every resume."""
    longest = os.pathconf(tmp_path, "PC_PATH_MAX") - 1
    deep, size = tmp_path, longest - 59  # --out's bytes: room for 59 below it
    while size - len(os.fsencode(deep)) > 250:
        deep = deep / ("d" * 200)
    deep.mkdir(parents=True)
    out = deep / ("r" * (size - len(os.fsencode(deep)) - 1))
    assert len(os.fsencode(out)) == size
    proc = coevo("run", EXPLORE, "--out", str(out))
    assert proc.returncode == 2 and not out.exists(), proc.stderr
    assert proc.stderr.startswith(f"coevo: error: {out}: too long a path for the run's files")
    assert proc.stderr.endswith("; choose a shorter --out\n")
    short = deep / "r"  # (the explore world writes no checkpoint: it runs, and ends)
    assert coevo("run", EXPLORE, "--out", str(short), "--quiet").returncode == 0
    # (an outside tester) a copy there, and a resume of a run moved there, played on first
    copied = coevo("copy", str(short), str(out))
    assert copied.returncode == 2 and not out.exists(), copied.stderr
    assert copied.stderr.endswith("; choose a shorter DEST\n"), copied.stderr
    short.rename(out)
    resumed = coevo("resume", str(out))
    assert resumed.returncode == 2, resumed.stderr
    assert resumed.stderr.endswith("; move it to a shorter path (coevo copy RUN DEST)\n")


def test_a_run_whose_log_is_hard_linked_elsewhere_is_not_resumed(tmp_path: Path) -> None:
    """A copy made with ``cp -al`` shares the log's file: resuming one twin changed the
    other in silence (it read as completed, without a checkpoint of its own)."""
    run, twin = tmp_path / "run", tmp_path / "twin"
    assert coevo("run", EXPLORE, "--out", str(run), "--quiet").returncode == 0
    subprocess.run(["cp", "-al", str(run), str(twin)], check=True)
    before = (twin / "log" / "data.mdb").read_bytes()
    for where in (run, twin):
        proc = coevo("resume", str(where))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (
            f"coevo: error: {where}: log/data.mdb has 2 hard links (a copy made with cp -al, "
            "cp -as or rsync --link-dest shares it): a resume would write into the other run "
            "too; resume an independent copy (coevo copy RUN DEST) or remove the other links\n"
        )
    assert (twin / "log" / "data.mdb").read_bytes() == before
    shutil.rmtree(twin)  # one link left: the run is its own
    assert "nothing to resume" in coevo("resume", str(run)).stderr
    # (an outside tester) a twin of symbolic links, and one sharing the run's own log of lines
    subprocess.run(["cp", "-as", str(run), str(twin)], check=True)
    said = coevo("resume", str(twin)).stderr
    assert f"{twin}: log/data.mdb is a symbolic link to {run}/log/data.mdb" in said, said
    shutil.rmtree(twin)
    subprocess.run(["cp", "-al", str(run), str(twin)], check=True)
    shutil.rmtree(twin / "log")
    shutil.copytree(run / "log", twin / "log")
    assert f"{twin}: coevo.jsonl has 2 hard links" in coevo("resume", str(twin)).stderr


def test_a_copy_holds_what_the_runs_links_name_not_the_links(tmp_path: Path) -> None:
    """A run's ``checkpoints`` linked to a bigger disk was copied as the link: the copy's
    resume pruned the run's own checkpoints, and the run could no longer be resumed."""
    run, dest, disk = tmp_path / "run", tmp_path / "copy", tmp_path / "disk"
    assert coevo("run", EXPLORE, "--out", str(run), "--quiet").returncode == 0
    (disk / "v000004").mkdir(parents=True)
    (disk / "v000004" / "model.safetensors").write_bytes(b"weights")
    (run / "checkpoints").symlink_to(disk)
    (run / "notes").mkdir()
    (run / "notes" / "up").symlink_to(run)  # a link back up: no loop
    (run / "notes" / "gone").symlink_to(tmp_path / "nowhere")  # dangling: left out
    proc = coevo("copy", str(run), str(dest))
    assert proc.returncode == 0, proc.stderr
    kept = dest / "checkpoints" / "v000004" / "model.safetensors"
    assert not (dest / "checkpoints").is_symlink() and kept.read_bytes() == b"weights"
    kept.unlink()  # the copy's own: the run's stays
    assert (disk / "v000004" / "model.safetensors").exists()
    assert (dest / "notes" / "up").is_dir() and not (dest / "notes" / "up" / "notes").exists()
    assert not (dest / "notes" / "gone").exists() and verified(dest) == verified(run)
    (run / "notes" / "zero").symlink_to("/dev/zero")  # read forever: refused, nothing left
    proc = coevo("copy", str(run), str(tmp_path / "again"))
    assert proc.returncode == 2 and not (tmp_path / "again").exists(), proc.stderr
    assert proc.stderr == (
        f"coevo: error: cannot copy {run}/notes/zero: not a file or a directory (a device, a "
        "pipe or a socket); remove it from the run directory, or the link to it\n"
    )


KILLED_COPY = """
import os, shutil, signal, sys
from scenarios.cli import main

def killed(*args, **kwargs):  # the log is copied; the run's other files are next
    os.kill(os.getpid(), signal.SIGKILL)

shutil.copy2 = killed
main(["copy", sys.argv[1], sys.argv[2]])
"""


def test_a_copy_killed_part_way_is_not_taken_for_a_run(tmp_path: Path) -> None:
    """A SIGKILLed ``coevo copy`` left the whole log and part of the run's other files: a
    destination that `check` and `replay --verify` passed as a complete run, its checkpoints
    missing. The log takes its name last; the re-run says what is there."""
    run, dest = tmp_path / "run", tmp_path / "copy"
    assert coevo("run", EXPLORE, "--out", str(run), "--quiet").returncode == 0
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_COPY, str(run), str(dest)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    check = coevo("check", str(dest))
    assert check.returncode == 2 and "not a coevo run directory" in check.stderr, check.stderr
    again = coevo("copy", str(run), str(dest))
    assert again.returncode == 2
    assert "holds a copy under way, or one stopped before it ended" in again.stderr, again.stderr
    shutil.rmtree(dest)
    assert coevo("copy", str(run), str(dest)).returncode == 0
    assert verified(dest) == verified(run)


def test_a_second_copy_into_the_same_destination_at_once_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ``coevo copy`` into one DEST at once both passed the "new or empty" check: the
    loser failed with a traceback, and its clean-up removed the winner's finished copy. The
    first to start claims DEST; the other, started while it copies, is refused in one line
    and leaves its copy alone."""
    from scenarios.cli import main
    from stores.lmdb_log import LmdbEventLog

    run, dest = tmp_path / "run", tmp_path / "copy"
    assert coevo("run", EXPLORE, "--out", str(run), "--quiet").returncode == 0
    real, second = LmdbEventLog.copy_to, []

    def copy_to(self: LmdbEventLog, path: str) -> int:
        if not second:  # the other copy starts and ends while this one is copying
            second.append(-1)
            second[0] = main(["copy", str(run), str(dest)])
            second.append(capsys.readouterr().err)
        return real(self, path)

    monkeypatch.setattr(LmdbEventLog, "copy_to", copy_to)
    assert main(["copy", str(run), str(dest)]) == 0, capsys.readouterr().err
    assert second[0] == 2 and second[1].count("\n") == 1, second
    assert "holds a copy under way" in second[1], second
    assert verified(dest) == verified(run)


def test_no_thread_to_start_is_one_line_before_a_run_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under ``ulimit -u``, ``validate`` (and ``run`` before its loop) failed with a traceback
    from the world's first call in a thread; the run's loop already said it in one line."""
    import threading

    from scenarios.cli import main

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    assert main(["validate", EXPLORE]) == 1
    err = capsys.readouterr().err
    assert err == (
        "coevo: error: the process cannot start another thread (a process or memory limit: "
        "ulimit -u, ulimit -v)\n"
    )


def test_a_report_under_an_unusable_home_prints_no_matplotlib_notes(tmp_path: Path) -> None:
    """With a HOME that cannot be written (a service account, a container), matplotlib's notes
    on its own cache (eight log lines) came out with every report; the report is complete."""
    run = tmp_path / "run"
    args = ("--quiet", "--set", "run.episodes=4")
    assert coevo("run", EXPLORE, "--out", str(run), *args).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "MPLCONFIGDIR"}
    (tmp_path / "home").write_text("a file, not a directory")
    env["HOME"] = str(tmp_path / "home")
    proc = coevo("report", str(run), "--out", str(tmp_path / "r.md"), env=env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "(" in proc.stdout and (tmp_path / "r.md").stat().st_size > 0


ODD_TEXT = """
from scenarios.worlds.minilab import MiniLab


class FailsOdd(MiniLab):
    \"\"\"A plug-in world that fails the episodes of odd seeds as they start.\"\"\"

    def reset(self, task, seed):
        if seed % 2:
            raise RuntimeError("odd seed")
        return super().reset(task, seed)
"""


def test_a_run_some_of_whose_episodes_aborted_warns_even_with_quiet(tmp_path: Path) -> None:
    """A world that fails some episodes (say on the step that wins) lowered the success
    rates without a sign: with ``--quiet`` nothing was printed and the run exited 0."""
    scenario, env = world_scenario(
        tmp_path, "failsodd", ODD_TEXT,
        'name = "failsodd"\n[world]\nname = "failsodd:FailsOdd"\nfamilies = ["fetch"]\n'
        '[agent]\nkind = "explorer"\n[run]\nepisodes = 12\nworkers = 2\n',
    )  # fmt: skip
    run = tmp_path / "run"
    proc = coevo("run", str(scenario), "--out", str(run), "--quiet", env=env)
    assert proc.returncode == 0, proc.stderr
    log = coevo("log", str(run), "--kind", "episode_aborted", "--json", env=env)
    aborted = len(log.stdout.splitlines())
    assert 0 < aborted < 12, log.stdout
    assert proc.stderr == (
        f"coevo: warning: {aborted} of its 12 training episodes were aborted (the world "
        "failed, hung or gave what the worker refuses; evaluation counts an aborted episode "
        "as a failure, training leaves it out of its group): coevo log "
        f"{run} --kind episode_aborted says why\n"
    )
