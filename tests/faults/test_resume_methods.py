"""``coevo resume`` of rollout, EMPO2 and Complementary RL runs (GRPO: test_resume.py).

A scripted rollout is deterministic, so a run killed and resumed must have the events of the
same run left alone. EMPO2's and Complementary RL's runs are not deterministic even when left
alone: the memory's writes (a reflection, an extraction) race its reads (the next episode's
retrieval), see docs/RELIABILITY.md. For them a resume is checked for what it owes: the log
verifies, nothing committed is lost or recorded twice, every request of a finished episode is
answered exactly once, the bank's events follow from one another, the version chains of both
models are unbroken, every update re-executes bit for bit from the log (the resumed learner
and extractor trained from the weights and optimiser moments they had), and every credit
re-derives.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
from collections import Counter
from pathlib import Path

import fault_counts
import pytest
from resume_kit import (
    COMPLEMENTARY,
    EMPO2,
    ROLLOUT,
    Chain,
    add_counts,
    check_consistent,
    coevo,
    comparable,
    finish,
    read_log,
    stop_and_resume,
)

from agents.events.episodes import EpisodeAbandoned, EpisodeFinished
from agents.events.extractor import (
    ExtractionRequested,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
    MergeRequested,
)
from agents.events.memory import (
    ReflectionRequested,
    RetrievalRequested,
    TipEvicted,
    TipProposed,
    TipRejected,
    TipsRetrieved,
    TipStored,
)
from agents.events.policy import ActionRequested, ActionSampled, GradientRequested, PolicyUpdated
from engine.events import Envelope, Event
from engine.lifecycle import RunResumed
from scenarios.cli import main


def kills(rng: random.Random, n: int, stops: int) -> list[tuple[int, int]]:
    """``stops`` stops at increasing random points of a run of about ``n`` events, the
    first a SIGINT, the others SIGKILL."""
    points = sorted(rng.sample(range(n // 10, n - n // 10), stops))
    return [(signal.SIGINT if i == 0 else signal.SIGKILL, at) for i, at in enumerate(points)]


def scenario(root: Path, text: str) -> Path:
    path = root / "scenario.toml"
    path.write_text(text)
    return path


# --- rollout ------------------------------------------------------------------------------------


def test_a_rollout_stopped_three_times_ends_as_the_run_left_alone(tmp_path: Path) -> None:
    """Each stop's point counts the events of its own session (``relative``): an absolute
    point that the previous stop overshot (scripted explorers write thousands of events a
    second, and on a loaded machine the overshoot passed the next point) ends the next resume
    as it loads, before its first commit, and the run was stopped fewer times than planned.

    Whether a stop leaves an episode running is timing (:func:`resume_kit.check_abandoned`):
    on a loaded machine all three stops of a chain once landed between commits of whole
    episodes. A chain that abandoned nothing is checked and followed by another one, with
    other stops, until one has re-run an abandoned episode (three at most)."""
    toml = scenario(tmp_path, ROLLOUT)
    finish(coevo(["run", str(toml), "--out", str(tmp_path / "ref"), "--quiet"], tmp_path))
    reference = read_log(tmp_path / "ref")
    n, counts = len(reference), dict[str, int]()
    try:
        for attempt in range(3):
            rng = random.Random(3 + attempt)
            gaps = [(sig, rng.randrange(n // 20, n // 6)) for sig, _ in kills(rng, n, 3)]
            chain = stop_and_resume(tmp_path, toml, f"stopped{attempt}", gaps, relative=True)
            add_counts(counts, chain.counts())
            assert len(chain.after) == 3, "the run ended before a stop"
            assert chain.counts()["stops_before_first_commit"] == 0
            check_consistent(chain.run, chain.final, chain.after)
            assert comparable(chain.final) == comparable(reference)
            if any(isinstance(env.event, EpisodeAbandoned) for env in chain.final):
                return
        raise AssertionError("no stop of three chains left an episode running")
    finally:
        fault_counts.record(**counts)


def test_a_stop_before_a_resume_commits_leaves_the_log_as_it_was(tmp_path: Path) -> None:
    """A stop whose point has passed when its resume starts ends the resume before its first
    commit: the log stays as it was (no ``run_resumed``), and the next resume continues."""
    toml = scenario(tmp_path, ROLLOUT)
    plan = [(signal.SIGINT, 1000), (signal.SIGKILL, 1001), (signal.SIGKILL, 1002)]
    chain = stop_and_resume(tmp_path, toml, "stopped", plan)
    fault_counts.record(**chain.counts())
    assert len(chain.after) == 3
    assert chain.counts()["stops_before_first_commit"] == 2
    assert chain.after[0] == chain.after[1] == chain.after[2]
    check_consistent(chain.run, chain.final, chain.after)
    assert sum(isinstance(env.event, RunResumed) for env in chain.final) == 1


# --- what every resumed learning run owes --------------------------------------------------------


def answered_once(final: list[Envelope[Event]]) -> None:
    """Every request of an attempt that finished is answered exactly once (an action by a
    sample, a retrieval by its tips, a reflection by a tip, a tip by the bank, an extraction
    or a merge by an extractor call); a request of an abandoned attempt at most once (before
    the stop, never after the resume). Every gradient request of either model is answered by
    one update, in order."""
    finished = {env.event.episode for env in final if isinstance(env.event, EpisodeFinished)}
    abandoned = {
        env.event.episode: env.seq for env in final if isinstance(env.event, EpisodeAbandoned)
    }
    answers = (ActionSampled, TipsRetrieved, TipProposed, TipStored, TipRejected, ExtractorCalled)
    causes = Counter(env.cause for env in final if isinstance(env.event, answers))
    asked = (
        ActionRequested,
        RetrievalRequested,
        ReflectionRequested,
        TipProposed,
        ExtractionRequested,
    )
    for env in final:
        ev = env.event
        if isinstance(ev, asked):
            live = ev.episode in finished and abandoned.get(ev.episode, -1) < env.seq
            assert causes[env.seq] == 1 if live else causes[env.seq] <= 1, (env.seq, ev)
        elif isinstance(ev, MergeRequested):
            assert causes[env.seq] == 1, (env.seq, ev)
    for request, update in (
        (GradientRequested, PolicyUpdated),
        (ExtractorGradientRequested, ExtractorUpdated),
    ):
        requests = [env.event.update for env in final if isinstance(env.event, request)]
        made = [env.event.update for env in final if isinstance(env.event, update)]
        assert made == requests == list(range(len(requests))), (request, made, requests)


def versions_chain(final: list[Envelope[Event]], kind: type, field: str) -> None:
    """Versions 1, 2, ... in order, each starting from the digest its predecessor ended at."""
    updates = [env.event for env in final if isinstance(env.event, kind)]
    assert [getattr(u, field) for u in updates] == list(range(1, len(updates) + 1))
    for before, now in itertools.pairwise(updates):
        assert now.parent_digest == before.digest


def bank_follows(final: list[Envelope[Event]]) -> None:
    """Tip ids are given out in order, an eviction names a tip held, and a retrieval shows
    only tips held when it answered."""
    held: set[int] = set()
    next_id = 0
    for env in final:
        ev = env.event
        if isinstance(ev, TipStored):
            assert ev.tip_id == next_id
            held.add(ev.tip_id)
            next_id += 1
        elif isinstance(ev, TipEvicted):
            held.remove(ev.tip_id)
        elif isinstance(ev, TipsRetrieved):
            assert set(ev.tip_ids) <= held, env.seq


def reexecutes(run: Path, cache: Path) -> None:
    """``coevo replay --reexecute-learner`` re-derives every update's digest."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COEVO_CACHE", str(cache))
        assert main(["replay", str(run), "--reexecute-learner"]) == 0


