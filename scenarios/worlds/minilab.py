"""minilab: the built-in world, a procedurally generated science lab in miniature.

Five task families (docs/WORLD.md): ``fetch`` and ``heat`` are easy, ``unlock`` is medium,
``circuit`` and ``paint`` are hard. Every fact of a variant derives only from
``(family, variant)`` (:mod:`scenarios.worlds.minilab_layouts`); episodes have no other
randomness: the same task always plays the same way.

Reward: 0.1 the first time a true subgoal is reached (taking the object the goal names, a correct
irreversible step), and at success whatever brings the score to exactly 1.0. A wrong irreversible
step (the wrong key, wire, device or paint mix) ends the episode as a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

from engine.world import SPLITS, Observation, Task
from scenarios.worlds.minilab_layouts import (
    DEVICES,
    FAMILIES,
    HELDOUT_BASE,
    KEYS,
    PREP,
    WIRES,
    Layout,
    layout_of,
)

DEFAULT_MAX_STEPS = {"fetch": 18, "heat": 20, "unlock": 20, "circuit": 18, "paint": 20}
MAX_STEPS_CAP = 20
SUBGOAL_REWARD = 0.1

_VOWELS = ("a", "e", "i", "o", "u")


class _Episode:
    """The mutable state of one episode over a cached :class:`Layout`."""

    def __init__(self, layout: Layout, max_steps: int) -> None:
        self.layout = layout
        self.max_steps = max_steps
        self.place = dict(layout.start)  # item -> container, receptacle, "table", "hand", "gone"
        self.recv = {name for name, _, _ in layout.receptacles}
        self.opened: set[str] = set()
        self.locked = set(layout.locked)
        self.powered: set[str] = set()
        self.bowl: list[str] = []
        self.achieved: set[str] = set()
        self.steps = 0
        self.score = 0.0
        self.done = False
        self.success = False


_Handler = Callable[[_Episode, str, str], tuple[str, float]]
_Actions = dict[str, tuple[_Handler, str, str]]


def _a(thing: str) -> str:
    if thing.endswith("paint"):
        return thing
    return f"an {thing}" if thing.startswith(_VOWELS) else f"a {thing}"


def _join(words: Sequence[str]) -> str:
    if len(words) <= 1:
        return "".join(words)
    return f"{', '.join(words[:-1])} and {words[-1]}"


def _finish(ep: _Episode, success: bool, text: str) -> tuple[str, float]:
    ep.done = True
    ep.success = success
    if success:
        return f"{text} you have completed the task.", round(1.0 - ep.score, 6)
    return f"{text} the task failed.", 0.0


def _subgoal(ep: _Episode, key: str) -> float:
    if key in ep.achieved:
        return 0.0
    ep.achieved.add(key)
    return SUBGOAL_REWARD


def _visible(ep: _Episode, place: str) -> bool:
    return place == "table" or place in ep.opened or place in ep.recv


def _describe(ep: _Episode) -> str:
    lay = ep.layout
    seen = [f"{'an open' if c in ep.opened else 'a closed'} {c}" for c in lay.containers]
    seen += [_a(f) for f in lay.fixtures]
    parts = [f"you see {_join(seen)}."]
    holds: dict[str, list[str]] = {}
    for item, place in ep.place.items():
        if _visible(ep, place):
            holds.setdefault(place, []).append(_a(item))
    for place in sorted(holds):
        where = "on the table you see" if place == "table" else f"the {place} holds"
        parts.append(f"{where} {_join(holds[place])}.")
    parts += [f"the {d} is on." for d in sorted(ep.powered)]
    if ep.bowl:
        parts.append(f"the bowl holds {_join(ep.bowl)}.")
    return " ".join(parts)


def _look(ep: _Episode, _: str, __: str) -> tuple[str, float]:
    return _describe(ep), 0.0


def _inventory(ep: _Episode, _: str, __: str) -> tuple[str, float]:
    held = [_a(item) for item, place in ep.place.items() if place == "hand"]
    return f"you carry {_join(held) if held else 'nothing'}.", 0.0


def _open(ep: _Episode, container: str, _: str) -> tuple[str, float]:
    if container in ep.locked:
        return f"the {container} is locked.", 0.0
    ep.opened.add(container)
    inside = [_a(item) for item, place in ep.place.items() if place == container]
    found = f"inside you see {_join(inside)}." if inside else "it is empty."
    return f"you open the {container}. {found}", 0.0


def _close(ep: _Episode, container: str, _: str) -> tuple[str, float]:
    ep.opened.discard(container)
    return f"you close the {container}.", 0.0


def _take(ep: _Episode, item: str, _: str) -> tuple[str, float]:
    ep.place[item] = "hand"
    text = f"you take the {item}."
    if item == ep.layout.facts.get("take_wins"):
        return _finish(ep, True, text)
    if item == ep.layout.facts.get("take_earns"):
        return text, _subgoal(ep, "take")
    return text, 0.0


def _put(ep: _Episode, item: str, recv: str) -> tuple[str, float]:
    """Put a held ``item`` into receptacle ``recv``; the family decides what happens next."""
    family = ep.layout.family
    if family == "paint":
        return _pour(ep, item)
    if family == "circuit" and item != "battery":
        return f"the {item} does not fit in the {recv}.", 0.0
    ep.place[item] = recv
    text = f"you put the {item} {PREP.get(recv, 'in')} the {recv}."
    if family == "fetch" and item == ep.layout.facts["item"]:
        return _finish(ep, True, text)
    if family == "heat" and recv in ep.powered:
        more, reward = _heat(ep, item, recv)
        return f"{text} {more}", reward
    if family == "circuit":
        return text, _subgoal(ep, "socket")
    return text, 0.0


def _heat(ep: _Episode, item: str, device: str) -> tuple[str, float]:
    """``item`` is on ``device`` while it is on: it heats if that is its device, else cracks."""
    facts = ep.layout.facts
    if item not in facts:
        return f"the {item} gets warm.", 0.0
    right = facts[item] == device
    if item == facts["target"]:
        if right:
            return _finish(ep, True, f"the {item} is now hot.")
        return _finish(ep, False, f"the {item} cracks.")
    if right:
        return f"the {item} gets hot.", 0.0
    ep.place[item] = "gone"
    return f"the {item} cracks.", 0.0


def _turn_on(ep: _Episode, device: str, _: str) -> tuple[str, float]:
    ep.powered.add(device)
    texts = [f"you turn on the {device}."]
    reward = 0.0
    for item, place in list(ep.place.items()):
        if place == device and not ep.done:
            more, reward = _heat(ep, item, device)
            texts.append(more)
    return " ".join(texts), reward


def _pour(ep: _Episode, paint: str) -> tuple[str, float]:
    """The first paint waits in the bowl; the second mixes with it, right or wrong."""
    facts = ep.layout.facts
    needed = (facts["first"], facts["second"])
    ep.place[paint] = "gone"
    ep.bowl.append(paint)
    text = f"you pour the {paint} into the bowl."
    if len(ep.bowl) == 1:
        return text, _subgoal(ep, paint) if paint in needed else 0.0
    if tuple(sorted(ep.bowl)) != needed:
        return _finish(ep, False, f"{text} the paints run together and turn brown.")
    return text, _subgoal(ep, paint)


def _stir(ep: _Episode, tool: str, _: str) -> tuple[str, float]:
    if len(ep.bowl) < 2:
        return f"you stir the bowl with the {tool}. nothing changes.", 0.0
    return _finish(ep, True, f"you stir the bowl. the paint turns {ep.layout.facts['color']}.")


def _unlock(ep: _Episode, key: str, _: str) -> tuple[str, float]:
    if key != ep.layout.facts["key"]:
        return _finish(ep, False, f"the {key} snaps in the lock.")
    ep.locked.discard("safe")
    return f"you unlock the safe with the {key}.", _subgoal(ep, "unlock")


def _connect(ep: _Episode, wire: str, _: str) -> tuple[str, float]:
    bulb = ep.layout.facts[wire]
    if bulb == ep.layout.facts["bulb"]:
        return _finish(ep, True, f"the {bulb} lights up.")
    return _finish(ep, False, f"the {bulb} flashes and the battery goes flat.")


def _admissible(ep: _Episode) -> _Actions:
    """The actions the world accepts now, in a fixed order, with their handlers."""
    lay = ep.layout
    acts: _Actions = {"look": (_look, "", ""), "inventory": (_inventory, "", "")}
    for c in lay.containers:
        if c not in ep.opened:
            acts[f"open {c}"] = (_open, c, "")
    for c in lay.containers:
        if c in ep.opened:
            acts[f"close {c}"] = (_close, c, "")
    held = [item for item, place in ep.place.items() if place == "hand"]
    for item, place in ep.place.items():
        if place != "hand" and _visible(ep, place):
            acts[f"take {item}"] = (_take, item, "")
    for item in held:
        for name, verb, prep in lay.receptacles:
            if verb != "pour" or item.endswith("paint"):
                acts[f"{verb} {item} {prep} {name}"] = (_put, item, name)
    _family_actions(ep, held, acts)
    return acts


def _family_actions(ep: _Episode, held: list[str], acts: _Actions) -> None:
    family = ep.layout.family
    if family == "heat":
        for device in sorted(DEVICES):
            if device not in ep.powered:
                acts[f"turn on {device}"] = (_turn_on, device, "")
    elif family == "unlock" and "safe" in ep.locked:
        for key in held:
            if key in KEYS:
                acts[f"unlock safe with {key}"] = (_unlock, key, "")
    elif family == "paint" and ep.place["stick"] == "hand":
        acts["stir bowl with stick"] = (_stir, "stick", "")
    elif family == "circuit" and ep.place["battery"] == "socket":
        for wire in held:
            if wire in WIRES:
                acts[f"connect {wire} to battery"] = (_connect, wire, "")


def _check_families(families: object) -> tuple[str, ...]:
    if families is None:
        return FAMILIES
    if not isinstance(families, (list, tuple)):
        raise ValueError(f"families must be a list or tuple of family names, got {families!r}")
    names = list(cast("list[object] | tuple[object, ...]", families))
    if not names:
        raise ValueError("families must not be empty")
    for name in names:
        if name not in FAMILIES:
            raise ValueError(f"unknown minilab family {name!r}; known: {', '.join(FAMILIES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"families must not repeat a name, got {names!r}")
    return tuple(f for f in FAMILIES if f in names)


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if type(value) is not int:
        raise ValueError(f"{name} must be an int, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value


class MiniLab:
    """The built-in world: a tiny lab, generated per variant, cheap to step.

    Args:
        families: the families to offer, a subset of :data:`FAMILIES` (None: all of them).
        train_variants: train variants per family, ids ``0..n-1``.
        heldout_variants: held-out variants per family, ids from :data:`HELDOUT_BASE` on.
        max_steps: the step limit of every episode, 1 to 20 (None: each family's default).

    Raises:
        ValueError: an option has the wrong type, is out of range or names an unknown family.
    """

    name: str = "minilab"
    blocking: bool = False  # microseconds per step: env workers may step it on the event loop

    def __init__(
        self,
        *,
        families: Sequence[str] | None = None,
        train_variants: int = 500,
        heldout_variants: int = 100,
        max_steps: int | None = None,
    ) -> None:
        self._families = _check_families(families)
        self._train = _check_int("train_variants", train_variants, 1, HELDOUT_BASE)
        self._heldout = _check_int("heldout_variants", heldout_variants, 0, HELDOUT_BASE)
        if max_steps is not None:
            _check_int("max_steps", max_steps, 1, MAX_STEPS_CAP)
        self._max_steps = max_steps
        self._tasks: dict[tuple[str, str], tuple[Task, ...]] = {}
        self._episode: _Episode | None = None
        self._actions: _Actions = {}

    def families(self) -> tuple[str, ...]:
        """The offered families, in the order of :data:`FAMILIES`."""
        return self._families

    def tasks(self, family: str, split: str) -> Sequence[Task]:
        """The variants of ``family`` in ``split``, by increasing id.

        Raises:
            ValueError: unknown family or split.
        """
        self._check_family(family)
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of: {', '.join(SPLITS)}")
        key = (family, split)
        if key not in self._tasks:
            ids = range(self._train) if split == "train" else self._heldout_ids()
            self._tasks[key] = tuple(Task(family=family, variant=v, split=split) for v in ids)
        return self._tasks[key]

    def reset(self, task: Task, seed: int) -> Observation:
        """Start an episode of ``task``. minilab has no within-episode randomness, so ``seed``
        is accepted for the interface and changes nothing.

        Raises:
            ValueError: the task's family, split or variant is not offered by this world.
        """
        self._check_task(task)
        limit = self._max_steps or DEFAULT_MAX_STEPS[task.family]
        ep = _Episode(layout_of(task.family, task.variant), limit)
        self._episode = ep
        self._actions = _admissible(ep)
        text = f"you are in a small lab. {_describe(ep)}"
        return Observation(text=text, admissible=tuple(self._actions), goal=ep.layout.goal)

    def step(self, action: str) -> Observation:
        """Apply ``action``; one that is not admissible wastes the turn.

        Raises:
            RuntimeError: called before ``reset`` or after the episode is done.
        """
        ep = self._episode
        if ep is None:
            raise RuntimeError("step() called before reset()")
        if ep.done:
            raise RuntimeError("step() called after the episode is done; call reset() first")
        entry = self._actions.get(action)
        text, reward = entry[0](ep, entry[1], entry[2]) if entry else ("you can not do that.", 0.0)
        ep.steps += 1
        ep.score = 1.0 if ep.success else round(ep.score + reward, 6)
        if not ep.done and ep.steps >= ep.max_steps:
            ep.done = True
            text = f"{text} you are out of time."
        self._actions = {} if ep.done else _admissible(ep)
        return Observation(
            text=text,
            admissible=tuple(self._actions),
            goal=ep.layout.goal,
            reward=reward,
            done=ep.done,
            score=ep.score,
            success=ep.success,
        )

    def close(self) -> None:
        """Forget the current episode; there is nothing else to release. Safe to call twice."""
        self._episode = None
        self._actions = {}

    def _heldout_ids(self) -> range:
        return range(HELDOUT_BASE, HELDOUT_BASE + self._heldout)

    def _check_family(self, family: str) -> None:
        if family not in self._families:
            offered = ", ".join(self._families)
            raise ValueError(f"unknown minilab family {family!r}; this world offers: {offered}")

    def _check_task(self, task: Task) -> None:
        self._check_family(task.family)
        if task.split not in SPLITS:
            raise ValueError(f"unknown split {task.split!r}; expected one of: {', '.join(SPLITS)}")
        ids = range(self._train) if task.split == "train" else self._heldout_ids()
        if task.variant not in ids:
            raise ValueError(
                f"variant {task.variant} is not a {task.split} variant of {task.family}"
            )
