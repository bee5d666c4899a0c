"""Hypothesis strategies for well-formed event streams: episodes that are assigned, start, take
turns and end; evaluation rounds of held-out episodes that hold the policy's updates; requests
with their answers; memory entries with lineage, retrievals and credits; policy and extractor
updates with version chains; sessions stopped (or failed) and resumed.

A stream is drawn as a short program (a list of operations, each with a number that picks
which episode or entry it acts on) and played by :class:`StreamBuilder`, which emits what the
real actors would: advantages through the GRPO method's own ``score``, credits and extractor
requests through the credit actor's own fold (``CreditBook.decide``). So a stream shrinks
with its program, to the few operations a failure needs, and every stream holds every
invariant of :mod:`agents.invariants` (``credit`` under :data:`AUDIT`).

Needs Hypothesis (``pip install 'coevo[testing]'``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agents.acting.scheduler import RESUMED
from agents.audit.inputs import AuditSettings
from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from agents.events.extractor import CreditsDue, CreditsSettled
from agents.events.memory import RetrievalRequested
from agents.events.policy import (
    ActionRequested,
    ActionSampled,
    AdvantagesComputed,
    EvalRoundFinished,
    EvalRoundStarted,
    GradientRequested,
)
from agents.methods.advantages import group_stats
from agents.methods.base import ADV_EPS
from agents.methods.builtin import Grpo
from agents.methods.settings import GrpoConfig
from agents.testing.events import policy_updated
from agents.testing.stream_memory import CREDIT, MEMORIES, Episode, Memory, StreamMemory
from engine.events import Envelope, Event
from engine.lifecycle import RunFailed, RunResumed, RunStarted, RunStopped

try:
    from hypothesis import strategies as st
except ModuleNotFoundError:  # the optional extra: say how to get it, in one line
    raise ModuleNotFoundError(
        "coevo's strategies need Hypothesis: pip install 'coevo[testing]'"
    ) from None

__all__ = ["AUDIT", "CREDIT", "OPS", "Memory", "StreamBuilder", "runs"]

GRPO = GrpoConfig(reward="success", group_size=2)

AUDIT = AuditSettings(CREDIT, Grpo(GRPO), GRPO.reward)
"""What streams re-derive under (``agents.invariants.Credit.with_settings(AUDIT)``)."""
GROUPS_PER_UPDATE = 2
FAMILIES = ("heat", "unlock")

OPS = ("assign", "start", "turn", "finish", "abort", "merge", "evaluate", "stop")
"""The operations of a stream's program."""

_WEIGHTS = {
    "assign": 3,
    "start": 3,
    "turn": 6,
    "finish": 3,
    "abort": 1,
    "merge": 1,
    "evaluate": 1,
    "stop": 1,
}
"""How often each operation is drawn (turns most: an episode takes several)."""


@dataclass
class _Round:
    version: int
    episodes: int
    ended: int = 0
    successes: int = 0


