"""A method plug-in's mistakes stop at coevo's boundary, in one line: at ``validate`` for what
can be known before a run (its import, constructor, settings, attributes and actors), in the
run's ``run_failed`` for what its hooks return while it runs (non-finite advantages, a mode
that asks a memory nobody keeps), and never as NaN weights a completed run would hand on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_blocks import doc_block
from safetensors.torch import load_file

from agents.events.policy import AdvantagesComputed, PolicyUpdated
from engine.lifecycle import RunFailed
from scenarios.cli import main
from stores.lmdb_log import LmdbEventLog

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = """
import math
import sys

from agents.methods.base import Scored
from agents.methods.builtin import Empo2, Grpo
from engine.actor import ActorSpec


class Raises(Grpo):
    def __init__(self, grpo, settings):
        raise RuntimeError("no such thing")


class Exits(Grpo):
    def __init__(self, grpo, settings):
        sys.exit(4)


class NoArgs(Grpo):
    def __init__(self):
        pass


class FiveSettings(Grpo):
    Settings = 5


class NegativeWarmup(Grpo):
    warmup = -5


class TextWarmup(Grpo):
    warmup = "2"


class UnknownMemoryEval(Grpo):
    memory_eval = "bogus"


class MemoryEvalWithoutMemory(Grpo):
    memory_eval = "tips"


class ActorsRaise(Grpo):
    def actors(self, run):
        raise KeyError("where")


class ActorsNotSpecs(Grpo):
    def actors(self, run):
        return ["x"]


class ActorNamedTrainer(Grpo):
    def actors(self, run):
        return [ActorSpec(name="trainer", factory=lambda: None)]


class NanScore(Grpo):
    def score(self, outcomes, rollouts, similar):
        s = super().score(outcomes, rollouts, similar)
        return Scored(s.rewards, tuple(math.nan for _ in s.advantages), s.rule)


class RaisingScore(Grpo):
    def score(self, outcomes, rollouts, similar):
        raise ValueError("my score exploded")


class PluginError(BaseException):  # derived from BaseException by mistake
    pass


class BaseScore(Grpo):
    def score(self, outcomes, rollouts, similar):
        raise PluginError("my score exploded")


class BaseRaises(Grpo):
    def __init__(self, grpo, settings):
        raise PluginError("no such")


class HugeScore(Grpo):
    def score(self, outcomes, rollouts, similar):
        s = super().score(outcomes, rollouts, similar)
        return Scored(s.rewards, tuple(1e300 for _ in s.advantages), s.rule)


class TipsWithoutMemory(Grpo):
    def rollout(self, run_seed, step, index, member):
        return "tips"


class LossReturnsNone(Grpo):
    def loss(self, req):
        return None


class LossClipsAdvantages(Grpo):  # the audit re-derives score()'s advantages: check failed
    def loss(self, req):
        return req.__replace__(advantages=tuple(max(-0.1, min(0.1, a)) for a in req.advantages))


class StepEventsDict(Grpo):
    def step_events(self, step):
        return {"step": step}


class ShapeMovesFamily(Grpo):  # every episode aborted, the method named nowhere
    def shape(self, job, task):
        return job.__replace__(family="elsewhere")


class NoneAdvantages(Grpo):  # a TypeError naming neither the method nor the hook
    def score(self, outcomes, rollouts, similar):
        s = super().score(outcomes, rollouts, similar)
        return Scored(s.rewards, None, s.rule)


class ShapeRaises(Grpo):  # these three read as the trainer's own errors
    def shape(self, job, task):
        raise RuntimeError("shape exploded")


class LossRaises(Grpo):
    def loss(self, req):
        raise RuntimeError("loss exploded")


class StepEventsRaises(Grpo):
    def step_events(self, step):
        raise RuntimeError("step_events exploded")


class IntRule(Grpo):
    def score(self, rewards, *args, **kwargs):
        s = super().score(rewards, *args, **kwargs)
        return Scored(s.rewards, s.advantages, 7)


class UnrecordedDistill(Empo2):
    records_rollouts = False  # its distill episodes trained as plain, its audit failed

    def rollout(self, run_seed, step, index, member):
        return "distill"



