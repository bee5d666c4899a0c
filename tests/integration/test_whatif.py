"""``coevo audit RUN whatif EPISODE``: the tiny Complementary RL run's guided episodes replayed
from their seeds on the built-in (deterministic) world: unchanged, the replay gives back the
log; without the entry, with another, or at another policy version, it shows the change. Two
tiny GRPO runs more: one trained with LoRA adapters (its checkpoints are adapters, loaded on the
base), one whose episodes the run cut at ``[world] max_turns`` (the replay stops there too)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pytest
from test_grpo_run import TINY, of, read_events

from agents.audit.whatif import (
    Change,
    Played,
    PlayedTurn,
    Prompting,
    Recorded,
    replay,
    what_if,
)
from agents.events.episodes import EpisodeFinished
from agents.events.extractor import CreditAssigned
from agents.events.memory import TipStored
from agents.events.policy import ActionRequested, ActionSampled, PolicyUpdated
from engine.world import Observation, Task
from scenarios.cli import main
from stores.checkpoints import ADAPTER_FILE, WEIGHTS_FILE
from stores.lmdb_log import LmdbEventLog


@pytest.fixture(scope="module")
def run(distill_root: Path) -> Path:
    return distill_root / "run"


@pytest.fixture
def cached(distill_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COEVO_CACHE", str(distill_root / "cache"))  # the run's embedded model


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache the tiny GRPO runs below build their embedded model in (once for both)."""
    return tmp_path_factory.mktemp("whatif-cache")


@pytest.fixture
def tiny_cached(tiny_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COEVO_CACHE", str(tiny_cache))


def _tiny_run(root: Path, cache: Path, text: str) -> Path:
    (root / "scenario.toml").write_text(text)
    mp = pytest.MonkeyPatch()
    mp.setenv("COEVO_CACHE", str(cache))
    try:
        assert (
            main(["run", str(root / "scenario.toml"), "--out", str(root / "run"), "--quiet"]) == 0
        )
    finally:
        mp.undo()
    return root / "run"


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory, tiny_cache: Path) -> Path:
    text = TINY.replace("[policy]\n", "[policy]\nlora = { r = 4, alpha = 8 }\n")
    return _tiny_run(tmp_path_factory.mktemp("whatif-lora"), tiny_cache, text)


