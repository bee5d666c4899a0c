"""The invariant registry and the pass over a stream (``engine.invariants``): names, scopes,
what a live stream is not yet asked for, and a plug-in's own invariant next to coevo's."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agents.events.episodes import EpisodeAssigned
from agents.events.policy import ActionRequested
from agents.methods.builtin import Empo2
from engine.eventlog import MemoryEventLog
from engine.events import Envelope, Event
from engine.invariants import (
    CheckContext,
    InvariantViolated,
    check_log,
    check_stream,
    invariant,
    registered,
    select,
)
from engine.lifecycle import RunStarted, RunStopped
from engine.strategies import envelopes_of

START = RunStarted(run_id="r", scenario="s", scenario_hash="h", seed=1, coevo_version="0")
ASSIGNED = EpisodeAssigned(
    episode="ep0", index=0, worker="w", family="f", variant=0, split="train", seed=0
)
ASKED = ActionRequested(
    episode="ep0", worker="w", turn=0, messages=(), admissible=("look",), seed=0
)


class _NoPlain:
    """A world's promise for the tests below: no assignment is of rollout "plain"."""

    name = "test-no-plain"

    def __init__(self, ctx: CheckContext | None = None) -> None:
        self.ctx = ctx

    def check_many(self, envs: Sequence[Envelope[Event]]) -> None:
        for env in envs:
            if isinstance(env.event, EpisodeAssigned) and env.event.rollout == "plain":
                raise InvariantViolated(self.name, env.seq, "a plain rollout")

    def finish(self, completed: bool) -> None:
        return None


invariant("test-no-plain", worlds=("tests:World",))(_NoPlain)


def test_coevos_invariants_are_registered_and_scoped() -> None:
    known = registered()
    assert {"sessions", "recorded-once", "episodes", "requests", "versions"} <= set(known)
    assert {"lineage", "retrievals", "credit"} <= set(known)
    assert known["lineage"].methods == {"empo2", "complementary"}
    assert all(known[n].doc for n in known)


def test_a_run_gets_what_applies_to_its_method_and_world() -> None:
    chosen, skipped = select(CheckContext(method="grpo", world="minilab", scenario=object()))
    names = {r.name for r in chosen}
    assert "credit" in names and "lineage" not in names and "test-no-plain" not in names
    assert any(s.startswith("lineage: for methods complementary, empo2, not grpo") for s in skipped)
    mine = {r.name for r in select(CheckContext(method="empo2", world="tests:World"))[0]}
    assert {"lineage", "test-no-plain"} <= mine and "credit" not in mine  # no scenario
    assert "credit: needs the run's scenario (its settings)" in select(CheckContext())[1]


def test_names_given_are_run_whatever_their_scope_and_unknown_ones_refused() -> None:
    chosen, skipped = select(CheckContext(method="rollout"), ["lineage", "lineage"])
    assert [r.name for r in chosen] == ["lineage"] and skipped == []
    with pytest.raises(KeyError, match="unknown invariant 'nope'; known: credit, "):
        select(CheckContext(), ["nope"])


def test_a_name_is_registered_once() -> None:
    class Other(_NoPlain):
        pass

    invariant("test-no-plain", worlds=("tests:World",))(_NoPlain)  # the same again: fine
    with pytest.raises(ValueError, match="registered twice"):
        invariant("test-no-plain")(Other)


def test_a_plugins_invariant_reports_its_seq_and_the_factory_gets_the_context() -> None:
    ctx = CheckContext(world="tests:World")
    check = registered()["test-no-plain"].factory(ctx)
    assert isinstance(check, _NoPlain) and check.ctx is ctx
    report = check_stream([envelopes_of([START, ASSIGNED])], [check])
    assert report.violation is not None
    assert (report.violation.invariant, report.violation.seq) == ("test-no-plain", 1)


def test_what_a_run_owes_by_its_end_is_asked_of_a_completed_stream_only() -> None:
    requests = registered()["requests"].factory
    live = envelopes_of([START, ASSIGNED, ASKED])
    assert check_stream([live], [requests(CheckContext())], ended=False).ok
    assert check_stream([live], [requests(CheckContext())]).ok  # ended, not completed
    # the action of an episode that never finished is owed nothing, even at completion
    done = envelopes_of([START, ASSIGNED, ASKED, RunStopped(reason="completed")])
    report = check_stream([done], [requests(CheckContext())])
    assert report.ok and report.completed


def test_a_log_is_checked_in_one_call_against_named_invariants() -> None:
    log = MemoryEventLog()
    log.append(envelopes_of([START, ASSIGNED, ASSIGNED]))
    report = check_log(log, names=["episodes", "sessions"])
    assert report.invariants == ("episodes", "sessions") and report.events == 3
    assert report.violation is not None and report.violation.seq == 2
    assert report.violation.involved == (1, 2)
    assert check_log(log, names=["sessions"]).ok


class _KeepsItsMemory(Empo2):
    """A plug-in built on EMPO2 that changes its score only."""

    def score(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        return super().score(*args, **kwargs)  # type: ignore[arg-type]


class _OwnMemory(Empo2):
    """A plug-in built on EMPO2 that brings actors of its own (a memory of its making)."""

    def actors(self, run: object) -> tuple[()]:  # type: ignore[override]
        return ()


def test_a_subclass_that_keeps_its_built_in_s_memory_is_checked_as_the_built_in() -> None:
    """An outside tester: a subclass of EMPO2 with the built-in memory unchanged was not
    checked for ``lineage`` ("for methods complementary, empo2, not mymod:RandomScore")."""
    from scenarios.checks import _built_on  # pyright: ignore[reportPrivateUsage]

    assert (_built_on(_KeepsItsMemory), _built_on(_OwnMemory), _built_on(Empo2)) == (
        "empo2", "", "empo2",
    )  # fmt: skip
    kept = CheckContext(method="mymod:Kept", built_on="empo2")
    assert "lineage" in {r.name for r in select(kept)[0]}
    own = CheckContext(method="mymod:Own")
    assert "lineage: for methods complementary, empo2, not mymod:Own" in select(own)[1]
