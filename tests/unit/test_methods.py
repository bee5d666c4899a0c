"""The method interface around the hooks: the built-ins' actors come from their ``actors``
hook, a plug-in's base-model roles are checked, the first form of the hook (no argument) is
still called, Complementary RL's ablation settings change its scoring and its rule's name, and
the scenario's prompt texts reach the actors that write prompts."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest

from agents.acting.env_worker import EnvWorker, PromptSettings
from agents.memory.extraction import extract_messages
from agents.memory.memory_actor import MemoryActor
from agents.methods.base import LoadedModel, RunResources, base_models, method_actors
from agents.methods.builtin import Complementary, Empo2, Grpo
from agents.methods.settings import (
    QUERY_CHARS,
    ComplementaryConfig,
    Empo2Config,
    GrpoConfig,
)
from agents.models.embedder import BoundedEmbedder
from engine.actor import ActorSpec
from engine.errors import ScenarioInvalid
from scenarios.assemble import assemble
from scenarios.loader import parse_toml, to_scenario
from stores.checkpoints import MemoryCheckpoints


class Resources:
    """A run's resources that record what the hooks ask of them."""

    def __init__(self) -> None:
        self.stores: list[str] = []
        self.models: list[str] = []

    def run(self) -> RunResources:
        return RunResources(
            device="cpu",
            batch_max=4,
            batch_wait=0.001,
            checkpoints=self._store,
            base_model=self._model,
            load_model=self._load,
            prompts={"merge": "tidy these notes."},
        )

    def _store(self, name: str) -> MemoryCheckpoints:
        self.stores.append(name)
        return MemoryCheckpoints()

    def _load(self, role: str) -> LoadedModel:
        raise AssertionError(f"the hooks build specs only; {role!r} loads in its actor")

    def _model(self, role: str) -> Path | None:
        self.models.append(role)
        return None


def test_the_built_ins_bring_their_actors() -> None:
    grpo = GrpoConfig(group_size=4)
    res = Resources()
    assert method_actors(Grpo(grpo), res.run()) == ()
    empo2 = method_actors(Empo2(grpo, Empo2Config(embedder="hashing")), res.run())
    assert [a.name for a in empo2] == ["memory"]
    comp = Complementary(grpo, ComplementaryConfig(embedder="hashing"))
    actors = method_actors(comp, res.run())
    assert [a.name for a in actors] == ["memory", "extractor", "credit"]
    # the extractor's checkpoints keep their directory name, and its base model is asked for
    assert (res.stores, res.models) == (["extractor"], ["extractor"])
    assert base_models(comp) == ("extractor",) and base_models(Grpo(grpo)) == ()
    memory = actors[0].factory
    assert isinstance(memory, partial) and memory.func is MemoryActor
    assert memory.keywords["merge_system"] == "tidy these notes."


def test_the_memory_embeds_texts_cut_to_query_chars() -> None:
    """The memory actor's embedder is the scenario's, cutting texts to ``query_chars``."""
    grpo = GrpoConfig(group_size=4)
    for config in (
        Empo2(grpo, Empo2Config(embedder="hashing", query_chars=64)),
        Complementary(grpo, ComplementaryConfig(embedder="hashing", query_chars=64)),
    ):
        memory = method_actors(config, Resources().run())[0].factory
        assert isinstance(memory, partial)
        embedder = memory.args[0]()
        assert isinstance(embedder, BoundedEmbedder) and embedder.limit == 64
        assert embedder.name == "hashing/64"
    assert Empo2Config().query_chars == ComplementaryConfig().query_chars == QUERY_CHARS > 0


class OldForm(Grpo):
    """A plug-in written against the first form of the hook."""

    def actors(self):  # type: ignore[override]  # the old form, on purpose
        return (OLD,)


OLD = ActorSpec(name="old", factory=lambda: None)  # type: ignore[arg-type,return-value]


def test_the_first_form_of_the_actors_hook_is_still_called() -> None:
    assert method_actors(OldForm(GrpoConfig()), Resources().run()) == (OLD,)


