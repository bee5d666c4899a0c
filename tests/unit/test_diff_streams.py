"""``coevo diff``'s comparison: scenarios key by key, logs stream by stream (interleavings
and wall-clock fields ignored, the earliest differing event found)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.analysis.diff import describe, diverging_seqs, scenario_changes, stream_of
from agents.events.episodes import EpisodeAbandoned, StepTaken
from agents.events.extractor import MergeDue
from agents.events.policy import PolicyUpdated
from agents.testing.events import policy_updated
from engine.events import Envelope, Event
from engine.lifecycle import ActorStarted, RunResumed


def _step(episode: str, turn: int, reward: float = 0.0) -> StepTaken:
    return StepTaken(
        episode=episode,
        turn=turn,
        action="look",
        observation="a room",
        admissible=("look",),
        reward=reward,
        done=False,
        score=0.0,
    )


def _log(*items: tuple[str, str, Event]) -> list[Envelope[Event]]:
    return [
        Envelope(seq=i, run="r", t=i, actor=actor, corr=corr, event=ev, cause=i - 1 if i else None)
        for i, (actor, corr, ev) in enumerate(items)
    ]


def _started(actor: str) -> ActorStarted:
    return ActorStarted(actor=actor, actor_type="EnvWorker", seed=1, attempt=0)


def _updated(seconds: float, loss: float = 0.5) -> PolicyUpdated:
    return policy_updated(1, loss=loss, grad_norm=1.0, checkpoint="c", seconds=seconds)


def test_interleavings_and_wall_clock_fields_are_not_divergences() -> None:
    a = _log(
        ("runtime", "", _started("w0")),
        ("runtime", "", _started("w1")),
        ("w0", "ep0", _step("ep0", 0)),
        ("w1", "ep1", _step("ep1", 0)),
        ("learner", "", _updated(1.5)),
    )
    b = _log(
        ("runtime", "", _started("w1")),
        ("runtime", "", _started("w0")),
        ("w1", "ep1", _step("ep1", 0)),
        ("w0", "ep0", _step("ep0", 0)),
        ("learner", "", _updated(9.0)),
    )
    assert diverging_seqs(a, b) is None


def test_the_earliest_differing_event_and_a_stream_that_ends() -> None:
    a = _log(
        ("w0", "ep0", _step("ep0", 0)),
        ("w1", "ep1", _step("ep1", 0)),
        ("w0", "ep0", _step("ep0", 1)),
        ("w1", "ep1", _step("ep1", 1, reward=1.0)),
    )
    b = _log(
        ("w1", "ep1", _step("ep1", 0)),
        ("w0", "ep0", _step("ep0", 0)),
        ("w1", "ep1", _step("ep1", 1, reward=0.5)),
    )
    found = diverging_seqs(a, b)
    assert found == ("w0/ep0", 2, None)  # ep0's turn 1 (seq 2 in A) comes before ep1's (seq 3)
    div = describe("w0/ep0", a[2], None)
    assert (div.seq_a, div.seq_b, div.differing) == (2, None, ("end of stream",))
    assert diverging_seqs(a[:2] + a[3:], b) == ("w1/ep1", 3, 2)  # A without ep0's turn 1
    div = describe("w1/ep1", a[3], b[2])
    assert div.differing == ("reward",)
    assert div.a is not None and div.a["event"]["reward"] == 1.0


def test_a_log_is_compared_by_digest_not_held_in_memory() -> None:
    """``coevo diff`` kept every event's encoded form of both logs (3.2 GB for a 3.2M-event
    log): it keeps a digest per event, whatever the event's size."""
    import tracemalloc

    from agents.analysis.diff import _streams

    big = _step("ep0", 0).__replace__(observation="x" * 2000)  # ~2 KB an event
    log = _log(*[(f"w{i % 4}", f"ep{i // 10}", big.__replace__(turn=i)) for i in range(5000)])
    tracemalloc.start()
    try:
        streams = _streams(log)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert sum(len(v) for v in streams.values()) == 2 * len(log)
    assert held < 100 * len(log)  # the events' encoded forms alone were ~10 MB


