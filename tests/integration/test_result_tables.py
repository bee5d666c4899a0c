"""The scripts that write docs/RESULTS.md's tables (``bench/headline.py``,
``bench/method_results.py``, ``bench/headline_logs.py``) count what the run counted: an
aborted episode is a failure there as in the trainer and the held-out rounds."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
from bench_import import load_bench

from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    episode_success,
)
from agents.events.policy import EvalRoundFinished, EvalRoundStarted
from engine.events import Event

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = (
    "steps=20", "warmup=2", "episodes_per_family=6", "hidden_size=32", "layers=1", "heads=2",
    "kv_heads=1", "intermediate_size=64", "eval_variants=1", "eval_notes=1",
    "note_episodes_per_family=8", "probe_variants=2", "probe_seeds=1",
)  # fmt: skip


def _assigned(i: int, purpose: str = "eval") -> EpisodeAssigned:
    return EpisodeAssigned(
        episode=f"ep{i:06d}", index=i, worker="w", family="heat", variant=i, split="test",
        seed=i, purpose=purpose,
    )  # fmt: skip


def _finished(i: int, success: bool, purpose: str = "eval") -> EpisodeFinished:
    return EpisodeFinished(
        episode=f"ep{i:06d}", worker="w", family="heat", variant=i, split="test", steps=3,
        score=float(success), success=success, total_reward=float(success), purpose=purpose,
    )  # fmt: skip


def _round() -> list[Event]:
    """A held-out round of four episodes: one success, one failure, two aborted (one of
    them abandoned first and run again to its abort)."""
    return [
        EvalRoundStarted(round=0, policy_version=0, episodes=4),
        *(_assigned(i) for i in range(4)),
        _finished(0, True),
        _finished(1, False),
        EpisodeAbandoned(episode="ep000002", worker="w", purpose="eval"),
        EpisodeAborted(episode="ep000002", worker="w", reason="the world failed", purpose="eval"),
        EpisodeAborted(episode="ep000003", worker="w", reason="the world failed", purpose="eval"),
        EvalRoundFinished(
            round=0, policy_version=0, episodes=4, success=0.25, score=0.25, train_episodes=0
        ),
    ]


def test_an_aborted_episode_is_a_failure_and_an_episode_keeps_its_last_end() -> None:
    events = [_assigned(9, "train"), _finished(9, True, "train")]
    events += [EpisodeAborted(episode="ep000009", worker="w", reason="x")]  # ended again
    assert episode_success([*_round(), *events]) == {
        "ep000000": True,
        "ep000001": False,
        "ep000002": False,
        "ep000003": False,
        "ep000009": False,
    }


def test_the_results_scripts_count_aborted_held_out_episodes_as_failures() -> None:
    """An outside tester's world aborted 9 of 30 held-out episodes: the log said 2 of 30,
    headline.py 2 of 21 and method_results.py 1 of 7 of the hard family."""
    events = _round()
    final = load_bench("headline").final_of(events)
    assert sorted(ok for _, ok in final.plain) == [False, False, False, True]
    facts = load_bench("method_results").fold("grpo", 0, events, 1.0)
    assert facts.family_success(0, ("heat",)) == (1, 4)
    assert facts.rounds == [(0, 0, 0.25)]  # what the round itself said


def test_a_held_out_episode_assigned_again_after_a_stop_is_counted_once() -> None:
    """A resumed run's re-run evaluation episode (assigned again with its id and index) was
    counted twice in the last round, and the round's first episode fell out of it."""
    events: list[Event] = [
        EvalRoundStarted(round=0, policy_version=0, episodes=4),
        *(_assigned(i) for i in range(4)),
        _finished(0, True),
        _finished(1, False),
        EpisodeAbandoned(episode="ep000002", worker="w", purpose="eval"),
        _assigned(2),  # the resume plays it again
        _finished(2, False),
        _finished(3, False),
        EvalRoundFinished(
            round=0, policy_version=0, episodes=4, success=0.25, score=0.25, train_episodes=0
        ),
    ]
    final = load_bench("headline").final_of(events)
    assert [ok for _, ok in final.plain] == [True, False, False, False]  # ep000000 to 3


def test_the_bank_pairing_says_how_many_seeds_it_used() -> None:
    """A seed whose two rounds do not line up family by family was left out of "bank minus
    without" while the table said every seed."""
    headline = load_bench("headline")
    lined_up = headline.Final(plain=[("heat", False)] * 2, bank=[("heat", True)] * 2)
    apart = headline.Final(plain=[("heat", False), ("cool", False)], bank=[("cool", True)] * 2)
    for runs, said in (([lined_up, lined_up], ""), ([lined_up, apart], " (1 of the 2 seeds")):
        summary = headline.summarize({"complementary": runs}, ())
        [line] = [x for x in headline.table(summary, ()) if x.startswith("With its bank")]
        assert re.search(r"complementary \+1\.000 \[[+-]0\.\d+, \+1\.000\]" + re.escape(said), line)


def test_a_resumed_runs_wall_time_leaves_out_the_time_it_was_stopped() -> None:
    """method_results.py's "wall" column read from the first event to the last: a run stopped
    for an hour and resumed counted the hour."""
    from engine.events import Envelope
    from engine.lifecycle import RunResumed, RunStarted, RunStopped

    start = RunStarted(run_id="r", scenario="s", scenario_hash="h", seed=0, coevo_version="0")
    events: list[tuple[Event, float]] = [
        (start, 0.0),
        (RunStopped(reason="signal", signal="SIGINT", exit_code=130), 10.0),
        (RunResumed(after=1, previous="run_stopped"), 3610.0),  # an hour later
        (RunStopped(reason="completed"), 3615.5),
    ]
    envs = [
        Envelope(seq=i, run="r", t=int(at * 1e9), actor="runtime", event=ev)
        for i, (ev, at) in enumerate(events)
    ]
    assert load_bench("method_results").running_seconds(envs) == pytest.approx(15.5)


