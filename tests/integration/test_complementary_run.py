"""A tiny Complementary RL run end to end through the CLI: the extractor fills the bank, guided
episodes use its entries, credit flows back to the calls that wrote them, both models' weights
change, every credit, extractor request and subgroup advantage re-derives from the log, and the
log verifies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from bench_import import load_bench
from test_grpo_run import TINY, of, read_events, run_scenario

from agents.events.episodes import EpisodeAssigned, EpisodeFinished
from agents.events.extractor import (
    CreditAssigned,
    ExtractionRequested,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
    MergeDue,
    MergeRequested,
)
from agents.events.memory import RetrievalRequested, TipRejected, TipsRetrieved, TipStored
from agents.events.policy import (
    AdvantagesComputed,
    EvalRoundFinished,
    GradientRequested,
    PolicyUpdated,
)
from agents.learning.credit_actor import CreditBook, CreditSettings
from agents.methods.advantages import subgroup_advantages, subgroup_weights
from engine.events import Event
from scenarios.cli import main
from stores.checkpoints import param_digest
from stores.model_dirs import load_model_dir

COMPLEMENTARY = (
    TINY.replace('name = "tiny-grpo"', 'name = "tiny-complementary"')
    .replace('method = "grpo"', 'method = "complementary"')
    .replace("episodes = 24", "episodes = 32")
    .replace("temperature = 5.0", "temperature = 10.0")  # varied outcomes, so varied credit
    .replace(
        "[logging]",
        '[complementary]\nwarmup = 1\nmerge_every = 2\nbatch = 3\nembedder = "hashing"\n'
        'max_new_tokens = 12\nlr = 0.05\ncredit = "score"\nextractor = "embedded-ops"\n\n'
        "[complementary.ops]\nepisodes_per_family = 3\nsteps = 8\nwarmup = 1\nchecks = 1\n\n"
        "[logging]",
    )
)
SETTINGS = CreditSettings(batch=3, lr=0.05, rule="score")
NO_EVAL = COMPLEMENTARY.replace("\nevery = 2", "\nevery = 0").replace(
    "final_episodes = 9", "final_episodes = 0"
)
"""The run without evaluation rounds (nor a final one: ``validate`` refuses one without them)."""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("complementary")
    run_scenario(path, COMPLEMENTARY)
    return path


@pytest.fixture(scope="module")
def events(root: Path) -> list[Event]:
    return read_events(root / "run")


def test_groups_split_into_guided_and_free_halves_after_the_warm_up(events: list[Event]) -> None:
    train = [e for e in of(events, EpisodeAssigned) if e.purpose == "train"]
    assert all(e.extract and not e.reflect for e in train)
    rollouts = [e.rollout for e in train]
    assert rollouts[:8] == ["plain"] * 8  # warm-up: one step of 2 groups of 4
    assert rollouts[8:] == ["guided", "guided", "plain", "plain"] * 6
    guided = {e.episode for e in train if e.rollout == "guided"}
    trained = {e.episode for e in train}
    asked = [r for r in of(events, RetrievalRequested) if r.episode in trained]
    assert {r.episode for r in asked} == guided
    assert all(r.turn == 0 and r.rule == "diverse" and r.k == 1 for r in asked)
    requests = of(events, GradientRequested)
    assert [r.update for r in requests] == [0, 1, 2]  # no update for the warm-up step


def test_subgroup_advantages_re_derive_from_rewards(events: list[Event]) -> None:
    for g in of(events, AdvantagesComputed):
        assert g.rule == "subgroup-mean-weighted-score"
        flags = [r == "guided" for r in g.rollouts]
        adv = subgroup_advantages(g.rewards, flags, std_norm=False, eps=g.eps)
        weighted = [a * w for a, w in zip(adv, subgroup_weights(flags), strict=True)]
        assert list(g.advantages) == weighted


def test_every_episode_goes_to_the_extractor_and_its_operations_are_applied(
    events: list[Event],
) -> None:
    train = {e.episode for e in of(events, EpisodeFinished) if e.purpose == "train"}
    assert {r.episode for r in of(events, ExtractionRequested)} == train
    calls = {c.call: c for c in of(events, ExtractorCalled)}
    assert {c.source for c in calls.values() if c.task == "extract"} == train
    stored = of(events, TipStored)
    assert stored, "plain notes are read as adds: the bank should fill"
    for tip in stored:
        op = calls[tip.call].ops[0]
        assert op[0] in ("add", "update", "merge", "rewrite") and op[2].strip() == tip.text
    writes = sum(1 for c in calls.values() for op in c.ops if op[0] != "return")
    refused = len(of(events, TipRejected))
    assert len(stored) + refused >= writes - sum(
        1 for c in calls.values() for op in c.ops if op[0] == "discard"
    )
    merges = of(events, MergeRequested)
    assert merges and {m.step for m in merges} == {d.step for d in of(events, MergeDue)}


def test_credits_and_extractor_requests_re_derive_from_the_log(events: list[Event]) -> None:
    book = CreditBook()
    derived: list[Event] = []
    for ev in events:
        if isinstance(ev, TipsRetrieved | EpisodeFinished):
            derived += book.decide(ev, SETTINGS)
    recorded = [ev for ev in events if isinstance(ev, CreditAssigned | ExtractorGradientRequested)]
    assert derived == recorded
    credits = of(events, CreditAssigned)
    assert credits
    writer = {t.tip_id: t.call for t in of(events, TipStored)}
    score = {e.episode: e.score for e in of(events, EpisodeFinished)}
    for c in credits:
        assert c.call == writer[c.entry] and c.credit == 2 * score[c.episode] - 1


def test_both_models_change(root: Path, events: list[Event]) -> None:
    (model_dir,) = (root / "cache" / "embedded").glob("*[!k]")
    (ops_dir,) = (root / "cache" / "extractor").glob("*[!k]")  # "embedded-ops"
    start = param_digest(load_model_dir(model_dir, torch.device("cpu"))[0])
    policy = of(events, PolicyUpdated)
    assert any(u.digest != start for u in policy)
    start = param_digest(load_model_dir(ops_dir, torch.device("cpu"))[0])
    extractor = of(events, ExtractorUpdated)
    assert [u.update for u in extractor] == [
        r.update for r in of(events, ExtractorGradientRequested)
    ]
    trained = [u for u in extractor if u.samples > 0]
    assert trained, "some extractor batch should carry unequal credit"
    assert trained[-1].digest != start and trained[0].grad_norm > 0


def test_the_log_verifies(root: Path) -> None:
    assert main(["replay", str(root / "run"), "--verify"]) == 0


def test_the_run_holds_every_invariant(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``coevo check``: every invariant of a Complementary RL run, lineage and credit too."""
    assert main(["check", str(root / "run")]) == 0
    held = capsys.readouterr().out.splitlines()[0]
    assert "(completed) hold 8 invariants" in held and "credit" in held, held
    assert "lineage" in held


