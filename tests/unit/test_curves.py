"""Learning curves folded from events, and the trainer's pure helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.events.episodes import EpisodeAborted, EpisodeFinished
from agents.events.policy import AdaptRoundFinished, EvalRoundFinished, PolicyUpdated
from agents.learning.rounds import eval_tasks
from agents.methods.builtin import rule_name
from agents.methods.settings import GrpoConfig
from agents.report.curves import fold_curves, report, summary_lines
from agents.testing.events import episode_finished, policy_updated
from engine.events import Event
from engine.world import Task


def finished(i: int, success: bool, purpose: str = "train") -> EpisodeFinished:
    return episode_finished(
        f"ep{i:06d}",
        variant=i,
        steps=3,
        score=1.0 if success else 0.1,
        success=success,
        total_reward=1.0,
        purpose=purpose,
    )


def updated(version: int) -> PolicyUpdated:
    return policy_updated(
        version,
        samples=10,
        loss=0.5 / version,
        grad_norm=1.0,
        clip_frac=0.1,
        kl=0.01,
        checkpoint=f"checkpoints/v{version:06d}",
        seconds=0.5,
    )


def test_train_blocks_count_training_episodes_only() -> None:
    events = [finished(i, i % 2 == 0) for i in range(8)]
    events.insert(3, finished(100, True, purpose="eval"))
    curves = fold_curves(events, block=4)
    assert curves.train == [(4, 0.5, pytest.approx(0.55)), (8, 0.5, pytest.approx(0.55))]


def test_an_aborted_training_episode_is_a_failure_in_the_train_curve_and_said() -> None:
    """A world that fails half its training episodes does not show 100% train success (the
    aborted ones count as failures, as held-out evaluation counts them), and the summary says
    how many were aborted; an aborted evaluation episode is not a training one."""
    events: list[Event] = []
    for i in range(8):
        events.append(finished(i, True))
        events.append(EpisodeAborted(episode=f"x{i}", worker="w0", reason="RuntimeError: lost"))
    events.append(EpisodeAborted(episode="e", worker="w0", reason="lost", purpose="eval"))
    curves = fold_curves([*events, updated(1)], block=4)
    assert curves.train == [(4 * k, 0.5, pytest.approx(0.5)) for k in (1, 2, 3, 4)]
    assert curves.train_aborted == 8
    assert (
        "aborted: 8 training episodes (their world failed: counted as failures in the train "
        "curve; no group trains on them)"
    ) in summary_lines(curves)
    assert not any(line.startswith("aborted") for line in summary_lines(fold_curves(events[::2])))


def test_the_summary_gives_each_train_block_its_interval() -> None:
    """Two blocks of 25 episodes (36% and 40%) read as learning; their intervals say how
    little two blocks of one run can tell."""
    from agents.report.intervals import proportion_interval

    events = [finished(i, i % 25 < 9) for i in range(25)]
    events += [finished(25 + i, i % 25 < 10) for i in range(25)]
    curves = fold_curves(events, block=25)
    assert [row[:2] for row in curves.train] == [(25, 0.36), (50, 0.4)]
    assert (
        "train success: first block 36.0% [20%, 55%], last block 40.0% [23%, 59%] "
        "(blocks of 25, 95% intervals)"
    ) in summary_lines(curves)
    assert proportion_interval(0.0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert proportion_interval(1.0, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    with pytest.raises(ValueError, match="n >= 1"):
        proportion_interval(0.5, 0)


def test_heldout_rounds_and_updates_become_rows() -> None:
    events = [
        EvalRoundFinished(
            round=0, policy_version=0, episodes=4, success=0.25, score=0.3, train_episodes=0
        ),
        updated(1),
        updated(2),
        EvalRoundFinished(
            round=1, policy_version=2, episodes=4, success=0.75, score=0.8, train_episodes=64
        ),
    ]
    curves = fold_curves(events)
    assert curves.heldout == [(0, 0, 0.25, 0.3), (64, 2, 0.75, 0.8)]
    assert [row[0] for row in curves.updates] == [1, 2]
    assert summary_lines(curves)[0] == (
        "held-out success: 25.0% [5%, 70%] of 4 at version 0 -> 75.0% [30%, 95%] of 4 at "
        "version 2 (2 rounds, 95% intervals)"
    )


def test_the_bank_round_before_any_training_read_an_empty_bank_and_is_said_so() -> None:
    """The round with the bank at version 0 plays before any training episode ended, so its
    bank is empty: the summary compared it as "with the bank" (0.0% -> ...)."""
    rounds = [
        EvalRoundFinished(
            round=r,
            policy_version=v,
            episodes=4,
            success=s,
            score=s,
            train_episodes=x,
            memory=True,
        )
        for r, v, s, x in ((0, 0, 0.0, 0), (1, 2, 0.25, 64), (2, 4, 0.5, 128))
    ]
    lines = summary_lines(fold_curves([*rounds, updated(1)]))
    assert lines[-1] == (
        "held-out success with the bank: 25.0% at version 2 -> 50.0% at version 4 (not "
        "counted: the earlier round, played before any training episode ended, with an empty "
        "bank)"
    )
    lines = summary_lines(fold_curves([*rounds[1:], updated(1)]))
    assert lines[-1] == "held-out success with the bank: 25.0% at version 2 -> 50.0% at version 4"
    # one round with a filled bank: it was compared with itself ("50.0% at version 1 -> 50.0%
    # at version 1"); the note read as if that round's bank were empty (an outside tester's)
    lines = summary_lines(fold_curves([*rounds[:2], updated(1)]))
    assert lines[-1] == (
        "held-out success with the bank: 25.0% at version 2 (not counted: the earlier round, "
        "played before any training episode ended, with an empty bank)"
    )


def test_report_writes_csv_and_png(tmp_path: Path) -> None:
    events = [finished(i, i % 3 == 0) for i in range(128)] + [updated(1)]
    lines = report(tmp_path, events, title="t")
    assert lines[-1].startswith("curves: curve_train.csv")
    assert (tmp_path / "curve_train.csv").read_text().splitlines()[0] == "episodes,success,score"
    # blocks of 12 (block_size(128)), as coevo report draws them: 10 points
    assert len((tmp_path / "curve_train.csv").read_text().splitlines()) == 1 + 10
    report(tmp_path, [finished(i, True) for i in range(30)] + [updated(1)])
    assert len((tmp_path / "curve_train.csv").read_text().splitlines()) == 1 + 10  # of 3
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_an_adaptation_round_ending_mid_block_leaves_the_train_block_alone() -> None:
    """The adaptation round's scores were read into the train block's running score (a name
    reused): a block of four episodes scoring 1.0 read 0.2625 with a round ending inside it."""
    adapt = AdaptRoundFinished(
        round=0, policy_version=0, tasks=2, attempts=2, success=(0.5, 0.0), score=(0.5, 0.05),
        aborted=0,
    )  # fmt: skip
    events: list[Event] = [finished(i, True) for i in range(4)]
    events.insert(3, adapt)
    curves = fold_curves(events, block=4)
    assert curves.train == [(4, 1.0, pytest.approx(1.0))]
    assert curves.adapt == [(0, 1, 0.5, 0.5), (0, 2, 0.0, 0.05)]


def test_adaptation_rounds_become_rows_a_csv_and_summary_lines(tmp_path: Path) -> None:
    events = [
        AdaptRoundFinished(
            round=0,
            policy_version=0,
            tasks=4,
            attempts=3,
            success=(0.25, 0.25, 0.5),
            score=(0.3, 0.3, 0.6),
            aborted=0,
        ),
        updated(1),
    ]
    curves = fold_curves(events)
    assert curves.adapt == [(0, 1, 0.25, 0.3), (0, 2, 0.25, 0.3), (0, 3, 0.5, 0.6)]
    assert summary_lines(curves)[-1] == (
        "adaptation at version 0 (memory, no update), success by attempt: 25.0% -> 25.0% -> 50.0%"
    )
    report(tmp_path, events)
    rows = (tmp_path / "adaptation.csv").read_text().splitlines()
    assert rows == ["version,attempt,success,score", "0,1,0.25,0.3", "0,2,0.25,0.3", "0,3,0.5,0.6"]


def test_report_of_a_run_without_learning_writes_nothing(tmp_path: Path) -> None:
    assert report(tmp_path, [finished(0, True)]) == []
    assert list(tmp_path.iterdir()) == []


def test_block_must_be_positive() -> None:
    with pytest.raises(ValueError, match="block"):
        fold_curves([], block=0)


def test_eval_tasks_spread_over_the_heldout_tasks() -> None:
    tasks = [Task(family="heat", variant=v, split="heldout") for v in range(10)]
    assert [t.variant for t in eval_tasks(tasks, 5)] == [0, 2, 4, 6, 8]
    assert [t.variant for t in eval_tasks(tasks[:3], 6)] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="no evaluation tasks"):
        eval_tasks([], 3)


def test_rule_names_the_formula() -> None:
    assert rule_name(GrpoConfig()) == "grpo-std-score"
    assert rule_name(GrpoConfig(std_norm=False, reward="success")) == "grpo-mean-success"