def test_the_versions_that_resumed_a_run_are_named_by_both_results_scripts() -> None:
    """method_results.py's table named only the coevo version that created each run: a run
    resumed by other code (the half of it trained by that code) went unsaid."""
    from engine.eventlog import RunMeta
    from engine.lifecycle import RunResumed, RunStopped

    results = load_bench("method_results")
    meta = RunMeta(
        run_id="r", created_ns=1, coevo_version="0.1+gaaa", log_format=1, scenario_name="s",
        scenario_toml="", scenario_hash="", seed=0, event_versions={},
    )  # fmt: skip
    events: list[Event] = [
        RunStopped(reason="signal", signal="SIGINT", exit_code=130),
        RunResumed(after=1, previous="run_stopped", coevo_version="0.1+gbbb"),
        RunResumed(after=2, previous=""),  # an older resume, which recorded no version
        RunStopped(reason="completed"),
    ]
    assert results.written_by(meta, events) == ["0.1+gaaa", "0.1+gbbb"]
    assert results.written_by(None, events[:1]) == ["unknown"]
    made = results.provenance({"grpo": [0]}, [], versions=results.written_by(meta, events))
    assert "by coevo 0.1+gaaa, 0.1+gbbb," in results.provenance_line(made)


def test_a_headlines_json_writes_an_unbounded_ratio_as_null() -> None:
    """headline.json held ``"high": Infinity`` (a ratio whose GRPO side resampled to no
    success): not JSON, refused by strict readers and read as a number by others."""
    from agents.report.intervals import Interval

    headline = load_bench("headline")
    summary = {"complementary": {"bank_vs_grpo": Interval(2.0, 0.5, math.inf, 3, 60)}}
    doc = json.loads(json.dumps(headline._jsonable(summary), allow_nan=False))
    assert doc == {
        "complementary": {"bank_vs_grpo": {"value": 2.0, "low": 0.5, "high": None, "n": 60}}
    }


def test_the_extractor_table_counts_every_operation_and_says_what_its_quarters_are() -> None:
    """The ops column left out ``return`` (160 + 91 of 252 calls' operations accounted for),
    and "quarter of training" was a quarter of the credits."""
    from collections import Counter

    from agents.report.curves import Coevolution

    report = load_bench("extractor_report")
    c = Coevolution(ops=Counter({"add": 3, "merge": 1, "return": 2}))
    header, _, row = report.coevolution_table({"complementary": [(0, c)]})
    assert "quarter of the credits" in header and "/discard/return)" in header
    assert "| 3/0/1/0/0/2 |" in row, row


def test_a_round_with_an_empty_bank_is_not_a_with_its_bank_figure() -> None:
    """method_results.py's "with its bank" row gave version 0's cell from the round played
    before any training episode ended, with an empty bank (the run's summary leaves it out)."""
    results = load_bench("method_results")
    f = results.RunFacts(
        "complementary", 0, rounds=[(0, 0, 0.1), (64, 2, 0.3)],
        memory_rounds=[(0, 0, 0.125), (64, 2, 0.5)],
    )  # fmt: skip
    row = next(x for x in results.table({"complementary": [f]}, ()) if "with its bank" in x)
    assert "| - (empty bank) | 0.500 |" in row, row
    f.memory_rounds[0] = (16, 1, 0.25)  # a first round after training began: a bank's figure
    row = next(x for x in results.table({"complementary": [f]}, ()) if "with its bank" in x)
    assert "| 0.250 | 0.500 |" in row, row


def test_seeds_evaluated_on_other_schedules_are_averaged_where_all_evaluated(
    tmp_path: Path,
) -> None:
    """The curves' mean indexed the first seed's rounds into every seed's: a seed with fewer
    rounds was a traceback (and the table never written), one with more averaged by position."""
    results = load_bench("method_results")
    short = results.RunFacts("grpo", 0, rounds=[(0, 0, 0.1), (64, 2, 0.3)])
    long = results.RunFacts("grpo", 1, rounds=[(0, 0, 0.2), (32, 1, 0.4), (64, 2, 0.5)])
    for runs in ([short, long], [long, short]):
        assert results.plot({"grpo": runs}, ("heat",), tmp_path / "c.png").is_file()


def test_a_reused_run_of_other_settings_is_named_not_counted(tmp_path: Path) -> None:
    """headline.py counted any finished run in METHOD-seedN: another scenario's, or one of
    other --set values (the --set given was ignored for it)."""
    from engine.eventlog import new_run_meta
    from scenarios.loader import load_scenario, resolved_toml
    from stores.lmdb_log import LmdbEventLog

    grpo = ROOT / "scenarios" / "grpo.toml"
    text = resolved_toml(load_scenario(grpo, ["seed=0", "run.episodes=64"]))
    meta = new_run_meta("r", scenario_name="grpo", seed=0, coevo_version="0", scenario_toml=text)
    LmdbEventLog.create(tmp_path / "log", meta, durable=False).close()
    differs = load_bench("method_results").reused_differs
    assert differs(tmp_path, grpo, ["seed=0", "run.episodes=64"]) == []
    assert differs(tmp_path, grpo, ["seed=0"]) == ["run.episodes"]
    assert differs(tmp_path, grpo, ["seed=1", "run.episodes=64"]) == ["seed"]


def test_a_reused_run_made_before_a_setting_that_changed_its_method_is_named(
    tmp_path: Path,
) -> None:
    """A Complementary RL run recorded before ``reweight_counts`` counted calls as the old
    rule did: its scenario lacks the key, which read as "no difference", and it was counted
    as a run of today's rule. A GRPO run lacking it is reused: its method never reads it."""
    from engine.eventlog import new_run_meta
    from scenarios.loader import load_scenario, resolved_toml
    from stores.lmdb_log import LmdbEventLog

    differs = load_bench("method_results").reused_differs
    cases = [  # the key, the value every run made before it had, one a new run may ask for
        ("reweight_counts", "weighted", "pushed"),
        # one made before guided_fraction played half of each group guided: it was counted
        # as a run of any fraction (an outside tester's)
        ("guided_fraction", 0.5, 0.25),
    ]
    for key, then, now in cases:
        for name in ("complementary", "grpo"):
            toml = ROOT / "scenarios" / f"{name}.toml"
            text = resolved_toml(load_scenario(toml, ["seed=0"]))
            old = "\n".join(line for line in text.splitlines() if key not in line)
            where = tmp_path / key / name
            meta = new_run_meta(
                "r", scenario_name=name, seed=0, coevo_version="0", scenario_toml=old
            )
            LmdbEventLog.create(where / "log", meta, durable=False).close()
            for value, other in ((then, False), (now, name == "complementary")):
                got = differs(where, toml, ["seed=0", f"complementary.{key}={value}"])
                assert got == ([f"complementary.{key}"] if other else []), (key, name, value)