LENGTH = {"empo2": 3500, "complementary": 3000}
"""About how many events each tiny run logs (stops fall between 10% and 90% of it)."""


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models' cache, shared by this module's runs (each builds them once)."""
    return tmp_path_factory.mktemp("cache")


def stopped_run(root: Path, cache: Path, method: str, seed: int, stops: int) -> Chain:
    """Run the tiny ``method`` scenario with ``stops`` stops, resumed after each."""
    root.mkdir(parents=True, exist_ok=True)
    toml = scenario(root, EMPO2 if method == "empo2" else COMPLEMENTARY)
    plan = kills(random.Random(seed), LENGTH[method], stops)
    chain = stop_and_resume(root, toml, "stopped", plan, cache)
    assert len(chain.after) == stops, "the run ended before a stop"
    return chain


def owes(chain: Chain, cache: Path, method: str) -> None:
    """What a resumed EMPO2 or Complementary RL run owes (the module docstring): consistency,
    every request answered once, the bank's events following from one another, both models'
    version chains, every update re-executed, and (Complementary RL) every credit re-derived."""
    run, final = chain.run, chain.final
    check_consistent(run, final, chain.after)
    answered_once(final)
    bank_follows(final)
    versions_chain(final, PolicyUpdated, "policy_version")
    versions_chain(final, ExtractorUpdated, "extractor_version")
    if method == "complementary":
        assert any(isinstance(env.event, ExtractorUpdated) for env in final)
    reexecutes(run, cache)
    if method == "complementary":
        assert main(["audit", str(run), "credit"]) == 0


def test_an_empo2_run_stopped_twice_resumes_consistently(tmp_path: Path, cache: Path) -> None:
    chain = stopped_run(tmp_path, cache, "empo2", 5, 2)
    fault_counts.record(**chain.counts())
    owes(chain, cache, "empo2")


def test_a_complementary_run_stopped_twice_resumes_consistently(
    tmp_path: Path, cache: Path
) -> None:
    chain = stopped_run(tmp_path, cache, "complementary", 6, 2)
    fault_counts.record(**chain.counts())
    owes(chain, cache, "complementary")


@pytest.mark.faults
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("method", ["empo2", "complementary"])
def test_sweep_of_stops_each_resumed(
    tmp_path: Path, cache: Path, method: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ten stops in chains of resumes, each chain checked as :func:`owes` says."""
    counts: dict[str, int] = {}
    for n in range(CHAINS):
        chain = stopped_run(tmp_path / f"c{n}", cache, method, 100 + n, 2)
        fault_counts.record(**add_counts(counts, chain.counts()), chains=n + 1)
        owes(chain, cache, method)
        with capsys.disabled():
            c = chain.counts()
            signals = ", ".join(f"{sig.name} at {at}" for sig, at in plan_of(method, n))
            print(
                f"\n{method} chain {n}: {c['stops']} stops survived ({signals}; "
                f"{c['stops_before_first_commit']} before the resume's first commit), "
                f"{c['abandoned']} episodes abandoned, {c['events']} events"
            )
    assert counts["stops"] == 2 * CHAINS


CHAINS = int(os.environ.get("COEVO_RESUME_CHAINS", "5"))
"""Chains of two stops per method in the sweep (``COEVO_RESUME_CHAINS`` for a shorter one)."""


def plan_of(method: str, chain: int) -> list[tuple[signal.Signals, int]]:
    """The stops of a sweep's chain (as :func:`stopped_run` draws them)."""
    return [
        (signal.Signals(sig), at)
        for sig, at in kills(random.Random(100 + chain), LENGTH[method], 2)
    ]
