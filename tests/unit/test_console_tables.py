"""The tables a run and ``coevo replay`` print."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
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


def test_an_envelope_line_tells_inf_and_nan_from_no_value() -> None:
    """``coevo log`` printed inf, -inf and NaN as ``null`` (JSON has no other), as if the
    field held no value (an older log's round mean of 1e308 and -1e308)."""
    from agents.events.episodes import StepTaken
    from agents.events.policy import EvalRoundFinished
    from engine.events import Envelope
    from scenarios.cli.console import envelope_line

    for value, shown in ((float("inf"), "Infinity"), (-float("inf"), "-Infinity")):
        ev = EvalRoundFinished(
            round=0, policy_version=0, episodes=4, success=0.5, score=value, train_episodes=0
        )
        line = envelope_line(Envelope(seq=3, run="r", t=0, actor="trainer", event=ev))
        assert f" score={shown} " in line, line
    step = StepTaken(
        episode="ep1", turn=0, action="look", observation="x", admissible=("look",),
        reward=float("nan"), done=False, score=0.0,
    )  # fmt: skip
    assert "reward=NaN" in envelope_line(Envelope(seq=4, run="r", t=0, actor="w", event=step))


def test_a_world_s_names_print_as_written_and_its_control_characters_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A family named ``[bold red]fam[/bold red]`` printed as a bold red "fam" in ``coevo
    replay``'s table (rich read it as markup), ``a\\nb`` split its row, and ESC and a
    right-to-left override reached the terminal raw; a path holding markup lost it in a run's
    lines, and a path holding ESC and a newline did in an error."""
    from agents.events.episodes import EpisodeAssigned, EpisodeFinished
    from engine.eventlog import new_run_meta
    from engine.events import Envelope
    from engine.lifecycle import RunStarted, RunStopped
    from scenarios.cli import main
    from stores.lmdb_log import LmdbEventLog

    run = tmp_path / "[b]run[/b]"
    meta = new_run_meta("r", scenario_name="x", seed=0, coevo_version="0", scenario_toml="")
    log = LmdbEventLog.create(run / "log", meta, durable=False)
    events: list[Any] = [
        RunStarted(run_id="r", scenario="x", scenario_hash="h", seed=0, coevo_version="0")
    ]
    for i, family in enumerate(["[bold red]fam[/bold red]", "a\nb", "q\x1b[2Jr\u202e"]):
        at = dict(episode=f"ep{i}", worker="w", family=family, variant=i, split="train")
        events.append(EpisodeAssigned(index=i, seed=i, purpose="train", **at))
        events.append(EpisodeFinished(steps=3, score=1.0, success=True, total_reward=1.0, **at))
    events.append(RunStopped(reason="completed"))
    log.append([Envelope(seq=i, run="r", t=i, actor="w", event=e) for i, e in enumerate(events)])
    log.close()
    assert main(["replay", str(run)]) == 0
    out = capsys.readouterr().out
    assert "[bold red]fam[/bold" in out and "│ a\\nb " in out and "q\\x1b[2Jr\\u202e" in out
    assert "\x1b" not in out and "\u202e" not in out
    assert main(["log", str(tmp_path / "no\x1b[2Jsuch\nrun")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "no\\x1b[2Jsuch\\nrun" in err, err
    explore = Path(__file__).resolve().parents[2] / "scenarios" / "explore.toml"
    marked = tmp_path / "[b]x[/b]"
    assert main(["run", str(explore), "--out", str(marked), "--set", "run.episodes=4"]) == 0
    squeezed = "".join(capsys.readouterr().err.split())  # rich wraps, at a space or not
    assert f"{marked}(exit0)" in squeezed, squeezed


def test_a_command_a_message_suggests_pastes_as_one_word() -> None:
    """Messages suggested ``coevo log runs/my run --kind episode_aborted`` (two words to a
    shell), and ``coevo audit -ins tip 1`` (an option to argparse)."""
    from agents.audit.shown import pasteable

    assert [pasteable(p) for p in ("runs/my run", "-ins", "runs/a", Path("x y"))] == [
        "'runs/my run'",
        "./-ins",
        "runs/a",
        "'x y'",
    ]
    # a path a message shows escaped: bash's $'...' names it, escaped as it is
    assert pasteable("r/e\x1b[7m it's\u202e") == "$'r/e\\x1b[7m it\\'s\\u202e'"
    word = subprocess.run(
        ["bash", "-c", f"printf %s {pasteable('a b/e' + chr(27) + chr(0x202E))}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert word.stdout == "a b/e\x1b\u202e"


def test_a_world_s_score_is_shown_short_at_any_size() -> None:
    """``serve`` and ``audit`` printed a score of 1e308 as 309 digits and 5e-324 as 0.00
    (a world's scores are at most 1e100 now, still 101 digits)."""
    from agents.audit.shown import score_text

    assert [score_text(x) for x in (0.0, -0.0, 0.5, -3.25, 12345.678)] == [
        "0.00",
        "0.00",
        "0.50",
        "-3.25",
        "12345.68",
    ]
    assert [score_text(x) for x in (1e100, -2.5e6, 5e-324, 0.001234)] == [
        "1e+100",
        "-2.5e+06",
        "4.94e-324",
        "0.00123",
    ]
