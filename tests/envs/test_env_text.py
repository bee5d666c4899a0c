"""The pure text helpers of the real-environment adapters: ScienceWorld's list normalisation
and action ranking, TextWorld's banner and status-line cleaning. No extra needed."""

from __future__ import annotations

import random
import sys

import pytest

from engine.world_registry import load_world
from scenarios.worlds.options import ExtraMissing, import_extra
from scenarios.worlds.scienceworld_text import EXCLUDED_ACTIONS, normalise, rank_actions
from scenarios.worlds.textworld import clean, game_seed

ROOM = (
    "This room is called the art studio. In it, you see: \n"
    "\tthe agent\n"
    "\ta substance called air\n"
    "\ta table. On the table is: a bowl (containing nothing), a drawer.\n"
    "\ta wood cup (containing {0} paint)\n"
    "\ta wood cup (containing {1} paint)\n"
    "You also see:\n"
    "\tA door to the hallway (that is closed)"
)


def test_normalise_sorts_room_contents_whatever_order_they_came_in() -> None:
    a = normalise(ROOM.format("red", "blue"))
    b = normalise(ROOM.format("blue", "red"))
    assert a == b
    assert a.splitlines()[0] == "This room is called the art studio. In it, you see:"
    assert a.splitlines()[-2:] == ["You also see:", "\tA door to the hallway (that is closed)"]


def test_normalise_sorts_nested_inline_lists_and_keeps_which_clauses() -> None:
    text = (
        "a sink, which is turned off. In the sink is: a red box (containing nothing), "
        "a bowl (containing a red apple, a banana, an orange), a blue light bulb, which is off. "
        "The drain is open."
    )
    assert normalise(text) == (
        "a sink, which is turned off. In the sink is: a blue light bulb, which is off, "
        "a bowl (containing a banana, a red apple, an orange), a red box (containing nothing). "
        "The drain is open."
    )
    doors = "You also see: A door to the kitchen (that is open), A door to the bedroom."
    assert (
        normalise(doors)
        == "You also see: A door to the bedroom, A door to the kitchen (that is open)."
    )


def test_normalise_leaves_text_without_lists_alone() -> None:
    for text in ("The stove is now activated.", "the temperature is 100.0 degrees celsius"):
        assert normalise(text) == text


def test_rank_actions_is_bounded_deterministic_and_fair_to_every_verb() -> None:
    objects = [f"thing {i}" for i in range(30)]
    valid = [f"connect {a} to {b}" for a in objects for b in objects]
    valid += ["open door to kitchen", "look around", "reset task", "focus on water", "wait"]
    valid += [f"focus on {o}" for o in objects]
    shuffled = valid[:]
    random.Random(0).shuffle(shuffled)
    ranked = rank_actions(valid, "Your task is to boil water.", limit=12)
    assert ranked == rank_actions(shuffled, "Your task is to boil water.", limit=12)
    assert len(ranked) == 12
    assert ranked[0] == "look around" and "open door to kitchen" in ranked and "wait" in ranked
    assert ranked.index("focus on water") < ranked.index("focus on thing 0")  # names the goal
    assert not EXCLUDED_ACTIONS & set(ranked)
    assert len(rank_actions(valid, "", limit=0)) == len(valid) - 1


def test_textworld_clean_drops_banner_prompt_and_status_line() -> None:
    feedback = (
        "\n\n                    ________  ________  __    __  ________        \n"
        "                   |        \\|        \\|  \\  |  \\|        \\       \n"
        "                      | $$   | $$  \\     >$$  $$    | $$          \n\n"
        "Hey, thanks for coming over to the TextWorld today.\n\n-= Cookhouse =-\n"
        "You've just sauntered into a cookhouse.\n\n\n\nThere is a coin on the floor.\n\n"
        ">                                                         -= Cookhouse =-0/1"
    )
    assert clean(feedback) == (
        "Hey, thanks for coming over to the TextWorld today.\n\n-= Cookhouse =-\n"
        "You've just sauntered into a cookhouse.\n\nThere is a coin on the floor."
    )
    end = (
        "\nYou eat the meal.\n\n\n                       *** The End ***\n\nYou scored 3 out of "
        "a possible 3, in 6 turns.\n\n\nWould you like to RESTART, RESTORE a saved game, QUIT "
        "or UNDO the last command?\n>          -= Kitchen =-2/5"
    )
    assert clean(end) == (
        "You eat the meal.\n\n*** The End ***\n\nYou scored 3 out of a possible 3, in 6 turns."
    )


def test_game_seeds_are_stable_and_distinct() -> None:
    assert game_seed("coin_collector", 0, 0) == game_seed("coin_collector", 0, 0)
    seeds = {
        game_seed(f, v, s) for f in ("cooking", "coin_collector") for v in range(50) for s in (0, 1)
    }
    assert len(seeds) == 200 and all(0 <= s < 2**31 for s in seeds)


def test_a_missing_extra_is_a_one_line_error_naming_the_extra() -> None:
    with pytest.raises(ExtraMissing, match=r"pip install -e '\.\[nosuchextra\]'"):
        import_extra("no_such_package_here", "nosuchextra")
    with pytest.raises(ValueError, match="unknown world 'sciworld'"):
        load_world("sciworld", {})


@pytest.mark.parametrize("name", ["scienceworld", "textworld"])
def test_a_builtin_world_without_its_extra_names_the_extra(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    with pytest.raises(
        ValueError,
        match=rf"world '{name}' is not available: .*'coevo\[{name}\]' "
        rf"\(in a checkout: pip install -e '\.\[{name}\]'\)$",
    ):
        load_world(name, {})
