"""The ``coevo`` command as a user runs it: validate, run, replay, log, bad input, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COEVO = str(Path(sys.executable).parent / "coevo")
EXPLORE = str(ROOT / "scenarios" / "explore.toml")


def coevo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COEVO, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False
    )


def assert_clean_error(proc: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("coevo: error: ")
    assert fragment in lines[0]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "qs"
    proc = coevo("run", EXPLORE, "--out", str(out), "--set", "run.episodes=60")
    assert proc.returncode == 0, proc.stderr
    assert "completed" in proc.stderr
    return out


def test_run_writes_a_run_directory(small_run: Path) -> None:
    assert (small_run / "log" / "data.mdb").is_file()
    assert "episodes = 60" in (small_run / "scenario.toml").read_text()
    lines = (small_run / "coevo.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert any(r["event"] == "run ended" and r["reason"] == "completed" for r in records)


def test_replay_verify_and_until(small_run: Path) -> None:
    proc = coevo("replay", str(small_run), "--verify")
    assert proc.returncode == 0, proc.stderr
    assert "checksums: ok" in proc.stdout
    whole = json.loads(coevo("replay", str(small_run), "--json").stdout)
    finished = sum(f["episodes"] for f in whole["episodes"]["families"].values())
    assert finished == 60
    early = json.loads(coevo("replay", str(small_run), "--until", "100", "--json").stdout)
    assert sum(r["emitted"] for r in early["actor_stats"]["actors"].values()) == 101


def test_a_seq_past_the_log_s_end_is_said(small_run: Path) -> None:
    """``replay --until`` and ``log --from`` past the end answered the end, or nothing, without
    a word (and ``--json`` names no seq)."""
    end = sum(1 for _ in coevo("log", str(small_run)).stdout.splitlines())
    past = f"is past the log's end: its last event is seq {end - 1}"
    proc = coevo("replay", str(small_run), "--until", "99999999", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout), proc.stderr
    assert proc.stderr == f"coevo: note: --until 99999999 {past}\n"
    proc = coevo("log", str(small_run), "--from", str(end))
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        "",
        f"coevo: note: --from {end} {past}\n",
    )
    proc = coevo("replay", str(small_run), "--until", str(end - 1))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    proc = coevo("log", str(small_run), "--from", str(end), "--follow", timeout=30)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        "",
        f"coevo: note: --from {end} {past}\n",
    )


def test_log_filters_and_json(small_run: Path) -> None:
    proc = coevo("log", str(small_run), "--kind", "episode_finished", "--json")
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 60
    assert all(r["event"]["kind"] == "episode_finished" for r in rows)
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(seqs)
    episode = rows[0]["event"]["episode"]
    proc = coevo("log", str(small_run), "--episode", episode, "--json")
    kinds = [json.loads(line)["event"]["kind"] for line in proc.stdout.splitlines()]
    assert kinds[0] == "episode_assigned" and kinds[1] == "episode_started"
    assert kinds[-1] == "episode_finished" and set(kinds[2:-1]) == {"step_taken"}
    proc = coevo("log", str(small_run), "--from", "5", "--to", "8")
    assert [int(line.split()[0]) for line in proc.stdout.splitlines()] == [5, 6, 7]
    # the time of day is UTC and says so (a reader in another zone took it for local time)
    assert all(
        re.fullmatch(r"\d\d:\d\d:\d\dZ", line.split()[1]) for line in proc.stdout.splitlines()
    )
    proc = coevo("log", str(small_run), "--follow", "--limit", "3", timeout=30)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 3


def test_a_log_filter_naming_nothing_in_the_run_is_an_error_not_silence(small_run: Path) -> None:
    assert_clean_error(
        coevo("log", str(small_run), "--kind", "step_taen"),
        2,
        "--kind: no event kind 'step_taen' (did you mean step_taken",
    )
    assert_clean_error(
        coevo("log", str(small_run), "--actor", "worker-99"),
        2,
        "--actor: no event of 'worker-99' in this run; its actors: runtime, scheduler, worker-0",
    )
    assert_clean_error(
        coevo("log", str(small_run), "--episode", "ep99999"),
        2,
        "--episode: no event of 'ep99999' in this run (its ",
    )
    # an empty name printed every event; --to before --from printed nothing, exit 0
    assert_clean_error(coevo("log", str(small_run), "--episode", ""), 2, "--episode: an empty name")
    assert_clean_error(coevo("log", str(small_run), "--actor", " "), 2, "--actor: an empty name")
    assert_clean_error(
        coevo("log", str(small_run), "--from", "50", "--to", "10"),
        2,
        "--to 10 is not after --from 50: no event lies between them (--to is exclusive)",
    )
    # a real actor or episode with nothing in range is an empty answer, not an error
    proc = coevo("log", str(small_run), "--actor", "worker-0", "--to", "1")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    proc = coevo("log", str(small_run), "--episode", "ep000001", "--to", "1")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_outputs_are_refused_inside_a_runs_log_directory(small_run: Path) -> None:
    """``export --tensorboard RUN/log`` wrote its files beside the log's ``data.mdb``, and
    ``report --out RUN/log/x.html`` too: nothing but the log belongs there."""
    log = small_run / "log"
    for args, flag in (
        (("report", str(small_run), "--out", str(log / "x.html")), "--out"),
        (("export", str(small_run), "--tensorboard", str(log)), "--tensorboard"),
        (("export", str(small_run), "--mlflow", str(log / "m")), "--mlflow"),
    ):
        assert_clean_error(coevo(*args), 2, f"{flag} {log}")
    assert sorted(p.name for p in log.iterdir()) == sorted(
        p for p in ("data.mdb", "lock.mdb", "writer.lock") if (log / p).exists()
    )
    assert not (log / "x.html").exists() and not (log / "m").exists()


def test_outcomes_do_not_depend_on_worker_count(tmp_path: Path) -> None:
    tables = []
    for workers in (1, 5):
        out = tmp_path / f"w{workers}"
        proc = coevo(
            "run", EXPLORE, "--out", str(out), "--quiet",
            "--set", "run.episodes=40", "--set", f"run.workers={workers}",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        state = json.loads(coevo("replay", str(out), "--json").stdout)["episodes"]["episodes"]
        keep = ("family", "variant", "seed", "steps", "score", "success", "status")
        tables.append({eid: {k: row[k] for k in keep} for eid, row in state.items()})
    assert tables[0] == tables[1]
    assert len(tables[0]) == 40


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[run]\nepisodes = -3\n')
    assert_clean_error(coevo("validate", str(bad)), 2, "$.run.episodes")
    assert_clean_error(coevo("run", str(bad)), 2, "$.run.episodes")
    assert_clean_error(coevo("run", str(tmp_path / "nope.toml")), 2, "cannot read")
    assert_clean_error(coevo("run", EXPLORE, "--set", "world.families=['nope']"), 2, "nope")
    assert_clean_error(coevo("run", EXPLORE, "--set", "world.name=no.such:World"), 2, "world")
    assert_clean_error(coevo("replay", str(tmp_path)), 2, "not a coevo run directory")
    assert_clean_error(coevo("log", str(tmp_path / "missing")), 2, "no such run directory")
    assert_clean_error(coevo("log", EXPLORE), 2, "not a coevo run directory")


@pytest.mark.parametrize("command", ["run", "report", "probe"])
def test_an_empty_out_is_refused_not_read_as_the_default(
    small_run: Path, tmp_path: Path, command: str
) -> None:
    """``--out "$UNSET"`` must not quietly write where the default goes."""
    target = EXPLORE if command == "run" else str(small_run)
    proc = subprocess.run(
        [COEVO, command, target, "--out", ""],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert_clean_error(proc, 2, "--out is empty ('')")
    assert list(tmp_path.iterdir()) == []  # no runs/ made here


def test_out_directory_holding_a_run_is_refused(small_run: Path) -> None:
    assert_clean_error(coevo("run", EXPLORE, "--out", str(small_run)), 2, "already holds")


def test_out_directory_that_is_not_empty_is_refused_and_left_alone(
    tmp_path: Path, small_run: Path
) -> None:
    foreign = tmp_path / "mine"
    (foreign / "checkpoints" / "v000001").mkdir(parents=True)
    (foreign / "checkpoints" / "v000001" / "model.safetensors").write_bytes(b"weights")
    (foreign / "scenario.toml").write_text("my notes")
    before = sorted((p.relative_to(foreign), p.read_bytes()) for p in foreign.rglob("*.*"))
    proc = coevo("run", EXPLORE, "--out", str(foreign))
    assert_clean_error(proc, 2, f"{foreign}: not empty and not a run (it holds checkpoints, ")
    after = sorted((p.relative_to(foreign), p.read_bytes()) for p in foreign.rglob("*.*"))
    assert after == before and not (foreign / "log").exists()
    inside = small_run / "log"  # a run nested in another run's log
    entries = sorted(p.name for p in inside.iterdir())
    assert_clean_error(coevo("run", EXPLORE, "--out", str(inside)), 2, f"--out {inside}: inside")
    assert sorted(p.name for p in inside.iterdir()) == entries
    assert coevo("replay", str(small_run), "--verify").returncode == 0


def test_out_that_is_a_file_and_bad_replay_arguments(tmp_path: Path, small_run: Path) -> None:
    afile = tmp_path / "plain"
    afile.write_text("x")
    assert_clean_error(coevo("run", EXPLORE, "--out", str(afile)), 2, "cannot create")
    assert_clean_error(coevo("replay", str(small_run), "--until", "-1"), 2, "--until")
    assert_clean_error(coevo("replay", str(small_run), "--verify", "--json"), 2, "--verify")


def test_replay_until_starts_from_a_snapshot(tmp_path: Path) -> None:
    out = tmp_path / "snap"
    proc = coevo(
        "run", EXPLORE, "--out", str(out), "--quiet",
        "--set", "run.episodes=80", "--set", "runtime.snapshot_every=300",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert coevo("replay", str(out), "--verify").returncode == 0
    proc = coevo("replay", str(out), "--until", "900")
    assert "folded from snapshot after seq" in proc.stdout, proc.stdout
    with_snapshot = json.loads(coevo("replay", str(out), "--until", "900", "--json").stdout)
    listed = coevo("log", str(out), "--to", "901", "--kind", "episode_finished", "--json")
    ended = len(listed.stdout.splitlines())
    families = with_snapshot["episodes"]["families"].values()
    assert sum(f["episodes"] + f["aborted"] for f in families) == ended


def test_a_run_stopped_as_its_log_was_created_can_be_run_again_or_resumed(tmp_path: Path) -> None:
    """A process stopped the moment ``log/data.mdb`` appears leaves a blank data file (no
    commit: LMDB's meta pages, or an empty file if it was stopped before LMDB wrote them; the
    run goes there again) or a log with its metadata and no event (resumed, it starts); never
    a directory that can be neither resumed nor run into."""
    import lmdb

    from engine.eventlog import new_run_meta
    from scenarios.loader import load_scenario, resolved_toml
    from stores.lmdb_log import LmdbEventLog

    for name in ("blank", "empty", "uncommitted"):
        blank = tmp_path / name
        (blank / "log").mkdir(parents=True)
        if name == "empty":
            (blank / "log" / "data.mdb").touch()
        else:
            lmdb.open(str(blank / "log"), max_dbs=3).close()  # meta pages, nothing committed
        if name == "uncommitted":  # the first commit's pages written, its meta page not
            with (blank / "log" / "data.mdb").open("ab") as f:
                f.write(b"\x5a" * 3 * 4096)
        assert_clean_error(coevo("resume", str(blank)), 2, "run the scenario again with --out")
        proc = coevo("run", EXPLORE, "--out", str(blank), "--quiet", "--set", "run.episodes=20")
        assert proc.returncode == 0, proc.stderr
        assert coevo("replay", str(blank), "--verify").returncode == 0
    created = tmp_path / "created"
    text = resolved_toml(load_scenario(EXPLORE, ["run.episodes=20"]))
    meta = new_run_meta(
        "r1", scenario_name="explore", seed=1, coevo_version="0", scenario_toml=text
    )
    LmdbEventLog.create(created / "log", meta).close()  # no event, no scenario.toml
    proc = coevo("resume", str(created), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert (created / "scenario.toml").read_text() == text
    events = [
        json.loads(line)["event"]
        for line in coevo("log", str(created), "--json").stdout.splitlines()
    ]
    assert events[0]["kind"] == "run_started" and events[0]["run_id"] == "r1"
    assert sum(e["kind"] == "episode_finished" for e in events) == 20
    assert events[-1]["kind"] == "run_stopped" and events[-1]["reason"] == "completed"
    assert coevo("replay", str(created), "--verify").returncode == 0


def test_resume_follows_the_log_s_scenario_and_says_when_the_file_differs(tmp_path: Path) -> None:
    """``scenario.toml`` is a copy for people: an edited one is left as it is, the run resumes
    as its log stores it, and the user is told that the edit does not apply."""
    from engine.eventlog import new_run_meta
    from scenarios.loader import load_scenario, resolved_toml
    from stores.lmdb_log import LmdbEventLog

    run = tmp_path / "run"
    text = resolved_toml(load_scenario(EXPLORE, ["run.episodes=20"]))
    meta = new_run_meta(
        "r1", scenario_name="explore", seed=1, coevo_version="0", scenario_toml=text
    )
    LmdbEventLog.create(run / "log", meta).close()
    edited = text.replace("episodes = 20\n", "episodes = 30\n", 1)
    assert edited != text
    (run / "scenario.toml").write_text(edited)
    proc = coevo("resume", str(run), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[0] == (
        f"coevo: warning: {run / 'scenario.toml'} is not the scenario this run's log stores "
        "(changed or replaced since the run started); the run resumes as its log stores it, "
        "and a changed setting applies only to a new run (`coevo run` that file)"
    )
    assert (run / "scenario.toml").read_text() == edited
    kinds = [
        json.loads(line)["event"]["kind"]
        for line in coevo("log", str(run), "--json").stdout.splitlines()
    ]
    assert kinds.count("episode_finished") == 20


def start_long_run(out: Path, *extra: str) -> subprocess.Popen[str]:
    """Start a run far too long to finish and wait until its log exists."""
    proc = subprocess.Popen(
        [COEVO, "run", EXPLORE, "--out", str(out), "--set", "run.episodes=1000000", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out / "log" / "data.mdb").exists():
        time.sleep(0.05)
    return proc


def test_ctrl_c_stops_gracefully(tmp_path: Path) -> None:
    out = tmp_path / "long"
    proc = start_long_run(out)
    time.sleep(1.0)  # let it commit a few thousand events
    live = coevo("log", str(out), "--follow", "--limit", "25", "--json", timeout=60)
    assert live.returncode == 0 and len(live.stdout.splitlines()) == 25
    assert coevo("replay", str(out), "--verify").returncode == 0  # verifies a live run
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = coevo("log", str(out), "--json", "--kind", "run_stopped").stdout.splitlines()
    stopped = json.loads(last[-1])["event"]
    assert stopped["reason"] == "signal" and stopped["signal"] == "SIGINT"
    assert coevo("replay", str(out), "--verify").returncode == 0


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_sighup_stops_gracefully_as_sigterm_does(tmp_path: Path) -> None:
    """A terminal or SSH session that closed (SIGHUP) killed a run as SIGKILL does: no
    ``run_stopped``, exit 129 without a word."""
    out = tmp_path / "hup"
    proc = start_long_run(out, "--quiet")
    time.sleep(0.5)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 129, err
    last = coevo("log", str(out), "--json", "--kind", "run_stopped").stdout.splitlines()
    stopped = json.loads(last[-1])["event"]
    assert stopped["reason"] == "signal" and stopped["signal"] == "SIGHUP"
    assert coevo("replay", str(out), "--verify").returncode == 0


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_sigterm_stops_gracefully(tmp_path: Path) -> None:
    out = tmp_path / "term"
    proc = start_long_run(out, "--quiet")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert coevo("replay", str(out), "--verify").returncode == 0


STOP_AT = """
import os, signal, sys
import {module} as target
from scenarios.cli import entry
real = target.{name}
def stop_then_go_on(*args, **kwargs):
    os.kill(os.getpid(), signal.{sig})  # delivered at the next bytecode, in the main thread
    return real(*args, **kwargs)
