"""The text-environment interface every world implements.

A world is a source of tasks (a family and a variant) and a stateful environment for one episode
at a time: ``reset`` starts an episode on a task with a seed, ``step`` applies an action string.
Both return an :class:`Observation`, the typed result of one turn. One instance serves one env
worker; calls may block (a JVM, a subprocess) and are made from a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Protocol, runtime_checkable

import msgspec

SPLITS = ("train", "heldout")


class Task(msgspec.Struct, frozen=True, kw_only=True):
    """One task instance: a family (kind of problem) and a variant (one generated instance).

    The facts of a variant (where things are, which rule applies) are fixed by the pair
    ``(family, variant)``; the episode seed only affects what is random within an episode.
    A variant is a signed 64-bit integer (what every event that names it can record).
    """

    family: str
    variant: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
    split: str = "train"


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """What the agent sees after ``reset`` or ``step``.

    Attributes:
        text: the observation text of this turn.
        admissible: the actions the world accepts now, in a deterministic order.
        goal: the task's goal text (the same for every turn of an episode).
        reward: reward earned by this turn (0 on reset).
        done: the episode is over (success, failure or step limit).
        score: cumulative score of the episode so far.
        success: the goal was reached.
    """

    text: str
    admissible: tuple[str, ...]
    goal: str
    reward: float = 0.0
    done: bool = False
    score: float = 0.0
    success: bool = False


@runtime_checkable
class TextWorld(Protocol):
    """A text environment. One instance runs one episode at a time.

    A world may set a class attribute ``blocking = False`` when ``reset`` and ``step`` take
    microseconds and touch no process or file (the built-in world): env workers then call them
    on the event loop instead of in a worker thread. Worlds without it are treated as blocking.
    A world whose admissible actions are templates to fill in (``open OBJ``), not actions, sets
    ``templates = True`` (an attribute): only a policy that writes its own actions
    (``policy.mode = "generate"``) can play it, and assembly refuses any other agent.
    """

    name: str

    def families(self) -> tuple[str, ...]:
        """The task families this world offers, in a fixed order."""
        ...

    def tasks(self, family: str, split: str) -> Sequence[Task]:
        """The variants of ``family`` in ``split`` ("train" or "heldout"), in a fixed order.

        Raises:
            ValueError: unknown family or split.
        """
        ...

    def reset(self, task: Task, seed: int) -> Observation:
        """Start an episode of ``task``; the same (task, seed) always gives the same episode.

        Raises:
            ValueError: unknown family, split or variant.
        """
        ...

    def step(self, action: str) -> Observation:
        """Apply ``action``. An action that is not admissible wastes the turn, it never raises.

        Raises:
            RuntimeError: called before ``reset`` or after the episode is done.
        """
        ...

    def close(self) -> None:
        """Release resources (processes, files). Safe to call twice."""
        ...


class ExtraMissing(ValueError):
    """A world needs a package from one of coevo's optional extras that is not installed.

    A ``ValueError`` like every option error, so :func:`engine.world_registry.load_world`
    reports it as a scenario error; its message says which extra to install.
    """
