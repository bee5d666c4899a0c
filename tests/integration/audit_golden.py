"""A small recorded Complementary RL run built event by event, whose lineage, credit and
advantages are known by hand (the golden answers of ``tests/integration/test_audit.py``).

Eight episodes of one task. Calls xA and xB write entries 0 and 1 from the free episodes
ep000 (failure) and ep001 (success); merge call xM merges them into entry 2; ep002 (success)
and ep003 (failure) are guided by entry 2; ep004's reflection writes entry 3; call xC (from
ep005) updates entry 2 into entry 4, which guides ep006 (success); ep007 is shown entry 3.
Credits: xM +1 (ep002), xM -1 (ep003), xC +1 (ep006); with batch 2 they make one extractor
request: calls (xM, xC), rewards (0, 1), advantages (-0.5, +0.5), weights (1, 1). The group
(ep000..ep003; free, free, guided, guided; rewards 0, 1, 1, 0) has advantages
(-0.5, +0.5, +0.5, -0.5).
"""

from __future__ import annotations

from pathlib import Path

from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from agents.events.extractor import (
    ExtractionRequested,
    ExtractorCalled,
    ExtractorUpdated,
    MergeDue,
    MergeRequested,
)
from agents.events.memory import (
    ReflectionRequested,
    RetrievalRequested,
    TipEvicted,
    TipProposed,
    TipsRetrieved,
    TipStored,
)
from agents.events.policy import (
    ActionRequested,
    ActionSampled,
    AdvantagesComputed,
    GradientRequested,
)
from agents.learning.credit_actor import CreditBook, credit_settings
from agents.methods.advantages import group_stats
from agents.testing.events import policy_updated
from engine.eventlog import new_run_meta
from engine.events import Envelope, Event
from scenarios.loader import parse_toml, to_scenario
from stores.lmdb_log import LmdbEventLog

TOML = (
    'name = "golden"\n[run]\nmethod = "complementary"\n[grpo]\nreward = "success"\n'
    '[complementary]\nbatch = 2\nreweight_counts = "pushed"\n'  # (a stored scenario lacking
)  # it is a run recorded before it: scenarios.loader.SINCE)
SETTINGS = credit_settings(to_scenario(parse_toml(TOML, "golden"), "golden").complementary)
SLOT = "train/heat"
TEXTS = {
    0: "open the oven first",
    1: "heat the can on the stove",
    2: "turn on the stove, then heat the can",
    3: "i took the can but never heated it",
    4: "stove first, then the can",
}


