"""The TextWorld adapter against real generated games: the walkthrough wins every family,
cumulative score becomes per-step reward, the banner and status line are gone, a second world
reuses the cached games, two runs agree, and a scenario runs end to end through ``coevo run``.
Skipped without the ``textworld`` extra.

Games are generated once per module into a temporary cache with the options of
``scenarios/textworld_rollout.toml``, so the ``coevo run`` test finds them there.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("textworld")

from engine.world import Observation, Task
from engine.world_registry import load_world
from scenarios.worlds.textworld import (
    FAMILIES,
    REFUSED,
    TextWorldGames,
    _OneAtATime,
    broken_game,
)

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "textworld_rollout.toml"
COEVO = str(Path(sys.executable).parent / "coevo")
STATUS = re.compile(r"-=.*=-\s*\d+/\d+")


def scenario_options() -> dict[str, Any]:
    with SCENARIO.open("rb") as f:
        return dict(tomllib.load(f)["world"]["options"])


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("coevo-cache")


@pytest.fixture(scope="module")
def world(cache: Path) -> Iterator[TextWorldGames]:
    w = TextWorldGames(**scenario_options(), cache_dir=str(cache / "games"))
    yield w
    w.close()


def play(world: TextWorldGames, task: Task, actions: list[str]) -> list[Observation]:
    obs = [world.reset(task, seed=0)]
    for action in actions:
        if obs[-1].done:
            break
        obs.append(world.step(action))
    return obs


@pytest.mark.parametrize("family", FAMILIES)
def test_the_walkthrough_wins_with_per_step_rewards(world: TextWorldGames, family: str) -> None:
    task = world.tasks(family, "train")[0]
    world.reset(task, seed=0)
    walkthrough = list(world.walkthrough())
    obs = play(world, task, walkthrough)
    assert len(obs) == len(walkthrough) + 1
    last = obs[-1]
    assert last.done and last.success and last.score == pytest.approx(1.0)
    assert last.admissible == ()
    rewards = [o.reward for o in obs]
    assert sum(rewards) == pytest.approx(1.0) and min(rewards) >= 0
    for o in obs[1:]:  # a reward exactly where the game says the score went up
        assert (o.reward > 0) == ("Your score has just gone up" in o.text)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        world.step("look")


def test_observations_lose_banner_prompt_and_status_line(world: TextWorldGames) -> None:
    task = world.tasks("cooking", "train")[0]
    obs = play(world, task, ["look", "inventory", "examine cookbook"])
    assert obs[0].goal and obs[0].goal in obs[0].text
    for o in obs:
        assert not STATUS.search(o.text) and "$$" not in o.text
        assert not any(line.startswith(">") for line in o.text.splitlines())
        assert "\n\n\n" not in o.text and o.text == o.text.strip()
        assert list(o.admissible) == sorted(set(o.admissible))


def test_a_second_world_with_the_same_options_reuses_the_games(
    world: TextWorldGames, cache: Path
) -> None:
    task = world.tasks("coin_collector", "train")[0]
    first = world.reset(task, seed=0)
    again = TextWorldGames(**scenario_options(), cache_dir=str(world.cache))
    other = TextWorldGames(**{**scenario_options(), "seed": 1}, cache_dir=str(world.cache))
    try:
        assert again.reset(task, seed=5) == first and again.generated == 0
        assert other.game_path(task) != world.game_path(task)
    finally:
        again.close()
        other.close()


def test_two_runs_of_one_game_agree(world: TextWorldGames) -> None:
    task = world.tasks("treasure_hunter", "train")[0]
    obs = world.reset(task, seed=0)
    rng = random.Random(0)
    actions = []
    for _ in range(8):
        actions.append(rng.choice(obs.admissible))
        obs = world.step(actions[-1])
        if obs.done:
            break
    assert play(world, task, actions) == play(world, task, actions)


def test_the_step_limit_ends_an_episode_unsolved(world: TextWorldGames) -> None:
    short = TextWorldGames(**{**scenario_options(), "max_steps": 2}, cache_dir=str(world.cache))
    try:
        obs = play(short, short.tasks("cooking", "train")[0], ["look", "look", "look"])
    finally:
        short.close()
    assert len(obs) == 3 and obs[-1].done and not obs[-1].success


@pytest.mark.parametrize(
    "damage",
    [
        "random bytes",
        "truncated",
        "a flipped byte",
        "no checksum and random bytes",
        "no json",
        "bad json",
        "another json",
    ],
)
def test_a_damaged_cached_game_is_generated_again(world: TextWorldGames, damage: str) -> None:
    """jericho's interpreter ends the whole process (C ``exit``) on a story file it cannot
    read: a damaged cached game is found before it starts, and generated again, the same."""
    task = world.tasks("coin_collector", "train")[1]
    fresh = TextWorldGames(**scenario_options(), cache_dir=str(world.cache))
    try:
        first = fresh.reset(task, seed=0)
    finally:
        fresh.close()
    path = world.game_path(task)
    game, meta = path.read_bytes(), path.with_suffix(".json")
    assert broken_game(path) is None
    if damage == "random bytes":
        path.write_bytes(random.Random(1).randbytes(1000))
    elif damage == "truncated":
        path.write_bytes(game[: len(game) // 2])
    elif damage == "a flipped byte":
        mid = len(game) // 2
        path.write_bytes(game[:mid] + bytes([game[mid] ^ 0xFF]) + game[mid + 1 :])
    elif damage == "no checksum and random bytes":  # jericho then spun in reset for good
        noise = random.Random(2).randbytes(len(game) - 0x40)
        path.write_bytes(game[:0x1C] + b"\0\0" + game[0x1E:0x40] + noise)
    elif damage == "no json":
        meta.unlink()
    elif damage == "bad json":
        meta.write_text("{not json")
    else:  # it read as JSON, and the game then failed to load with KeyError: 'KB'
        meta.write_text("{}")
    assert broken_game(path) is not None
    again = TextWorldGames(**scenario_options(), cache_dir=str(world.cache))
    try:
        assert again.reset(task, seed=0) == first and again.generated == 1
    finally:
        again.close()
    assert path.read_bytes() == game and broken_game(path) is None


def test_a_game_that_stays_damaged_is_refused_in_one_line(
    world: TextWorldGames, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = world.tasks("coin_collector", "train")[0]
    other = TextWorldGames(**scenario_options(), cache_dir=str(world.cache))
    path = other.game_path(task)
    game = path.read_bytes()

    def damaged(self: TextWorldGames, task: Task, where: Path) -> None:
        where.write_bytes(b"\x00" * 100)  # a generator that writes nothing playable

    monkeypatch.setattr(TextWorldGames, "_generate", damaged)
    path.write_bytes(b"\x09" + game[1:])
    try:
        with pytest.raises(ValueError, match=r"textworld game .*v0\.z8 is damaged: not a Z-mach"):
            other.reset(task, seed=0)
    finally:
        other.close()
        path.write_bytes(game)


def test_the_interpreters_own_commands_are_refused(
    world: TextWorldGames, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``save``, ``restore``, ``script``, ``quit`` and their kind write files in the working
    directory or end the game: a free-text policy that types one spends the turn, and the
    game goes on as before."""
    monkeypatch.chdir(tmp_path)
    task = world.tasks("treasure_hunter", "train")[0]
    first = world.reset(task, seed=0)
    for command in ("save", "SAVE game", "restore", "script", "quit", "q", "restart", "die"):
        obs = world.step(command)
        assert obs.text == REFUSED and obs.admissible == first.admissible and not obs.done
    assert list(tmp_path.iterdir()) == []
    assert world.step("look").text == play(world, task, ["look"])[-1].text


