"""``coevo probe`` on the tiny Complementary RL run and a tiny frozen control beside it: every
bank is rebuilt and played on the same held-out episodes, the report says what it found, the
numbers repeat under the same seed, a pruned extractor version is re-executed to the same bank,
version 0 rebuilds exactly the bank a frozen extractor wrote, and bad input is one line."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from bench_import import load_bench
from test_complementary_run import COMPLEMENTARY
from test_grpo_run import of, read_events

from agents.events.extractor import ExtractorCalled, ExtractorUpdated
from agents.events.memory import TipEvicted, TipStored
from agents.memory.bank_rebuild import RebuildSettings, Rebuilt, bank_script, rebuild_bank
from agents.methods.actors import bank_settings, embedder_for
from agents.report.intervals import proportion_interval
from engine.eventlog import RunMeta
from engine.events import Envelope, Event
from scenarios.cli import main
from scenarios.loader import scenario_hash
from scenarios.policy_models import extractor_model_dir, policy_model_dir
from scenarios.policy_setup import load_extractor_for
from scenarios.probe_setup import read_run
from stores.lmdb_log import LmdbEventLog

EPISODES = 12
FROZEN = COMPLEMENTARY.replace('name = "tiny-complementary"', 'name = "tiny-frozen"').replace(
    "batch = 3", "batch = 1000000"
)


@pytest.fixture(scope="module")
def root(distill_root: Path) -> Path:
    return distill_root


@pytest.fixture(autouse=True)
def cache(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe finds the runs' base models where the runs built them."""
    monkeypatch.setenv("COEVO_CACHE", str(root / "cache"))


@pytest.fixture(scope="module")
def frozen(root: Path) -> Path:
    """A tiny frozen control beside the run (its models come from the run's cache)."""
    out = root / "probe-frozen"
    (root / "frozen.toml").write_text(FROZEN)
    mp = pytest.MonkeyPatch()
    mp.setenv("COEVO_CACHE", str(root / "cache"))
    try:
        assert main(["run", str(root / "frozen.toml"), "--out", str(out), "--quiet"]) == 0
    finally:
        mp.undo()
    return out


@pytest.fixture(scope="module")
def last(root: Path) -> int:
    n = len(of(read_events(root / "run"), ExtractorUpdated))
    assert n >= 1, "the tiny run should update its extractor"
    return n


