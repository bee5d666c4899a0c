"""Supervision's reading of what an actor raised: which errors are the actor's failure (and
how each is recorded) rather than the run's own end, the checked factory, and the history an
actor's recovery reads, which a stop ends. :class:`~engine.runtime.Runtime` supervises with
them."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any, cast

import trio

from engine.actor import Actor, ActorSpec, first_error
from engine.events import Envelope, Event

__all__ = [
    "BaseExceptionRaised",
    "ExitCalled",
    "NativePanic",
    "RecoveryStopped",
    "StoppableHistory",
    "actor_failure",
    "built",
]


class ExitCalled(Exception):
    """An actor's code (a plug-in's hook, say) called ``sys.exit``: a failure of that actor,
    recorded and supervised as any other, not the end of the process without a word."""


def built(spec: ActorSpec) -> Actor:
    """``spec.factory()``, checked to be an actor.

    Raises:
        TypeError: it is not (a plug-in's factory returning something else).
    """
    actor = spec.factory()
    if not isinstance(actor, Actor):  # pyright: ignore[reportUnnecessaryIsInstance] (plug-ins)
        raise TypeError(f"the factory of actor {spec.name!r} returned {actor!r}, not an Actor")
    return actor


class RecoveryStopped(BaseException):
    """Raised inside an actor's :meth:`Actor.recover` as it reads the history once a stop was
    asked for (a signal): a long log's recovery is synchronous work that holds the event loop,
    which would take the signal only after every actor had read the whole log. A
    ``BaseException``, as a cancellation is: an actor's ``except Exception`` lets it through."""


RECOVERY_CHECK = 512
"""Events of the history an actor reads between two looks at whether a stop was asked for."""


class StoppableHistory(Sequence[Envelope[Event]]):
    """``history`` as an actor's recovery reads it, ending the reading
    (:class:`RecoveryStopped`) once ``stopping()`` says a stop was asked for."""

    def __init__(self, history: Sequence[Envelope[Event]], stopping: Callable[[], bool]) -> None:
        self._history = history
        self._stopping = stopping

    def __len__(self) -> int:
        return len(self._history)

    def __getitem__(self, at: Any) -> Any:
        history: Any = self._history  # (an int gives an envelope, a slice a sequence of them)
        return history[at]

    def __iter__(self) -> Generator[Envelope[Event]]:
        stopping = self._stopping
        for n, env in enumerate(self._history):
            if not n % RECOVERY_CHECK and stopping():
                raise RecoveryStopped
            yield env


class NativePanic(Exception):
    """A library written in Rust panicked in the actor's code (pyo3's ``PanicException``,
    which derives from ``BaseException`` and so passed every ``except Exception``: the
    tokenizer's thread pool, under a process limit, escaped the run with no final event)."""


class BaseExceptionRaised(Exception):
    """An actor's code raised a ``BaseException`` that is neither an ``Exception`` nor the
    run's own end: a plug-in's class derived from ``BaseException``, or a
    ``KeyboardInterrupt`` with no signal received. It escaped the run as a traceback with no
    final event in the log, and a ``KeyboardInterrupt`` read as the user's Ctrl-C ("stopped:
    coevo resume continues it"), the failure unsaid."""


def actor_failure(raised: BaseException, ctrl_c_possible: bool) -> Exception | None:
    """The actor's failure that ``raised`` (what its code raised) is, as an ``Exception`` to
    record and supervise; None when it is the run's own end (:func:`_actor_error`)."""
    caught = _beneath_cancel(raised)
    return _failure(caught) if _actor_error(caught, ctrl_c_possible) else None


def _actor_error(exc: BaseException, ctrl_c_possible: bool) -> bool:
    """Whether ``exc``, raised by an actor's code, is that actor's failure (supervised and
    recorded) rather than the run's own end: a cancellation, or a ``KeyboardInterrupt`` that
    may be the user's Ctrl-C (``ctrl_c_possible``: the run does not handle signals, or one
    has arrived; :meth:`~engine.runtime.Runtime.ctrl_c_possible`)."""
    if isinstance(exc, KeyboardInterrupt):
        return not ctrl_c_possible
    if isinstance(exc, Exception):
        return True
    # a group left by _beneath_cancel holds cancellations only
    return not isinstance(exc, trio.Cancelled | RecoveryStopped | BaseExceptionGroup)


def _beneath_cancel(exc: BaseException) -> BaseException:
    """The error of an actor's nursery that failed while the run was stopping: a group of
    its own error and the stop's ``Cancelled`` is not an ``Exception``, and passed
    supervision as the run's own end, escaping :meth:`Runtime.run` as a traceback (a Ray
    proxy whose cluster went away while another actor's failure stopped the run). Its first
    leaf that is not a cancellation, as :func:`~engine.actor.task_nursery` raises; ``exc``
    itself otherwise (a plain exception, an ``ExceptionGroup``, a group of cancellations)."""
    if not isinstance(exc, BaseExceptionGroup) or isinstance(exc, Exception):
        return exc
    group = cast("BaseExceptionGroup[BaseException]", exc)
    return first_error(group) or group


def _failure(exc: BaseException) -> Exception:
    """The actor's failure that ``exc`` is (:func:`_actor_error`), as an ``Exception``."""
    if isinstance(exc, Exception):
        return exc
    if isinstance(exc, SystemExit):
        return ExitCalled(f"sys.exit({exc.code!r}) was called in the actor's code")
    if type(exc).__name__ == "PanicException":
        converted: Exception = NativePanic(f"a native library panicked: {exc}")
    elif isinstance(exc, KeyboardInterrupt):
        converted = BaseExceptionRaised(
            f"the actor's code raised {type(exc).__name__} with no signal received"
            + (f": {exc}" if str(exc) else "")
        )
    else:
        converted = BaseExceptionRaised(
            f"the actor's code raised {type(exc).__name__}, a BaseException that is not an "
            "Exception" + (f": {exc}" if str(exc) else "")
        )
    converted.__cause__ = exc
    return converted