@pytest.fixture(scope="module")
def truncated_run(tmp_path_factory: pytest.TempPathFactory, tiny_cache: Path) -> Path:
    text = TINY.replace("[world]\n", "[world]\nmax_turns = 8\n")  # the world ends them at 18
    return _tiny_run(tmp_path_factory.mktemp("whatif-turns"), tiny_cache, text)


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
def test_the_replay_acts_through_the_runs_backend(
    run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy replays through the backend the run's ``[policy] backend`` names (the
    replay built the default one, whatever the run sampled with)."""
    from agents.models.backend import BACKENDS, HfBackend

    scored: list[int] = []

    class Named(HfBackend):
        def score(self, *args: Any, **kwargs: Any) -> Any:
            scored.append(1)
            return super().score(*args, **kwargs)

    monkeypatch.setitem(BACKENDS, "hf", Named)
    credit = of(read_events(run), CreditAssigned)[0]
    w = _whatif(run, credit.episode, "--without-tip", str(credit.entry), capsys=capsys)
    assert w["reproduced"] is True and scored


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
    envs = list(LmdbEventLog.open(run / "log").read())
    ended = next(
        e.seq
        for e in envs
        if isinstance(e.event, EpisodeFinished) and e.event.episode == credit.episode
    )
    later = next(e.event.tip_id for e in envs if isinstance(e.event, TipStored) and e.seq > ended)
    change = ("--with-tip", str(later), "--without-tip", str(credit.entry))
    w = _whatif(run, credit.episode, *change, capsys=capsys)
    assert f"entry {later} was stored at seq" in w["note"] and f"(seq {ended})" in w["note"]
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
    (played,) = {s.policy_version for s in of(events, ActionSampled) if s.episode == credit.episode}
    for args, message in (
        (  # replayed twice, the same trajectory side by side
            ["--version", str(played)],
            f"episode {credit.episode} was played by policy version {played} at every turn: "
            f"--version {played} replays it unchanged (another version asks what it did)",
        ),
        ([], "whatif needs a change: --without-tip ID, --with-tip ID or --version N"),
        (
            ["--without-tip", str(other)],
            f"episode {credit.episode} was not shown entry {other} (it was shown: {shown})",
        ),
        (["--version", "99"], "the run has no policy version 99"),
        (
            ["--with-tip", str(shown)],
            f"episode {credit.episode} was shown entry {shown} already: showing it again adds "
            f"a duplicate, not the entry (--without-tip {shown} asks what it did)",
        ),
        (
            ["--without-tip", str(shown), "--with-tip", str(shown)],
            f"entry {shown} instead of entry {shown} changes nothing",
        ),
    ):
        capsys.readouterr()
        assert main(["audit", str(run), "whatif", credit.episode, *args]) == 2
        assert capsys.readouterr().err == f"coevo: error: {message}\n"
    assert main(["audit", str(run), "whatif", "ep999999", "--version", "0"]) == 2
    assert "no episode 'ep999999' in this run" in capsys.readouterr().err


@pytest.mark.usefixtures("tiny_cached")
def test_a_lora_run_replays_its_adapters_on_the_base(
    lora_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    events = read_events(lora_run)
    updates = of(events, PolicyUpdated)
    last = updates[-1]
    saved = lora_run / last.checkpoint
    assert (saved / ADAPTER_FILE).is_file() and not (saved / WEIGHTS_FILE).exists()
    versions: dict[str, set[int]] = {}
    for s in of(events, ActionSampled):
        versions.setdefault(s.episode, set()).add(s.policy_version)
    # the final evaluation round's episodes are played by the last version only
    episode = next(e for e, v in versions.items() if v == {last.policy_version})
    # the control's actions come from the last checkpoint; the change's from the base with the
    # run's untrained adapters (version 0), whose digest the first update records
    w = _whatif(lora_run, episode, "--version", "0", capsys=capsys)
    assert w["reproduced"] is True
    assert {t["version"] for t in w["control"]["turns"]} == {last.policy_version}
    assert {t["version"] for t in w["changed"]["turns"]} == {0}
    assert [t["logp"] for t in w["changed"]["turns"]] != [t["logp"] for t in w["control"]["turns"]]
    pruned = tmp_path / "run"  # a copy whose version 1 is gone, as grpo.keep_checkpoints prunes
    shutil.copytree(lora_run, pruned)
    shutil.rmtree(pruned / updates[0].checkpoint)
    capsys.readouterr()
    assert main(["audit", str(pruned), "whatif", episode, "--version", "1"]) == 2
    assert capsys.readouterr().err == (
        f"coevo: error: the checkpoint of policy version 1 ({updates[0].checkpoint}) is no "
        "longer on disk (runs keep the newest few: grpo.keep_checkpoints); the change (policy "
        "version 1) needs it\n"
    )
    shutil.rmtree(pruned / last.checkpoint)  # the version that played it: the control's
    assert main(["audit", str(pruned), "whatif", episode, "--version", "0"]) == 2
    err = capsys.readouterr().err
    assert f"({last.checkpoint}) is no longer on disk" in err, err
    assert err.endswith(
        f"; episode {episode} was played by policy version {last.policy_version}, and the "
        "control (the episode replayed as it was played, which the change is compared with) "
        "needs each\n"
    ), err


@pytest.mark.usefixtures("tiny_cached")
def test_an_episode_cut_at_max_turns_replays_as_many_turns(
    truncated_run: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    events = read_events(truncated_run)
    fin = next(f for f in of(events, EpisodeFinished) if f.truncated and f.purpose == "train")
    assert fin.steps == 8
    w = _whatif(truncated_run, fin.episode, "--version", "1", capsys=capsys)
    assert w["reproduced"] is True
    assert len(w["control"]["turns"]) == len(w["changed"]["turns"]) == 8
    assert w["control"]["score"] == fin.score and w["control"]["success"] == fin.success
    capsys.readouterr()
    assert main(["audit", str(truncated_run), "whatif", fin.episode, "--version", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("control: replayed unchanged, it gives back the logged trajectory (8")
    assert len(out) == 3 + 8 + 2  # header lines, the 8 turns, both outcomes and the effect


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
    assert strays.strayed == "at turn 1, 'take key' where the log has 'open box'"

    # a log-prob rounded otherwise (the run's request was scored in a batch, the replay's
    # alone: 2e-6 apart in an EMPO2 run) is the same; beyond float32 rounding it is not
    def nudged(by: float) -> Played:
        played = _played("look", "open box")
        turn = msgspec.structs.replace(played.turns[1], logp=-1.0 + by)
        return msgspec.structs.replace(played, turns=(played.turns[0], turn))

    assert what_if(rec, nudged(2e-6), _played("look", "take key"), change).reproduced
    off = what_if(rec, nudged(1e-3), _played("look", "take key"), change)
    assert (
        off.strayed
        == "at turn 1, the same action with log-prob -0.999000 where the log has -1.000000"
    )
    short = what_if(rec, _played("look"), _played("look"), change)
    assert short.strayed == "the replay played 1 turns, the log 2"
    assert same.strayed == ""
    # why it strayed: another machine kind first; on the same kind, the world or a defect
    from scenarios.cli.whatif import _whatif_lines  # pyright: ignore[reportPrivateUsage]

    def why(logged: str, here: str) -> str:
        w = msgspec.structs.replace(strays, logged_machine=logged, machine=here)
        lines = _whatif_lines(w)
        assert "does NOT give back the logged trajectory: at turn 1, 'take key'" in lines[1]
        return lines[2]

    assert "the log was written on A; this is B: a model re-executes" in why("A", "B")
    assert "the log does not record the machine that wrote it (this is B)" in why("", "B")
    assert "a defect of the replay: please report it" in why("B", "B")
    with pytest.raises(ValueError, match="a what-if changes one thing"):
        Change(without=3, version=2)
    # a world's huge (finite) score is written short, not as 300 digits
    big = msgspec.structs.replace(_played("look"), score=1e308)
    lines = _whatif_lines(what_if(rec, _played("look", "open box"), big, change))
    assert "failure, score 1e+308, 1 steps" in "\n".join(lines)
    assert "score +1e+308" in lines[-1] and max(map(len, lines)) < 200


class _Corridor:
    """A world whose episodes end after five steps, the score counting them."""

    def reset(self, task: Task, seed: int) -> Observation:
        self.steps = 0
        return Observation(text="0", admissible=("go",), goal="the end")

    def step(self, action: str) -> Observation:
        self.steps += 1
        k = self.steps
        return Observation(text=str(k), admissible=("go",), goal="the end", done=k == 5, score=k)


def test_the_replay_stops_at_the_runs_max_turns_and_at_a_cap_without_one() -> None:
    asked = ActionRequested(
        episode="ep1", worker="w", turn=0, messages=(), admissible=("go",), seed=1
    )
    rec = Recorded(
        episode="ep1",
        task=Task(family="f", variant=0),
        seed=1,
        purpose="train",
        requests=(asked,),
        sampled=(cast(Any, SimpleNamespace(policy_version=0)),),
        played=_played(),
        shown={},
        credits=(),
    )
    runner = SimpleNamespace(answer=lambda asked: [SimpleNamespace(action="go", logp=-1.0)])
    prompting = Prompting(window=4, list_actions=True, system="", memory="user")
    played = [
        replay(rec, cast(Any, _Corridor()), lambda _: cast(Any, runner), prompting, max_turns=m)
        for m in (0, 3, 9)
    ]
    assert [(p.steps, p.score) for p in played] == [(5, 5.0), (3, 3.0), (5, 5.0)]
    # a run without a limit: a replay still ends, at the cap (a world that never ends)
    from agents.audit import whatif

    was, whatif.UNLIMITED_CAP = whatif.UNLIMITED_CAP, 4
    try:
        capped = replay(
            rec, cast(Any, _Corridor()), lambda _: cast(Any, runner), prompting, max_turns=0
        )
    finally:
        whatif.UNLIMITED_CAP = was
    assert capped.steps == 4


@pytest.mark.usefixtures("cached")
@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ("raise", "world.step({}) on turn 1 raised RuntimeError: the simulator lost its state"),
        (
            "nan",
            "world.step({}) on turn 1 returned an observation whose score is nan, not a finite",
        ),
        ("hang", "world.step({}) on turn 1 did not return within 0.5 s (world.step_timeout)"),
    ],
)
def test_a_world_that_fails_under_the_replay_is_one_line_and_exit_1(
    run: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
    said: str,
) -> None:
    """The replay calls the world behind the env worker's guards, with the run's
    ``[world] step_timeout`` (here 0.5 s): no traceback, no wait without end, no NaN result."""
    import scenarios.whatif_setup as setup

    real = setup.world_factory

    def failing(scenario: Any, source: str) -> Any:
        make = real(scenario, source)

        def build() -> Any:
            world = make()
            step = world.step
            count = [0]

            def faulty(action: str) -> Observation:
                count[0] += 1
                obs = step(action)
                if count[0] == 2:
                    if fault == "raise":
                        raise RuntimeError("the simulator lost its state")
                    if fault == "hang":
                        import time

                        time.sleep(30)
                    return msgspec.structs.replace(obs, score=float("nan"))
                return obs

            world.step = faulty
            world.blocking = True  # called in a thread, under the deadline
            return world

        return build

    monkeypatch.setattr(setup, "world_factory", failing)
    credit = of(read_events(run), CreditAssigned)[0]
    played = [t for t in _recorded_actions(run, credit.episode)]
    capsys.readouterr()
    tip = ["--without-tip", str(credit.entry)]
    here = ["--set", "world.step_timeout=0.5"]  # a setting of this machine, not the run's
    code = main(["audit", str(run), "whatif", credit.episode, *tip, *here])
    err = capsys.readouterr().err
    assert code == 1, err
    prefix = f"coevo: error: replaying episode {credit.episode}: "
    assert err.startswith(prefix + said.format(repr(played[1]))), err
    assert err.count("\n") == 1


def _recorded_actions(run: Path, episode: str) -> list[str]:
    from agents.events.episodes import StepTaken

    return [s.action for s in of(read_events(run), StepTaken) if s.episode == episode]