def test_every_evaluation_round_is_played_without_and_with_the_bank(events: list[Event]) -> None:
    rounds = of(events, EvalRoundFinished)
    assert sorted(r.round for r in rounds if not r.memory) == [0, 1, 2]
    assert sorted(r.round for r in rounds if r.memory) == [0, 1, 2]
    evals = [e for e in of(events, EpisodeAssigned) if e.purpose == "eval"]
    with_bank = [e for e in evals if e.rollout == "guided"]
    assert len(with_bank) == len(evals) // 2 == 6 + 6 + 9  # the last round: final_episodes
    last = [r for r in rounds if r.round == 2]
    assert [r.episodes for r in last] == [9, 9]
    assert all(e.scope == "train" and not e.extract for e in with_bank)
    asked = {r.episode: r.slot for r in of(events, RetrievalRequested)}
    assert all(asked[e.episode] == f"train/{e.family}" for e in with_bank)
    # evaluation reads the training bank without counting its picks
    shown = {e.episode for e in with_bank}
    assert all(r.read_only == (r.episode in shown) for r in of(events, RetrievalRequested))
    assert all(t.read_only == (t.episode in shown) for t in of(events, TipsRetrieved))


def test_the_audit_re_derives_the_run_and_explains_its_entries(
    root: Path, events: list[Event], capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(root / "run")
    assert main(["audit", run, "credit", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["match"]
    credits = of(events, CreditAssigned)
    entry = credits[0].entry
    assert main(["audit", run, "tip", str(entry), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["origin"]["call"] == credits[0].call
    mine = [(c.episode, c.credit) for c in credits if c.entry == entry]
    assert [(c["episode"], c["credit"]) for c in answer["credits"]] == mine
    assert {u["episode"] for u in answer["uses"]} >= {e for e, _ in mine}
    guided = next(c.episode for c in credits)
    assert main(["audit", run, "episode", guided, "--json"]) == 0
    episode = json.loads(capsys.readouterr().out)
    assert (
        episode["credit"]["entry"] == entry and episode["turns"][0]["retrieved"][0]["tip"] == entry
    )


def test_the_headline_reads_the_last_round_with_and_without_the_bank(root: Path) -> None:
    headline = load_bench("headline")
    got = headline.read_run(root / "run")
    assert got is not None
    final = headline.final_of(got[0])
    assert len(final.plain) == len(final.bank) == 9 and not final.adapt
    lines = headline.table(headline.summarize({"c": [final]}, ("fetch",)), ("fetch",))
    assert lines[2].startswith("| c | 1 |") and lines[3] == ""
    assert lines[4].startswith("With its bank minus without, paired over the same held-out tasks")
    assert "c: fewer than 3 seeds" in lines[-1]


def test_the_headline_counts_training_episodes_by_mode(root: Path, events: list[Event]) -> None:
    modes = load_bench("headline_logs").modes_of(read_events(root / "run"))
    assert len(modes.success["plain (warm-up)"]) == 8  # one warm-up step of 2 groups of 4
    train = [e for e in of(events, EpisodeAssigned) if e.purpose == "train"]
    assert len(modes.success["guided"]) == sum(e.rollout == "guided" for e in train)
    assert sum(map(len, modes.success.values())) == len(train)
    assert set(modes.kl) == {"mixed"} and not modes.first_adapt


def test_a_slow_extractor_finishes_its_work_before_the_run_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An extractor slower than the policy left extraction and merge requests unanswered when
    the trainer's last update and round ended the run: their work was lost, and ``replay
    --verify`` and ``check`` refused the completed run."""
    import time

    from agents.memory.extractor import ExtractorModel

    answer = ExtractorModel.answer

    def slow(self: ExtractorModel, *args: object, **kwargs: object) -> object:
        time.sleep(2.0)  # in the extractor's thread: the rest of the run goes on
        return answer(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ExtractorModel, "answer", slow)
    scenario = NO_EVAL  # the last update ends it
    run = run_scenario(tmp_path, scenario.replace("episodes = 32", "episodes = 24"))
    events = read_events(run)
    asked = len(of(events, ExtractionRequested)) + len(of(events, MergeRequested))
    assert asked and len(of(events, ExtractorCalled)) == asked
    asked_updates = len(of(events, ExtractorGradientRequested))
    assert len(of(events, ExtractorUpdated)) == asked_updates
    assert main(["replay", str(run), "--verify"]) == 0
    assert main(["check", str(run)]) == 0, capsys.readouterr().out


def test_a_merge_pass_planned_late_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A merge pass asked for with the last update, which the memory actor plans after the
    update has landed: the run used to complete without it (the pass lost, and ``check``
    refused the log); the trainer now waits for its plan and its chunks' answers."""
    import trio

    from agents.events.extractor import MergePlanned
    from agents.memory.memory_actor import MemoryActor

    apply = MemoryActor._apply_vectors

    async def late(self: MemoryActor, ctx: object, bank: object, batch: list, *rest: object):
        if any(isinstance(env.event, MergeDue) for env in batch):
            await trio.sleep(3.0)  # the last update lands meanwhile
        return await apply(self, ctx, bank, batch, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(MemoryActor, "_apply_vectors", late)
    scenario = NO_EVAL.replace("episodes = 32", "episodes = 24")  # steps 0 (warm-up), 1, 2
    # a pass with the last update only, which ends the run
    scenario = scenario.replace("merge_every = 2", "merge_every = 3")
    run = run_scenario(tmp_path, scenario)
    events = read_events(run)
    [due] = of(events, MergeDue)
    [planned] = of(events, MergePlanned)
    assert due.step == planned.step == 2 and planned.requests > 0
    assert len(of(events, MergeRequested)) == planned.requests
    # the pass was planned after the last update: the run waited for it
    assert events.index(planned) > events.index(of(events, PolicyUpdated)[-1])
    assert main(["check", str(run)]) == 0, capsys.readouterr().out
    assert main(["replay", str(run), "--verify"]) == 0


def test_an_extractor_update_asked_for_late_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A credit actor that reaches the last step's episode ends after the last policy update
    has landed: its extractor update request came after the run had completed (the request
    lost, the log's credits no longer re-derived). The trainer now asks it to settle and
    completes only once its answer, and the update asked for before it, are in."""
    import trio

    from agents.events.extractor import CreditsDue, CreditsSettled
    from agents.learning.credit_actor import CreditActor
    from engine.actor import Context

    handle, emit = CreditActor.handle, Context.emit
    slept: list[str] = []
    due: list[CreditsDue] = []

    async def seen(self: Context, ev: Event, *args: object, **kwargs: object) -> None:
        await emit(self, ev, *args, **kwargs)  # type: ignore[arg-type]
        if isinstance(ev, CreditsDue):
            due.append(ev)

    async def late(self: CreditActor, ctx: object, ev: Event) -> bool:
        last_step = isinstance(ev, EpisodeFinished) and int(ev.episode[2:]) >= 24
        if last_step and not slept:  # the step's other ends wait behind it in the mailbox
            slept.append(ev.episode)
            with trio.fail_after(300):  # until the last update landed and settling was asked
                while not due:  # (a fixed sleep lost the race on a loaded machine)
                    await trio.sleep(0.05)
        return await handle(self, ctx, ev)  # type: ignore[arg-type]

    monkeypatch.setattr(Context, "emit", seen)
    monkeypatch.setattr(CreditActor, "handle", late)
    scenario = NO_EVAL.replace(
        "batch = 3",
        "batch = 2",  # every other credited episode asks for an update
    )
    run = run_scenario(tmp_path, scenario)
    events = read_events(run)
    asked = of(events, ExtractorGradientRequested)
    assert slept and len(of(events, ExtractorUpdated)) == len(asked)
    # the last request came after the last policy update: the run waited for it
    assert events.index(asked[-1]) > events.index(of(events, PolicyUpdated)[-1])
    [due], [settled] = of(events, CreditsDue), of(events, CreditsSettled)
    assert settled.updates == len(asked) and events.index(due) < events.index(settled)
    assert main(["check", str(run)]) == 0, capsys.readouterr().out
    assert main(["replay", str(run), "--verify"]) == 0


def test_a_run_stopped_while_its_credits_are_due_settles_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped (SIGINT) after the trainer asked the credit actor to settle and before the
    answer: the resumed trainer does not ask again, the resumed credit actor folds the ends
    it had not reached and answers, and the run completes with every request answered."""
    import os
    import signal

    import trio

    from agents.events.extractor import CreditsDue, CreditsSettled
    from agents.learning.credit_actor import CreditActor

    handle = CreditActor.handle
    stopping: list[bool] = []

    async def stop_late(self: CreditActor, ctx: object, ev: Event) -> bool:
        if isinstance(ev, CreditsDue) and not stopping:
            stopping.append(True)
            os.kill(os.getpid(), signal.SIGINT)  # the run stops with this answer owed
            await trio.sleep(30.0)
        return await handle(self, ctx, ev)  # type: ignore[arg-type]

    monkeypatch.setattr(CreditActor, "handle", stop_late)
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(NO_EVAL)
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    assert main(["run", str(scenario), "--out", str(run), "--quiet"]) == 130
    stopped = read_events(run)
    assert len(of(stopped, CreditsDue)) == 1 and not of(stopped, CreditsSettled)
    assert main(["resume", str(run), "--quiet"]) == 0, capsys.readouterr().err
    events = read_events(run)
    [due], [settled] = of(events, CreditsDue), of(events, CreditsSettled)
    asked = of(events, ExtractorGradientRequested)
    assert events.index(due) < events.index(settled)  # asked once, answered after the resume
    assert settled.updates == len(asked) == len(of(events, ExtractorUpdated))
    assert main(["check", str(run)]) == 0, capsys.readouterr().out
    assert main(["replay", str(run), "--verify"]) == 0


@pytest.mark.parametrize(
    ("text", "asked", "played"),
    [
        (TINY, 28, 24),  # GRPO: whole steps of 8, rounded down
        (COMPLEMENTARY, 32, 32),  # warm-up step included: 4 steps of 8, 3 updates
        (COMPLEMENTARY, 39, 32),
    ],
    ids=["grpo rounded", "complementary whole", "complementary rounded"],
)
def test_validate_counts_the_episodes_a_run_plays_and_warns_when_rounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, asked: int, played: int
) -> None:
    """``run.episodes`` not a whole number of steps was rounded down without a word, and
    the count ``validate`` printed (and the progress bar's total: the same number) left out
    the warm-up steps."""
    path = tmp_path / "s.toml"
    episodes = "episodes = 32" if text is COMPLEMENTARY else "episodes = 24"
    path.write_text(text.replace(episodes, f"episodes = {asked}"))
    capsys.readouterr()
    assert main(["validate", str(path)]) == 0
    err = " ".join(capsys.readouterr().err.split())  # rich wraps lines at a space
    assert f", {played} episodes, " in err
    warned = f"run.episodes = {asked} is not a whole number of steps of 8 episodes"
    assert (warned in err) == (asked != played)
    assert (f"the run plays {played}" in err) == (asked != played)