@dataclass
class StreamBuilder(StreamMemory):
    """Plays operations into a well-formed stream (pure: no clock, no randomness of its own):
    the episodes, evaluation rounds, groups, updates and sessions here, what the memory and the
    extractor answer in :class:`~agents.testing.stream_memory.StreamMemory`.

    Attributes:
        memory: the stream's memory.
        credit: the credit actor's settings (:data:`CREDIT`: an extractor request per credit).
        envs: the stream so far (since the last :meth:`take`).
    """

    _running: dict[str, Episode] = field(default_factory=dict[str, Episode])
    _episodes: int = 0
    _finished: list[tuple[str, str, bool]] = field(default_factory=list[tuple[str, str, bool]])
    _groups: list[AdvantagesComputed] = field(default_factory=list[AdvantagesComputed])
    _rounds: dict[int, _Round] = field(default_factory=dict[int, _Round])
    _round: int = 0
    _held: list[list[AdvantagesComputed]] = field(
        default_factory=list[list[AdvantagesComputed]]
    )  # the groups of updates due while an evaluation round was open

    def play(self, op: str, pick: int) -> None:
        """One operation; ``pick`` chooses among the episodes or entries it can act on (an
        operation with nothing to act on does nothing)."""
        if op == "assign":
            self.assign()
            return
        if op == "merge":
            self.merge(pick)
            return
        if op == "evaluate":
            self.evaluate(pick)
            return
        if op == "stop":
            self.stop_and_resume(failed=pick % 4 == 3)
            return
        candidates = [
            ep for ep, e in self._running.items() if (op == "start") != e.started or op == "abort"
        ]
        if candidates:
            ep = candidates[pick % len(candidates)]
            getattr(self, op)(ep, pick)

    def begin(self) -> None:
        self.add(
            RunStarted(run_id="r", scenario="s", scenario_hash="h", seed=1, coevo_version="0"),
            actor="runtime",
        )

    def assign(self, index: int | None = None, episode: str = "", round: int = -1) -> str:
        """Assign a training episode, or one of evaluation round ``round`` (held out, plain,
        writing no memory)."""
        index = self._episodes if index is None else index
        episode = episode or f"ep{index:06d}"
        family = FAMILIES[index % len(FAMILIES)]
        train = round < 0
        rollout = {"none": "plain", "tips": "tips", "extractor": "guided"}[self.memory]
        self._episodes = max(self._episodes, index + 1)
        busy = {e.worker for e in self._running.values()}
        worker = next(w for k in range(len(busy) + 1) if (w := f"worker-{k}") not in busy)
        seq = self.add(
            EpisodeAssigned(
                episode=episode,
                index=index,
                worker=worker,
                family=family,
                variant=0 if train else 1,
                split="train" if train else "heldout",
                seed=index,
                purpose="train" if train else "eval",
                rollout=rollout if train else "plain",
                reflect=train and self.memory == "tips",
                extract=train and self.memory == "extractor",
            ),
            cause=self._handled,
            actor="trainer",
            corr=episode,
        )
        self._running[episode] = Episode(family, index, worker, seq, round=round, last=seq)
        return episode

    def evaluate(self, pick: int = 0) -> None:
        """An evaluation round (the trainer's): one held-out episode (two when ``pick`` > 5) at the
        policy's version, assigned now and played by the other operations; the policy's
        updates wait until every open round has ended (``holds_updates``)."""
        number, self._round = self._round, self._round + 1
        r = self._rounds[number] = _Round(self._policy, 1 + (pick > 5))
        self.add(
            EvalRoundStarted(
                round=number, policy_version=r.version, episodes=r.episodes, holds_updates=True
            ),
            cause=self._handled,
            actor="trainer",
        )
        for _ in range(r.episodes):
            self.assign(round=number)

    def _round_ended(self, e: Episode, success: bool) -> None:
        """An evaluation episode ended (an aborted one a failure); its round's end once it was
        the last, and the updates held meanwhile once no round is open."""
        r = self._rounds[e.round]
        r.ended += 1
        r.successes += success
        if r.ended < r.episodes:
            return
        del self._rounds[e.round]
        self.add(
            EvalRoundFinished(
                round=e.round,
                policy_version=r.version,
                episodes=r.episodes,
                success=r.successes / r.episodes,
                score=r.successes / r.episodes,
                train_episodes=self._policy * GRPO.group_size * GROUPS_PER_UPDATE,
            ),
            cause=self._handled,
            actor="trainer",
        )
        while self._held and not self._rounds:
            self._update(self._held.pop(0))

    def start(self, episode: str, pick: int = 0) -> None:
        """The worker starts the episode and asks for its first action (its memory first, when
        the episode is shown some)."""
        e = self._running[episode]
        worker = e.worker
        ev = EpisodeStarted(
            episode=episode, worker=worker, goal="g", observation="o", admissible=("a", "b")
        )
        self.add(ev, cause=e.assigned, actor=worker, corr=episode)
        e.started = True
        self._ask(episode, e, e.assigned)

    def turn(self, episode: str, pick: int = 0) -> None:
        """The answer to the episode's open request: its memory's tips (then its action is
        asked for), or its action, whose step it takes and asks for the next. Other episodes'
        events come between a request and its answer, as the inference actor batches them."""
        e = self._running[episode]
        if not e.started:  # (called directly: ``play`` turns started episodes only)
            self.start(episode)
        if e.waiting == "tips":
            self._ask_action(episode, e, self._tips(episode, e, pick))
            return
        sampled = self._act(episode, e, pick, done=False, success=False)
        self._ask(episode, e, sampled)

    def _ask(self, episode: str, e: Episode, cause: int) -> None:
        """The worker, handling ``cause``, asks for the next turn's tips (a training episode
        with memory: every turn with tips, the first turn with an extractor's bank) or its
        action."""
        worker, slot = e.worker, f"train/{e.family}"
        shown = self.memory == "tips" or (self.memory == "extractor" and e.turns == 0)
        if shown and e.round < 0:  # (evaluation episodes play without memory)
            diverse = self.memory == "extractor"
            e.waiting, e.asked = (
                "tips",
                self.add(
                    RetrievalRequested(
                        episode=episode,
                        worker=worker,
                        turn=e.turns,
                        slot=slot,
                        query="o",
                        rule="diverse" if diverse else "threshold",
                        k=1 if diverse else 0,
                    ),
                    cause=cause,
                    actor=worker,
                    corr=episode,
                ),
            )
            return
        self._ask_action(episode, e, cause)

    def _act(self, episode: str, e: Episode, pick: int, done: bool, success: bool) -> int:
        """The inference actor's answer to the open action request, and the step the worker
        takes with it (the last, when ``done``: its reward and score the episode's outcome);
        returns the answer's seq."""
        worker = e.worker
        action = ("a", "b")[pick % 2]
        sampled = self.add(
            ActionSampled(
                episode=episode,
                worker=worker,
                turn=e.turns,
                policy_version=self._policy,
                action=action,
                prompt_ids=(1, 2),
                response_ids=(3,),
                token_logps=(-0.5,),
                logp=-0.5,
                temperature=1.0,
            ),
            cause=e.asked,
            actor="inference",
            corr=episode,
        )
        outcome = 1.0 if success else 0.0
        step = StepTaken(
            episode=episode,
            turn=e.turns,
            action=action,
            observation="o",
            admissible=("a", "b"),
            reward=outcome if done else 0.0,
            done=done,
            score=outcome if done else 0.0,
        )
        self.add(step, cause=sampled, actor=worker, corr=episode)
        e.turns += 1
        e.waiting, e.asked, e.last = "", -1, sampled
        return sampled

    def _ask_action(self, episode: str, e: Episode, cause: int) -> None:
        worker = e.worker
        e.waiting, e.asked = (
            "action",
            self.add(
                ActionRequested(
                    episode=episode,
                    worker=worker,
                    turn=e.turns,
                    messages=(("user", "o"),),
                    admissible=("a", "b"),
                    seed=e.turns,
                ),
                cause=cause,
                actor=worker,
                corr=episode,
            ),
        )

    def finish(self, episode: str, pick: int = 0) -> None:
        """The episode's last turn (its tips first, when it waits on them) and its end,
        succeeded or failed as ``pick`` says; then what the trainer does with it."""
        e = self._running[episode]
        worker, success, train = e.worker, pick % 2 == 0, e.round < 0
        if not e.started:  # (called directly: ``play`` finishes started episodes only)
            self.start(episode)
        if e.waiting == "tips":
            self._ask_action(episode, e, self._tips(episode, e, pick))
        sampled = self._act(episode, e, pick, done=True, success=success)
        del self._running[episode]
        outcome = 1.0 if success else 0.0
        self._handled = self.add(
            EpisodeFinished(
                episode=episode,
                worker=worker,
                family=e.family,
                variant=0 if train else 1,
                split="train" if train else "heldout",
                steps=e.turns,
                score=outcome,
                success=success,
                total_reward=outcome,
                purpose="train" if train else "eval",
            ),
            cause=sampled,
            actor=worker,
            corr=episode,
        )
        if not train:
            self._round_ended(e, success)
            return
        if self.memory == "tips":
            self._reflect(episode, e, worker, success, pick, sampled)
        elif self.memory == "extractor":
            self._extract(episode, e, worker, success, pick, sampled)
        self._finished.append((episode, e.family, success))
        self._group()

    def abort(self, episode: str, pick: int = 0) -> None:
        e = self._running.pop(episode)
        worker, purpose = e.worker, "train" if e.round < 0 else "eval"
        self._handled = self.add(  # (an open request of its stays unanswered, as in a run)
            EpisodeAborted(episode=episode, worker=worker, reason="boom", purpose=purpose),
            cause=e.last,
            actor=worker,
            corr=episode,
        )
        if e.round >= 0:
            self._round_ended(e, False)

    def _group(self) -> None:
        """A group of the method's size finished: its advantages (GRPO's own ``score``), and
        an update every :data:`GROUPS_PER_UPDATE` groups."""
        if len(self._finished) < GRPO.group_size:
            return
        members, self._finished = (
            self._finished[: GRPO.group_size],
            self._finished[GRPO.group_size :],
        )
        outcomes = [1.0 if ok else 0.0 for _, _, ok in members]
        scored = Grpo(GRPO).score(outcomes, ["plain"] * len(outcomes), [[] for _ in outcomes])
        mean, std = group_stats(scored.rewards)
        group = AdvantagesComputed(
            group=f"g{len(self._groups)}",
            update=len(self._groups) // GROUPS_PER_UPDATE,  # (of the updates held too)
            family=members[0][1],
            variant=0,
            episodes=tuple(ep for ep, _, _ in members),
            rewards=scored.rewards,
            advantages=scored.advantages,
            rule=scored.rule,
            eps=ADV_EPS,
            mean=mean,
            std=std,
        )
        self.add(group, cause=self._handled, actor="trainer")
        self._groups.append(group)
        if len(self._groups) % GROUPS_PER_UPDATE == 0:
            groups = self._groups[-GROUPS_PER_UPDATE:]
            if self._rounds:  # an open evaluation round holds it
                self._held.append(groups)
            else:
                self._update(groups)

    def _update(self, groups: Sequence[AdvantagesComputed]) -> None:
        update = self._policy
        asked = self.add(
            GradientRequested(
                update=update,
                episodes=tuple(ep for g in groups for ep in g.episodes),
                advantages=tuple(a for g in groups for a in g.advantages),
            ),
            cause=self._handled,
            actor="trainer",
        )
        self._policy += 1
        self._handled = self.add(  # (the trainer's next assignments follow the update)
            policy_updated(
                self._policy,
                update=update,
                samples=4,
                digest=f"p{self._policy}",
                checkpoint="",
                parent_digest=f"p{update}",
            ),
            cause=asked,
            actor="learner",
        )

    def stop_and_resume(self, failed: bool = False) -> None:
        """The session stops (``failed``: fails, as an actor past its restarts ends it); the
        next resumes, abandons the attempts left running and assigns them again (same ids,
        indexes and rounds)."""
        end = (
            RunFailed(error_type="ActorCrashed", message="boom", actor="worker-0")
            if failed
            else RunStopped(reason="signal")
        )
        stopped = self.add(end, actor="runtime")
        previous = "run_failed" if failed else "run_stopped"
        self.add(RunResumed(after=stopped, previous=previous), actor="runtime")
        running, self._running = self._running, {}
        for episode, e in running.items():
            worker, purpose = e.worker, "train" if e.round < 0 else "eval"
            self.add(
                EpisodeAbandoned(episode=episode, worker=worker, purpose=purpose, reason=RESUMED),
                actor="trainer",
                corr=episode,
            )
        self._handled = None
        for episode, e in running.items():
            self.assign(e.index, episode, e.round)

    def complete(self) -> None:
        """End every episode still running (abort those not started) and the run; with the
        extractor, the trainer first asks the credit actor to settle, and it answers."""
        for episode, e in list(self._running.items()):
            if e.started:
                self.finish(episode)
            else:
                self.abort(episode)
        if self.memory == "extractor":
            due = self.add(
                CreditsDue(policy_version=self._policy), cause=self._handled, actor="trainer"
            )
            self.add(CreditsSettled(updates=self._credit.updates), cause=due, actor="credit")
        self.add(RunStopped(reason="completed"), actor="runtime")


