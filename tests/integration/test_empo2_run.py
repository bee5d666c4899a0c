"""A tiny EMPO2 run end to end through the CLI: tips are written, stored and retrieved, each
update's recorded ratio re-derives from the log and the checkpoints (distillation's two inputs
included), the novelty bonus re-derives from the retrievals, the adaptation test runs, and the
log verifies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from bench_import import load_bench
from test_grpo_run import TINY, of, read_events, run_scenario

from agents.events.episodes import EpisodeAssigned, EpisodeFinished
from agents.events.memory import (
    ReflectionRequested,
    RetrievalRequested,
    TipProposed,
    TipRejected,
    TipsRetrieved,
    TipStored,
)
from agents.events.policy import (
    ActionRequested,
    ActionSampled,
    AdaptRoundFinished,
    AdvantagesComputed,
    GradientRequested,
    PolicyUpdated,
)
from agents.learning.update import Sample, sample_logps
from agents.methods.empo2 import intrinsic_reward
from agents.models.prompts import encode_prompt, strip_tips
from engine.events import Event
from scenarios.cli import main
from stores.checkpoints import DirCheckpoints, load_weights
from stores.model_dirs import load_model_dir

EMPO2 = (
    TINY.replace('name = "tiny-grpo"', 'name = "tiny-empo2"')
    .replace('method = "grpo"', 'method = "empo2"')
    .replace("max_staleness = 1", "max_staleness = 0\nminibatch = 1024\nkeep_checkpoints = 10")
    .replace("episodes = 6\n", "episodes = 6\nadapt_attempts = 2\nadapt_tasks = 2\n")
    .replace(
        "[logging]",
        '[empo2]\np = 1.0\nq = 0.5\ndraw = "episode"\nembedder = "hashing"\n'
        "tip_tokens = 6\nnovelty_coef = 0.5\n\n[logging]",
    )
)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("empo2")
    run_scenario(path, EMPO2)
    return path


@pytest.fixture(scope="module")
def events(root: Path) -> list[Event]:
    return read_events(root / "run")


def test_every_training_episode_is_reflected_on_and_its_tip_stored_or_refused(
    events: list[Event],
) -> None:
    train = {e.episode for e in of(events, EpisodeFinished) if e.purpose == "train"}
    reflected = {r.episode for r in of(events, ReflectionRequested)}
    assert train <= reflected
    proposed = [t.episode for t in of(events, TipProposed)]
    assert sorted(proposed) == sorted(reflected)
    outcome = [e.episode for e in events if isinstance(e, TipStored | TipRejected)]
    assert sorted(outcome) == sorted(proposed)  # exactly one each
    assert of(events, TipStored)


def test_tip_modes_retrieve_every_turn_and_show_the_tips(events: list[Event]) -> None:
    rollout = {e.episode: e.rollout for e in of(events, EpisodeAssigned)}
    asked = {(r.episode, r.turn) for r in of(events, RetrievalRequested)}
    acted = {(a.episode, a.turn) for a in of(events, ActionRequested)}
    assert asked == {k for k in acted if rollout[k[0]] != "plain"}
    found = {(t.episode, t.turn): t for t in of(events, TipsRetrieved)}
    assert set(found) == asked
    shown = [a for a in of(events, ActionRequested) if a.tips]
    assert shown, "later episodes of a variant should see the earlier ones' tips"
    for a in shown:
        assert a.tips == found[a.episode, a.turn].tips


def test_novelty_and_rewards_re_derive_from_the_log(events: list[Event]) -> None:
    similar: dict[str, list[int]] = {}
    for t in of(events, TipsRetrieved):
        similar.setdefault(t.episode, []).append(t.similar)
    outcome = {e.episode: e.score for e in of(events, EpisodeFinished)}
    for g in of(events, AdvantagesComputed):
        assert g.intrinsic_coef == 0.5
        for i, ep in enumerate(g.episodes):
            bonus = intrinsic_reward(similar[ep]) if g.rollouts[i] != "plain" else 0.0
            assert g.intrinsic[i] == bonus and g.outcomes[i] == outcome[ep]
            assert g.rewards[i] == outcome[ep] + 0.5 * bonus


def test_recorded_ratios_re_derive_from_the_log_and_checkpoints(
    root: Path, events: list[Event]
) -> None:
    """Staleness 0 and one minibatch per update: ``ratio_mean`` is the mean over the update's
    turns of pi_v(a | prompt) / pi_old, where distilled turns read the prompt without tips."""
    (model_dir,) = (root / "cache" / "embedded").glob("*[!k]")  # the model, not its lock
    model, tokenizer = load_model_dir(model_dir, torch.device("cpu"))
    turns: dict[str, list[ActionSampled]] = {}
    for s in of(events, ActionSampled):
        turns.setdefault(s.episode, []).append(s)
    updates = of(events, PolicyUpdated)
    checkpoints = DirCheckpoints(root / "run" / "checkpoints", keep=10)
    distilled = 0
    for req, done in zip(of(events, GradientRequested), updates, strict=True):
        if req.update:
            load_weights(model, checkpoints.load(updates[req.update - 1].checkpoint))
        samples = [
            Sample(t, adv, distill=rollout == "distill")
            for ep, adv, rollout in zip(req.episodes, req.advantages, req.rollouts, strict=True)
            for t in turns[ep]
        ]
        assert {s.turn.policy_version for s in samples} == {req.update}
        distilled += sum(1 for s in samples if s.distill and s.turn.bare_prompt_ids)
        with torch.no_grad():
            logp, old, _ = sample_logps(model, samples, tokenizer.pad_token_id, torch.device("cpu"))
        assert done.samples == len(samples)
        assert (logp - old).exp().mean().item() == pytest.approx(done.ratio_mean, abs=1e-5)
    assert distilled, "some distilled turn should have shown tips"


def test_bare_prompts_are_the_prompts_without_the_tips(root: Path, events: list[Event]) -> None:
    (model_dir,) = (root / "cache" / "embedded").glob("*[!k]")
    _, tokenizer = load_model_dir(model_dir, torch.device("cpu"))
    requests = {(a.episode, a.turn): a for a in of(events, ActionRequested)}
    for s in of(events, ActionSampled):
        req = requests[s.episode, s.turn]
        if not req.tips:
            assert s.bare_prompt_ids == ()
            continue
        messages = [{"role": r, "content": c} for r, c in req.messages]
        assert list(s.bare_prompt_ids) == encode_prompt(tokenizer, strip_tips(messages, req.tips))


def test_the_adaptation_rounds_play_attempts_in_a_row(events: list[Event]) -> None:
    rounds = of(events, AdaptRoundFinished)
    assert [(r.policy_version, r.tasks, r.attempts) for r in rounds] == [(0, 2, 2), (3, 2, 2)]
    adapt = [e for e in of(events, EpisodeAssigned) if e.scope.startswith("adapt")]
    assert len(adapt) == 2 * 2 * 2
    assert all(e.purpose == "eval" and e.rollout == "tips" for e in adapt)
    # the second attempt of a task starts only after the first one's tip is settled
    position = {id(e): i for i, e in enumerate(events)}
    settled = {e.episode: position[id(e)] for e in events if isinstance(e, TipStored | TipRejected)}
    by_scope: dict[str, list[EpisodeAssigned]] = {}
    for e in adapt:
        by_scope.setdefault(e.scope, []).append(e)
    for first, second in by_scope.values():
        assert first.reflect and not second.reflect
        assert settled[first.episode] < position[id(second)]


def test_an_adaptation_episode_is_told_apart_from_an_evaluation_rounds(
    root: Path, events: list[Event], capsys: pytest.CaptureFixture[str]
) -> None:
    """The audit and the browser called both kinds of episode "eval": an adaptation test's
    episodes (tips carried from attempt to attempt) read as an evaluation round's."""
    from html import unescape

    from starlette.testclient import TestClient

    from agents.browse.app import make_app
    from scenarios.cli.serve import open_views

    assigned = of(events, EpisodeAssigned)
    adapt = next(e for e in assigned if e.scope.startswith("adapt"))
    plain = next(e for e in assigned if e.purpose == "eval" and not e.scope.startswith("adapt"))
    for ep, said in ((adapt.episode, f"eval ({adapt.scope})"), (plain.episode, "eval")):
        capsys.readouterr()
        assert main(["audit", str(root / "run"), "episode", ep]) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert f", {said}, rollout " in first, first
    views = open_views([str(root / "run")])
    try:
        client = TestClient(make_app(views))
        listed = unescape(client.get("/runs/run?purpose=eval").text)
        assert f"<td>eval ({adapt.scope})</td>" in listed and "<td>eval</td>" in listed
        page = unescape(client.get(f"/runs/run/episodes/{adapt.episode}").text)
        assert f"· eval ({adapt.scope}) ·" in page
    finally:
        for view in views.values():
            view.close()


