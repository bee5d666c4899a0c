"""Quality checks of a pre-trained policy model, reported in its build's ``pretrain.json``:
its play on the held-back train variants (greedy and sampled, against the Explorer), its notes
on fresh episodes against their hindsight notes, and (:mod:`agents.models.note_probe`) its play with
notes shown.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from agents.acting.scripted import Explorer, hindsight_note, parse_note, run_episode
from agents.models.policy import generate, score_and_choose
from agents.models.pretrain_play import (
    PlaySpec,
    play_families,
    reflection_conversation,
    split_train,
)
from agents.models.prompts import (
    PromptEncoder,
    Step,
    cut_gap,
    cut_middle,
    decode_response,
    encode_prompt,
    encode_response,
    end_ids,
    fit_scoring,
    prompt_room,
    turn_messages,
)
from engine.world import Observation, TextWorld


class CheckSpec(PlaySpec, Protocol):
    """What the checks read of a spec (an :class:`agents.models.embedded.EmbeddedSpec`)."""

    @property
    def window(self) -> int: ...
    @property
    def eval_notes(self) -> int: ...
    @property
    def max_positions(self) -> int: ...


CHECK_SEEDS = {"greedy": 1, "sampled": 2, "explorer": 4}
"""Episodes per held-back variant in the policy check (greedy play is deterministic)."""


class PolicyAgent:
    """Plays by scoring every admissible action as a response: it takes the most likely one,
    or, given an ``rng``, samples one from the softmax of the scores.

    Args:
        model: a causal LM; tokenizer: its tokenizer.
        window: the turns of history its prompts show.
        rng: None for greedy play, else the sampling rng.
    """

    def __init__(
        self, model: Any, tokenizer: Any, window: int, rng: random.Random | None = None
    ) -> None:
        self._model, self._tok, self._window, self._rng = model, tokenizer, window, rng
        self._goal = ""
        self._history: list[Step] = []
        self._last: str | None = None

    def reset(self, goal: str, observation: Observation) -> None:
        """Start a new episode."""
        self._goal, self._history, self._last = goal, [], None

    def act(self, observation: Observation) -> str:
        """The chosen admissible action."""
        if self._last is not None:
            self._history.append((self._last, observation.text))
        messages = turn_messages(self._goal, self._history, observation.text, window=self._window)
        actions = observation.admissible
        prompt, responses = fit_scoring(
            encode_prompt(self._tok, messages),
            [encode_response(self._tok, a) for a in actions],
            self._model.config.max_position_embeddings,
            cut_gap(self._tok),
        )
        (choice,) = score_and_choose(
            self._model,
            [prompt],
            [responses],
            [self._rng or random.Random(0)],  # greedy draws nothing from it
            temperature=0.0 if self._rng is None else 1.0,
            pad_id=self._tok.pad_token_id,
            device=torch.device("cpu"),
        )
        self._last = actions[choice.index]
        return self._last


def _rate(flags: Sequence[bool]) -> float | None:
    return round(sum(flags) / len(flags), 4) if flags else None


def policy_check(model: Any, tokenizer: Any, world: TextWorld, spec: CheckSpec) -> dict:
    """Success on the held-back train variants of greedy and sampled play and of the Explorer
    (:data:`CHECK_SEEDS` episodes per variant)."""
    agents: dict[str, Callable[[int], Any]] = {
        "greedy": lambda seed: PolicyAgent(model, tokenizer, spec.window),
        "sampled": lambda seed: PolicyAgent(model, tokenizer, spec.window, random.Random(seed)),
        "explorer": lambda seed: Explorer(random.Random(seed)),
    }
    flags: dict[str, dict[str, list[bool]]] = {"all": {name: [] for name in agents}}
    for family in world.families():
        tasks = split_train(world, family, spec.eval_variants)[1]
        flags[family] = {
            name: [
                run_episode(world, task, seed, make(seed)).success
                for task in tasks
                for seed in range(CHECK_SEEDS[name])
            ]
            for name, make in agents.items()
        }
        for name in agents:
            flags["all"][name] += flags[family][name]
    return {
        group: {"variants": len(f["greedy"]), **{name: _rate(f[name]) for name in agents}}
        for group, f in flags.items()
    }


def greedy_answer(model: Any, tokenizer: Any, prompt: Sequence[int], room: int) -> str:
    """The model's greedy answer to ``prompt`` on CPU, at most ``room`` tokens, as text."""
    ((ids, _),) = generate(
        model,
        [prompt],
        [random.Random(0)],  # greedy draws nothing from it
        temperature=0.0,
        max_new_tokens=room,
        eos_ids=end_ids(tokenizer),
        pad_id=tokenizer.pad_token_id,
        device=torch.device("cpu"),
    )
    return decode_response(tokenizer, ids)


def note_check(model: Any, tokenizer: Any, world: TextWorld, spec: CheckSpec) -> dict:
    """Greedy notes on fresh episodes of the held-back variants against their hindsight notes:
    exact, read by :func:`parse_note` as the same plan and avoid list, and exact among the
    notes with a plan. A note is cut 16 tokens past its target's length."""
    episodes = play_families(world, spec, spec.eval_notes, True, "check")
    exact, same, planned = [], [], []
    prompts = PromptEncoder(tokenizer).encode([reflection_conversation(ep) for ep in episodes])
    gap = cut_gap(tokenizer)
    for episode, prompt in zip(episodes, prompts, strict=True):
        target = hindsight_note(episode.transcript)
        wanted = len(tokenizer.encode(target)) + 16
        prompt, _ = cut_middle(prompt, prompt_room(spec.max_positions, wanted), gap)
        room = min(wanted, spec.max_positions - len(prompt))
        note = greedy_answer(model, tokenizer, prompt, room)
        exact.append(note == target)
        same.append(parse_note(note) == parse_note(target))
        if parse_note(target)[0]:
            planned.append(note == target)
    return {
        "notes": len(exact),
        "exact": _rate(exact),
        "same_plan_and_avoid": _rate(same),
        "notes_with_a_plan": len(planned),
        "exact_with_a_plan": _rate(planned),
    }