target.{name} = stop_then_go_on
entry.run(sys.argv[1:])
"""


def stop_at(module: str, name: str, sig: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``coevo ARGS`` with ``sig`` sent to itself as ``module.name`` is called."""
    script = STOP_AT.format(module=module, name=name, sig=sig)
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_sigterm_outside_a_runs_actors_ends_with_one_line_and_143(tmp_path: Path) -> None:
    """Before the runtime handles signals (start-up) a SIGTERM stops as a Ctrl-C does; after a
    run completed (its closing report) it says the run completed, and where."""
    early = stop_at("scenarios.cli.commands", "main", "SIGTERM", "validate", EXPLORE)
    assert (early.returncode, early.stderr) == (143, "coevo: terminated\n")
    out = tmp_path / "done"
    late = stop_at(
        "scenarios.cli.drive", "finish", "SIGTERM", "run", EXPLORE, "--out", str(out),
        "--set", "run.episodes=20", "--quiet",
    )  # fmt: skip
    assert late.returncode == 143, late.stderr
    lines = late.stderr.strip().splitlines()
    assert lines[0] == "coevo: terminated" and "Traceback" not in late.stderr
    assert lines[1].startswith("coevo: run ") and lines[1].endswith(
        f" completed before the stop ({len(list_events(out))} events in {out})"
    )
    interrupted = stop_at(
        "scenarios.cli.drive", "finish", "SIGINT", "run", EXPLORE, "--out", str(tmp_path / "i"),
        "--set", "run.episodes=20", "--quiet",
    )  # fmt: skip
    assert interrupted.returncode == 130
    assert interrupted.stderr.startswith("coevo: interrupted\ncoevo: run ")


