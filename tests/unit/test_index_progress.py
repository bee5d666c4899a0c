"""Indexing a long log for the audit says how it goes (a 4.8M-event log's first question took
32 s in silence): ``refresh`` reports each chunk, and the CLI prints a line at every tenth."""

from __future__ import annotations

import pytest

from agents.audit.index import refresh
from engine.eventlog import MemoryEventLog
from engine.events import Envelope
from engine.lifecycle import RunStarted
from scenarios.cli.console import indexing_lines
from stores.fact_index import MemoryFactIndex


def test_refresh_reports_each_chunk_and_the_cli_a_line_per_tenth(
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = RunStarted(run_id="r", scenario="s", scenario_hash="", seed=0, coevo_version="")
    log = MemoryEventLog()
    log.append([Envelope(seq=i, run="r", t=i, actor="a", event=started) for i in range(95)])
    index = MemoryFactIndex()
    seen: list[tuple[int, int]] = []
    refresh(log, index, chunk=10, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(n, 95) for n in (*range(10, 100, 10), 95)]
    report = indexing_lines(least=50)
    for done, total in seen:
        report(done, total)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "coevo: indexing the log for the audit (once): 10 of 95 events"
    assert lines[-1].endswith("95 of 95 events") and len(lines) == 10
    quiet = indexing_lines(least=1000)
    quiet(95, 95)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("total", [25, 2_001_776 // 1000, 10, 7])
def test_a_long_read_says_each_tenth_once_and_ends_at_its_last_event(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], total: int
) -> None:
    """Lines every ``total // 10`` events came one short of each tenth when ``total`` is not
    a multiple of 10: no line for the first tenth, two at the end (an outside tester, on
    2,001,776 events: first 400,354, then 2,001,770 and 2,001,776)."""
    from types import SimpleNamespace

    from scenarios.cli import console

    monkeypatch.setattr(console, "READ_LINES_LEAST", 1)
    log = SimpleNamespace(next_seq=total, read=lambda start, stop: iter(range(start, stop)))
    assert list(console.reporting(log, "reading").read(0, total)) == list(range(total))
    lines = capsys.readouterr().err.splitlines()
    said = [int(line.rsplit(": ", 1)[1].split(" of ")[0].replace(",", "")) for line in lines]
    assert said == sorted(set(said)) and said[-1] == total, said  # once each, to the end
    assert len(said) == min(10, total) and said[0] == -(-total // 10), said