def runs(
    *,
    memory: Memory | None = None,
    max_ops: int = 60,
    ops: Sequence[str] = OPS,
    completed: bool | None = None,
) -> st.SearchStrategy[list[Envelope[Event]]]:
    """A well-formed run's stream: ``run_started``, then a drawn program of operations
    (:data:`OPS`), then, if ``completed`` (drawn when None), every episode ended and
    ``run_stopped(completed)``.

    Args:
        memory: the stream's memory (drawn when None).
        max_ops: the longest program.
        ops: the operations to draw from (leave out "stop" for one session, "abort" for
            episodes that all finish, "evaluate" for training episodes only).
        completed: whether the stream ends with the run's completion.

    Raises:
        ValueError: a memory or an operation there is not (a misspelt one was never drawn),
            ``max_ops`` not a non-negative integer, or ``completed`` not a bool or None.
    """
    if isinstance(max_ops, bool) or not isinstance(max_ops, int) or max_ops < 0:
        raise ValueError(f"runs(max_ops={max_ops!r}): the longest program, an integer >= 0")
    if completed is not None and not isinstance(completed, bool):  # "yes" read as true
        raise ValueError(f"runs(completed={completed!r}): True, False, or None (drawn)")
    if memory is not None and memory not in MEMORIES:
        raise ValueError(f"runs(memory={memory!r}): one of {', '.join(MEMORIES)}, or None")
    unknown = [] if isinstance(ops, str) else [op for op in ops if op not in OPS]
    if isinstance(ops, str) or unknown or not ops:
        raise ValueError(
            f"runs(ops={ops!r}): a sequence of operations of {', '.join(OPS)}"
            + (f" ({', '.join(map(repr, unknown))}: no such operation)" if unknown else "")
        )
    return _runs(memory, max_ops, tuple(ops), completed)


@st.composite
def _runs(
    draw: st.DrawFn,
    memory: Memory | None,
    max_ops: int,
    ops: tuple[str, ...],
    completed: bool | None,
) -> list[Envelope[Event]]:
    builder = StreamBuilder(memory=memory or draw(st.sampled_from(MEMORIES)))
    builder.begin()
    size = draw(st.integers(0, max_ops))  # drawn first: lists alone stay short
    step = st.tuples(st.sampled_from(_weighted(ops)), st.integers(0, 7))
    program = draw(st.lists(step, min_size=size, max_size=size))
    for op, pick in program:
        builder.play(op, pick)
    if completed if completed is not None else draw(st.booleans()):
        builder.complete()
    return builder.envs


def _weighted(ops: Sequence[str]) -> tuple[str, ...]:
    return tuple(op for op in ops for _ in range(_WEIGHTS.get(op, 1)))
