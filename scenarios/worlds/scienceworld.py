"""ScienceWorld (PyPI ``scienceworld``, a Scala simulator in a JVM) as a coevo world.

Families are ScienceWorld's 30 tasks (``boil``, ``find-living-thing``, ...), variants are its
variations, and the splits are its own: ``train`` is ScienceWorld's train list, ``heldout`` its
dev list (or test, with ``heldout = "test"``). One world owns one JVM, started on the first call
that needs it and bounded in memory (``-Xmx512m`` by default). Every JVM call runs under a
deadline (:mod:`scenarios.worlds.scienceworld_jvm`): a JVM that dies or stops answering is
killed and the call raises ``JvmDied`` or ``JvmHung``; the env worker records the episode as
aborted and builds a fresh world, and the next ``reset`` of this one would start a new JVM.

Scores are ScienceWorld's 0-100 scale divided by 100: 1.0 at success, negative when the task
failed (ScienceWorld then ends the episode); the reward of a turn is the change of that score.
Observation texts are normalised so that replays compare equal, and the admissible list is
bounded deterministically (:mod:`scenarios.worlds.scienceworld_text`). docs/ENVIRONMENTS.md has
the options and the measured costs.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from engine.world import SPLITS, Observation, Task
from scenarios.worlds.options import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_names,
    import_extra,
)
from scenarios.worlds.scienceworld_jvm import STABLE_HASH_FLAGS, Jvm, JvmFailed, check_jvm_options
from scenarios.worlds.scienceworld_text import EXCLUDED_ACTIONS, normalise, rank_actions, verb_rank

T = TypeVar("T")

SIMPLIFICATIONS = (
    "teleportAction",
    "selfWateringFlowerPots",
    "openContainers",
    "openDoors",
    "noElectricalAction",
    "easy",
)
_AMBIGUOUS = "Ambiguous request"
_SPLIT_CACHE: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
_SPLIT_LOCK = threading.Lock()


REFUSED_ACTIONS = frozenset({"reset task"})
"""ScienceWorld's own command that resets the goal progress (never admissible, but a
free-text policy can type it): the world answers :data:`REFUSED` and the turn is spent."""
REFUSED = "That action is not available in this world."


class _Episode:
    def __init__(self, task: Task, goal: str) -> None:
        self.task = task
        self.goal = goal
        self.steps = 0
        self.points = 0
        self.done = False


class ScienceWorld:
    """ScienceWorld tasks as a coevo world (see the module docstring and docs/ENVIRONMENTS.md).

    Args:
        tasks: task names or numbers (``"boil"``, ``"1-1"``) offered as families; default all.
        simplifications: ``"easy"``, or a list of ScienceWorld's simplifications.
        max_steps: step limit of every episode.
        max_actions: the most admissible actions per turn (0: all; see :func:`rank_actions`).
        actions: ``"valid"`` (action-object combinations) or ``"templates"`` (``"open OBJ"``:
            for a model that writes its own actions, ``policy.mode = "generate"``).
        heldout: ScienceWorld's split behind coevo's held-out split: ``"dev"`` or ``"test"``.
        variants: the first this many variations of each split (0: all).
        resolve_ambiguity: answer ScienceWorld's "Ambiguous request" with its first choice.
        normalise: sort object lists in observations (:func:`normalise`).
        stable_hashes: run the JVM with :data:`STABLE_HASH_FLAGS`, which makes ScienceWorld's
            hash-ordered collections iterate in a fixed order (see there).
        jvm_memory: the JVM's heap bound (``-Xmx``).
        jvm_options: further JVM flags.
        step_timeout: seconds a step may take before the JVM counts as hung.
        start_timeout: seconds for starting the JVM and loading a task.

    Raises:
        ValueError: the ``scienceworld`` extra or Java is missing, or an option is wrong.
    """

    name = "scienceworld"

    def __init__(
        self,
        *,
        tasks: Sequence[str] | None = None,
        simplifications: str | Sequence[str] = "",
        max_steps: int = 100,
        max_actions: int = 48,
        actions: str = "valid",
        heldout: str = "dev",
        variants: int = 0,
        resolve_ambiguity: bool = True,
        normalise: bool = True,
        stable_hashes: bool = True,
        jvm_memory: str = "512m",
        jvm_options: Sequence[str] = (),
        step_timeout: float = 60.0,
        start_timeout: float = 300.0,
    ) -> None:
        import_extra("scienceworld", "scienceworld")
        import_extra("py4j", "scienceworld")
        if shutil.which("java") is None:
            raise ValueError("scienceworld needs Java (17 or later) on PATH: no 'java' found")
        self._tasks = _task_names(tasks)
        self._simplifications = _simplifications(simplifications, self._tasks)
        self.max_steps = check_int("max_steps", max_steps, 1, 100_000)
        self.max_actions = check_int("max_actions", max_actions, 0, 100_000)
        self._actions = check_choice("actions", actions, ("valid", "templates"))
        self.templates = self._actions == "templates"  # engine.world.TextWorld: for a writer
        self._heldout = check_choice("heldout", heldout, ("dev", "test"))
        self._variants = check_int("variants", variants, 0, 1_000_000)
        self._resolve = check_bool("resolve_ambiguity", resolve_ambiguity)
        self._normalise = check_bool("normalise", normalise)
        _check_heap(jvm_memory)
        stable = STABLE_HASH_FLAGS if check_bool("stable_hashes", stable_hashes) else ()
        self._jvm_options = (f"-Xmx{jvm_memory}", *stable, *check_jvm_options(jvm_options))
        self.step_timeout = check_float("step_timeout", step_timeout, 0.1, 86_400)
        self.start_timeout = check_float("start_timeout", start_timeout, 1, 86_400)
        self._jvm: Jvm | None = None
        self._templates: tuple[str, ...] | None = None
        self._episode: _Episode | None = None

    # -- the TextWorld protocol -------------------------------------------------------------

    def families(self) -> tuple[str, ...]:
        """The tasks this world offers, in ScienceWorld's task order."""
        return self._tasks

    def tasks(self, family: str, split: str) -> list[Task]:
        """The variations of ``family`` in ``split`` (ScienceWorld's own lists, in its order).

        Raises:
            ValueError: unknown family or split.
            JvmFailed: the JVM needed to read the splits failed.
        """
        return [Task(family=family, variant=v, split=split) for v in self._split(family, split)]

    def reset(self, task: Task, seed: int) -> Observation:
        """Load ``task`` (the seed is not used: ScienceWorld's variations are deterministic).

        Raises:
            ValueError: unknown family, split or variation.
            JvmFailed: the JVM died or hung.
        """
        del seed
        if task.variant not in self._split(task.family, task.split):
            raise ValueError(f"{task.family} has no variation {task.variant} in {task.split}")
        self._episode = None
        jvm = self._ensure_jvm()
        simpl = self._simplifications

        def load() -> tuple[str, str]:
            jvm.server.load(task.family, task.variant, simpl, False)
            return str(jvm.server.step("look around")), str(jvm.server.getTaskDescription())

        text, goal = self._call(f"load {task.family} {task.variant}", self.start_timeout, load)
        self._episode = _Episode(task, goal.strip())
        return Observation(text=self._text(text), admissible=self._admissible(), goal=goal.strip())

    def step(self, action: str) -> Observation:
        """Apply ``action``; an unknown action wastes the turn, as in ScienceWorld.

        Raises:
            RuntimeError: before ``reset`` or after the episode is done.
            JvmFailed: the JVM died or hung (the episode is over).
        """
        ep = self._episode
        if ep is None or ep.done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        if " ".join(action.lower().split()) in REFUSED_ACTIONS:
            ep.steps += 1
            ep.done = ep.steps >= self.max_steps
            return Observation(
                text=REFUSED,
                admissible=() if ep.done else self._admissible(),
                goal=ep.goal,
                done=ep.done,
                score=ep.points / 100,
            )
        jvm = self._ensure_jvm()

        def step() -> tuple[str, float, bool]:
            text = str(jvm.server.step(action))
            if self._resolve and text.startswith(_AMBIGUOUS):
                text = str(jvm.server.step("0"))
            return text, float(jvm.server.getScore()), bool(jvm.server.getCompleted())

        text, raw, completed = self._call(f"step {action!r}", self.step_timeout, step)
        ep.steps += 1
        points = round(100 * raw)
        reward, ep.points = (points - ep.points) / 100, points
        ep.done = completed or points < 0 or points >= 100 or ep.steps >= self.max_steps
        return Observation(
            text=self._text(text),
            admissible=() if ep.done else self._admissible(),
            goal=ep.goal,
            reward=reward,
            done=ep.done,
            score=points / 100,
            success=points >= 100,
        )

    def close(self) -> None:
        """End the JVM. Safe to call twice."""
        jvm, self._jvm = self._jvm, None
        self._episode = None
        if jvm is not None:
            jvm.close()

    # -- beyond the protocol ------------------------------------------------------------------

    @property
    def jvm_pid(self) -> int | None:
        """The process id of this world's JVM (None before it starts or after it failed)."""
        return None if self._jvm is None else self._jvm.pid

    def gold_actions(self, task: Task) -> tuple[str, ...]:
        """ScienceWorld's own gold action sequence for ``task`` (takes a few seconds).

        The world must be ``reset`` afterwards.
        """
        jvm = self._ensure_jvm()
        self._episode = None

        def gold() -> list[str]:
            jvm.server.load(task.family, task.variant, self._simplifications, True)
            return [str(a) for a in jvm.server.getGoldActionSequence()]

        return tuple(self._call(f"gold path of {task.family}", self.start_timeout, gold))

    # -- internals ------------------------------------------------------------------------------

    def _ensure_jvm(self) -> Jvm:
        if self._jvm is None:
            self._jvm = Jvm(self._jvm_options, self.start_timeout)
        return self._jvm

    def _call(self, what: str, timeout: float, fn: Callable[[], T]) -> T:
        jvm = self._ensure_jvm()
        try:
            return jvm.call(what, timeout, fn)
        except JvmFailed:
            self._jvm = None  # already dead and reaped; the next reset starts a new one
            self._episode = None
            raise

    def _text(self, text: str) -> str:
        return normalise(text) if self._normalise else text.strip()

    def _admissible(self) -> tuple[str, ...]:
        ep = self._episode
        assert ep is not None
        if self._actions == "templates":
            return self._template_list()
        jvm = self._ensure_jvm()
        raw = self._call(
            "valid actions",
            self.step_timeout,
            lambda: str(jvm.server.getValidActionObjectCombinationsJSON()),
        )
        valid = [str(a["action"]) for a in json.loads(raw)["validActions"]]
        return rank_actions(valid, ep.goal, self.max_actions)

    def _template_list(self) -> tuple[str, ...]:
        if self._templates is None:
            jvm = self._ensure_jvm()
            raw = self._call(
                "action templates",
                self.step_timeout,
                lambda: [str(a) for a in jvm.server.getPossibleActions()],
            )
            self._templates = tuple(
                sorted(set(raw) - EXCLUDED_ACTIONS, key=lambda a: (verb_rank(a), a))
            )
        return self._templates

    def _split(self, family: str, split: str) -> tuple[int, ...]:
        if family not in self._tasks:
            raise ValueError(f"unknown scienceworld task {family!r}; offered: {list(self._tasks)}")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of: {', '.join(SPLITS)}")
        train, dev, test = self._splits_of(family)
        chosen = train if split == "train" else (dev if self._heldout == "dev" else test)
        return chosen[: self._variants] if self._variants else chosen

    def _splits_of(self, family: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        with _SPLIT_LOCK:  # fixed by ScienceWorld's jar: read once per process
            if family not in _SPLIT_CACHE:
                jvm = self._ensure_jvm()

                def read() -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
                    jvm.server.load(family, 0, "", False)
                    return (
                        tuple(int(v) for v in jvm.server.getVariationsTrain()),
                        tuple(int(v) for v in jvm.server.getVariationsDev()),
                        tuple(int(v) for v in jvm.server.getVariationsTest()),
                    )

                _SPLIT_CACHE[family] = self._call(f"splits of {family}", self.start_timeout, read)
            return _SPLIT_CACHE[family]


def _task_names(tasks: object) -> tuple[str, ...]:
    id2task: dict[str, str] = dict(import_extra("scienceworld.constants", "scienceworld").ID2TASK)
    known = tuple(id2task.values())
    if tasks is None:
        return known
    names = check_names("tasks", tasks)
    resolved = tuple(id2task.get(n, n) for n in names)
    unknown = [n for n, r in zip(names, resolved, strict=True) if r not in known]
    if unknown:
        raise ValueError(
            f"unknown scienceworld tasks {unknown}; use a name or a number such as "
            f"'1-1' ({', '.join(known)})"
        )
    if len(set(resolved)) != len(resolved):
        raise ValueError(f"tasks names one task twice: {list(names)}")
    return resolved


def _simplifications(value: object, tasks: Sequence[str]) -> str:
    if isinstance(value, str):
        parts = tuple(p for p in value.split(",") if p)
    else:
        parts = check_names("simplifications", value) if value else ()
    unknown = [p for p in parts if p not in SIMPLIFICATIONS]
    if unknown:
        raise ValueError(f"unknown simplifications {unknown}; known: {', '.join(SIMPLIFICATIONS)}")
    electrical = [t for t in tasks if "power-component" in t or "conductivity" in t]
    if "noElectricalAction" in parts and electrical:
        raise ValueError(f"noElectricalAction removes the actions that {electrical} need")
    return ",".join(parts)


MIN_HEAP_MB = 32
"""The smallest ``jvm_memory`` taken: below it the JVM does not start ("Too small maximum
heap") or runs out of memory loading ScienceWorld (16m did)."""


def _check_heap(jvm_memory: object) -> None:
    """Refuse a ``jvm_memory`` the JVM would refuse or could not run ScienceWorld in: its
    form (a number and a unit, ``512m`` or ``2g``: a bare number is bytes to the JVM, and
    ``512`` failed as the JVM started, naming no setting) and :data:`MIN_HEAP_MB`."""
    found = (
        re.fullmatch(r"([1-9][0-9]{0,9})([kmgKMG])", jvm_memory)
        if isinstance(jvm_memory, str)
        else None
    )
    if found is None:
        raise ValueError(
            f"jvm_memory must be a size with a unit, like '512m' or '2g', got {jvm_memory!r}"
        )
    scale = {"k": 1 / 1024, "m": 1, "g": 1024}[found.group(2).lower()]
    if int(found.group(1)) * scale < MIN_HEAP_MB:
        raise ValueError(
            f"jvm_memory must be at least {MIN_HEAP_MB}m (the JVM cannot load ScienceWorld in "
            f"less), got {jvm_memory!r}"
        )
