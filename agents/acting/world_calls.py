"""Calling a world and checking what it answers, for every caller of a world.

The env worker steps its world on the event loop or in a trio worker thread
(:class:`agents.acting.env_worker.EnvWorker`); the tools that play a world outside a run
(``coevo audit RUN whatif``, ``coevo probe``, the local models' scripted pre-training) go
through :class:`GuardedWorld`, the same guards without an event loop. Both check each
observation with :func:`checked_observation` before anything records or acts on it, and both
turn what a plug-in world can do wrong into one error naming the call: it raised, it called
``sys.exit()``, it raised ``KeyboardInterrupt`` in its own thread, it did not return within
``[world] step_timeout`` seconds (the thread is abandoned with the world it holds: Python
cannot stop a thread), or it answered something coevo cannot record.
"""

from __future__ import annotations

import math
import threading
import unicodedata
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from agents.audit.shown import hidden
from engine.errors import CoevoError
from engine.world import Observation, Task, TextWorld

__all__ = [
    "UNLIMITED_CAP",
    "Abandoned",
    "GuardedWorld",
    "ObservationInvalid",
    "WorldFailed",
    "checked_observation",
    "in_thread",
    "utf8_text",
]


UNLIMITED_CAP = 1000
"""The most turns an episode played outside a run (a what-if replay, a probe) plays when the
run's ``[world] max_turns`` is 0 (no limit): one in a world that never ends it ends all the
same."""


class WorldFailed(CoevoError):
    """A world call failed: it raised, exited, hung past its deadline or answered wrongly
    (:class:`ObservationInvalid`). The message names the call."""


class ObservationInvalid(WorldFailed):
    """A world's ``reset`` or ``step`` returned something coevo cannot record or act on: not an
    :class:`Observation`, a field of another type (``text=None``, a number in
    ``admissible``), a reward or score that is not a finite number, or no admissible action on
    a turn that is not done. The episode is aborted with this message, which names the world
    call; unlike a world that raises, the world answered, wrongly."""


def checked_observation(obs: object, call: str) -> Observation:
    """What a world returned, checked and in builtin types, before anything records or acts on
    it: numpy scalars (a text game's win flag is often ``numpy.bool_``) become ``float`` and
    ``bool``; anything else of another type than :class:`Observation` declares is refused.

    Args:
        obs: the world's answer.
        call: the world call, for the message (``world.step('open door') on turn 3``).

    Raises:
        ObservationInvalid: naming ``call`` and what is wrong.
    """
    if not isinstance(obs, Observation):
        raise ObservationInvalid(f"{call} returned {_short(obs)}, not an Observation")
    try:
        admissible = _actions(obs.admissible)
        checked = Observation(
            text=_text(obs.text, "text"),
            admissible=admissible,
            goal=_text(obs.goal, "goal"),
            reward=_number(obs.reward, "reward"),
            done=_flag(obs.done, "done"),
            score=_number(obs.score, "score"),
            success=_flag(obs.success, "success"),
        )
    except ValueError as exc:
        raise ObservationInvalid(f"{call} returned an observation whose {exc}") from None
    if not checked.admissible and not checked.done:
        raise ObservationInvalid(f"{call} returned no admissible action on a turn that is not done")
    return checked


def _short(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 4096:  # past int's str() limit
        return f"an int of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception as exc:  # a world's own type whose __repr__ fails
        return f"a {type(value).__name__} whose repr() raised {type(exc).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _text(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{field} is {_short(value)}, not a string")
    return utf8_text(str(value), field)


