"""minilab: determinism, the action contract, step limits, splits, fixed facts, difficulty."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from agents.acting.scripted import Explorer, RandomAgent, run_episode
from engine import entrypoints
from engine.world import Observation, Task, TextWorld
from engine.world_registry import WORLDS_GROUP, builtin_worlds, load_world
from scenarios.worlds.minilab import DEFAULT_MAX_STEPS, MiniLab
from scenarios.worlds.minilab_layouts import (
    FAMILIES,
    HELDOUT_BASE,
    in_heldout_space,
    layout_of,
    stable_seed,
)

INADMISSIBLE = "you can not do that."
ROOT = Path(__file__).resolve().parents[2]


def play(world: MiniLab, task: Task, actions: list[str]) -> list[Observation]:
    observations = [world.reset(task, seed=0)]
    observations += [world.step(action) for action in actions]
    return observations


def random_actions(world: MiniLab, task: Task, seed: int) -> list[str]:
    result = run_episode(world, task, seed, RandomAgent(seed))
    return [action for action, _, _ in result.transcript]


def test_minilab_is_a_text_world() -> None:
    world = MiniLab()
    assert isinstance(world, TextWorld)
    assert world.name == "minilab"
    assert world.families() == FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_same_task_and_seed_give_the_same_episode(family: str) -> None:
    task = MiniLab().tasks(family, "train")[7]
    first, second = MiniLab(), MiniLab(train_variants=10)
    for seed in range(5):
        actions = random_actions(first, task, seed)
        assert play(first, task, actions) == play(second, task, actions)


def test_facts_are_the_same_in_every_process() -> None:
    code = (
        "from scenarios.worlds.minilab import MiniLab\n"
        "w = MiniLab()\n"
        "for f in w.families():\n"
        "    for t in w.tasks(f, 'train')[:20] + w.tasks(f, 'heldout')[:5]:\n"
        "        print(w.reset(t, 0).text)\n"
    )
    outputs = set()
    for hash_seed in ("1", "2"):
        env = {"PYTHONHASHSEED": hash_seed, "PATH": ""}
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            check=True,
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1
    assert stable_seed("circuit", 3) == stable_seed("circuit", 3) != stable_seed("circuit", 4)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_admissible_action_is_accepted(family: str) -> None:
    world = MiniLab()
    for task in world.tasks(family, "train")[:6]:
        actions = random_actions(world, task, seed=task.variant)
        for t in range(len(actions)):
            admissible = play(world, task, actions[:t])[-1].admissible
            assert 0 < len(admissible) <= 25
            assert len(set(admissible)) == len(admissible)
            for action in admissible:
                play(world, task, actions[:t])
                assert not world.step(action).text.startswith(INADMISSIBLE), action


def test_an_inadmissible_action_wastes_the_turn_and_never_raises() -> None:
    world = MiniLab(max_steps=3)
    task = world.tasks("unlock", "train")[0]
    start = world.reset(task, seed=0)
    for action in ("dance", "", "open the safe", "take gem"):
        world.reset(task, seed=0)
        obs = world.step(action)
        assert obs.text == INADMISSIBLE
        assert obs.admissible == start.admissible
        assert (obs.reward, obs.score, obs.done, obs.success) == (0.0, 0.0, False, False)
    world.reset(task, seed=0)
    last = [world.step("dance") for _ in range(3)][-1]
    assert last.done and not last.success


@pytest.mark.parametrize("family", FAMILIES)
def test_the_step_limit_ends_the_episode_without_success(family: str) -> None:
    world = MiniLab(max_steps=4)
    world.reset(world.tasks(family, "train")[0], seed=0)
    observations = [world.step("look") for _ in range(4)]
    assert [obs.done for obs in observations] == [False, False, False, True]
    assert not observations[-1].success
    assert observations[-1].text.endswith("you are out of time.")
    assert observations[-1].admissible == ()
    with pytest.raises(RuntimeError, match="after the episode is done"):
        world.step("look")


def test_step_before_reset_raises() -> None:
    with pytest.raises(RuntimeError, match=r"step\(\) called before reset\(\)"):
        MiniLab().step("look")
    world = MiniLab()
    world.close()
    world.close()


def test_default_step_limits_are_at_most_twenty() -> None:
    world = MiniLab()
    for family in FAMILIES:
        world.reset(world.tasks(family, "train")[0], seed=0)
        steps = 1
        while not world.step("inventory").done:
            steps += 1
        assert steps == DEFAULT_MAX_STEPS[family] <= 20


def test_no_heldout_variant_repeats_a_train_variant() -> None:
    for family in FAMILIES:
        train = {layout_of(family, v) for v in range(500)}
        heldout = {layout_of(family, HELDOUT_BASE + v) for v in range(100)}
        assert not any(in_heldout_space(layout) for layout in train)
        assert all(in_heldout_space(layout) for layout in heldout)
        as_text = {repr(layout) for layout in train}
        assert not as_text & {repr(layout) for layout in heldout}


def test_train_and_heldout_variants_are_disjoint() -> None:
    world = MiniLab(train_variants=300, heldout_variants=50)
    for family in FAMILIES:
        train = {t.variant for t in world.tasks(family, "train")}
        heldout = {t.variant for t in world.tasks(family, "heldout")}
        assert len(train) == 300 and len(heldout) == 50
        assert not train & heldout
        assert all(t.split == "heldout" for t in world.tasks(family, "heldout"))
        assert min(heldout) == HELDOUT_BASE
    with pytest.raises(ValueError, match="variant 1000000 is not a train variant of heat"):
        world.reset(Task(family="heat", variant=HELDOUT_BASE), seed=0)
    with pytest.raises(ValueError, match="variant 3 is not a heldout variant of heat"):
        world.reset(Task(family="heat", variant=3, split="heldout"), seed=0)


def test_facts_of_a_variant_do_not_depend_on_options_or_seed() -> None:
    small, large = MiniLab(train_variants=5), MiniLab(train_variants=900, max_steps=12)
    for family in FAMILIES:
        task = small.tasks(family, "train")[4]
        assert small.reset(task, seed=1) == large.reset(task, seed=99)
        assert layout_of(family, 4) is layout_of(family, 4)


@pytest.mark.parametrize(("family", "verb"), [("circuit", "connect "), ("unlock", "unlock ")])
def test_the_deciding_fact_is_fixed_within_a_variant(family: str, verb: str) -> None:
    world = MiniLab()
    for task in world.tasks(family, "train")[:5]:
        wins, losses = set(), set()
        for seed in range(60):
            result = run_episode(world, task, seed, Explorer(seed))
            decisive = [a for a, _, _ in result.transcript if a.startswith(verb)]
            if decisive:
                (wins if result.success else losses).add(decisive[-1])
        assert len(wins) == 1, wins
        assert not wins & losses


def test_the_goal_does_not_give_away_the_hidden_facts() -> None:
    hidden = {
        "heat": ["oven", "burner", "stove"],
        "unlock": ["brass", "iron", "silver", "key"],
        "circuit": ["wire", "copper", "zinc", "tin"],
        "paint": ["black", "blue", "red", "white", "yellow", "stick"],
        "fetch": ["bin", "box", "cabinet", "chest", "crate", "cupboard", "drawer", "sack"],
    }
    world = MiniLab()
    for family, words in hidden.items():
        for task in world.tasks(family, "train")[:100]:
            goal = set(re.findall(r"[a-z]+", world.reset(task, seed=0).goal))
            assert not goal & set(words), (family, goal)


def test_observations_use_a_small_vocabulary_and_fixed_punctuation() -> None:
    world = MiniLab()
    words: set[str] = set()
    for family in FAMILIES:
        for task in [*world.tasks(family, "train")[:60], *world.tasks(family, "heldout")[:10]]:
            obs = world.reset(task, seed=0)
            rng = random.Random(task.variant)
            texts = [obs.goal, obs.text, *obs.admissible]
            while not obs.done:
                obs = world.step(rng.choice(obs.admissible))
                texts += [obs.text, *obs.admissible]
            for text in texts:
                assert re.fullmatch(r"[a-z .,]*", text), text
                words.update(re.findall(r"[a-z]+", text))
    assert 80 <= len(words) <= 200


def test_success_scores_exactly_one_and_subgoals_a_tenth() -> None:
    world = MiniLab()
    task = world.tasks("circuit", "train")[0]
    facts = layout_of("circuit", 0).facts
    wire = next(w for w, bulb in facts.items() if bulb == facts["bulb"] and w.endswith("wire"))
    where = dict(layout_of("circuit", 0).start)
    actions = sorted({f"open {where['battery']}", f"open {where[wire]}"})
    actions += ["take battery", f"take {wire}", "put battery in socket"]
    actions += [f"connect {wire} to battery"]
    observations = play(world, task, actions)
    assert [obs.reward for obs in observations] == [0, 0, 0, 0.1, 0, 0.1, 0.8]
    assert observations[-1].success and observations[-1].done
    assert observations[-1].score == 1.0
    assert "the green bulb lights up" in observations[-1].text


BANDS = {  # (low, high) of a uniformly random policy's success rate over 1000 episodes
    "fetch": (0.2, 0.4),  # easy
    "heat": (0.2, 0.4),  # easy
    "unlock": (0.02, 0.1),  # medium
    "circuit": (0.0, 0.02),  # hard: exploration is the bottleneck
    "paint": (0.0, 0.02),  # hard
}


@pytest.mark.parametrize("family", FAMILIES)
def test_random_policy_success_lies_in_the_family_band(family: str) -> None:
    world = MiniLab()
    tasks = world.tasks(family, "train")
    episodes = 1000
    wins = sum(
        run_episode(world, tasks[i % len(tasks)], i, RandomAgent(i)).success
        for i in range(episodes)
    )
    low, high = BANDS[family]
    assert low <= wins / episodes <= high


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"families": ("heat", "boil")}, "unknown minilab family 'boil'; known: fetch, heat"),
        ({"families": ()}, "families must not be empty"),
        ({"families": "heat"}, "families must be a list or tuple of family names, got 'heat'"),
        ({"families": ["heat", "heat"]}, "families must not repeat a name"),
        ({"train_variants": 0}, "train_variants must be between 1 and 1000000, got 0"),
        ({"train_variants": 2.0}, "train_variants must be an int, got 2.0"),
        ({"heldout_variants": -1}, "heldout_variants must be between 0 and 1000000, got -1"),
        ({"max_steps": 21}, "max_steps must be between 1 and 20, got 21"),
        ({"max_steps": True}, "max_steps must be an int, got True"),
    ],
)
def test_bad_options_are_rejected_with_exact_messages(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        MiniLab(**options)  # type: ignore[arg-type]


def test_families_option_selects_and_orders_families() -> None:
    world = MiniLab(families=["paint", "fetch"])
    assert world.families() == ("fetch", "paint")
    with pytest.raises(ValueError, match="unknown minilab family 'heat'; this world offers"):
        world.tasks("heat", "train")
    with pytest.raises(ValueError, match="unknown split 'test'"):
        world.tasks("fetch", "test")


def test_load_world_builds_builtin_and_imported_worlds() -> None:
    assert set(builtin_worlds()) == {"minilab", "scienceworld", "textworld"}
    world = load_world("minilab", {"families": ["heat"], "max_steps": 5})
    assert isinstance(world, MiniLab) and world.families() == ("heat",)
    assert isinstance(load_world("scenarios.worlds.minilab:MiniLab", {}), MiniLab)


def test_installed_worlds_are_read_once_and_again_for_a_name_not_yet_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run builds a world per worker: the entry points are read once, and read again only
    for a name they did not have (a plug-in installed while the process runs)."""
    reads: list[str] = []
    installed = [EntryPoint("minilab", "scenarios.worlds.minilab:MiniLab", WORLDS_GROUP)]

    def entry_points(group: str) -> list[EntryPoint]:
        reads.append(group)
        return list(installed)

    monkeypatch.setattr(entrypoints, "entry_points", entry_points)
    monkeypatch.setattr(entrypoints, "_read", {})
    for _ in range(3):
        assert isinstance(load_world("minilab", {}), MiniLab)
    assert reads == [WORLDS_GROUP]
    installed.append(EntryPoint("lab2", "scenarios.worlds.minilab:MiniLab", WORLDS_GROUP))
    assert isinstance(load_world("lab2", {}), MiniLab)
    assert len(reads) == 2
    with pytest.raises(ValueError, match="unknown world 'lab3'"):
        load_world("lab3", {})
    assert len(reads) == 3
    load_world("scenarios.worlds.minilab:MiniLab", {})  # an import path needs no read
    assert len(reads) == 3


