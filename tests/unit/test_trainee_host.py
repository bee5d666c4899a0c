"""The learner's trainee in a process of its own (``[policy] learner_threads``): an update there
is the in-process update bit for bit (with as many threads), a resume restores and checks its
checkpoint there, an error comes back with its type, a killed process is reported as lost with
its exit code, and the process is out of reach of a terminal's Ctrl-C but never outlives its
parent."""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_updates import request, score_turns, tiny_model

from agents.learning.trainee_host import (
    LearnerProcessFailed,
    LearnerProcessLost,
    LocalTrainee,
    TraineeProcess,
)
from agents.learning.update import Sample, Trainee
from agents.testing.processes import alive
from engine.errors import ModelUnavailable, ScenarioInvalid
from scenarios.assemble import assemble
from scenarios.loader import load_scenario
from stores.checkpoints import DirCheckpoints

CPU = torch.device("cpu")


class Tokenizer:
    """What the learner asks of a tokenizer: a pad id, and saving (nothing) with a checkpoint."""

    pad_token_id = 0

    def save_pretrained(self, path: str | Path) -> None:
        pass


def load_tiny() -> Trainee:
    """The trainee both sides load (the spawned process imports this module to call it)."""
    return Trainee(tiny_model(), Tokenizer(), CPU, reference=False)


def load_missing() -> Trainee:
    raise ModelUnavailable("model = '/nowhere': no such directory")


def test_an_update_in_its_own_process_is_the_local_update_bit_for_bit(tmp_path: Path) -> None:
    samples = [Sample(t, 1.0) for t in score_turns(tiny_model())]
    local = LocalTrainee(load_tiny, DirCheckpoints(tmp_path / "local" / "checkpoints"))
    remote = TraineeProcess(threads=1)
    remote.start(load_tiny, DirCheckpoints(tmp_path / "process" / "checkpoints"))
    local.open()
    remote.open()
    try:
        start = local.digest()
        assert remote.digest() == start
        with_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for k in range(2):
                a = local.update(samples, request(update=k), seed=k, version=k + 1, committed=k)
                b = remote.update(samples, request(update=k), seed=k, version=k + 1, committed=k)
                assert (b.digest, b.checkpoint, b.stats, b.memory) == (
                    a.digest,
                    a.checkpoint,
                    a.stats,
                    a.memory,
                )
                assert a.threads == b.threads == 1
        finally:
            torch.set_num_threads(with_threads)
        assert (tmp_path / "process" / b.checkpoint).is_dir()
        assert b.digest != start and remote.digest() == b.digest
    finally:
        remote.close()
        local.close()

    resumed = TraineeProcess(threads=2)
    resumed.launch()  # it imports meanwhile; what to load comes later
    resumed.start(load_tiny, DirCheckpoints(tmp_path / "process" / "checkpoints"))
    resumed.open()
    try:
        resumed.restore(b.checkpoint, b.digest)
        assert resumed.digest() == b.digest
        with pytest.raises(ModelUnavailable, match=r"the log records 0+ for checkpoints/v000002"):
            resumed.restore(b.checkpoint, "0" * 32)
        again = resumed.update(samples, request(update=2), seed=2, version=3, committed=2)
        assert again.threads == 2 and again.checkpoint == "checkpoints/v000003"
    finally:
        resumed.close()
        resumed.close()  # closing twice is harmless


def test_an_error_in_the_process_comes_back_with_its_type(tmp_path: Path) -> None:
    host = TraineeProcess(threads=1)
    host.start(load_missing, DirCheckpoints(tmp_path))
    with pytest.raises(ModelUnavailable, match="model = '/nowhere': no such directory"):
        host.open()
    pid = host.pid
    host.close()
    assert pid is not None and not alive(pid)


def test_the_process_imports_coevo_not_the_working_directory_s_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started with ``python -m`` from a project folder holding a package of its own named
    ``agents`` (or ``engine``, ``stores``), the child imported that one and died at start."""
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "__init__.py").write_text("raise ImportError('the project own')\n")
    monkeypatch.chdir(tmp_path)
    host = TraineeProcess(threads=1)
    host.start(load_tiny, DirCheckpoints(tmp_path / "checkpoints"))
    try:
        host.open()
        assert host.digest()
    finally:
        host.close()


class Odd(Exception):
    """An error that does not unpickle (its constructor takes two arguments)."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(a + b)


def load_odd() -> Trainee:
    raise Odd("no ", "model")


def test_an_error_that_cannot_come_back_is_a_failure_with_its_text(tmp_path: Path) -> None:
    """Not :class:`LearnerProcessLost` (which supervision answers with a new process): the
    code failed, and would again."""
    host = TraineeProcess(threads=1)
    host.start(load_odd, DirCheckpoints(tmp_path))
    with pytest.raises(LearnerProcessFailed, match=r"failed \(ready\): Odd: no model\n"):
        host.open()
    host.close()
    with pytest.raises(LearnerProcessFailed, match=r"^the learner's trainee does not pickle"):
        TraineeProcess(threads=1).start(lambda: load_odd(), DirCheckpoints(tmp_path))


def test_a_killed_process_is_lost_with_its_exit_code(tmp_path: Path) -> None:
    host = TraineeProcess(threads=1)
    host.start(load_tiny, DirCheckpoints(tmp_path))
    host.open()
    try:
        assert host.pid is not None
        os.kill(host.pid, signal.SIGKILL)
        with pytest.raises(
            LearnerProcessLost, match=r"^the learner's process ended with exit code -9 during "
        ):
            host.digest()
    finally:
        host.close()
    with pytest.raises(LearnerProcessLost, match="is not running"):
        host.digest()


def load_slowly() -> Trainee:
    """Loads for 3 s: longer than the stall timeout below, beating all along."""
    time.sleep(3)
    return load_tiny()


