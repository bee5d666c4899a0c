"""A tiny GRPO run end to end through the CLI: the parameters change, the log replays and
verifies, every advantage re-derives exactly from the logged rewards, and no sample is staler
than the bound."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest

from agents.events.episodes import EpisodeFinished
from agents.events.policy import (
    ActionRequested,
    ActionSampled,
    AdvantagesComputed,
    EvalRoundFinished,
    GradientRequested,
    PolicyUpdated,
)
from engine.events import Event
from engine.lifecycle import RunStopped
from scenarios.cli import main
from stores.lmdb_log import LmdbEventLog

TINY = """
name = "tiny-grpo"
seed = 3

[world]
families = ["fetch"]
pool = 2  # training revisits variants 0 and 1; evaluation stays on held-out ones

[agent]
kind = "policy"

[run]
episodes = 24
workers = 3
method = "grpo"

[policy]
temperature = 5.0  # the barely trained tiny model prefers short actions; flatten it

[policy.embedded]
steps = 20
warmup = 2
episodes_per_family = 6
hidden_size = 32
layers = 1
heads = 2
kv_heads = 1
intermediate_size = 64
eval_variants = 1
eval_notes = 1
note_episodes_per_family = 8
probe_variants = 2
probe_seeds = 1

[grpo]
group_size = 4
groups_per_update = 2
lr = 0.01
max_staleness = 1

[eval]
every = 2
episodes = 6
final_episodes = 9  # the round after the last update: the final figures

[logging]
progress = false
"""


def run_scenario(root: Path, text: str) -> Path:
    """Run ``text`` as a scenario into ``root/run``, the model cached under ``root/cache``."""
    scenario = root / "scenario.toml"
    scenario.write_text(text)
    out = root / "run"
    mp = pytest.MonkeyPatch()
    mp.setenv("COEVO_CACHE", str(root / "cache"))
    try:
        assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 0
    finally:
        mp.undo()
    return out


def read_events(run_dir: Path) -> list[Event]:
    log = LmdbEventLog.open(run_dir / "log", writable=False)
    try:
        return [env.event for env in log.read(0, None)]
    finally:
        log.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_scenario(tmp_path_factory.mktemp("grpo"), TINY)


@pytest.fixture(scope="module")
def events(run_dir: Path) -> list[Event]:
    return read_events(run_dir)


def of(events: list[Event], kind: type) -> list:
    return [ev for ev in events if isinstance(ev, kind)]


def test_updates_with_signal_change_the_parameters(events: list[Event]) -> None:
    updates = of(events, PolicyUpdated)
    assert [u.policy_version for u in updates] == [1, 2, 3]
    requests = of(events, GradientRequested)
    with_signal = [any(a != 0 for a in r.advantages) for r in requests]
    assert any(with_signal), "the tiny run should give some group unequal rewards"
    digests = [u.digest for u in updates]
    for k, signal in enumerate(with_signal):
        changed = digests[k] != (digests[k - 1] if k else None)
        assert changed or not signal
        assert updates[k].samples > 0
        assert (updates[k].grad_norm > 0) == signal


def by_hand(rewards: tuple[float, ...], eps: float) -> list[float]:
    """GRPO's advantages as ALGORITHMS.md writes them, ``(R_i - mean) / (std + eps)`` with the
    sample std (ddof=1), in exact rational arithmetic (``statistics``), not the production
    code's floats; a group whose rewards are all equal carries no signal (0 each)."""
    if len(set(rewards)) == 1:
        return [0.0] * len(rewards)
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)
    return [(r - mean) / (std + eps) for r in rewards]


def test_advantages_re_derive_from_logged_rewards(events: list[Event]) -> None:
    score = {ev.episode: ev.score for ev in of(events, EpisodeFinished)}
    groups = of(events, AdvantagesComputed)
    assert len(groups) == 6
    assert any(len(set(g.rewards)) > 1 for g in groups), "no group with a signal to check"
    for g in groups:
        assert g.rule == "grpo-std-score"
        assert list(g.rewards) == [score[e] for e in g.episodes]
        assert g.mean == pytest.approx(statistics.mean(g.rewards), rel=1e-12, abs=1e-15)
        assert g.std == pytest.approx(statistics.stdev(g.rewards), rel=1e-12, abs=1e-15)
        assert list(g.advantages) == pytest.approx(by_hand(g.rewards, g.eps), rel=1e-9, abs=1e-12)
    by_episode = {e: a for g in groups for e, a in zip(g.episodes, g.advantages, strict=True)}
    for req in of(events, GradientRequested):
        assert list(req.advantages) == [by_episode[e] for e in req.episodes]