def test_a_set_the_scenario_refuses_is_one_line(tmp_path: Path) -> None:
    """A reused run checked against ``--set grpo:grpo.nokey=1`` was a traceback."""

    from engine.eventlog import new_run_meta
    from stores.lmdb_log import LmdbEventLog

    meta = new_run_meta("r", scenario_name="grpo", seed=0, coevo_version="0", scenario_toml="")
    LmdbEventLog.create(tmp_path / "log", meta, durable=False).close()
    differs = load_bench("method_results").reused_differs
    with pytest.raises(SystemExit, match=r"coevo: error: .*unknown field `nokey`"):
        differs(tmp_path, ROOT / "scenarios" / "grpo.toml", ["grpo.nokey=1"])


def test_method_results_refuses_a_reused_run_of_other_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """method_results.py counted whatever finished run its directory held (headline.py
    refused one of other settings; this script did not look)."""
    from engine.eventlog import new_run_meta
    from engine.events import Envelope
    from engine.lifecycle import RunStarted, RunStopped
    from scenarios.loader import load_scenario, resolved_toml
    from stores.lmdb_log import LmdbEventLog

    grpo = ROOT / "scenarios" / "grpo.toml"
    text = resolved_toml(load_scenario(grpo, ["seed=0", "run.episodes=64"]))
    meta = new_run_meta("r", scenario_name="grpo", seed=0, coevo_version="0", scenario_toml=text)
    log = LmdbEventLog.create(tmp_path / "grpo-seed0" / "log", meta, durable=False)
    started = RunStarted(run_id="r", scenario="grpo", scenario_hash="h", seed=0, coevo_version="0")
    log.append(
        [
            Envelope(seq=i, run="r", t=i, actor="runtime", event=ev)
            for i, ev in enumerate([started, RunStopped(reason="completed")])
        ]
    )
    log.close()
    main = load_bench("method_results").main
    argv = ["method_results.py", "--runs", str(tmp_path), "--seeds", "0", "--out", str(tmp_path)]
    monkeypatch.setattr("sys.argv", [*argv, "--baseline", f"grpo={grpo}"])
    with pytest.raises(SystemExit, match=r"grpo-seed0 holds a finished run of another scenario "
                       r"than .*grpo\.toml with seed=0 \(run\.episodes differ\)"):  # fmt: skip
        main()


def test_method_results_names_a_malformed_method_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--method empo2`` (no ``=SCENARIO``) was a ValueError traceback."""
    main = load_bench("method_results").main
    for flag, value, what in [("--method", "empo2", "NAME=SCENARIO"), ("--reuse", "x", "NAME=DIR")]:
        monkeypatch.setattr("sys.argv", ["method_results.py", flag, value])
        with pytest.raises(SystemExit, match=rf"coevo: error: {flag} '{value}': expected {what}"):
            main()


@pytest.mark.parametrize("script", ["headline", "method_results"])
@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--parallel", "0"], "--parallel: '0' is not a whole number >= 1"),
        (["--parallel", "-1"], "--parallel: '-1' is not a whole number >= 1"),
        (["--seeds", "0", "0"], "coevo: error: --seeds: [0] given more than once"),
        (["--tag", "my tag"], "--tag: 'my tag': letters, digits, '.', '_' and '-' only"),
    ],
)
def test_the_results_scripts_refuse_bad_counts_in_one_line(
    script: str,
    argv: list[str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """``--parallel 0`` waited forever with no word, and method_results.py counted a seed
    given twice twice (two runs queued into one directory)."""
    main = load_bench(script).main
    monkeypatch.setattr("sys.argv", [f"{script}.py", "--runs", str(tmp_path), *argv])
    with pytest.raises(SystemExit) as info:
        main()
    assert said in f"{info.value.code}{capsys.readouterr().err}"
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("item", "said"),
    [
        ("typo=0", "coevo: error: --seeds-of 'typo=0': 'typo' is no --method or --baseline"),
        ("grpo=", "coevo: error: --seeds-of 'grpo=': expected NAME=SEED,SEED,..."),
        ("grpo=x", "coevo: error: --seeds-of 'grpo=x': expected NAME=SEED,SEED,..."),
        ("grpo=1,1", "coevo: error: --seeds-of grpo: [1] given more than once"),
        ("grpo=\u0663", "coevo: error: --seeds-of 'grpo=\u0663': expected NAME=SEED,SEED,..."),
        ("grpo=1_0", "coevo: error: --seeds-of 'grpo=1_0': expected NAME=SEED,SEED,..."),
    ],
)
def test_method_results_names_a_malformed_seeds_of(
    item: str, said: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--seeds-of typo=0`` was dropped without a word; ``grpo=`` was a ValueError
    traceback."""
    main = load_bench("method_results").main
    monkeypatch.setattr("sys.argv", ["m.py", "--runs", str(tmp_path), "--seeds-of", item])
    with pytest.raises(SystemExit) as info:
        main()
    assert str(info.value.code).startswith(said), info.value.code


def test_a_hard_family_no_run_played_is_refused() -> None:
    """``--hard circuits`` (a typo) filled the table with "-" and drew 0% success for it."""
    results = load_bench("method_results")
    facts = {"grpo": [results.fold("grpo", 0, _round(), 1.0)]}
    results.check_families(("heat",), facts)
    with pytest.raises(SystemExit) as info:
        results.check_families(("heat", "circuits"), facts)
    assert info.value.code == (
        "coevo: error: --hard circuits: no held-out episode of the runs is of that family "
        "(they have: heat)"
    )