"""

EXITS_ON_IMPORT = "import sys\nsys.exit(3)\n"


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("boundary")
    (root / "boundary_methods.py").write_text(textwrap.dedent(PLUGIN))
    (root / "boundary_exits.py").write_text(EXITS_ON_IMPORT)
    scenario = doc_block(ROOT / "docs" / "METHODS.md", "# insights.toml")  # a tiny model
    scenario = scenario.replace('"insights:Insights"', '"grpo"').replace(
        "[method]\nshown = 2\n", ""
    )
    (root / "base.toml").write_text(scenario)
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(root))
    mp.setenv("COEVO_CACHE", str(root / "cache"))
    yield root
    mp.undo()


def validate(plugins: Path, setting: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``coevo validate`` of the tiny scenario with ``--set SETTING``: its code and stderr."""
    code = main(["validate", str(plugins / "base.toml"), "--set", setting])
    return code, capsys.readouterr().err


LABEL = "method 'grpo' (boundary_methods:{})"
"""How messages name a plug-in that subclasses GRPO: its inherited name alone sent its author
to coevo's own GRPO."""


def cli(*args: str, path: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    """``coevo ARGS`` in a process of its own, ``path`` on PYTHONPATH (ROOT after it), with
    ``env`` added to the environment."""
    paths = os.pathsep.join(dict.fromkeys([str(path), str(ROOT)]))
    return subprocess.run(
        [sys.executable, "-m", "scenarios.cli", *args],
        capture_output=True, text=True, timeout=600, cwd=ROOT, check=False,
        env={**os.environ, "PYTHONPATH": paths, **env},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("method", "says"),
    [
        ("Raises", "could not be built: Raises(grpo, settings) raised RuntimeError: no such"),
        ("Exits", "raised SystemExit: 4"),
        ("BaseRaises", "could not be built: BaseRaises(grpo, settings) raised PluginError: no"),
        ("NoArgs", "raised TypeError: "),
        ("FiveSettings", "its Settings (5) cannot take the options"),
        ("NegativeWarmup", f"{LABEL.format('NegativeWarmup')}: warmup must be an int >= 0, got -5"),
        ("TextWarmup", "warmup must be an int >= 0, got '2'"),
        (
            "UnknownMemoryEval",
            f"{LABEL.format('UnknownMemoryEval')}: memory_eval is 'bogus', not a",
        ),
        ("ActorsRaise", f"{LABEL.format('ActorsRaise')}: actors() raised KeyError: 'where'"),
        ("ActorsNotSpecs", "actors() returned 'x', not an ActorSpec"),
        ("ActorNamedTrainer", "two actors are named ['trainer']"),
    ],
)
def test_what_can_be_known_before_a_run_is_one_line_at_validate(
    plugins: Path, method: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each was a traceback, a hang (a negative warm-up, a memory round without a memory), or
    a run recorded as 0% (an unknown ``memory_eval`` aborted every episode of its round)."""
    code, err = validate(plugins, f'run.method="boundary_methods:{method}"', capsys)
    assert code == 2 and err.count("\n") == 1 and says in err, err


def test_a_module_that_exits_on_import_is_one_line(
    plugins: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = validate(plugins, 'run.method="boundary_exits:X"', capsys)
    assert code == 2 and "cannot import method module 'boundary_exits': SystemExit: 3" in err


@pytest.mark.parametrize(
    ("method", "says"),
    [
        ("NanScore", f"{LABEL.format('NanScore')}: score returned advantages that are not finite"),
        ("HugeScore", "UpdateNotFinite: policy update 0: loss "),
        (
            "RaisingScore",
            f"{LABEL.format('RaisingScore')}: score raised ValueError: my score exploded",
        ),
        ("BaseScore", f"{LABEL.format('BaseScore')}: score raised PluginError: my score exploded"),
        ("TipsWithoutMemory", "rollout() returned 'tips', which asks the memory, but no actor"),
        ("MemoryEvalWithoutMemory", "memory_eval is 'tips', which asks the memory, but no actor"),
        ("UnrecordedDistill", "rollout() returned 'distill' and records_rollouts is false"),
        ("LossReturnsNone", f"{LABEL.format('LossReturnsNone')}: loss() returned NoneType, not"),
        ("LossClipsAdvantages", "loss() changed the request's advantages: it sets loss settings"),
        ("StepEventsDict", "step_events() returned {'step': 0}, not a sequence of events"),
        ("IntRule", f"{LABEL.format('IntRule')}: score returned the rule 7, not its name as text"),
        ("ShapeMovesFamily", "shape() changed the job's family: it adds requests only"),
        (
            "NoneAdvantages",
            f"{LABEL.format('NoneAdvantages')}: score returned advantages None, not a sequence",
        ),
        (
            "ShapeRaises",
            f"{LABEL.format('ShapeRaises')}: shape() raised RuntimeError: shape exploded",
        ),
        ("LossRaises", f"{LABEL.format('LossRaises')}: loss() raised RuntimeError: loss exploded"),
        (
            "StepEventsRaises",
            f"{LABEL.format('StepEventsRaises')}: step_events() raised RuntimeError: step_events "
            "exploded",
        ),
    ],
)
def test_what_a_hook_returns_while_it_runs_fails_the_run_before_it_harms_the_model(
    plugins: Path, method: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN or 1e300 advantages completed the run with every weight NaN (and ``check`` passed
    for 1e300); a ``tips`` rollout without a memory actor waited forever."""
    out = plugins / method
    args = ["run", str(plugins / "base.toml"), "--out", str(out), "--quiet"]
    assert main([*args, "--set", f'run.method="boundary_methods:{method}"']) == 1
    err = capsys.readouterr().err  # the first run builds the tiny model and logs it
    assert "Traceback" not in err and says in err.splitlines()[-1], err
    with LmdbEventLog.open(out / "log") as log:
        events = [env.event for env in log.read(0, None)]
    assert isinstance(events[-1], RunFailed)
    assert not [e for e in events if isinstance(e, PolicyUpdated)]  # nothing was applied
    for version in (out / "checkpoints").glob("v*"):
        weights = load_file(str(version / "model.safetensors"))
        assert all(bool(t.isfinite().all()) for t in weights.values())


def broken_entry_point(where: Path, group: str, line: str) -> None:
    """An installed distribution (its metadata in ``where``, a directory on the path) whose
    entry point ``line`` of ``group`` names a module that does not exist."""
    info = where / "broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{line}\n")


def test_a_broken_events_entry_point_is_a_warning_not_a_traceback_in_every_command(
    tmp_path: Path,
) -> None:
    """An installed package whose ``coevo.events`` module fails to import made every command
    that reads a log (``log``, ``replay``, ``check``, ``run``) a traceback."""
    broken_entry_point(tmp_path, "coevo.events", "broken = no_such_events_module")
    run = tmp_path / "run"
    explore = str(ROOT / "scenarios" / "explore.toml")
    for args in (
        ["run", explore, "--out", str(run), "--quiet", "--set", "run.episodes=4"],
        ["log", str(run), "--limit", "1"],
    ):
        done = cli(*args, path=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stderr.startswith(
            "coevo: warning: the coevo.events entry point 'broken' (no_such_events_module) "
            "could not be imported (ModuleNotFoundError"
        ), done.stderr
        assert "Traceback" not in done.stderr


def test_a_broken_invariants_entry_point_is_a_note_and_fails_only_strict(tmp_path: Path) -> None:
    """An installed package whose ``coevo.invariants`` module fails to import made ``check`` and
    ``replay --verify`` a traceback on every run."""
    broken_entry_point(tmp_path, "coevo.invariants", "mine = no_such_checks_module")
    run = tmp_path / "run"
    explore = str(ROOT / "scenarios" / "explore.toml")
    made = cli(
        "run", explore, "--out", str(run), "--quiet", "--set", "run.episodes=4", path=tmp_path
    )
    assert made.returncode == 0, made.stderr
    note = (
        "the coevo.invariants entry point 'mine' (no_such_checks_module) could not be imported "
        "(ModuleNotFoundError: No module named 'no_such_checks_module'): its invariants are not "
        "checked"
    )
    for args, code in (
        (["check", str(run)], 0),
        (["replay", str(run), "--verify"], 0),
        (["check", str(run), "--strict"], 1),
    ):
        done = cli(*args, path=tmp_path)
        assert done.returncode == code and note in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and done.stderr.count(note) == 1, done.stderr


NOTING = """
from agents.events.policy import AdvantagesComputed
from agents.methods.builtin import Grpo
from engine.actor import Actor, ActorSpec
from engine.events import Event, event


@event
class GroupNoted(Event, frozen=True, kw_only=True, tag="boundary_group_noted"):
    group: str


class Noter(Actor):
    subscribes = (AdvantagesComputed,)

    async def run(self, ctx):
        async for env in ctx.events():
            await ctx.emit(GroupNoted(group=env.event.group))


class Noting(Grpo):
    def actors(self, run):
        return [ActorSpec(name="noter", factory=Noter)]
"""


def test_a_plugin_methods_own_events_are_read_by_a_reader_that_can_import_it(
    plugins: Path,
) -> None:
    """A method named by import path recorded events only its module registers: ``coevo
    log``, ``replay``, ``report`` and ``diff`` said "unknown event kind" even with the module
    on the path (only a ``coevo.events`` entry point was imported). Readers import the run's
    method module."""
    (plugins / "boundary_noting.py").write_text(NOTING)
    out = plugins / "noting"
    run = ["run", str(plugins / "base.toml"), "--out", str(out), "--quiet"]
    run += ["--set", 'run.method="boundary_noting:Noting"']
    # each in a process of its own: the plug-in's event type stays out of this one's registry
    for command in (run, ["log", str(out), "--kind", "boundary_group_noted"], ["replay", str(out)]):
        done = cli(*command, path=plugins)
        assert done.returncode == 0, done.stderr
    assert done.stdout  # the replayed state
    # a data frame of the plug-in's kind, in a fresh process (the kind was refused there
    # before the run's method module was imported)
    code = f"from agents.analysis.frames import events_frame as f; print(len(f({str(out)!r}, "
    code += "'boundary_group_noted')))"
    paths = os.pathsep.join([str(plugins), str(ROOT)])
    frame = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": paths}, check=False,
    )  # fmt: skip
    assert frame.returncode == 0 and int(frame.stdout) > 0, frame.stderr
    # without the module on the path: its kind is unknown, and the error says which module
    done = cli("replay", str(out))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "unknown event kind 'boundary_group_noted'" in done.stderr
    assert (
        "the run's method 'boundary_noting:Noting' did not import here (cannot import method "
        "module 'boundary_noting'"
    ) in done.stderr
    assert done.stderr.rstrip().endswith("put its module on PYTHONPATH")
    # log --kind of its kind, and report, said nothing of the module (a near kind; a bare seq)
    # ... nor did replay --verify
    for command in (
        ["log", str(out), "--kind", "boundary_group_noted"],
        ["report", str(out)],
        ["replay", str(out), "--verify"],
    ):
        done = cli(*command)
        assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
        last = done.stderr.splitlines()[-1]  # verify's notes (what it left out) come first
        assert last.startswith("coevo: error: "), done.stderr
        assert "the run's method 'boundary_noting:Noting' did not import here" in last
        assert done.stderr.count("\n") == 1 or command[-1] == "--verify", done.stderr


def test_verify_without_the_runs_plugin_leaves_its_check_out_with_a_note(plugins: Path) -> None:
    """``replay --verify`` of a run whose plug-in method no longer imports was a traceback
    (``check`` left the credit invariant out with a note, as ``verify`` now does)."""
    (plugins / "boundary_gone.py").write_text(
        "from agents.methods.builtin import Grpo\n\nclass Gone(Grpo):\n    pass\n"
    )
    out = plugins / "gone"
    args = ["run", str(plugins / "base.toml"), "--out", str(out), "--quiet"]
    assert main([*args, "--set", 'run.method="boundary_gone:Gone"']) == 0
    (plugins / "boundary_gone.py").unlink()
    done = cli("replay", str(out), "--verify")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "coevo: note: credit: not checked: cannot be built for this run: cannot import " in (
        done.stderr
    )
    assert done.stdout.startswith("verified ")


def test_a_plugin_that_inherits_coevo_s_score_is_judged_as_coevo_s() -> None:
    """A group coevo's own ``score`` refuses is the log's doing, also in the run of a plug-in
    that inherits it (it was "not checked" there, hiding a damaged log)."""
    from agents.audit.derive import _coevo_score  # pyright: ignore[reportPrivateUsage]
    from agents.methods.builtin import Complementary, Grpo

    class Inherits(Grpo):
        pass

    class Own(Complementary):
        def score(self, *args: object) -> None:
            raise RuntimeError

    assert _coevo_score(object.__new__(Grpo)) and _coevo_score(object.__new__(Inherits))
    assert not _coevo_score(object.__new__(Own))


def test_a_plugin_score_that_fails_now_leaves_the_credit_check_out(plugins: Path) -> None:
    """A plug-in method's ``score`` edited since its run to raise (or answer NaN, or the
    wrong length) made ``check`` and ``replay --verify`` call a sound log inconsistent, at
    its last ``episode_finished``: the method's code fails, not the log; the group's seq is
    named, ``--strict`` fails, and the groups it does not fail on are still checked (a
    tampered one is found)."""
    module = plugins / "boundary_later.py"
    module.write_text("from agents.methods.builtin import Grpo\n\nclass Later(Grpo):\n    pass\n")
    out = plugins / "later"
    args = ["run", str(plugins / "base.toml"), "--out", str(out), "--quiet"]
    assert main([*args, "--set", 'run.method="boundary_later:Later"']) == 0
    with LmdbEventLog.open(out / "log") as log:
        meta, envs = log.read_meta(), list(log.read(0, log.next_seq))
    groups = [e.seq for e in envs if isinstance(e.event, AdvantagesComputed)]
    assert meta is not None and len(groups) >= 2
    tampered = plugins / "tampered"  # the second group's first advantage edited
    shutil.copytree(out, tampered, ignore=shutil.ignore_patterns("log"))
    edited = [
        e.__replace__(event=e.event.__replace__(advantages=(9.0, *e.event.advantages[1:])))
        if e.seq == groups[1] and isinstance(e.event, AdvantagesComputed)
        else e
        for e in envs
    ]
    with LmdbEventLog.create(tampered / "log", meta, durable=False) as writer:
        writer.append(edited)
    scored = "    def score(self, outcomes, modes, similar):\n        {}\n"
    fails_first = "if not getattr(self, 'seen', 0):\n            self.seen = 1\n            {}\n"
    fails_first += "        return super().score(outcomes, modes, similar)"
    for body in (
        "raise RuntimeError('edited since')",
        "raise ValueError('edited since')",
        "return float('nan')",
        fails_first.format("raise RuntimeError('first only')"),
    ):
        module.write_text(
            "from agents.methods.builtin import Grpo\n\nclass Later(Grpo):\n" + scored.format(body)
        )
        said = f"credit: the run's method fails on its group at seq {groups[0]}"
        verified = cli("replay", str(out), "--verify", path=plugins)
        assert verified.returncode == 0 and verified.stdout.startswith("verified "), verified
        assert f"coevo: note: credit: not checked: {said[8:]}" in verified.stderr, verified
        assert "Traceback" not in verified.stderr
        checked = cli("check", str(out), path=plugins)
        assert checked.returncode == 0 and f"  not checked: {said}" in checked.stdout, checked
        assert " credit," not in checked.stdout.splitlines()[0]  # not among those that held
        strict = cli("check", str(out), "--strict", path=plugins)
        assert strict.returncode == 1 and f"--strict: {said}" in strict.stderr, strict
        found = cli("check", str(tampered), "--invariant", "credit", path=plugins)
        assert found.returncode == 1 and "invariant credit violated at seq " in found.stdout
        if "first only" in body:  # the tampered group is scored, so found there
            assert f"invariant credit violated at seq {groups[1]}: " in found.stdout, found
        # else its advantages, taken as recorded, disagree with its update's request


def test_quiet_is_quiet_while_the_model_is_built(plugins: Path, tmp_path: Path) -> None:
    """``run --quiet`` printed the embedded model's build, about 30 lines."""
    base = str(plugins / "base.toml")
    done = cli(
        "run", base, "--quiet", "--out", str(tmp_path / "run"), COEVO_CACHE=str(tmp_path / "cache")
    )
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", done.stderr
    assert list((tmp_path / "cache" / "embedded").iterdir())  # it was built


def test_method_options_given_to_a_built_in_are_refused(
    plugins: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``[method]`` table given to ``grpo`` was ignored without a word."""
    code, err = validate(plugins, "method.shown=2", capsys)
    assert code == 2 and "$.method: method 'grpo' takes no [method] options (got ['shown'])" in err
