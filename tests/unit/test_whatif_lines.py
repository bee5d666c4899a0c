"""``coevo audit RUN whatif``'s table: its left column is the log's trajectory only when the
control gave it back; otherwise it is the control's replay and says so."""

from __future__ import annotations

from agents.audit.whatif import Played, PlayedTurn, WhatIf
from scenarios.cli.explore import _whatif_lines  # pyright: ignore[reportPrivateUsage]


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
