"""The invariants on generated streams (``agents.testing.streams``): every well-formed stream
holds every one, and each one catches exactly the violation it names, injected into a valid
stream, at the right seq (its negative control)."""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from agents.events.extractor import (
    CreditAssigned,
    CreditsSettled,
    ExtractionRequested,
    MergePlanned,
)
from agents.events.memory import (
    ReflectionRequested,
    RetrievalRequested,
    TipEvicted,
    TipsRetrieved,
    TipStored,
)
from agents.events.policy import (
    ActionRequested,
    ActionSampled,
    AdvantagesComputed,
    EvalRoundFinished,
    EvalRoundStarted,
    GradientRequested,
    PolicyUpdated,
)
from agents.invariants import Credit
from agents.testing.edits import drop, insert, swap
from agents.testing.events import policy_updated
from agents.testing.streams import AUDIT, Memory, StreamBuilder, runs
from engine.eventlog import new_run_meta
from engine.events import Envelope, Event
from engine.invariants import CheckContext, Invariant, check_stream, registered
from engine.lifecycle import RunResumed, RunStopped

Stream = list[Envelope[Event]]
CONTROL = settings(  # rare events (updates) are filtered for: slow on a loaded machine, not wrong
    max_examples=40, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow]
)


def fresh(name: str) -> Invariant:
    """A new instance of ``name`` (``credit`` under the settings streams are made with)."""
    return (
        Credit.with_settings(AUDIT)
        if name == "credit"
        else registered()[name].factory(CheckContext())
    )


def coevos() -> list[str]:
    """coevo's own invariants (other tests register plug-ins' in the same session)."""
    return sorted(
        name
        for name, r in registered().items()
        if r.factory.__module__.split(".")[0] in ("engine", "agents")
    )


def caught(envs: Stream, name: str) -> int | None:
    """The seq at which ``name`` reports ``envs`` (None: it holds)."""
    report = check_stream([envs], [fresh(name)])
    if report.violation is None:
        return None
    assert report.violation.invariant == name
    assert report.violation.seq in report.violation.involved
    return report.violation.seq


def pick(data: st.DataObject, envs: Stream, test: Callable[[Event], bool]) -> int:
    """The seq of a drawn event that passes ``test`` (the example is discarded if none)."""
    seqs = [env.seq for env in envs if test(env.event)]
    assume(seqs)
    return data.draw(st.sampled_from(seqs))


# --- every generated stream holds every invariant ----------------------------------------------


@settings(max_examples=150)
@given(envs=runs())
def test_every_well_formed_stream_holds_every_invariant(envs: Stream) -> None:
    names = coevos()
    assert len(names) == 8
    report = check_stream([envs], [fresh(n) for n in names])
    assert report.violation is None, report.violation
    assert report.events == len(envs)
    last = envs[-1].event
    assert report.completed == (isinstance(last, RunStopped) and last.reason == "completed")


# --- negative controls: exactly the violation each invariant names ----------------------------


@CONTROL
@given(envs=runs(completed=True), data=st.data())
def test_sessions_catches_an_event_after_the_run_completed(
    envs: Stream, data: st.DataObject
) -> None:
    assert caught(envs, "sessions") is None
    bad = insert(envs, len(envs), EpisodeAborted(episode="ep", worker="w", reason="late"))
    assert caught(bad, "sessions") == len(envs)


@CONTROL
@given(envs=runs(), data=st.data())
def test_sessions_catches_an_event_between_a_stop_and_its_resume(
    envs: Stream, data: st.DataObject
) -> None:
    at = pick(data, envs, lambda ev: isinstance(ev, RunResumed))
    bad = insert(envs, at, EpisodeAborted(episode="ep", worker="w", reason="stale"))
    assert caught(envs, "sessions") is None and caught(bad, "sessions") == at


