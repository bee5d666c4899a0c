"""The scripted play the local models are pre-trained on, as text: deterministic given the
world, the spec's seeds and the purpose.

- :func:`play_families`: episodes by the memoryless :class:`~agents.acting.scripted.Explorer` (a
  share ``explorer_share``) and :class:`~agents.acting.scripted.RandomAgent`, on each family's train
  variants, never the last ``eval_variants`` of them (kept back for checks) nor held-out ones.
- :func:`note_episodes`: episodes in which notes are shown (a kind drawn from
  :data:`NOTE_MIX`, :mod:`agents.models.notes`) and the Explorer follows them; their turns teach the
  policy to read a note in its prompt, as EMPO2's tips and Complementary RL's entries show it.

Shared by the embedded policy model (:mod:`agents.models.embedded`) and the extractor's operation
stage (:mod:`agents.models.extractor_base`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from agents.acting.scripted import MAX_TURNS, Agent, Explorer, RandomAgent, Turn
from agents.acting.world_calls import WorldFailed, checked_observation
from agents.models.notes import EMPTY_NOTE, NoteSource, Shown, combine_notes, render, write_library
from agents.models.prompts import Step, reflection_messages, turn_messages
from engine.errors import CoevoError
from engine.world import Observation, Task, TextWorld

NOTE_MIX = (
    ("variant", 0.35),
    ("failure", 0.15),
    ("family", 0.3),
    ("unrelated", 0.1),
    ("empty", 0.1),
)
"""The kinds of note pre-training shows, with their shares
(:data:`agents.models.notes.NOTE_KINDS`)."""


class PlaySpec(Protocol):
    """What play reads of a spec (an :class:`agents.models.embedded.EmbeddedSpec`)."""

    @property
    def seed(self) -> int: ...
    @property
    def explorer_share(self) -> float: ...
    @property
    def eval_variants(self) -> int: ...
    @property
    def episodes_per_family(self) -> int: ...
    @property
    def note_episodes_per_family(self) -> int: ...
    @property
    def note_tries(self) -> int: ...
    @property
    def entry_share(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Episode:
    """One episode of scripted play, as text: ``agent`` is ``"explorer"`` or ``"random"``,
    ``first`` the observation after reset, ``admissible`` the actions offered before each
    turn, ``tips`` the notes every turn's prompt showed (as rendered) and ``kind`` their kind
    (``"none"`` without notes)."""

    task: Task
    agent: str
    goal: str
    first: str
    transcript: tuple[Turn, ...]
    admissible: tuple[tuple[str, ...], ...]
    success: bool
    tips: tuple[str, ...] = ()
    kind: str = "none"

    @property
    def history(self) -> list[Step]:
        """``(action, observation text)`` per turn, as prompts show it."""
        return [(action, text) for action, text, _ in self.transcript]


def play(
    world: TextWorld, task: Task, seed: int, agent: Agent, name: str, shown: Shown | None = None
) -> Episode:
    """One episode of ``task`` by ``agent`` (called ``name``); ``shown`` are the notes its
    prompts show (as rendered), which the agent was given."""
    where = f"{task.family}/{task.variant}"
    obs = _world_call(partial(world.reset, task, seed), f"world.reset({where})")
    agent.reset(obs.goal, obs)
    goal, first, turns, offered = obs.goal, obs.text, [], []
    while not obs.done:
        if len(turns) >= MAX_TURNS:
            raise PlayFailed(f"an episode of {where} did not end in {MAX_TURNS} turns")
        offered.append(tuple(obs.admissible))
        action = agent.act(obs)
        obs = _world_call(partial(world.step, action), f"world.step({action!r}) on {where}")
        turns.append((action, obs.text, obs.reward))
    tips, kind = (shown.tips, shown.kind) if shown else ((), "none")
    return Episode(task, name, goal, first, tuple(turns), tuple(offered), obs.success, tips, kind)


class PlayFailed(CoevoError):
    """Scripted play could not go on: the world raised, returned an invalid observation
    (:func:`agents.acting.world_calls.checked_observation`) or never ended an episode."""


def _world_call(call: Callable[[], object], what: str) -> Observation:
    try:
        obs = call()
    except WorldFailed as exc:  # a guarded world (GuardedWorld), which names the call
        raise PlayFailed(str(exc)) from None
    except Exception as exc:
        raise PlayFailed(f"{what} raised {type(exc).__name__}: {exc}") from exc
    try:
        return checked_observation(obs, what)
    except WorldFailed as exc:
        raise PlayFailed(str(exc)) from None


def split_train(world: TextWorld, family: str, eval_variants: int) -> tuple[list[Task], list[Task]]:
    """The train variants of ``family`` for pre-training, and the last ``eval_variants``.

    Raises:
        ValueError: no train variant would be left for pre-training.
    """
    tasks = list(world.tasks(family, "train"))
    if len(tasks) <= eval_variants:
        raise ValueError(
            f"family {family!r} has {len(tasks)} train variants: pre-training keeps the last "
            f"eval_variants ({eval_variants}) back and needs one more (set "
            "policy.embedded.eval_variants lower)"
        )
    return tasks[: len(tasks) - eval_variants], tasks[len(tasks) - eval_variants :]


def play_mix(
    world: TextWorld, tasks: Sequence[Task], count: int, spec: PlaySpec, purpose: str
) -> list[Episode]:
    """``count`` episodes over ``tasks`` in turn, by the Explorer with probability
    ``spec.explorer_share`` and by RandomAgent otherwise, seeded from the spec and purpose."""
    episodes = []
    for i in range(count):
        task = tasks[i % len(tasks)]
        rng = random.Random(f"coevo.embedded/{purpose}/{spec.seed}/{task.family}/{i}")
        explorer = rng.random() < spec.explorer_share
        agent = Explorer(rng) if explorer else RandomAgent(rng)
        episodes.append(play(world, task, i, agent, "explorer" if explorer else "random"))
    return episodes


def play_families(
    world: TextWorld, spec: PlaySpec, count: int, held_back: bool, purpose: str
) -> list[Episode]:
    """:func:`play_mix` of ``count`` episodes per family, family by family, on its train
    variants for training (``held_back`` False) or on the last ``spec.eval_variants`` of them,
    kept back for checks (a family with none is skipped)."""
    return [
        ep
        for family in world.families()
        for tasks in [split_train(world, family, spec.eval_variants)[int(held_back)]]
        if tasks
        for ep in play_mix(world, tasks, count, spec, purpose)
    ]


def _kind(rng: random.Random) -> str:
    u, acc = rng.random(), 0.0
    for kind, share in NOTE_MIX:
        acc += share
        if u < acc:
            return kind
    return NOTE_MIX[-1][0]


def note_episodes(world: TextWorld, spec: PlaySpec, purpose: str = "notes") -> list[Episode]:
    """``spec.note_episodes_per_family`` episodes per family on its pre-training variants,
    each shown notes of a kind drawn from :data:`NOTE_MIX` (as written, or as entries with
    probability ``spec.entry_share``) and played by the Explorer following them. A kind with no
    note for the variant (no success seen in ``spec.note_tries`` tries) falls back to
    ``family``, then to ``empty``."""
    count = spec.note_episodes_per_family
    if not count:
        return []
    used = {
        family: [tasks[i % len(tasks)] for i in range(count)]
        for family in world.families()
        for tasks in [split_train(world, family, spec.eval_variants)[0]]
    }
    distinct = list(dict.fromkeys(t for tasks in used.values() for t in tasks))
    library = write_library(world, distinct, spec.note_tries, f"{purpose}/{spec.seed}")
    source = NoteSource(library, world)
    episodes = []
    for family, tasks in used.items():
        for i, task in enumerate(tasks):
            rng = random.Random(f"coevo.embedded/{purpose}/{spec.seed}/{family}/{i}")
            own = library[task]
            shown = source.pick(_kind(rng), task, own.goal, rng, own=own)
            if not shown.tips:
                shown = source.pick("family", task, own.goal, rng, own=own)
            if not shown.tips:
                shown = Shown("empty", (EMPTY_NOTE,))
            agent = Explorer(rng, note=combine_notes(shown.tips))
            rendered = Shown(shown.kind, render(shown.tips, rng.random() < spec.entry_share))
            episodes.append(play(world, task, i, agent, "explorer", rendered))
    return episodes


def turn_conversations(episode: Episode, window: int) -> list[list[dict[str, str]]]:
    """The prompt of each turn: no admissible list, the episode's tips, the last ``window``
    turns."""
    history, first, tips = episode.history, episode.first, episode.tips
    return [
        turn_messages(
            episode.goal, history[:t], history[t - 1][1] if t else first, tips=tips, window=window
        )
        for t in range(len(history))
    ]


def reflection_conversation(episode: Episode) -> list[dict[str, str]]:
    """The prompt that asks for a note on the whole episode."""
    return reflection_messages(
        episode.goal, episode.first, episode.history, success=episode.success
    )


def pretrain_episodes(world: TextWorld, spec: PlaySpec) -> list[Episode]:
    """The pre-training play: train variants only, never the held-back ones; the episodes
    without notes, then those with."""
    plain = play_families(world, spec, spec.episodes_per_family, False, "pretrain")
    return plain + note_episodes(world, spec)
