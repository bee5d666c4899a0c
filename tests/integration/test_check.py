"""``coevo check RUN``: a real run holds every invariant that applies to it; the same run with
one violation injected into its log is reported at that seq with the events involved, one line
each, exit 1; ``replay --verify`` refuses it too; none of it needs Hypothesis."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from agents.events.episodes import EpisodeFinished
from agents.testing.edits import insert
from engine.events import Envelope, Event
from scenarios.cli import main
from stores.lmdb_log import LmdbEventLog

ROOT = Path(__file__).resolve().parents[2]
EXPLORE = str(ROOT / "scenarios" / "explore.toml")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "explore"
    assert main(["run", EXPLORE, "--out", str(out), "--set", "run.episodes=24", "--quiet"]) == 0
    return out


def read(run: Path) -> list[Envelope[Event]]:
    log = LmdbEventLog.open(run / "log")
    try:
        return list(log.read(0, None))
    finally:
        log.close()


@pytest.fixture(scope="module")
def broken(run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """The run again with its tenth episode's end recorded twice: (run, seq of the copy, seq
    of the original)."""
    envs = read(run)
    first = [e.seq for e in envs if isinstance(e.event, EpisodeFinished)][9]
    edited = insert(envs, first + 1, envs[first].event)
    out = tmp_path_factory.mktemp("runs") / "broken"
    source = LmdbEventLog.open(run / "log")
    meta = source.read_meta()
    source.close()
    assert meta is not None
    log = LmdbEventLog.create(out / "log", meta, durable=False)
    log.append(edited)
    log.close()
    shutil.copy(run / "scenario.toml", out / "scenario.toml")
    return out, first + 1, first


def test_a_real_run_holds_every_invariant_that_applies(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{run}: {len(read(run))} events (completed) hold 7 invariants: ")
    for name in ("sessions", "episodes", "requests", "versions", "retrievals", "recorded-once"):
        assert name in out[0]
    assert "credit" in out[0]  # a rollout has no credit to re-derive: it holds
    skipped = [line.strip() for line in out[1:]]
    assert "not checked: lineage: for methods complementary, empo2, not rollout" in skipped


def test_a_violation_is_its_seq_and_the_events_involved_one_line_each(
    broken: tuple[Path, int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, copy, original = broken
    assert main(["check", str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{path}: invariant episodes violated at seq {copy}: ")
    assert f"finishes again after it ended at seq {original}" in lines[0]
    seqs = [int(line.split()[0]) for line in lines[1:]]
    assert seqs == sorted(seqs) and original in seqs and seqs[-1] == copy
    assert all("episode_" in line or "step_taken" in line for line in lines[1:])
    for env in read(path)[copy : copy + 1]:  # every field named and whole: nothing cut
        fields = msgspec.to_builtins(env.event)
        for name in env.event.__struct_fields__:
            value = msgspec.json.encode(fields[name]).decode()
            assert f" {name}={value}" in lines[-1], (name, lines[-1])


def test_one_invariant_by_name_and_as_json(
    broken: tuple[Path, int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, copy, original = broken
    assert main(["check", str(path), "--invariant", "recorded-once", "--json"]) == 1
    answer = json.loads(capsys.readouterr().out)
    assert answer["ok"] is False and answer["invariants"] == ["recorded-once"]
    assert answer["completed"] is True  # the run completed: the pass stopped at its violation
    violation = answer["violation"]
    assert (violation["invariant"], violation["seq"]) == ("recorded-once", copy)
    assert violation["involved"] == [original, copy]
    assert [e["seq"] for e in violation["events"]] == [original, copy]
    assert main(["check", str(path), "--invariant", "versions"]) == 0
    capsys.readouterr()


def test_an_invariant_asked_for_outside_its_scope_says_so(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rollout has no lineage to check: "holds" alone would read as a verdict."""
    assert main(["check", str(run), "--invariant", "lineage"]) == 0
    out, err = capsys.readouterr()
    assert "hold 1 invariant: lineage" in out
    assert "coevo: note: lineage was run as asked, outside its scope (for methods " in err


def test_replay_verify_runs_the_invariants_too(
    broken: tuple[Path, int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, copy, _ = broken
    assert main(["replay", str(path), "--verify"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"event log inconsistent at seq {copy}: episodes: " in err


def test_a_log_that_records_no_scenario_is_checked_without_it(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A generated stream written with ``new_run_meta``'s defaults: ``check`` and ``replay
    --verify`` said "(its scenario): Object missing required field name" and checked nothing."""
    import msgspec

    source = LmdbEventLog.open(run / "log")
    recorded = source.read_meta()
    source.close()
    assert recorded is not None
    meta = msgspec.structs.replace(recorded, scenario_toml="")
    log = LmdbEventLog.create(tmp_path / "bare" / "log", meta, durable=False)
    log.append(read(run))
    log.close()
    capsys.readouterr()
    assert main(["check", str(tmp_path / "bare")]) == 0
    out = capsys.readouterr()
    assert "the log records no scenario, so what needs the run's settings" in out.err
    assert "not checked: credit: needs the run's scenario" in out.out
    # an invariant of some methods said "not ?" of a run whose method it cannot know
    assert "lineage: for methods complementary, empo2; the run's method is unknown: its" in out.out
    assert main(["replay", str(tmp_path / "bare"), "--verify"]) == 0


def test_a_log_whose_metadata_is_gone_says_what_it_cannot_check(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the run's metadata record removed, ``replay --verify`` said "ok" without a word
    of the checks it left out (``check`` listed them)."""
    import lmdb

    shutil.copytree(run, tmp_path / "bare")
    env = lmdb.open(str(tmp_path / "bare" / "log"), max_dbs=3, create=False)
    with env, env.begin(write=True, db=env.open_db(b"meta", create=False)) as txn:
        assert txn.delete(b"run")
    capsys.readouterr()
    for command in (["check"], ["replay", "--verify"]):
        assert main([command[0], str(tmp_path / "bare"), *command[1:]]) == 0
        err = capsys.readouterr().err
        assert "the log records no run metadata, so what needs the run's settings" in err, err


def test_an_unknown_invariant_is_one_line_and_exit_2(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(run), "--invariant", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("coevo: error: unknown invariant 'nope'; known: ") and "\n" not in err


def test_check_needs_no_hypothesis(broken: tuple[Path, int, int], run: Path) -> None:
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "from scenarios.cli import main\n"
        "sys.exit(main(['check', sys.argv[1]]))\n"
    )
    for path, expected in ((run, 0), (broken[0], 1)):
        proc = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT
        )
        assert proc.returncode == expected, proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_damaged_log_is_one_line_not_a_traceback(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "damaged"
    shutil.copytree(run, copy)
    data = copy / "log" / "data.mdb"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    assert main(["check", str(copy)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("coevo: error: ") and "\n" not in err
    assert "truncated" in err