@CONTROL
@given(envs=runs(), data=st.data())
def test_episodes_catches_an_episode_finished_twice(envs: Stream, data: st.DataObject) -> None:
    at = pick(data, envs, lambda ev: isinstance(ev, EpisodeFinished))
    bad = insert(envs, at + 1, envs[at].event)
    assert caught(envs, "episodes") is None and caught(bad, "episodes") == at + 1


@CONTROL
@given(envs=runs(), data=st.data())
def test_requests_catches_a_request_answered_twice(envs: Stream, data: st.DataObject) -> None:
    at = pick(data, envs, lambda ev: isinstance(ev, ActionSampled))
    bad = insert(envs, at + 1, envs[at].event, cause=envs[at].cause)
    assert caught(envs, "requests") is None and caught(bad, "requests") == at + 1


@CONTROL
@given(envs=runs(completed=True, ops=("assign", "start", "turn", "finish")), data=st.data())
def test_requests_catches_a_request_never_answered_by_the_runs_end(
    envs: Stream, data: st.DataObject
) -> None:
    at = pick(data, envs, lambda ev: isinstance(ev, ActionSampled))
    request = envs[at].cause
    assert request is not None
    assert caught(envs, "requests") is None and caught(drop(envs, at), "requests") == request


@CONTROL
@given(envs=runs(memory="extractor", completed=True), data=st.data())
def test_requests_catches_a_merge_pass_never_planned_or_planned_wrong(
    envs: Stream, data: st.DataObject
) -> None:
    """A pass the memory never planned (the run completed without it: its merge lost), or a
    plan that miscounts its chunks; a log whose writer predates ``merge_planned`` is not asked
    for plans."""
    at = pick(data, envs, lambda ev: isinstance(ev, MergePlanned))
    plan = envs[at].event
    assert isinstance(plan, MergePlanned)
    due = envs[at].cause
    assert caught(envs, "requests") is None and caught(drop(envs, at), "requests") == due
    miscounted = swap(envs, at, msgspec.structs.replace(plan, requests=plan.requests + 1))
    assert caught(miscounted, "requests") == at
    meta = new_run_meta("r", scenario_name="s", seed=0, coevo_version="0", scenario_toml="")
    versions = {k: v for k, v in meta.event_versions.items() if k != "merge_planned"}
    older = CheckContext(meta=msgspec.structs.replace(meta, event_versions=versions))
    requests = registered()["requests"].factory
    assert check_stream([drop(envs, at)], [requests(older)]).violation is None
    assert check_stream([drop(envs, at)], [requests(CheckContext(meta=meta))]).violation


@CONTROL
@given(envs=runs(memory="extractor", completed=True))
def test_requests_catches_credits_never_settled_or_settled_wrong(envs: Stream) -> None:
    """A completed run whose credit actor never answered the trainer's ``credits_due`` (an
    extractor update it asked for late would be lost), or answered with another count of
    the update requests before it."""
    [at] = [env.seq for env in envs if isinstance(env.event, CreditsSettled)]
    settled = envs[at].event
    assert isinstance(settled, CreditsSettled)
    due = envs[at].cause
    assert caught(envs, "requests") is None and caught(drop(envs, at), "requests") == due
    miscounted = swap(envs, at, msgspec.structs.replace(settled, updates=settled.updates + 1))
    assert caught(miscounted, "requests") == at


@CONTROL
@given(envs=runs(), data=st.data())
def test_versions_catches_a_broken_chain(envs: Stream, data: st.DataObject) -> None:
    at = pick(data, envs, lambda ev: isinstance(ev, PolicyUpdated))
    ev = envs[at].event
    assert isinstance(ev, PolicyUpdated)
    skipped = msgspec.structs.replace(ev, policy_version=ev.policy_version + 1)
    assert caught(envs, "versions") is None and caught(swap(envs, at, skipped), "versions") == at
    if ev.policy_version > 1:  # a digest chain to break, too
        forked = msgspec.structs.replace(ev, parent_digest="not-the-last-digest")
        assert caught(swap(envs, at, forked), "versions") == at


