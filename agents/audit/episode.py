"""``coevo audit RUN episode ID``: one episode turn by turn, from the log and its index.

Each turn: the observation the policy saw, the admissible actions, the entries retrieved and
shown, the action with its log-prob and the policy version that chose it, and what the world
answered. Then the rewards (outcome and intrinsic), the advantage every sample of the episode
received (:class:`AdvantagesComputed`), the policy update that used it (:class:`GradientRequested`,
:class:`PolicyUpdated`), and in Complementary RL the credit it gave the extractor call behind
its entry and the extractor update that consumed it, and the extractor call it fed.
"""

from __future__ import annotations

from typing import TypedDict

import msgspec

from agents.audit.index import (
    Stored,
    applied,
    consumer,
    fetch,
    last_attempt,
    refs,
    tip_rows,
    weighed,
)
from agents.events.episodes import (
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from agents.events.extractor import (
    CreditAssigned,
    ExtractorCalled,
)
from agents.events.memory import TipProposed, TipRejected, TipsRetrieved, TipStored
from agents.events.policy import (
    ActionRequested,
    ActionSampled,
    AdvantagesComputed,
    GradientRequested,
    PolicyUpdated,
)
from engine.errors import AuditQueryInvalid
from engine.eventlog import EventLog, last_envelope
from engine.events import Envelope, Event
from engine.lifecycle import RunFailed, RunStopped
from stores.fact_index import FactIndex


class Shown(msgspec.Struct, frozen=True, kw_only=True):
    """An entry retrieved at a turn: id, writer call, similarity rank, similarity, score."""

    tip: int
    call: str
    rank: int
    similarity: float
    score: float | None
    text: str
    stored_by: str = ""  # the actor that stored it, when no extractor call or reflection did


class Turn(msgspec.Struct, frozen=True, kw_only=True):
    """One turn: what the policy saw, what it chose, what the world answered. ``answered``
    False: the world did not answer the action (the episode's last turn: the world failed on
    it and the episode was aborted, or the episode is still running); reward and score are
    then 0 and ``seq`` is the action's."""

    turn: int
    observation: str
    admissible: tuple[str, ...]
    retrieved: tuple[Shown, ...] = ()
    tips_shown: int = 0
    action: str = ""
    logp: float | None = None
    policy_version: int = -1
    valid: bool = True
    reward: float = 0.0
    score: float = 0.0
    done: bool = False
    seq: int = -1
    answered: bool = True
    prompt_cut: int = 0
    """Tokens the prompt lost from its middle to fit the model (what it showed, the entries
    retrieved included, may have lost text there); 0: none."""
    searched: int = -1
    """The entries the memory slot held when this turn's retrieval searched it (-1: no
    retrieval at this turn): a retrieval that showed nothing says why."""


class Advantage(msgspec.Struct, frozen=True, kw_only=True):
    """The episode's reward and advantage in its group (every turn is a sample with it)."""

    seq: int
    group: str
    update: int
    rule: str
    rollout: str
    outcome: float
    intrinsic: float
    intrinsic_coef: float
    reward: float
    advantage: float
    group_rewards: tuple[float, ...]


class Update(msgspec.Struct, frozen=True, kw_only=True):
    """The policy update that trained on the episode's samples (``version`` -1: not yet)."""

    seq: int
    update: int
    advantage: float
    rollout: str
    version: int = -1
    samples: int = 0
    stale: int = 0
    loss: float = 0.0
    kl: float = 0.0
    digest: str = ""


class EpisodeCredit(msgspec.Struct, frozen=True, kw_only=True):
    """The credit the episode gave the call behind its entry, and the update that used it."""

    seq: int
    entry: int
    call: str
    credit: float
    rule: str
    update: int = -1
    reward: float | None = None
    advantage: float | None = None
    weight: float | None = None
    version: int = -1


class Written(msgspec.Struct, frozen=True, kw_only=True):
    """What the episode wrote into memory: the extractor call fed with it, or its reflection,
    with the entries stored and the writes refused."""

    kind: str
    seq: int
    call: str = ""
    text: str = ""
    ops: tuple[str, ...] = ()
    stored: tuple[int, ...] = ()
    refused: tuple[str, ...] = ()
    duplicate_of: tuple[int, ...] = ()  # each refused write's entry (-1: not a duplicate)


class EpisodeAudit(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the log says about one episode."""

    episode: str
    family: str
    variant: int
    purpose: str
    rollout: str
    worker: str
    goal: str
    turns: tuple[Turn, ...]
    ended: str
    success: bool
    score: float
    steps: int
    total_reward: float
    advantage: Advantage | None
    update: Update | None
    credit: EpisodeCredit | None
    written: tuple[Written, ...]
    abandoned: int = 0
    """Earlier attempts of the episode that were lost and run again (a resumed run, a restarted
    worker): the turns and outcome are its last attempt's alone."""
    run_end: str = ""
    """How the run's last session ended: "completed", "failed" or "stopped" ("": it is
    running, or was killed): an update not applied by then was never applied."""
    scope: str = ""
    """The memory the episode read and wrote (:class:`EpisodeAssigned`'s ``scope``)."""


def audit_episode(log: EventLog, index: FactIndex, episode: str) -> EpisodeAudit:
    """Episode ``episode`` turn by turn, with its rewards, advantage, update and credit.

    Raises:
        AuditQueryInvalid: the log holds no such episode.
    """
    found = refs(index, "e", episode)
    assigns = [seq for seq, kind in found if kind == "episode_assigned"]
    if not assigns:
        raise AuditQueryInvalid(f"no episode {episode!r} in this run (ids look like ep000005)")
    attempt, lost = last_attempt(found)
    events = fetch(log, [assigns[-1], *(seq for seq, _ in attempt)])
    envs = [events[seq] for seq, _ in attempt]
    assigned = events[assigns[-1]].event
    assert isinstance(assigned, EpisodeAssigned)
    started = next((e.event for e in envs if isinstance(e.event, EpisodeStarted)), None)
    turns = _stored_by(log, index, _turns(envs, started))
    ends = (e.event for e in envs if isinstance(e.event, EpisodeFinished | EpisodeAborted))
    fin = next(ends, None)
    return EpisodeAudit(
        episode=episode,
        family=assigned.family,
        variant=assigned.variant,
        purpose=assigned.purpose,
        scope=assigned.scope,
        rollout=assigned.rollout,
        worker=assigned.worker,
        goal=started.goal if started is not None else "",
        turns=turns,
        ended="finished" if isinstance(fin, EpisodeFinished) else fin.reason if fin else "running",
        success=isinstance(fin, EpisodeFinished) and fin.success,
        score=fin.score if isinstance(fin, EpisodeFinished) else 0.0,
        steps=fin.steps if isinstance(fin, EpisodeFinished) else sum(t.answered for t in turns),
        total_reward=fin.total_reward if isinstance(fin, EpisodeFinished) else 0.0,
        advantage=_advantage(envs, episode),
        update=_update(log, index, envs, episode),
        credit=_credit(log, index, envs, episode),
        written=_written(log, index, envs),
        abandoned=lost,
        run_end=run_end(log),
    )


def run_end(log: EventLog) -> str:
    """How the log's run ended, by its last event: "completed", "failed", "stopped" (a
    signal), or "" (it is being written, or its process was killed)."""
    last = last_envelope(log)
    ev = last.event if last is not None else None
    if isinstance(ev, RunFailed):
        return "failed"
    if isinstance(ev, RunStopped):
        return "completed" if ev.reason == "completed" else "stopped"
    return ""


def _stored_by(log: EventLog, index: FactIndex, turns: tuple[Turn, ...]) -> tuple[Turn, ...]:
    """``turns`` with each retrieved entry that no extractor call wrote named by the actor
    that stored it, unless a reflection wrote it (a method's own list: docs/METHODS.md)."""
    actors: dict[int, str] = {}
    for tip in {s.tip for t in turns for s in t.retrieved if not s.call}:
        stored = next(((seq, r) for seq, r in tip_rows(index, tip) if isinstance(r, Stored)), None)
        if stored is not None and not stored[1].call and not stored[1].episode:
            env = fetch(log, [stored[0]]).get(stored[0])
            actors[tip] = env.actor if env is not None else "?"
    if not actors:
        return turns
    return tuple(
        msgspec.structs.replace(
            t,
            retrieved=tuple(
                msgspec.structs.replace(s, stored_by=actors[s.tip]) if s.tip in actors else s
                for s in t.retrieved
            ),
        )
        for t in turns
    )


def _turns(envs: list[Envelope[Event]], started: EpisodeStarted | None) -> tuple[Turn, ...]:
    observation = started.observation if started else ""
    admissible = started.admissible if started else ()
    retrieved: dict[int, tuple[Shown, ...]] = {}
    searched: dict[int, int] = {}  # turn -> the slot's size when its retrieval searched it
    asked: dict[int, ActionRequested] = {}
    sampled: dict[int, tuple[ActionSampled, int]] = {}  # turn -> the sample and its seq
    turns: list[Turn] = []

    def turn(k: int, seq: int, smp: ActionSampled | None, step: StepTaken | None) -> Turn:
        """Turn ``k``: what the policy saw (the observation so far) and chose, and the
        world's answer (``step``; None: it never answered the action)."""
        req = asked.get(k)
        return Turn(
            turn=k,
            observation=observation,
            admissible=admissible,
            retrieved=retrieved.get(k, ()),
            searched=searched.get(k, -1),
            tips_shown=len(req.tips) if req else 0,
            action=step.action if step else smp.action if smp else "",
            logp=smp.logp if smp else None,
            policy_version=smp.policy_version if smp else -1,
            valid=smp.valid if smp else True,
            reward=step.reward if step else 0.0,
            score=step.score if step else 0.0,
            done=step.done if step else False,
            seq=seq,
            answered=step is not None,
            prompt_cut=smp.prompt_cut if smp else 0,
        )

    for env in envs:
        ev = env.event
        if isinstance(ev, TipsRetrieved):
            searched[ev.turn] = ev.slot_size
            retrieved[ev.turn] = tuple(
                Shown(tip=t, call=call, rank=rank, similarity=sim, score=score, text=text)
                for t, rank, sim, score, text, call in ev.entries()
            )
        elif isinstance(ev, ActionRequested):
            asked[ev.turn] = ev
        elif isinstance(ev, ActionSampled):
            sampled[ev.turn] = (ev, env.seq)
        elif isinstance(ev, StepTaken):
            smp = sampled[ev.turn][0] if ev.turn in sampled else None
            turns.append(turn(ev.turn, env.seq, smp, ev))
            observation, admissible = ev.observation, ev.admissible
    last = turns[-1].turn + 1 if turns else 0
    if last in sampled:  # chosen, and the world never answered it
        smp, seq = sampled[last]
        turns.append(turn(last, seq, smp, None))
    return tuple(turns)


def _advantage(envs: list[Envelope[Event]], episode: str) -> Advantage | None:
    env = next((e for e in envs if isinstance(e.event, AdvantagesComputed)), None)
    if env is None:
        return None
    g = env.event
    assert isinstance(g, AdvantagesComputed)
    i = g.episodes.index(episode)
    return Advantage(
        seq=env.seq,
        group=g.group,
        update=g.update,
        rule=g.rule,
        rollout=g.rollouts[i] if g.rollouts else "plain",
        outcome=g.outcomes[i] if g.outcomes else g.rewards[i],
        intrinsic=g.intrinsic[i] if g.intrinsic else 0.0,
        intrinsic_coef=g.intrinsic_coef,
        reward=g.rewards[i],
        advantage=g.advantages[i],
        group_rewards=g.rewards,
    )


def _update(
    log: EventLog, index: FactIndex, envs: list[Envelope[Event]], episode: str
) -> Update | None:
    env = next((e for e in envs if isinstance(e.event, GradientRequested)), None)
    if env is None:
        return None
    req = env.event
    assert isinstance(req, GradientRequested)
    i = req.episodes.index(episode)
    out = Update(
        seq=env.seq,
        update=req.update,
        advantage=req.advantages[i],
        rollout=req.rollouts[i] if req.rollouts else "plain",
    )
    done = [s for s, kind in refs(index, "u", str(req.update)) if kind == "policy_updated"]
    if not done:
        return out
    upd = fetch(log, done[:1])[done[0]].event
    assert isinstance(upd, PolicyUpdated)
    return msgspec.structs.replace(
        out,
        version=upd.policy_version,
        samples=upd.samples,
        stale=upd.stale,
        loss=upd.loss,
        kl=upd.kl,
        digest=upd.digest,
    )


def _credit(
    log: EventLog, index: FactIndex, envs: list[Envelope[Event]], episode: str
) -> EpisodeCredit | None:
    env = next((e for e in envs if isinstance(e.event, CreditAssigned)), None)
    if env is None:
        return None
    c = env.event
    assert isinstance(c, CreditAssigned)
    out = EpisodeCredit(seq=env.seq, entry=c.entry, call=c.call, credit=c.credit, rule=c.rule)
    seq = consumer(index, episode)
    line = next((w for s, w in weighed(index, c.call) if s == seq), None)
    if line is None:
        return out
    [done] = applied(index, [line.update])
    return msgspec.structs.replace(
        out,
        update=line.update,
        reward=line.reward,
        advantage=line.advantage,
        weight=line.weight,
        version=done.version if done is not None else -1,
    )


def _written(log: EventLog, index: FactIndex, envs: list[Envelope[Event]]) -> tuple[Written, ...]:
    out: list[Written] = []
    for env in envs:
        ev = env.event
        if isinstance(ev, ExtractorCalled):
            effects = fetch(log, [s for s, k in refs(index, "c", ev.call) if k.startswith("tip_")])
            out.append(
                Written(
                    kind="extractor",
                    seq=env.seq,
                    call=ev.call,
                    text=ev.text,
                    ops=tuple(f"{op} {list(ids)}" if ids else op for op, ids, _ in ev.ops),
                    **_effects(list(effects.values())),
                )
            )
        elif isinstance(ev, TipProposed):
            effects = [e for e in envs if isinstance(e.event, TipStored | TipRejected)]
            out.append(Written(kind="reflection", seq=env.seq, text=ev.text, **_effects(effects)))
    return tuple(out)


class _Effects(TypedDict):
    """The :class:`Written` fields of a write's outcome."""

    stored: tuple[int, ...]
    refused: tuple[str, ...]
    duplicate_of: tuple[int, ...]


def _effects(envs: list[Envelope[Event]]) -> _Effects:
    stored = tuple(e.event.tip_id for e in envs if isinstance(e.event, TipStored))
    rejected = [e.event for e in envs if isinstance(e.event, TipRejected)]
    refused = tuple(
        r.reason + (f" of {r.duplicate_of}" if r.duplicate_of >= 0 else "") for r in rejected
    )
    return {
        "stored": stored,
        "refused": refused,
        "duplicate_of": tuple(r.duplicate_of for r in rejected),
    }