@contextlib.contextmanager
def stopped(tmp_path: Path, load: Callable[[], Trainee]) -> Iterator[tuple[TraineeProcess, int]]:
    """A loaded learner's process with a stall timeout of 2 s, then stopped (SIGSTOP), and its
    pid; killed and closed after."""
    host = TraineeProcess(threads=1, stall_timeout=2.0)
    host.start(load, DirCheckpoints(tmp_path))
    host.open()
    pid = host.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield host, pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        host.close()


def test_a_stopped_process_is_lost_after_the_stall_timeout_and_killed(tmp_path: Path) -> None:
    """A call hears the child's beats while it works, however long (loading for 3 s with a
    2 s timeout); a child that goes silent (SIGSTOP) is killed once the timeout passes."""
    with stopped(tmp_path, load_slowly) as (host, pid):
        with pytest.raises(
            LearnerProcessLost,
            match=r"^the learner's process sent nothing for 2 s during 'digest' \(stopped, or "
            r"hung\): killed$",
        ):
            host.digest()
        assert not alive(pid)
    with pytest.raises(LearnerProcessLost, match="is not running"):
        host.digest()


def test_a_process_stopped_between_calls_is_lost_when_an_update_cannot_reach_it(
    tmp_path: Path,
) -> None:
    """An update's samples fill the socket's buffer: sent to a child stopped between calls,
    the send waited forever and the stall timeout never ran (the run hung without a word)."""
    turns = score_turns(tiny_model())
    samples = [Sample(copy.deepcopy(t), 1.0) for _ in range(4096) for t in turns]  # ~3 MB
    with stopped(tmp_path, load_tiny) as (host, pid):
        started = time.monotonic()
        with pytest.raises(
            LearnerProcessLost,
            match=r"^the learner's process took nothing for 2 s during 'update' \(stopped, or "
            r"hung\): killed$",
        ):
            host.update(samples, request(update=0), seed=0, version=1, committed=0)
        assert time.monotonic() - started < 30 and not alive(pid)


PARENT = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with it ignored
sys.path[:0] = {path!r}
from stores.checkpoints import DirCheckpoints
from agents.learning.trainee_host import TraineeProcess
from test_trainee_host import load_tiny
host = TraineeProcess(threads=1)
host.start(load_tiny, DirCheckpoints({root!r}))
host.open()
print(host.pid, flush=True)
time.sleep(120)
"""


def ends_soon(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` ends within ``within`` seconds."""
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


@contextlib.contextmanager
def parent_with_learner(tmp_path: Path, session: bool = False) -> Iterator[tuple[Any, int]]:
    """A Python process (:data:`PARENT`; in a session of its own with ``session``) holding a
    loaded learner's process, and that child's pid; the parent killed after."""
    code = PARENT.format(path=sys.path, root=str(tmp_path))
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=session
    )
    try:
        assert parent.stdout is not None
        yield parent, int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_a_stopped_process_does_not_outlive_its_killed_parent(tmp_path: Path) -> None:
    """The child's watch for its parent cannot run while it is stopped: SIGKILLed, the run
    left a stopped trainer behind for good (reparented, holding its memory)."""
    with parent_with_learner(tmp_path) as (parent, child):
        os.kill(child, signal.SIGSTOP)
        parent.kill()
        parent.wait(timeout=30)
        assert ends_soon(child), "a stopped learner's process outlived its killed parent"


def test_a_ctrl_c_reaches_only_the_parent_and_the_process_ends_with_it(tmp_path: Path) -> None:
    with parent_with_learner(tmp_path, session=True) as (parent, child):
        assert os.getpgid(child) != os.getpgid(parent.pid)  # a terminal signals one group
        os.killpg(parent.pid, signal.SIGINT)  # Ctrl-C in the parent's terminal
        assert parent.wait(timeout=30) != 0
        assert ends_soon(child), "the learner's process outlived its parent"


def test_a_learner_process_needs_a_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    source = str(Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.toml")
    scenario = load_scenario(source, ["policy.learner_threads=2"])
    with pytest.raises(ScenarioInvalid) as err:
        assemble(scenario, source)
    assert str(err.value) == (
        f"{source}: $.policy.learner_threads: a learner in a process of its own needs a run "
        "directory (it writes its checkpoints there, inference reads them)"
    )
    assert not (tmp_path / "cache").exists()  # refused before any model was built


def test_validating_launches_no_learner_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def launched(self: TraineeProcess) -> None:
        raise AssertionError("a learner process was launched")

    monkeypatch.setattr(TraineeProcess, "launch", launched)
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    source = str(Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.toml")
    scenario = load_scenario(source, ["policy.learner_threads=2"])
    assemble(scenario, source, prepare_model=False)  # what ``coevo validate`` does
    with pytest.raises(LearnerProcessFailed, match="was not given a trainee to load"):
        TraineeProcess(threads=1).open()


def test_a_learner_process_killed_before_it_was_given_its_trainee_is_replaced(
    tmp_path: Path,
) -> None:
    """The process launched early (while the run is assembled) and killed before it was sent
    what to load failed the run ("ended with exit code -9 during 'start'"): the learner starts
    one of its own instead, as it does after any loss."""
    from scenarios.policy_setup import _LearnerFactory  # pyright: ignore[reportPrivateUsage]

    early = TraineeProcess(threads=1)
    early.launch()
    assert early.pid is not None
    os.kill(early.pid, signal.SIGKILL)
    time.sleep(0.2)
    factory = _LearnerFactory(load_tiny, DirCheckpoints(tmp_path), 1, early, 60.0)
    learner = factory()
    assert learner._host is None  # pyright: ignore[reportAttributeAccessIssue]