def utf8_text(text: str, field: str) -> str:
    """``text``, refused if UTF-8 cannot encode it (a lone surrogate, from bytes decoded with
    ``surrogateescape``): the log, the tokenizer and the embedder all need UTF-8."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = text[exc.start : exc.end]
            raise ValueError(
                f"{field} holds {bad!r} at character {exc.start}, a lone surrogate that UTF-8 "
                "cannot encode"
            ) from None
    return text


def _actions(value: object) -> tuple[str, ...]:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, tuple | list):
        raise ValueError(f"admissible is {_short(value)}, not a tuple of strings")
    actions = tuple(value)
    for i, action in enumerate(actions):
        if not isinstance(action, str):
            raise ValueError(f"admissible[{i}] is {_short(action)}, not a string")
    first: dict[str, int] = {}  # each action's index, in order: the checked tuple
    normal: dict[str, int] = {}  # the same, by the action's NFC form
    for i, action in enumerate(actions):
        if all(hidden(c) or c.isspace() for c in action):  # blank, or only zero-width and
            # control characters: scored by the end of its message alone
            raise ValueError(f"admissible[{i}] is {action!r}, an empty action")
        if action in first:  # scored once per copy: its probability counted that many times
            raise ValueError(
                f"admissible[{i}] {_short(action)} repeats admissible[{first[action]}]"
            )
        key = unicodedata.normalize("NFC", action)
        if key in normal:  # "café" twice, in two spellings: a tokenizer reads them alike
            a, b = _apart(action, actions[normal[key]])
            raise ValueError(
                f"admissible[{i}] {a} repeats admissible[{normal[key]}] {b} in another Unicode "
                "spelling (the same text once NFC-normalized)"
            )
        first[utf8_text(str(action), f"admissible[{i}]")] = i
        normal[key] = i
    return tuple(first)


def _apart(a: str, b: str, around: int = 24) -> tuple[str, str]:
    """Two texts that read alike, each as ``ascii()`` writes it, cut to the part around where
    they first differ (``...`` where cut), so that the difference shows."""
    at = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), 0)
    lo = max(at - around, 0)

    def part(text: str) -> str:
        cut = text[lo : at + around]
        return ("..." if lo else "") + ascii(cut) + ("..." if at + around < len(text) else "")

    return part(a), part(b)


SCORE_LIMIT = 1e15
"""The largest reward or score (in magnitude) a world may give. The learner trains in
float32 (largest 3.4e38): an advantage that is a score (Complementary RL's subgroup
advantages, GRPO's without ``std_norm``) of 1e30 overflowed its gradient's norm, and one of
1e100 its loss; past 1e154 a spread's square overflows even float64, and at 1e308 a round's
mean or a credit rule's ``2 * score - 1`` is inf. Up to 1e15 every sum, mean, spread,
credit and gradient a run computes stays finite, with room to spare."""


def _number(value: object, field: str) -> float:
    if isinstance(value, bool | np.bool_) or not isinstance(
        value, int | float | np.integer | np.floating
    ):
        kind = type(value).__name__
        raise ValueError(f"{field} is {_short(value)} (a {kind}), not a float or an int")
    try:
        number = float(value)
    except OverflowError:  # an int past float's range (10**400)
        raise ValueError(f"{field} is {_short(value)}, too large for a float") from None
    if not math.isfinite(number):
        raise ValueError(f"{field} is {number}, not a finite number")
    if abs(number) > SCORE_LIMIT:
        raise ValueError(
            f"{field} is {_short(value)}, past +/-{SCORE_LIMIT:g} (an advantage or a gradient "
            "the learner computes from it in float32, or a mean or a credit, would overflow): "
            "give the world's scores a smaller scale"
        )
    return number


def _flag(value: object, field: str) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{field} is {_short(value)}, not a bool")
    return bool(value)


class GuardedWorld:
    """A world built and called behind the env worker's guards, synchronously; itself a
    :class:`~engine.world.TextWorld`.

    Each call runs in a daemon thread given ``timeout`` seconds (None: no limit, called in
    the caller's thread, as is every call of a world that declares ``blocking = False``);
    whatever the world does wrong is :class:`WorldFailed`. A world that failed is
    ``broken``: a hung call's thread may still hold it, a raising one may be half-way
    through, so it is not called again (build another). ``close_error`` says why closing
    failed ("" when it closed).

    Raises:
        WorldFailed: the constructor raised, exited or hung.
    """

    def __init__(self, make_world: Callable[[], TextWorld], timeout: float | None) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 or None, got {timeout}")
        self._timeout = timeout
        self.broken = False
        self.close_error = ""
        self._turn = 0
        self._world: TextWorld = self._call(make_world, "the world's constructor", threaded=True)
        try:
            self.name = str(self._world.name)
        except Exception:  # a plug-in's name that raises: its class names it
            self.name = type(self._world).__name__

    def families(self) -> tuple[str, ...]:
        """The world's ``families()``."""
        return self._call(self._world.families, "world.families()")

    def tasks(self, family: str, split: str) -> Sequence[Task]:
        """The world's ``tasks``."""
        return self._call(self._world.tasks, f"world.tasks({family!r}, {split!r})", family, split)

    def reset(self, task: Task, seed: int) -> Observation:
        """The world's ``reset``, checked."""
        what = f"world.reset({task.family}/{task.variant} {task.split}, seed {seed})"
        self._turn = 0
        return checked_observation(self._call(self._world.reset, what, task, seed), what)

    def step(self, action: str) -> Observation:
        """The world's ``step``, checked."""
        what = f"world.step({action!r}) on turn {self._turn}"
        self._turn += 1
        return checked_observation(self._call(self._world.step, what, action), what)

    def close(self) -> None:
        """Close the world; never raises (``close_error`` says why it failed, or that a
        broken world was left to whatever holds it, not called)."""
        if self.broken:
            self.close_error = "not closed: it failed earlier"
            return
        try:
            self._call(self._world.close, "world.close()")
        except WorldFailed as exc:
            self.close_error = str(exc)

    def _call(self, fn: Callable[..., Any], what: str, *args: Any, threaded: bool = False) -> Any:
        if self.broken:
            raise WorldFailed(f"{what}: the world failed earlier and is not called again")
        blocking = threaded or getattr(self._world, "blocking", True)
        if self._timeout is None or not blocking:
            try:
                return fn(*args)
            except (Exception, SystemExit) as exc:  # not KeyboardInterrupt: the user's Ctrl-C
                self.broken = True
                raise _failed(what, exc) from None
        try:
            out, error = in_thread(partial(fn, *args), self._timeout, "coevo-world-call")
        except Abandoned:
            self.broken = True
            raise WorldFailed(
                f"{what} did not return within {self._timeout:g} s (world.step_timeout); its "
                "thread and world were abandoned"
            ) from None
        if error is not None:
            self.broken = True
            raise _failed(what, error) from None
        return out


class Abandoned(Exception):
    """A call :func:`in_thread` ran did not return in time; its thread was left running."""


def in_thread(
    fn: Callable[[], Any], timeout: float | None, name: str
) -> tuple[Any, BaseException | None]:
    """``fn()`` in a daemon thread named ``name``, waited for ``timeout`` seconds (None: no
    limit). Returns what it returned, or what it raised (anything, ``SystemExit`` and a
    ``KeyboardInterrupt`` raised in that thread included, for the caller to word); a
    Ctrl-C while waiting is the caller's own.

    Raises:
        Abandoned: ``fn`` did not return in time (its thread keeps running: Python cannot
            stop a thread).
    """
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out"] = fn()
        except BaseException as exc:  # told in the calling thread
            box["error"] = exc

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise Abandoned(name)
    return box.get("out"), box.get("error")


def _failed(what: str, exc: BaseException) -> CoevoError:
    """The error a world call's exception is reported as: coevo's own as it is (worded
    already: a scenario's bad world options), the others naming the call."""
    if isinstance(exc, CoevoError):
        return exc
    if isinstance(exc, SystemExit):
        return WorldFailed(f"{what} called sys.exit({exc.code!r})")
    return WorldFailed(f"{what} raised {_raised(exc)}")


def _raised(exc: BaseException) -> str:
    """``Type: message`` of a world's exception, even one whose ``str()`` raises."""
    try:
        said = str(exc)
    except Exception:
        said = "(its message could not be read)"
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__
