"""ScienceWorld (PyPI ``scienceworld``, a Scala simulator in a JVM) as a coevo world.

Families are ScienceWorld's 30 tasks (``boil``, ``find-living-thing``, ...), variants are its
variations, and the splits are its own: ``train`` is ScienceWorld's train list, ``heldout`` its
dev list (or test, with ``heldout = "test"``). One world owns one JVM, started on the first call
that needs it and bounded in memory (``-Xmx512m`` by default). Every JVM call runs under a
deadline: a JVM that dies or stops answering is killed and the call raises :class:`JvmDied` or
:class:`JvmHung`; the env worker records the episode as aborted and builds a fresh world, and
the next ``reset`` of this one would start a new JVM.

Scores are ScienceWorld's 0-100 scale divided by 100: 1.0 at success, negative when the task
failed (ScienceWorld then ends the episode); the reward of a turn is the change of that score.
Observation texts are normalised (:func:`normalise`) so that replays compare equal, and the
admissible list is bounded deterministically (:func:`rank_actions`). docs/ENVIRONMENTS.md has the
options and the measured costs.
"""

from __future__ import annotations

import collections
import heapq
import json
import logging
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from engine.world import SPLITS, Observation, Task
from scenarios.worlds.options import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_names,
    import_extra,
)

T = TypeVar("T")

SIMPLIFICATIONS = (
    "teleportAction",
    "selfWateringFlowerPots",
    "openContainers",
    "openDoors",
    "noElectricalAction",
    "easy",
)
VERB_ORDER = (
    "look around",
    "inventory",
    "task",
    "go to",
    "go",
    "teleport to",
    "teleport",
    "open",
    "pick up",
    "focus on",
    "move",
    "activate",
    "deactivate",
    "use",
    "pour",
    "look at",
    "look in",
    "read",
    "put down",
    "close",
    "mix",
    "dunk",
    "eat",
    "flush",
    "wait1",
    "wait",
    "connect",
    "disconnect",
)
"""Verbs in the order :func:`rank_actions` serves them; any other verb comes last."""
EXCLUDED_ACTIONS = frozenset({"reset task"})
"""Valid in ScienceWorld but never offered: ``reset task`` restarts the episode in place."""
_STOP_WORDS = frozenset(
    re.findall(
        r"[a-z]+",
        "your task first then that will cause with without also which where when from into "
        "focus take actions make changes this these there they them their acceptable located "
        "around place substance thing",
    )
)
"""Words of goal texts too common to say which objects matter."""
_AMBIGUOUS = "Ambiguous request"
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


def normalise(text: str) -> str:
    """ScienceWorld's text with every list of objects in a fixed order.

    ScienceWorld lists the contents of rooms and containers in the iteration order of hash
    sets, which changes from run to run unless the JVM runs with :data:`STABLE_HASH_FLAGS`.
    Both forms of list are sorted: tab-indented lines that follow each other at one
    indentation, and inline lists (``In the sink is: a, b.``, ``(containing a, b)``,
    ``You also see: a, b.``). Trailing spaces and blank edges are dropped; nothing else changes.
    """
    lines = [_canon(line.rstrip()) for line in text.strip().split("\n")]
    out: list[str] = []
    i = 0
    while i < len(lines):
        indent = len(lines[i]) - len(lines[i].lstrip("\t"))
        j = i + 1
        if indent:
            while j < len(lines) and _tabs(lines[j]) == indent:
                j += 1
        out += sorted(lines[i:j])
        i = j
    return "\n".join(out)


def _tabs(line: str) -> int:
    return len(line) - len(line.lstrip("\t"))


_OPENER = re.compile(r"\(containing |(?:\bis|\bsee|you need to mix): ?")


def _canon(s: str) -> str:
    """``s`` with the items of every inline list sorted, innermost lists first."""
    out: list[str] = []
    i = 0
    while (m := _OPENER.search(s, i)) is not None:
        out.append(s[i : m.end()])
        end = _closing(s, m.end()) if m.group().startswith("(") else _sentence_end(s, m.end())
        out.append(", ".join(sorted(_canon(item) for item in _items(s[m.end() : end]))))
        i = end
    out.append(s[i:])
    return "".join(out)


def _closing(s: str, start: int) -> int:
    depth = 1
    for k in range(start, len(s)):
        depth += {"(": 1, ")": -1}.get(s[k], 0)
        if depth == 0:
            return k
    return len(s)


def _sentence_end(s: str, start: int) -> int:
    depth = 0
    for k in range(start, len(s)):
        c = s[k]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return k
        elif c == "." and depth == 0 and (k + 1 == len(s) or s[k + 1] in " \n"):
            return k
    return len(s)


def _items(body: str) -> list[str]:
    """Split a list at its top-level ``", "`` (not before ``which``: ``a bulb, which is off``)."""
    items: list[str] = []
    depth = 0
    start = 0
    for k, c in enumerate(body):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth == 0 and body.startswith(", ", k) and not body.startswith("which ", k + 2):
            items.append(body[start:k])
            start = k + 2
    items.append(body[start:])
    return items


