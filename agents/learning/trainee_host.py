"""Where the learner's model trains: in this process, or in a process of its own.

The learner actor (:class:`agents.learning.learner.Learner`) keeps the samples and the versions;
a *host* holds the :class:`Trainee` and runs the blocking work on it: its first digest, a
resume's restore, and each update (train, checkpoint, digest). Two hosts:

- :class:`LocalTrainee`: the trainee in this process, its work in the actor's worker threads,
  with the process's torch threads (``[policy] threads``), which inference shares.
- :class:`TraineeProcess` (``[policy] learner_threads``): the trainee in a child process with
  torch threads of its own. Torch's thread count is process-wide, so only a second process lets
  the learner use two cores while inference keeps one; it also keeps the learner's Python off
  the run's GIL. The child runs in a session of its own (a terminal's Ctrl-C stops the run,
  which stops it) and exits as soon as its parent is gone, so a killed run leaves no trainer
  behind.

Both run the same :func:`train_update`, so an update's result depends on the thread count
only: each update records it (:attr:`PolicyUpdated.threads`) and re-execution runs with it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agents.models.tuning import MemoryUse, reset_peak
from engine.errors import CoevoError
from stores.checkpoints import Checkpoints, optimizer_tensors, param_digest, restore_checkpoint

if TYPE_CHECKING:
    from agents.events.policy import GradientRequested
    from agents.learning.update import Sample, StepStats, Trainee

_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the agents package

BEAT_S = 1.0
"""How often the child says it is alive while it works on a call (loading included)."""

STALL_TIMEOUT = 120.0
"""Default seconds a call may go without a sign of life from the child (``[policy]
learner_stall_timeout``) before the child counts as lost: stopped (SIGSTOP), or hung with its
interpreter stuck. Generous: a beat needs the child's GIL once a second, which a loaded
machine may delay by seconds, not minutes."""


class LearnerProcessLost(CoevoError):
    """The learner's own process (``[policy] learner_threads``) ended (killed: out of memory,
    a signal) or could not be started. Unlike an error the update itself raised, which comes
    back as that error, nothing is known of the update it was running: supervision restarts
    the learner (``runtime.on_failure``), which starts a new process and redoes it from the
    log."""


class LearnerProcessFailed(CoevoError):
    """A call in the learner's own process failed with an error that could not come back with
    its type (its text, type and traceback say what it was), or the process was misused
    (``load`` or the checkpoints do not pickle, a call before :meth:`TraineeProcess.start`):
    a failure of the code, which a new process would repeat."""


@dataclass(frozen=True, slots=True)
class Trained:
    """What one update gave: its statistics, the state's cost, the checkpoint written, the new
    weights' digest and the torch threads it ran with."""

    stats: StepStats
    memory: MemoryUse
    checkpoint: str
    digest: str
    threads: int


def train_update(
    trainee: Trainee,
    checkpoints: Checkpoints,
    samples: Sequence[Sample],
    req: GradientRequested,
    seed: int,
    version: int,
    committed: int,
) -> Trained:
    """Train ``req`` on ``samples`` from policy ``version - 1``, write ``version`` with the
    optimiser's state (pruning never removes a version >= ``committed``), and digest it
    (blocking)."""
    import torch

    from agents.learning.update import grpo_step

    reset_peak(trainee.device)
    stats = grpo_step(trainee, samples, req, seed, version - 1)
    memory = trainee.memory()
    moments = optimizer_tensors(trainee.model, trainee.optimiser(req.lr))
    name = checkpoints.save(
        version, trainee.model, trainee.tokenizer, moments, protect_from=committed
    )
    digest = param_digest(trainee.model)
    return Trained(stats, memory, name, digest, torch.get_num_threads())


class TraineeHost(Protocol):
    """Holds the trainee and runs its blocking work (every method blocks: call it from a
    worker thread)."""

    def open(self) -> None:
        """Load the trainee (at the base weights); once loaded, does nothing."""
        ...

    def digest(self) -> str:
        """The current weights' digest."""
        ...

    def restore(self, checkpoint: str, digest: str) -> None:
        """Load checkpoint ``checkpoint`` with its optimiser's state and check its digest
        (:func:`stores.checkpoints.restore_checkpoint`).

        Raises:
            ModelUnavailable: as :func:`~stores.checkpoints.restore_checkpoint` does.
        """
        ...

    def update(
        self,
        samples: Sequence[Sample],
        req: GradientRequested,
        seed: int,
        version: int,
        committed: int,
    ) -> Trained:
        """:func:`train_update` on the hosted trainee."""
        ...

    def close(self) -> None:
        """Release the trainee (a process: stop it). Safe to call more than once."""
        ...


