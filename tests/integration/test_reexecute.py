"""``coevo replay RUN --reexecute-learner`` on a tiny Complementary RL run whose guided episodes
are trained as distills (so the policy's samples include prompts with the entry removed, and
the extractor trains too): every update re-executes bit for bit from the base weights, and a
tampered digest or checkpoint is reported as the first update that diverged."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_grpo_run import of, read_events

from agents.events.episodes import EpisodeFinished
from agents.events.extractor import ExtractorUpdated
from agents.events.policy import ActionSampled, GradientRequested, PolicyUpdated
from agents.learning.learner import update_seed
from engine.events import Event
from engine.lifecycle import RunStarted
from scenarios.cli import main
from stores.checkpoints import param_digest
from stores.lmdb_log import LmdbEventLog
from stores.model_dirs import load_model_dir


@pytest.fixture(scope="module")
def root(distill_root: Path) -> Path:
    return distill_root


@pytest.fixture(autouse=True)
def cache(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-execution finds the run's base model where the run built it."""
    monkeypatch.setenv("COEVO_CACHE", str(root / "cache"))


@pytest.fixture(scope="module")
def events(root: Path) -> list[Event]:
    return read_events(root / "run")


def copy_run(root: Path, name: str, edit: Callable[[Event], Event] | None = None) -> Path:
    """A copy of the run (scenario, checkpoints); with ``edit``, its log rewritten through it."""
    src, out = root / "run", root / f"reexecute-{name}"
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("log") if edit else None)
    if edit is not None:
        reader = LmdbEventLog.open(src / "log")
        try:
            meta = reader.read_meta()
            envs = [msgspec.structs.replace(e, event=edit(e.event)) for e in reader.read(0, None)]
        finally:
            reader.close()
        assert meta is not None
        writer = LmdbEventLog.create(out / "log", meta, durable=False)
        try:
            writer.append(envs)
        finally:
            writer.close()
    return out


def first_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert lines, "expected an error line"
    return lines[-1]


def test_every_update_re_executes_bit_for_bit(
    root: Path, events: list[Event], capsys: pytest.CaptureFixture[str]
) -> None:
    policy, extractor = of(events, PolicyUpdated), of(events, ExtractorUpdated)
    assert len(policy) == 3 and [u.update for u in extractor] == list(range(len(extractor)))
    assert any(u.samples > 0 for u in extractor), "an extractor update should train"
    # both models' updates name the layout they ran in, which re-execution follows
    assert {u.scoring for u in extractor} == {r.scoring for r in of(events, GradientRequested)}
    assert {u.scoring for u in extractor} == {"kept"}
    distilled = {
        e
        for r in of(events, GradientRequested)
        for e, m in zip(r.episodes, r.rollouts, strict=True)
        if m.endswith("distill")
    }
    bare = [s for s in of(events, ActionSampled) if s.episode in distilled and s.bare_prompt_ids]
    assert bare and all(s.bare_prompt_ids != s.prompt_ids for s in bare)
    assert main(["replay", str(root / "run"), "--reexecute-learner"]) == 0
    out = capsys.readouterr().out
    assert (
        f"re-executed 3 policy and {len(extractor)} extractor updates: every parameter digest "
        f"matches the log ({3 + min(len(extractor), 3)} checkpoints on disk compared)"
    ) in out


def test_updates_record_their_seed_and_the_digest_they_started_from(
    root: Path, events: list[Event]
) -> None:
    (model_dir,) = (root / "cache" / "embedded").glob("*[!k]")
    (ops_dir,) = (root / "cache" / "extractor").glob("*[!k]")  # the extractor's "embedded-ops"
    (started,) = of(events, RunStarted)
    for model, start in ((PolicyUpdated, model_dir), (ExtractorUpdated, ops_dir)):
        base, _ = load_model_dir(start, torch.device("cpu"))
        updates = of(events, model)
        parents = [u.parent_digest for u in updates]
        assert parents == [param_digest(base)] + [u.digest for u in updates[:-1]]
    for u in of(events, PolicyUpdated):
        assert u.seed == update_seed(started.seed, u.update)


def test_a_log_without_seeds_or_parent_digests_re_executes_too(root: Path) -> None:
    def old(ev: Event) -> Event:
        if isinstance(ev, PolicyUpdated):
            return msgspec.structs.replace(ev, seed=None, parent_digest="")
        return ev

    assert main(["replay", str(copy_run(root, "old", old)), "--reexecute-learner"]) == 0