@CONTROL
@given(envs=runs(), data=st.data())
def test_versions_catches_a_sample_from_a_version_not_yet_made(
    envs: Stream, data: st.DataObject
) -> None:
    at = pick(data, envs, lambda ev: isinstance(ev, ActionSampled))
    ev = envs[at].event
    assert isinstance(ev, ActionSampled)
    bad = swap(envs, at, msgspec.structs.replace(ev, policy_version=ev.policy_version + 1))
    assert caught(envs, "versions") is None and caught(bad, "versions") == at


@pytest.mark.parametrize("holds", [True, False])
def test_versions_catches_an_update_published_while_a_round_held_them(holds: bool) -> None:
    """A round that holds updates ends at its own version; one written before the hold (an
    old log) may end at a later one."""
    played = [
        EvalRoundStarted(round=0, policy_version=0, episodes=1, holds_updates=holds),
        policy_updated(1),
        EvalRoundFinished(
            round=0, policy_version=0, episodes=1, success=1.0, score=1.0, train_episodes=4
        ),
    ]
    envs = [Envelope(seq=i, run="r", t=0, actor="trainer", event=ev) for i, ev in enumerate(played)]
    assert caught(envs, "versions") == (2 if holds else None)
    after = [played[0], played[2], played[1]]  # the update once the round has ended
    envs = [Envelope(seq=i, run="r", t=0, actor="trainer", event=ev) for i, ev in enumerate(after)]
    assert caught(envs, "versions") is None


def test_runs_draw_evaluation_rounds_that_hold_updates_and_failed_sessions() -> None:
    """``runs()`` drew no evaluation round, held-out episode or failed session: a fold or
    invariant that mishandled them passed every drawn stream. A drawn round's held-out
    episodes interleave with training, an update due meanwhile waits for the round's end,
    and a failed session is resumed as a stopped one is."""
    from hypothesis import find

    def held(envs: Stream) -> bool:  # an update requested after a round that held it
        kinds = [type(e.event).__name__ for e in envs]
        if "EvalRoundStarted" not in kinds or "PolicyUpdated" not in kinds:
            return False
        start, end = kinds.index("EvalRoundStarted"), kinds.index("EvalRoundFinished")
        groups = [i for i, k in enumerate(kinds) if k == "AdvantagesComputed"]
        return len(groups) >= 2 and start < groups[1] < end < kinds.index("PolicyUpdated")

    ops = ("assign", "start", "turn", "finish", "evaluate")
    envs = find(runs(memory="none", ops=ops, completed=True), held)
    assert caught(envs, "versions") is None
    evals = [e.event for e in envs if getattr(e.event, "purpose", "") == "eval"]
    assert evals and all(getattr(ev, "split", "heldout") == "heldout" for ev in evals)
    at = next(e.seq for e in envs if isinstance(e.event, EvalRoundFinished))
    asked = next(e for e in envs if isinstance(e.event, GradientRequested))
    update = next(e for e in envs if isinstance(e.event, PolicyUpdated))
    assert at < asked.seq < update.seq  # requested once the round had ended
    early = drop(drop(envs, update.seq), asked.seq)  # both published while the round held:
    early = insert(insert(early, at, asked.event), at + 1, update.event, cause=at)
    assert caught(early, "versions") == at + 2  # the round ends at another version

    failed = find(
        runs(ops=("assign", "start", "stop")),
        lambda envs: any(isinstance(e.event, RunResumed) and e.event.previous == "run_failed"
                         for e in envs),
    )  # fmt: skip
    assert caught(failed, "sessions") is None


@CONTROL
@given(envs=runs(memory="extractor"), data=st.data())
def test_lineage_catches_an_entry_whose_parent_was_never_stored(
    envs: Stream, data: st.DataObject
) -> None:
    at = pick(data, envs, lambda ev: isinstance(ev, TipStored))
    ev = envs[at].event
    assert isinstance(ev, TipStored)
    bad = swap(envs, at, msgspec.structs.replace(ev, parents=(*ev.parents, 10_000)))
    assert caught(envs, "lineage") is None and caught(bad, "lineage") == at


