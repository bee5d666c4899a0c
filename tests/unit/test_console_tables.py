"""The tables a run and ``coevo replay`` print."""

from __future__ import annotations

from rich.console import Console

from engine.projection import ActorRow, ActorStatsState
from scenarios.cli.console import actors_table


def test_an_actor_that_emitted_nothing_has_no_first_or_last_seq() -> None:
    """A worker that started and emitted nothing (every episode went to the others) showed
    ``-1`` as its first and last seq."""
    state = ActorStatsState(
        actors={
            "worker-0": ActorRow(starts=1),
            "worker-1": ActorRow(emitted=2, first_seq=4, last_seq=9, starts=1),
        }
    )
    console = Console(width=120, record=True)
    console.print(actors_table(state))
    cells = [
        [c.strip() for c in line.strip("│ ").split("│")]
        for line in console.export_text().splitlines()
        if "worker-" in line
    ]
    rows = {row[0]: row for row in cells}
    assert rows["worker-0"][-2:] == ["-", "-"], rows
    assert rows["worker-1"][-2:] == ["4", "9"], rows