def test_a_round_with_no_episode_of_the_hard_family_is_no_point_on_its_curve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The curves' hard-family panel drew 0% success at a round that played no episode of the
    family (the table showed "-" for it)."""
    import matplotlib.figure

    results = load_bench("method_results")
    figures: list[matplotlib.figure.Figure] = []
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: figures.append(fig)
    )
    facts = {"grpo": [results.fold("grpo", 0, _round(), 1.0)]}  # one round, of heat alone
    results.plot(facts, ("unlock",), tmp_path / "curves.png")
    (fig,) = figures
    hard = [line.get_ydata() for line in fig.axes[1].get_lines()]
    assert hard and all(math.isnan(y) for ys in hard for y in ys)
    results.plot(facts, ("heat",), tmp_path / "curves.png")  # a quarter of heat succeeded
    assert all(list(line.get_ydata()) == [0.25] for line in figures[1].axes[1].get_lines())


def test_a_headline_stays_with_its_runs_and_says_where_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A one-seed try of headline.py wrote over docs/results/headline.* (its default --out)
    with nothing but "seeds 1" to tell; its JSON held summaries only. The table goes beside
    the runs unless --out is named, names its commit, time, command and seeds, warns of few
    seeds, and the JSON holds every seed's held-out outcomes, which give the interval again."""
    import json

    from agents.report.intervals import bootstrap_mean

    headline = load_bench("headline")
    small = ["run.episodes=32", "eval.final_episodes=16", "eval.episodes=8", "world.pool=16"]
    small += [f"policy.embedded.{k}" for k in TINY_MODEL]  # built in seconds, not minutes
    argv = ["headline.py", "--methods", "grpo", "--seeds", "3", "--probe", "0"]
    argv += ["--runs", str(tmp_path), *(a for s in small for a in ("--set", f"grpo:{s}"))]
    before = {p: p.stat().st_mtime_ns for p in (ROOT / "docs" / "results").iterdir()}
    monkeypatch.setattr("sys.argv", argv)
    headline.main()
    assert {p: p.stat().st_mtime_ns for p in (ROOT / "docs" / "results").iterdir()} == before
    md = (tmp_path / "headline.md").read_text().splitlines()
    assert md[0].startswith("Table made ") and "seeds: grpo [3]; ` headline.py --methods" in md[0]
    assert re.search(r"from runs created (\S+ \S+) to \1 UTC", md[0]), md[0]
    assert re.search(r" UTC by coevo \d\S*, seeds: ", md[0]), md[0]  # which code made them
    assert "grpo: fewer than 3 seeds" in "\n".join(md)
    doc = json.loads((tmp_path / "headline.json").read_text())
    assert doc["provenance"]["seeds"] == {"grpo": [3]} and doc["provenance"]["commit"]
    (run,) = doc["outcomes"]["grpo"]
    assert run["seed"] == 3 and len(run["plain"]) == 16
    again = bootstrap_mean([[float(ok) for _, ok in run["plain"]]])
    assert (again.value, again.low, again.high) == tuple(
        doc["grpo"]["plain"][k] for k in ("value", "low", "high")
    )
    monkeypatch.setattr("sys.argv", [*argv, "--hard", "circuits"])  # refused before its reuse
    with pytest.raises(SystemExit, match="--hard circuits: no scenario plays that family"):
        headline.main()


def test_the_bank_round_is_paired_with_the_round_without_it_task_by_task() -> None:
    """The bank round plays the round's tasks again, in order: its gain is a paired
    difference (the docs compared two overlapping intervals); rounds that do not line up
    family by family are not paired."""
    headline = load_bench("headline")
    final = headline.Final(
        plain=[("heat", True), ("heat", False), ("circuit", False)],
        bank=[("heat", True), ("heat", True), ("circuit", True)],
    )
    assert headline.paired([final]) == [[0.0, 1.0, 1.0]]
    final.bank = final.bank[::-1]
    assert headline.paired([final]) == []


def test_a_failed_job_stops_the_runs_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One job of ``--parallel 2`` failed: the script exited and left the other ``coevo run``
    going as an orphan, which a retry then met writing into its directory."""
    import subprocess

    results = load_bench("method_results")
    started: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def kept(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc = popen(*args, **kwargs)  # type: ignore[call-overload]
        started.append(proc)
        return proc

    monkeypatch.setattr(subprocess, "Popen", kept)
    long = (ROOT / "scenarios" / "explore.toml", tmp_path / "long", 0, ["run.episodes=10000000"])
    bad = (tmp_path / "no-such.toml", tmp_path / "bad", 0)
    with pytest.raises(SystemExit, match="bad failed with exit 2"):
        results.run_all([long, bad], 2)
    assert len(started) == 2 and all(p.poll() is not None for p in started)


@pytest.mark.parametrize("script", ["headline", "method_results"])
def test_a_hard_family_no_scenario_lists_is_refused_before_anything_runs(
    script: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``--hard`` typo was refused only once every run had trained (hours)."""
    main = load_bench(script).main
    argv = [f"{script}.py", "--runs", str(tmp_path / "r"), "--hard", "circuits"]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as info:
        main()
    assert str(info.value.code).startswith(
        "coevo: error: --hard circuits: no scenario plays that family (they list: "
    )
    assert not (tmp_path / "r").exists()


def test_a_probe_of_another_size_is_not_reused_as_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """headline.py reused whatever ``probe.json`` a run held: ``--probe 300`` after a
    ``--probe 100`` reported the 100-episode probe as the 300-episode one."""
    import json
    import subprocess

    headline = load_bench("headline")
    run = tmp_path / "complementary-seed0"
    (run / "probe-100").mkdir(parents=True)
    (run / "probe-100" / "probe.json").write_text(json.dumps({"episodes": 100}))
    asked: list[list[str]] = []

    def probe(cmd: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        asked.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "probe.json").write_text(
            json.dumps({"episodes": int(cmd[cmd.index("--episodes") + 1])})
        )
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", probe)
    assert headline.probe_runs(tmp_path, [0], 300) == [{"episodes": 300}]
    assert headline.probe_runs(tmp_path, [0], 100) == [{"episodes": 100}]
    assert len(asked) == 1