@CONTROL
@given(envs=runs(memory="tips"), data=st.data())
def test_lineage_catches_an_entry_that_ends_at_no_call_and_no_reflection(
    envs: Stream, data: st.DataObject
) -> None:
    at = pick(data, envs, lambda ev: isinstance(ev, TipStored))
    ev = envs[at].event
    assert isinstance(ev, TipStored)
    bad = swap(envs, at, msgspec.structs.replace(ev, episode="ep-never-reflected-on"))
    assert caught(envs, "lineage") is None and caught(bad, "lineage") == at


@CONTROL
@given(envs=runs(), data=st.data())
def test_retrievals_catches_an_entry_shown_after_its_eviction(
    envs: Stream, data: st.DataObject
) -> None:
    at = pick(data, envs, lambda ev: isinstance(ev, TipsRetrieved) and bool(ev.tip_ids))
    ev = envs[at].event
    assert isinstance(ev, TipsRetrieved)
    slot = next(
        e.event.slot
        for e in envs[:at]
        if isinstance(e.event, TipStored) and e.event.tip_id == ev.tip_ids[0]
    )
    bad = insert(envs, at, TipEvicted(tip_id=ev.tip_ids[0], slot=slot, reason="discard"))
    assert caught(envs, "retrievals") is None and caught(bad, "retrievals") == at + 1


@CONTROL
@given(envs=runs(), data=st.data(), broken=st.sampled_from(["short", "nan", "negative"]))
def test_retrievals_catches_a_malformed_answer(
    envs: Stream, data: st.DataObject, broken: str
) -> None:
    """A plug-in memory's answer with three tips and one similarity (or a NaN one, or a
    negative count) passed every check, and the audit of the run then died on it."""
    at = pick(data, envs, lambda ev: isinstance(ev, TipsRetrieved) and bool(ev.tip_ids))
    ev = envs[at].event
    assert isinstance(ev, TipsRetrieved)
    changed = {
        "short": {"similarities": ev.similarities[:-1]},
        "nan": {"similarities": (math.nan, *ev.similarities[1:])},
        "negative": {"similar": -5},
    }[broken]
    bad = swap(envs, at, msgspec.structs.replace(ev, **changed))
    assert caught(envs, "retrievals") is None and caught(bad, "retrievals") == at


@CONTROL
@given(envs=runs(), data=st.data())
def test_credit_catches_an_advantage_that_does_not_re_derive(
    envs: Stream, data: st.DataObject
) -> None:
    at = pick(data, envs, lambda ev: isinstance(ev, AdvantagesComputed))
    ev = envs[at].event
    assert isinstance(ev, AdvantagesComputed)
    advantages = (ev.advantages[0] + 0.5, *ev.advantages[1:])
    bad = swap(envs, at, msgspec.structs.replace(ev, advantages=advantages))
    assert caught(envs, "credit") is None and caught(bad, "credit") == at


@CONTROL
@given(envs=runs(memory="extractor"), data=st.data())
def test_credit_catches_a_credit_of_the_wrong_sign(envs: Stream, data: st.DataObject) -> None:
    at = pick(data, envs, lambda ev: isinstance(ev, CreditAssigned))
    ev = envs[at].event
    assert isinstance(ev, CreditAssigned)
    bad = swap(envs, at, msgspec.structs.replace(ev, credit=-ev.credit))
    assert caught(envs, "credit") is None and caught(bad, "credit") == at


@CONTROL
@given(envs=runs(), data=st.data())
def test_recorded_once_catches_a_group_recorded_twice(envs: Stream, data: st.DataObject) -> None:
    at = pick(data, envs, lambda ev: isinstance(ev, AdvantagesComputed))
    bad = insert(envs, at + 1, envs[at].event)
    assert caught(envs, "recorded-once") is None and caught(bad, "recorded-once") == at + 1