def test_every_turn_is_sampled_within_the_staleness_bound(events: list[Event]) -> None:
    requested = {(ev.episode, ev.turn) for ev in of(events, ActionRequested)}
    sampled = of(events, ActionSampled)
    assert {(s.episode, s.turn) for s in sampled} == requested
    version_of = {}
    for s in sampled:
        version_of.setdefault(s.episode, set()).add(s.policy_version)
    for req in of(events, GradientRequested):
        oldest = min(min(version_of[e]) for e in req.episodes)
        assert req.update - oldest <= req.max_staleness
    assert all(u.stale == 0 for u in of(events, PolicyUpdated))


def test_evaluation_rounds_run_on_heldout_variants(events: list[Event]) -> None:
    rounds = of(events, EvalRoundFinished)
    assert sorted(r.policy_version for r in rounds) == [0, 2, 3]  # rounds may end out of order
    assert {r.policy_version: r.episodes for r in rounds} == {0: 6, 2: 6, 3: 9}
    evals = [ev for ev in of(events, EpisodeFinished) if ev.purpose == "eval"]
    assert len(evals) == 6 + 6 + 9
    assert all(ev.split == "heldout" for ev in evals)
    assert len({ev.variant for ev in evals}) > 2


def test_training_revisits_the_pool_of_variants(events: list[Event]) -> None:
    train = [ev for ev in of(events, EpisodeFinished) if ev.purpose == "train"]
    assert len(train) == 24
    assert {(ev.split, ev.variant) for ev in train} == {("train", 0), ("train", 1)}