def _outcomes_file(path: Path, method: str, seeds: dict[str, list[tuple[str, bool]]]) -> Path:
    import json

    runs = [
        {"seed": s, "plain": [list(x) for x in o], "bank": [], "adapt": {}}
        for s, o in seeds.items()
    ]
    path.write_text(json.dumps({"outcomes": {method: runs}}))
    return path


def test_a_seed_found_twice_names_where(tmp_path: Path) -> None:
    """A seed listed twice in one file was refused as "in another file too"."""
    paired = load_bench("paired_runs")
    tasks = [("heat", True)]
    one = _outcomes_file(tmp_path / "one.json", "m", {"0": tasks, "1": tasks})
    doc = json.loads(one.read_text())
    doc["outcomes"]["m"].append(doc["outcomes"]["m"][0])  # seed 0 again
    one.write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match=re.escape(f"{one}: seed 0 of m is twice in it")):
        paired.outcomes_of([one], "m")
    other = _outcomes_file(tmp_path / "other.json", "m", {"1": tasks})
    two = _outcomes_file(tmp_path / "two.json", "m", {"0": tasks, "1": tasks})
    with pytest.raises(SystemExit, match=re.escape(f"{other}: seed 1 of m is in {two} too")):
        paired.outcomes_of([two, other], "m")