def test_every_registered_invariant_has_a_negative_control() -> None:
    """A new invariant of coevo's own needs its control here (plug-ins test theirs)."""
    controls = {
        name.removeprefix("test_").split("_catches_")[0].replace("_", "-")
        for name in globals()
        if "_catches_" in name
    }
    assert set(coevos()) <= controls, set(coevos()) - controls


def test_a_stream_shrinks_to_a_small_one() -> None:
    """A failure that needs one finished episode shrinks to the shortest stream that has one."""
    from hypothesis import find

    smallest = find(
        runs(memory="none", completed=False, ops=("assign", "start", "turn", "finish"), max_ops=30),
        lambda envs: any(isinstance(e.event, EpisodeFinished) for e in envs),
    )
    kinds = [type(e.event).__name__ for e in smallest]
    assert kinds == [
        "RunStarted",
        "EpisodeAssigned",
        "EpisodeStarted",
        "ActionRequested",  # its one turn: asked for, answered, taken, the episode's end
        "ActionSampled",
        "StepTaken",
        "EpisodeFinished",
    ]


@settings(max_examples=150)
@given(envs=runs())
def test_drawn_episodes_are_what_a_world_would_report(envs: Stream) -> None:
    """A finished attempt took at least one step, only its last done, and ended with that
    step's score and the sum of its rewards (an abandoned attempt's steps start over)."""
    steps: dict[str, list[StepTaken]] = {}
    for env in envs:
        ev = env.event
        if isinstance(ev, EpisodeAssigned):
            steps[ev.episode] = []
        elif isinstance(ev, StepTaken):
            assert not any(s.done for s in steps[ev.episode]), env
            steps[ev.episode].append(ev)
        elif isinstance(ev, EpisodeFinished):
            taken = steps[ev.episode]
            assert taken and taken[-1].done and ev.steps == len(taken), (env, taken)
            assert ev.score == taken[-1].score, env
            assert ev.total_reward == sum(s.reward for s in taken), env


# what real runs' actors cause each kind with (the event the emitting actor was handling)
REAL_CAUSES: dict[type[Event], tuple[type[Event], ...]] = {
    EpisodeStarted: (EpisodeAssigned,),
    RetrievalRequested: (EpisodeAssigned, ActionSampled),
    ActionRequested: (EpisodeAssigned, ActionSampled, TipsRetrieved),
    StepTaken: (ActionSampled,),
    EpisodeFinished: (ActionSampled,),
    ReflectionRequested: (ActionSampled,),
    ExtractionRequested: (ActionSampled,),
    AdvantagesComputed: (EpisodeFinished,),
}


@settings(max_examples=150)
@given(envs=runs())
def test_drawn_events_have_the_causes_real_runs_give_them(envs: Stream) -> None:
    """Each kind a worker or the trainer emits names as its cause what it was handling, of
    the same episode where it has one, as a run's actors do (a fold that follows causes
    works on drawn streams as on real logs)."""
    by_seq = {env.seq: env for env in envs}
    for env in envs:
        kinds = REAL_CAUSES.get(type(env.event))
        if kinds is None:
            continue
        assert env.cause is not None, env
        cause = by_seq[env.cause]
        assert isinstance(cause.event, kinds), (env, cause)
        mine, theirs = getattr(env.event, "episode", None), getattr(cause.event, "episode", None)
        assert mine is None or theirs is None or mine == theirs, (env, cause)


@settings(max_examples=150)
@given(envs=runs())
def test_a_drawn_worker_plays_one_episode_at_a_time(envs: Stream) -> None:
    """A worker is assigned an episode only once its last one ended (finished, aborted, or
    abandoned by a resume, which says so), as the scheduler keeps it."""
    playing: dict[str, str] = {}
    for env in envs:
        ev = env.event
        if isinstance(ev, EpisodeAssigned):
            assert ev.worker not in playing, (env, playing[ev.worker])
            playing[ev.worker] = ev.episode
        elif isinstance(ev, EpisodeFinished | EpisodeAborted | EpisodeAbandoned):
            assert playing.pop(ev.worker) == ev.episode, env
            assert not isinstance(ev, EpisodeAbandoned) or ev.reason, env


