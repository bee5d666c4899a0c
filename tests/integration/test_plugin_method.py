"""The worked example of docs/METHODS.md is real: its method, taken from the page as it stands,
runs through ``coevo run`` by import path with no change to coevo, and edits its insight list."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
from doc_blocks import doc_block

from stores.lmdb_log import LmdbEventLog

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "METHODS.md"
COEVO = str(Path(sys.executable).parent / "coevo")


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    (tmp_path / "insights.py").write_text(doc_block(DOC, "# insights.py"))
    (tmp_path / "insights.toml").write_text(doc_block(DOC, "# insights.toml"))
    return tmp_path


def coevo(plugin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{plugin_dir}{os.pathsep}{ROOT}"}
    return subprocess.run(
        [COEVO, *args], capture_output=True, text=True, cwd=plugin_dir, env=env, timeout=300
    )


def events(plugin_dir: Path, kind: str) -> list[dict]:
    out = coevo(plugin_dir, "log", "run", "--kind", kind, "--json")
    assert out.returncode == 0, out.stderr
    return [json.loads(line)["event"] for line in out.stdout.splitlines()]


def test_the_documented_method_runs_by_import_path(plugin_dir: Path) -> None:
    proc = coevo(plugin_dir, "run", "insights.toml", "--out", "run", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert len(events(plugin_dir, "policy_updated")) == 2
    stored = events(plugin_dir, "tip_stored")
    assert stored and all(s["slot"] == "heat" for s in stored)
    shown = [a for a in events(plugin_dir, "action_requested") if a["tips"]]
    assert shown and {t for a in shown for t in a["tips"]} <= {s["text"] for s in stored}
    groups = events(plugin_dir, "advantages_computed")
    assert {r for g in groups for r in g["rollouts"]} == {"tips", "plain"}
    check = coevo(plugin_dir, "check", "run")  # the plug-in imported, every invariant that applies
    assert check.returncode == 0 and check.stderr == "", check.stdout + check.stderr
    assert "not checked: lineage: for methods complementary, empo2, not insights:Insights" in (
        check.stdout
    )
    assert "credit" in check.stdout.splitlines()[0]  # its advantages re-derive, its own score
    # the audit re-derives the plug-in's advantages with its own score
    audit = coevo(plugin_dir, "audit", "run", "credit", "--json")
    assert audit.returncode == 0, audit.stderr
    checks = {c["kind"]: c for c in json.loads(audit.stdout)["checks"]}
    assert checks["advantages_computed"]["equal"] == len(groups) > 0
    # a plug-in not built on Complementary RL has no subgroups: split re-derived nothing
    split = coevo(plugin_dir, "audit", "run", "credit", "--set", "split=false")
    assert split.returncode == 2 and "'insights:Insights' has no guided and free" in split.stderr
    # the audit says which actor stored an entry that no extractor call or reflection wrote
    first = stored[0]["tip_id"]
    tip = coevo(plugin_dir, "audit", "run", "tip", str(first), "--json")
    assert tip.returncode == 0, tip.stderr
    origin = json.loads(tip.stdout)["origin"]
    assert origin["kind"] == "actor" and origin["source"] == "insights", origin
    text = coevo(plugin_dir, "audit", "run", "tip", str(first)).stdout
    assert f"stored by actor 'insights' at seq {origin['seq']}, handling seq " in text
    assert "reflection on" not in text
    # and so does the episode that was shown it (it said "written by a reflection")
    guided = next(a["episode"] for a in shown if stored[0]["text"] in a["tips"])
    turns = coevo(plugin_dir, "audit", "run", "episode", guided).stdout
    assert f"retrieved entry {first} (stored by actor 'insights'; rank " in turns, turns
    assert "written by a reflection" not in turns
    recovers_its_lists(plugin_dir, stored)
    # without the plug-in on the path: one line naming its module, no traceback
    alone = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [COEVO, "replay", "run", "--reexecute-learner"],
        capture_output=True, text=True, cwd=plugin_dir, env=alone, timeout=300,
    )  # fmt: skip
    *_, last = proc.stderr.splitlines()  # after "loading the base models of run ..."
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert last.startswith("coevo: error: ") and "cannot import method module 'insights'" in last


def recovers_its_lists(plugin_dir: Path, stored: list[dict]) -> None:
    """The example's ``recover`` (what ``coevo resume`` calls) folds the finished run's log
    back into the lists its edits describe, with nothing left of any training episode."""
    sys.path.insert(0, str(plugin_dir))
    try:
        insights = importlib.import_module("insights")
        actor = insights.InsightList(insights.InsightSettings())
        log = LmdbEventLog.open(plugin_dir / "run" / "log")
        try:
            history = [env for chunk in log.read_chunks(0, log.next_seq) for env in chunk]
        finally:
            log.close()
        trio.run(actor.recover, SimpleNamespace(name="insights"), history)
    finally:
        sys.path.remove(str(plugin_dir))
        sys.modules.pop("insights", None)
    evicted = {e["tip_id"] for e in events(plugin_dir, "tip_evicted")}
    live = {s["tip_id"]: s for s in stored if s["tip_id"] not in evicted}
    got = {i.id: i for family in actor._lists.values() for i in family}
    assert set(got) == set(live) and live and evicted
    for tip_id, insight in got.items():
        assert insight.text("heat") == live[tip_id]["text"]
        assert insight.votes == abs(live[tip_id]["score"])
    assert actor._next == max(s["tip_id"] for s in stored) + 1
    assert actor._actions == {}  # every training episode's group was compared


def test_bad_method_options_are_one_line(plugin_dir: Path) -> None:
    proc = coevo(plugin_dir, "validate", "insights.toml", "--set", "method.colour=1")
    assert proc.returncode == 2
    assert proc.stderr.startswith("coevo: error: insights.toml: $.method: bad options")
    assert "\n" not in proc.stderr.strip()
    proc = coevo(plugin_dir, "validate", "insights.toml", "--set", 'method.shown="x"')
    assert proc.returncode == 2  # the option's path as the file's, not the Settings' own
    assert proc.stderr.rstrip().endswith("- at `$.method.shown`"), proc.stderr


def test_an_unknown_method_is_refused_by_name(plugin_dir: Path) -> None:
    proc = coevo(plugin_dir, "validate", "insights.toml", "--set", "run.method=ppo")
    assert proc.returncode == 2
    assert "$.run.method: unknown method 'ppo'" in proc.stderr