def test_a_tampered_policy_digest_is_the_first_divergent_update(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def tamper(ev: Event) -> Event:
        if isinstance(ev, PolicyUpdated) and ev.update == 1:
            return msgspec.structs.replace(ev, digest="0" * 32)
        return ev

    run = copy_run(root, "tampered-digest", tamper)
    assert main(["replay", str(run), "--reexecute-learner"]) == 1
    line = first_line(capsys.readouterr().err)
    assert line.startswith("coevo: error: policy update 1 (seq ")
    assert line.endswith(
        f"diverged: re-executed parameters have digest {_digest(root / 'run', 2)}, "
        f"the log records {'0' * 32}"
    )


def test_a_tampered_extractor_digest_is_named(
    root: Path, events: list[Event], capsys: pytest.CaptureFixture[str]
) -> None:
    last = of(events, ExtractorUpdated)[-1].update

    def tamper(ev: Event) -> Event:
        if isinstance(ev, ExtractorUpdated) and ev.update == last:
            return msgspec.structs.replace(ev, digest="f" * 32)
        return ev

    run = copy_run(root, "tampered-extractor", tamper)
    assert main(["replay", str(run), "--reexecute-learner"]) == 1
    line = first_line(capsys.readouterr().err)
    assert line.startswith(f"coevo: error: extractor update {last} (seq ")
    assert line.endswith(f"the log records {'f' * 32}")


def test_a_tampered_checkpoint_is_the_first_divergent_update(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(root, "tampered-checkpoint")
    path = run / "checkpoints" / "v000002" / "model.safetensors"
    state = load_file(str(path))
    name = sorted(state)[0]
    state[name] = state[name] + 1e-6
    save_file(state, str(path), metadata={"format": "pt"})
    assert main(["replay", str(run), "--reexecute-learner"]) == 1
    line = first_line(capsys.readouterr().err)
    assert line.startswith("coevo: error: policy update 1 (seq ")
    assert "diverged: checkpoint checkpoints/v000002 on disk has digest " in line
    assert line.endswith(f"the log records {_digest(run, 2)}")


@pytest.mark.parametrize(
    ("kind", "step"), [(PolicyUpdated, "grpo_step"), (ExtractorUpdated, "extractor_step")]
)
def test_a_different_base_model_is_named_before_training(
    root: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    kind: type[Event],
    step: str,
) -> None:
    """Named before its first update is run: another base model (the policy's given as the
    extractor's) failed inside the step with a traceback (``IndexError``: its vocabulary)."""
    import agents.audit.reexecute as reexecute

    def tamper(ev: Event) -> Event:
        if isinstance(ev, kind) and getattr(ev, "update", None) == 0:
            return msgspec.structs.replace(ev, parent_digest="1" * 32)
        return ev

    def fails(*_args: object, **_kwargs: object) -> None:
        raise IndexError("index out of range in self")

    run = copy_run(root, f"other-base-{step}", tamper)
    monkeypatch.setattr(reexecute, step, fails)
    assert main(["replay", str(run), "--reexecute-learner"]) == 1
    line = first_line(capsys.readouterr().err)
    name = "policy" if kind is PolicyUpdated else "extractor"
    assert line.startswith(f"coevo: error: {name} update 0 (seq ")
    assert line.endswith(f"the run started from {'1' * 32} (another base model or cache?)")


def test_the_run_directory_s_scenario_file_changes_nothing(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run re-executes from the scenario its log stores: its ``scenario.toml`` (a copy for
    people) deleted, or edited to a setting that cannot load here, changes nothing."""
    deleted = copy_run(root, "no-scenario-file")
    (deleted / "scenario.toml").unlink()
    assert main(["replay", str(deleted), "--reexecute-learner"]) == 0
    edited = copy_run(root, "edited-scenario-file")
    text = (edited / "scenario.toml").read_text()
    assert '\ndevice = "cpu"\n' in text
    (edited / "scenario.toml").write_text(
        text.replace('\ndevice = "cpu"\n', '\ndevice = "cuda:7"\n')
    )
    assert main(["replay", str(edited), "--reexecute-learner"]) == 0
    assert "diverged" not in capsys.readouterr().err


def test_a_run_without_updates_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "explore.toml"
    scenario.write_text(
        'name = "x"\n[run]\nepisodes = 4\nworkers = 2\n[agent]\nkind = "explorer"\n'
        "[logging]\nprogress = false\n"
    )
    assert main(["run", str(scenario), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "run"), "--reexecute-learner"]) == 2
    assert first_line(capsys.readouterr().err) == (
        f"coevo: error: {tmp_path / 'run'}: the log records no model update to re-execute"
    )
    assert main(["replay", str(tmp_path / "run"), "--reexecute-learner", "--json"]) == 2


def _digest(run: Path, version: int) -> str:
    (ev,) = [
        e for e in read_events(run) if isinstance(e, PolicyUpdated) and e.policy_version == version
    ]
    return ev.digest


def test_a_request_for_an_unfinished_episode_is_named(
    root: Path, events: list[Event], capsys: pytest.CaptureFixture[str]
) -> None:
    first = of(events, GradientRequested)[0].episodes[0]

    def tamper(ev: Event) -> Event:
        if isinstance(ev, EpisodeFinished) and ev.episode == first:
            return msgspec.structs.replace(ev, purpose="eval")
        return ev

    run = copy_run(root, "unfinished", tamper)
    assert main(["replay", str(run), "--reexecute-learner"]) == 1
    line = first_line(capsys.readouterr().err)
    assert line.startswith("coevo: error: policy update 0 (seq ")
    assert line.endswith(f"diverged: gradient requested for {first}, which has not finished")
