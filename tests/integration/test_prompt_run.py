"""A tiny EMPO2 run with ``[prompt] memory = "system"`` and a system text of its own: every turn's
system message is that text, tips go after it and never into the user message, distillation's
prompts are stripped from the system message, every reflection is asked with the scenario's
reflection text, and the run directory keeps the settings."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch
from test_empo2_run import EMPO2
from test_grpo_run import of, read_events, run_scenario

from agents.events.memory import ReflectionRequested
from agents.events.policy import ActionRequested, ActionSampled
from agents.memory.extraction import EXTRACT_SYSTEM, MERGE_SYSTEM
from agents.models.prompts import encode_prompt, from_pairs, strip_tips
from engine.events import Event
from stores.model_dirs import load_model_dir

SYSTEM = "you act in a text lab. answer with one action."
REFLECT = "note one thing for the next try."
PROMPT = EMPO2.replace(
    "[logging]",
    f'[prompt]\nsystem = "{SYSTEM}"\nmemory = "system"\nreflect = "{REFLECT}"\n\n[logging]',
)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompt")
    run_scenario(path, PROMPT)
    return path


@pytest.fixture(scope="module")
def events(root: Path) -> list[Event]:
    return read_events(root / "run")


def test_tips_are_in_the_system_message_only(events: list[Event]) -> None:
    requests = of(events, ActionRequested)
    assert any(r.tips for r in requests), "later episodes should see earlier ones' tips"
    for r in requests:
        (role, system), (user_role, user) = r.messages
        assert (role, user_role) == ("system", "user")
        assert system == "\n".join([SYSTEM, *(f"<tip> {t} </tip>" for t in r.tips)])
        assert "<tip>" not in user


def test_reflections_are_asked_with_the_scenario_text(events: list[Event]) -> None:
    reflections = of(events, ReflectionRequested)
    assert reflections
    assert {r.messages[0] for r in reflections} == {("system", REFLECT)}


def test_distillation_strips_the_tips_from_the_system_message(
    root: Path, events: list[Event]
) -> None:
    (model_dir,) = (root / "cache" / "embedded").glob("*[!k]")  # the model, not its lock
    _, tokenizer = load_model_dir(model_dir, torch.device("cpu"))
    requests = {(a.episode, a.turn): a for a in of(events, ActionRequested)}
    stripped = 0
    for s in of(events, ActionSampled):
        req = requests[s.episode, s.turn]
        if not req.tips:
            assert s.bare_prompt_ids == ()
            continue
        bare = strip_tips(from_pairs(req.messages), req.tips, "system")
        assert bare[0]["content"] == SYSTEM
        assert list(s.bare_prompt_ids) == encode_prompt(tokenizer, bare)
        stripped += 1
    assert stripped


def test_the_run_directory_keeps_the_settings(root: Path) -> None:
    kept = tomllib.loads((root / "run" / "scenario.toml").read_text())
    assert kept["prompt"] == {
        "system": SYSTEM,
        "memory": "system",
        "reflect": REFLECT,
        "extract": EXTRACT_SYSTEM,
        "merge": MERGE_SYSTEM,
    }
