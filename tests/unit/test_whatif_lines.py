"""``coevo audit RUN whatif``'s table: its left column is the log's trajectory only when the
control gave it back; otherwise it is the control's replay and says so."""

from __future__ import annotations

import msgspec

from agents.audit.whatif import Played, PlayedTurn, WhatIf
from scenarios.cli.whatif import _whatif_lines  # pyright: ignore[reportPrivateUsage]


def played(*actions: str) -> Played:
    turns = tuple(
        PlayedTurn(
            turn=k, observation="", tips=(), action=a, logp=0.0, version=0, reward=0.0, score=0.0
        )
        for k, a in enumerate(actions)
    )
    return Played(turns=turns, success=True, score=1.0, steps=len(actions))


def answer(logged: Played, control: Played, reproduced: bool) -> WhatIf:
    return WhatIf(
        episode="ep000000",
        change="policy version 1",
        logged=logged,
        control=control,
        changed=played("wait", "wait", "push"),
        reproduced=reproduced,
        first_difference=0,
        credit=None,
        strayed="" if reproduced else "turn 0: the action differs",
        logged_machine="m",
        machine="m",
    )


def test_the_left_column_is_named_for_what_it_shows() -> None:
    same = _whatif_lines(answer(played("push", "pull"), played("push", "pull"), True))
    assert any(line.startswith("turn  as logged ") for line in same)
    strayed = _whatif_lines(answer(played("push", "pull"), played("pull"), False))
    header = next(line for line in strayed if line.startswith("turn  "))
    assert "control (replayed unchanged)" in header and "as logged" not in header
    assert "(logged: success, score 1.000, 2 steps; replayed: success, score 1.000, 1 steps)" in (
        "\n".join(strayed)
    )


def test_a_control_that_strayed_under_a_set_names_the_set_first() -> None:
    """``--set policy.temperature=0.5`` made the control stray, and the line blamed the
    world's randomness or a defect of the replay ("please report it")."""
    strayed = answer(played("push", "pull"), played("pull"), False)
    plain = "\n".join(_whatif_lines(strayed))
    assert "please report" in plain
    under = msgspec.structs.replace(strayed, overrides=("policy.temperature=0.5",))
    why = next(line for line in _whatif_lines(under) if line.startswith("  why: "))
    assert why.startswith("  why: --set policy.temperature=0.5 may change how the run acts")
    assert "please report" not in why
