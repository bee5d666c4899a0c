"""The run's progress line: a resumed run starts from what its earlier sessions did, and the
events/s it shows is the rate of the last seconds, not the mean since the start; and the
family table printed at the end."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from agents.events.episodes import EpisodeFinished
from engine.events import Envelope, Event
from scenarios.cli import console as console_module
from scenarios.cli.console import RunProgress


def finished(seq: int, success: bool = True) -> Envelope[Event]:
    ev = EpisodeFinished(
        episode=f"ep{seq:06d}", worker="w0", family="heat", variant=0, split="train",
        steps=1, score=1.0, success=success, total_reward=1.0,
    )  # fmt: skip
    return Envelope(seq=seq, run="r", t=0, actor="w0", event=ev)


def lines(out: io.StringIO) -> list[str]:
    return [line for line in out.getvalue().splitlines() if line.startswith("episodes")]


def test_a_resumed_run_counts_on_from_the_episodes_its_log_holds() -> None:
    out = io.StringIO()
    progress = RunProgress(Console(file=out, width=200, force_terminal=False), 100)
    progress.resume([finished(i, success=i % 2 == 0) for i in range(55)])
    progress.observe([finished(55 + i) for i in range(10)])
    shown = lines(out)
    assert shown and shown[0].startswith("episodes 65/100") and "success" in shown[0]
    assert not any(line.startswith(("episodes 10/", "episodes 20/")) for line in shown)


def updated(seq: int, version: int) -> Envelope[Event]:
    from agents.events.policy import PolicyUpdated

    ev = PolicyUpdated(
        policy_version=version, update=version, samples=8, stale=0, loss=0.0, grad_norm=0.0,
        clip_frac=0.0, kl=0.0, ratio_mean=1.0, ref_kl=0.0, digest="d", checkpoint="",
        seconds=1.0,
    )  # fmt: skip
    return Envelope(seq=seq, run="r", t=0, actor="learner", event=ev)


def test_a_resumed_run_s_update_rate_counts_this_session_s_updates_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a resume the bar divided every update since the run began by this session's
    seconds (v30 at "11.71 upd/s" before its first update), and it showed 0 episodes until
    the session's first commit."""
    now = [1000.0]
    monkeypatch.setattr(console_module.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    progress = RunProgress(Console(file=out, width=200, force_terminal=False), 100)
    history = [finished(i) for i in range(40)] + [updated(40 + v, v) for v in range(1, 31)]
    progress.resume(history)
    assert progress._progress.tasks[0].completed == 40
    now[0] += 3.0
    progress.observe([finished(70)])
    assert "v30 (- upd/s)" in progress._learning()
    for v in (31, 32, 33):  # one update every 10 s
        now[0] += 10.0
        progress.observe([updated(70 + v, v)])
    assert "v33 (0.10 upd/s)" in progress._learning()


def test_events_per_second_is_the_rate_of_the_last_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(console_module.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    progress = RunProgress(Console(file=out, width=200, force_terminal=False), 10**9)
    for _ in range(100):  # 100 s at 10,000 events/s
        now[0] += 1.0
        progress.observe([finished(0, True)] * 10_000)
    for _ in range(30):  # then 30 s at 100 events/s
        now[0] += 1.0
        progress.observe([finished(0, True)] * 100)
    assert progress._rate() == pytest.approx(100, rel=0.2)  # the mean since start: ~7,700


def test_the_family_table_counts_an_aborted_episode_as_a_failure_by_purpose() -> None:
    """72 of 74 episodes aborted and the 2 finished succeeded: 2.7%, not 100%. Training and
    evaluation episodes are rows of their own (a family's success mixed the two: 35.7% where
    training was 44.4% and evaluation 20.0%)."""
    from rich.console import Console as Rich

    from agents.acting.projections import EpisodeRow, EpisodeTableState
    from scenarios.cli.console import families_table

    def row(family: str, purpose: str, status: str, success: bool = False) -> EpisodeRow:
        return EpisodeRow(
            index=0, worker="w", family=family, variant=0, split="train", seed=0,
            purpose=purpose, status=status, steps=5, success=success,
        )  # fmt: skip

    rows = [row("fetch", "train", "finished", True)] * 2 + [row("fetch", "train", "aborted")] * 72
    rows += [row("heat", "train", "aborted")] * 3 + [row("heat", "train", "running")]
    rows += [row("heat", "eval", "finished", True), row("heat", "eval", "finished")]
    state = EpisodeTableState(episodes={f"ep{i}": r for i, r in enumerate(rows)})
    out = Rich(width=100, record=True)
    out.print(families_table(state))
    text = out.export_text()
    lines = [line.split() for line in text.splitlines() if "│" in line]
    cells = [[c for c in line if c != "│"] for line in lines]
    assert ["fetch", "train", "2", "72", "2.7%", "5.0"] in cells, cells
    assert ["heat", "train", "0", "3", "0.0%", "-"] in cells, cells
    assert ["heat", "eval", "2", "0", "50.0%", "5.0"] in cells, cells
    # an outside tester read an eval row as the held-out figure: it pools every evaluation
    assert "eval: every evaluation episode together" in " ".join(text.split())
