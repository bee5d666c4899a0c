"""``coevo resume``: a tiny GRPO run stopped (SIGINT) or killed (SIGKILL) at random points,
resumed each time, ends with the same final policy digest and the same events (modulo
timestamps, the runtime's own events and abandoned attempts) as the same run left alone; no
committed event is lost or duplicated and the log verifies."""

from __future__ import annotations

import random
import shutil
import signal
from pathlib import Path

import fault_counts
import pytest
from resume_kit import (
    GRPO,
    Chain,
    add_counts,
    check_consistent,
    coevo,
    comparable,
    final_digest,
    finish,
    read_log,
    stop_and_resume,
)

from agents.events.episodes import EpisodeAbandoned
from agents.events.policy import PolicyUpdated
from engine.events import Envelope, Event
from engine.lifecycle import RunFailed, RunResumed, RunStopped
from scenarios.cli import main


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


def interrupted_run(root: Path, name: str, kills: list[tuple[int, int]]) -> Chain:
    return stop_and_resume(root, root / "scenario.toml", name, kills)


def check_resumed(
    run: Path,
    final: list[Envelope[Event]],
    after: list[list[Envelope[Event]]],
    reference: list[Envelope[Event]],
) -> None:
    check_consistent(run, final, after)
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
    chain = interrupted_run(root, "killed", kills)
    fault_counts.record(**chain.counts())
    final, after = chain.final, chain.after
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


def test_a_completed_run_on_a_read_only_disk_is_nothing_to_resume(
    root: Path,
    reference: list[Envelope[Event]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On a read-only file system a completed run's resume failed to open the log for
    writing (exit 1, "Read-only file system"), where a writable one says there is nothing to
    resume (exit 2); a run that did not complete still says why it cannot be written."""
    from engine.errors import LogError
    from stores.lmdb_log import LmdbEventLog

    ref = LmdbEventLog.open(root / "ref" / "log", writable=False)
    meta, envs = ref.read_meta(), list(ref.read(0, None))[:-1]  # as if stopped before its end
    ref.close()
    cut = LmdbEventLog.create(tmp_path / "cut" / "log", meta, durable=False)
    cut.append(envs)
    cut.close()
    opened = LmdbEventLog.open.__func__  # type: ignore[attr-defined]

    def read_only(cls: type, path: object, *, writable: bool = False, **kw: object) -> object:
        if writable:
            raise LogError(f"cannot open the event log at {path} for writing: Read-only")
        return opened(cls, path, writable=writable, **kw)

    monkeypatch.setattr(LmdbEventLog, "open", classmethod(read_only))
    assert main(["resume", str(root / "ref")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the run completed" in err and "nothing to resume" in err
    assert main(["resume", str(tmp_path / "cut")]) == 1
    assert "for writing: Read-only" in capsys.readouterr().err


def test_a_failed_run_resumes_and_ends_as_if_it_had_not_failed(
    root: Path, reference: list[Envelope[Event]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The learner raises in its second update: the run fails (``run_failed``, exit 1). The
    resume owes that update and ends with the uninterrupted run's digest and events."""
    import agents.learning.update

    real = agents.learning.update.grpo_step
    calls = []

    def failing(*args: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected learner failure")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setenv("COEVO_CACHE", str(root))
    monkeypatch.setattr(agents.learning.update, "grpo_step", failing)
    run = root / "failed"
    args = ["run", str(root / "scenario.toml"), "--out", str(run), "--quiet"]
    assert main(args) == 1
    before = read_log(run)
    failed = before[-1].event
    assert isinstance(failed, RunFailed) and "injected learner failure" in failed.message
    monkeypatch.setattr(agents.learning.update, "grpo_step", real)
    assert main(["resume", str(run), "--quiet"]) == 0
    final = read_log(run)
    fault_counts.record(**Chain(run, final, [before]).counts())  # the failure as its stop
    check_resumed(run, final, [before], reference)
    resumed = next(env.event for env in final if isinstance(env.event, RunResumed))
    assert resumed.previous == "run_failed"


def test_a_resume_checks_the_checkpoint_it_loads_against_the_log(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flipped tensor bytes, an older version in the newer's place, or a deleted optimiser
    state: the resumed learner refuses the checkpoint, naming the file, and trains nothing (it
    took the log's digest on trust and resumed each with exit 0). A missing optimiser state
    is now refused before the resume plays anything (an outside tester: the learner's refusal
    came after a session's episodes, the log growing on every try)."""
    import agents.learning.update

    real = agents.learning.update.grpo_step
    calls = []

    def failing(*args: object) -> object:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected learner failure")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setenv("COEVO_CACHE", str(root))
    monkeypatch.setattr(agents.learning.update, "grpo_step", failing)
    run = root / "checked"
    args = ["run", str(root / "scenario.toml"), "--out", str(run), "--quiet"]
    assert main([*args, "--set", "grpo.keep_checkpoints=2"]) == 1
    monkeypatch.setattr(agents.learning.update, "grpo_step", real)
    newest = Path("checkpoints") / "v000002"

    def flip(copy: Path) -> None:
        weights = copy / newest / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0x40  # in the last tensor's data
        weights.write_bytes(bytes(data))

    def older(copy: Path) -> None:
        shutil.rmtree(copy / newest)
        (copy / "checkpoints" / "v000001").rename(copy / newest)

    damages = {
        "flipped": (flip, "model.safetensors: the weights have digest"),
        "older": (older, "model.safetensors: the weights have digest"),
        "no optimiser": (
            lambda copy: (copy / newest / "optimizer.safetensors").unlink(),
            "optimizer.safetensors is missing",
        ),
    }
    for name, (damage, says) in damages.items():
        copy = root / f"checked-{name}"
        shutil.copytree(run, copy)
        damage(copy)
        if name == "no optimiser":  # seen on disk: refused before anything plays (exit 2)
            before = len(read_log(copy))
            assert main(["resume", str(copy), "--quiet"]) == 2, name
            assert len(read_log(copy)) == before, name
            continue
        assert main(["resume", str(copy), "--quiet"]) == 1, name
        final = read_log(copy)
        failed = final[-1].event
        assert isinstance(failed, RunFailed), name
        assert f"the learner cannot resume: {copy / newest}/{says}" in failed.message, name
        resumed = next(env.seq for env in final if isinstance(env.event, RunResumed))
        assert not [e for e in final[resumed:] if isinstance(e.event, PolicyUpdated)], name


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
    counts: dict[str, int] = {}
    while survived < SWEEP_KILLS:
        kills: list[tuple[int, int]] = []
        at = 0
        while at < n:
            at += rng.randrange(20, n // 8)
            sig = signal.SIGINT if rng.random() < 0.2 else signal.SIGKILL
            kills.append((sig, at))
        name = f"sweep{chains}"
        chain = interrupted_run(root, name, kills)
        fault_counts.record(**add_counts(counts, chain.counts()), chains=chains + 1)
        check_resumed(root / name, chain.final, chain.after, reference)
        survived += len(chain.after)
        chains += 1
        with capsys.disabled():
            c = chain.counts()
            print(
                f"\nchain {name}: {c['stops']} stops survived "
                f"({c['stops_before_first_commit']} before the resume's first commit), "
                f"{c['abandoned']} episodes abandoned"
            )
