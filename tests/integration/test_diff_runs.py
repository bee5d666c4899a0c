"""``coevo diff`` on real runs: two runs of a deterministic scripted scenario are the same
stream by stream (though their logs interleave differently); another seed diverges."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scenarios.cli import main

EXPLORE = """name = "explore-diff"
seed = {seed}
[agent]
kind = "explorer"
[run]
episodes = 6
workers = 3
[logging]
progress = false
"""


def _run(root: Path, name: str, seed: int, *sets: str) -> Path:
    (root / f"{name}.toml").write_text(EXPLORE.format(seed=seed))
    args = ["run", str(root / f"{name}.toml"), "--out", str(root / name), "--quiet"]
    assert main([*args, *(a for s in sets for a in ("--set", s))]) == 0
    return root / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("diff")
    return _run(root, "a", 0), _run(root, "b", 0), _run(root, "c", 1)


def test_the_same_scenario_is_the_same_run(
    runs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, _ = runs
    assert main(["diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2:] == [
        "scenario: the same",
        "events: the same, stream by stream (leaving out wall-clock fields)",
    ]


def test_another_seed_diverges_at_its_first_seeded_event(
    runs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _, c = runs
    assert main(["diff", str(a), str(c)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[2:4] == ["scenario: 1 difference", "  seed: 0 -> 1"]
    assert out[4] == "events: first divergence at seq 0, stream runtime/ (seed)"
    assert out[7] == "  seed: first differs at the value: A 0, B 1"
    assert main(["diff", str(a), str(c), "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert got["scenario"] == [{"key": "seed", "a": 0, "b": 1}]
    div = got["divergence"]
    assert div["differing"] == ["seed"] and div["a"]["event"]["kind"] == "run_started"


@pytest.mark.parametrize("json_out", [False, True])
def test_a_reader_gone_before_the_answer_is_read_keeps_the_answer(
    runs: tuple[Path, Path, Path], json_out: bool
) -> None:
    """``coevo diff A B | head -1`` (or ``| true``) exited 0, the code for "the logs do not
    diverge", when its reader went away: the answer is the exit code, read or not."""
    a, b, c = runs
    root = Path(__file__).resolve().parents[2]
    for other, code in ((c, 1), (b, 0)):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before anything is written
        try:
            done = subprocess.run(
                [sys.executable, "-m", "scenarios.cli", "diff", str(a), str(other)]
                + ["--json"] * json_out,
                stdout=write,
                stderr=subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": str(root)},
                timeout=120,
            )
        finally:
            os.close(write)
        assert (done.returncode, done.stderr) == (code, b"")