def test_options_are_checked_with_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="level must be between 1 and 30 for treasure_hunter"):
        load_world("textworld", {"level": 40})
    # the allowed coin collector levels as they are (it said 1-100 and 101-150; 201-233 play too)
    said = r"coin_collector games of 102 rooms; TextWorld allows 100 \(levels 1-150 and 201-233\)"
    with pytest.raises(ValueError, match=said):
        load_world("textworld", {"level": 151, "families": ["coin_collector"]})
    assert load_world("textworld", {"level": 233, "families": ["coin_collector"]})
    with pytest.raises(ValueError, match="cache_dir is empty"):  # read as the default
        load_world("textworld", {"cache_dir": " "})
    (tmp_path / "file").write_text("x")  # every episode aborted "Not a directory"; valid
    for where in (tmp_path / "file", tmp_path / "file" / "games"):
        with pytest.raises(ValueError, match=f"'{tmp_path / 'file'}' is not a directory"):
            load_world("textworld", {"cache_dir": str(where)})
    with pytest.raises(ValueError, match=r"unknown cooking settings \['knife'\]"):
        load_world("textworld", {"cooking": {"knife": True}})
    with pytest.raises(ValueError, match="unknown textworld families"):
        load_world("textworld", {"families": ["zork"]})


def test_a_rollout_scenario_runs_end_to_end(world: TextWorldGames, cache: Path) -> None:
    run = cache / "run"  # one game per family: the ones the walkthrough test generated
    sets = ["agent.kind=random", "world.options.train_games=1"]
    sets.append(f"world.options.cache_dir={world.cache}")
    args = [COEVO, "run", str(SCENARIO), "--out", str(run)]
    args += [arg for item in sets for arg in ("--set", item)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run(
        [COEVO, "log", str(run), "--kind", "episode_finished", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    finished = [json.loads(line)["event"] for line in out.stdout.splitlines()]
    assert len(finished) == tomllib.loads(SCENARIO.read_text())["run"]["episodes"]
    assert {f["family"] for f in finished} <= set(FAMILIES)
    assert all(f["steps"] >= 1 for f in finished)
    assert (run / "scenario.toml").is_file()


def test_game_folders_left_by_a_killed_generation_are_swept(tmp_path: Path) -> None:
    """A process killed while it generated a game left its ``.gen-*`` folder in the cache for
    good; one older than an hour is removed when the folder's next game is generated (a
    younger one may be another process's, at work)."""
    import os

    from scenarios.worlds.textworld import STALE_S, sweep_stale

    old, young = tmp_path / ".gen-old", tmp_path / ".gen-young"
    for d in (old, young):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "game.z8").write_bytes(b"x")
    (tmp_path / "kept.z8").write_bytes(b"game")
    now = 1_000_000.0
    os.utime(old, (now - STALE_S - 1, now - STALE_S - 1))
    os.utime(young, (now - 60, now - 60))
    sweep_stale(tmp_path, now)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".gen-young", "kept.z8"]


def test_a_call_that_never_returns_fails_the_calls_waiting_on_it_with_what_is_stuck() -> None:
    """TextWorld plays one call at a time per process: a call that hung (a damaged game
    spinning in jericho) held the lock for good, and every other game's call waited on it
    until ``step_timeout`` abandoned it, episode after episode. A call waiting on a holder
    past its limit now fails at once, naming it; the lock works again once it is let go."""
    lock, holding, let_go = _OneAtATime(), threading.Event(), threading.Event()

    def hang() -> None:
        with lock.held("world.reset of game v3.z8", limit=0.3):
            holding.set()
            let_go.wait(30)

    holder = threading.Thread(target=hang, daemon=True)
    holder.start()
    assert holding.wait(10)
    stuck = r"stuck in this process: world.reset of game v3.z8"
    with pytest.raises(RuntimeError, match=stuck), lock.held("world.step('look')"):
        pass
    let_go.set()
    holder.join(10)
    with lock.held("world.step('look')"), lock.held("nested in the same thread"):
        pass