_VERB_INDEX = {verb: k for k, verb in enumerate(VERB_ORDER)}


def _verb(action: str) -> int:
    """The rank of ``action``'s verb in :data:`VERB_ORDER` (one- or two-word verbs)."""
    words = action.split(" ", 2)
    two = " ".join(words[:2])
    return _VERB_INDEX.get(two, _VERB_INDEX.get(words[0], len(VERB_ORDER)))


def goal_words(goal: str) -> frozenset[str]:
    """The content words of a goal (what :func:`rank_actions` counts as relevant)."""
    words = re.findall(r"[a-z]+", goal.lower())
    return frozenset(w for w in words if len(w) >= 4 and w not in _STOP_WORDS)


def rank_actions(actions: Iterable[str], goal: str, limit: int) -> tuple[str, ...]:
    """A deterministic, bounded admissible list from ScienceWorld's valid actions.

    Actions are grouped by verb (:data:`VERB_ORDER`); within a verb those naming more of the
    goal's words come first, then shorter ones, then in alphabetical order. Up to ``limit``
    actions are taken round-robin over the verbs, so that a few hundred ``connect X to Y``
    combinations cannot crowd out ``open door to kitchen``. The result is ordered by verb, then
    by rank. :data:`EXCLUDED_ACTIONS` and repeats are dropped.

    Args:
        actions: valid action strings, in any order.
        goal: the task description.
        limit: the most actions returned; 0 returns them all.
    """
    relevant = goal_words(goal)

    def key(action: str) -> tuple[int, int, str]:
        words = action.split()
        return (-len(relevant.intersection(words)), len(words), action)

    buckets: dict[int, list[str]] = collections.defaultdict(list)
    for action in set(actions) - EXCLUDED_ACTIONS:
        buckets[_verb(action)].append(action)
    keep = limit or None  # round-robin never takes more than ``limit`` from one verb
    ranked = {
        verb: heapq.nsmallest(keep, group, key=key) if keep else sorted(group, key=key)
        for verb, group in buckets.items()
    }
    total = sum(len(group) for group in ranked.values())
    if limit == 0 or total <= limit:
        return tuple(a for verb in sorted(ranked) for a in ranked[verb])
    chosen: list[tuple[int, int, str]] = []
    depth = 0
    while len(chosen) < limit:
        for verb in sorted(ranked):
            if depth < len(ranked[verb]) and len(chosen) < limit:
                chosen.append((verb, depth, ranked[verb][depth]))
        depth += 1
    return tuple(a for _, _, a in sorted(chosen))


class _Py4jSendErrors(logging.Filter):
    """Drops py4j's root-logger traceback for a command the JVM never answered: the world
    raises :class:`JvmDied` or :class:`JvmHung` for it, and that is what gets recorded."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.msg == "Exception while sending command."
            and record.pathname.endswith("java_gateway.py")
        )


_PY4J_FILTER = _Py4jSendErrors()


class _Jvm:
    """One ScienceWorld JVM behind py4j, every call under a deadline.

    Args:
        options: JVM flags (``-Xmx512m``, ...).
        timeout: seconds the JVM has to start and answer its first call.
    """

    def __init__(self, options: Sequence[str], timeout: float) -> None:
        gateway = import_extra("py4j.java_gateway", "scienceworld")
        constants = import_extra("scienceworld.constants", "scienceworld")
        logging.getLogger().addFilter(_PY4J_FILTER)  # once: filters are a set
        self.stderr: collections.deque[str] = collections.deque(maxlen=20)
        self.hung = False
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
        except ValueError as exc:  # the JVM printed no port: it failed to start
            raise JvmDied(f"scienceworld JVM failed to start: {exc}") from None
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
        except protocol.Py4JError:
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
        own thread closes its output pipes. Safe to call twice."""
        self.gateway.close()
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_SPLIT_CACHE: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
_SPLIT_LOCK = threading.Lock()


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
        self._heldout = check_choice("heldout", heldout, ("dev", "test"))
        self._variants = check_int("variants", variants, 0, 1_000_000)
        self._resolve = check_bool("resolve_ambiguity", resolve_ambiguity)
        self._normalise = check_bool("normalise", normalise)
        if not re.fullmatch(r"[1-9][0-9]*[kmgKMG]?", str(jvm_memory)):
            raise ValueError(f"jvm_memory must look like '512m' or '2g', got {jvm_memory!r}")
        stable = STABLE_HASH_FLAGS if check_bool("stable_hashes", stable_hashes) else ()
        self._jvm_options = (f"-Xmx{jvm_memory}", *stable, *check_jvm_options(jvm_options))
        self.step_timeout = check_float("step_timeout", step_timeout, 0.1, 86_400)
        self.start_timeout = check_float("start_timeout", start_timeout, 1, 86_400)
        self._jvm: _Jvm | None = None
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

    def _ensure_jvm(self) -> _Jvm:
        if self._jvm is None:
            self._jvm = _Jvm(self._jvm_options, self.start_timeout)
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
                sorted(set(raw) - EXCLUDED_ACTIONS, key=lambda a: (_verb(a), a))
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