def test_the_log_verifies(root: Path) -> None:
    assert main(["replay", str(root / "run"), "--verify"]) == 0


def test_the_run_holds_every_invariant(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``coevo check``: every invariant of an EMPO2 run, lineage and credit included."""
    assert main(["check", str(root / "run")]) == 0
    held = capsys.readouterr().out.splitlines()[0]
    assert "(completed) hold 8 invariants" in held and "credit" in held, held
    assert "lineage" in held


def test_the_headline_reads_the_last_round_and_the_adaptation_test(root: Path) -> None:
    headline = load_bench("headline")
    got = headline.read_run(root / "run")
    assert got is not None
    final = headline.final_of(got[0])
    assert len(final.plain) == 9 and not final.bank  # eval.final_episodes in TINY
    assert len(final.adapt) == 2 and all(len(a) == 2 for a in final.adapt.values())
    summary = headline.summarize({"empo2": [final, final]}, ("fetch",))
    row = summary["empo2"]
    assert row["plain"].episodes == 18 and row["plain"].seeds == 2
    assert len(row["attempts"]) == 2 and row["bank"] is None


def test_the_first_rounds_gain_is_a_ratio_only_where_the_first_attempt_ever_succeeded() -> None:
    logs = load_bench("headline_logs")
    never = logs.Modes(first_adapt={"adapt0-t0": [False, True], "adapt0-t1": [False, False]})
    (*_, row) = logs.modes_table({"empo2": [never, never]})
    assert row.endswith("| - |")  # no first success: no ratio, and no error
    once = logs.Modes(first_adapt={"adapt0-t0": [True, True], "adapt0-t1": [False, True]})
    (*_, row) = logs.modes_table({"empo2": [once, once]})
    gain = row.rsplit("|", 2)[1].strip()
    assert gain.startswith("2.0")  # attempt 2: 1.0, attempt 1: 0.5


def test_a_small_mean_kl_keeps_its_digits() -> None:
    """GRPO's mean KL of an update (1.5e-5 and 4.9e-5) read 0.0000 beside another method's
    0.0001: the rounding hid it."""
    logs = load_bench("headline_logs")
    (*_, row) = logs.modes_table({"grpo": [logs.Modes(kl={"free": [1.5e-5, 4.9e-5]})]})
    assert row.endswith("| 2 | 3.2e-05 |"), row


def test_updates_count_the_samples_the_low_probability_mask_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing said how many responses ``[empo2] low_prob_mask`` dropped: a threshold that
    drops them all left every update unchanged, and the run blamed equal scores."""
    text = EMPO2.replace("[policy]\n", '[policy]\nmode = "generate"\nmax_new_tokens = 4\n')
    text = text.replace("episodes = 24", "episodes = 8").replace("every = 2", "every = 0")
    text = text.replace("final_episodes = 9", "final_episodes = 0")
    text = text.replace("adapt_attempts = 2\nadapt_tasks = 2\n", "")
    text = text.replace("[empo2]\n", "[empo2]\nlow_prob_mask = true\nlow_prob_delta = -0.001\n")
    run = run_scenario(tmp_path, text)
    events = read_events(run)
    updates = of(events, PolicyUpdated)
    assert updates and all(u.low_prob_masked == u.samples for u in updates)
    assert all(u.digest == u.parent_digest for u in updates)
    err = capsys.readouterr().err
    total = sum(u.samples for u in updates)
    assert f"EMPO2's low-probability mask dropped all {total} of their samples" in err, err
