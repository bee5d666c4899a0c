"""A resumed run's history (:class:`engine.eventlog.LogHistory`): the log's events read on
demand, behaving as the list of them would, and what ``coevo resume`` and a restart that
rebuilds an actor hand to ``recover`` (a list held 1.5 KB per event for the whole session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.eventlog import LogHistory, MemoryEventLog, new_run_meta
from engine.events import Envelope, Event
from engine.lifecycle import RunStarted
from scenarios.cli.resume import read_history
from stores.lmdb_log import LmdbEventLog


def envelopes(n: int) -> list[Envelope[Event]]:
    started = RunStarted(run_id="r", scenario="s", scenario_hash="", seed=0, coevo_version="")
    return [Envelope(seq=i, run="r", t=i, actor="a", event=started) for i in range(n)]


@pytest.mark.parametrize("n", [0, 1, 300, 1000])
def test_a_log_history_reads_as_the_list_of_its_events(n: int) -> None:
    log = MemoryEventLog()
    events = envelopes(n)
    log.append(events)
    log.append(envelopes(n + 5)[n:])  # written after the history was taken: not in it
    history = LogHistory(log, n)
    assert len(history) == n and bool(history) == bool(n)
    assert list(history) == events and list(history) == events  # read again, the same
    for at in (0, 1, n // 2, -1, -n):
        if -n <= at < n:
            assert history[at] == events[at]
    for at in (n, -n - 1):
        with pytest.raises(IndexError):
            history[at]
    for part in (slice(None), slice(2, 7), slice(-3, None), slice(None, None, 2), slice(5, 1)):
        assert history[part] == events[part]
    assert list(reversed(history)) == events[::-1]


def test_resume_reads_the_log_through_and_hands_it_on_unheld(tmp_path: Path) -> None:
    meta = new_run_meta("r", scenario_name="s", seed=0, coevo_version="test", scenario_toml="")
    log = LmdbEventLog.create(tmp_path / "log", meta, durable=False)
    try:
        log.append(envelopes(500))
        history, newest = read_history(str(tmp_path), log, None)
        assert newest == {}  # no model update in these events
        assert isinstance(history, LogHistory) and len(history) == 500
        assert history[-1].seq == 499 and [e.seq for e in history] == list(range(500))
    finally:
        log.close()
