"""The ScienceWorld JVM: one process behind py4j, every call under a deadline.

A JVM that dies or stops answering is killed and the call raises :class:`JvmDied` or
:class:`JvmHung` (both :class:`JvmFailed`); ScienceWorld's own Java exceptions are plain
``RuntimeError``s and the JVM lives on. :class:`~scenarios.worlds.scienceworld.ScienceWorld`
owns one :class:`Jvm` and starts a new one after a failure.
"""

from __future__ import annotations

import collections
import functools
import logging
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from scenarios.worlds.options import check_names, import_extra

__all__ = ["STABLE_HASH_FLAGS", "Jvm", "JvmDied", "JvmFailed", "JvmHung", "check_jvm_options"]

T = TypeVar("T")

STABLE_HASH_FLAGS = ("-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2")
"""Every object's identity hash is the same constant, so the hash sets ScienceWorld keeps
objects in iterate in insertion order: room and container contents, and the names that tell
two objects of one kind apart in valid actions (``yellow paint`` vs ``yellow paint in wood
cup``), come out the same in every run and every JVM. Without it they vary between resets even
in one JVM. It cost no measurable speed (docs/ENVIRONMENTS.md)."""


class JvmFailed(RuntimeError):
    """Base of the JVM's failures: the episode cannot go on in this JVM.

    The world has already killed and forgotten the process; its next ``reset`` starts a new one.
    """


class JvmDied(JvmFailed):
    """The JVM exited or was killed while a call was in flight (or before it was made)."""


class JvmHung(JvmFailed):
    """A JVM call did not return within its deadline; the world killed the JVM."""


