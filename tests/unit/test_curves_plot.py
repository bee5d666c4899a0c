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
