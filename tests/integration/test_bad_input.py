"""Bad input that an outside attack sent through ``coevo validate`` (issue 16, item 8): each
ended in a traceback, a hang, or was accepted. Each must now be one line ``coevo: error: ...``
and exit 2, before anything runs."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scenarios.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXPLORE = str(ROOT / "scenarios" / "explore.toml")
QUICKSTART = str(ROOT / "scenarios" / "quickstart.toml")
_modules = itertools.count()


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *fragments: str) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("coevo: error: "), err
    for fragment in fragments:
        assert fragment in err, err


def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> str:
    """A world module with ``source`` on the path under a fresh name; returns ``module:W``."""
    name = f"attack_world_{next(_modules)}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:W"


def test_nesting_deeper_than_any_scenario_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text('name = "x"\nv = ' + "[" * 5000 + "]" * 5000 + "\n")  # RecursionError
    refused(capsys, ["validate", str(deep)], "nested too deeply")
    options = tmp_path / "options.toml"
    options.write_text('name = "x"\n[world.options]\nv = ' + "[" * 300 + "]" * 300 + "\n")
    refused(capsys, ["validate", str(options)], "$.world.options.v: nested more than 32 levels")
    nested = "[" * 5000 + "]" * 5000
    refused(capsys, ["validate", EXPLORE, "--set", f"run.episodes={nested}"], "$.run.episodes")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("5 x", "text after the value"),
        ('"a" b', "text after the value"),
        ("5 # a note", "a comment after the value"),
        ("5\nworkers = 3", "a value is one line"),
    ],
)
def test_text_after_a_set_value_is_refused(
    capsys: pytest.CaptureFixture[str], value: str, says: str
) -> None:
    key = "name" if value.startswith('"') else "run.episodes"
    refused(capsys, ["validate", EXPLORE, "--set", f"{key}={value}"], f"$.{key}: {says}")


def test_an_out_under_a_file_is_refused_before_the_run_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out FILE/x`` was refused only when the run directory was made, after the run's
    model had been built (28 s of pre-training with a fresh cache)."""
    (tmp_path / "f").write_text("")
    out = tmp_path / "f" / "x"
    refused(capsys, ["run", EXPLORE, "--out", str(out)], f"{out}: cannot create it: ")


