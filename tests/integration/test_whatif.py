"""``coevo audit RUN whatif EPISODE``: the tiny Complementary RL run's guided episodes replayed
from their seeds on the built-in (deterministic) world: unchanged, the replay gives back the
log; without the entry, with another, or at another policy version, it shows the change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_grpo_run import of, read_events

from agents.audit.whatif import Change, Played, PlayedTurn, Recorded, what_if
from agents.events.extractor import CreditAssigned
from agents.events.memory import TipStored
from agents.events.policy import ActionRequested, PolicyUpdated
from engine.world import Task
from scenarios.cli import main


@pytest.fixture(scope="module")
def run(distill_root: Path) -> Path:
    return distill_root / "run"


@pytest.fixture
def cached(distill_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COEVO_CACHE", str(distill_root / "cache"))  # the run's embedded model


def _whatif(run: Path, episode: str, *change: str, capsys: pytest.CaptureFixture[str]) -> Any:
    capsys.readouterr()
    assert main(["audit", str(run), "whatif", episode, *change, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.usefixtures("cached")
def test_without_its_entry_the_episode_replays_exactly_then_unshown(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = read_events(run)
    credit = of(events, CreditAssigned)[0]
    text = next(t.text for t in of(events, TipStored) if t.tip_id == credit.entry)
    asked = [r for r in of(events, ActionRequested) if r.episode == credit.episode]
    w = _whatif(run, credit.episode, "--without-tip", str(credit.entry), capsys=capsys)
    assert w["reproduced"] is True
    assert w["change"] == f"without entry {credit.entry}"
    control, changed = w["control"]["turns"], w["changed"]["turns"]
    assert [t["action"] for t in control] == [t["action"] for t in w["logged"]["turns"]]
    assert len(control) == len(asked)
    assert all(t["tips"] == [text] for t in control)
    assert all(t["tips"] == [] for t in changed)
    assert changed[0]["logp"] != control[0]["logp"]  # the prompt lost the entry
    assert w["credit"] == credit.credit and w["credit_rule"] == credit.rule
    capsys.readouterr()
    assert main(
        ["audit", str(run), "whatif", credit.episode, "--without-tip", str(credit.entry)]
    ) in (0,)
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0] == f"episode {credit.episode}: replayed from its seeds, without entry {credit.entry}"
    )
    assert out[1].startswith("control: replayed unchanged, it gives back the logged trajectory")
    assert out[-1].endswith(
        f"the credit this episode gave the entry: {credit.credit:+.3f} ({credit.rule})"
    )


@pytest.mark.usefixtures("cached")
def test_another_entry_or_another_version(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = read_events(run)
    credit = of(events, CreditAssigned)[0]
    other = next(t for t in of(events, TipStored) if t.tip_id != credit.entry and t.text)
    w = _whatif(
        run,
        credit.episode,
        "--without-tip",
        str(credit.entry),
        "--with-tip",
        str(other.tip_id),
        capsys=capsys,
    )
    assert w["change"] == f"entry {other.tip_id} instead of entry {credit.entry}"
    assert all(t["tips"] == [other.text] for t in w["changed"]["turns"])
    last = of(events, PolicyUpdated)[-1].policy_version  # its checkpoint is kept
    w = _whatif(run, credit.episode, "--version", str(last), capsys=capsys)
    assert w["reproduced"] is True
    assert {t["version"] for t in w["changed"]["turns"]} == {last}
    assert {t["version"] for t in w["control"]["turns"]} != {last}


@pytest.mark.usefixtures("cached")
def test_bad_changes_are_one_line(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = read_events(run)
    credit = of(events, CreditAssigned)[0]
    shown = credit.entry
    other = next(t.tip_id for t in of(events, TipStored) if t.tip_id != shown)
    for args, message in (
        ([], "whatif needs a change: --without-tip ID, --with-tip ID or --version N"),
        (
            ["--without-tip", str(other)],
            f"episode {credit.episode} was not shown entry {other} (it was shown: {shown})",
        ),
        (["--version", "99"], "the run has no policy version 99"),
    ):
        capsys.readouterr()
        assert main(["audit", str(run), "whatif", credit.episode, *args]) == 2
        assert capsys.readouterr().err == f"coevo: error: {message}\n"
    assert main(["audit", str(run), "whatif", "ep999999", "--version", "0"]) == 2
    assert "no episode 'ep999999' in this run" in capsys.readouterr().err


def _played(*actions: str) -> Played:
    turns = tuple(
        PlayedTurn(
            turn=i, observation="", tips=(), action=a, logp=-1.0, version=0, reward=0.0, score=0.0
        )
        for i, a in enumerate(actions)
    )
    return Played(turns=turns, success=False, score=0.0, steps=len(turns))


def test_a_control_that_strays_from_the_log_is_reported() -> None:
    rec = Recorded(
        episode="ep1",
        task=Task(family="f", variant=0),
        seed=1,
        purpose="train",
        requests=(),
        sampled=(),
        played=_played("look", "open box"),
        shown={3: "t"},
        credits=(),
    )
    change = Change(without=3)
    same = what_if(rec, _played("look", "open box"), _played("look", "take key"), change)
    assert same.reproduced and same.first_difference == 1
    strays = what_if(rec, _played("look", "take key"), _played("look", "take key"), change)
    assert not strays.reproduced and strays.first_difference is None
    with pytest.raises(ValueError, match="a what-if changes one thing"):
        Change(without=3, version=2)