class _Py4jSendErrors(logging.Filter):
    """Drops py4j's root-logger traceback for a command the JVM never answered: the world
    raises :class:`JvmDied` or :class:`JvmHung` for it, and that is what gets recorded."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.msg == "Exception while sending command."
            and record.pathname.endswith("java_gateway.py")
        )


_PY4J_FILTER = _Py4jSendErrors()


class Jvm:
    """One ScienceWorld JVM behind py4j, every call under a deadline.

    Args:
        options: JVM flags (``-Xmx512m``, ...).
        timeout: seconds the JVM has to start and answer its first call.
    """

    def __init__(self, options: Sequence[str], timeout: float) -> None:
        gateway = import_extra("py4j.java_gateway", "scienceworld")
        constants = import_extra("scienceworld.constants", "scienceworld")
        logging.getLogger().addFilter(_PY4J_FILTER)  # once: filters are a set
        # py4j's own logger reports a JVM that died, hung or was closed under a call (with
        # tracebacks, through the root logger's handlers, where no logger filter applies):
        # the world raises JvmDied or JvmHung for it, and that is what gets recorded
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        self.stderr: collections.deque[str] = collections.deque(maxlen=20)
        self.hung = False
        refused = _why_java_refuses(tuple(options))
        if refused:  # before py4j starts it: py4j would lose both the reason and the process
            raise JvmDied(f"scienceworld JVM failed to start: {refused}")
        try:
            port, proc = gateway.launch_gateway(
                classpath=constants.JAR_PATH,
                javaopts=list(options),
                die_on_exit=True,  # the JVM exits when this process does (stdin closes)
                cwd=constants.BASEPATH,
                return_proc=True,
                create_new_process_group=True,  # Ctrl-C goes to coevo, which stops the run
                redirect_stdout=collections.deque(maxlen=0),  # ScienceWorld's debug prints
                redirect_stderr=self.stderr,
            )
        except ValueError:  # the JVM printed no port: it exited (or was killed) as it started
            said = "; ".join(line.strip() for line in list(self.stderr)[-3:] if line.strip())
            raise JvmDied(
                "scienceworld JVM exited as it started, before it named its port"
                + (f": {said}" if said else " (it printed nothing: killed, or out of memory?)")
            ) from None
        self.proc: Any = proc  # a subprocess.Popen
        self.pid = int(proc.pid)
        self.gateway: Any = gateway.JavaGateway(
            gateway_parameters=gateway.GatewayParameters(
                port=port, auto_field=True, enable_memory_management=False
            ),
            java_process=proc,
        )
        jvm = self.gateway.jvm
        self.server: Any = self.call(
            "start", timeout, lambda: jvm.scienceworld.runtime.pythonapi.PythonInterface()
        )

    def call(self, what: str, timeout: float, fn: Callable[[], T]) -> T:
        """``fn()`` with a deadline.

        Raises:
            JvmDied: the JVM is gone.
            JvmHung: no answer within ``timeout`` seconds (the JVM has been killed).
            RuntimeError: ScienceWorld raised a Java exception (the JVM lives on).
        """
        protocol = import_extra("py4j.protocol", "scienceworld")

        if self.proc.poll() is not None:
            raise self._failure(what, timeout)
        timer = threading.Timer(timeout, self._expire)
        timer.daemon = True
        timer.start()
        try:
            return fn()
        except protocol.Py4JJavaError as exc:
            detail = " ".join(str(exc.java_exception).split())
            raise RuntimeError(f"scienceworld failed in {what}: {detail}") from None
        except protocol.Py4JError as exc:
            close_dropped_sockets(exc)
            raise self._failure(what, timeout) from None
        finally:
            timer.cancel()

    def _expire(self) -> None:
        self.hung = True
        self.proc.kill()

    def _failure(self, what: str, timeout: float) -> JvmFailed:
        self.close()
        if self.hung:
            return JvmHung(
                f"scienceworld JVM (pid {self.pid}) did not answer {what} within {timeout:g}s; "
                "killed it"
            )
        tail = " | ".join(line.strip() for line in self.stderr if line.strip())[-300:]
        return JvmDied(
            f"scienceworld JVM (pid {self.pid}) died during {what} "
            f"(exit code {self.proc.returncode})" + (f": {tail}" if tail else "")
        )

    def close(self) -> None:
        """End the JVM (closing its stdin ends it; killed if it lingers) and reap it; py4j's
        own thread closes its output pipes. Safe to call twice. The JVM is reaped whatever the
        gateway's close raises (a JVM already ended by the same Ctrl-C): a process left
        unreaped outlives this one as a zombie where the container's init does not reap."""
        try:
            self.gateway.close()
        finally:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def close_dropped_sockets(exc: BaseException) -> None:
    """Close the sockets of the py4j connections in the frames of ``exc`` and its causes.

    Once the JVM is gone, py4j retries a command on a new connection, whose ``start`` raises
    without closing its socket; the error's traceback holds the connection in a cycle that the
    garbage collector breaks at some later moment, with a ResourceWarning (a failure of
    whichever test runs then, under ``filterwarnings = error``). The JVM is dead, so every
    connection there is finished with.
    """
    gateway = import_extra("py4j.java_gateway", "scienceworld")
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending:
        err = pending.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        tb = err.__traceback__
        while tb is not None:
            for value in tb.tb_frame.f_locals.values():
                if isinstance(value, gateway.GatewayConnection) and isinstance(
                    value.socket, socket.socket
                ):
                    value.socket.close()
            tb = tb.tb_next
        pending += [e for e in (err.__cause__, err.__context__) if e is not None]


@functools.cache
def _why_java_refuses(options: tuple[str, ...]) -> str:
    """What ``java`` says of ``options`` when it will not start with them ("" if it starts),
    asked once per process and options (``java -version``, about 0.1 s): py4j reads the
    gateway's port from the JVM's output and, when the JVM exits at once, reports only that no
    port came (``invalid literal for int()``), losing the JVM's message and its process."""
    try:
        done = subprocess.run(
            ["java", *options, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"java could not be run: {exc}"
    if done.returncode == 0:
        return ""
    said = (done.stdout + "\n" + done.stderr).splitlines()
    lines = [line.strip() for line in said if line.strip()]
    return "; ".join(lines[:3]) or f"java exited with {done.returncode}"


def check_jvm_options(value: object) -> tuple[str, ...]:
    """Extra JVM flags: a list of strings that start with ``-``.

    Raises:
        ValueError: anything else.
    """
    if value == [] or value == ():
        return ()
    flags = check_names("jvm_options", value)
    if not all(f.startswith("-") for f in flags):
        raise ValueError(f"jvm_options must be a list of flags such as '-Xss4m', got {value!r}")
    return flags
