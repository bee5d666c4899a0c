"""Scenario files: every way to be wrong is one clean ScenarioInvalid naming file and key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import ScenarioInvalid
from scenarios.loader import load_scenario, resolved_toml, scenario_hash, to_scenario
from scenarios.schema import Scenario

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "s.toml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


@pytest.mark.parametrize("name", ["quickstart", "grpo", "explore"])
def test_shipped_scenarios_are_valid_and_resolve_every_default(name: str) -> None:
    sc = load_scenario(ROOT / "scenarios" / f"{name}.toml")
    assert sc.name == name
    text = resolved_toml(sc)
    again = to_scenario(__import__("tomllib").loads(text), "resolved")
    assert again == sc
    assert len(scenario_hash(text)) == 64


@pytest.mark.parametrize("placed", [False, True])
def test_a_ray_placement_resolves_whether_or_not_it_is_given(tmp_path: Path, placed: bool) -> None:
    extra = "\n[runtime.ray.inference]\nnum_gpus = 1\n" if placed else ""
    sc = load_scenario(write(tmp_path, 'name = "x"\n[runtime]\nbackend = "ray"\n' + extra))
    text = resolved_toml(sc)
    again = to_scenario(__import__("tomllib").loads(text), "resolved")
    assert again == sc
    assert (again.runtime.ray.inference is not None) == placed


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('name = "x"\n[run]\nepisodes = "many"\n', "$.run.episodes"),
        ('name = "x"\n[run]\nepisodez = 3\n', "unknown field `episodez`"),
        ("[run]\nepisodes = 3\n", "missing required field `name`"),
        ('name = "x"\n[run]\nepisodes = 0\n', "$.run.episodes"),
        ('name = "x"\n[run]\nworkers = 100000\n', "$.run.workers"),
        ('name = "x"\nseed = -1\n', "$.seed"),
        ('name = "bad name!"\n', "$.name"),
        ('name = "x"\n[agent]\nkind = "genius"\n', "$.agent.kind"),
        ('name = "x"\n[runtime]\non_failure = "ignore"\n', "$.runtime.on_failure"),
        ('name = "x"\nworld = 3\n', "$.world"),
        ('name = "x"\n[run\n', "not valid TOML"),
        ('name = "x"\n[grpo]\ngroup_size = 1\n', "$.grpo.group_size"),
        ('name = "x"\n[grpo]\nclip_low = 1.5\n', "$.grpo.clip_low"),
        ('name = "x"\n[policy]\ndevice = "tpu"\n', "$.policy.device"),
        ('name = "x"\n[policy]\nmode = "telepathy"\n', "$.policy.mode"),
        ('name = "x"\n[run]\nmethod = "ppo"\n', "$.run.method"),
    ],
)
def test_invalid_scenarios_name_the_key_path(tmp_path: Path, body: str, fragment: str) -> None:
    path = write(tmp_path, body)
    with pytest.raises(ScenarioInvalid) as info:
        load_scenario(path)
    message = str(info.value)
    assert message.startswith(str(path))
    assert fragment in message
    assert "\n" not in message


def test_unreadable_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(ScenarioInvalid, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")
    with pytest.raises(ScenarioInvalid, match="is a directory"):
        load_scenario(tmp_path)
    with pytest.raises(ScenarioInvalid, match="not UTF-8"):
        load_scenario(write(tmp_path, b"name = \xff\xfe\x00"))


def test_overrides_set_nested_keys_with_toml_values(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "x"\n')
    sc = load_scenario(
        path, ["run.episodes=12", "runtime.durable=false", "world.families=['a']", "name=y"]
    )
    assert sc.run.episodes == 12
    assert sc.runtime.durable is False
    assert sc.world.families == ["a"]
    assert sc.name == "y"


def test_an_override_key_may_quote_its_parts_as_toml_does(tmp_path: Path) -> None:
    """``--set 'world.options."a.b"=1'`` set a key named ``"a`` in a table ``b"``: quotes
    were kept as part of the name and a quoted dot split it."""
    path = write(tmp_path, 'name = "x"\n')
    sc = load_scenario(
        path,
        [
            'world.options."a.b"=1',
            "world.options.'k=v'=2",
            'world."options".plain = "x=y"',
            'world.options."sp ace"=3',
        ],
    )
    assert sc.world.options == {"a.b": 1, "k=v": 2, "plain": "x=y", "sp ace": 3}
    assert sc == load_scenario(
        write(
            tmp_path,
            'name = "x"\n[world.options]\n"a.b" = 1\n"k=v" = 2\nplain = "x=y"\n"sp ace" = 3\n',
        ),
    )


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ('world."options=1', "key.path=value"),
        ('world."a" b=1', "is not a TOML key"),
        ("run.episodes", "key.path=value"),
        ("=3", "key.path=value"),
        ("name.inner=3", "$.name is not a table"),
        ("run.episodes=-5", "$.run.episodes"),
        ("run.nope=1", "unknown field `nope`"),
    ],
)
def test_bad_overrides(tmp_path: Path, override: str, fragment: str) -> None:
    path = write(tmp_path, 'name = "x"\n')
    with pytest.raises(ScenarioInvalid) as info:
        load_scenario(path, [override])
    assert fragment in str(info.value)


def test_defaults_form_a_valid_scenario() -> None:
    sc = to_scenario({"name": "n"}, "inline")
    assert isinstance(sc, Scenario)
    assert sc.runtime.durable is True


def test_the_runtime_table_sets_the_engine_and_its_defaults_are_the_engine_s() -> None:
    from engine.runtime import RuntimeConfig
    from scenarios.assemble import runtime_config

    assert runtime_config(to_scenario({"name": "n"}, "inline")) == RuntimeConfig()
    sc = to_scenario({"name": "n", "runtime": {"write_buffer_mb": 0.5, "batch_max": 7}}, "x")
    cfg = runtime_config(sc)
    assert cfg.write_buffer_bytes == 2**19 and cfg.batch_max == 7


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (
            'name = "x"\n'.encode("utf-16"),
            "not UTF-8 text (a UTF-16 little-endian byte-order mark)",
        ),
        ('name = "x"\n'.encode("utf-16-be"), "not UTF-8 text (NUL byte at offset 0"),
        (
            'name = "x"\n'.encode("utf-32"),
            "not UTF-8 text (a UTF-32 little-endian byte-order mark)",
        ),
        ('name = "café"\n'.encode("latin-1"), "not UTF-8 text (bad byte at offset 11)"),
        (b'name = "x"\x00\n', "not UTF-8 text (NUL byte at offset 10"),
    ],
)
def test_other_encodings_say_so(tmp_path: Path, data: bytes, fragment: str) -> None:
    with pytest.raises(ScenarioInvalid) as info:
        load_scenario(write(tmp_path, data))
    assert fragment in str(info.value)


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    sc = load_scenario(write(tmp_path, '\ufeffname = "x"\n'.encode()))
    assert sc.name == "x"


@pytest.mark.parametrize(
    ("text", "unread"),
    [
        ('[run]\nmethod = "grpo"\n[grpo]\n[eval]\n[policy]\n[agent]\nkind = "policy"\n', []),
        ('[run]\nmethod = "grpo"\n[empo2]\np = 0.5\n[complementary]\n', ["empo2", "complementary"]),
        ('[run]\nmethod = "empo2"\n[empo2]\n[complementary]\nlam = 0.1\n', ["complementary"]),
        ('[run]\nmethod = "rollout"\n[grpo]\n[eval]\n', ["grpo", "eval"]),
        ('[agent]\nkind = "explorer"\n[policy]\n[prompt]\n', ["policy", "prompt"]),
        ('[run]\nmethod = "complementary"\n[grpo]\nstd_norm = false\n', ["grpo.std_norm"]),
        ('[run]\nmethod = "empo2"\n[grpo]\nstd_norm = false\n', []),
        ('[run]\nmethod = "mine.methods:Mine"\n[empo2]\n[agent]\nkind = "policy"\n', []),
        (
            '[run]\nmethod = "agents.methods.builtin:Empo2"\n[empo2]\np = 1.0\n[agent]\n'
            'kind = "policy"\n',
            ["empo2"],  # EMPO2 named by its path is a plug-in: it reads [method]
        ),
        ('[run]\nmethod = "rollout"\n[method]\nfoo = 1\n', ["method"]),
        ('[run]\nmethod = "rollout"\n[method]\n', []),
        (
            '[agent]\nkind = "policy"\n[policy]\nmodel = "/m"\n[policy.embedded]\nlayers = 2\n',
            ["policy.embedded"],
        ),
        ('[agent]\nkind = "policy"\n[policy.embedded]\nlayers = 2\n', []),
        ("[runtime.ray.inference]\nnum_gpus = 1\n", ["runtime.ray"]),
        ('[runtime]\nbackend = "ray"\n[runtime.ray.inference]\nnum_gpus = 1\n', []),
        (
            '[run]\nmethod = "complementary"\n[complementary.ops]\nbogus = 1\n',
            ["complementary.ops"],
        ),
        (
            '[run]\nmethod = "complementary"\n[complementary]\nextractor = "embedded-ops"\n'
            "[complementary.ops]\nlr = 0.1\n",
            [],
        ),
    ],
    ids=[
        "grpo reads its own",
        "grpo",
        "empo2",
        "rollout",
        "scripted agent",
        "complementary's std",
        "empo2 reads grpo's std",
        "plug-in method",
        "a plug-in built on empo2",
        "a rollout's method options",
        "an empty method table",
        "embedded settings of a model directory",
        "embedded settings of the embedded model",
        "ray placements of a local run",
        "ray placements of a ray run",
        "operation-format settings of another extractor",
        "operation-format settings of embedded-ops",
    ],
)
def test_tables_nothing_reads_are_named(text: str, unread: list[str]) -> None:
    import tomllib

    from scenarios.loader import unread_tables

    doc = tomllib.loads('name = "s"\n' + text)
    assert unread_tables(doc, to_scenario(doc, "s.toml")) == unread


def test_a_file_setting_another_methods_table_is_warned_about_once_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scenarios.cli import main

    path = write(tmp_path, b'name = "s"\n[agent]\nkind = "explorer"\n[policy]\nthreads = 1\n')
    assert main(["validate", str(path)]) == 0
    err = capsys.readouterr().err
    # the console wraps at its width, at a space or inside a long path: compare without either
    assert f"{path}:nothingreads[policy]inthisscenario" in "".join(err.split())
    bad = ["validate", str(path), "--set", "run.method=grpo"]  # refused: only why
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert err.startswith("coevo: error: ") and err.count("\n") == 1


def test_training_on_the_variants_evaluation_holds_out_is_warned_about(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from scenarios.cli import main

    quickstart = str(Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.toml")
    heldout = 'world.split = "heldout" trains on the variants that held-out evaluation plays'
    train = (  # the converse: the "held-out" figures were labelled so without a word
        'eval.split = "train" evaluates on the variants training plays (world.split = "train"): '
        "what the run calls held-out success"
    )
    for sets, warned in (
        (["world.split=heldout"], heldout),
        (["world.split=heldout", "eval.split=train"], None),
        (["world.split=heldout", "eval.every=0"], None),
        (["eval.split=train"], train),
        (["eval.split=train", "eval.every=0"], None),
        (["eval.split=train", "run.method=rollout"], None),
        ([], None),
    ):
        assert main(["validate", quickstart, *(a for s in sets for a in ("--set", s))]) == 0
        err = " ".join(capsys.readouterr().err.split())
        said = [w for w in (heldout, train) if w in err]
        assert said == ([warned] if warned else []), (sets, err)


def test_a_subgroup_of_one_names_the_set_of_either_setting_that_made_it(tmp_path: Path) -> None:
    """The refusal names the fraction first; a ``--set grpo.group_size`` that made a subgroup
    of one under the file's fraction was not named (an outside tester's)."""
    from scenarios.loader import load_scenario

    shipped = Path(__file__).resolve().parents[2] / "scenarios" / "complementary.toml"
    path = tmp_path / "c25.toml"
    path.write_text(
        shipped.read_text().replace(
            "[complementary]\n", "[complementary]\nguided_fraction = 0.25\n"
        )
    )
    with pytest.raises(ScenarioInvalid) as caught:
        load_scenario(path, ["grpo.group_size=5"])
    said = str(caught.value)
    assert "$.complementary.guided_fraction = 0.25 of $.grpo.group_size = 5: " in said
    assert said.endswith("(given by --set grpo.group_size=5)"), said


def test_a_complementary_run_that_guides_no_episode_is_warned_about(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its extractor is credited for guided episodes only: it never trains."""
    from scenarios.cli import main

    quickstart = str(Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.toml")
    warned = (
        "complementary.guided_fraction = 0.1 of grpo.group_size = 8 guides no episode: the "
        "extractor is credited for guided episodes only, so it never trains"
    )
    method = ["run.method=complementary", "complementary.embedder=hashing"]
    for sets, warns in (
        ([*method, "complementary.guided_fraction=0.1"], True),
        ([*method, "complementary.guided_fraction=0.25"], False),
        (["complementary.guided_fraction=0.1"], False),  # a GRPO run reads no such table
    ):
        assert main(["validate", quickstart, *(a for s in sets for a in ("--set", s))]) == 0
        err = " ".join(capsys.readouterr().err.split())
        assert (warned in err) is warns, (sets, err)


def test_tips_that_may_not_fit_the_prompt_are_warned_about(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``top_k`` tips of ``tip_tokens`` each beyond the half of the positions a prompt is sure
    of were accepted without a word: every turn shown that many had its prompt cut."""
    from scenarios.cli import main

    empo2 = str(ROOT / "scenarios" / "empo2.toml")
    warned = (
        "empo2.top_k * empo2.tip_tokens = 10 * 100 = 1000 tokens of tips; the model is built "
        "for 1024 positions and a prompt is sure of half of them (512)"
    )
    for sets, warns in ((["empo2.top_k=10", "empo2.tip_tokens=100"], True), ([], False)):
        assert main(["validate", empo2, *(a for s in sets for a in ("--set", s))]) == 0
        err = " ".join(capsys.readouterr().err.split())
        assert (warned in err) == warns, (sets, err)


def test_a_temperature_too_small_to_divide_by_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A temperature of 1e-300 (valid: >= 0) overflowed float32 in generation: every
    log-prob NaN (the run then stopped, blaming the model's weights)."""
    from scenarios.cli import main

    root = Path(__file__).resolve().parents[2] / "scenarios"
    for scenario, key, at in (
        ("quickstart.toml", "policy.temperature", "$.policy.temperature"),
        ("empo2.toml", "empo2.tip_temperature", "$.empo2.tip_temperature"),
        ("complementary.toml", "complementary.temperature", "$.complementary.temperature"),
    ):
        assert main(["validate", str(root / scenario), "--set", f"{key}=1e-300"]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"{at} = 1e-300: a temperature between 0 and 0.001 loses" in err, err
        for fine in ("0", "0.001"):
            assert main(["validate", str(root / scenario), "--set", f"{key}={fine}"]) == 0
            capsys.readouterr()


def test_a_pool_larger_than_a_familys_variants_is_warned_about(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``world.pool`` above the variants a family has trains on all of them: said, where it
    was accepted without a word (a pool of 50 read as 50 variants revisited)."""
    from scenarios.cli import main

    quickstart = str(Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.toml")
    small = ["--set", "world.options.train_variants=6"]
    warned = "world.pool = 8 is more than the train variants of"
    for sets, warns in ((["world.pool=8"], True), (["world.pool=6"], False), ([], False)):
        assert main(["validate", quickstart, *small, *(a for s in sets for a in ("--set", s))]) == 0
        err = " ".join(capsys.readouterr().err.split())  # rich wraps lines at a space
        assert (warned in err) == warns, (sets, err)
        assert not warns or "(6)" in err


@pytest.mark.parametrize(
    ("overrides", "given"),
    [
        (["run.episodes=-1"], "run.episodes=-1"),  # the key itself
        (["grpo.dual_clip=0.5"], "grpo.dual_clip=0.5"),  # the error names its table
        (["grpo={clip_low = 2.0}"], "grpo={clip_low = 2.0}"),  # the override sets a table
        (["run.episodes=-1", "run.episodes=-2"], "run.episodes=-2"),  # the last one counts
        (["run.episodess=3"], "run.episodess=3"),  # a key the table does not have
        (["seeed=3"], "seeed=3"),  # one at the top: msgspec's error names no path
    ],
)
def test_an_invalid_value_from_the_command_line_names_its_override(
    overrides: list[str], given: str
) -> None:
    """A bad ``--set`` value was reported against the file, which holds a valid one."""
    with pytest.raises(ScenarioInvalid) as err:
        load_scenario(ROOT / "scenarios" / "quickstart.toml", overrides)
    assert str(err.value).endswith(f"(given by --set {given})"), err.value


def test_an_invalid_value_names_only_the_override_that_gave_it() -> None:
    with pytest.raises(ScenarioInvalid) as err:
        load_scenario(ROOT / "scenarios" / "quickstart.toml", ["run.episodes=-1", "seed=3"])
    assert "given by --set seed=3" not in str(err.value)


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("empo2.low_prob_delta=0", "Expected `float` < 0 - at `$.empo2.low_prob_delta`"),
        ("grpo.lr=nan", "Expected `float` > 0.0, got nan (not a number) - at `$.grpo.lr`"),
        ("grpo.lr=-1", "Expected `float` > 0.0 - at `$.grpo.lr`"),
    ],
)
def test_a_range_error_reads_plainly(override: str, said: str) -> None:
    """A bound of 0 read ``< -0.0``, and a NaN was refused as if it were a number out of
    range."""
    with pytest.raises(ScenarioInvalid) as err:
        load_scenario(ROOT / "scenarios" / "empo2.toml", [override])
    assert f"{said} (given by --set {override})" in str(err.value), err.value


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ('world.split="test"', "Invalid enum value 'test' (one of 'heldout', 'train')"),
        ('eval.split="dev"', "Invalid enum value 'dev' (one of 'heldout', 'train')"),
        ('agent.kind="robot"', "(one of 'explorer', 'policy', 'random') - at `$.agent.kind`"),
        (  # TOML reads `.001` as text: "got `str`" of a value that looks like a number
            "grpo.lr=.001",
            "Expected `float`, got `str` ('.001' is text to TOML, which writes a number as "
            "0.001, 1.0 or 1e-3) - at `$.grpo.lr`",
        ),
        (  # an item of a list of choices: neither the choices nor the --set were named
            'tracking.sinks=["tb"]',
            "'tb' (one of 'mlflow', 'tensorboard', 'wandb') - at `$.tracking.sinks[0]` "
            '(given by --set tracking.sinks=["tb"])',
        ),
    ],
)
def test_a_choice_refused_names_the_choices(override: str, said: str) -> None:
    """msgspec's "Invalid enum value 'test'" named none of the values allowed."""
    with pytest.raises(ScenarioInvalid) as err:
        load_scenario(ROOT / "scenarios" / "quickstart.toml", [override])
    assert said in str(err.value), err.value


def test_a_very_long_bad_value_is_cut_in_the_error() -> None:
    """A 20,000-character bad enum value was echoed whole, twice (msgspec's message and the
    override): one 40 KB line."""
    long = "x" * 20_000
    with pytest.raises(ScenarioInvalid) as err:
        load_scenario(ROOT / "scenarios" / "quickstart.toml", [f'agent.kind="{long}"'])
    said = str(err.value)
    assert len(said) < 600 and "(20,000 characters)" in said and "`$.agent.kind`" in said, said


def test_a_missing_file_named_as_a_shipped_scenario_says_where_that_one_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed coevo keeps its scenarios in site-packages: ``coevo run quickstart`` said
    only "cannot read", and the scenarios' place was nowhere said."""
    monkeypatch.chdir(tmp_path)
    shipped = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.toml"
    for name in ("quickstart", "quickstart.toml"):
        with pytest.raises(ScenarioInvalid) as err:
            load_scenario(name)
        assert str(err.value) == (
            f"{name}: cannot read: No such file or directory (coevo's own scenario of that "
            f"name: {shipped})"
        )
    for name in ("no_such_scenario", "sub/quickstart"):
        with pytest.raises(ScenarioInvalid) as err:
            load_scenario(name)
        assert str(err.value) == f"{name}: cannot read: No such file or directory"


def test_a_set_over_a_run_s_stored_scenario_is_named_when_refused() -> None:
    """``whatif``/``probe --set grpo.nokey=1`` said only "unknown field `nokey`" (``run`` and
    ``validate`` name the --set that gave it)."""
    from engine.eventlog import new_run_meta
    from scenarios.loader import stored_scenario

    text = resolved_toml(load_scenario(ROOT / "scenarios" / "grpo.toml"))
    meta = new_run_meta("r", scenario_name="grpo", seed=0, coevo_version="0", scenario_toml=text)
    assert stored_scenario(meta, "runs/r", ["policy.device=cpu"]).policy.device == "cpu"
    with pytest.raises(ScenarioInvalid, match=r"`nokey`.*\(given by --set grpo\.nokey=1\)"):
        stored_scenario(meta, "runs/r", ["grpo.nokey=1"])


def test_a_stored_scenario_without_a_later_setting_reads_as_the_run_was_made() -> None:
    """``[complementary] reweight_counts`` came after runs were recorded: a stored scenario
    without it is a run that counted every weighted call as trained, and re-deriving, checking
    or resuming it under today's default re-derived credits it never gave."""
    from engine.eventlog import new_run_meta
    from scenarios.loader import stored_scenario

    scenario = load_scenario(ROOT / "scenarios" / "complementary.toml")
    assert scenario.complementary.reweight_counts == "pushed"  # today's default

    def stored(text: str) -> str:
        meta = new_run_meta("r", scenario_name="c", seed=0, coevo_version="0", scenario_toml=text)
        return stored_scenario(meta, "runs/r").complementary.reweight_counts

    text = resolved_toml(scenario)
    assert 'reweight_counts = "pushed"' in text and stored(text) == "pushed"
    old = "\n".join(line for line in text.splitlines() if "reweight_counts" not in line)
    assert stored(old) == "weighted"
    # a run written before query_chars embedded its queries and keys whole (0): it resumed
    # with today's default, 1,024, and embedded its longer keys again cut
    meta = new_run_meta("r", scenario_name="c", seed=0, coevo_version="0", scenario_toml=text)
    assert stored_scenario(meta, "runs/r").empo2.query_chars == 1024
    before = "\n".join(line for line in text.splitlines() if "query_chars" not in line)
    meta = new_run_meta("r", scenario_name="c", seed=0, coevo_version="0", scenario_toml=before)
    old_run = stored_scenario(meta, "runs/r")
    assert old_run.empo2.query_chars == 0 and old_run.complementary.query_chars == 0
    # a run written before eval.own_seeds counted evaluation episodes into the training
    # episodes' seeds: resumed with today's default, its later episodes would play others
    assert "own_seeds = true" in text
    assert stored_scenario(meta, "runs/r").eval.own_seeds is True  # (meta: before, with it)
    before = "\n".join(line for line in text.splitlines() if "own_seeds" not in line)
    meta = new_run_meta("r", scenario_name="c", seed=0, coevo_version="0", scenario_toml=before)
    assert stored_scenario(meta, "runs/r").eval.own_seeds is False


def test_a_set_over_a_stored_scenario_that_nothing_reads_is_said() -> None:
    """``whatif --set complementary.guided_fraction=0.25`` on a GRPO run replayed the run
    unchanged without a word, as if the setting had been tried (``run`` and ``validate`` warn
    of a table nothing reads)."""
    from structlog.testing import capture_logs

    from engine.eventlog import new_run_meta
    from scenarios.loader import stored_scenario

    text = resolved_toml(load_scenario(ROOT / "scenarios" / "grpo.toml"))
    meta = new_run_meta("r", scenario_name="grpo", seed=0, coevo_version="0", scenario_toml=text)
    sets = ["policy.device=cpu", "complementary.guided_fraction=0.25", "empo2.top_k=3"]
    with capture_logs() as logs:
        stored_scenario(meta, "runs/r", sets)
        stored_scenario(meta, "runs/r", sets[:1])  # read: no word
    assert [e["event"] for e in logs] == [
        "runs/r (its scenario): --set complementary.guided_fraction=0.25 empo2.top_k=3: nothing "
        "reads [empo2], [complementary] in this run (method 'grpo', agent 'policy'): it "
        "changes nothing"
    ]


def test_a_set_the_asking_command_never_reads_is_said() -> None:
    """``audit RUN whatif --set grpo.lr=0.5`` (a setting of the run's own method) replayed the
    episode without a word: a replay of episodes trains nothing (``whatif`` and ``probe``
    name what they never read)."""
    from structlog.testing import capture_logs

    from engine.eventlog import new_run_meta
    from scenarios.loader import stored_scenario

    text = resolved_toml(load_scenario(ROOT / "scenarios" / "grpo.toml"))
    meta = new_run_meta("r", scenario_name="grpo", seed=0, coevo_version="0", scenario_toml=text)
    sets = ["policy.device=cpu", "grpo.lr=0.5", "eval.every=2"]
    with capture_logs() as logs:
        stored_scenario(meta, "runs/r", sets, ignored=("grpo", "eval"))
        stored_scenario(meta, "runs/r", sets[:1], ignored=("grpo", "eval"))  # read: no word
        stored_scenario(meta, "runs/r", sets)  # a command that reads them all (resume)
    assert [e["event"] for e in logs] == [
        "runs/r (its scenario): --set grpo.lr=0.5 eval.every=2: this command reads nothing of "
        "[grpo], [eval] (it plays episodes and trains nothing): it changes nothing"
    ]


def test_the_built_in_model_is_refused_too_few_positions_for_a_cut_prompt() -> None:
    """``policy.embedded.max_positions = 8`` was valid, and the run failed building its model
    ("room for 5 prompt tokens cannot hold a cut prompt"): minutes in with a real world."""
    from agents.models.specs import EmbeddedSpec

    with pytest.raises(ValueError, match="max_positions must be between 16 and 131072, got 8"):
        EmbeddedSpec(max_positions=8)
    assert EmbeddedSpec(max_positions=16).max_positions == 16


def test_greedy_grpo_is_warned_that_its_groups_play_alike() -> None:
    """``policy.temperature = 0`` validated in silence; a GRPO run in minilab then played
    every group's episodes alike, and no update changed the policy."""
    from structlog.testing import capture_logs

    from scenarios.loader import warn_settings

    grpo = ROOT / "scenarios" / "grpo.toml"
    for temperature, warned in ((0.0, True), (0.7, False)):
        scenario = load_scenario(grpo, [f"policy.temperature={temperature}"])
        with capture_logs() as logs:
            warn_settings(str(grpo), scenario, [], scenario.run.episodes)
        said = [e["event"] for e in logs if "acts greedily" in e["event"]]
        assert bool(said) == warned, logs
