"""The embedded model a scenario asks for: the run's ``[world.options]`` are its world's, so a
model built on another world does not take them (a plug-in world's options built a minilab
model of 3-step episodes, or failed naming minilab's constructor)."""

from __future__ import annotations

from agents.models.specs import EmbeddedSpec
from scenarios.loader import parse_toml, to_scenario
from scenarios.policy_models import embedded_spec

BASE = """name = "s"
[world]
name = "minilab"
[world.options]
max_steps = 3
"""


def spec_of(text: str) -> EmbeddedSpec:
    return embedded_spec(to_scenario(parse_toml(text, "s.toml"), "s.toml"), "s.toml")


def test_the_run_s_world_options_are_the_model_s_only_on_the_run_s_world() -> None:
    own = spec_of(BASE)
    assert own.world == "minilab" and own.world_options == {"max_steps": 3}
    named = spec_of(BASE + '[policy.embedded]\nworld = "minilab"\n')
    assert named.world_options == {"max_steps": 3}
    other = spec_of(
        BASE.replace('name = "minilab"', 'name = "paced"') + "[policy.embedded]\n"
        'world = "minilab"\n'
    )
    assert other.world == "minilab" and other.world_options == {}
    told = spec_of(
        BASE.replace('name = "minilab"', 'name = "paced"') + "[policy.embedded]\n"
        'world = "minilab"\nworld_options = { max_steps = 5 }\n'
    )
    assert told.world_options == {"max_steps": 5}