def test_audit_credit_refuses_an_index_it_would_not_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``audit credit --index DIR`` was taken and ignored (the credit pass reads the log)."""
    assert main(["audit", "RUN", "credit", "--index", "DIR"]) == 2
    assert "unrecognized arguments: --index DIR" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["1e-400", "-2.5e-999", "0.000_1e-330"])
def test_a_float_too_small_to_tell_from_0_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """A positive float that reads as 0.0 took 0's meaning unnoticed (``step_timeout``: no
    limit; ``temperature``: greedy), in a file and by ``--set``; a zero written so stays 0."""
    refused(
        capsys,
        ["validate", EXPLORE, "--set", f"world.step_timeout={value}"],
        f"$.world.step_timeout: {value} is too small for a float: it would read as 0",
    )
    scenario = tmp_path / "s.toml"
    text = f"# {value} in a comment\n{Path(EXPLORE).read_text()}\n[eval]\nzzz = [{value}]\n"
    scenario.write_text(text)  # (named by its key: the comment holds the same text first)
    refused(capsys, ["validate", str(scenario)], f"$.eval.zzz[0]: {value} is too small for a")
    assert main(["validate", EXPLORE, "--set", "policy.temperature=0.0e5"]) == 0
    assert "temperature = 0.0" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        (
            'prompt.memory="assistant"',
            "Invalid enum value 'assistant' (one of 'system', 'user') - at `$.prompt.memory`",
        ),
        ('prompt.system=""', "Expected `str` of length >= 1 - at `$.prompt.system`"),
        ("prompt.tips=1", "unknown field `tips` - at `$.prompt`"),
        (
            'empo2.embedder="minilm-int4"',
            "Invalid enum value 'minilm-int4' (one of 'hashing', 'minilm', 'minilm-int8') - at "
            "`$.empo2.embedder`",
        ),
        ("empo2.query_chars=-1", "Expected `int` >= 0 - at `$.empo2.query_chars`"),
    ],
)
def test_a_bad_prompt_setting_is_one_line(
    capsys: pytest.CaptureFixture[str], setting: str, says: str
) -> None:
    refused(capsys, ["validate", EXPLORE, "--set", setting], says)


def test_prompt_settings_are_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["validate", EXPLORE, "--set", 'prompt.memory="system"', "--set", 'prompt.system="act."']
    assert main(argv) == 0
    capsys.readouterr()


def test_a_fifo_as_the_scenario_file_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "scenario.toml"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [sys.executable, "-m", "scenarios.cli", "validate", str(fifo)],
        capture_output=True,
        text=True,
        timeout=60,  # it waited forever for a writer
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr == f"coevo: error: {fifo}: not a regular file (a FIFO, socket or device?)\n"


WORLDS = {
    "raises at import": ("raise ZeroDivisionError('at import')\n", "failed to import: Zero"),
    "exits at import": ("import sys\nsys.exit(3)\n", "called sys.exit(3) while importing"),
    "exits when built": (
        "import sys\nfrom scenarios.worlds.minilab import MiniLab\n"
        "class W(MiniLab):\n    def __init__(self, **kw):\n        sys.exit('bye')\n",
        "called sys.exit('bye') while starting",
    ),
    "a TypeError inside its constructor": (
        "from scenarios.worlds.minilab import MiniLab\nclass W(MiniLab):\n"
        "    def __init__(self, **kw):\n        len(None)\n",
        "failed to start: TypeError: object of type 'NoneType' has no len()",
    ),
    "name raises": (
        "from scenarios.worlds.minilab import MiniLab\nclass W(MiniLab):\n    @property\n"
        "    def name(self):\n        raise KeyError('no name')\n",
        "reading its name raised KeyError",
    ),
    "name raises AttributeError": (
        "from scenarios.worlds.minilab import MiniLab\nclass W(MiniLab):\n    @property\n"
        "    def name(self):\n        return self.missing\n",
        "reading its name raised AttributeError: 'W' object has no attribute 'missing'",
    ),
    "close raises": (
        "from scenarios.worlds.minilab import MiniLab\nclass W(MiniLab):\n"
        "    def close(self):\n        raise OSError('close fails')\n",
        "world.close raised OSError: close fails",
    ),
    "tasks are not tasks": (
        "from scenarios.worlds.minilab import MiniLab\nclass W(MiniLab):\n"
        "    def tasks(self, family, split):\n        return ['a', 3]\n",
        ".tasks('fetch', 'train') returned 'a', not a Task",
    ),
    "tasks of the wrong types": (
        "from engine.world import Task\nfrom scenarios.worlds.minilab import MiniLab\n"
        "class W(MiniLab):\n    def tasks(self, family, split):\n"
        "        return [Task(family=family, variant='one', split=split)]\n",
        "Expected `int`, got `str` - at `$.variant`",
    ),
    "a variant past 64 bits": (
        "from engine.world import Task\nfrom scenarios.worlds.minilab import MiniLab\n"
        "class W(MiniLab):\n    def tasks(self, family, split):\n"
        "        return [Task(family=family, variant=2**70, split=split)]\n",
        "Expected `int` <= 9223372036854775807 - at `$.variant`",
    ),
    "a family twice": (
        "from scenarios.worlds.minilab import MiniLab\nclass W(MiniLab):\n"
        "    def families(self):\n        return ('fetch', 'heat', 'fetch')\n",
        ".families() returned ('fetch', 'heat', 'fetch'): a name twice",
    ),
    "families as one string": (
        "from scenarios.worlds.minilab import MiniLab\nclass W(MiniLab):\n"
        "    def families(self):\n        return 'fetch'\n",
        ".families() returned 'fetch', not a list of names",
    ),
    "a family UTF-8 cannot encode": (
        "from scenarios.worlds.minilab import MiniLab\nclass W(MiniLab):\n"
        "    def families(self):\n        return ('fetch\\ud800', 'heat')\n"
        "    def tasks(self, family, split):\n"
        "        return super().tasks('fetch' if family.startswith('fetch') else family, split)\n",
        "a lone surrogate that UTF-8 cannot encode",
    ),
    "its own BaseException as it starts": (  # a traceback and exit 1
        "from scenarios.worlds.minilab import MiniLab\nclass Mine(BaseException):\n    pass\n"
        "class W(MiniLab):\n    def __init__(self):\n        raise Mine('no')\n",
        "failed to start: raised Mine: no",
    ),
    "KeyboardInterrupt as it starts": (  # read as the user's Ctrl-C: "interrupted", exit 130
        "from scenarios.worlds.minilab import MiniLab\n"
        "class W(MiniLab):\n    def __init__(self):\n        raise KeyboardInterrupt\n",
        "failed to start: raised KeyboardInterrupt",
    ),
    "tasks exit": (
        "import sys\nfrom scenarios.worlds.minilab import MiniLab\nclass W(MiniLab):\n"
        "    def families(self):\n        sys.exit(0)\n",
        "called sys.exit(0) listing its tasks",
    ),
}


@pytest.mark.parametrize("case", list(WORLDS))
def test_a_plugin_world_that_misbehaves_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    source, says = WORLDS[case]
    world = plugin(tmp_path, monkeypatch, source)
    argv = ["validate", EXPLORE, "--set", f"world.name={world}", "--set", "world.families=[]"]
    refused(capsys, argv, "$.world", says)


@pytest.mark.parametrize("where", ["__init__", "families", "tasks", "close"])
def test_a_world_that_hangs_while_its_tasks_are_listed_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """validate (and run) give a world's calls the scenario's step_timeout, as a run does."""
    source = (
        "import time\nfrom scenarios.worlds.minilab import MiniLab\nclass W(MiniLab):\n"
        f"    def {where}(self, *args, **kwargs):\n        time.sleep(10**6)\n"
    )
    world = plugin(tmp_path, monkeypatch, source)
    argv = ["validate", EXPLORE, "--set", f"world.name={world}", "--set", "world.step_timeout=0.5"]
    started = time.monotonic()
    refused(capsys, argv, "did not build, list its train tasks and close within 0.5 s")
    assert time.monotonic() - started < 30


def test_a_family_listed_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """It would get twice its share of the episodes without a word."""
    argv = ["validate", EXPLORE, "--set", 'world.families=["heat", "fetch", "heat"]']
    refused(capsys, argv, "$.world.families: ['heat'] listed more than once")


def test_a_world_s_own_family_names_can_be_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A world may name its families "日本語" or "c d" (a run with families = [] played them),
    but world.families refused every name outside [A-Za-z0-9_.-]."""
    from scenarios.cli import main

    source = (
        "from engine.world import Task\nfrom scenarios.worlds.minilab import MiniLab\n"
        "NAMES = {'日本語': 'heat', 'c d': 'fetch'}\n"
        "class W(MiniLab):\n"
        "    def families(self):\n        return tuple(NAMES)\n"
        "    def tasks(self, family, split):\n"
        "        return [Task(family=family, variant=t.variant, split=t.split)\n"
        "                for t in super().tasks(NAMES[family], split)]\n"
    )
    world = plugin(tmp_path, monkeypatch, source)
    argv = ["validate", EXPLORE, "--set", f"world.name={world}"]
    assert main([*argv, "--set", 'world.families=["日本語", "c d"]']) == 0, capsys.readouterr().err
    capsys.readouterr()
    refused(capsys, [*argv, "--set", 'world.families=["café"]'], "$.world.families: unknown")


