"""Notes shown to the policy (agents/models/notes.py) and the pre-training play that shows them
(agents/models/pretrain_play.py): what each kind of note is, that the scripted reader's outcome
matches the kind (a helpful note wins, a wrong one fails), and that turn prompts show them."""

from __future__ import annotations

import random

import pytest

from agents.acting.scripted import parse_note
from agents.models.embedded import EmbeddedSpec
from agents.models.notes import (
    EMPTY_NOTE,
    NoteSource,
    combine_notes,
    entry_text,
    follows_to_success,
    render,
    write_library,
    write_notes,
)
from agents.models.pretrain_play import note_episodes, turn_conversations
from scenarios.worlds.minilab import MiniLab

WRITTEN = "plan: open box, take key.\nfound: key after open box.\navoid: take rock."


def test_an_entry_keeps_plan_and_avoid_on_one_line() -> None:
    assert entry_text(WRITTEN) == "plan: open box, take key. avoid: take rock."
    assert entry_text(EMPTY_NOTE) == EMPTY_NOTE
    assert render([WRITTEN], as_entries=True) == (entry_text(WRITTEN),)
    assert render([WRITTEN], as_entries=False) == (WRITTEN,)


def test_combined_notes_take_the_first_plan_and_every_avoid_line() -> None:
    failure = "plan: take battery.\navoid: connect tin wire to battery."
    success = "plan: take battery, connect iron wire to battery."
    combined = combine_notes([entry_text(failure), success])
    assert parse_note(combined) == (["take battery"], {"connect tin wire to battery"})
    assert parse_note(combine_notes([EMPTY_NOTE, success])) == (
        ["take battery", "connect iron wire to battery"],
        set(),
    )
    assert combine_notes([]) == EMPTY_NOTE


@pytest.fixture(scope="module")
def world() -> MiniLab:
    return MiniLab(families=("heat", "circuit", "fetch"), train_variants=40, heldout_variants=6)


def test_written_notes_are_deterministic_and_a_success_note_wins_when_followed(world) -> None:
    tasks = list(world.tasks("circuit", "train"))[:10]
    library = write_library(world, tasks, 64, "t")
    assert library == write_library(world, tasks, 64, "t")
    wins = [w for w in library.values() if w.success is not None]
    assert wins, "the explorer finds a circuit success within 64 tries on some variant"
    for written in wins:
        assert follows_to_success(world, written.task, [written.success])
        assert EMPTY_NOTE not in written.failures and len(written.failures) <= 2
    fetch = write_notes(world, world.tasks("fetch", "train")[0], 64, "t")
    assert fetch.success is not None and not fetch.failures  # fetch has no trap


def test_each_kind_of_note_comes_from_where_it_says(world) -> None:
    tasks = [t for f in ("heat", "circuit", "fetch") for t in world.tasks(f, "train")[:30]]
    library = write_library(world, tasks, 64, "k")
    source = NoteSource(library, world)
    rng = random.Random(0)
    by_text = {w.success: w for w in library.values() if w.success}
    heat = [t for t in tasks if t.family == "heat" and library[t].success]
    checked_wrong = 0
    for task in heat[:10]:
        own = library[task]
        assert source.pick("variant", task, own.goal, rng, own=own).tips[0] == own.success
        assert source.pick("none", task, own.goal, rng).tips == ()
        assert source.pick("empty", task, own.goal, rng).tips == (EMPTY_NOTE,)
        (family,) = source.pick("family", task, own.goal, rng).tips
        assert by_text[family].task.family == "heat" and by_text[family].task != task
        (unrelated,) = source.pick("unrelated", task, own.goal, rng).tips
        assert by_text[unrelated].task.family != "heat"
        wrong = source.pick("wrong", task, own.goal, rng).tips
        if wrong:
            checked_wrong += 1
            assert by_text[wrong[0]].goal == own.goal and by_text[wrong[0]].task != task
            assert not follows_to_success(world, task, wrong)
    assert checked_wrong, "some heat variant has a same-goal note that fails it"
    with pytest.raises(ValueError, match="unknown note kind"):
        source.pick("helpful", heat[0], "x", rng)


def test_note_episodes_show_their_notes_in_every_turn_prompt(world) -> None:
    spec = EmbeddedSpec(
        world_options={"families": ["heat", "circuit"], "train_variants": 40},
        episodes_per_family=4,
        note_episodes_per_family=30,
        eval_variants=2,
    )
    episodes = note_episodes(world, spec)
    assert episodes == note_episodes(world, spec)
    assert len(episodes) == 90  # three families in the world, 30 each
    kinds = {ep.kind for ep in episodes}
    assert {"variant", "family"} <= kinds and "none" not in kinds
    for ep in episodes:
        assert ep.tips, ep.kind
        for messages in turn_conversations(ep, window=4):
            assert messages[1]["content"].endswith("".join(f"\n<tip> {t} </tip>" for t in ep.tips))
    variant = [ep for ep in episodes if ep.kind == "variant"]
    assert all(ep.success for ep in variant), "the Explorer wins with its variant's success note"
    held_back = {t for f in world.families() for t in world.tasks(f, "train")[-2:]}
    assert not {ep.task for ep in episodes} & held_back
    assert all(ep.task.split == "train" for ep in episodes)
    assert {len(ep.tips[0].splitlines()) > 1 for ep in variant} == {True, False}  # both forms


def test_no_note_episodes_when_the_spec_asks_for_none(world) -> None:
    spec = EmbeddedSpec(episodes_per_family=4, note_episodes_per_family=0, eval_variants=2)
    assert note_episodes(world, spec) == []