class Critic(Grpo):
    name = "critic"
    base_models = ("critic",)


def test_an_unknown_base_model_role_is_refused(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"base model\(s\) \['critic'\]; known roles"):
        base_models(Critic(GrpoConfig()))
    (tmp_path / "critic_method.py").write_text(
        "from agents.methods.builtin import Grpo\n\n"
        "class Critic(Grpo):\n    name = 'critic'\n    base_models = ('critic',)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    toml = (
        'name = "c"\n[run]\nmethod = "critic_method:Critic"\nepisodes = 8\n'
        '[agent]\nkind = "policy"\n[grpo]\ngroup_size = 2\ngroups_per_update = 1\n'
    )
    scenario = to_scenario(parse_toml(toml, "c.toml"), "c.toml")
    try:
        with pytest.raises(
            ScenarioInvalid, match=r"\$\.run\.method: method 'critic' \(critic_method:Critic\) asks"
        ):
            assemble(scenario, "c.toml", prepare_model=False)
    finally:
        sys.modules.pop("critic_method", None)


@pytest.mark.parametrize(
    ("subgroups", "weights", "rule", "advantages"),
    [
        # rewards (1, 0 | 1, 1, 0, 0): guided (1, 0) mean 0.5, free (1, 1, 0, 0) mean 0.5;
        # weights n / (2 n_c): guided 6/4 = 1.5, free 6/8 = 0.75
        (True, True, "subgroup-mean-weighted-score", (0.75, -0.75, 0.375, 0.375, -0.375, -0.375)),
        (True, False, "subgroup-mean-flat-score", (0.5, -0.5, 0.5, 0.5, -0.5, -0.5)),
        (False, False, "group-mean-flat-score", tuple(r - 0.5 for r in (1, 0, 1, 1, 0, 0))),
    ],
)
def test_complementary_ablations_score_and_name_their_rule(
    subgroups: bool, weights: bool, rule: str, advantages: tuple[float, ...]
) -> None:
    c = ComplementaryConfig(subgroups=subgroups, subgroup_weights=weights)
    rollouts = ["guided", "guided", "plain", "plain", "plain", "plain"]
    scored = Complementary(GrpoConfig(group_size=6), c).score(
        [1.0, 0.0, 1.0, 1.0, 0.0, 0.0], rollouts, [[]] * 6
    )
    assert scored.rule == rule
    assert scored.advantages == pytest.approx(advantages)


@pytest.mark.parametrize(
    ("size", "fraction", "guided"),
    [(8, 0.5, 4), (7, 0.5, 3), (8, 0.25, 2), (100, 0.29, 29), (8, 0.0, 0), (8, 1.0, 8)],
)
def test_the_guided_subgroup_is_its_fraction_of_the_group_rounded_down(
    size: int, fraction: float, guided: int
) -> None:
    c = ComplementaryConfig(guided_fraction=fraction)
    assert c.guided_count(size) == guided
    method = Complementary(GrpoConfig(group_size=size), c)
    assert [method.rollout(0, c.warmup, 0, m) for m in range(size)] == (
        ["guided"] * guided + ["plain"] * (size - guided)
    )
    assert {method.rollout(0, c.warmup - 1, 0, m) for m in range(size)} == {"plain"}


def test_the_extraction_prompt_says_the_scenarios_operation_count() -> None:
    messages = extract_messages(
        "g", "start", [], success=True, entry=None, max_ops=5, system="{note} at most {max_ops}"
    )
    assert messages[0] == {"role": "system", "content": "{note} at most 5"}


