"""Playing a fixed policy with a bank (:mod:`agents.probe.play`) in the built-in world, with a
scripted stand-in for the policy: each episode is shown its family partition's entry every turn
as a guided episode is, retrievals count on the bank given, and what is played does not depend
on how many episodes are live or batched together."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest

from agents.events.extractor import ExtractorCalled
from agents.events.policy import ActionRequested
from agents.memory.bank import MemorySettings, TipBank
from agents.models.embedder import make_embedder
from agents.probe.play import PlaySettings, episode_seeds, play
from engine.world_registry import load_world

EMBED = make_embedder("hashing", dim=64)
TASKS = [t for f in ("heat", "unlock") for t in load_world("minilab", {}).tasks(f, "heldout")[:3]]


def embed(texts: Sequence[str]) -> list[np.ndarray]:
    return list(EMBED.embed(list(texts)))


class Answer:
    def __init__(self, action: str) -> None:
        self.action = action


class Scripted:
    """Picks an admissible action from the request's own seed."""

    def __init__(self) -> None:
        self.requests: list[ActionRequested] = []
        self.batches: list[int] = []

    def answer(self, requests: Sequence[ActionRequested]) -> list[Answer]:
        self.requests += requests
        self.batches.append(len(requests))
        return [Answer(random.Random(r.seed).choice(r.admissible)) for r in requests]


def bank_of(entries: dict[str, list[str]]) -> TipBank:
    bank = TipBank(MemorySettings(index="exact"), EMBED.dim)
    for family, texts in entries.items():
        ops = tuple(("add", (), t) for t in texts)
        called = ExtractorCalled(
            call=f"x-{family}",
            task="extract",
            source="",
            slot=f"train/{family}",
            prompt_ids=(),
            response_ids=(),
            token_logps=(),
            text="",
            temperature=1.0,
            extractor_version=0,
            ops=ops,
        )
        bank.apply(called, embed(texts))
    return bank


def run(runner: Scripted, bank: TipBank | None, width: int = 4, batch: int = 3) -> list:
    settings = PlaySettings(window=2, batch=batch, width=width)
    seeds = episode_seeds(7, len(TASKS))
    return play(runner, lambda: load_world("minilab", {}), TASKS, seeds, settings, bank, embed)  # type: ignore[arg-type]


def test_every_turn_shows_the_entry_retrieved_from_the_family_partition() -> None:
    runner = Scripted()
    bank = bank_of({"heat": ["heat note"], "unlock": ["unlock note"]})
    played = run(runner, bank)
    assert [p.index for p in played] == list(range(len(TASKS)))
    assert all(p.entry >= 0 and p.call.startswith("x-") for p in played)
    for p in played:
        turns = [r for r in runner.requests if r.episode == f"probe{p.index}"]
        assert len(turns) == p.steps > 0
        assert all(r.messages[-1][1].endswith(f"<tip> {p.family} note </tip>") for r in turns)
    assert [t.retrieved for t in bank.tips.values()] == [3, 3]  # counted on the bank given


def test_no_bank_shows_nothing() -> None:
    runner = Scripted()
    played = run(runner, None)
    assert all(p.entry == -1 for p in played)
    assert not any("<tip>" in r.messages[-1][1] for r in runner.requests)


@pytest.mark.parametrize(("width", "batch"), [(1, 1), (2, 5), (6, 2)])
def test_what_is_played_does_not_depend_on_width_or_batch(width: int, batch: int) -> None:
    entries = {"heat": ["go north", "take jug"], "unlock": ["open door", "take key"]}
    reference = run(Scripted(), bank_of(entries), width=4, batch=3)
    runner = Scripted()
    assert run(runner, bank_of(entries), width=width, batch=batch) == reference
    assert max(runner.batches) <= batch


def test_the_run_s_prompt_settings_place_the_entry() -> None:
    runner = Scripted()
    settings = PlaySettings(window=2, batch=3, width=4, system="be brief.", memory="system")
    seeds = episode_seeds(7, len(TASKS))
    bank = bank_of({"heat": ["heat note"], "unlock": ["unlock note"]})
    world = lambda: load_world("minilab", {})  # noqa: E731
    played = play(runner, world, TASKS, seeds, settings, bank, embed)  # type: ignore[arg-type]
    for p in played:
        for r in (r for r in runner.requests if r.episode == f"probe{p.index}"):
            assert r.messages[0] == ("system", f"be brief.\n<tip> {p.family} note </tip>")
            assert "<tip>" not in r.messages[-1][1]
