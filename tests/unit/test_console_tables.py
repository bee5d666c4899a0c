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


def test_an_envelope_line_for_check_shows_every_value_whole() -> None:
    """``coevo check`` named every field of a violation's events but cut each value at 60
    characters: two tip texts that differ at their ends read the same."""
    from agents.events.episodes import StepTaken
    from engine.events import Envelope
    from scenarios.cli.console import envelope_line

    text = "plan: open box, take silver key, unlock safe with silver key (EDITED AT THE END)"
    ev = StepTaken(
        episode="ep1", turn=0, action="look", observation=text, admissible=("look",),
        reward=0.0, done=False, score=0.0,
    )  # fmt: skip
    env = Envelope(seq=3, run="r", t=0, actor="w", event=ev)
    assert f'observation="{text}"' in envelope_line(env, width=None)
    assert "(EDITED AT THE END)" not in envelope_line(env)  # a listing's line stays short