class Stream:
    """Envelopes numbered as they are added; the credit actor's fold runs alongside."""

    def __init__(self) -> None:
        self.envs: list[Envelope[Event]] = []
        self.book = CreditBook()
        self.calls: dict[str, str] = {}  # name in the docstring -> call id

    def add(self, ev: Event, cause: int | None = None, corr: str = "") -> int:
        seq = len(self.envs)
        self.envs.append(
            Envelope(seq=seq, run="golden", t=seq, actor="a", event=ev, cause=cause, corr=corr)
        )
        if isinstance(ev, TipsRetrieved | EpisodeFinished | EpisodeAbandoned):
            for out in self.book.decide(ev, SETTINGS):
                self.add(out, cause=seq)
        return seq

    def episode(
        self,
        ep: str,
        index: int,
        success: bool,
        tip: int | None = None,
        call: str = "",
        *,
        observation: str = "you see a can and a stove.",
        abandon: bool = False,
        abort: str = "",
        prompt_cut: int = 0,
    ) -> None:
        """One episode of one turn; ``abandon``: an attempt lost after its first sample
        (:class:`EpisodeAbandoned`), to be run again; ``abort``: the world failed on its first
        action (:class:`EpisodeAborted` with that reason)."""
        rollout = "guided" if tip is not None else "plain"
        self.add(
            EpisodeAssigned(
                episode=ep,
                index=index,
                worker="w0",
                family="heat",
                variant=1,
                split="train",
                seed=index,
                rollout=rollout,
                extract=True,
            )
        )
        self.add(
            EpisodeStarted(
                episode=ep,
                worker="w0",
                goal="heat the can.",
                observation=observation,
                admissible=("look", "take can"),
            )
        )
        if tip is not None:
            query = "heat the can. you see a can and a stove."
            self.add(
                RetrievalRequested(
                    episode=ep, worker="w0", turn=0, slot=SLOT, query=query, rule="diverse", k=1
                )
            )
            self.add(
                TipsRetrieved(
                    episode=ep,
                    worker="w0",
                    turn=0,
                    slot=SLOT,
                    tip_ids=(tip,),
                    similarities=(0.75,),
                    ranks=(0,),
                    tips=(TEXTS[tip],),
                    similar=1,
                    slot_size=2,
                    scores=(-0.25,),
                    calls=(call,),
                )
            )
        shown = (TEXTS[tip],) if tip is not None else ()
        self.add(
            ActionRequested(
                episode=ep,
                worker="w0",
                turn=0,
                messages=(("user", "heat the can."),),
                admissible=("look", "take can"),
                seed=index,
                tips=shown,
            )
        )
        self.add(
            ActionSampled(
                episode=ep,
                worker="w0",
                turn=0,
                policy_version=0,
                action="take can",
                prompt_ids=(1, 2),
                response_ids=(3,),
                token_logps=(-0.5,),
                logp=-0.5,
                temperature=1.0,
                prompt_cut=prompt_cut,
            )
        )
        if abandon:
            self.add(EpisodeAbandoned(episode=ep, worker="w0", reason="worker restarted (lost)"))
            return
        if abort:
            self.add(EpisodeAborted(episode=ep, worker="w0", reason=abort))
            return
        reward = 1.0 if success else 0.0
        self.add(
            StepTaken(
                episode=ep,
                turn=0,
                action="take can",
                observation="you take the can.",
                admissible=("look",),
                reward=reward,
                done=True,
                score=reward,
            )
        )
        self.add(
            EpisodeFinished(
                episode=ep,
                worker="w0",
                family="heat",
                variant=1,
                split="train",
                steps=1,
                score=reward,
                success=success,
                total_reward=reward,
            )
        )

    def extract(
        self, ep: str, success: bool, name: str, op: tuple[str, tuple[int, ...]], tip: int
    ) -> None:
        req = self.add(
            ExtractionRequested(
                episode=ep,
                worker="w0",
                slot=SLOT,
                entry=-1,
                messages=(("user", "what did you learn?"),),
                success=success,
                score=1.0 if success else 0.0,
                seed=0,
            ),
            corr=ep,
        )
        self._call(name, f"x{req}", "extract", ep, op, tip, req)

    def merge(self, name: str, entries: tuple[int, ...], tip: int) -> None:
        self.add(MergeDue(step=0))
        req = self.add(
            MergeRequested(
                step=0, slot=SLOT, entries=entries, messages=(("user", "merge"),), seed=0
            )
        )
        self._call(name, f"x{req}", "merge", "0", ("merge", entries), tip, req)

    def _call(
        self,
        name: str,
        call: str,
        task: str,
        source: str,
        op: tuple[str, tuple[int, ...]],
        tip: int,
        req: int,
    ) -> None:
        self.calls[name] = call
        text = TEXTS[tip]
        seq = self.add(
            ExtractorCalled(
                call=call,
                task=task,
                source=source,
                slot=SLOT,
                prompt_ids=(1,),
                response_ids=(2,),
                token_logps=(-1.0,),
                text=f"{op[0]}: {text}",
                temperature=1.0,
                extractor_version=0,
                ops=((op[0], op[1], text),),
            ),
            cause=req,
        )
        for parent in op[1]:
            self.add(TipEvicted(tip_id=parent, slot=SLOT, reason=op[0]), cause=seq)
        self.add(
            TipStored(
                tip_id=tip,
                slot=SLOT,
                episode=source,
                text=text,
                score=0.0,
                key=text,
                call=call,
                parents=op[1],
            ),
            cause=seq,
        )

    def reflect(self, ep: str, tip: int) -> None:
        req = self.add(
            ReflectionRequested(
                episode=ep,
                worker="w0",
                slot=SLOT,
                messages=(("user", "reflect"),),
                key="k",
                score=0.0,
                success=False,
                seed=0,
            )
        )
        prop = self.add(
            TipProposed(
                episode=ep,
                slot=SLOT,
                key="k",
                score=0.0,
                text=TEXTS[tip],
                prompt_ids=(1,),
                response_ids=(2,),
                token_logps=(-1.0,),
                temperature=0.0,
                policy_version=1,
            ),
            cause=req,
        )
        self.add(
            TipStored(tip_id=tip, slot=SLOT, episode=ep, text=TEXTS[tip], score=0.0, key="k"),
            cause=prop,
        )


