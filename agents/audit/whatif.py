"""What-if replay of one episode (``coevo audit RUN whatif EPISODE``): the episode played again
from its recorded seeds, once unchanged (which must give back the logged trajectory: the control)
and once with one change: an entry removed from what the policy was shown, another entry shown
in its place, or another policy version acting. The two trajectories and outcomes side by side
are the causal effect of that one change on that episode, next to the credit the entry got.

What is replayed: the world is reset with the episode's seed; each turn's prompt is rendered as
the env worker rendered it (:func:`agents.models.prompts.turn_messages`, the run's prompt
settings) with the entries the log shows at that turn (``ActionRequested.tips``; a turn past
the recorded ones shows the last recorded turn's); the action is drawn with the turn's seed
(``derive_seed(episode seed, "act", turn)``, as the worker derives it), greedy where the log's
request was, by the policy version that acted at that turn (past the recorded turns: the last);
an episode ends where the world ends it or at the run's ``[world] max_turns``, as the worker
ends it. The world is called behind the env worker's guards
(:class:`agents.acting.world_calls.GuardedWorld`: checked answers, ``[world] step_timeout``).
Exact for a deterministic world (the built-in one) on the device the run used: the control
checks it. A world with hidden randomness of its own, or retrievals that depend on the state
(EMPO2's per-turn tips), make the changed replay one sample, not the answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from agents.acting.inference import PolicyRunner
from agents.acting.world_calls import UNLIMITED_CAP, GuardedWorld
from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from agents.events.extractor import CreditAssigned
from agents.events.memory import TipsRetrieved
from agents.events.policy import ActionRequested, ActionSampled
from agents.models.prompts import MemoryPlace, Step, to_pairs, turn_messages
from engine.errors import AuditQueryInvalid
from engine.events import Envelope, Event
from engine.seeds import derive_seed
from engine.world import Task

__all__ = ["Change", "Played", "Recorded", "WhatIf", "check", "recorded", "replay", "what_if"]

LOGP_TOLERANCE = 1e-4
"""How far a replayed log-prob may be from the logged one for the control to count as
reproducing the log, its action being the same: the run scored each request packed with
others in a batch, the replay alone, and the two round float32 sums differently (candidate
scores measured up to 8.1e-6 apart, docs/BENCHMARKS.md; 1e-6 failed EMPO2 replays at 2e-6)."""


class PlayedTurn(msgspec.Struct, frozen=True, kw_only=True):
    """One turn: what the policy saw and chose, and what the world answered."""

    turn: int
    observation: str
    tips: tuple[str, ...]
    action: str
    logp: float
    version: int
    reward: float
    score: float


class Played(msgspec.Struct, frozen=True, kw_only=True):
    """A trajectory and its outcome."""

    turns: tuple[PlayedTurn, ...]
    success: bool
    score: float
    steps: int


@dataclass(frozen=True)
class Recorded:
    """What the log says of the episode, as the replay needs it."""

    episode: str
    task: Task
    seed: int
    purpose: str
    requests: tuple[ActionRequested, ...]
    sampled: tuple[ActionSampled, ...]
    played: Played
    shown: dict[int, str]  # entry id -> its text, for every entry the episode was shown
    credits: tuple[CreditAssigned, ...]


@dataclass(frozen=True)
class Change:
    """The one change: ``without`` an entry, ``instead`` (entry id, text) shown in its place
    (or alone), or another policy ``version``."""

    without: int | None = None
    instead: tuple[int, str] | None = None
    version: int | None = None

    def __post_init__(self) -> None:
        if (self.without is None and self.instead is None) == (self.version is None):
            raise ValueError("a what-if changes one thing: an entry, or the policy version")

    def describe(self) -> str:
        """The change in words."""
        if self.version is not None:
            return f"policy version {self.version}"
        if self.instead is not None and self.without is not None:
            return f"entry {self.instead[0]} instead of entry {self.without}"
        if self.instead is not None:
            return f"entry {self.instead[0]} shown"
        return f"without entry {self.without}"


@dataclass(frozen=True)
class Prompting:
    """How the run rendered prompts (its ``[policy]`` and ``[prompt]`` settings)."""

    window: int
    list_actions: bool
    system: str
    memory: MemoryPlace


class WhatIf(msgspec.Struct, frozen=True, kw_only=True):
    """The answer: the log's trajectory, the unchanged replay's (the control) and the changed
    one's; ``reproduced`` says whether the control gave back every logged action (and log-prob
    within :data:`LOGP_TOLERANCE`), and ``strayed`` where and how it did not ("" when it did);
    ``credit`` is what the changed entry was credited for this episode (None: no credit);
    ``logged_machine`` the machine the log says wrote it ("" when it does not say) and
    ``machine`` the one replaying (:func:`engine.eventlog.machine_description`; both set by the
    caller that read the log's metadata, for a control that strays)."""

    episode: str
    change: str
    logged: Played
    control: Played
    changed: Played
    reproduced: bool
    first_difference: int | None
    credit: float | None
    credit_rule: str = ""
    strayed: str = ""
    logged_machine: str = ""
    machine: str = ""
    note: str = ""
    """What the change is not (an entry shown that the bank stored only after the episode
    ended: no retrieval could have shown it then); "" for none."""
    overrides: tuple[str, ...] = ()
    """The ``--set key.path=value`` the replay ran under (for what differs on this machine;
    one that changes how the run acts makes the control stray)."""


def recorded(episode: str, envs: Sequence[Envelope[Event]]) -> Recorded:
    """The episode's facts from its events (the audit index's refs of it, in seq order): those
    of its last attempt, after its last :class:`EpisodeAbandoned` (a resumed run, a restarted
    worker: what the lost attempts played is not what the episode's outcome came from).

    Raises:
        AuditQueryInvalid: no such episode, it did not finish, or no policy acted in it.
    """
    assigned = [env.event for env in envs if isinstance(env.event, EpisodeAssigned)]
    if not assigned:
        raise AuditQueryInvalid(f"no episode {episode!r} in this run (ids look like ep000005)")
    job = assigned[-1]
    cut = max(
        (i for i, env in enumerate(envs) if isinstance(env.event, EpisodeAbandoned)), default=-1
    )
    events = [env.event for env in envs[cut + 1 :]]
    fin = next((e for e in events if isinstance(e, EpisodeFinished)), None)
    requests = tuple(e for e in events if isinstance(e, ActionRequested))
    sampled = tuple(e for e in events if isinstance(e, ActionSampled))
    if fin is None:
        raise AuditQueryInvalid(f"episode {episode} did not finish: nothing to compare with")
    if not requests or len(requests) != len(sampled):
        raise AuditQueryInvalid(f"episode {episode} was not played by the policy (no actions)")
    shown: dict[int, str] = {}
    for e in events:
        if isinstance(e, TipsRetrieved):
            shown.update(zip(e.tip_ids, e.tips, strict=False))
    started = next((e for e in events if isinstance(e, EpisodeStarted)), None)
    steps = {e.turn: e for e in events if isinstance(e, StepTaken)}
    seen = [started.observation if started else ""]
    seen += [steps[t].observation if t in steps else "" for t in range(len(requests))]
    turns = tuple(
        PlayedTurn(
            turn=r.turn,
            observation=seen[r.turn] if r.turn < len(seen) else "",
            tips=r.tips,
            action=s.action,
            logp=s.logp,
            version=s.policy_version,
            reward=steps[r.turn].reward if r.turn in steps else 0.0,
            score=steps[r.turn].score if r.turn in steps else 0.0,
        )
        for r, s in zip(requests, sampled, strict=True)
    )
    played = Played(turns=turns, success=fin.success, score=fin.score, steps=fin.steps)
    credits = tuple(e for e in events if isinstance(e, CreditAssigned))
    return Recorded(
        episode=episode,
        task=Task(family=job.family, variant=job.variant, split=job.split),
        seed=job.seed,
        purpose=job.purpose,
        requests=requests,
        sampled=sampled,
        played=played,
        shown=shown,
        credits=credits,
    )


def replay(
    rec: Recorded,
    world: GuardedWorld,
    runner_for: Callable[[int], PolicyRunner],
    prompting: Prompting,
    change: Change | None = None,
    *,
    max_turns: int,
) -> Played:
    """Play the episode again (see the module's docstring), with ``change`` (None: unchanged),
    for at most ``max_turns`` turns (the run's ``[world] max_turns``, as its env worker stops a
    truncated episode; 0, a run without a limit:
    :data:`~agents.acting.world_calls.UNLIMITED_CAP`, so that a changed replay in a world that
    never ends an episode ends all the same).

    Raises:
        AuditQueryInvalid: the change names an entry the episode was not shown.
        WorldFailed: the world raised, hung or answered wrongly.
    """
    if change is not None:
        check(rec, change)
    obs = world.reset(rec.task, rec.seed)
    goal = obs.goal
    history: list[Step] = []
    turns: list[PlayedTurn] = []
    cap = max_turns or UNLIMITED_CAP
    while not obs.done and len(turns) < cap:
        k = len(turns)
        logged = rec.requests[min(k, len(rec.requests) - 1)]
        version = rec.sampled[min(k, len(rec.sampled) - 1)].policy_version
        tips = _tips(logged.tips, rec.shown, change)
        if change is not None and change.version is not None:
            version = change.version
        messages = turn_messages(
            goal,
            history,
            obs.text,
            admissible=obs.admissible if prompting.list_actions else None,
            tips=tips,
            window=prompting.window,
            system=prompting.system,
            memory=prompting.memory,
        )
        request = ActionRequested(
            episode=rec.episode,
            worker="whatif",
            turn=k,
            messages=to_pairs(messages),
            admissible=obs.admissible,
            seed=derive_seed(rec.seed, "act", k),
            greedy=logged.greedy,
            tips=tips,
        )
        (answer,) = runner_for(version).answer([request])
        seen = obs.text
        obs = world.step(answer.action)
        history.append((answer.action, obs.text))
        turns.append(
            PlayedTurn(
                turn=k,
                observation=seen,
                tips=tips,
                action=answer.action,
                logp=answer.logp,
                version=version,
                reward=obs.reward,
                score=obs.score,
            )
        )
    return Played(turns=tuple(turns), success=obs.success, score=obs.score, steps=len(turns))


def check(rec: Recorded, change: Change) -> None:
    """Refuse a change that names an entry the episode was not shown, or that changes nothing:
    an entry shown instead of itself, or shown though the episode was shown it already, or
    the policy version that played every turn.

    Raises:
        AuditQueryInvalid: it does.
    """
    if change.instead is not None:
        tip = change.instead[0]
        if tip == change.without:
            raise AuditQueryInvalid(f"entry {tip} instead of entry {tip} changes nothing")
        if tip in rec.shown:
            raise AuditQueryInvalid(
                f"episode {rec.episode} was shown entry {tip} already: showing it again adds a "
                f"duplicate, not the entry (--without-tip {tip} asks what it did)"
            )
    played = {s.policy_version for s in rec.sampled}
    if change.version is not None and played == {change.version}:
        raise AuditQueryInvalid(
            f"episode {rec.episode} was played by policy version {change.version} at every "
            f"turn: --version {change.version} replays it unchanged (another version asks "
            "what it did)"
        )
    if change.without is not None and change.without not in rec.shown:
        shown = ", ".join(map(str, sorted(rec.shown))) or "none"
        raise AuditQueryInvalid(
            f"episode {rec.episode} was not shown entry {change.without} (it was shown: {shown})"
        )


def what_if(rec: Recorded, control: Played, changed: Played, change: Change) -> WhatIf:
    """Compare the log's trajectory with the control and the changed replay."""
    logged = rec.played
    strayed = _strayed(logged, control)
    first = next(
        (
            i
            for i, (a, b) in enumerate(zip(control.turns, changed.turns, strict=False))
            if a.action != b.action
        ),
        None
        if len(control.turns) == len(changed.turns)
        else min(len(control.turns), len(changed.turns)),
    )
    entry = change.without if change.without is not None else None
    credits = [c for c in rec.credits if entry is not None and c.entry == entry]
    return WhatIf(
        episode=rec.episode,
        change=change.describe(),
        logged=logged,
        control=control,
        changed=changed,
        reproduced=not strayed,
        first_difference=first,
        credit=math.fsum(c.credit for c in credits) if credits else None,
        credit_rule=credits[0].rule if credits else "",
        strayed=strayed,
    )


def _strayed(logged: Played, control: Played) -> str:
    """Where and how the control left the log: its first turn whose action differs, or whose
    log-prob does beyond :data:`LOGP_TOLERANCE`, or its length; "" where it gave the log
    back."""
    for k, (a, b) in enumerate(zip(logged.turns, control.turns, strict=False)):
        if a.action != b.action:
            return f"at turn {k}, {b.action!r} where the log has {a.action!r}"
        if not math.isclose(a.logp, b.logp, abs_tol=LOGP_TOLERANCE):
            return (
                f"at turn {k}, the same action with log-prob {b.logp:.6f} where the log has "
                f"{a.logp:.6f}"
            )
    if len(control.turns) == len(logged.turns):
        return ""
    return f"the replay played {len(control.turns)} turns, the log {len(logged.turns)}"


def _tips(logged: tuple[str, ...], shown: dict[int, str], change: Change | None) -> tuple[str, ...]:
    if change is None or change.version is not None:
        return logged
    tips = list(logged)
    if change.without is not None:
        text = shown[change.without]
        tips = [t for t in tips if t != text]
    if change.instead is not None:
        tips = [change.instead[1], *tips]
    return tuple(tips)
