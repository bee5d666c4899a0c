"""The co-evolution fold (bank, retrievals, credit, extractor rewards) and the report's entry
ledger, from hand-written event streams."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from test_curves import finished

from agents.events.extractor import (
    CreditAssigned,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
)
from agents.events.memory import TipEvicted, TipRejected, TipsRetrieved, TipStored
from agents.report.curves import block_size, fold_coevolution, fold_curves, rolling_mean
from agents.report.page import RunData, fold_entries, fold_run, render
from agents.testing.events import extractor_called
from engine.events import Envelope, Event


def stored(tip: int, call: str = "x1", slot: str = "train/heat", parents=()) -> TipStored:
    return TipStored(
        tip_id=tip,
        slot=slot,
        episode="",
        text=f"tip {tip} <b>",
        score=0.0,
        key="k",
        call=call,
        parents=parents,
    )


def retrieved(
    tips: tuple[int, ...], slot: str = "train/heat", episode: str = "ep000001"
) -> TipsRetrieved:
    return TipsRetrieved(
        episode=episode,
        worker="w",
        turn=0,
        slot=slot,
        tip_ids=tips,
        similarities=(1.0,) * len(tips),
        ranks=tuple(range(len(tips))),
        tips=("t",) * len(tips),
        similar=len(tips),
        slot_size=3,
    )


def credit(entry: int, value: float, episode: str) -> CreditAssigned:
    return CreditAssigned(
        episode=episode, entry=entry, call="x1", success=value > 0, credit=value, step=0
    )


def called(call: str) -> ExtractorCalled:
    return extractor_called(call, slot="train/heat", ops=(("add", (), "t"),))


STREAM: list[Event] = [
    called("x1"),
    stored(0),
    stored(1),
    finished(0, True),
    TipRejected(episode="", slot="train/heat", reason="duplicate", duplicate_of=0, call="x1"),
    stored(9, slot="adapt0/heat/1"),  # an adaptation round's memory: not the training bank
    retrieved((0,)),
    retrieved((0, 1)),
    retrieved((1,), slot="adapt0/heat/1"),
    finished(1, False),
    credit(0, 1.0, "ep1"),
    credit(0, -1.0, "ep2"),
    credit(1, -1.0, "ep3"),
    ExtractorGradientRequested(
        update=0,
        step=0,
        calls=("x1",),
        rewards=(0.5, -0.5),
        advantages=(1.0, -1.0),
        weights=(1.0, 1.0),
        credits=("ep1",),
        lr=0.1,
    ),
    ExtractorUpdated(
        extractor_version=1,
        update=0,
        samples=1,
        loss=0.25,
        grad_norm=1.0,
        clip_frac=0.0,
        digest="d",
        checkpoint="extractor/v000001",
        seconds=0.1,
    ),
    TipEvicted(tip_id=1, slot="train/heat", reason="merge"),
    stored(2, parents=(1,)),
]


def test_the_fold_follows_the_training_bank_only() -> None:
    c = fold_coevolution(STREAM)
    assert c.bank == [(0, 1), (0, 2), (2, 1), (2, 2)]
    assert c.bank_ops == [
        (0, "stored"),
        (0, "stored"),
        (1, "rejected:duplicate"),
        (2, "evicted:merge"),
        (2, "stored"),
    ]
    assert c.retrievals == [(2, 1, 3), (2, 2, 3)]  # in the block where ep000001 ended
    assert c.credits == [(2, 1.0), (2, -1.0), (2, -1.0)]
    assert c.extractor == [(2, 0.0, 0.25, 1)]
    assert (c.calls, c.updates, c.trained, c.ops["add"]) == (1, 1, 1, 1)


def test_an_evaluation_round_s_retrievals_are_not_training_retrievals() -> None:
    """A round played with the bank reads the training slots (read-only): its retrievals
    were counted as training ones (112 where a run's training episodes made 48)."""
    from agents.events.episodes import EpisodeAssigned

    def assigned(episode: str, purpose: str) -> EpisodeAssigned:
        return EpisodeAssigned(
            episode=episode, index=0, worker="w", family="heat", variant=0, split="heldout",
            seed=0, purpose=purpose,
        )  # fmt: skip

    held = msgspec.structs.replace(retrieved((1,)), episode="ev1", read_only=True)
    stream = [assigned("ev1", "eval"), assigned("ep", "train"), held, *STREAM]
    assert fold_coevolution(stream).retrievals == fold_coevolution(STREAM).retrievals


def test_a_retrieval_counts_where_its_episode_ended_as_the_train_curve_and_export_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The report's retrieval panels put a retrieval in the block of the episodes ended when
    it was made, drawn at the block's start, while the train curve and ``coevo export`` put an
    episode in the block where it ended, drawn at the block's end: one x, other episodes."""
    from agents.events.episodes import EpisodeAbandoned
    from agents.report import plots
    from agents.report.curves import fold_curves

    stream: list[Event] = [
        retrieved((0,), episode="ep000003"),  # ep3 runs long: it ends fourth
        retrieved((0,), episode="ep000001"),
        retrieved((0, 1, 2), episode="ep000002"),  # a try abandoned: not the episode's
        EpisodeAbandoned(episode="ep000002", worker="w", purpose="train"),
        finished(1, True),
        retrieved((0, 1), episode="ep000002"),  # ep2 played again after its abandoned try
        finished(2, False),
        finished(0, False),
        finished(3, True),
        retrieved((1,), episode="ep000004"),  # ep4 ends in the last block, not yet whole
        finished(4, True),
    ]
    c = fold_coevolution(stream)
    assert c.retrievals == [(1, 1, 3), (2, 2, 3), (4, 1, 3), (5, 1, 3)]
    figures: list = []
    monkeypatch.setattr(plots, "_finish", lambda fig, axes, name: figures.append(fig) or "")
    curves = fold_curves(stream, block=2)
    run = RunData(
        label="r", path=Path("r"), method="empo2", seed=None, scenario="", events=1, status="",
        train_episodes=5, curves=curves, coevolution=c, entries={}, calls={},
    )  # fmt: skip
    plots.retrieval_figure([run])
    per_block, shown = figures[0].axes[:2]
    assert [list(line.get_xdata()) for line in per_block.get_lines()] == [[2, 4]]
    assert [list(line.get_ydata()) for line in per_block.get_lines()] == [[2, 1]]
    assert [list(line.get_ydata()) for line in shown.get_lines()] == [[1.5, 1.0]]
    assert [x for x, *_ in curves.train] == [2, 4]  # the train curve's blocks: the same x


def test_a_long_run_name_is_cut_in_the_figures_not_their_panels() -> None:
    """A run directory of 150 characters or more made ``coevo report`` squeeze its panels to
    nothing, with matplotlib's warning on stderr (the run's name in a legend and a title)."""
    from agents.report import plots
    from agents.report.curves import fold_curves

    name = "n" * 150 + "/run-seed7"
    curves = fold_curves(STREAM, block=1)
    run = RunData(
        label=name, path=Path(name), method="complementary", seed=7, scenario="", events=1,
        status="", train_episodes=2, curves=curves, coevolution=fold_coevolution(STREAM),
        entries={}, calls={},
    )  # fmt: skip
    svg = plots.bank_figures([run])  # (a warning is an error in the tests)
    assert svg.startswith("<svg") and plots.retrieval_figure([run]).startswith("<svg")
    shown = plots.legend_label(name)
    assert len(shown) == plots.LABEL_CHARS and shown.endswith("n/run-seed7")


def test_a_bank_panel_with_nothing_to_draw_says_so() -> None:
    """An outside tester: a run whose training bank never held an entry (its proposals all
    refused) drew an empty 0-1 by 0-1 panel "entries in the training bank", with no word."""
    from agents.report import plots
    from agents.report.curves import fold_curves

    refused = [
        TipRejected(episode="", slot="train/heat", reason="duplicate", duplicate_of=0, call="x1")
    ]
    empty = {"curves": fold_curves([], block=1), "coevolution": fold_coevolution(refused)}
    run = RunData("r", Path("r"), "empo2", 3, "", 1, "", 0, **empty, entries={}, calls={})
    assert run.coevolution.bank_ops and not run.coevolution.bank
    assert "no entry stored in a training bank" in plots.bank_figures([run])


def test_two_long_run_names_cut_alike_are_kept_apart_in_the_figures() -> None:
    """An outside tester: two runs named ``grpo-minilab-embedded-tiny-heat-lr0.001-...-seed3``
    and ``...-lr0.003-...`` both read ``grpo-minilab-embedded-ti…up8-unlock-circuit-seed3``
    in every figure."""
    from agents.report import plots

    a = "grpo-minilab-embedded-tiny-heat-lr0.001-clip0.2-group8-unlock-circuit-seed3"
    b = a.replace("lr0.001", "lr0.003")
    names = plots.figure_names([a, b, "short", "x" * 60, "x" * 60])
    assert "lr0.001" in names[0] and "lr0.003" in names[1] and names[2] == "short"
    assert all(len(n) <= plots.LABEL_CHARS for n in names[:3])
    assert names[3].startswith("4. ") and names[4].startswith("5. ")  # the same name twice
    empty = {"curves": fold_curves([], block=1), "coevolution": fold_coevolution([])}
    runs = [
        RunData(x, Path(x), "grpo", 3, "", 1, "", 0, **empty, entries={}, calls={}) for x in (a, b)
    ]
    render(runs)
    assert [r.shown for r in runs] == plots.figure_names([a, b])


def test_entries_gather_what_the_log_says_of_each() -> None:
    envs = [Envelope(seq=i, run="r", t=0, actor="a", event=ev) for i, ev in enumerate(STREAM)]
    entries, calls = fold_entries(envs)
    assert sorted(entries) == [0, 1, 2]  # tip 9 lives in an adaptation memory
    assert entries[0].credits == [("ep1", 1.0), ("ep2", -1.0)] and entries[0].total == 0.0
    assert entries[0].retrieved == 2 and entries[1].retrieved == 1
    assert entries[1].fate == "merge" and entries[2].parents == (1,)
    assert calls["x1"].seq == 0 and calls["x1"].source == "ep000001"


def test_rolling_mean() -> None:
    assert rolling_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    with pytest.raises(ValueError, match="window"):
        rolling_mean([1.0], 0)


def test_block_size_shrinks_for_short_runs() -> None:
    assert [block_size(n) for n in (0, 25, 320, 1024, 100_000)] == [1, 2, 32, 64, 64]


def test_a_page_escapes_entry_text_and_links_parents_shown(tmp_path: Path) -> None:
    envs = [Envelope(seq=i, run="r", t=0, actor="a", event=ev) for i, ev in enumerate(STREAM)]
    envs.append(Envelope(seq=len(envs), run="r", t=0, actor="a", event=credit(2, 1.0, "ep4")))
    envs.append(Envelope(seq=len(envs), run="r", t=0, actor="a", event=credit(1, 1.0, "ep5")))
    page = render([fold_run("one", tmp_path, "", envs)])
    assert render([fold_run("one", tmp_path, "", envs)]) == page  # the same log, the same bytes
    assert "tip 2 &lt;b&gt;" in page and "tip 2 <b>" not in page
    assert 'id="r0-tip2"' in page and 'id="r0-tip1"' not in page  # 1's credits sum to 0
    assert "<dt>parents</dt><dd>#1</dd>" in page  # not shown, so not a link
    assert "no run_stopped yet: killed (no process writes its log" in page  # none runs


def test_a_report_tells_a_live_run_from_a_killed_one(tmp_path: Path) -> None:
    """A run without a final event read "still running, or killed", where `serve` told the two
    apart: the writer's lock says whether a process still writes the log."""
    import os
    import socket

    from stores.lmdb_env import LOCK_FILE
    from stores.rundir import LOG_DIR

    envs = [Envelope(seq=i, run="r", t=0, actor="a", event=ev) for i, ev in enumerate(STREAM)]
    (tmp_path / LOG_DIR).mkdir()
    assert "killed (no process writes its log" in render([fold_run("one", tmp_path, "", envs)])
    with open(tmp_path / LOG_DIR / LOCK_FILE, "w") as lock:  # held open, as a writer holds it
        lock.write(f"{os.getpid()} {socket.gethostname().replace(' ', '_')}\n")
        lock.flush()
        page = render([fold_run("one", tmp_path, "", envs)])
    assert "no run_stopped yet: live (a process writes its log)" in page


def test_serve_and_report_say_how_a_run_ended_in_the_same_words(tmp_path: Path) -> None:
    """`serve`, `report` and `log --follow` each worked out a run's end state with their own
    wording ("failed" in one, "failed: ValueError" in another): one ``run_state`` now."""
    from engine.lifecycle import RunFailed, RunStopped
    from stores.rundir import run_state

    log = tmp_path / "log"
    assert run_state(RunStopped(reason="completed"), log) == "completed"
    assert run_state(RunStopped(reason="signal:SIGTERM"), log) == "stopped (signal:SIGTERM)"
    failed = RunFailed(error_type="ValueError", message="no")
    assert run_state(failed, log) == "failed (ValueError)"
    assert run_state(None, log) == "killed"  # an empty log no process writes
    envs = [Envelope(seq=i, run="r", t=0, actor="a", event=ev) for i, ev in enumerate(STREAM)]
    envs.append(Envelope(seq=len(envs), run="r", t=0, actor="runtime", event=failed))
    assert "failed (ValueError)" in render([fold_run("one", tmp_path, "", envs)])
