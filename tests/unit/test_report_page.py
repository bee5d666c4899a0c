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