def test_a_key_set_to_its_default_is_no_difference_and_a_default_used_is_named(
    runs: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``[policy.embedded]`` is recorded as written: ``layers`` set to its default read as a
    difference from a run that left it out, and a default used as "(missing)"."""
    from scenarios.schema import table_defaults

    layers = table_defaults()["policy.embedded"]["layers"]
    _default_is_no_difference(runs[0], tmp_path, capsys, "policy.embedded.layers", layers)


def _default_is_no_difference(
    a: Path, root: Path, capsys: pytest.CaptureFixture[str], key: str, default: int
) -> None:
    """``key`` set to its ``default`` is the same scenario as run ``a`` (which left it out),
    and set to ``default + 1`` differs from it by that key alone, shown as the default."""
    same = _run(root, "same", 0, f"{key}={default}")
    other = _run(root, "other", 0, f"{key}={default + 1}")
    assert main(["diff", str(a), str(same)]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "scenario: the same"
    main(["diff", str(other), str(a)])
    out = capsys.readouterr().out.splitlines()
    assert out[2:4] == ["scenario: 1 difference", f"  {key}: {default + 1} -> {default} (default)"]


def test_a_bad_run_is_one_line(
    tmp_path: Path, runs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diff", str(runs[0]), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"coevo: error: {tmp_path}: not a coevo run directory (no log/data.mdb inside)\n"


def test_a_world_option_at_its_default_is_no_difference(
    runs: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """World options were compared as written: ``train_variants = 500``, MiniLab's default,
    read as a difference from a run that left it out."""
    _default_is_no_difference(runs[0], tmp_path, capsys, "world.options.train_variants", 500)


def test_two_runs_of_a_deterministic_learning_scenario_are_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GRPO run's trainer emits a group's advantages, its update request and an evaluation
    round under the id of whichever episode ended last (timing): two runs of a deterministic
    learning scenario (one sample at a time, no stale sampling) are the same all the same."""
    from test_grpo_run import TINY

    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    text = TINY.replace("max_staleness = 1", "max_staleness = 0").replace(
        "[policy]\n", "[policy]\nbatch_max = 1\n"
    )
    (tmp_path / "tiny.toml").write_text(text)
    for name in ("a", "b"):
        out = str(tmp_path / name)
        assert main(["run", str(tmp_path / "tiny.toml"), "--out", out, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0, capsys.readouterr().out


def test_the_evaluation_settings_leave_the_training_episodes_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outside tester ran the same deterministic scenario with ``eval.episodes`` 3 and 6
    and got other policies: evaluation episodes were counted into the training episodes'
    seeds. With ``eval.own_seeds`` (the default) the training episodes and every update are
    the same; ``own_seeds = false`` is the rule of the runs recorded before it."""
    from test_grpo_run import TINY, read_events

    from agents.events.episodes import EpisodeAssigned
    from agents.events.policy import PolicyUpdated

    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    text = TINY.replace("max_staleness = 1", "max_staleness = 0").replace(
        "[policy]\n", "[policy]\nbatch_max = 1\n"
    )
    (tmp_path / "tiny.toml").write_text(text)

    def played(name: str, *sets: str) -> tuple[list[tuple[int, str, int]], list[str]]:
        out = str(tmp_path / name)
        args = ["run", str(tmp_path / "tiny.toml"), "--out", out, "--quiet"]
        assert main([*args, *(a for s in sets for a in ("--set", s))]) == 0
        events = read_events(tmp_path / name)
        train = [
            (ev.seed, ev.variant, ev.index)
            for ev in events
            if isinstance(ev, EpisodeAssigned) and ev.purpose == "train"
        ]
        return train, [ev.digest for ev in events if isinstance(ev, PolicyUpdated)]

    six, six_updates = played("six")
    three, three_updates = played("three", "eval.episodes=3", "eval.final_episodes=4")
    assert [t[:2] for t in six] == [t[:2] for t in three]  # seeds and tasks
    assert [t[2] for t in six] != [t[2] for t in three]  # the ids still count every episode
    assert six_updates == three_updates and len(six_updates) == 3
    shared, _ = played("shared", "eval.episodes=3", "eval.own_seeds=false")
    assert [t[1] for t in shared] == [t[1] for t in six]  # the same tasks, other seeds
    assert [t[0] for t in shared] != [t[0] for t in six]


def test_a_setting_a_run_predates_reads_as_the_value_it_ran_as() -> None:
    """A run recorded before ``eval.own_seeds`` ran as ``false`` (and resumes so), but diff
    showed it as "(missing) -> True", which read as if it had run with the default."""
    from agents.analysis.diff import scenario_changes
    from scenarios.cli.diff import _before, _diff_lines  # pyright: ignore[reportPrivateUsage]
    from scenarios.loader import load_scenario, resolved_toml

    new = resolved_toml(load_scenario(str(Path(__file__).parents[2] / "scenarios/grpo.toml")))
    old = "\n".join(line for line in new.splitlines() if "own_seeds" not in line)
    [change] = scenario_changes(old, new, None, (_before(old), _before(new)))
    assert (change.key, change.a, change.b, change.before_a) == (
        "eval.own_seeds",
        False,
        True,
        True,
    )
    lines = _diff_lines("old", "new", [change], (1, 1), None)
    assert "  eval.own_seeds: False (recorded before the setting) -> True" in lines


def test_a_long_field_s_difference_is_shown_where_it_is() -> None:
    """Two runs' ``candidate_scores`` differed at item 23 of 24 (float noise of batching);
    the event lines, cut at 80 characters, showed the same prefix on both sides."""
    from scenarios.cli.diff import _first_difference

    a = [-60.55, -4.05, *[-1.0] * 21, -100.31357]
    b = [*a[:23], -100.31359]
    assert _first_difference(a, b) == "at [23]: A -100.31357, B -100.31359"
    assert _first_difference([1, 2], [1, 2, 3]) == "at its end: A has 2 items, B 3"
    assert _first_difference({"x": ["ab", "ac"]}, {"x": ["ab", "ad"]}) == (
        'at .x[1], character 1: A "ac", B "ad"'
    )
    assert _first_difference([1], [1]) == ""
    # decoded events hold tuples: the same place (it said "at the value: A [...], B [...]")
    assert _first_difference(tuple(a), tuple(b)) == "at [23]: A -100.31357, B -100.31359"
    # a zero-width space (JSON leaves it as it is): the two sides read the same on a terminal
    assert _first_difference("open door", "open door\u200b") == (
        'at character 9: A "open door", B "open door\\u200b"'
    )


def test_runs_made_by_other_code_say_so(
    runs: tuple[Path, Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The events' comparison leaves out the version each session recorded: two runs made by
    other code (or one made by edited code) read "the same" with no word of it."""
    import scenarios.cli.run as run_command
    from scenarios.cli.common import version

    a = runs[0]
    monkeypatch.setattr(run_command, "version", lambda: "0.1.0+gfeedfacecafe.dirty")
    other = _run(tmp_path, "a", 0)
    capsys.readouterr()
    assert main(["diff", str(a), str(other)]) == 0  # the same events
    out = capsys.readouterr().out.splitlines()
    assert out[2:] == [
        "scenario: the same",
        f"code: A {version()}; B 0.1.0+gfeedfacecafe.dirty",
        "events: the same, stream by stream (leaving out wall-clock fields)",
    ]
    assert main(["diff", str(a), str(other), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["code"]
    assert got == {"a": [version()], "b": ["0.1.0+gfeedfacecafe.dirty"]}
    assert main(["diff", str(a), str(runs[1])]) == 0  # one version: no line
    assert not any(line.startswith("code:") for line in capsys.readouterr().out.splitlines())
    from scenarios.cli.diff import _versions_text  # pyright: ignore[reportPrivateUsage]

    assert _versions_text(["0.1.0+ga", "0.1.0+ga", "0.1.0+gb"]) == "0.1.0+ga, then 0.1.0+gb"
    assert _versions_text(["", "0.1.0+gb"]) == "(not recorded), then 0.1.0+gb"
