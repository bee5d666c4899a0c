"""The system message and the memory's place in a turn's prompt (a scenario's ``[prompt]``):
the defaults render today's prompt, tips go to the message named, and stripping them removes
them from that message only."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.models.prompts import TURN_SYSTEM, strip_tips, turn_messages

HISTORY = [("open box", "you see an apple.")]
tips_lists = st.lists(st.sampled_from(["take apple.", "open box first.", "a\nb."]), max_size=3)


def test_the_defaults_are_the_fixed_prompt() -> None:
    messages = turn_messages("find the apple.", HISTORY, "you see a box.", tips=["take apple."])
    assert messages == [
        {"role": "system", "content": TURN_SYSTEM},
        {
            "role": "user",
            "content": "goal: find the apple.\n> open box\nyou see an apple.\n"
            "now: you see a box.\n<tip> take apple. </tip>",
        },
    ]


def test_system_memory_appends_the_tips_to_the_system_message() -> None:
    shown = turn_messages(
        "g.", HISTORY, "o.", tips=["a.", "b."], system="be brief.", memory="system"
    )
    assert shown[0] == {"role": "system", "content": "be brief.\n<tip> a. </tip>\n<tip> b. </tip>"}
    assert shown[1] == turn_messages("g.", HISTORY, "o.")[1]


@given(tips=tips_lists, memory=st.sampled_from(["user", "system"]))
def test_stripping_from_the_place_shown_gives_the_prompt_without_memory(
    tips: list[str], memory: str
) -> None:
    shown = turn_messages("g.", HISTORY, "o.", tips=tips, system="sys.", memory=memory)  # type: ignore[arg-type]
    bare = turn_messages("g.", HISTORY, "o.", system="sys.", memory=memory)  # type: ignore[arg-type]
    assert strip_tips(shown, tips, memory) == bare  # type: ignore[arg-type]


def test_stripping_from_the_other_place_is_refused() -> None:
    in_system = turn_messages("g.", [], "o.", tips=["a."], memory="system")
    with pytest.raises(ValueError, match="last message is not a user message ending"):
        strip_tips(in_system, ["a."])
    in_user = turn_messages("g.", [], "o.", tips=["a."])
    with pytest.raises(ValueError, match="first message is not a system message ending"):
        strip_tips(in_user, ["a."], "system")


def test_a_history_shorter_than_the_window_is_shown_whole() -> None:
    """Every past turn up to ``window`` is shown: a history of 3 with a window of 4 showed only
    its last turn (the slice started at -1)."""
    history = [("open box", "one."), ("open jar", "two."), ("look", "three.")]
    for n in range(len(history) + 1):
        user = turn_messages("g.", history[:n], "now.", window=4)[1]["content"]
        assert [line for line in user.splitlines() if line.startswith("> ")] == [
            f"> {action}" for action, _ in history[:n]
        ]
    assert turn_messages("g.", history, "now.", window=2)[1]["content"].count("> ") == 2