@pytest.mark.parametrize("memory", ["none", "tips", "extractor"])
def test_a_builder_called_directly_on_an_unstarted_episode_starts_it(memory: Memory) -> None:
    """``turn`` or ``finish`` called on an episode not yet started (``play`` never does) gave
    an action a cause of -1 and no ``episode_started``: it starts the episode first."""
    builder = StreamBuilder(memory=memory)
    builder.begin()
    builder.turn(builder.assign())
    builder.finish(builder.assign())
    builder.complete()
    envs = builder.envs
    assert all(env.cause is None or 0 <= env.cause < env.seq for env in envs)
    assert sum(isinstance(env.event, EpisodeStarted) for env in envs) == 2
    report = check_stream([envs], [fresh(n) for n in coevos()])
    assert report.violation is None, report.violation


def test_drawn_episodes_interleave_between_a_request_and_its_answer() -> None:
    """Other episodes' events come between an action's request and its sample, as the
    inference actor batches requests in a run (a fold assuming "the answer is next" fails)."""
    from hypothesis import find

    def interleaved(envs: Stream) -> bool:
        asked = {env.seq: env for env in envs if isinstance(env.event, ActionRequested)}
        return any(
            isinstance(env.event, ActionSampled)
            and env.cause in asked
            and any(
                getattr(between.event, "episode", "") not in ("", env.event.episode)
                for between in envs[env.cause + 1 : env.seq]
            )
            for env in envs
        )

    found = find(runs(memory="none", ops=("assign", "start", "turn", "finish")), interleaved)
    assert interleaved(found)


@CONTROL
@given(envs=runs(), data=st.data())
def test_every_check_catches_a_stream_out_of_order(envs: Stream, data: st.DataObject) -> None:
    """Whatever invariants are asked for, the stream's own numbering is checked: two envelopes
    swapped, seqs shifted, a cause that is not an earlier event (a log's reader refuses these;
    a stream made in memory may hold them)."""
    assume(len(envs) >= 3)
    at = data.draw(st.integers(1, len(envs) - 2))

    def numbering(bad: Stream) -> int | None:
        report = check_stream([bad], [])
        return None if report.violation is None else report.violation.seq

    assert numbering(envs) is None
    swapped = [*envs[:at], envs[at + 1], envs[at], *envs[at + 2 :]]
    assert numbering(swapped) == envs[at + 1].seq
    shifted = [*envs[:at], *(msgspec.structs.replace(e, seq=e.seq + 100) for e in envs[at:])]
    assert numbering(shifted) == at + 100
    ahead = msgspec.structs.replace(envs[at], cause=at + 1)
    assert numbering([*envs[:at], ahead, *envs[at + 1 :]]) == at
    report = check_stream([[*envs[:at], ahead, *envs[at + 1 :]]], [fresh(n) for n in coevos()])
    assert report.violation is not None and report.violation.invariant == "numbering"


def test_edits_keep_every_envelope_s_time() -> None:
    """insert and drop set every later envelope's time to its seq: a log edited with them
    exported throughput of 1e9 events/s and showed 00:00:00Z for every later event."""
    run = [
        Envelope(seq=i, run="r", t=1_000_000_000 * (i + 1), actor="a", event=RunStopped(
            reason="completed", signal="", exit_code=0))
        for i in range(3)
    ]  # fmt: skip
    inserted = insert(run, 1, RunResumed(after=0))
    assert [e.t for e in inserted] == [1e9, 1e9, 2e9, 3e9] and inserted[1].seq == 1
    assert [e.t for e in drop(run, 1)] == [1e9, 3e9]
