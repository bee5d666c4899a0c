"""Co-evolution you can see: did the extractor's RL make its bank better for the actor?

A rising credit curve cannot say: a frozen extractor's credit rises as much, because the actor
learns to use whatever entries it is shown. This probe holds everything but the extractor
fixed. For each extractor (versions of a Complementary RL run's extractor, and the frozen
control's) it rebuilds the bank that extractor would write from the same episodes
(:mod:`agents.memory.bank_rebuild`: the run's logged extraction requests and merge passes), then
plays one fixed policy with each bank on the same held-out tasks and seeds
(:mod:`agents.probe.play`), plus once with no bank. Success per bank comes with a 95% Wilson
interval (a percentile bootstrap of 0 of 20 is [0, 0], which any later success would lie
above), and each later version is compared with every frozen extractor, on the same episodes
(:mod:`agents.report.intervals`).

Co-evolution is shown when the last version's bank raises the policy's success above every
frozen extractor's bank (version 0, and the control's when given) beyond the 95% intervals:
its interval lies entirely above theirs. Loading the run (its scenario, models, versions) is
the application's: ``scenarios/probe_setup.py``; reporting is :mod:`agents.probe.report`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from agents.acting.inference import PolicyRunner
from agents.acting.world_calls import WorldFailed
from agents.learning.rounds import eval_tasks
from agents.memory.bank import MemorySettings
from agents.memory.bank_rebuild import (
    Answer,
    BankScript,
    BankStats,
    Embed,
    RebuildSettings,
    Rebuilt,
    rebuild_bank,
)
from agents.probe.play import Played, PlaySettings, episode_seeds, play
from agents.report.intervals import ROUNDS, Interval, paired_difference, success_rate
from engine.errors import CoevoError
from engine.seeds import derive_seed
from engine.world import Task, TextWorld

NO_BANK = "no bank"


class ProbeInvalid(CoevoError):
    """``coevo probe`` cannot run on what it was given: a run that is not Complementary RL, an
    extractor version the run does not have, a control whose extractor trained, a policy or
    base model that cannot be found or is not the one the log names.

    Raised before anything is played; unlike :class:`RunNotFound`, the run directory is there.
    """

    exit_code = 2


@dataclass(frozen=True)
class Writer:
    """An extractor whose bank is probed.

    Attributes:
        label: its name in the report ("v0", "v9", "control").
        version: its version in the run (None: another run's, the control).
        origin: where its weights came from (the base, a checkpoint, re-execution).
        digest: its parameters' digest.
        load: makes the extractor current and returns what answers requests as it (called
            once, just before its bank is rebuilt).
        frozen: an extractor that never trained (version 0, the control): the reference.
        same_as: the label of an earlier writer with the same weights and settings, whose
            bank this one shares (it would write the same bank).
    """

    label: str
    version: int | None
    origin: str
    digest: str
    load: Callable[[], Answer]
    frozen: bool
    same_as: str = ""


@dataclass(frozen=True)
class Setup:
    """Everything a probe holds fixed.

    Attributes:
        script: the run's bank-writing requests.
        bank: its bank's rules; ``dim`` its embedder's dimension; ``embed`` its embedder.
        rebuild: how its merge passes were formed.
        runner: the fixed policy; ``policy`` says which.
        make_world: builds one world of the run.
        heldout: the held-out tasks (cycled over the episodes).
        play: how the policy is prompted and batched.
        episodes: episodes per bank.
        seed: the probe's seed (episode seeds, bootstrap).
        resamples: bootstrap resamples per interval.
    """

    script: BankScript
    bank: MemorySettings
    dim: int
    embed: Embed
    rebuild: RebuildSettings
    runner: PolicyRunner
    policy: str
    make_world: Callable[[], TextWorld]
    heldout: Sequence[Task]
    play: PlaySettings
    episodes: int
    seed: int = 0
    resamples: int = ROUNDS


class BankResult(msgspec.Struct, frozen=True, kw_only=True):
    """One bank's probe: who wrote it, what it holds, and the policy's success with it.

    ``success`` is the mean over episodes with its Wilson interval, ``by_family`` the same
    per family; ``shown`` the fraction of episodes shown an entry, ``distinct`` how many
    different entries were shown; ``outcomes`` each episode's success (1 / 0) in index order;
    ``aborted`` how many episodes' world failed (counted as failures), ``abort`` the first
    one's reason; ``cut`` of ``turns`` turns had their prompt cut in the middle to fit the
    policy's positions (its goal may be lost).
    """

    label: str
    version: int | None
    origin: str
    digest: str
    stats: BankStats | None
    success: Interval
    score: float
    by_family: dict[str, Interval]
    shown: float
    distinct: int
    outcomes: list[int]
    aborted: int = 0
    abort: str = ""
    cut: int = 0
    turns: int = 0


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    """A later version's bank against a frozen extractor's, on the same episodes.

    ``above``: its success interval lies entirely above the reference's; ``difference`` the
    paired mean difference of success with its bootstrap interval.
    """

    bank: str
    reference: str
    above: bool
    difference: Interval


class ProbeResult(msgspec.Struct, frozen=True, kw_only=True):
    """The whole probe: what was held fixed, every bank's result, and the verdict."""

    run: str
    control: str
    policy: str
    seed: int
    episodes: int
    tasks: dict[str, int]
    extractions: int
    merge_passes: int
    banks: list[BankResult]
    comparisons: list[Comparison]
    shown: bool
    verdict: str
    overrides: tuple[str, ...] = ()
    """The ``--set key.path=value`` the run's scenario was read with (this machine's: where
    its models lie, the device; a setting of the run's own changes the policy probed)."""


@dataclass
class Progress:
    """Callbacks for long work: ``stage(label, total)`` starts a stage of ``total`` units,
    ``advance(n)`` reports ``n`` more done, ``done(result)`` reports a bank's result."""

    stage: Callable[[str, int], None] = lambda _label, _total: None
    advance: Callable[[int], None] = lambda _n: None
    done: Callable[[BankResult], None] = lambda _r: None


def probe(
    setup: Setup,
    writers: Sequence[Writer],
    progress: Progress | None = None,
    *,
    run: str = "",
    control: str = "",
) -> ProbeResult:
    """Rebuild each writer's bank, play the fixed policy with each (and with none), compare.

    Args:
        setup: what is held fixed.
        writers: the extractors, in report order (frozen ones first reads best).
        progress: callbacks for long work.
        run, control: the runs as the report names them.

    Raises:
        ValueError: no writers, ``episodes < 1``, or a ``same_as`` naming no earlier writer.
    """
    if not writers:
        raise ValueError("no extractor to probe")
    if setup.episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {setup.episodes}")
    p = progress or Progress()
    tasks = eval_tasks(setup.heldout, setup.episodes)  # as evaluation rounds pick them
    seeds = episode_seeds(setup.seed, setup.episodes)
    results = [_played_bank(setup, None, None, tasks, seeds, p)]
    built: dict[str, Rebuilt] = {}
    for w in writers:
        built[w.label] = _bank_of(setup, w, built, p)
        results.append(_played_bank(setup, w, built[w.label], tasks, seeds, p))
    comparisons = _compare(setup, writers, results)
    shown, verdict = _verdict(writers, results, comparisons)
    return ProbeResult(
        run=run,
        control=control,
        policy=setup.policy,
        seed=setup.seed,
        episodes=setup.episodes,
        tasks=dict(Counter(t.family for t in tasks)),
        extractions=setup.script.extractions,
        merge_passes=setup.script.passes,
        banks=results,
        comparisons=comparisons,
        shown=shown,
        verdict=verdict,
    )


def _bank_of(setup: Setup, w: Writer, built: dict[str, Rebuilt], p: Progress) -> Rebuilt:
    """``w``'s bank: the one it shares, or rebuilt with its extractor."""
    if w.same_as:
        if w.same_as not in built:
            raise ValueError(f"{w.label} shares the bank of {w.same_as!r}, not probed before it")
        return built[w.same_as]
    p.stage(f"{w.label}: rebuilding its bank", setup.script.extractions + setup.script.merge_calls)
    answer = w.load()
    return rebuild_bank(
        setup.script, answer, setup.embed, setup.bank, setup.dim, setup.rebuild, p.advance
    )


def _played_bank(
    setup: Setup,
    writer: Writer | None,
    rebuilt: Rebuilt | None,
    tasks: list[Task],
    seeds: list[int],
    p: Progress,
) -> BankResult:
    label = writer.label if writer else NO_BANK
    p.stage(f"{label}: playing", len(tasks))
    played = play(
        setup.runner,
        setup.make_world,
        tasks,
        seeds,
        setup.play,
        bank=rebuilt.copy() if rebuilt else None,
        embed=setup.embed if rebuilt else None,
        progress=p.advance,
    )
    if played and all(e.aborted for e in played):
        raise WorldFailed(
            f"{label}: the world failed in every one of the {len(played)} probe episodes, so "
            f"they measure nothing (the first: {played[0].aborted})"
        )
    result = _result(setup, writer, rebuilt, played)
    p.done(result)
    return result


def _result(
    setup: Setup, writer: Writer | None, rebuilt: Rebuilt | None, played: list[Played]
) -> BankResult:
    label = writer.label if writer else NO_BANK
    outcomes = [int(e.success) for e in played]
    families = sorted({e.family for e in played})
    by_family = {f: success_rate([e.success for e in played if e.family == f]) for f in families}
    return BankResult(
        label=label,
        version=writer.version if writer else None,
        origin=writer.origin if writer else "",
        digest=writer.digest if writer else "",
        stats=rebuilt.stats() if rebuilt else None,
        success=success_rate(outcomes),
        score=sum(e.score for e in played) / len(played),
        by_family=by_family,
        shown=sum(e.entry >= 0 for e in played) / len(played),
        distinct=len({e.entry for e in played if e.entry >= 0}),
        outcomes=outcomes,
        aborted=sum(bool(e.aborted) for e in played),
        abort=next((e.aborted for e in played if e.aborted), ""),
        cut=sum(e.cut for e in played),
        turns=sum(e.steps for e in played),
    )


def _bootstrap_seed(setup: Setup) -> int:
    """One resampling stream for every interval: the same outcomes (two banks that write the
    same entries) get the same interval, and banks are resampled on the same episodes."""
    return derive_seed(setup.seed, "bootstrap")


def _compare(
    setup: Setup, writers: Sequence[Writer], results: list[BankResult]
) -> list[Comparison]:
    """Every trained version's bank against every frozen extractor's."""
    of = {r.label: r for r in results}
    refs = [w.label for w in writers if w.frozen]
    later = [w.label for w in writers if not w.frozen]
    return [
        Comparison(
            bank=b,
            reference=r,
            above=of[b].success.above(of[r].success),
            difference=paired_difference(
                of[b].outcomes,
                of[r].outcomes,
                seed=_bootstrap_seed(setup),
                rounds=setup.resamples,
            ),
        )
        for b in later
        for r in refs
    ]


def _verdict(
    writers: Sequence[Writer], results: list[BankResult], comparisons: list[Comparison]
) -> tuple[bool, str]:
    """Whether co-evolution is shown, and one plain paragraph saying why."""
    of = {r.label: r for r in results}
    refs = [w.label for w in writers if w.frozen]
    later = [w for w in writers if not w.frozen]
    if not later:
        return False, (
            "Co-evolution is not shown: no trained extractor version was probed (the run's "
            "extractor never updated, or only frozen versions were asked for)."
        )
    if not refs:
        return False, "Co-evolution cannot be judged: no frozen extractor (version 0) was probed."
    last = max(later, key=lambda w: w.version or 0).label
    mine = [c for c in comparisons if c.bank == last]
    shown = all(c.above for c in mine)
    s = of[last].success
    parts = [
        f"{c.reference}'s {_ci(of[c.reference].success)} "
        f"(paired difference {c.difference.value:+.3f} "
        f"[{c.difference.low:+.3f}, {c.difference.high:+.3f}])"
        for c in mine
    ]
    head = "Co-evolution is shown" if shown else "Co-evolution is NOT shown"
    how = (
        "lies entirely above" if shown else "does not lie entirely above every one of"
    ) + " the frozen extractors' 95% intervals"
    return shown, (
        f"{head}: with the bank of {last} (the last extractor version probed) the fixed "
        f"policy succeeds {_ci(s)}, which {how}: " + "; ".join(parts) + "."
    )


def _ci(i: Interval) -> str:
    return str(i)