def test_two_settings_are_paired_task_by_task_and_other_tasks_are_refused(tmp_path: Path) -> None:
    """`bench/paired_runs.py`, which RESULTS.md's novelty comparison quotes: per seed the
    difference of the same tasks' outcomes, seeds matched by name across files."""
    paired = load_bench("paired_runs")
    tasks = [("heat", False), ("heat", True), ("unlock", False), ("unlock", False)]
    better = [("heat", True), ("heat", True), ("unlock", True), ("unlock", False)]
    a = paired.outcomes_of(
        [_outcomes_file(tmp_path / "a0.json", "m", {"0": tasks}),
         _outcomes_file(tmp_path / "a1.json", "m", {"1": tasks})], "m",
    )  # fmt: skip
    b = paired.outcomes_of(
        [_outcomes_file(tmp_path / "b.json", "m", {"1": better, "0": tasks})], "m"
    )
    rows, gap = paired.table(a, b, ("x", "y"))
    assert rows[2:4] == ["| 0 | 0.250 | 0.250 | +0.000 |", "| 1 | 0.250 | 0.750 | +0.500 |"]
    assert gap.value == pytest.approx(0.25) and gap.seeds == 2 and gap.episodes == 8
    swapped = [("unlock", False), *tasks[1:]]
    c = paired.outcomes_of([_outcomes_file(tmp_path / "c.json", "m", {"0": swapped})], "m")
    with pytest.raises(SystemExit, match="seed 0: the two sides played other tasks"):
        paired.table(a, c, ("x", "y"))
    with pytest.raises(SystemExit, match="no seed in common"):
        paired.paired({"7": tasks}, b)
    with pytest.raises(SystemExit, match="no outcomes of method 'n'"):
        paired.outcomes_of([tmp_path / "b.json"], "n")
    # a variant shipped as a method of its own: --method-b names the second side's
    other = _outcomes_file(tmp_path / "n.json", "n", {"0": better})
    argv = ["paired_runs", "--method", "m", "--method-b", "n", "--a", str(tmp_path / "a0.json")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", [*argv, "--b", str(other), "--out", str(tmp_path / "t.md")])
        paired.main()
    assert "| 0 | 0.250 | 0.750 | +0.500 |" in (tmp_path / "t.md").read_text()


def test_a_reuse_of_no_method_is_refused_not_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outside tester's ``--reuse c52=DIR`` beside ``--baseline c25=...`` was dropped
    without a word: with RESULTS.md's ``--reuse grpo=...`` a typo trains every seed again."""
    main = load_bench("method_results").main
    grpo = ROOT / "scenarios" / "grpo.toml"
    argv = ["method_results.py", "--runs", str(tmp_path), "--seeds", "0", "--hard", "heat"]
    monkeypatch.setattr("sys.argv", [*argv, "--baseline", f"grpo={grpo}", "--reuse", "gpro=x"])
    with pytest.raises(
        SystemExit, match=r"coevo: error: --reuse gpro=x: 'gpro' is no --method or --baseline"
    ):
        main()


def test_a_run_directory_with_no_log_is_not_called_an_unfinished_run(tmp_path: Path) -> None:
    unfinished = load_bench("method_results").unfinished
    assert unfinished(tmp_path) == f"{tmp_path} holds no run (no log): remove it"
    (tmp_path / "log").mkdir()
    assert unfinished(tmp_path) == f"{tmp_path} holds an unfinished run: resume or remove it"
    assert unfinished(tmp_path, resume=False) == f"{tmp_path} holds an unfinished run: remove it"


def test_a_run_still_being_written_is_not_to_be_removed(tmp_path: Path) -> None:
    """headline.py and method_results.py told a user to remove a run another process was
    still training ("holds an unfinished run: resume or remove it")."""
    from engine.eventlog import new_run_meta
    from stores.lmdb_log import LmdbEventLog

    unfinished = load_bench("method_results").unfinished
    meta = new_run_meta("live", scenario_name="live", seed=0, coevo_version="test")
    with LmdbEventLog.create(tmp_path / "log", meta, durable=False):  # the writer holds its lock
        said = unfinished(tmp_path)
    assert (
        said
        == f"{tmp_path} holds a run still being written (a process writes its log): wait for it"
    )
    assert unfinished(tmp_path) == f"{tmp_path} holds an unfinished run: resume or remove it"


def test_paired_runs_refuses_what_it_cannot_pair_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An outside tester's: a run without outcomes (KeyError) or with none (ZeroDivisionError)
    and ``--out`` into a missing directory were tracebacks; labels with a ``|`` broke the
    table; runs made before evaluation drew its own seeds, and seeds one side lacks, were
    paired or left out without a word."""
    paired = load_bench("paired_runs")
    tasks = [("heat", False), ("heat", True)]
    for name, runs, said in [
        (
            "noplain",
            [{"seed": 0}],
            "not a headline JSON file (a run of m whose seed or held-out outcomes",
        ),
        ("empty", [{"seed": 0, "plain": []}], "seed 0 of m has no held-out episode"),
        # a string "false" was scored a success (an outside tester's)
        (
            "string",
            [{"seed": 0, "plain": [["heat", "false"]]}],
            "not a headline JSON file (a run of m whose seed or held-out outcomes are not as "
            "headline.py writes them: TypeError: outcome 'false' is not true or false)",
        ),
    ]:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"outcomes": {"m": runs}}))
        with pytest.raises(SystemExit, match=re.escape(f"{path}: {said}")):
            paired.outcomes_of([path], "m")
    gone = tmp_path / "gone.json"  # it said "not a headline JSON file ([Errno 2] ...)"
    with pytest.raises(SystemExit, match=re.escape(f"{gone}: cannot read it (No such file")):
        paired.outcomes_of([gone], "m")
    twice = _outcomes_file(tmp_path / "twice.json", "m", {"0": tasks})  # "seed 0 is twice in it"
    with pytest.raises(SystemExit, match=re.escape(f"{twice}: given more than once")):
        paired.outcomes_of([twice, twice], "m")
    a = _outcomes_file(tmp_path / "a.json", "m", {"0": tasks, "1": tasks})
    b = _outcomes_file(tmp_path / "b.json", "m", {"0": tasks})
    doc = json.loads(b.read_text())
    doc["provenance"] = {"runs_created": "2026-12-06 09:49 to 2026-12-06 10:40 UTC"}
    b.write_text(json.dumps(doc))
    base = ["paired_runs", "--method", "m", "--a", str(a), "--b", str(b)]
    for extra, said in [
        (["--out", str(tmp_path / "no" / "t.md")], f"--out {tmp_path / 'no' / 't.md'}: no dir"),
        (["--labels", "x", "x"], "--labels ['x', 'x']: two labels, not empty, and not the same"),
    ]:
        monkeypatch.setattr(sys, "argv", [*base, *extra])
        with pytest.raises(SystemExit, match=re.escape(said)):
            paired.main()
    monkeypatch.setattr(sys, "argv", [*base, "--labels", "a|b", "c"])
    paired.main()
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "| seed | a\\|b | c | c - a\\|b |"
    assert "seeds only a holds, left out: ['1']" in err
    assert f"{b}: its runs were made from 2026-12-06 09:49, before evaluation drew" in err
    assert str(a) not in err


def test_extractor_report_alone_refuses_a_run_without_an_extractor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run alone, it printed a row of zeros for a GRPO run, every seed as 0, and answered
    ``--help`` with "no finished run"."""
    from engine.eventlog import new_run_meta
    from engine.events import Envelope
    from engine.lifecycle import RunStarted, RunStopped
    from stores.lmdb_log import LmdbEventLog

    meta = new_run_meta("r", scenario_name="grpo", seed=3, coevo_version="0")
    log = LmdbEventLog.create(tmp_path / "run" / "log", meta, durable=False)
    started = RunStarted(run_id="r", scenario="grpo", scenario_hash="h", seed=3, coevo_version="0")
    events = [started, RunStopped(reason="completed")]
    log.append(
        [Envelope(seq=i, run="r", t=i, actor="runtime", event=e) for i, e in enumerate(events)]
    )
    log.close()
    main = load_bench("extractor_report").main
    monkeypatch.setattr(sys, "argv", ["extractor_report.py", str(tmp_path / "run")])
    with pytest.raises(SystemExit, match="run: no extractor call in this run"):
        main()
    monkeypatch.setattr(sys, "argv", ["extractor_report.py", "--help"])
    with pytest.raises(SystemExit) as caught:
        main()
    assert caught.value.code == 0


def test_paired_runs_pairs_the_rounds_with_the_bank_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    paired = load_bench("paired_runs")
    plain = [("heat", False), ("heat", False)]
    for name, bank in (("a", [("heat", False), ("heat", True)]), ("b", [("heat", True)] * 2)):
        doc = {"outcomes": {"m": [{"seed": 0, "plain": plain, "bank": bank}]}}
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    argv = ["paired_runs", "--method", "m", "--a", str(tmp_path / "a.json")]
    monkeypatch.setattr(sys, "argv", [*argv, "--b", str(tmp_path / "b.json"), "--bank"])
    paired.main()
    assert capsys.readouterr().out.splitlines()[2] == "| 0 | 0.500 | 1.000 | +0.500 |"
    monkeypatch.setattr(sys, "argv", [*argv, "--b", str(tmp_path / "b.json")])
    paired.main()
    assert capsys.readouterr().out.splitlines()[2] == "| 0 | 0.000 | 0.000 | +0.000 |"
    empty = tmp_path / "e.json"
    empty.write_text(json.dumps({"outcomes": {"m": [{"seed": 0, "plain": plain, "bank": []}]}}))
    with pytest.raises(SystemExit, match="seed 0 of m has no round with its bank"):
        paired.outcomes_of([empty], "m", "bank")


def test_a_headline_made_again_from_its_records_when_its_runs_are_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pre-registered test's runs take several sessions, and a session's machine (with the
    runs under /tmp) was lost between them: 41 finished runs went with it. ``--records`` keeps
    what the table needs of each finished run, the table made from the records alone is the
    table made from the runs, and ``--keep-only`` keeps records without making a table."""
    import shutil

    import msgspec

    headline = load_bench("headline")
    runs, records, out = tmp_path / "runs", tmp_path / "records", tmp_path / "out"
    small = ["run.episodes=32", "eval.final_episodes=16", "eval.episodes=8", "world.pool=16"]
    small += [f"policy.embedded.{k}" for k in TINY_MODEL]
    sets = [a for s in small for a in ("--set", f"grpo:{s}")]
    argv = ["headline.py", "--methods", "grpo", "--seeds", "3", "--probe", "0", *sets]
    argv += ["--runs", str(runs), "--out", str(out)]
    monkeypatch.setattr("sys.argv", argv)
    headline.main()  # trains the run; no record asked for
    assert not records.exists()
    monkeypatch.setattr("sys.argv", [*argv, "--records", str(records), "--keep-only"])
    with pytest.raises(SystemExit) as info:
        headline.main()
    assert info.value.code == f"kept 1 records under {records}; 1 of 1 runs finished"
    assert [p.name for p in records.iterdir()] == ["grpo-seed3.json"]
    written = (records / "grpo-seed3.json").stat().st_mtime_ns
    with pytest.raises(SystemExit, match="kept 1 records"):
        headline.main()  # the same run: its record is not written again
    assert (records / "grpo-seed3.json").stat().st_mtime_ns == written
    # another test's run's record in the same directory was written over without a word
    mine = (records / "grpo-seed3.json").read_text()
    other = headline.read_record(records / "grpo-seed3.json")
    other.meta = msgspec.structs.replace(other.meta, run_id="another")
    other.digest = headline._digest(other)  # a whole record, of another run
    (records / "grpo-seed3.json").write_bytes(msgspec.json.encode(other))
    with pytest.raises(SystemExit, match=r"grpo-seed3\.json holds the record of another run "):
        headline.main()
    table = [*argv[:5], "4", *argv[5:], "--records", str(records)]  # (--seeds 3 4)
    monkeypatch.setattr("sys.argv", table)
    with pytest.raises(SystemExit, match=r"grpo-seed3\.json holds the record of another run "):
        headline.main()  # at once: it was said once seed 4 had trained
    assert not (runs / "grpo-seed4").exists()
    monkeypatch.setattr("sys.argv", [*argv, "--records", str(records), "--keep-only"])
    (records / "grpo-seed3.json").write_text(mine)
    assert (out / "headline.md").read_text().startswith("Table made ")
    first = json.loads((out / "headline.json").read_text())
    shutil.rmtree(runs)  # the machine is gone
    monkeypatch.setattr("sys.argv", [*argv, "--records", str(records)])
    headline.main()  # nothing trains: the record stands for the run
    assert not runs.exists() or not any(runs.iterdir())
    again = json.loads((out / "headline.json").read_text())
    assert again["outcomes"] == first["outcomes"] and again["grpo"] == first["grpo"]
    assert again["provenance"]["runs_created"] == first["provenance"]["runs_created"]
    other = [*argv[:-4], "--set", "grpo:run.episodes=40", *argv[-4:]]  # not what was run
    monkeypatch.setattr("sys.argv", [*other, "--records", str(records)])
    said = r"grpo-seed3\.json holds a finished run of another scenario than scenarios/grpo\.toml "
    with pytest.raises(SystemExit, match=said + r".*\(run\.episodes differ\)"):
        headline.main()
    monkeypatch.setattr("sys.argv", [*argv, "--keep-only"])
    with pytest.raises(SystemExit, match="--keep-only writes records: name --records DIR"):
        headline.main()
    kept = json.loads((records / "grpo-seed3.json").read_text())
    for edit, said in [
        ({"meta": None}, "it holds no run metadata or scenario"),  # it passed any settings
        (
            {"meta": {**kept["meta"], "scenario_toml": kept["meta"]["scenario_toml"] + "#\n"}},
            "its scenario is not the one its run recorded (the hash differs: edited?)",
        ),
    ]:
        (records / "grpo-seed3.json").write_text(json.dumps({**kept, **edit}))
        monkeypatch.setattr("sys.argv", [*argv, "--records", str(records)])
        with pytest.raises(SystemExit, match=re.escape(said)):
            headline.main()
    (records / "grpo-seed3.json").write_text('{"name": "grpo"')  # cut short
    monkeypatch.setattr("sys.argv", [*argv, "--records", str(records)])
    with pytest.raises(SystemExit, match=r"grpo-seed3\.json: not a record of a run \("):
        headline.main()
    # its outcomes edited (the hash covered its scenario only), or it renamed: refused
    won = {
        **kept,
        "final": {**kept["final"], "plain": [[f, True] for f, _ in kept["final"]["plain"]]},
    }
    (records / "grpo-seed3.json").write_text(json.dumps(won))
    with pytest.raises(SystemExit, match=r"it is not as it was written \(its digest differs"):
        headline.main()
    (records / "grpo-seed3.json").write_text(json.dumps(kept))
    (records / "grpo-seed4.json").write_text(json.dumps(kept))
    monkeypatch.setattr("sys.argv", [*argv, "--seeds", "4", "--records", str(records)])
    with pytest.raises(SystemExit, match=r"it is the record of grpo-seed3 \(renamed or copied"):
        headline.main()
    # --keep-only counted a record it never read as a finished run
    (records / "grpo-seed4.json").write_text("garbage")
    monkeypatch.setattr(
        "sys.argv", [*argv, "--seeds", "4", "--records", str(records), "--keep-only"]
    )
    with pytest.raises(SystemExit, match=r"grpo-seed4\.json: not a record of a run"):
        headline.main()


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        # every "seed" was one run, counted as several (an outside tester's)
        (["--set", "grpo:seed=5"], "--set grpo:seed=5: seed is each run's own"),
        (["--set", "grpo:run.method=empo2"], "--set grpo:run.method=empo2: run.method is each"),
        (["--methods", "grpo", "grpo"], "--methods: ['grpo'] given more than once"),
        # refused when its turn came, after the seeds before it had trained
        (["--seeds", "-1"], "coevo: error: --seeds -1: "),  # (seeds 7 and -1)
        (["--records", "FILE"], "coevo: error: --records FILE: not a directory"),
        (["--out", "FILE"], "coevo: error: --out FILE: not a directory"),
        (["--out", "FILE/sub"], "coevo: error: --out FILE/sub: under FILE, not a directory"),
        (["--records", "GONE"], "coevo: error: --records GONE: a symbolic link to nothing"),
        (["--set", "grpo:run={method='empo2'}"], "a --set of the whole [run] table may set"),
        (["--methods", "grpo"], "--methods: ['grpo'] given more than once"),  # a second flag
        (["--seeds", "7"], "coevo: error: --seeds: [7] given more than once"),
    ],
)
def test_headline_refuses_what_would_mislead_before_any_run(
    extra: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each was accepted: a table of one run counted as several seeds, a row of another
    method, a run counted twice, or a failure once runs had trained (a traceback for a file
    where a directory goes)."""
    (tmp_path / "FILE").write_text("mine")
    (tmp_path / "GONE").symlink_to(tmp_path / "nowhere" / "x")
    monkeypatch.chdir(tmp_path)
    argv = ["headline.py", "--methods", "grpo", "--seeds", "7", "--probe", "0"]
    monkeypatch.setattr("sys.argv", [*argv, "--runs", str(tmp_path / "runs"), *extra])
    with pytest.raises(SystemExit) as info:
        load_bench("headline").main()
    assert said in str(info.value.code), info.value.code
    assert not (tmp_path / "runs").exists()


def test_a_stopped_results_script_stops_its_runs_and_says_so(tmp_path: Path) -> None:
    """SIGTERM (kill, a scheduler) ended the script at once and left its ``coevo run``
    training as an orphan, which a quick rerun met in its directory; Ctrl-C ended in a
    KeyboardInterrupt traceback."""
    import signal
    import subprocess
    import time

    from stores.lmdb_env import writer_alive

    out = tmp_path / "long"
    script = (
        "import sys; from pathlib import Path; sys.path.insert(0, 'bench'); "
        "from method_results import run_all; "
        f"run_all([(Path('scenarios/explore.toml'), Path({str(out)!r}), 0, "
        "['run.episodes=10000000'])], 1)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 240
    while not writer_alive(out / "log") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert writer_alive(out / "log"), "the run never started"
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 1
    assert f"stopped long (coevo resume {out} continues it)" in stdout.decode()
    last = stderr.decode().strip().splitlines()[-1]  # (after the run's own stop line)
    assert last.startswith("coevo: stopped: the runs it had started"), stderr
    assert "Traceback" not in stderr.decode()
    assert not writer_alive(out / "log")  # no orphan writes it


def test_two_results_scripts_do_not_start_runs_in_one_directory(tmp_path: Path) -> None:
    """A second script on the same --runs started the same run in the ~20 s before the first
    one's log existed; that run failed once it had started ("already holds a run")."""
    results = load_bench("method_results")
    first = results._hold(tmp_path)  # as the first script holds it while its runs go
    job = (tmp_path / "no-such.toml", tmp_path / "grpo-seed0", 0)
    with pytest.raises(SystemExit) as info:
        results.run_all([job], 1)
    assert str(info.value.code).startswith(f"coevo: error: another process runs runs in {tmp_path}")
    assert not (tmp_path / "grpo-seed0").exists()
    first.close()
    with pytest.raises(SystemExit, match="grpo-seed0 failed with exit 2"):  # its turn now
        results.run_all([job], 1)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--method", "x=a.toml", "--method", "x=b.toml"], "['x'] given more than once"),
        (["--method", "grpo=b.toml"], "['grpo'] given more than once"),  # the baseline's name
        (["--seeds", "-1"], "coevo: error: --seeds -1: "),  # (seeds 0 and -1)
        (["--runs", "FILE"], "coevo: error: --runs FILE: not a directory"),
    ],
)
def test_method_results_refuses_what_would_mislead_before_any_run(
    argv: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """headline.py's refusals, which method_results.py lacked: a name given twice kept the
    last scenario without a word, a seed of -1 was refused after seed 0 had trained, a file
    for --runs was a traceback."""
    (tmp_path / "FILE").write_text("mine")
    monkeypatch.chdir(tmp_path)
    grpo = str(ROOT / "scenarios" / "grpo.toml")
    base = ["m.py", "--baseline", f"grpo={grpo}", "--seeds", "0"]
    base += [] if "--runs" in argv else ["--runs", str(tmp_path / "runs")]
    monkeypatch.setattr("sys.argv", [*base, *argv])
    with pytest.raises(SystemExit) as info:
        load_bench("method_results").main()
    assert said in str(info.value.code), info.value.code
    assert not (tmp_path / "runs").exists()


def test_a_probe_of_runs_known_only_by_their_records_is_refused_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the default --probe, a table made from records ran ``coevo probe`` on run
    directories that were gone: a traceback once every other run had trained, and no table."""
    headline = load_bench("headline")
    records = tmp_path / "records"
    records.mkdir()
    for name in ("complementary", "complementary-frozen"):  # records of the settings asked
        (records / f"{name}-seed3.json").write_text("{}")
    kept = type("R", (), {"meta": None})()
    monkeypatch.setattr(headline, "record_of", lambda name, seed, run, rec: kept)
    monkeypatch.setattr(headline, "refuse_reused", lambda *args, **kwargs: None)
    argv = ["headline.py", "--methods", "complementary", "complementary-frozen", "--seeds", "3"]
    argv += ["--runs", str(tmp_path / "runs"), "--records", str(records), "--probe", "8"]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as info:
        headline.main()
    assert str(info.value.code).startswith("coevo: error: --probe plays each Complementary RL")
    assert not (tmp_path / "runs").exists()


def test_a_probe_stopped_or_failing_is_one_line_and_a_run_without_updates_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM while probing ended the script and left ``coevo probe`` running (its Ctrl-C a
    traceback); a probe that failed was a CalledProcessError traceback; a run whose extractor
    never updated had no "last" bank, and the summary was a KeyError."""
    import subprocess

    headline = load_bench("headline")

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # as the SIGTERM handler raises it (run() kills its child)

    monkeypatch.setattr(subprocess, "run", interrupted)
    with pytest.raises(SystemExit, match="coevo: stopped while probing: its probe was stopped"):
        headline.probe_runs(tmp_path, [0], 8)
    failed = subprocess.CompletedProcess([], 2)
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(
        SystemExit, match=r"coevo probe of .*complementary-seed0 failed with exit 2"
    ):
        headline.probe_runs(tmp_path, [0], 8)
    banks = [
        {"label": "no bank", "version": None, "outcomes": [0.0, 1.0]},
        {"label": "v0", "version": 0, "outcomes": [1.0, 0.0]},
    ]
    lines, summary = headline.probe_summary([{"episodes": 2, "banks": banks}])
    assert lines == [
        "coevo probe of 1 seeds: no run's extractor was updated (every bank is version 0's): "
        "co-evolution not measured"
    ]
    assert summary["shown"] is False
