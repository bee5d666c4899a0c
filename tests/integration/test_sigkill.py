"""SIGKILL a writer mid-stream, again and again: every commit it reported survives, no batch is
half-written, the writer lock dies with it, and the next writer continues at the right seq.

The writer is this file run as a script (see :func:`writer_main`); it prints the committed
``next_seq`` after each commit, so the test knows what was promised before the kill.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine.eventlog import new_run_meta
from engine.events import Envelope, Event
from engine.lifecycle import ActorFailed, ActorStarted, RunStopped
from stores.lmdb_log import LmdbEventLog

ROOT = Path(__file__).resolve().parents[2]
BATCH = 7
KILLS = 5
SEED = 20240611
META = new_run_meta("sigkill", scenario_name="sigkill", seed=SEED, coevo_version="0.1.0")


def make_event(seq: int) -> Event:
    """Deterministic events of varied size (some span LMDB overflow pages)."""
    if seq % 5 == 0:
        return ActorFailed(
            actor=f"w{seq}",
            attempt=seq,
            error_type="E",
            message="boom",
            traceback="x" * (seq % 3000),
            action="restart",
        )
    if seq % 5 == 1:
        return RunStopped(reason=f"r{seq}")
    return ActorStarted(actor=f"worker-{seq}", actor_type="env", seed=seq * 7919)


def batch(start: int) -> list[Envelope[Event]]:
    return [
        Envelope(seq=s, run="sigkill", t=s, actor="runtime", event=make_event(s))
        for s in range(start, start + BATCH)
    ]


def writer_main(path: str, durable: bool) -> None:
    """Append batches forever, printing the committed next_seq after each commit."""
    log = LmdbEventLog.open(path, writable=True, durable=durable)
    while True:
        start = log.next_seq
        log.append(batch(start))
        print(start + BATCH, flush=True)


def start_writer(path: Path, durable: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, str(path), "durable" if durable else "fast"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def kill_after(writer: subprocess.Popen[str], commits: int, delay: float) -> int:
    """Wait for ``commits`` progress lines, then ``delay`` seconds, then SIGKILL.

    Returns:
        The last next_seq the writer reported before it died.
    """
    assert writer.stdout is not None
    reported: list[int] = []
    while len(reported) < commits:
        line = writer.stdout.readline()
        if not line:
            _, err = writer.communicate(timeout=30)
            raise AssertionError(f"writer died on its own:\n{err}")
        reported.append(int(line))
    time.sleep(delay)
    os.kill(writer.pid, signal.SIGKILL)
    # read the rest through the same text stream: readline() may already hold later lines in
    # its buffer, which communicate() (reading the file descriptor) would never see
    rest = writer.stdout.read()
    writer.communicate(timeout=30)  # waits, and closes the pipes
    assert writer.returncode == -signal.SIGKILL
    return max(reported + [int(line) for line in rest.split()])


def test_sigkill_loses_no_reported_commit_and_no_partial_batch(tmp_path: Path) -> None:
    path = tmp_path / "log"
    LmdbEventLog.create(path, META, map_size=64 * 1024).close()  # kills also hit map growth
    rng = random.Random(SEED)
    for kill in range(KILLS):
        writer = start_writer(path, durable=kill % 2 == 0)
        reported = kill_after(writer, commits=rng.randint(1, 30), delay=rng.uniform(0, 0.003))
        with LmdbEventLog.open(path, writable=True) as log:  # the dead writer's lock is gone
            report = log.verify()
            assert report.ok, report
            count = report.records
            assert reported <= count <= reported + BATCH  # at most one unreported commit
            assert count % BATCH == 0  # batches are atomic
            assert list(log.read()) == [env for s in range(0, count, BATCH) for env in batch(s)]
            log.append(batch(count))  # appending resumes right after the last commit
            assert log.next_seq == count + BATCH


if __name__ == "__main__":
    writer_main(sys.argv[1], durable=sys.argv[2] == "durable")
