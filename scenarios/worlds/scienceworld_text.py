"""ScienceWorld's texts made comparable and its action lists bounded, for the ScienceWorld world.

:func:`normalise` puts every list of objects in an observation in a fixed order, so that replays
compare equal; :func:`rank_actions` bounds the admissible list deterministically, by verb
(:data:`VERB_ORDER`) and by the goal's words. Plain string work: nothing here needs the
``scienceworld`` extra.
"""

from __future__ import annotations

import collections
import heapq
import re
from collections.abc import Iterable

__all__ = [
    "EXCLUDED_ACTIONS",
    "VERB_ORDER",
    "goal_words",
    "normalise",
    "rank_actions",
    "verb_rank",
]

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


def normalise(text: str) -> str:
    """ScienceWorld's text with every list of objects in a fixed order.

    ScienceWorld lists the contents of rooms and containers in the iteration order of hash sets,
    which changes from run to run unless the JVM runs with
    :data:`~scenarios.worlds.scienceworld_jvm.STABLE_HASH_FLAGS`. Both forms of list are sorted:
    tab-indented lines that follow each other at one indentation, and inline lists
    (``In the sink is: a, b.``, ``(containing a, b)``, ``You also see: a, b.``). Trailing spaces
    and blank edges are dropped; nothing else changes.
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


def verb_rank(action: str) -> int:
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
        buckets[verb_rank(action)].append(action)
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
