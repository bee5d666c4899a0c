"""``coevo resume``: a tiny GRPO run stopped (SIGINT) or killed (SIGKILL) at random points,
resumed each time, ends with the same final policy digest and the same events (modulo
timestamps, the runtime's own events and abandoned attempts) as the same run left alone; no
committed event is lost or duplicated and the log verifies."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
from resume_kit import (
    GRPO,
    coevo,
    comparable,
    duplicates,
    final_digest,
    finish,
    read_log,
    stop_at,
)

from agents.episode_events import EpisodeAbandoned
from engine.cli import main
from engine.events import Envelope, Event
from engine.lifecycle import RunResumed, RunStopped
from engine.replay import verify_log
from scenarios.assemble import projections
from stores.lmdb_log import LmdbEventLog


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("resume")
    (path / "scenario.toml").write_text(GRPO)
    return path


@pytest.fixture(scope="module")
def reference(root: Path) -> list[Envelope[Event]]:
    """The scenario run without interruption."""
    finish(coevo(["run", str(root / "scenario.toml"), "--out", str(root / "ref"), "--quiet"], root))
    return read_log(root / "ref")


def interrupted_run(
    root: Path, name: str, kills: list[tuple[int, int]]
) -> tuple[list[Envelope[Event]], list[list[Envelope[Event]]]]:
    """Run the scenario into ``root/name``, send each ``(signal, after this many events)`` in
    turn (the first to the run, the next ones to the resumes), then resume until it completes.

    Returns:
        The final log and the log as it was after each stop.
    """
    run = root / name
    proc = coevo(["run", str(root / "scenario.toml"), "--out", str(run), "--quiet"], root)
    after: list[list[Envelope[Event]]] = []
    for sig, events in kills:
        code = stop_at(proc, run, events, sig)
        if code is None:  # it completed before the kill point
            return read_log(run), after
        after.append(read_log(run))
        proc = coevo(["resume", str(run), "--quiet"], root)
    finish(proc)
    return read_log(run), after


def check_resumed(
    run: Path,
    final: list[Envelope[Event]],
    after: list[list[Envelope[Event]]],
    reference: list[Envelope[Event]],
) -> None:
    log = LmdbEventLog.open(run / "log", writable=False)
    try:
        result = verify_log(log, projections())
    finally:
        log.close()
    assert result.ok, result.error
    assert [env.seq for env in final] == list(range(len(final)))
    for before in after:  # nothing committed before a stop is lost or changed
        assert final[: len(before)] == before
    assert duplicates(final) == []
    last = final[-1].event
    assert isinstance(last, RunStopped) and last.reason == "completed"
    assert sum(isinstance(env.event, RunResumed) for env in final) == len(after)
    assert final_digest(final) == final_digest(reference)
    assert comparable(final) == comparable(reference)


@pytest.mark.slow
def test_uninterrupted_runs_are_deterministic(root: Path, reference: list[Envelope[Event]]) -> None:
    """The premise of the comparison: the same scenario run twice gives the same events (as
    a multiset: the interleaving of actors depends on timing) and the same digest."""
    args = ["run", str(root / "scenario.toml"), "--out", str(root / "ref2"), "--quiet"]
    finish(coevo(args, root))
    again = read_log(root / "ref2")
    assert final_digest(again) == final_digest(reference)
    assert comparable(again) == comparable(reference)


def test_sigint_then_sigkill_of_the_resume_then_resume(
    root: Path, reference: list[Envelope[Event]]
) -> None:
    rng = random.Random(8)
    n = len(reference)
    first = rng.randrange(n // 10, n // 2)
    second = rng.randrange(first + n // 10, n - n // 10)
    kills = [(signal.SIGINT, first), (signal.SIGKILL, second)]
    final, after = interrupted_run(root, "killed", kills)
    assert len(after) == 2, "the run ended before a kill point"
    stopped = after[0][-1].event
    assert isinstance(stopped, RunStopped) and stopped.reason == "signal"
    check_resumed(root / "killed", final, after, reference)
    assert any(isinstance(env.event, EpisodeAbandoned) for env in final)


def test_resume_of_a_completed_run_or_of_no_run_is_one_line_and_exit_2(
    root: Path, reference: list[Envelope[Event]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["resume", str(root / "ref")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the run completed" in err and "nothing to resume" in err
    assert main(["resume", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a coevo run directory" in err


SWEEP_KILLS = 20


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sweep_of_random_kills_each_resumed(
    root: Path, reference: list[Envelope[Event]], capsys: pytest.CaptureFixture[str]
) -> None:
    """At least ``SWEEP_KILLS`` stops at random points (1 in 5 a SIGINT, the others SIGKILL,
    many during a resume's own start), in chains of resumes until each run completes."""
    rng = random.Random(20)
    n = len(reference)
    survived = chains = 0
    while survived < SWEEP_KILLS:
        kills: list[tuple[int, int]] = []
        at = 0
        while at < n:
            at += rng.randrange(20, n // 8)
            sig = signal.SIGINT if rng.random() < 0.2 else signal.SIGKILL
            kills.append((sig, at))
        name = f"sweep{chains}"
        final, after = interrupted_run(root, name, kills)
        check_resumed(root / name, final, after, reference)
        survived += len(after)
        chains += 1
        with capsys.disabled():
            abandoned = sum(isinstance(env.event, EpisodeAbandoned) for env in final)
            print(f"\nchain {name}: {len(after)} stops survived, {abandoned} episodes abandoned")