def later(last: int) -> list[str]:
    """The labels of the trained versions probed by default (``mid`` may be ``last``)."""
    return [f"v{v}" for v in sorted({(last + 1) // 2, last})]


def probe(out: Path, *args: str) -> dict[str, Any]:
    """Run ``coevo probe`` into ``out`` and return its JSON."""
    assert main(["probe", *args, "--episodes", str(EPISODES), "--out", str(out)]) == 0
    return json.loads((out / "probe.json").read_text())


@pytest.fixture(scope="module")
def result(root: Path, frozen: Path) -> dict[str, Any]:
    mp = pytest.MonkeyPatch()
    mp.setenv("COEVO_CACHE", str(root / "cache"))
    try:
        return probe(root / "probe-out", str(root / "run"), "--control", str(frozen))
    finally:
        mp.undo()


def banks(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["label"]: b for b in result["banks"]}


def test_every_bank_is_played_on_the_same_episodes_with_intervals(
    result: dict[str, Any], root: Path, last: int
) -> None:
    assert [b["label"] for b in result["banks"]] == ["no bank", "v0", "control", *later(last)]
    assert result["episodes"] == EPISODES and result["tasks"] == {"fetch": EPISODES}
    calls = of(read_events(root / "run"), ExtractorCalled)
    assert result["extractions"] == sum(c.task == "extract" for c in calls)
    for b in result["banks"]:
        s = b["success"]
        assert len(b["outcomes"]) == EPISODES and s["episodes"] == EPISODES
        assert s["value"] == pytest.approx(sum(b["outcomes"]) / EPISODES)
        assert s["low"] <= s["value"] <= s["high"]
        # Wilson's, not a percentile bootstrap's ([0, 0] at 0 of n: any success lay "above" it)
        assert [s["low"], s["high"]] == pytest.approx(proportion_interval(s["value"], EPISODES))
        assert set(b["by_family"]) == {"fetch"}
        if b["label"] == "no bank":
            assert b["stats"] is None and b["shown"] == 0 and b["distinct"] == 0
        else:
            stats = b["stats"]
            assert stats["size"] == sum(stats["sizes"].values()) > 0
            assert stats["calls"]["extract"] == result["extractions"]
            assert b["shown"] == 1.0 and b["distinct"] >= 1  # the fetch partition is never empty
    for label in later(last):
        assert banks(result)[label]["origin"].startswith(("checkpoint", "re-executed"))


def test_later_versions_are_compared_with_both_frozen_extractors_and_the_verdict_says_so(
    result: dict[str, Any], last: int, root: Path
) -> None:
    pairs = {(c["bank"], c["reference"]) for c in result["comparisons"]}
    assert pairs == {(v, r) for v in later(last) for r in ("v0", "control")}
    of_label = banks(result)
    for c in result["comparisons"]:
        bank, ref = of_label[c["bank"]]["success"], of_label[c["reference"]]["success"]
        assert c["above"] == (bank["low"] > ref["high"])
        diffs = [
            a - b
            for a, b in zip(
                of_label[c["bank"]]["outcomes"], of_label[c["reference"]]["outcomes"], strict=True
            )
        ]
        assert c["difference"]["value"] == pytest.approx(sum(diffs) / EPISODES)
    shown = all(c["above"] for c in result["comparisons"] if c["bank"] == f"v{last}")
    assert result["shown"] == shown
    head = "Co-evolution is shown" if shown else "Co-evolution is NOT shown"
    assert result["verdict"].startswith(head) and f"v{last}" in result["verdict"]
    report = (root / "probe-out" / "probe.md").read_text()
    assert result["verdict"] in report
    assert all(f"| {b['label']} |" in report for b in result["banks"])
    assert (root / "probe-out" / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_control_shares_version_0s_bank_and_so_its_outcomes(result: dict[str, Any]) -> None:
    v0, control = banks(result)["v0"], banks(result)["control"]
    assert "same weights and settings as v0" in control["origin"]
    assert control["digest"] == v0["digest"] and control["stats"] == v0["stats"]
    assert control["outcomes"] == v0["outcomes"]  # the same bank, episodes and seeds
    assert control["success"] == v0["success"]  # and so the same interval


def test_the_same_seed_gives_the_same_numbers(
    root: Path, result: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    again = probe(root / "probe-again", str(root / "run"), "--versions", "0", "--json")
    assert json.loads(capsys.readouterr().out) == again  # --json prints what probe.json holds
    assert [b["label"] for b in again["banks"]] == ["no bank", "v0"]
    for label in ("no bank", "v0"):
        assert banks(again)[label] == banks(result)[label]
    other = probe(root / "probe-seed", str(root / "run"), "--versions", "0", "--seed", "1")
    assert banks(other)["v0"]["stats"] == banks(result)["v0"]["stats"]  # the same bank


def test_a_pruned_version_is_re_executed_to_the_same_bank(
    root: Path, result: dict[str, Any], last: int
) -> None:
    pruned = root / "probe-pruned"
    shutil.copytree(root / "run", pruned, ignore=shutil.ignore_patterns("extractor", "probe*"))
    again = probe(root / "probe-pruned-out", str(pruned), "--versions", "last")
    redone, kept = banks(again)[f"v{last}"], banks(result)[f"v{last}"]
    assert redone["origin"].startswith("re-executed from the base")
    assert redone["digest"] == kept["digest"]
    assert redone["stats"] == kept["stats"] and redone["outcomes"] == kept["outcomes"]


def stored_meta(run_dir: Path) -> RunMeta | None:
    log = LmdbEventLog.open(run_dir / "log", writable=False)
    try:
        return log.read_meta()
    finally:
        log.close()


def envelopes(path: str) -> Iterator[Envelope[Event]]:
    log = LmdbEventLog.open(Path(path) / "log", writable=False)
    try:
        yield from log.read(0, None)
    finally:
        log.close()


def rebuild_v0(run_dir: Path) -> Rebuilt:
    """The bank the run's extractor at its base writes from the run's own requests."""
    run = read_run(str(run_dir), stored_meta(run_dir), envelopes)
    s = run.scenario
    ext = load_extractor_for(s, extractor_model_dir(s, run.source, policy_model_dir(s, run.source)))
    embedder = embedder_for(s.complementary.embedder, s.complementary.query_chars)()
    settings = RebuildSettings(
        run_seed=run.seed,
        merge_chunk=s.complementary.merge_chunk,
        merge_max=s.complementary.merge_max,
        batch=s.policy.batch_max,
    )
    embed = lambda texts: list(embedder.embed(list(texts)))  # noqa: E731
    return rebuild_bank(
        bank_script(run.envelopes),
        ext.answer,
        embed,
        bank_settings(s.complementary),
        embedder.dim,
        settings,
    )


def live_bank(events: list[Event]) -> dict[str, list[str]]:
    """Every partition's entry texts at the end of a run, oldest first (folded from its log)."""
    held: dict[int, TipStored] = {}
    for ev in events:
        if isinstance(ev, TipStored):
            held[ev.tip_id] = ev
        elif isinstance(ev, TipEvicted):
            del held[ev.tip_id]
    out: dict[str, list[str]] = {}
    for tip in held.values():
        out.setdefault(tip.slot, []).append(tip.text)
    return dict(sorted(out.items()))


def test_version_0_rebuilds_the_bank_the_frozen_extractor_wrote(frozen: Path) -> None:
    events = read_events(frozen)
    rebuilt = rebuild_v0(frozen)
    logged = {c.call: c for c in of(events, ExtractorCalled)}
    extracts = [c for c in rebuilt.calls if c.task == "extract"]
    assert extracts and all(c.text == logged[c.call].text for c in extracts)
    merges = [c.text for c in rebuilt.calls if c.task == "merge"]
    assert merges == [c.text for c in logged.values() if c.task == "merge"]
    assert rebuilt.entries() == live_bank(events)
    assert sum(len(v) for v in rebuilt.entries().values()) > 3


def test_version_0_answers_the_trained_run_as_its_extractor_did_before_training(root: Path) -> None:
    logged = {c.call: c for c in of(read_events(root / "run"), ExtractorCalled)}
    untrained = [c for c in logged.values() if c.task == "extract" and c.extractor_version == 0]
    assert untrained
    rebuilt = {c.call: c for c in rebuild_v0(root / "run").calls if c.task == "extract"}
    assert all(rebuilt[c.call].text == c.text for c in untrained)


def run_copy(root: Path, name: str, old: str, new: str) -> Path:
    """A copy of the run with ``old`` replaced by ``new`` in the scenario its log stores (the
    one every command reads; ``scenario.toml`` is a copy for people)."""
    out = root / f"probe-bad-{name}"
    if not out.exists():
        shutil.copytree(
            root / "run", out, ignore=shutil.ignore_patterns("checkpoints", "extractor", "log")
        )
        reader = LmdbEventLog.open(root / "run" / "log", writable=False)
        try:
            meta, envs = reader.read_meta(), list(reader.read(0, None))
        finally:
            reader.close()
        assert meta is not None and old in meta.scenario_toml
        text = meta.scenario_toml.replace(old, new)
        meta = msgspec.structs.replace(meta, scenario_toml=text, scenario_hash=scenario_hash(text))
        writer = LmdbEventLog.create(out / "log", meta, durable=False)
        try:
            writer.append(envs)
        finally:
            writer.close()
    return out


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("empty-dir", "not a coevo run directory"),
        ("grpo", "run.method = 'grpo': not a Complementary RL run"),
        ("no-base", "/nonexistent/extractor"),
        ("version", "--versions: '99' is not an extractor version of the run"),
        ("control", "its extractor was updated"),
        ("policy", "/nonexistent/policy"),
        ("policy-empty", "--policy is empty (''); give final, base or a PATH"),  # read as "."
        ("episodes", "--episodes must be between 1 and 1,000,000, got 0"),
        ("huge", "--episodes must be between 1 and 1,000,000, got 99999999999999999999"),
        ("out-file", "a file, not a directory for the probe's report"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    case: str, message: str, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(root / "run")
    args = {
        "empty-dir": [str(tmp_path)],
        "grpo": [str(run_copy(root, "grpo", 'method = "complementary"', 'method = "grpo"'))],
        "no-base": [
            str(
                run_copy(
                    root,
                    "base",
                    'extractor = "embedded-ops"',
                    'extractor = "/nonexistent/extractor"',
                )
            )
        ],
        "version": [run, "--versions", "0,99"],
        "control": [run, "--control", run],
        "policy": [run, "--policy", "/nonexistent/policy"],
        "policy-empty": [run, "--policy", ""],
        "episodes": [run, "--episodes", "0"],
        "huge": [run, "--episodes", "99999999999999999999"],  # took memory until killed
        "out-file": [run],  # failed only after playing every episode
    }[case]
    out = tmp_path / "out"
    if case == "out-file":
        out.write_text("mine")
    assert main(["probe", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("coevo: error: ") and message in err[0], err
    assert out.read_text() == "mine" if case == "out-file" else not out.exists()


def test_an_output_it_cannot_write_is_refused_before_any_episode(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a read-only run directory the probe played every bank's episodes, then failed to
    write its report; report failed without naming --out."""
    import os

    import scenarios.cli.common as common
    import scenarios.probe_setup as probe_setup

    shut = tmp_path / "read-only"
    shut.mkdir()
    real = os.access
    monkeypatch.setattr(  # as a read-only mount answers, which root's chmod cannot make
        common.os, "access", lambda p, mode: Path(p) != shut and real(p, mode)
    )

    def played(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the probe played")

    monkeypatch.setattr(probe_setup, "probe_run", played)
    assert main(["probe", str(root / "run"), "--out", str(shut / "probe")]) == 2
    err = capsys.readouterr().err
    assert err == f"coevo: error: {shut / 'probe'}: cannot write in {shut} (no permission)\n"
    assert main(["report", str(root / "run"), "--out", str(shut / "r.html")]) == 2
    assert capsys.readouterr().err.endswith(f"cannot write in {shut} (no permission)\n")
    # the place it writes by default: named with the option that moves it
    monkeypatch.setattr(common.os, "access", lambda p, mode: Path(p) != root / "run")
    assert main(["report", str(root / "run")]) == 2  # (--out given: "--out FILE writes it
    assert capsys.readouterr().err.endswith("; --out FILE writes it elsewhere\n")  # elsewhere")


def test_the_headline_pools_the_probes_of_several_seeds(result: dict[str, Any]) -> None:
    headline = load_bench("headline")
    lines, summary = headline.probe_summary([result, result])
    cells = summary["cells"]
    assert {"no bank", "v0", "control", "last"} <= set(cells)
    assert cells["v0"].seeds == 2 and cells["v0"].episodes == 2 * EPISODES
    by = banks(result)
    last = by[max((b for b in by if b.startswith("v")), key=lambda b: by[b]["version"])]
    gain = (sum(last["outcomes"]) - sum(by["v0"]["outcomes"])) / EPISODES
    assert summary["last_minus_v0"].value == pytest.approx(gain)
    # seeds then pairs resampled, as the cells are (the pairs were one pool, as if independent)
    assert summary["last_minus_v0"].seeds == 2
    assert summary["shown"] == cells["last"].above(cells["v0"])
    assert any("co-evolution" in line for line in lines)


def test_a_probe_of_a_run_that_has_not_completed_says_so(root: Path, tmp_path: Path) -> None:
    """``coevo probe`` of a stopped or killed run played its banks without saying that the
    run had not finished (the probe is for a finished run's extractor versions)."""
    from scenarios.cli.report import _state_of  # pyright: ignore[reportPrivateUsage]

    assert _state_of(str(root / "run")) == "completed"
    cut = tmp_path / "cut"
    meta = stored_meta(root / "run")
    assert meta is not None
    log = LmdbEventLog.create(cut / "log", meta, durable=False)
    try:
        log.append(list(envelopes(str(root / "run")))[:50])  # killed: no final event
    finally:
        log.close()
    assert _state_of(str(cut)) == "killed"
