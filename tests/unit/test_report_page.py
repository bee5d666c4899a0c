"""Sections of ``coevo report``'s page, given what the runs' logs folded to."""

from __future__ import annotations

import html
from types import SimpleNamespace

from agents.report.curves import Coevolution
from agents.report.page import _bank  # pyright: ignore[reportPrivateUsage]


def test_an_extractor_whose_every_call_was_malformed_is_said_so() -> None:
    """96 extractor calls, all malformed, nothing stored: the page said only "No bank or
    memory (nothing stored) in: c3", the calls' line being shown for runs with operations."""
    wrote_nothing = SimpleNamespace(
        label="c3", method="complementary", coevolution=Coevolution(calls=96, malformed=96)
    )
    text = html.unescape("\n".join(_bank([wrote_nothing])))  # type: ignore[list-item]
    assert "No bank or memory (nothing stored) in: c3 (complementary)." in text
    assert "c3: 96 extractor calls (96 malformed, 0 read as one add); operations: none." in text
    no_extractor = SimpleNamespace(label="g", method="grpo", coevolution=Coevolution())
    assert "extractor calls" not in "\n".join(_bank([no_extractor]))  # type: ignore[list-item]


def test_a_page_of_more_runs_than_colours_says_they_repeat() -> None:
    """Twelve runs: runs 11 and 12 took the colours of runs 1 and 2, without a word."""
    from agents.report.page import _runs_table  # pyright: ignore[reportPrivateUsage]

    def run(i: int) -> SimpleNamespace:
        curves = SimpleNamespace(heldout=[], train_aborted=0, updates=[])
        return SimpleNamespace(
            label=f"r{i}", path=f"runs/r{i}", scenario="grpo", method="grpo", seed=i,
            events=10, train_episodes=4, curves=curves, status="completed",
        )  # fmt: skip

    assert "colours" not in _runs_table([run(i) for i in range(10)])  # type: ignore[misc]
    said = html.unescape(_runs_table([run(i) for i in range(12)]))  # type: ignore[misc]
    assert "12 runs and 10 colours: runs 11 on share the colours of the first 10" in said


def test_the_credit_histogram_of_equal_large_totals_is_drawn() -> None:
    """Every entry's total credit -2e16 (a world scoring 1e16, inside the score limit):
    numpy's ten bins over the value +/- 0.5 do not exist at that size, and ``coevo report``
    stopped with a traceback."""
    from agents.report.page import Entry
    from agents.report.plots import credit_figure

    for total in (-2e16, 0.0, 3.0, 1e100):
        entries = {
            i: Entry(tip_id=i, slot="s", text="t", call="x1", episode="e", parents=(), seq=i,
                     credits=[("ep1", total)])
            for i in range(3)
        }  # fmt: skip
        run = SimpleNamespace(label="c", shown="", entries=entries, coevolution=Coevolution())
        assert "<svg" in credit_figure([run])  # type: ignore[list-item]
