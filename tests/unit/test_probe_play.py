"""Playing a fixed policy with a bank (:mod:`agents.probe.play`) in the built-in world, with a
scripted stand-in for the policy: each episode is shown its family partition's entry every turn
as a guided episode is, retrievals count on the bank given, and what is played does not depend
on how many episodes are live or batched together."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import msgspec
import numpy as np
import pytest

from agents.events.extractor import ExtractorCalled
from agents.events.policy import ActionRequested
from agents.memory.bank import MemorySettings, TipBank
from agents.models.embedder import make_embedder
from agents.probe.play import PlaySettings, episode_seeds, play
from engine.world import Observation, Task
from engine.world_registry import load_world

EMBED = make_embedder("hashing", dim=64)
TASKS = [t for f in ("heat", "unlock") for t in load_world("minilab", {}).tasks(f, "heldout")[:3]]


def embed(texts: Sequence[str]) -> list[np.ndarray]:
    return list(EMBED.embed(list(texts)))


class Answer:
    def __init__(self, action: str, prompt_cut: int = 0) -> None:
        self.action = action
        self.prompt_cut = prompt_cut


class Scripted:
    """Picks an admissible action from the request's own seed (``cut``: every prompt was cut
    by that many tokens to fit)."""

    def __init__(self, cut: int = 0) -> None:
        self.requests: list[ActionRequested] = []
        self.batches: list[int] = []
        self.cut = cut

    def answer(self, requests: Sequence[ActionRequested]) -> list[Answer]:
        self.requests += requests
        self.batches.append(len(requests))
        return [Answer(random.Random(r.seed).choice(r.admissible), self.cut) for r in requests]


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
        # the request names the tip it shows: the policy reads its <tip> and </tip> as the
        # special tokens they are, not as a world's text (agents.models.prompts)
        assert all(r.tips == (f"{p.family} note",) for r in turns)
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


class Failing:
    """minilab, except that ``variant``'s episodes fail at their second step as ``how`` says;
    ``built`` counts the worlds made."""

    built = 0

    def __init__(self, variant: int, how: str) -> None:
        Failing.built += 1
        self.world, self.variant, self.how = load_world("minilab", {}), variant, how
        self.chosen, self.steps = False, 0

    def reset(self, task: Task, seed: int) -> Observation:
        self.chosen, self.steps = task.variant == self.variant, 0
        return self.world.reset(task, seed)

    def step(self, action: str) -> Observation:
        self.steps += 1
        obs = self.world.step(action)
        if self.chosen and self.steps == 2:
            if self.how == "raise":
                raise RuntimeError("lost")
            if self.how == "hang":
                time.sleep(30)
            return msgspec.structs.replace(obs, score=float("nan"))
        return obs

    def close(self) -> None:
        self.world.close()


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("raise", "raised RuntimeError: lost"),
        ("hang", "did not return within 0.5 s (world.step_timeout)"),
        ("nan", "returned an observation whose score is nan, not a finite number"),
    ],
)
def test_an_episode_whose_world_fails_is_aborted_as_a_failure_and_the_rest_play_on(
    how: str, said: str
) -> None:
    """Its world is replaced; every other episode plays exactly as with a sound world."""
    reference = run(Scripted(), None)
    bad = TASKS[1].variant
    Failing.built = 0
    settings = PlaySettings(window=2, batch=3, width=4, step_timeout=0.5)
    seeds = episode_seeds(7, len(TASKS))
    world = lambda: Failing(bad, how)  # noqa: E731
    played = play(Scripted(), world, TASKS, seeds, settings)  # type: ignore[arg-type]
    assert [p.index for p in played] == list(range(len(TASKS)))
    for p, ref in zip(played, reference, strict=True):
        if p.variant != bad:
            assert p == ref
            continue
        assert not p.success and p.steps == 1
        assert p.aborted.startswith("world.step(") and said in p.aborted, p.aborted
    aborted = sum(p.variant == bad for p in played)
    assert aborted >= 1 and Failing.built == 4 + aborted  # one new world per abort


def test_an_episode_ends_unfinished_at_the_runs_max_turns() -> None:
    reference = run(Scripted(), None)
    assert max(p.steps for p in reference) > 3
    settings = PlaySettings(window=2, batch=3, width=4, max_turns=3)
    seeds = episode_seeds(7, len(TASKS))
    world = lambda: load_world("minilab", {})  # noqa: E731
    played = play(Scripted(), world, TASKS, seeds, settings)  # type: ignore[arg-type]
    assert [p.steps for p in played] == [min(r.steps, 3) for r in reference]
    assert [p.success for p in played] == [r.success and r.steps <= 3 for r in reference]


def test_a_bank_s_aborted_episodes_are_counted_and_reported_and_all_aborted_is_an_error() -> None:
    """The probe's result counts the episodes whose world failed (failures in its success) and
    its report says so; when every episode's world failed the probe measures nothing and
    says why instead."""
    from types import SimpleNamespace

    from agents.acting.world_calls import WorldFailed
    from agents.probe import coevolution
    from agents.probe.coevolution import Progress
    from agents.probe.report import line, markdown

    bad = TASKS[1].variant
    setup = SimpleNamespace(
        runner=Scripted(),
        make_world=lambda: Failing(bad, "raise"),
        play=PlaySettings(window=2, batch=3, width=4, step_timeout=5.0),
        seed=0,
        resamples=200,
    )
    seeds = episode_seeds(7, len(TASKS))
    played_bank = coevolution._played_bank  # pyright: ignore[reportPrivateUsage]
    result = played_bank(setup, None, None, TASKS, seeds, Progress())  # type: ignore[arg-type]
    assert result.aborted == sum(t.variant == bad for t in TASKS) >= 1
    assert result.abort.endswith("raised RuntimeError: lost")
    assert result.outcomes[1] == 0
    assert line(result).endswith(f"({result.aborted} aborted as failures: {result.abort})")
    report = SimpleNamespace(
        verdict="v",
        run="r",
        control="",
        policy="p",
        episodes=len(TASKS),
        seed=0,
        tasks={},
        extractions=0,
        merge_passes=0,
        banks=[result],
        comparisons=[],
        overrides=(),
    )
    assert f"{result.aborted} of {len(TASKS)} episodes aborted" in markdown(report)  # type: ignore[arg-type]
    assert "--set" not in markdown(report)  # type: ignore[arg-type]
    report.overrides = ("policy.temperature=0.05",)  # recorded nowhere, and it moved the numbers
    said = "- the run's scenario read with `--set policy.temperature=0.05`"
    assert said in markdown(report)  # type: ignore[arg-type]
    setup.make_world = _AlwaysFailing
    with pytest.raises(WorldFailed, match="the world failed in every one of the 6 probe episodes"):
        played_bank(setup, None, None, TASKS, seeds, Progress())  # type: ignore[arg-type]


class _AlwaysFailing(Failing):
    def __init__(self) -> None:
        super().__init__(-1, "raise")

    def reset(self, task: Task, seed: int) -> Observation:
        raise RuntimeError("no game")


def test_an_aborted_episode_keeps_the_entry_it_was_shown() -> None:
    bank = bank_of({"heat": ["heat note"], "unlock": ["unlock note"]})
    bad = TASKS[1].variant
    settings = PlaySettings(window=2, batch=3, width=4, step_timeout=5.0)
    world = lambda: Failing(bad, "raise")  # noqa: E731
    seeds = episode_seeds(7, len(TASKS))
    played = play(Scripted(), world, TASKS, seeds, settings, bank, embed)  # type: ignore[arg-type]
    lost = [p for p in played if p.aborted]
    assert lost and all(p.entry >= 0 and p.call.startswith("x-") for p in lost)


def test_a_bank_s_turns_whose_prompts_were_cut_are_counted_and_said() -> None:
    """``coevo probe --policy`` with a model too short for its prompts printed success figures
    and a verdict without a word: a run says so, the probe did not."""
    from types import SimpleNamespace

    from agents.probe import coevolution
    from agents.probe.coevolution import Progress
    from agents.probe.report import line

    seeds = episode_seeds(7, len(TASKS))
    played_bank = coevolution._played_bank  # pyright: ignore[reportPrivateUsage]
    for cut in (0, 12):
        setup = SimpleNamespace(
            runner=Scripted(cut),
            make_world=lambda: load_world("minilab", {}),
            play=PlaySettings(window=2, batch=3, width=4),
            seed=0,
            resamples=200,
        )
        result = played_bank(setup, None, None, TASKS, seeds, Progress())  # type: ignore[arg-type]
        assert result.turns == len(setup.runner.requests) > 0
        assert result.cut == (result.turns if cut else 0)
        said = f"({result.turns:,} of {result.turns:,} turns' prompts cut in the middle"
        assert (said in line(result)) == bool(cut)


def test_a_family_name_in_the_probe_s_report_is_escaped_and_keeps_its_table_whole() -> None:
    """``probe.md`` and the console lines wrote a family's ESC and right-to-left override raw,
    and a family ``a|b`` split the table's cell, shifting every column after it."""
    from agents.probe.report import _md  # pyright: ignore[reportPrivateUsage]

    assert _md("a|b\x1b[2J\u202e") == "a\\|b\\x1b[2J\\u202e"
