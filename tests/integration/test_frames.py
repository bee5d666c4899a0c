"""docs/ANALYSIS.md's notebook, run as it stands on the tiny Complementary RL run
(conftest.py), and its results checked against the events themselves."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from test_grpo_run import of, read_events

from agents.analysis.frames import events_frame, events_table
from agents.analysis.frames import read_events as read_envelopes
from agents.events.episodes import EpisodeFinished
from agents.events.extractor import CreditAssigned
from agents.events.policy import PolicyUpdated

DOC = Path(__file__).resolve().parents[2] / "docs" / "ANALYSIS.md"


@pytest.fixture(scope="module")
def notebook(distill_root: Path) -> dict[str, Any]:
    cells = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(cells) == 4
    line = 'run = "runs/tiny-complementary"  # a run directory\n'
    assert line in cells[0]
    cells[0] = cells[0].replace(line, f"run = {str(distill_root / 'run')!r}\n")
    namespace: dict[str, Any] = {}
    for cell in cells:
        exec(compile(cell, str(DOC), "exec"), namespace)
    return namespace


def test_the_notebook_computes_what_the_events_say(
    notebook: dict[str, Any], distill_root: Path
) -> None:
    events = read_events(distill_root / "run")
    updates = notebook["updates"]
    assert updates.policy_version.tolist() == [u.policy_version for u in of(events, PolicyUpdated)]
    assert updates.loss.tolist() == [u.loss for u in of(events, PolicyUpdated)]
    ends = of(events, EpisodeFinished)
    success = notebook["success"]
    for purpose in ("train", "eval"):
        mine = [e.success for e in ends if e.purpose == purpose and e.family == "fetch"]
        assert success.loc[(purpose, "fetch"), "success"] == pytest.approx(sum(mine) / len(mine))
    totals: dict[int, list[float]] = defaultdict(list)
    for c in of(events, CreditAssigned):
        totals[c.entry].append(c.credit)
    top = notebook["top"]
    assert top.height == len(totals)
    first = top.row(0, named=True)
    best = max(totals, key=lambda e: (sum(totals[e]), -e))
    assert (first["entry"], first["credits"]) == (best, len(totals[best]))
    assert first["total"] == pytest.approx(sum(totals[best]))
    table = notebook["table"]
    assert table.num_rows == len(events)
    assert table.column("seq").to_pylist() == list(range(len(events)))


def test_kinds_are_checked_and_fields_of_several_kinds_are_joined(distill_root: Path) -> None:
    run = distill_root / "run"
    with pytest.raises(ValueError, match=r"no event kind 'episode_done'; kinds: "):
        events_table(run, "episode_done")
    frame = events_frame(run, ["episode_finished", "episode_aborted"], library="polars")
    assert set(frame["kind"].to_list()) <= {"episode_finished", "episode_aborted"}
    assert "total_reward" in frame.columns
    sampled = events_table(run, "action_sampled", start=0, stop=2000)
    assert sampled.schema.field("prompt_ids").type.value_type.bit_width == 64
    envs = [e for e in read_envelopes(run, "action_sampled", stop=2000)]
    assert sampled.column("seq").to_pylist() == [e.seq for e in envs]
    assert sampled.column("cause").to_pylist() == [e.cause for e in envs]
    # a kind the run never recorded: no rows, and still its fields' columns (the notebook's
    # cell read a KeyError on a run without that kind)
    none = events_frame(run, "adapt_round_finished")
    assert len(none) == 0 and {"success", "attempts", "policy_version"} <= set(none.columns)


def test_an_event_field_named_as_an_envelope_column_keeps_its_value(distill_root: Path) -> None:
    """``actor_started.actor`` (the actor that started) was dropped for the envelope's
    ``actor``, always "runtime": which actor started or failed could not be read."""
    run = distill_root / "run"
    frame = events_frame(run, "actor_started")
    started = {e.event.actor for e in read_envelopes(run, "actor_started")}  # type: ignore[attr-defined]
    assert set(frame["actor"]) == {"runtime"}
    assert set(frame["event_actor"]) == started and len(started) > 1


@pytest.mark.parametrize(
    ("bounds", "said"),
    [({"stop": -5}, "stop must be a seq"), ({"start": 1.5}, "start must be a seq")],
)
def test_bounds_that_are_no_seq_are_refused(
    distill_root: Path, bounds: dict[str, Any], said: str
) -> None:
    """``stop=-5`` gave no rows without a word, and ``start=1.5`` a ``struct.error``."""
    with pytest.raises(ValueError, match=said):
        events_table(distill_root / "run", "episode_finished", **bounds)