HANGING_WORLD = """
import time
from pathlib import Path
from scenarios.worlds.minilab import MiniLab

class Hangs(MiniLab):
    blocking = False  # stepped on the event loop: a hang blocks the loop

    def step(self, action):
        Path(__file__).with_name("hung").touch()
        time.sleep(10**6)
"""


def signal_twice(proc: subprocess.Popen[str], sig: signal.Signals, wait: float, why: str) -> str:
    """Send ``sig`` to ``proc``, again 1.5 s later; its stderr, once it ended within ``wait``
    seconds with ``sig``'s exit status (else the test fails with ``why``)."""
    proc.send_signal(sig)
    time.sleep(1.5)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(why)
    assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], err
    return err


@pytest.mark.skipif(os.name != "posix", reason="signals")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_ends_a_run_whose_event_loop_a_world_blocks(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """The first signal cannot be taken (the loop is in the world's step); the second, a
    second or more later, ends the process with one line, and the log verifies."""
    (tmp_path / "hangs.py").write_text(HANGING_WORLD)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [COEVO, "run", EXPLORE, "--out", str(out), "--set", 'world.name="hangs:Hangs"'],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "hung").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    err = signal_twice(proc, sig, 30, "two signals did not end a run whose event loop is blocked")
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"coevo: {sig.name} again, and the event loop has not run"), err
    verify = subprocess.run(
        [COEVO, "replay", str(out), "--verify"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        check=False,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


LOCKED_WORLD = """
import threading, time
from pathlib import Path
from scenarios.worlds.minilab import MiniLab

LOCK = threading.Lock()  # one interpreter per process, as TextWorld's jericho

class Locked(MiniLab):
    blocking = True  # in a thread, under world.step_timeout

    def step(self, action):
        with LOCK:
            Path(__file__).with_name("hung").touch()
            time.sleep(10**6)

    def close(self):
        with LOCK:  # waits for the hung step for good
            pass
"""


def _start_locked(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    (tmp_path / "locked.py").write_text(LOCKED_WORLD)
    proc = subprocess.Popen(
        [COEVO, "run", EXPLORE, "--out", str(tmp_path / "run"), "--set",
         'world.name="locked:Locked"', "--set", "world.step_timeout=300", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (tmp_path / "hung").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the loop has taken the hang's thread and waits on it
    return proc


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_a_stop_does_not_wait_step_timeout_for_a_world_whose_close_hangs(tmp_path: Path) -> None:
    """A world call hung with a lock its ``close`` needs (a damaged TextWorld game spinning in
    jericho): a SIGTERM stopped the run only after ``step_timeout`` (300 s here, 600 by
    default), the worker's last ``close`` waiting that long. It now waits CLOSE_GRACE_S."""
    proc = _start_locked(tmp_path)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the stop waited for the hung world's close")
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    last = json.loads(list_events(tmp_path / "run")[-1])["event"]
    assert (last["kind"], last["signal"]) == ("run_stopped", "SIGTERM"), last


@pytest.mark.skipif(os.name != "posix", reason="signals")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_a_second_into_a_slow_stop_ends_it(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """The first signal is taken and the stop waits (here on the hung world's close); a second
    one a second or more later ends the process where it is, with one line (it went where it
    went before the run: nowhere that could end a stop the loop waits in)."""
    err = signal_twice(_start_locked(tmp_path), sig, 8, "a second signal did not end a slow stop")
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"coevo: {sig.name} again while the run stops"), err
    assert "Traceback" not in err


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_a_sigterm_ends_log_follow_with_143(small_run: Path) -> None:
    """A Ctrl-C is how ``--follow`` ends (exit 0); a SIGTERM is a stop (it ended with 0 too)."""
    proc = stop_at("engine.replay", "follow", "SIGTERM", "log", str(small_run), "--follow")
    assert (proc.returncode, proc.stderr) == (143, "coevo: terminated\n")


HOLDER = """
import sys, time
from pathlib import Path
from engine.eventlog import new_run_meta
from engine.events import Envelope
from engine.lifecycle import RunStarted
from stores.lmdb_log import LmdbEventLog
meta = new_run_meta("r-h", scenario_name="x", seed=0, coevo_version="0", scenario_toml="")
log = LmdbEventLog.create(Path(sys.argv[1]), meta, durable=False)
started = RunStarted(run_id="r-h", scenario="x", scenario_hash="", seed=0, coevo_version="0")
log.append([Envelope(seq=0, run="r-h", t=0, actor="a", event=started)])
print("writing", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_log_follow_ends_when_nobody_writes_the_log_and_a_sigterm_is_one_line(
    small_run: Path, tmp_path: Path
) -> None:
    """``--follow`` on a completed (or killed) run never ended; a SIGTERM while it waited for
    a live run's next commit printed trio's warnings and five ignored-exception tracebacks."""
    done = coevo("log", str(small_run), "--follow", timeout=30)  # its writer is gone
    assert done.returncode == 0 and done.stdout == coevo("log", str(small_run)).stdout
    assert "killed" not in done.stderr  # it completed
    writer = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "live" / "log")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
        follow = subprocess.Popen(
            [COEVO, "log", str(tmp_path / "live"), "--follow"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(3)  # it printed the first event and waits for the next
        assert follow.poll() is None, "a follow of a log being written ended"
        follow.send_signal(signal.SIGTERM)
        out, err = follow.communicate(timeout=30)
    finally:
        writer.kill()
        writer.communicate()
    assert (follow.returncode, err) == (143, "coevo: terminated\n")
    assert "run_started" in out
    # its writer killed: the follow ends, and says so (it ended as quietly as a completed one)
    done = coevo("log", str(tmp_path / "live"), "--follow", timeout=30)
    assert done.returncode == 0 and "run_started" in done.stdout
    assert "it was killed (coevo resume continues it)" in done.stderr


def test_log_follow_ends_when_the_noted_writer_pid_is_another_process(
    small_run: Path, tmp_path: Path
) -> None:
    """A pid is reused (a container's pid 1 always exists): a finished run whose lock file
    names a live process that is not its writer was followed for ever."""
    import socket

    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    host = socket.gethostname().replace(" ", "_") or "unknown-host"
    (run / "log" / "writer.lock").write_text(f"{os.getpid()} {host}\n")  # alive, not its writer
    done = coevo("log", str(run), "--follow", timeout=30)
    assert done.returncode == 0 and done.stdout == coevo("log", str(run)).stdout


def list_events(run: Path) -> list[str]:
    proc = coevo("log", str(run), "--json")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_log_lines_go_to_stderr_never_into_a_commands_output(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A command's output (``--json`` included) is only its output: what the code logs meanwhile
    (an embedded model being built, say) is routed to stderr by the command line."""
    import structlog

    from scenarios.cli import main

    assert main(["validate", EXPLORE]) == 0
    capsys.readouterr()
    structlog.get_logger("coevo").bind(actor="embedded").info("building the embedded model")
    out, err = capsys.readouterr()
    assert "building the embedded model" in err and out == ""


def test_an_ascii_stream_or_a_zero_width_is_no_traceback_and_no_silence(
    small_run: Path, tmp_path: Path
) -> None:
    """``PYTHONIOENCODING=ascii``: ``log`` (its "…"), ``check`` and ``report`` on a run with a
    non-ASCII name were tracebacks; ``COLUMNS=0 coevo replay`` printed nothing, exit 0."""
    import os
    import shutil

    named = tmp_path / "rün 日本"
    shutil.copytree(small_run, named)

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [COEVO, *args], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
            env={**os.environ, **env},
        )  # fmt: skip

    for args in (
        ["log", str(named), "--limit", "3"],
        ["check", str(named)],
        ["report", str(named), "--out", str(tmp_path / "rëport.html")],
    ):
        proc = run(*args, PYTHONIOENCODING="ascii")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert "\\u" in run("check", str(named), PYTHONIOENCODING="ascii").stdout  # escaped
    proc = run("report", str(named), "--out", str(tmp_path / "plain.html"))
    assert proc.returncode == 0 and "Glyph" not in proc.stderr, proc.stderr  # matplotlib's font
    proc = run("replay", str(small_run), COLUMNS="0")
    assert proc.returncode == 0 and "actors" in proc.stdout and "worker-0" in proc.stdout


def test_an_ascii_stream_s_escapes_read_back_as_toml_and_json(
    small_run: Path, tmp_path: Path
) -> None:
    """On an ASCII stdout ``validate`` printed ``description = "\\xfcn..."``, which TOML
    refuses (so the output could not be validated again), and ``--json`` outputs JSON
    refused too: the escapes are ``\\uXXXX`` now, which both read back."""
    import json
    import os
    import tomllib

    text = "Explorers \u2014 \u00fcn\u00efc\u00f6d\u00e9"
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'name = "x"\ndescription = "{text}"\n[agent]\nkind = "explorer"\n')
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}

    def run(*args: str) -> str:
        proc = subprocess.run(
            [COEVO, *args], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
            check=False,
        )  # fmt: skip
        assert proc.returncode in (0, 1) and proc.stdout.isascii(), proc.stderr
        return proc.stdout

    printed = run("validate", str(scenario))
    assert tomllib.loads(printed)["description"] == text
    described = tmp_path / "described"
    run("run", str(scenario), "--out", str(described), "--quiet", "--set", "run.episodes=2")
    changes = json.loads(run("diff", str(described), str(small_run), "--json"))["scenario"]
    assert [c["a"] for c in changes if c["key"] == "description"] == [text], changes


def test_copy_takes_a_whole_log_even_while_the_run_writes(tmp_path: Path) -> None:
    """A ``cp -r`` of a run being written can be torn mid-commit (3 of 52 in an outside
    tester's loop: the copy read as damaged). ``coevo copy`` takes the log in one read
    transaction: every copy verifies, and says it was taken from a live run."""
    out = tmp_path / "live"
    proc = start_long_run(out, "--quiet")
    try:
        for k in range(4):
            time.sleep(0.3)
            copied = coevo("copy", str(out), str(tmp_path / f"copy{k}"))
            assert copied.returncode == 0, copied.stderr
            assert "the run was being written" in copied.stderr
            verify = coevo("replay", str(tmp_path / f"copy{k}"), "--verify")
            assert verify.returncode == 0 and verify.stdout.startswith("verified "), verify
            assert (tmp_path / f"copy{k}" / "scenario.toml").is_file()
            assert not (tmp_path / f"copy{k}" / "log" / "writer.lock").exists()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    done = coevo("copy", str(out), str(tmp_path / "done"))
    assert done.returncode == 0 and "being written" not in done.stderr, done.stderr
    stopped = coevo("log", str(tmp_path / "done"), "--kind", "run_stopped", "--json").stdout
    assert json.loads(stopped.splitlines()[-1])["event"]["reason"] == "signal"
    assert_clean_error(coevo("copy", str(out), str(tmp_path / "done")), 2, "not a new or empty")
    assert_clean_error(coevo("copy", str(out), str(out / "inner")), 2, "inside")


def test_an_existing_out_directory_that_cannot_be_written_is_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An existing, empty ``--out`` on a read-only file system read "cannot create the run
    directory" (it exists)."""
    from scenarios.cli import main
    from stores.lmdb_log import LmdbEventLog

    def read_only(*_args: object, **_kwargs: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(LmdbEventLog, "create", read_only)
    (tmp_path / "there").mkdir()
    for name, said in (("there", "cannot write in"), ("new", "cannot create")):
        assert main(["run", EXPLORE, "--out", str(tmp_path / name), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / name}: {said} the run directory: Read-only file system" in err


SLOW_EXIT = """
import atexit, time
import scenarios.cli.commands as commands

def main(argv):  # a teardown that takes a while, set up by the command (a learner's process)
    atexit.register(time.sleep, 30)
    return command(argv)

command, commands.main = commands.main, main
from scenarios.cli.entry import run
run(["validate", "scenarios/explore.toml"])
"""

SLOW_FINAL = """
import os, time

class Slow:  # cleared with the modules, after the exit functions (torch's own objects)
    def __del__(self, write=os.write, sleep=time.sleep):
        write(1, b"clearing the modules\\n")
        sleep(5)

slow = Slow()
from scenarios.cli.entry import run
run(["validate", "scenarios/explore.toml"])
"""


@pytest.mark.parametrize(
    ("script", "waits_for"),
    [(SLOW_EXIT, "# valid:"), (SLOW_FINAL, "clearing the modules")],
    ids=["exit-functions", "modules-cleared"],
)
def test_a_sigterm_after_the_command_is_done_ends_it_with_its_own_code(
    tmp_path: Path, script: str, waits_for: str
) -> None:
    """A SIGTERM a second after a run completed (during the interpreter's teardown) ended the
    process by the signal, silently (exit -15), its log and curves complete: in the exit
    functions (a learner's process joined) it ends the process at once with the command's
    code; later, as the interpreter clears its modules (where it had set the handler back to
    the default), it is ignored and the process ends with the command's code."""
    out = tmp_path / "out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", script], stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT
        )
        try:
            deadline = time.monotonic() + 120
            while waits_for not in out.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1)  # in the teardown's sleep now
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0, out.read_text()
        finally:
            proc.kill()


def test_a_thread_the_run_s_code_leaked_does_not_hold_the_exit() -> None:
    """A plug-in world that started a thread (not a daemon) and never joined it: the run said
    "exit 0" and the process then waited for that thread forever."""
    code = (
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), name='leaked-by-world').start()\n"
        "import scenarios.cli.entry as entry\n"
        "entry.LEAKED_GRACE_S = 0.5\n"
        f"entry.run(['validate', {EXPLORE!r}])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        "coevo: note: 1 thread that the run's code started (a plug-in's?) still running 0.5 s "
        "after the command ended (leaked-by-world): not waiting for it"
    ) in proc.stderr