def test_the_scenarios_prompt_texts_reach_the_env_workers() -> None:
    toml = (
        'name = "p"\n[run]\nmethod = "complementary"\nepisodes = 8\n[agent]\nkind = "policy"\n'
        "[grpo]\ngroup_size = 2\ngroups_per_update = 1\n"
        '[complementary]\nmax_ops = 5\nembedder = "hashing"\nwarmup = 1\n'
        '[prompt]\nreflect = "reflect so."\nextract = "extract {max_ops} so."\n'
        'merge = "merge so."\n'
    )
    scenario = to_scenario(parse_toml(toml, "p.toml"), "p.toml")
    specs = assemble(scenario, "p.toml", prepare_model=False).specs
    worker = next(s.factory for s in specs if s.name == "worker-0")
    assert isinstance(worker, partial) and worker.func is EnvWorker
    prompt = next(a for a in worker.args if isinstance(a, PromptSettings))
    assert (prompt.reflect, prompt.extract, prompt.max_ops) == (
        "reflect so.",
        "extract {max_ops} so.",
        5,
    )
    memory = next(s.factory for s in specs if s.name == "memory")
    assert isinstance(memory, partial) and memory.keywords["merge_system"] == "merge so."


def test_a_plug_in_built_on_a_method_is_prepared_and_audited_under_its_own_settings(
    tmp_path: Path, monkeypatch
) -> None:
    """A plug-in subclassing Complementary RL or EMPO2 takes its settings from [method]; what
    read them outside the method read [complementary] / [empo2] (their defaults): the
    extractor's base model, the reflections' length, the extraction prompt's max_ops, the
    probe's banks and the credit audit, which then called a correct run broken."""
    from agents.invariants.credit import run_settings
    from agents.methods.registry import method_settings
    from engine.errors import ModelUnavailable
    from scenarios.methods import empo2_settings, method_with
    from scenarios.policy_models import extractor_model_dir

    (tmp_path / "built_on.py").write_text(
        "from agents.methods.builtin import Complementary, Empo2\n\n"
        "class MyComp(Complementary):\n    pass\n\n"
        "class MyEmpo2(Empo2):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    head = '[agent]\nkind = "policy"\n[grpo]\ngroup_size = 4\ngroups_per_update = 1\n'

    def scenario(method: str, options: str):
        toml = f'name = "c"\n[run]\nmethod = "{method}"\nepisodes = 8\n{head}{options}'
        return to_scenario(parse_toml(toml, "c.toml"), "c.toml")

    try:
        comp = scenario(
            "built_on:MyComp",
            '[method]\ncredit = "score"\nbatch = 3\nsubgroups = true\nmax_ops = 2\n'
            'extractor = "/no/such/model"\n',
        )
        c = method_settings(comp, ComplementaryConfig)
        assert (c.credit, c.batch, c.max_ops) == ("score", 3, 2)
        audit = run_settings(comp)
        assert (audit.credit.batch, audit.credit.rule) == (3, "score")
        flat = method_with(comp, split=False)
        assert isinstance(flat, Complementary) and not flat._c.subgroups  # --set split=false
        with pytest.raises((ModelUnavailable, ScenarioInvalid), match=r"\$\.method\.extractor"):
            extractor_model_dir(comp, "c.toml", None)
        empo2 = scenario("built_on:MyEmpo2", "[method]\ntip_tokens = 6\n")
        assert empo2_settings(empo2).tip_tokens == 6
        builtin = scenario("complementary", "[complementary]\nbatch = 5\n")
        assert method_settings(builtin, ComplementaryConfig) is builtin.complementary
    finally:
        sys.modules.pop("built_on", None)


def test_a_score_of_numpy_numbers_is_taken_as_floats() -> None:
    """A plug-in's score returning np.float32 rewards was refused ("not numbers"), where
    credit rules took NumPy numbers; they are floats once checked (the log records floats)."""
    import numpy as np

    from agents.methods.base import Scored, checked_scored

    scored = Scored((np.float32(0.5), 1), (np.float64(0.25), -0.25), "mine", intrinsic_coef=0)
    out = checked_scored(scored, 2, Grpo(GrpoConfig()))
    assert out.rewards == (0.5, 1.0) and out.advantages == (0.25, -0.25)
    assert all(type(v) is float for v in (*out.rewards, *out.advantages, out.intrinsic_coef))
    with pytest.raises(ValueError, match="not numbers: True"):
        checked_scored(Scored((True, 0.0), (0.0, 0.0), "mine"), 2, Grpo(GrpoConfig()))
