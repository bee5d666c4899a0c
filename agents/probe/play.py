"""Playing one fixed policy on fixed tasks, shown a bank's entries as guided episodes are.

A plain synchronous loop, no actors and no log (as ``bench/grpo_sync.py``): ``width`` episodes are
live at a time, one world each; every tick the live episodes' action requests are answered by
:meth:`PolicyRunner.answer`, ``batch`` per forward pass, and a finished episode's world takes the
next episode. Every world call goes through the env worker's guards
(:class:`agents.acting.world_calls.GuardedWorld`, ``step_timeout``): an episode whose world
raises, hangs or answers wrongly ends as aborted, a failure, as held-out evaluation counts it,
and a new world takes the next episode; one longer than ``max_turns`` ends unfinished.

Each episode is exactly a held-out episode of the method played with its bank
(:class:`agents.acting.env_worker._PolicyAgent`): at turn 0 the bank is asked once with the
"diverse" rule for one entry of the family's training partition, the query being the turn's state
text, and the entry stays in the prompt every turn (:func:`agents.models.prompts.turn_messages` with
``tips``). Episodes start in index order, so what each one retrieves does not depend on ``width`` or
``batch``; each request carries the seed an env worker would derive, so what is sampled does not
either. Given its tasks and seeds, the result is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from agents.acting.inference import PolicyRunner
from agents.acting.world_calls import UNLIMITED_CAP, GuardedWorld, WorldFailed
from agents.events.memory import RetrievalRequested, slot_of
from agents.events.policy import ActionRequested
from agents.memory.bank import TipBank
from agents.models.prompts import (
    TURN_SYSTEM,
    MemoryPlace,
    Step,
    state_text,
    to_pairs,
    turn_messages,
)
from engine.seeds import derive_seed
from engine.world import Observation, Task, TextWorld

Embed = Callable[[Sequence[str]], list[np.ndarray]]


@dataclass(frozen=True)
class PlaySettings:
    """How the policy is prompted and batched (the run's ``[policy]``, ``[prompt]`` and ``[eval]``
    keys).

    Attributes:
        window: past turns shown.
        list_actions: list the admissible actions in the prompt.
        greedy: act greedily (the run's ``eval.greedy``).
        batch: requests per forward pass.
        width: episodes live at a time (one world each).
        system: the system message's text.
        memory: the message the entry is appended to ("user" or "system").
        max_turns: turns after which an episode ends unfinished (the run's ``[world]
            max_turns``; 0:
            :data:`agents.acting.world_calls.UNLIMITED_CAP`).
        step_timeout: seconds a world call may take (the run's ``[world] step_timeout``;
            None: no limit).
    """

    window: int = 4
    list_actions: bool = False
    greedy: bool = False
    batch: int = 32
    width: int = 64
    system: str = TURN_SYSTEM
    memory: MemoryPlace = "user"
    max_turns: int = 0
    step_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.batch < 1 or self.width < 1 or self.max_turns < 0:
            raise ValueError(f"batch and width must be >= 1 and max_turns >= 0, got {self}")


class Played(msgspec.Struct, frozen=True, kw_only=True):
    """One probe episode's outcome and the entry it was shown (-1 and "": none); ``aborted``
    says why its world failed ("" when it did not; the episode then counts as a failure)."""

    index: int
    family: str
    variant: int
    seed: int
    success: bool
    score: float
    steps: int
    entry: int = -1
    call: str = ""
    aborted: str = ""
    cut: int = 0
    """Turns whose prompt was cut in the middle to fit the model's positions."""


@dataclass
class _Live:
    index: int
    world: GuardedWorld
    obs: Observation
    goal: str
    tips: tuple[str, ...]
    entry: int
    call: str
    history: list[Step] = field(default_factory=list[Step])
    cut: int = 0  # turns whose prompt lost its middle


def episode_seeds(seed: int, n: int) -> list[int]:
    """The seeds of a probe's ``n`` episodes (the same for every bank)."""
    return [derive_seed(seed, "probe-episode", i) for i in range(n)]


def play(
    runner: PolicyRunner,
    make_world: Callable[[], TextWorld],
    tasks: Sequence[Task],
    seeds: Sequence[int],
    settings: PlaySettings,
    bank: TipBank | None = None,
    embed: Embed | None = None,
    progress: Callable[[int], None] = lambda _: None,
) -> list[Played]:
    """Play ``tasks[i]`` with seed ``seeds[i]`` for every i, shown ``bank``'s entries (None:
    no bank); ``progress`` is told of each finished episode. Retrievals change ``bank``'s
    retrieval counts, as the method's do: give it a copy.

    Raises:
        ValueError: tasks and seeds differ in length, or a bank comes without ``embed``.
        WorldFailed: a world could not be built.
    """
    if len(tasks) != len(seeds):
        raise ValueError(f"{len(tasks)} tasks but {len(seeds)} seeds")
    if bank is not None and embed is None:
        raise ValueError("a bank needs an embed function for its queries")
    worlds = _Worlds(make_world, settings.step_timeout)
    try:
        for _ in range(min(settings.width, len(tasks))):
            worlds.free.append(worlds.build())
        return _loop(runner, worlds, tasks, seeds, settings, bank, embed, progress)
    finally:
        worlds.close()


class _Worlds:
    """Every world a play built: the free ones, and each closed at the end (a broken one is
    left to its abandoned thread)."""

    def __init__(self, make_world: Callable[[], TextWorld], timeout: float | None) -> None:
        self._make, self._timeout = make_world, timeout
        self.built: list[GuardedWorld] = []
        self.free: list[GuardedWorld] = []

    def build(self) -> GuardedWorld:
        world = GuardedWorld(self._make, self._timeout)
        self.built.append(world)
        return world

    def close(self) -> None:
        for world in self.built:
            world.close()


def _loop(
    runner: PolicyRunner,
    worlds: _Worlds,
    tasks: Sequence[Task],
    seeds: Sequence[int],
    s: PlaySettings,
    bank: TipBank | None,
    embed: Embed | None,
    progress: Callable[[int], None],
) -> list[Played]:
    done: list[Played | None] = [None] * len(tasks)
    live: list[_Live] = []
    free = worlds.free
    free.reverse()
    cap = s.max_turns or UNLIMITED_CAP
    nxt = 0

    def aborted(index: int, world: GuardedWorld, exc: WorldFailed, ep: _Live | None = None) -> None:
        """The episode ends as a failure, its world is replaced (``ep``: it had started)."""
        task = tasks[index]
        done[index] = Played(
            index=index,
            family=task.family,
            variant=task.variant,
            seed=seeds[index],
            success=False,
            score=0.0,
            steps=len(ep.history) if ep else 0,
            entry=ep.entry if ep else -1,
            call=ep.call if ep else "",
            aborted=str(exc),
        )
        world.close()
        free.append(worlds.build())
        progress(1)

    while nxt < len(tasks) or live:
        while free and nxt < len(tasks):
            world = free.pop()
            try:
                live.append(_start(world, nxt, tasks[nxt], seeds[nxt], s, bank, embed))
            except WorldFailed as exc:
                aborted(nxt, world, exc)
            nxt += 1
        requests = [_request(ep, seeds[ep.index], s) for ep in live]
        answers = []
        for k in range(0, len(requests), s.batch):
            answers += runner.answer(requests[k : k + s.batch])
        still = []
        for ep, answer in zip(live, answers, strict=True):
            try:
                ep.obs = ep.world.step(answer.action)
            except WorldFailed as exc:
                aborted(ep.index, ep.world, exc, ep)
                continue
            ep.history.append((answer.action, ep.obs.text))
            ep.cut += answer.prompt_cut > 0
            if ep.obs.done or len(ep.history) >= cap:
                done[ep.index] = _played(ep, tasks[ep.index], seeds[ep.index])
                free.append(ep.world)
                progress(1)
            else:
                still.append(ep)
        live = still
    return [p for p in done if p is not None]


def _start(
    world: GuardedWorld,
    index: int,
    task: Task,
    seed: int,
    s: PlaySettings,
    bank: TipBank | None,
    embed: Embed | None,
) -> _Live:
    obs = world.reset(task, seed)
    tips: tuple[str, ...] = ()
    entry, call = -1, ""
    if bank is not None and embed is not None:
        query = state_text(obs.goal, [], obs.text, window=s.window)
        found = bank.retrieve(
            RetrievalRequested(
                episode=f"probe{index}",
                worker="probe",
                turn=0,
                slot=slot_of("train", task.family),
                query=query,
                rule="diverse",
                k=1,
            ),
            embed([query])[0],
        )
        tips = found.tips
        if found.tip_ids:
            entry, call = found.tip_ids[0], found.calls[0]
    return _Live(index, world, obs, obs.goal, tips, entry, call)


def _request(ep: _Live, seed: int, s: PlaySettings) -> ActionRequested:
    messages = turn_messages(
        ep.goal,
        ep.history,
        ep.obs.text,
        admissible=ep.obs.admissible if s.list_actions else None,
        tips=ep.tips,
        window=s.window,
        system=s.system,
        memory=s.memory,
    )
    turn = len(ep.history)
    return ActionRequested(
        episode=f"probe{ep.index}",
        worker="probe",
        turn=turn,
        messages=to_pairs(messages),
        admissible=ep.obs.admissible,
        seed=derive_seed(seed, "act", turn),
        greedy=s.greedy,
        tips=ep.tips,
    )


def _played(ep: _Live, task: Task, seed: int) -> Played:
    return Played(
        index=ep.index,
        family=task.family,
        variant=task.variant,
        seed=seed,
        success=ep.obs.success,
        score=ep.obs.score,
        steps=len(ep.history),
        entry=ep.entry,
        call=ep.call,
        cut=ep.cut,
    )