def test_a_tilde_the_shell_left_unexpanded_is_the_home_directory(
    small_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The shell leaves ``~`` as it is in ``--out=~/x`` or quoted: a directory named ``~``
    was made in the working directory (``report: ~/r.html`` read as the home's); a ``~`` that
    names no home is one line."""
    from scenarios.cli import main

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    assert main(["report", str(small_run), "--out=~/r.html"]) == 0
    assert main(["copy", str(small_run), "~/copied"]) == 0
    assert main(["check", "~/copied"]) == 0
    assert (home / "r.html").is_file() and (home / "copied" / "log").is_dir()
    assert list(cwd.iterdir()) == []
    capsys.readouterr()
    for argv in (["check", ""], ["diff", str(small_run), ""], ["validate", ""]):
        assert main(argv) == 2  # `check ""` named "." (the working directory)
        assert capsys.readouterr().err.endswith(": an empty path; name a file or directory\n")
    assert main(["check", "~no_such_user_of_coevo/run"]) == 2
    assert capsys.readouterr().err == (
        "coevo: error: ~no_such_user_of_coevo/run: its ~ names no home directory here (HOME "
        "unset, or no such user); write the path out\n"
    )


def test_an_option_that_takes_one_value_given_twice_is_refused(
    small_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last of two silently won: ``log --episode A --episode B`` showed B's events only,
    ``export --tensorboard A --tensorboard B`` wrote B only, with exit 0."""
    from scenarios.cli import main

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for argv, option in (
        (["log", str(small_run), "--episode", "ep000001", "--episode", "ep000002"], "--episode"),
        (["export", str(small_run), "--tensorboard", a, "--tensorboard", b], "--tensorboard"),
        (["log", str(small_run), "--from", "1", "--from=2"], "--from"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.splitlines()[-1].endswith(f": error: {option} given twice: give it once")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert main(["log", str(small_run), "--kind", "run_started", "--kind", "run_stopped"]) == 0


def test_version_says_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    """``coevo --version`` said "the following arguments are required: COMMAND"; and every
    commit said 0.1.0, so a run resumed after an upgrade did not say which code wrote which
    session: from a git checkout it names the commit."""
    import subprocess
    from importlib.metadata import version

    from scenarios.cli import main

    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    label = f"+g{head.stdout.strip()[:12]}" if head.returncode == 0 else ""
    changed = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    )
    label += ".dirty" if label and changed.stdout.strip() else ""
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"coevo {version('coevo')}{label}\n"


def test_the_commit_is_read_from_any_kind_of_checkout(tmp_path: Path) -> None:
    """A branch, packed refs, a detached head, a worktree; nothing outside a checkout."""
    import subprocess

    from scenarios.cli.common import source_commit

    def git(*args: str, at: Path = tmp_path / "repo") -> str:
        done = subprocess.run(["git", "-C", str(at), *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "pyproject.toml").write_text("[project]\nname = 'coevo'\n")
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "a")
    (repo / "x").write_text("x")
    head = git("rev-parse", "HEAD")
    assert source_commit(repo) == head
    branch = repo / ".git" / git("symbolic-ref", "HEAD")
    assert branch.is_file()
    git("pack-refs", "--all")
    assert not branch.exists()
    assert source_commit(repo) == head
    git("checkout", "-q", "--detach")
    assert source_commit(repo) == head
    git("checkout", "-q", "-")
    git("worktree", "add", "-q", "--detach", str(tmp_path / "tree"))
    (tmp_path / "tree" / "pyproject.toml").write_text("")
    assert source_commit(tmp_path / "tree") == head
    assert source_commit(tmp_path) == ""  # no checkout there
    (tmp_path / "pyproject.toml").write_text("")
    assert source_commit(tmp_path) == ""


def test_a_checkout_with_uncommitted_changes_is_told(tmp_path: Path) -> None:
    """A run made by edited code recorded the commit's version as if it were that code."""
    import subprocess

    from scenarios.cli.common import uncommitted

    def git(*args: str) -> None:
        done = subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True)
        assert done.returncode == 0, done.stderr

    (tmp_path / "engine.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "engine.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
    assert not uncommitted(tmp_path)
    (tmp_path / "runs").mkdir()  # files git does not track: a run, a cache
    (tmp_path / "runs" / "log").write_text("")
    assert not uncommitted(tmp_path)
    (tmp_path / "engine.py").write_text("x = 2\n")
    assert uncommitted(tmp_path)
    assert not uncommitted(tmp_path / "runs" / "nowhere")  # git refuses: not told


def test_an_option_a_subcommand_does_not_know_is_refused_with_its_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """argparse refused ``coevo log RUN --bogus`` with the top-level usage (``coevo [-h]
    COMMAND ...``), which does not show the options ``log`` takes."""
    from scenarios.cli import main

    assert main(["log", "somewhere", "--bogus"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("usage: coevo log ") and "--follow" in " ".join(err)
    assert err[-1] == "coevo log: error: unrecognized arguments: --bogus"


def test_log_full_shows_every_value_whole(
    small_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A line of ``coevo log`` is cut at 160 characters, whatever the terminal's width: a
    policy update's digest (its last fields) could be read only with ``--json``."""
    from scenarios.cli import main

    args = ["log", str(small_run), "--kind", "step_taken", "--limit", "5"]
    assert main(args) == 0
    cut = capsys.readouterr().out.splitlines()
    assert main([*args, "--full"]) == 0
    whole = capsys.readouterr().out.splitlines()
    assert len(cut) == len(whole) == 5 and max(map(len, cut)) <= 160
    assert max(map(len, whole)) > 160 and all("…" not in line for line in whole)
    assert all(w.startswith(c.removesuffix("…")) for c, w in zip(cut, whole, strict=True))


def test_a_deleted_working_directory_is_one_line_before_anything_is_made(tmp_path: Path) -> None:
    """A shell left in a directory someone deleted: `run` with an absolute --out made the run,
    then failed in its workers with a FileNotFoundError naming no file."""
    gone, out = tmp_path / "gone", tmp_path / "out"
    code = (
        "import os, sys\n"
        f"os.chdir({str(gone)!r}); os.rmdir({str(gone)!r})\n"
        "from scenarios.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    scenario = str(ROOT / "scenarios" / "explore.toml")
    for argv in (["run", scenario, "--out", str(out)], ["validate", scenario]):
        gone.mkdir()
        done = subprocess.run(
            [sys.executable, "-c", code, *argv],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
        )
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr == (
            "coevo: error: the working directory no longer exists (deleted): cd to one that does\n"
        )
    assert not out.exists()


@pytest.mark.parametrize("mine", ["engine.py", "agents.py", "stores.py"])
def test_a_module_of_ones_own_named_like_coevo_s_packages_is_named(
    tmp_path: Path, mine: str
) -> None:
    """A researcher's ``engine.py`` beside their credit rules, on PYTHONPATH (as the audit's
    docs tell them to put it), made every command a traceback: coevo's imports reached it."""
    (tmp_path / mine).write_text("def half(episode, group):\n    return 0.5\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "scenarios.cli", "--version"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip
    name = mine.removesuffix(".py")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"coevo: error: {name!r} here is {tmp_path / mine}, ")
    assert done.stderr.count("\n") == 1 and f"not coevo's {name} package" in done.stderr
    (tmp_path / mine).unlink()
    (tmp_path / name).mkdir()  # a folder of the name without __init__.py hides nothing
    done = subprocess.run(
        [sys.executable, "-m", "scenarios.cli", "--version"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("coevo "), done.stderr


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            ImportError(
                "/v/libtorch_cpu.so: failed to map segment from shared object", name="torch"
            ),
            "cannot load torch: out of memory for the process (a limit: ulimit -v): /v/libtorch",
        ),
        (
            ImportError("resource.so: cannot open shared object file: Too many open files"),
            "cannot load a library: too many open files (raise the limit: ulimit -n): resource.so",
        ),
        (MemoryError(), "out of memory (a MemoryError: the process asked for more than it"),
    ],
)
def test_a_process_out_of_memory_or_files_while_loading_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: BaseException,
    said: str,
) -> None:
    """Under ``ulimit -v`` torch, safetensors or tokenizers could not be mapped, and under
    ``ulimit -n`` a lazily imported module could not be opened: a traceback of 26-53 lines."""
    import scenarios.cli.commands as commands

    def fail(args: object) -> None:
        raise error

    monkeypatch.setattr(commands, "home_expanded", fail)
    assert commands.main(["log", "nowhere"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"coevo: error: {said}") and err.count("\n") == 1, err
    monkeypatch.setattr(commands, "home_expanded", lambda args: (_ for _ in ()).throw(
        ImportError("No module named 'nothing_like_it'")
    ))  # fmt: skip
    with pytest.raises(ImportError):  # an import that fails otherwise is not explained away
        commands.main(["log", "nowhere"])
    noexec = ImportError(
        "/v/a.so: failed to map segment from shared object: Operation not permitted"
    )
    monkeypatch.setattr(commands, "home_expanded", lambda args: (_ for _ in ()).throw(noexec))
    with pytest.raises(ImportError):  # a noexec mount's refusal is not memory
        commands.main(["log", "nowhere"])


@pytest.mark.parametrize("command", ["check", "verify", "replay", "report"])
def test_a_long_read_of_a_log_says_how_far_it_has_come(
    small_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """On a log of two million events `check`, `replay`, `report`, `export` and `diff` were
    silent for 11 to 133 s (an outside tester): a read of at least READ_LINES_LEAST events
    says how far it has come, every tenth, to its last event (the least made small here)."""
    from scenarios.cli import console, main

    monkeypatch.setattr(console, "READ_LINES_LEAST", 10)
    run = str(small_run)
    argv = {
        "check": ["check", run],
        "verify": ["replay", run, "--verify"],
        "replay": ["replay", run],
        "report": ["report", run, "--out", str(tmp_path / "r.html")],
    }[command]
    assert main(argv) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.endswith(" events")]
    assert len(said) >= 3 and all(line.startswith("coevo: ") and run in line for line in said)
    done, of = said[-1].rsplit(": ", 1)[1].removesuffix(" events").split(" of ")
    assert done == of, said[-1]  # to its last event