def test_the_log_verifies_and_the_curves_are_written(run_dir: Path) -> None:
    assert main(["replay", str(run_dir), "--verify"]) == 0
    for name in ("curve_train.csv", "curve_heldout.csv", "updates.csv", "curves.png"):
        assert (run_dir / name).stat().st_size > 0
    # 24 training episodes: fewer than the 64 a long run's points hold (it was header only)
    rows = (run_dir / "curve_train.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == list(range(2, 25, 2))
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["v000001", "v000002", "v000003"]


def test_the_run_holds_every_invariant(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``coevo check``: every invariant that applies to a GRPO run (advantages re-derived)."""
    assert main(["check", str(run_dir)]) == 0
    held = capsys.readouterr().out.splitlines()[0]
    assert "(completed) hold 7 invariants" in held and "credit" in held, held


def test_generate_mode_learns_from_free_text(tmp_path: Path) -> None:
    """Free-text actions: token-level samples, invalid answers recorded and still trained on."""
    text = TINY.replace("[policy]\n", '[policy]\nmode = "generate"\nmax_new_tokens = 6\n')
    text = text.replace("episodes = 24", "episodes = 8").replace("every = 2", "every = 0")
    text = text.replace("final_episodes = 9", "final_episodes = 0")  # no evaluation at all
    out = run_scenario(tmp_path, text)
    events = read_events(out)
    sampled = of(events, ActionSampled)
    assert sampled and all(s.mode == "generate" and not s.candidates for s in sampled)
    for s in sampled:
        assert len(s.response_ids) == len(s.token_logps) <= 6
        assert s.logp == pytest.approx(sum(s.token_logps))
    requests = of(events, ActionRequested)
    assert all("actions: " in dict(r.messages)["user"] for r in requests)  # listed when generating
    (update,) = of(events, PolicyUpdated)
    assert update.samples == len(sampled)
    assert main(["replay", str(out), "--verify"]) == 0


def test_a_run_whose_updates_change_nothing_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every episode cut at its first turn fails alike: every advantage is 0 and no update
    changes a weight, while the summary said ``updates: 3`` as for any run."""
    cut = TINY.replace("pool = 2", "pool = 2\nmax_turns = 1")
    run = run_scenario(tmp_path, cut)
    updates = of(read_events(run), PolicyUpdated)
    assert updates and all(u.digest == u.parent_digest for u in updates)
    err = capsys.readouterr().err
    assert f"none of the run's {len(updates)} policy updates changed its weights" in err


def test_a_memory_that_stayed_empty_all_run_is_said() -> None:
    """An extractor that never wrote an operation (``plain_add = false``) left the bank empty
    all run, every guided episode was shown nothing, and the run ended as if it were
    Complementary RL."""
    from collections import Counter

    from scenarios.cli.finish import _memory_empty  # pyright: ignore[reportPrivateUsage]

    counts = Counter(extractor_called=48, tips_retrieved=16)
    said = _memory_empty(counts)
    assert said.startswith(
        "coevo: warning: the memory stayed empty all run: its 48 extractor calls stored no "
        "entry, so its 16 retrievals showed nothing"
    ), said
    assert "1 reflection stored" in _memory_empty(Counter(tip_proposed=1))
    assert _memory_empty(counts + Counter(tip_stored=1)) == ""
    assert _memory_empty(Counter(tips_retrieved=3)) == ""  # asked to write nothing: GRPO


def test_a_run_whose_every_episode_was_cut_off_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A world that never says done: every episode was truncated at the turn limit, and the
    run ended with "success 0.0%" and nothing more."""
    cut = TINY.replace("pool = 2", "pool = 2\nmax_turns = 1")
    run = run_scenario(tmp_path, cut)
    err = capsys.readouterr().err.replace("\n", " ")
    ended = of(read_events(run), EpisodeFinished)
    said = f"all {len(ended)} of the run's finished episodes were cut off at [world] max_turns"
    assert said in err, err


TRAIN_FAILS = """
from scenarios.worlds.minilab import MiniLab


class W(MiniLab):  # training variants fail at their first step; held-out ones play
    def reset(self, task, seed):
        self.split = task.split
        return super().reset(task, seed)

    def step(self, action):
        if self.split == "train":
            raise RuntimeError("the training simulator is down")
        return super().step(action)
"""


def failing_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, code: str) -> Path:
    """The tiny scenario on the plug-in world ``module:W`` (``code``), run with --quiet to its
    exit 1 (every episode of a kind aborted); its run directory."""
    (tmp_path / f"{module}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = TINY.replace("[world]\n", f'[world]\nname = "{module}:W"\n').replace(
        "[policy.embedded]\n", '[policy.embedded]\nworld = "minilab"\n'
    )
    (tmp_path / "scenario.toml").write_text(text)
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert main(["run", str(tmp_path / "scenario.toml"), "--out", str(out), "--quiet"]) == 1
    return out


def test_a_run_whose_every_training_episode_aborted_exits_1_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Evaluation played on, so some episodes finished: the run trained on nothing all the
    same, and it says that (not that every group's episodes scored alike) and exits 1."""
    out = failing_run(tmp_path, monkeypatch, "train_fails", TRAIN_FAILS)
    err = capsys.readouterr().err
    assert "completed, but all 24 of its training episodes were aborted (the first: " in err, err
    assert "RuntimeError: the training simulator is down" in err
    assert "none of the run's" not in err  # not the unchanged-policy warning: its cause is wrong
    events = list(read_events(out))
    assert any(isinstance(e, EpisodeFinished) and e.purpose == "eval" for e in events)
    assert isinstance(events[-1], RunStopped) and events[-1].exit_code == 1, events[-1]


def test_a_run_whose_every_evaluation_episode_aborted_exits_1_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Held-out worlds that fail every episode: the run printed held-out success 0.0% at
    every round and exited 0, with nothing at all under --quiet; a figure made of aborts
    measures nothing."""
    held = TRAIN_FAILS.replace('self.split == "train"', 'self.split != "train"')
    out = failing_run(tmp_path, monkeypatch, "held_fails", held)
    err = capsys.readouterr().err
    assert " of its evaluation episodes were aborted (the first: " in err, err
    events = list(read_events(out))
    assert isinstance(events[-1], RunStopped) and events[-1].exit_code == 1, events[-1]


def test_the_credit_audit_of_a_grpo_run_names_no_subgroup_settings(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GRPO (and EMPO2) have no guided and free subgroups: the audit's first line does not
    print Complementary RL's split/weighted settings as if they applied."""
    capsys.readouterr()
    assert main(["audit", str(run_dir), "credit"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "no extractor credit in this run; advantages with the run's std_norm" in first, first
    assert "split=" not in first and "weighted=" not in first, first
    assert main(["audit", str(run_dir), "credit", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)  # not true: a script read subgroups there
    assert (answer["split"], answer["weighted"]) == (None, None)
    for setting in ("split=false", "weighted=true"):  # accepted, and called a counterfactual
        assert main(["audit", str(run_dir), "credit", "--set", setting]) == 2
        err = capsys.readouterr().err
        assert f"--set {setting}: run.method = 'grpo' has no guided and free subgroups" in err
    assert main(["audit", str(run_dir), "credit", "--set", "std_norm=false"]) == 0
    capsys.readouterr()
    assert main(["audit", str(run_dir), "credit", "--entry", "0"]) == 2  # no "audit tip 0"
    err = capsys.readouterr().err
    assert "--entry 0: this run credits no entry (no entry an extractor wrote" in err, err
    assert main(["audit", str(run_dir), "tip", "0"]) == 2  # it said only "no entry 0"
    err = capsys.readouterr().err
    assert "no entry 0 in this run: it has stored no entry" in err, err


def _killed_after_first_update(
    run_dir: Path, killed: Path, models: bool = True, checkpoint: bool = True
) -> tuple[int, str]:
    """A copy of ``run_dir`` as if killed after its first policy update: its checkpoint kept
    unless not ``checkpoint``, its metadata without the model directories it started from
    unless ``models``. Returns the number of events kept and the checkpoint's name."""
    import shutil

    import msgspec

    source = LmdbEventLog.open(run_dir / "log", writable=False)
    try:
        envs = list(source.read(0, None))
        meta = source.read_meta()
    finally:
        source.close()
    assert meta is not None and meta.models
    meta = meta if models else msgspec.structs.replace(meta, models={})
    first = next(i for i, e in enumerate(envs) if isinstance(e.event, PolicyUpdated))
    log = LmdbEventLog.create(killed / "log", meta, durable=False)
    try:
        log.append(envs[: first + 1])
    finally:
        log.close()
    shutil.copy(run_dir / "scenario.toml", killed / "scenario.toml")
    name = envs[first].event.checkpoint
    if checkpoint:
        shutil.copytree(run_dir / name, killed / name)
    return first + 1, name


def test_a_run_without_the_checkpoint_it_resumes_from_is_refused_before_it_plays(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A killed run whose newest checkpoint was gone played a session's episodes before its
    learner failed (ResumeDiverged, exit 1), growing the log on every try; a copy taken while
    the run pruned that checkpoint said it was complete."""
    import shutil

    killed = tmp_path / "killed"  # the run as killed after its first update, checkpoints lost
    kept, checkpoint = _killed_after_first_update(run_dir, killed, checkpoint=False)
    assert main(["resume", str(killed), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"cannot be resumed: the policy's {checkpoint} (the newest its log names" in err, err
    assert len(read_events(killed)) == kept  # nothing played, nothing written
    assert main(["copy", str(killed), str(tmp_path / "copy")]) == 1
    err = capsys.readouterr().err
    assert f"coevo: error: the copy lacks the policy's {checkpoint}, the newest its log" in err
    assert main(["copy", str(run_dir), str(tmp_path / "whole")]) == 0  # it has them all
    # the weights there, their optimiser's state not: refused as well (it played first)
    shutil.copytree(run_dir / checkpoint, killed / checkpoint)
    (killed / checkpoint / "optimizer.safetensors").unlink()
    assert main(["resume", str(killed), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"resumed: the policy's {checkpoint}/optimizer.safetensors (the newest its" in err, err
    assert len(read_events(killed)) == kept
    # there, but cut short or emptied: refused too (it played, then the learner refused it)
    for file, size in (("optimizer.safetensors", 0), ("model.safetensors", 1000)):
        shutil.copytree(run_dir / checkpoint, killed / checkpoint, dirs_exist_ok=True)
        os.truncate(killed / checkpoint / file, size)
        assert main(["resume", str(killed), "--quiet"]) == 2, file
        err = capsys.readouterr().err
        assert f"resumed: the policy's {checkpoint}/{file} (" in err and "is damaged" in err, err
        assert len(read_events(killed)) == kept


def test_commands_that_go_on_with_a_run_load_its_own_embedded_model(
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run made before the embedded model's recipe changed (a new coevo) could not be
    resumed, re-executed, replayed in a what-if or probed on the machine that made it: each
    built the embedded model by today's recipe, under another cache key, which the run's
    checkpoints and digests did not fit, while the run's own model was still in the cache
    with the files the run recorded. Now they load that one, and build nothing."""
    import agents.models.embedded

    def built(*args: object, **kwargs: object) -> None:
        raise AssertionError("the embedded model was built again")

    killed = tmp_path / "killed"
    _killed_after_first_update(run_dir, killed)
    monkeypatch.setattr(agents.models.embedded, "ensure_embedded", built)
    monkeypatch.setenv("COEVO_CACHE", str(run_dir.parent / "cache"))
    assert main(["replay", str(run_dir), "--reexecute-learner"]) == 0
    # a --set of an update's own settings changed nothing and said nothing of it
    assert main(["replay", str(run_dir), "--reexecute-learner", "--set", "grpo.lr=0.5"]) == 0
    assert "coevo: note: --set grpo.lr=0.5 was not read: each update" in capsys.readouterr().err
    monkeypatch.undo()  # a --set of the embedded recipe builds that model (it was ignored)
    monkeypatch.setenv("COEVO_CACHE", str(run_dir.parent / "cache"))
    other = ["--set", "policy.embedded.hidden_size=48"]
    assert main(["replay", str(run_dir), "--reexecute-learner", *other]) == 1
    err = capsys.readouterr().err
    assert "--set policy.embedded.hidden_size=48 gives another model than the one the run" in err
    monkeypatch.setattr(agents.models.embedded, "ensure_embedded", built)
    episode = next(
        e.episode
        for e in read_events(run_dir)
        if isinstance(e, ActionSampled) and e.policy_version == 1
    )
    assert main(["audit", str(run_dir), "whatif", episode, "--version", "0"]) == 0
    monkeypatch.undo()  # a what-if's base built by another recipe names the --set that did it
    monkeypatch.setenv("COEVO_CACHE", str(run_dir.parent / "cache"))
    capsys.readouterr()
    assert main(["audit", str(run_dir), "whatif", episode, "--version", "0", *other]) == 2
    err = capsys.readouterr().err
    assert "(--set policy.embedded.hidden_size=48 gives another model than the run's)" in err
    monkeypatch.setattr(agents.models.embedded, "ensure_embedded", built)
    assert main(["resume", str(killed), "--quiet"]) == 0
    assert isinstance(read_events(killed)[-1], RunStopped)


def test_a_run_whose_checkpoint_does_not_fit_today_s_model_is_refused_before_it_plays(
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run that does not record the model it started from (made before 2026-12-03), its
    embedded model built again by a newer recipe with a vocabulary of another size, failed
    its resume with torch's "size mismatch" after writing its first events."""
    from safetensors.torch import load_file, save_file

    killed = tmp_path / "killed"
    kept, checkpoint = _killed_after_first_update(run_dir, killed, models=False)
    weights = killed / checkpoint / "model.safetensors"
    state = load_file(weights)
    rows = state["model.embed_tokens.weight"].shape[0]
    grown = state["model.embed_tokens.weight"].repeat(2, 1)
    state["model.embed_tokens.weight"] = grown
    save_file(state, weights)
    monkeypatch.setenv("COEVO_CACHE", str(run_dir.parent / "cache"))
    assert main(["resume", str(killed), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"the policy's checkpoint of version 1 ({checkpoint}) does not fit the policy" in err
    assert f"(model.embed_tokens.weight: ({2 * rows}, 32) in the checkpoint, ({rows}, 32)" in err
    assert "the run does not record the model directories it started from" in err, err
    assert len(read_events(killed)) == kept  # nothing written
    # a run that records its model: the directory is as recorded, so the checkpoint is at fault
    recorded = tmp_path / "recorded"
    kept, _ = _killed_after_first_update(run_dir, recorded)
    save_file(state, recorded / checkpoint / "model.safetensors")
    assert main(["resume", str(recorded), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "so the checkpoint is not the one the run wrote (replaced or damaged)" in err, err
    assert len(read_events(recorded)) == kept


def test_a_world_that_offers_many_actions_is_said_to_slow_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A world offering 10,000 admissible actions ran for minutes (every one scored each
    turn and in each update) with no word, which read as a hang: the first such turn of each
    worker is warned of (here above 5, minilab's lists being short)."""
    import json

    from agents.acting import env_worker

    monkeypatch.setattr(env_worker, "MANY_ACTIONS", 5)
    text = TINY.replace("episodes = 24", "episodes = 8").replace("every = 2", "every = 0")
    text = text.replace("final_episodes = 9", "final_episodes = 0")
    run = run_scenario(tmp_path, text)
    logged = [json.loads(line) for line in (run / "coevo.jsonl").read_text().splitlines()]
    said = [e for e in logged if e["event"].startswith("many admissible actions")]
    assert 1 <= len(said) <= 3 and all(e["actions"] > 5 for e in said), said  # once a worker
    assert said[0]["level"] == "warning" and said[0]["at"].startswith("world.reset(")
