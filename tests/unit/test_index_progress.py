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
