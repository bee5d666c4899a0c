"""Scripted agents: seeded, pure baselines for tests, the quickstart and benchmarks.

Every agent takes its own ``random.Random`` (or a seed) and never touches the global RNG. An agent
is told the goal and first observation by ``reset`` and picks one admissible action per ``act``.

- :class:`RandomAgent` picks uniformly among the admissible actions.
- :class:`Explorer` explores without memory across episodes: it prefers actions it has not tried
  in this episode, looking and opening before taking and taking before anything else. Given a
  note (see :func:`hindsight_note`) it first follows the note's plan, then explores.

:func:`hindsight_note` writes a note from an episode's text alone (actions, observation texts and
rewards), never from a world's hidden state, so a learned extractor can be compared against it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.world import Observation, Task, TextWorld

Turn = tuple[str, str, float]
"""One turn of a transcript: (action, observation text, reward)."""

_PREPOSITIONS = re.compile(r" (?:into|in|on|to|with) ")
_NOT_WORD = re.compile(r"[^a-z0-9 ]+")
_NEVER_IN_PLAN = ("look", "inventory", "close ", "drop ")
_FAILED = "the task failed"
_RANK = {"look": 0, "open": 1, "take": 2, "inventory": 5, "close": 6, "drop": 6}
_COMMIT = 3  # any other verb changes the world in a way that may not be undone


class Agent(Protocol):
    """What acts in an episode: told the goal and first observation, then asked each turn."""

    def reset(self, goal: str, observation: Observation) -> None: ...

    def act(self, observation: Observation) -> str: ...


def _rng(rng: random.Random | int) -> random.Random:
    return rng if isinstance(rng, random.Random) else random.Random(rng)


class RandomAgent:
    """Picks uniformly among the admissible actions.

    Args:
        rng: a ``random.Random`` or a seed for one.
    """

    def __init__(self, rng: random.Random | int) -> None:
        self._rng = _rng(rng)

    def reset(self, goal: str, observation: Observation) -> None:
        """Nothing to remember."""

    def act(self, observation: Observation) -> str:
        """A uniformly random admissible action."""
        return self._rng.choice(observation.admissible)


def phrases(action: str) -> tuple[str, ...]:
    """The object phrases of an action: ``"put metal pan on stove"`` -> ``("metal pan", "stove")``.

    Args:
        action: an action in minilab's grammar: a verb (one word, or "turn on" and "turn off"),
            an object, maybe a preposition and a second object.

    Returns:
        The phrases after the verb, split at the preposition; empty for "look".
    """
    verb_words = 2 if action.startswith("turn ") else 1
    parts = action.split(" ", verb_words)
    if len(parts) <= verb_words:
        return ()
    return tuple(p for p in _PREPOSITIONS.split(parts[verb_words]) if p)


def _words(text: str) -> str:
    return f" {_NOT_WORD.sub(' ', text)} "


def _last_uses(uses: list[tuple[str, ...]], phrase: str, before: int, direct: bool) -> list[int]:
    """The last step before ``before`` that acted on ``phrase`` as its first object and, for a
    ``direct`` object, every later step that named it ("put pan on stove" before "turn on
    stove")."""
    start = next((j for j in range(before - 1, -1, -1) if uses[j][:1] == (phrase,)), -1)
    later = [j for j in range(start + 1, before) if phrase in uses[j]] if direct else []
    return [start, *later] if start >= 0 else later


def _first_mention(texts: list[str], phrase: str, before: int) -> int | None:
    needle = f" {phrase} "
    for k in range(before):
        if needle in texts[k]:
            return k
    return None


def _needed_steps(transcript: Sequence[Turn]) -> tuple[list[int], list[tuple[str, int]]]:
    """The steps a success depended on: the rewarded ones, then recursively the last earlier
    step that handled each of their objects and the step whose text first showed it."""
    uses = [phrases(action) for action, _, _ in transcript]
    texts = [_words(text) for _, text, _ in transcript]
    needed: set[int] = set()
    found: dict[str, int] = {}
    stack = [i for i, (_, _, reward) in enumerate(transcript) if reward > 0]
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        for position, phrase in enumerate(uses[i]):
            stack += _last_uses(uses, phrase, i, direct=position == 0)
            k = _first_mention(texts, phrase, i)
            if k is not None and phrase not in uses[k]:
                stack.append(k)
                if not transcript[k][0].startswith(_NEVER_IN_PLAN):
                    found.setdefault(phrase, k)
    return sorted(needed), sorted(found.items(), key=lambda pair: (pair[1], pair[0]))


def hindsight_note(transcript: Sequence[Turn]) -> str:
    """A short note on an episode, written from its text alone.

    The plan lists, in order, the actions that earned reward and the actions they depended on
    (where their objects were found and last handled), without looks, inventories or closes,
    and an action done more than once only where it was done last (``open safe`` tried while
    the safe was locked, then again after unlocking it, is planned after the unlocking);
    found lists where each object turned up; avoid lists the actions that failed the task.

    Args:
        transcript: the episode's turns, ``(action, observation text, reward)`` each.

    Returns:
        Lines ``plan: a, b.``, ``found: x after a.`` and ``avoid: a.``, the last two only when
        they have content; ``plan: none.`` when nothing earned reward.
    """
    needed, found = _needed_steps(transcript)
    plan = [transcript[i][0] for i in needed]
    plan = [action for action in plan if not action.startswith(_NEVER_IN_PLAN)]
    plan = [a for k, a in enumerate(plan) if a not in plan[k + 1 :]]  # each where done last
    lines = [f"plan: {', '.join(plan) if plan else 'none'}."]
    if found:
        lines.append(f"found: {', '.join(f'{p} after {transcript[k][0]}' for p, k in found)}.")
    avoid = sorted({action for action, text, _ in transcript if _FAILED in text})
    if avoid:
        lines.append(f"avoid: {', '.join(avoid)}.")
    return "\n".join(lines)


def parse_note(note: str | None) -> tuple[list[str], set[str]]:
    """The plan and the actions to avoid in a note written by :func:`hindsight_note`.

    Args:
        note: the note text, or None.

    Returns:
        ``(plan, avoid)``; both empty for None or a note without those lines.
    """
    plan: list[str] = []
    avoid: set[str] = set()
    for line in (note or "").splitlines():
        head, _, body = line.strip().rstrip(".").partition(": ")
        items = [item.strip() for item in body.split(", ") if item.strip()]
        if head == "plan" and items != ["none"]:
            plan = items
        elif head == "avoid":
            avoid = set(items)
    return plan, avoid


def _rank(action: str) -> int:
    return _RANK.get(action.split(" ", 1)[0], _COMMIT)


class Explorer:
    """A heuristic explorer with no memory across episodes, optionally following a note.

    Each turn it takes the first action of the note's plan that it has not done yet and that is
    admissible now; otherwise it explores: among the actions it has not tried in this episode
    it prefers look, then open, then take, then the rest; with nothing useful left untried it
    repeats a useful action (never a look), and closes or drops only as a last resort. Ties are
    broken by its own rng.

    Args:
        rng: a ``random.Random`` or a seed for one.
        note: a note on an earlier episode of the same variant (see :func:`hindsight_note`),
            read at every ``reset``; assign ``note`` to change it between episodes.
    """

    def __init__(self, rng: random.Random | int, note: str | None = None) -> None:
        self._rng = _rng(rng)
        self.note = note
        self._plan: list[str] = []
        self._avoid: set[str] = set()
        self._done: set[int] = set()
        self._tried: set[str] = set()

    def reset(self, goal: str, observation: Observation) -> None:
        """Forget the last episode and read the note again."""
        self._plan, self._avoid = parse_note(self.note)
        self._done = set()
        self._tried = set()

    def act(self, observation: Observation) -> str:
        """The next admissible plan action, else the best untried action."""
        admissible = observation.admissible
        action = self._from_plan(admissible) or self._explore(admissible)
        self._tried.add(action)
        return action

    def _from_plan(self, admissible: Sequence[str]) -> str | None:
        for i, action in enumerate(self._plan):
            if i not in self._done and action in admissible:
                self._done.add(i)
                return action
        return None

    def _explore(self, admissible: Sequence[str]) -> str:
        allowed = [a for a in admissible if a not in self._avoid] or list(admissible)
        useful = [a for a in allowed if _rank(a) <= _COMMIT]
        # untried first; then repeat something useful (not a look); close or drop last of all
        pool = [a for a in useful if a not in self._tried]
        pool = pool or [a for a in useful if _rank(a) > 0] or allowed
        best = min(_rank(a) for a in pool)
        return self._rng.choice([a for a in pool if _rank(a) == best])


@dataclass(frozen=True, slots=True)
class EpisodeResult:
    """The outcome of one episode run by :func:`run_episode`.

    Attributes:
        success: the goal was reached.
        score: the final score.
        steps: the number of actions taken.
        transcript: ``(action, observation text, reward)`` per turn.
    """

    success: bool
    score: float
    steps: int
    transcript: tuple[Turn, ...]


MAX_TURNS = 1000
"""The most turns of one scripted episode: :func:`run_episode` ends one there by default,
unsuccessful, and pre-training's play refuses a world whose episode goes on past it
(``agents.models.pretrain_play``). A world that never ends an episode, or an agent that repeats
an action the world answers without ending, would play for ever (the embedded model's checks
hung on a world that ends only on success)."""


def run_episode(
    world: TextWorld, task: Task, seed: int, agent: Agent, max_turns: int = MAX_TURNS
) -> EpisodeResult:
    """Run one episode of ``task`` with ``agent`` until the world says done, or for
    ``max_turns`` turns (the episode then ends there, unsuccessful, as a run truncates one at
    its ``[world] max_turns``).

    Args:
        world: any text world.
        task: the task to play.
        seed: the episode seed passed to ``world.reset``.
        agent: any object with ``reset(goal, observation)`` and ``act(observation)``.
        max_turns: the most turns played.

    Returns:
        The episode's :class:`EpisodeResult`.
    """
    obs = world.reset(task, seed)
    agent.reset(obs.goal, obs)
    transcript: list[Turn] = []
    while not obs.done and len(transcript) < max_turns:
        action = agent.act(obs)
        obs = world.step(action)
        transcript.append((action, obs.text, obs.reward))
    return EpisodeResult(
        success=obs.done and obs.success,
        score=obs.score,
        steps=len(transcript),
        transcript=tuple(transcript),
    )