def test_an_event_not_about_the_episode_it_was_emitted_under_is_compared_by_its_subject() -> None:
    """The trainer emits a merge (or a group's advantages, an update) when whichever episode
    ended last ended: under that episode's id, which is timing. Such events are compared by
    what they are about, whatever episode's id they carry."""
    a = _log(("trainer", "ep1", MergeDue(step=0)), ("trainer", "ep4", MergeDue(step=1)))
    b = _log(("trainer", "ep2", MergeDue(step=0)), ("trainer", "ep3", MergeDue(step=1)))
    assert stream_of(a[0]) == "trainer/merge_due:step=0"
    assert diverging_seqs(a, b) is None
    c = _log(("trainer", "ep1", MergeDue(step=0)), ("trainer", "ep4", MergeDue(step=2)))
    assert diverging_seqs(a, c) == ("trainer/merge_due:step=1", 1, None)
    assert stream_of(_log(("w-3", "ep1", _step("ep1", 0)))[0]) == "w/ep1"  # about its episode


def test_an_abandoned_attempt_and_a_resume_are_left_out() -> None:
    """A run stopped mid-episode and resumed: the lost attempt, its abandonment and the
    session's lifecycle events are not compared; the re-run is, and equals the run left
    alone."""
    alone = _log(("worker-0", "ep0", _step("ep0", 0)), ("worker-0", "ep0", _step("ep0", 1)))
    resumed = _log(
        ("worker-0", "ep0", _step("ep0", 0, reward=0.25)),  # the lost attempt
        ("runtime", "", RunResumed(after=0)),
        ("runtime", "", _started("worker-0")),
        ("trainer", "ep0", EpisodeAbandoned(episode="ep0", worker="worker-0")),
        ("worker-1", "ep0", _step("ep0", 0)),
        ("worker-1", "ep0", _step("ep0", 1)),
    )
    assert diverging_seqs(alone, resumed) is None
    other = Envelope(seq=5, run="r", t=5, actor="worker-1", corr="ep0", event=_step("ep0", 5))
    changed = [*resumed[:-1], other]  # the re-run's second turn differs
    assert diverging_seqs(alone, changed) == ("worker/ep0", 1, 5)


def test_scenario_changes_are_dotted_keys() -> None:
    a = 'name = "x"\nseed = 0\n[run]\nepisodes = 4\n[tracking]\nsinks = []\n'
    b = 'name = "x"\nseed = 1\n[run]\nepisodes = 4\nworkers = 2\n'
    got = [(c.key, c.a, c.b) for c in scenario_changes(a, b)]
    assert got == [("run.workers", None, 2), ("seed", 0, 1), ("tracking.sinks", [], None)]


def test_a_table_filled_with_defaults_shows_what_was_used() -> None:
    """``[policy.embedded]`` holds only what a scenario changes: a key written at its default
    read as a difference from a run that left it out, and a default used read as missing."""
    from scenarios.schema import table_defaults

    defaults = table_defaults()
    layers = defaults["policy.embedded"]["layers"]
    a = f'name = "x"\n[policy.embedded]\nlayers = {layers}\n'
    b = 'name = "x"\n[policy]\nmodel = "embedded"\n[complementary.ops]\nsteps = 7\n'
    got = [(c.key, c.a, c.b, c.default_a, c.default_b) for c in scenario_changes(a, b, defaults)]
    assert got == [
        ("complementary.ops.steps", defaults["complementary.ops"]["steps"], 7, True, False),
        ("policy.model", None, "embedded", False, False),
    ]
    assert [c.key for c in scenario_changes(a, b)] == [
        "complementary.ops.steps",
        "policy.embedded.layers",
        "policy.model",
    ]  # without the defaults, as it was


def test_a_plugin_methods_options_are_compared_with_their_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plug-in's ``[method]`` table was compared as written; its ``Settings`` defaults fill
    it where the method imports (and nothing is filled where it does not)."""
    from scenarios.schema import table_defaults

    (tmp_path / "diff_method.py").write_text(
        "import msgspec\nfrom agents.methods.builtin import Grpo\n\n"
        "class Tuned(Grpo):\n"
        "    class Settings(msgspec.Struct):\n        beta: float = 0.5\n        k: int = 2\n\n"
        "    def __init__(self, grpo, settings):\n        super().__init__(grpo)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    a = 'name = "x"\n[run]\nmethod = "diff_method:Tuned"\n[method]\nbeta = 0.5\n'
    b = 'name = "x"\n[run]\nmethod = "diff_method:Tuned"\n[method]\nk = 3\n'
    defaults = table_defaults(method="diff_method:Tuned")
    assert defaults["method"] == {"beta": 0.5, "k": 2}
    got = [(c.key, c.a, c.b, c.default_a) for c in scenario_changes(a, b, defaults)]
    assert got == [("method.k", 2, 3, True)]
    assert table_defaults(method="no_such_module:X")["method"] == {}
