"""``coevo diff``'s comparison: scenarios key by key, logs stream by stream (interleavings
and wall-clock fields ignored, the earliest differing event found)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.analysis.diff import Names, describe, diverging_seqs, scenario_changes, stream_of
from agents.events.episodes import EpisodeAbandoned, StepTaken
from agents.events.extractor import MergeDue
from agents.events.policy import PolicyUpdated
from agents.testing.events import policy_updated
from engine.events import Envelope, Event
from engine.lifecycle import ActorFailed, ActorStarted, RunFailed, RunResumed, RunStopped


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
    # ep0's turn 1 (seq 2 in A) comes before ep1's (seq 3)
    assert found is not None and found[:3] == ("w0/ep0", 2, None)
    div = describe("w0/ep0", a[2], None)
    assert (div.seq_a, div.seq_b, div.differing) == (2, None, ("end of stream",))
    assert diverging_seqs(a[:2] + a[3:], b)[:3] == ("w1/ep1", 3, 2)  # A without ep0's turn 1
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
        streams = _streams(log, Names())
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
    assert diverging_seqs(a, c)[:3] == ("trainer/merge_due:step=1", 1, None)
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
    assert diverging_seqs(alone, changed)[:3] == ("worker/ep0", 1, 5)


def test_how_a_resumed_session_ended_is_left_out_and_the_run_s_end_compared() -> None:
    """A run stopped by SIGTERM (or failed) and resumed was called diverged from the run
    left alone at the stopped session's ``run_stopped`` (a failed one's ``actor_failed``),
    which also hid a real divergence later on (the stopped session's end came first)."""
    done = RunStopped(reason="completed")
    alone = _log(
        ("w0", "ep0", _step("ep0", 0)), ("w0", "ep0", _step("ep0", 1)), ("runtime", "", done)
    )
    for end in (
        RunStopped(reason="signal", signal="SIGTERM", exit_code=143),
        RunFailed(error_type="ActorCrashed", message="boom", actor="learner"),
    ):

        def resumed(reward: float, end: Event = end) -> list[Envelope[Event]]:
            failed = ActorFailed(
                actor="learner", attempt=0, error_type="E", message="m", traceback="", action="stop"
            )
            stopped = [("runtime", "", failed)] if isinstance(end, RunFailed) else []
            return _log(
                ("w0", "ep0", _step("ep0", 0)),
                *stopped,
                ("runtime", "", end),
                ("runtime", "", RunResumed(after=1)),
                ("w0", "ep0", _step("ep0", 1, reward)),
                ("runtime", "", done),
            )

        assert diverging_seqs(alone, resumed(0.0)) is None
        assert diverging_seqs(resumed(0.0), alone) is None
        found = diverging_seqs(resumed(1.0), alone)  # the real divergence, not the stop
        at = 4 if isinstance(end, RunFailed) else 3
        assert found is not None and found[:3] == ("w0/ep0", at, 1), found
    stopped = _log(("w0", "ep0", _step("ep0", 0)), ("runtime", "", RunStopped(reason="signal")))
    assert diverging_seqs(alone, stopped) is not None  # no session follows: the run's end


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


def _called(call: str, source: str, text: str = "add: open box") -> Event:
    from agents.events.extractor import ExtractorCalled

    return ExtractorCalled(
        call=call, task="extract", source=source, slot="train/heat", prompt_ids=(1,),
        response_ids=(2,), token_logps=(-0.5,), text=text, temperature=1.0, extractor_version=0,
    )  # fmt: skip


def _credited(call: str, episode: str, entry: int = 1) -> Event:
    from agents.events.extractor import CreditAssigned

    return CreditAssigned(episode=episode, entry=entry, call=call, success=True, credit=1.0, step=0)


def _stored(tip: int, call: str, parents: tuple[int, ...] = ()) -> Event:
    from agents.events.memory import TipStored

    return TipStored(
        tip_id=tip, slot="train/heat", episode="ep5", text="open box", score=0.0, key="k",
        call=call, parents=parents,
    )  # fmt: skip


def test_an_extractor_call_is_compared_by_what_it_is_about_not_its_id() -> None:
    """A call's id is its request's seq (x1786 in one run, x1798 in the other, every other
    field the same): diff reported a divergence at the first call of every Complementary RL
    pair; the first real difference (the call's text here) is still found."""
    a = _log(
        ("w0", "ep0", _step("ep0", 0)),
        ("extractor", "ep5", _called("x1", "ep5")),
        ("credit", "ep9", _credited("x1", "ep9")),
    )
    b = _log(
        ("w0", "ep0", _step("ep0", 0)),
        ("runtime", "", _started("w1")),
        ("extractor", "ep5", _called("x2", "ep5")),
        ("credit", "ep9", _credited("x2", "ep9")),
    )
    assert diverging_seqs(a, b) is None
    # entries numbered across slots in storing order: 3 and 7 here, 4 and 8 there
    a += _log(("memory", "ep5", _stored(3, "x1")), ("memory", "ep6", _stored(7, "x1", (3,))))
    a.append(
        a[0].__replace__(seq=len(a), actor="credit", corr="ep9", event=_credited("x1", "ep9", 7))
    )
    b += _log(("memory", "ep5", _stored(4, "x2")), ("memory", "ep6", _stored(8, "x2", (4,))))
    b.append(
        b[0].__replace__(seq=len(b), actor="credit", corr="ep9", event=_credited("x2", "ep9", 8))
    )
    a, b = (
        [e.__replace__(seq=i) for i, e in enumerate(a)],
        [e.__replace__(seq=i) for i, e in enumerate(b)],
    )
    assert diverging_seqs(a, b) is None
    wrong = [*b[:-1], b[-1].__replace__(event=_credited("x2", "ep9", 4))]  # the other entry
    found = diverging_seqs(a, wrong)
    assert found is not None and found.seq_a == len(a) - 1 and found.seq_b == len(b) - 1
    c = [*b[:2], b[2].__replace__(event=_called("x2", "ep5", text="add: look")), b[3]]
    found = diverging_seqs(a, c)
    stream = "extractor/extractor_called:call=extract:ep5:train/heat,slot=train/heat,"
    assert found is not None and found[:3] == (f"{stream}extractor_version=0", 1, 2)
    div = describe(found.stream, a[1], c[2], (found.names_a, found.names_b))
    assert div.differing == ("text",)