GROUP_EPISODES = ("ep000", "ep001", "ep002", "ep003")
GROUP_ROLLOUTS = ("plain", "plain", "guided", "guided")
GROUP_REWARDS = (0.0, 1.0, 1.0, 0.0)
GROUP_ADVANTAGES = (-0.5, 0.5, 0.5, -0.5)


def golden_stream() -> Stream:
    """The run described in the module docstring, in log order."""
    s = Stream()
    s.episode("ep000", 0, success=False)
    s.extract("ep000", False, "xA", ("add", ()), 0)
    s.episode("ep001", 1, success=True)
    s.extract("ep001", True, "xB", ("add", ()), 1)
    s.merge("xM", (0, 1), 2)
    s.episode("ep002", 2, success=True, tip=2, call=s.calls["xM"])
    s.episode("ep003", 3, success=False, tip=2, call=s.calls["xM"])
    mean, std = group_stats(GROUP_REWARDS)
    s.add(
        AdvantagesComputed(
            group="g0",
            update=0,
            family="heat",
            variant=1,
            episodes=GROUP_EPISODES,
            rewards=GROUP_REWARDS,
            advantages=GROUP_ADVANTAGES,
            rule="subgroup-mean-weighted-success",
            eps=1e-6,
            mean=mean,
            std=std,
            rollouts=GROUP_ROLLOUTS,
        )
    )
    s.add(
        GradientRequested(
            update=0, episodes=GROUP_EPISODES, advantages=GROUP_ADVANTAGES, rollouts=GROUP_ROLLOUTS
        )
    )
    s.add(
        policy_updated(
            1,
            samples=4,
            loss=0.125,
            grad_norm=1.0,
            kl=0.01,
            digest="d1",
            checkpoint="checkpoints/v000001",
            seconds=0.5,
        )
    )
    s.episode("ep004", 4, success=False)
    s.reflect("ep004", 3)
    s.episode("ep005", 5, success=True)
    s.extract("ep005", True, "xC", ("update", (2,)), 4)
    s.episode("ep006", 6, success=True, tip=4, call=s.calls["xC"])  # -> the extractor request
    s.add(
        ExtractorUpdated(
            extractor_version=1,
            update=0,
            samples=2,
            loss=0.25,
            grad_norm=0.5,
            clip_frac=0.0,
            digest="e1",
            checkpoint="extractor/v000001",
            seconds=1.0,
        )
    )
    s.episode("ep007", 7, success=False, tip=3, call="")
    return s


def write_run(root: Path, envs: list[Envelope[Event]]) -> Path:
    """A run directory at ``root`` whose log holds ``envs``."""
    meta = new_run_meta(
        "golden", scenario_name="golden", seed=0, coevo_version="test", scenario_toml=TOML
    )
    log = LmdbEventLog.create(root / "log", meta, durable=False)
    try:
        log.append(envs)
    finally:
        log.close()
    return root