class BrokenWorld(MiniLab):
    """A world whose constructor fails of itself (a plug-in's defect)."""

    def __init__(self) -> None:
        raise ValueError("its own defect")


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        (
            "alfworld",
            {},
            "unknown world 'alfworld': use a built-in name (minilab, scienceworld, textworld)",
        ),
        ("pkg.mod:", {}, "bad world import path 'pkg.mod:'"),
        ("no_such_module_xyz:World", {}, "cannot import world module 'no_such_module_xyz'"),
        ("scenarios.worlds.minilab:Nope", {}, "has no class 'Nope'"),
        ("minilab", {"colour": 1}, "bad options for world 'minilab': "),
        ("minilab", {"max_steps": 0}, "bad options for world 'minilab': max_steps must be"),
        (  # it has one: not a class
            "engine.world:SPLITS",
            {},
            "engine.world:SPLITS is a tuple, not a class (a world is named by its class)",
        ),
        ("engine.seeds:derive_seed", {}, "engine.seeds:derive_seed is a function, not a class"),
        (  # a constructor's own ValueError, no option given: not "bad options"
            "test_minilab:BrokenWorld",
            {},
            "world 'test_minilab:BrokenWorld' failed to start: ValueError: its own defect",
        ),
    ],
)
def test_load_world_turns_every_failure_into_one_line(
    name: str, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        load_world(name, options)
    assert "\n" not in str(info.value)