class LocalTrainee:
    """The trainee in this process.

    Args:
        load: builds the :class:`Trainee` (blocking).
        checkpoints: where versions are written and read back.
    """

    def __init__(self, load: Callable[[], Trainee], checkpoints: Checkpoints) -> None:
        self._load = load
        self._checkpoints = checkpoints
        self._trainee: Trainee | None = None

    @property
    def trainee(self) -> Trainee:
        assert self._trainee is not None, "open() first"
        return self._trainee

    def open(self) -> None:
        if self._trainee is None:
            self._trainee = self._load()

    def digest(self) -> str:
        return param_digest(self.trainee.model)

    def restore(self, checkpoint: str, digest: str) -> None:
        t = self.trainee
        restore_checkpoint(self._checkpoints, checkpoint, t.model, t.optimiser(0.0), digest)

    def update(
        self,
        samples: Sequence[Sample],
        req: GradientRequested,
        seed: int,
        version: int,
        committed: int,
    ) -> Trained:
        return train_update(self.trainee, self._checkpoints, samples, req, seed, version, committed)

    def close(self) -> None:
        self._trainee = None


class TraineeProcess:
    """The trainee in a child process with ``threads`` torch threads of its own.

    :meth:`launch` starts the child (``python -m agents.learning.trainee_host``, in a session of
    its own so that a terminal's Ctrl-C reaches only the run, which stops it), which imports
    torch and transformers at once; :meth:`start` sends it what to load; :meth:`open` waits
    until it has loaded. Each returns at once but the last, so the child can import and load
    on another core while the run is being set up. It then answers one call at a time over a
    socket. ``load`` and ``checkpoints`` must pickle: a module-level function (or a
    ``functools.partial`` of one) and a store on disk (the child writes the checkpoints, the
    run's inference reads them). The child's OpenMP threads sleep when they wait
    (``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it): spinning took the cores
    inference needed while both ran (docs/BENCHMARKS.md).

    While it works on a call (loading included) the child sends a beat every :data:`BEAT_S`;
    a call that hears nothing for ``stall_timeout`` seconds kills the child (stopped, or hung
    with its interpreter stuck) and raises :class:`LearnerProcessLost`, as for a killed child.
    A child hung in native code that still lets its beat thread run is not caught.

    Raises (each call):
        LearnerProcessLost: the child ended, went silent or could not be started.
        Exception: whatever the call raised in the child (re-raised here with its type when it
            pickles, else as :class:`LearnerProcessFailed` with its text).
    """

    def __init__(self, threads: int, stall_timeout: float = STALL_TIMEOUT) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if stall_timeout <= 0:
            raise ValueError(f"stall_timeout must be > 0, got {stall_timeout}")
        self.threads = threads
        self.stall_timeout = stall_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._started = False
        self._ready = False
        self._lock = threading.Lock()  # one call on the socket at a time
        self._stop: Callable[[], Any] = lambda: None

    @property
    def ready(self) -> bool:
        """The child has loaded the trainee (:meth:`open` returned)."""
        return self._ready

    @property
    def pid(self) -> int | None:
        """The child's pid (None before :meth:`launch`)."""
        return None if self._process is None else self._process.pid

    def launch(self) -> None:
        """Start the child, which imports torch and transformers and then waits for
        :meth:`start` (a second call does nothing).

        Raises:
            LearnerProcessLost: the child could not be started.
        """
        if self._process is not None:
            return
        ours, theirs = socket.socketpair()
        env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}
        paths = [str(_ROOT), *filter(None, [env.get("PYTHONPATH")])]
        env["PYTHONPATH"] = os.pathsep.join(paths)  # finds this module; then sys.path is sent
        try:
            # -P: not the working directory's own packages; the launching thread is the
            # "parent" whose end a Linux parent-death signal follows: only the main thread's
            # lasts as long as the process
            main = "main" if threading.current_thread() is threading.main_thread() else "thread"
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    "-m",
                    __name__,
                    str(theirs.fileno()),
                    str(os.getpid()),
                    main,
                ],
                pass_fds=(theirs.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise LearnerProcessLost(f"the learner's process could not start: {exc}") from None
        finally:
            theirs.close()  # the child holds its end now; EOF here means it ended
        self._conn = Connection(ours.detach())
        # closed by close(), or when this object is collected or the interpreter exits
        self._stop = weakref.finalize(self, _stop_child, self._conn, self._process)

    def start(self, load: Callable[[], Trainee], checkpoints: Checkpoints) -> None:
        """Launch the child if need be and send it ``load`` and ``checkpoints``: it loads the
        trainee (at the base weights) while the caller goes on. Only the first call sends.

        Raises:
            LearnerProcessLost: the child could not be started.
            LearnerProcessFailed: ``load`` or ``checkpoints`` do not pickle.
        """
        if self._started:
            return
        try:
            payload = pickle.dumps((load, checkpoints, self.threads))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise LearnerProcessFailed(f"the learner's trainee does not pickle: {exc}") from None
        self.launch()
        assert self._conn is not None
        try:
            self._conn.send(list(sys.path))  # plain strings: the child can read them first
            self._conn.send_bytes(payload)
        except OSError as exc:
            raise LearnerProcessLost(self._lost("start", exc)) from None
        self._started = True

    def open(self) -> None:
        """Wait until the child has loaded the trainee (:meth:`start` first).

        Raises:
            LearnerProcessLost: as the class says.
            LearnerProcessFailed: nothing was started.
        """
        if not self._started:
            raise LearnerProcessFailed("the learner's process was not given a trainee to load")
        if not self._ready:
            self._call("ready")
            self._ready = True

    def digest(self) -> str:
        return self._call("digest")

    def restore(self, checkpoint: str, digest: str) -> None:
        self._call("restore", checkpoint, digest)

    def update(
        self,
        samples: Sequence[Sample],
        req: GradientRequested,
        seed: int,
        version: int,
        committed: int,
    ) -> Trained:
        return self._call("update", list(samples), req, seed, version, committed)

    def close(self) -> None:
        self._stop()

    def _call(self, op: str, *args: Any) -> Any:
        with self._lock:
            if self._conn is None or self._conn.closed:
                raise LearnerProcessLost(f"the learner's process is not running ({op})")
            try:
                if op != "ready":
                    self._send(op, (op, args))
                status, value = _BEAT, None
                while status == _BEAT:  # beats until the answer
                    if not self._conn.poll(self.stall_timeout):
                        self._stop()  # closes the socket, kills the child
                        raise LearnerProcessLost(
                            f"the learner's process sent nothing for {self.stall_timeout:g} s "
                            f"{_during(op)} (stopped, or hung): killed"
                        )
                    status, value = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise LearnerProcessLost(self._lost(op, exc)) from None
        if status == "ok":
            return value
        if isinstance(value, BaseException):
            raise value
        raise LearnerProcessFailed(f"the learner's process failed ({op}): {value}")

    def _send(self, op: str, message: Any) -> None:
        """Send ``message``, waiting at most the stall timeout for the child to take it: an
        update's samples fill the socket's buffer, and a child stopped between calls reads
        nothing, so a plain send waited forever where the timeout never ran.

        Raises:
            LearnerProcessLost: the child took nothing for that long: it is killed.
        """
        assert self._conn is not None
        conn = self._conn
        failed: list[BaseException] = []

        def send() -> None:
            try:
                conn.send(message)
            except BaseException as exc:  # raised on the caller's thread below
                failed.append(exc)

        sender = threading.Thread(target=send, name="coevo-learner-send", daemon=True)
        sender.start()
        sender.join(self.stall_timeout)
        if sender.is_alive():
            self._stop()  # the child killed, the blocked send fails and its thread ends
            sender.join(5.0)
            raise LearnerProcessLost(
                f"the learner's process took nothing for {self.stall_timeout:g} s "
                f"{_during(op)} (stopped, or hung): killed"
            )
        if failed:
            raise failed[0]

    def _lost(self, op: str, exc: BaseException) -> str:
        code = None
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):  # still running: said so
                code = self._process.wait(timeout=1.0)
        how = "is still running" if code is None else f"ended with exit code {code}"
        return f"the learner's process {how} {_during(op)} ({type(exc).__name__})"