def test_a_task_a_world_lists_twice_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """tasks() returning a variant twice was drawn twice as often (60 tasks of 30), where a
    family listed twice is refused."""
    source = (
        "from scenarios.worlds.minilab import MiniLab\nclass W(MiniLab):\n"
        "    def tasks(self, family, split):\n        t = super().tasks(family, split)\n"
        "        return t + t[:2]\n"
    )
    world = plugin(tmp_path, monkeypatch, source)
    argv = ["validate", EXPLORE, "--set", f"world.name={world}"]
    refused(capsys, argv, "lists variant 0 more than once (10 task(s) in all are listed so")


def model_dir(tmp_path: Path, config: object, index: object = None) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    (path / "tokenizer.json").write_text("{}")
    if index is not None:
        (path / "model.safetensors.index.json").write_text(index)  # type: ignore[arg-type]
    return path


@pytest.mark.parametrize(
    ("config", "index", "says"),
    [
        ({"model_type": ["qwen2"]}, None, "model_type ['qwen2'], not a causal language model"),
        ({"model_type": {"a": 1}}, None, "model_type {'a': 1}, not a causal language model"),
        ('{"a": ' * 5000 + "1" + "}" * 5000, None, "config.json is nested too deeply"),
        ({"model_type": "qwen2"}, "[" * 5000 + "]" * 5000, "index.json is nested too deeply"),
    ],
    ids=["list model_type", "dict model_type", "deep config", "deep index"],
)
def test_a_model_directory_with_odd_json_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: object, index: object, says: str
) -> None:
    path = model_dir(tmp_path, config, index)
    refused(capsys, ["validate", QUICKSTART, "--set", f"policy.model={path}"], says)


