"""The run's ``curves.png``: a series of one or a few points is drawn with markers (a line
of one point is not drawn at all: a one-update run's loss panel was blank)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from agents.report.curves import Curves, plot_curves


def drawn(curves: Curves, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    kept = []
    monkeypatch.setattr(plt, "close", kept.append)  # keep the figure to look at
    plot_curves(tmp_path / "curves.png", curves)
    (fig,) = kept
    lines = [line for ax in fig.axes for line in ax.lines]
    plt.close("all")
    return lines


def test_a_single_update_and_a_single_block_are_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    curves = Curves(
        block=16, train=[(16, 0.25, 0.25)], updates=[(1, 0.06, 1.0, 0.0, 0.008, 24, 1.0)]
    )
    lines = drawn(curves, tmp_path, monkeypatch)
    assert len(lines) == 3  # train, loss, KL
    assert all(line.get_marker() == "o" for line in lines)
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_long_series_are_plain_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    train = [(16 * (i + 1), 0.1 * i, 0.1 * i) for i in range(8)]
    lines = drawn(Curves(block=16, train=train), tmp_path, monkeypatch)
    assert [line.get_marker() for line in lines] == ["None"]


def test_the_report_draws_a_run_of_one_point_as_a_marker() -> None:
    """``coevo report``'s panels drew a series of one point as a line of one point: nothing
    (a one-update run's four update panels, a one-episode run's train panels, were blank)."""
    from types import SimpleNamespace

    from agents.report.plots import _lines  # pyright: ignore[reportPrivateUsage]

    fig, ax = plt.subplots()
    runs = [SimpleNamespace(label="one", shown=""), SimpleNamespace(label="many", shown="")]
    rows = {"one": [(1.0, 0.5)], "many": [(1.0, 0.5), (2.0, 0.7)]}
    assert _lines(ax, runs, lambda r: rows[r.label], lw=1.2)  # pyright: ignore[reportArgumentType]
    assert [line.get_marker() for line in ax.lines] == ["o", "None"]
    plt.close(fig)


def test_the_report_caption_names_each_runs_block_when_they_differ() -> None:
    """The caption listed "blocks of 1, 2, 20, 6, 9": sorted as text, unattributed, and with
    the block of a run that had no train curve."""
    from types import SimpleNamespace

    from agents.report.page import _blocks  # pyright: ignore[reportPrivateUsage]

    def run(label: str, block: int, train: bool) -> SimpleNamespace:
        return SimpleNamespace(label=label, curves=SimpleNamespace(block=block, train=[1] * train))

    same = [run("a", 20, True), run("b", 20, True), run("stopped", 1, False)]
    assert _blocks(same) == "Train curves: mean over blocks of 20 training episodes. "  # pyright: ignore[reportArgumentType]
    mixed = [run("a", 20, True), run("b", 6, True), run("stopped", 1, False)]
    assert "blocks of 20 (a), 6 (b) training" in _blocks(mixed)  # pyright: ignore[reportArgumentType]
    assert _blocks([run("stopped", 1, False)]) == ""  # pyright: ignore[reportArgumentType]