_BEAT = "beat"
"""The status of the child's sign of life (the other two: "ok", "error")."""


def _during(op: str) -> str:
    return "while loading the trainee" if op == "ready" else f"during {op!r}"


def _stop_child(conn: Connection, process: subprocess.Popen[bytes]) -> None:
    """Close the socket and reap the child: idle, it reads EOF and exits at once; busy
    (importing, loading, or an update nobody waits for any more) it is killed after 0.5 s,
    which loses nothing (a checkpoint is written whole before its reply, or not at all)."""
    conn.close()
    try:
        process.wait(timeout=0.5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """The child (:class:`TraineeProcess`): import transformers' model code while the parent
    prepares, read ``sys.path`` and the payload from the socket whose fd is the first argument
    (then the run's pid, and "main" when the run's main thread started it), load, answer
    ``ready``, serve calls until the socket closes, and exit at once (nothing is left to
    flush: every checkpoint was written before its reply)."""
    fd, pid, launcher = (argv if argv is not None else sys.argv[1:])[:3]
    parent = int(pid)  # the run that started this process
    if launcher == "main":
        _die_with_parent()
    if os.getppid() != parent:  # it went before this process could watch it
        os._exit(70)
    conn = _Beating(Connection(int(fd)))  # busy: importing and loading come before "ready"
    import transformers.modeling_utils  # noqa: F401  # the slow import, while the parent works

    try:
        sys.path[:] = conn.recv()
        load, checkpoints, threads = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        os._exit(0)  # the parent went before it sent them
    serve(conn, load, checkpoints, threads, parent)
    os._exit(0)


class _Beating:
    """The child's end of the socket, with a thread that sends a beat every :data:`BEAT_S`
    while the child is busy (from its start until its first answer, then during each call):
    the parent waits on a call only as long as beats come. Between calls it is silent, so
    nothing piles up unread."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()  # one message on the socket at a time
        self.busy = True
        threading.Thread(target=self._beat, name="coevo-beat", daemon=True).start()

    def recv(self) -> Any:
        return self._conn.recv()

    def recv_bytes(self) -> bytes:
        return self._conn.recv_bytes()

    def send(self, reply: tuple[str, Any]) -> None:
        with self._lock:
            self._conn.send(reply)

    def _beat(self) -> None:
        while True:
            time.sleep(BEAT_S)
            if not self.busy:
                continue
            try:
                with self._lock:
                    self._conn.send((_BEAT, None))
            except OSError:  # the parent closed its end
                return


def serve(
    conn: _Beating,
    load: Callable[[], Trainee],
    checkpoints: Checkpoints,
    threads: int,
    parent: int,
) -> None:
    """Load with ``threads`` torch threads, answer ``ready``, then serve calls until the
    connection closes; end at once if ``parent`` goes."""
    import torch

    threading.Thread(target=_orphan_watch, args=(parent,), daemon=True).start()
    torch.set_num_threads(threads)
    host = LocalTrainee(load, checkpoints)
    ok = _answer(conn, host.open)
    conn.busy = False
    if not ok:
        return
    ops: dict[str, Callable[..., Any]] = {
        "digest": host.digest,
        "restore": host.restore,
        "update": host.update,
    }
    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError):
            return
        conn.busy = True
        _answer(conn, ops[op], *args)
        conn.busy = False


def _answer(conn: _Beating, fn: Callable[..., Any], *args: Any) -> bool:
    """Send ``("ok", fn(*args))``, or ``("error", the exception)`` (its text when it does not
    pickle); False when it failed. Exits the process when the parent has closed its end."""
    try:
        reply: tuple[str, Any] = ("ok", fn(*args))
    except Exception as exc:  # every error goes back to the parent, which raises it
        reply = ("error", _portable(exc))
    try:
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            return False
    except OSError:  # the parent closed its end (stopped, or gone): nobody to answer
        os._exit(0)
    return reply[0] == "ok"


def _portable(exc: Exception) -> Exception | str:
    """``exc`` itself when it survives a pickle round trip, else its type, text and traceback."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # any failure: send the text instead
        lines = traceback.format_exception(exc)
        return f"{type(exc).__name__}: {exc}\n{''.join(lines[-6:])}"
    return exc


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the thread that started it ends (the run's main
    thread: the run itself). The orphan watch below cannot run while this process is stopped
    (SIGSTOP), and a stopped trainer outlived a killed run, in a session of its own that no
    signal of the run's terminal reaches. Elsewhere: the watch alone."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_PR_SET_PDEATHSIG = 1
"""``prctl``'s option that sets the signal a process gets when its parent thread ends."""


def _orphan_watch(parent: int) -> None:
    """End this process once ``parent`` is gone (its pid is no longer ours'): a killed run
    must not leave a trainer writing checkpoints into its directory."""
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(70)


if __name__ == "__main__":  # run as a script: use the package's module, whose classes pickle
    from agents.learning.trainee_host import main as child_main

    child_main()