def test_a_home_directory_that_does_not_exist_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["validate", QUICKSTART, "--set", "policy.model=~nosuchuser-coevo/m"]
    refused(capsys, argv, "$.policy.model = '~nosuchuser-coevo/m': cannot expand '~'")


def test_a_device_that_is_not_there_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["validate", QUICKSTART, "--set", "policy.device=cuda:7"]
    refused(capsys, argv, "$.policy.device: device 'cuda:7': torch sees no CUDA device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    refused(capsys, argv, "device 'cuda:7': torch sees 1 CUDA device(s) (cuda:0 to cuda:0)")


def test_a_worlds_control_characters_reach_no_terminal_through_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A world's goal (and actions) are its own text: an escape sequence in one cleared the
    screen of whoever ran ``coevo audit RUN episode``, and a right-to-left override reordered
    what ``coevo log`` and ``coevo diff`` showed after it; they print escaped."""
    source = (
        "import msgspec\nfrom scenarios.worlds.minilab import MiniLab\nclass W(MiniLab):\n"
        "    def reset(self, task, seed):\n"
        "        obs = super().reset(task, seed)\n"
        "        return msgspec.structs.replace(obs, goal='evil \\x1b[2J\\x1b[31mRED\\x07',\n"
        "            text='\\u202egnp.exe ' + obs.text)\n"
    )
    world = plugin(tmp_path, monkeypatch, source)
    run = tmp_path / "run"
    argv = ["run", EXPLORE, "--out", str(run), "--quiet", "--set", f"world.name={world}"]
    assert main([*argv, "--set", "world.families=[]", "--set", "run.episodes=4"]) == 0
    capsys.readouterr()
    assert main(["audit", str(run), "episode", "ep000000"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "goal: evil \\x1b[2J\\x1b[31mRED\\x07" in out
    assert main(["log", str(run), "--kind", "episode_started", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "\u202e" not in out and "\\u202egnp" in out  # (the line may be cut after it)
    from scenarios.cli.diff import _event_line  # a divergence, as ``coevo diff`` shows it

    step = {"kind": "step_taken", "observation": "ok\u202egnp.exe"}
    env = {"seq": 9, "actor": "worker-0", "corr": "ep1", "cause": 8, "event": step}
    line = _event_line(env, ("observation",))
    assert "\u202e" not in line and "\\u202egnp.exe" in line


@pytest.mark.parametrize(
    ("sets", "said"),
    [
        (
            ["policy.mode=generate", "policy.max_new_tokens=4000"],
            "$.policy.max_new_tokens = 4000: the model is built for",
        ),
        (["run.method=empo2", "empo2.tip_tokens=900"], "$.empo2.tip_tokens = 900"),
        (["run.episodes=1"], "$.run: run.episodes = 1 is less than one update"),
        (["world.options={heldout_variants=0}"], "$.world: no heldout tasks in"),
        (["tracking.sinks=['wandb','wandb']"], "$.tracking.sinks: a sink is named twice"),
        (
            ["runtime.backend=ray", "runtime.ray.extractor.num_cpus=1"],
            "$.runtime.ray.extractor: run.method = 'grpo' has no extractor actor to place",
        ),
        # settings a run spent its time on for nothing (an outside tester's runs): a subgroup
        # of one never trains, nor an extractor on batches of one call; a final round or an
        # adaptation test without evaluation rounds was not played
        (
            ["run.method=complementary", "complementary.embedder=hashing", "grpo.group_size=3"],
            "$.grpo.group_size = 3: Complementary RL splits a group into a guided and a free "
            "subgroup (1 and 2 episodes)",
        ),
        (
            [
                *("run.method=complementary", "complementary.embedder=hashing"),
                "complementary.guided_fraction=0.125",
            ],
            "$.complementary.guided_fraction = 0.125 of $.grpo.group_size = 8: Complementary RL "
            "splits a group into a guided and a free subgroup (1 and 7 episodes), and an "
            "episode alone in its subgroup always has advantage 0 (it never trains); give each "
            "subgroup 2 episodes or more (or none), or set complementary.subgroups = false "
            "(given by --set complementary.guided_fraction=0.125)",
        ),
        (
            ["run.method=complementary", "complementary.embedder=hashing", "complementary.batch=1"],
            "$.complementary.batch = 1: a call's advantage is its reward less its batch's mean",
        ),
        (
            ["eval.every=0", "eval.final_episodes=3"],
            "$.eval.final_episodes = 3: played in the last evaluation round, and eval.every = 0",
        ),
        (
            ["run.method=empo2", "eval.every=0", "eval.adapt_attempts=2"],
            "$.eval.adapt_attempts = 2: played in the last evaluation round",
        ),
        # a LoRA target was checked only when an actor added the adapters, mid-run
        (
            ["policy.lora.r=2", "policy.lora.targets=['q_proj','nosuch']"],
            "$.policy.lora.targets: ['nosuch'] name no module of the model 'embedded' (its "
            "modules: ",
        ),
        (
            [
                *("run.method=complementary", "complementary.embedder=hashing"),
                *("complementary.lora.r=2", "complementary.lora.targets=['c_attn']"),
            ],
            "$.complementary.lora.targets: ['c_attn'] name no module of the model",
        ),
    ],
)
def test_run_refuses_what_validate_refuses_before_it_builds_a_model(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    sets: list[str],
    said: str,
) -> None:
    """Building the embedded models takes minutes: `run` refuses a setting that does not fit
    before it builds one, with `validate`'s line."""
    import scenarios.policy_setup as setup

    def built(*args: object) -> None:
        raise AssertionError("a model was built before the scenario was refused")

    monkeypatch.setattr(setup, "policy_model_dir", built)
    given = [a for s in sets for a in ("--set", s)]
    refused(capsys, ["validate", QUICKSTART, *given], said)
    out = str(tmp_path / "run")
    refused(capsys, ["run", QUICKSTART, *given, "--out", out, "--quiet"], said)
    assert not (tmp_path / "run").exists()


def test_a_world_that_prints_as_it_is_built_leaves_validates_toml_whole(tmp_path: Path) -> None:
    """What a world prints (Python's ``print``, or a library writing to file descriptor 1)
    goes to stderr: stdout holds the resolved scenario only, which TOML reads back."""
    import tomllib

    (tmp_path / "noisy_world.py").write_text(
        "import os\nfrom scenarios.worlds.minilab import MiniLab\n"
        "class W(MiniLab):\n    def __init__(self, **kw):\n"
        "        print('hello from python', flush=True)\n"
        "        os.write(1, b'hello from C\\n')\n        super().__init__(**kw)\n"
    )
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "scenarios.cli", "validate", QUICKSTART),
            *("--set", "world.name=noisy_world:W"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert tomllib.loads(proc.stdout)["world"]["name"] == "noisy_world:W"
    assert "hello from python" in proc.stderr and "hello from C" in proc.stderr


def test_a_world_that_hangs_while_the_embedded_model_is_built_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pre-training plays the scenario's world behind the same deadline as a run
    (``[world] step_timeout``): a step that never returns ends the build with one line."""
    world = plugin(
        tmp_path,
        monkeypatch,
        "import time\nfrom scenarios.worlds.minilab import MiniLab\n"
        "class W(MiniLab):\n    blocking = True\n    def step(self, action):\n"
        "        time.sleep(60)\n",
    )
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    start = time.monotonic()
    argv = ["run", QUICKSTART, "--set", f"world.name={world}", "--set", "world.step_timeout=0.5"]
    assert main([*argv, "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coevo: error: "), err
    assert "$.policy.model: the embedded model could not be built for this world: " in err, err
    assert "on turn 0 did not return within 0.5 s (world.step_timeout)" in err, err
    assert time.monotonic() - start < 60


def test_a_world_too_small_for_the_built_in_model_is_refused_by_validate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``world.options.train_variants = 1`` validated, and the run failed building its model
    ("family 'fetch' has 1 train variants", blamed on ``$.policy.model``): the model
    pre-trains on every family and keeps ``eval_variants`` of each back."""
    small = ["--set", "policy.embedded.eval_variants=1", "--set", "run.episodes=32"]
    refused(
        capsys,
        ["validate", QUICKSTART, *small, "--set", "world.options.train_variants=1"],
        "$.policy.embedded.eval_variants = 1: the built-in model pre-trains on every family of "
        "minilab and keeps that many of each one's train variants back, and family",
        "has 1 (the world's options)",
    )
    assert main(["validate", QUICKSTART, *small, "--set", "world.options.train_variants=2"]) == 0
