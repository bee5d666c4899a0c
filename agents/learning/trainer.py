"""The GRPO trainer: the driver of a learning run.

It plans groups of K rollouts of one task, keeps every env worker busy, computes each group's
advantages when its last episode ends (:class:`AdvantagesComputed`), asks the learner for an
update once every group planned for it has ended (:class:`GradientRequested`), runs evaluation
rounds on held-out variants, and returns (ending the run) after the last update's evaluation.

Batching is by plan, never by completion order: group ``g`` belongs to step
``g // groups_per_update`` (its rollout mode, its warm-up or not, were drawn for that step), and
feeds that step's update whenever it ends. A step whose groups have all ended waits for the steps
before it, so requests go out in step order. Staleness: step ``s`` (after the warm-up) is update
``s - warmup``, which produces version ``s - warmup + 1``. A group starts only once the policy is
at least at version ``s - warmup - max_staleness``, so no sample is older than the bound allows.

What each episode is (task, seed) is a pure function of the run seed and its index, so it never
depends on which worker ran it or when.

What differs between methods is asked of the run's :class:`agents.methods.base.Method`: each
training episode's rollout mode and job, a group's rewards and advantages, events due at a step's
end, the update's loss flags, warm-up steps and a memory evaluation round. The trainer never asks
which method runs. The evaluation rounds (with a memory, the adaptation test too) are
:class:`agents.learning.rounds.EvalRounds`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from agents.acting.scheduler import abandon_running, episode_id, plan_episode, rerun_lost
from agents.events.episodes import (
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
)
from agents.events.extractor import (
    CreditsDue,
    CreditsSettled,
    ExtractionRequested,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
    MergeDue,
    MergePlanned,
    MergeRequested,
    Subject,
    subject_of,
)
from agents.events.memory import (
    RetrievalRequested,
    TipEvicted,
    TipRejected,
    TipsRetrieved,
    TipStored,
)
from agents.events.policy import (
    SCORING,
    AdvantagesComputed,
    EvalRoundStarted,
    GradientRequested,
    PolicyUpdated,
)
from agents.learning.rounds import EvalRounds
from agents.methods.advantages import group_stats, outcome
from agents.methods.base import (
    ADV_EPS,
    Method,
    called,
    check_mode,
    checked_attributes,
    checked_job,
    checked_loss,
    checked_scored,
    checked_step_events,
    method_label,
    mode_of,
)
from agents.methods.builtin import Grpo
from agents.methods.settings import Empo2Config, EvalConfig, GrpoConfig
from engine.actor import Context
from engine.events import Envelope, Event
from engine.lifecycle import ActorRestarted
from engine.recovery import Emitted, Replayed
from engine.seeds import derive_seed
from engine.world import Task

__all__ = ["ADV_EPS", "GrpoTrainer", "gradient_request"]


@dataclass
class _Group:
    index: int  # g: the group feeds step g // groups_per_update
    task: Task
    episodes: list[str]
    rollouts: list[str]
    outcomes: dict[str, float] = field(default_factory=dict[str, float])
    ended: int = 0


@dataclass(frozen=True)
class _Batch:
    """What an ended group gives its step's update."""

    episodes: tuple[str, ...]
    advantages: tuple[float, ...]
    rollouts: tuple[str, ...]


def gradient_request(
    grpo: GrpoConfig,
    update: int,
    episodes: Sequence[str],
    advantages: Sequence[float],
    rollouts: Sequence[str] = (),
    empo2: Empo2Config | None = None,
) -> GradientRequested:
    """The request for update ``update`` with the scenario's loss settings."""
    return GradientRequested(
        update=update,
        episodes=tuple(episodes),
        advantages=tuple(advantages),
        rollouts=tuple(rollouts),
        low_prob_delta=empo2.low_prob_delta if empo2 and empo2.low_prob_mask else None,
        epochs=grpo.epochs,
        minibatch=grpo.minibatch,
        lr=grpo.lr,
        clip_low=grpo.clip_low,
        clip_high=grpo.clip_high,
        dual_clip=grpo.dual_clip or None,
        kl_coef=grpo.kl_coef,
        aggregation=grpo.aggregation,
        max_grad_norm=grpo.max_grad_norm,
        max_staleness=grpo.max_staleness,
        tis_cap=grpo.tis_cap or None,
        skip_zero_advantage=grpo.skip_zero_advantage,
        scoring=SCORING,
    )


_EXTRACTOR_EVENTS = (
    ExtractionRequested,
    MergeRequested,
    MergePlanned,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
    CreditsSettled,
)
"""The extractor's requests and answers, the memory's plans of merge passes and the credit
actor's settlement: the trainer only counts them."""

_MEMORY_ANSWERS = (TipStored, TipRejected, TipsRetrieved, TipEvicted, MergeRequested, MergePlanned)
"""What a memory actor emits, each caused by the message it answers."""


class GrpoTrainer(Replayed):
    """Plans, feeds and trains a learning run of any :class:`Method` (GRPO by default).

    Args:
        tasks: training tasks.
        heldout: evaluation tasks.
        episodes: training episodes (whole updates of ``groups_per_update * group_size``).
        workers: env worker names.
        grpo: the GRPO settings.
        evaluation: the evaluation settings.
        method: the learning method (None: :class:`agents.methods.builtin.Grpo`).
    """

    subscribes = (
        EpisodeStarted,
        EpisodeFinished,
        EpisodeAborted,
        PolicyUpdated,
        TipsRetrieved,
        TipStored,
        TipRejected,
        ActorRestarted,
        *_EXTRACTOR_EVENTS,
    )

    def __init__(
        self,
        tasks: Sequence[Task],
        heldout: Sequence[Task],
        episodes: int,
        workers: Sequence[str],
        grpo: GrpoConfig,
        evaluation: EvalConfig,
        method: Method | None = None,
    ) -> None:
        method = method or Grpo(grpo)
        per_update = grpo.group_size * grpo.groups_per_update
        warmup = checked_attributes(method)
        if episodes < per_update * (warmup + 1):
            steps = f"{warmup} warm-up steps and one update" if warmup else "one update"
            raise ValueError(
                f"run.episodes = {episodes} is less than {steps} "
                f"(group_size * groups_per_update = {per_update} episodes each)"
            )
        if not tasks or not workers:
            raise ValueError("the trainer needs tasks and workers")
        if evaluation.adapt_attempts and not method.adapts:
            raise ValueError("eval.adapt_attempts needs a memory: run.method = 'empo2'")
        self._tasks = tuple(tasks)
        self._steps = episodes // per_update
        self._warmup = warmup
        self._memory = True  # until run() knows whether an actor answers retrievals
        self._updates = self._steps - warmup
        self._method = method
        self._workers = tuple(workers)
        self._grpo = grpo
        self._eval = evaluation
        self._rounds = EvalRounds(heldout, evaluation, method, self._updates, self._job)
        # run state (set up in run)
        self._queue: deque[EpisodeAssigned] = deque()
        self._free: list[str] = []
        self._groups: dict[str, _Group] = {}
        self._owner: dict[str, str] = {}  # episode -> group
        self._similar: dict[str, list[int]] = {}  # train episode -> per-turn similar tips
        # step -> its groups that ended (by group index), until the step is requested
        self._pending: dict[int, dict[int, _Batch]] = {}
        self._counted = {"train": 0, "eval": 0}  # episodes assigned, per purpose
        self._planned = 0
        self._stepped = 0  # steps requested: all their groups ended, in order (warm-up included)
        self._version = 0
        self._running: dict[str, EpisodeAssigned] = {}  # episode -> its assignment
        self._started: set[str] = set()  # running episodes whose worker has begun them
        self._legacy_requests = False  # resumed from requests that predate their two fields
        self._scoring = SCORING  # the layout its requests name (a resumed run: the log's)
        # the extractor's work the run still owes: open extraction and merge requests (what
        # each is about, as its answer names it) and extractor update requests not yet made
        self._extracting: dict[int, Subject] = {}  # request seq -> what it is about
        self._extractor_owed = 0
        self._extractor = True  # until run() knows whether an actor answers extractions
        # merge passes asked for (their steps) that the memory has not planned yet; a log
        # written before MergePlanned existed has passes never planned so: none is awaited
        self._merging: set[int] = set()
        self._planner = True  # until run() knows whether an actor answers MergeDue
        self._legacy_merges = False
        # the credit actor's settlement (CreditsDue -> CreditsSettled): asked for once the
        # rest is done, where an actor answers it (run() knows; a replay, from the log)
        self._credits = False
        self._settling = False  # CreditsDue emitted
        self._settled = False

    @property
    def updates(self) -> int:
        """The number of updates this run makes."""
        return self._updates

    @property
    def episodes(self) -> int:
        """The training episodes this run plays: whole steps (warm-up steps included) of
        ``group_size * groups_per_update``, so ``run.episodes`` rounded down."""
        return self._steps * self._per_update()

    async def begin(self, ctx: Context) -> None:
        self._free = list(self._workers)
        if self._rounds.due(0):
            await self._start_round(ctx)
        await self._fill(ctx)

    async def handle(self, ctx: Context, ev: Event) -> bool:
        """React to one event; True when the run's work is done."""
        if isinstance(ev, _EXTRACTOR_EVENTS):
            self._extractor_event(ev, ctx.current)
            return await self._settle(ctx)
        if isinstance(ev, PolicyUpdated):
            self._version = ev.policy_version
            if self._rounds.due(ev.policy_version):
                await self._start_round(ctx)
        elif isinstance(ev, TipsRetrieved):
            if ev.episode in self._similar:
                self._similar[ev.episode].append(ev.similar)
        elif isinstance(ev, TipStored | TipRejected):
            await self._front(ctx, *await self._rounds.tip_done(ctx, ev.episode))
        elif isinstance(ev, EpisodeStarted):
            self._started.add(ev.episode)
            return False
        elif isinstance(ev, ActorRestarted):
            await self._worker_restarted(ctx, ev)
            return False
        else:
            assert isinstance(ev, EpisodeFinished | EpisodeAborted)
            self._running.pop(ev.episode, None)
            self._started.discard(ev.episode)
            self._free.append(ev.worker)
            await self._ended(ctx, ev)
        if await self._settle(ctx):
            return True
        await self._fill(ctx)
        return False

    async def _settle(self, ctx: Context) -> bool:
        """:meth:`finished`, once the rest of the run's work is done asking the credit actor
        (where there is one) to settle: it answers after any extractor update request the last
        episode ends made it ask, which the run then waits for."""
        if self._credits and not self._settling and self._work_done():
            self._settling = True
            await ctx.emit(CreditsDue(policy_version=self._version))
        return self.finished()

    async def _worker_restarted(self, ctx: Context, ev: ActorRestarted) -> None:
        """A worker failed and was restarted: the episode it had begun runs again on it (one
        it had not begun is still in its mailbox, or sent again to a remote one)."""
        job = next((j for j in self._running.values() if j.worker == ev.actor), None)
        if job is None or job.episode not in self._started:
            return
        self._started.discard(job.episode)
        self._forget_attempt(job.episode)
        await rerun_lost(ctx, job, ev)

    def _forget_attempt(self, episode: str) -> None:
        """Drop what a lost attempt of ``episode`` gathered: it is played again (and its
        extraction, if it asked for one, is owed no more)."""
        lost = [seq for seq, (_, source, _) in self._extracting.items() if source == episode]
        for seq in lost:  # an answer that comes all the same names its cause: ignored
            del self._extracting[seq]
        if episode in self._similar:
            self._similar[episode] = []
        self._rounds.forget(episode)

    async def run(self, ctx: Context) -> None:
        """:meth:`Replayed.run`, once the method's memory modes have an actor that answers
        them (a retrieval nobody answers would keep its episode waiting for good).

        Raises:
            ValueError: ``memory_eval`` asks the memory and no actor answers it.
        """
        self._memory = ctx.answered(RetrievalRequested)
        self._extractor = ctx.answered(ExtractionRequested) or ctx.answered(MergeRequested)
        self._planner = ctx.answered(MergeDue)
        self._credits = ctx.answered(CreditsDue)
        if (shown := self._method.memory_eval) is not None:
            check_mode(self._method, "memory_eval is", shown, self._memory)
        await super().run(ctx)

    async def recover(self, ctx: Context, history: Sequence[Envelope[Event]]) -> None:
        """Replay on ``history`` (:meth:`Replayed.recover`). A run whose log holds requests
        written before :class:`GradientRequested` recorded ``skip_zero_advantage`` and
        ``scoring`` (coevo before 2026-12-02) goes on writing them that way, and one whose
        requests name an older scoring layout goes on naming it: the replay must emit what
        the log holds, and its learner goes on training as it did."""
        layouts = [
            env.event.scoring
            for env in history
            if env.actor == ctx.name and isinstance(env.event, GradientRequested)
        ]
        self._legacy_requests = None in layouts
        self._scoring = next((x for x in reversed(layouts) if x is not None), SCORING)
        self._legacy_merges = _passes_unplanned(history)
        # the replay must ask for the settlement where the log does
        self._credits = any(
            env.actor == ctx.name and isinstance(env.event, CreditsDue) for env in history
        )
        self._rounds.hold = not any(
            env.actor == ctx.name
            and isinstance(env.event, EvalRoundStarted)
            and not env.event.holds_updates
            for env in history
        )
        await super().recover(ctx, history)

    async def resume(self, ctx: Context, tail: list[Emitted]) -> None:
        """Continue after the log's end: emit what the replay decided beyond it (assignments
        excepted: they never reached a worker), record every episode left running as
        :class:`EpisodeAbandoned`, and queue them all again (same id and seed) ahead of the
        rest, on workers that are all free."""
        for ev, corr, cause in tail:
            if isinstance(ev, CreditsDue) and not self._credits:
                self._settling = False  # the replay asked; nobody answers in this run
            elif not isinstance(ev, EpisodeAssigned):
                await ctx.emit(ev, corr=corr, cause=cause)
        again = await abandon_running(ctx, self._running.values(), tail)
        for job in again:
            self._forget_attempt(job.episode)
        self._running.clear()
        self._started.clear()
        self._queue.extendleft(msgspec.structs.replace(j, worker="") for j in reversed(again))
        self._free = list(self._workers)
        await self._fill(ctx)
        # a replay that ended with the rest done (the log stops before the settlement was
        # asked for) asks now; the run waits for the answer
        self._done = await self._settle(ctx)

    def finished(self) -> bool:
        """Every update made, every round played, the extractor's work on them done (a slower
        extractor's requests were left unanswered by a run that completed: its work lost, and
        ``replay --verify`` refused the log), every merge pass asked for planned (its chunks
        are then among the requests awaited), and the credit actor settled (its last extractor
        update request, made after the last episode end, is then among them too)."""
        return self._work_done() and (self._settled or not self._credits)

    def _work_done(self) -> bool:
        """:meth:`finished` but the credit actor's settlement."""
        return (
            self._version == self._updates
            and not self._rounds.playing
            and not self._queue
            and not (self._extractor and (self._extracting or self._extractor_owed))
            and not (self._planner and self._merging)
        )

    def _extractor_event(self, ev: Event, env: Envelope[Event] | None) -> None:
        """Count the extractor's work the run owes (what :meth:`finished` waits for): each
        request by its seq, closed by the answer that names it as its cause."""
        if isinstance(ev, ExtractionRequested | MergeRequested) and env is not None:
            self._extracting[env.seq] = subject_of(ev)
        elif isinstance(ev, ExtractorCalled) and env is not None and env.cause is not None:
            self._extracting.pop(env.cause, None)
        elif isinstance(ev, MergePlanned):
            self._merging.discard(ev.step)
        elif isinstance(ev, ExtractorGradientRequested):
            self._extractor_owed += 1
        elif isinstance(ev, ExtractorUpdated):
            self._extractor_owed = max(0, self._extractor_owed - 1)
        elif isinstance(ev, CreditsSettled):
            self._settled = True

    async def _fill(self, ctx: Context) -> None:
        """Plan what may start, then hand queued episodes to free workers."""
        per = self._grpo.groups_per_update
        while (
            self._planned < self._steps * per
            and self._version >= self._planned // per - self._warmup - self._grpo.max_staleness
            and len(self._queue) < len(self._free)
        ):
            self._plan_group(ctx)
        while self._queue and self._free:
            job = self._queue.popleft()
            worker = self._free.pop(0)
            assigned = msgspec.structs.replace(job, worker=worker)
            self._running[job.episode] = assigned
            await ctx.emit(assigned, corr=job.episode)

    def _plan_group(self, ctx: Context) -> None:
        g = self._planned
        task, _ = plan_episode(ctx.run_seed, g, self._tasks)
        gid = f"g{g:05d}"
        group = _Group(index=g, task=task, episodes=[], rollouts=[])
        for k in range(self._grpo.group_size):
            step = g // self._grpo.groups_per_update
            rollout = self._method.rollout(ctx.run_seed, step, self._ordinal("train"), k)
            check_mode(self._method, "rollout() returned", rollout, self._memory)
            if rollout != "plain" and not self._method.records_rollouts:
                raise ValueError(
                    f"{method_label(self._method)}: rollout() returned {rollout!r} and "
                    "records_rollouts is false: the learner would train the episode as "
                    "'plain' (a distill episode with its tips in the prompt) and the audit "
                    "re-derive it so; set records_rollouts = True"
                )
            job = self._job(ctx, task, "train", rollout=rollout, scope="train")
            shaped = called(self._method, "shape()", self._method.shape, job, task)
            job = checked_job(shaped, job, self._method)
            group.episodes.append(job.episode)
            group.rollouts.append(rollout)
            self._owner[job.episode] = gid
            if mode_of(rollout).memory != "none":
                self._similar[job.episode] = []
            self._queue.append(job)
        self._groups[gid] = group
        self._planned += 1

    def _job(
        self,
        ctx: Context,
        task: Task,
        purpose: str,
        *,
        rollout: str = "plain",
        scope: str = "",
        reflect: bool = False,
    ) -> EpisodeAssigned:
        index = self._assigned()
        ordinal = self._ordinal(purpose)
        self._counted[purpose] += 1
        stream = "eval-episode" if purpose == "eval" and self._eval.own_seeds else "episode"
        return EpisodeAssigned(
            episode=episode_id(index),
            index=index,
            worker="",
            family=task.family,
            variant=task.variant,
            split=task.split,
            seed=derive_seed(ctx.run_seed, stream, ordinal),
            purpose=purpose,
            rollout=rollout,
            scope=scope,
            reflect=reflect,
        )

    def _ordinal(self, purpose: str) -> int:
        """The number that seeds the next episode of ``purpose``: how many of that purpose
        were assigned before it (``eval.own_seeds``), or of every purpose (a run recorded
        before the setting), so that a training episode's seed and rollout mode never depend
        on the evaluation settings."""
        return self._counted[purpose] if self._eval.own_seeds else self._assigned()

    def _assigned(self) -> int:
        """Episodes assigned so far, every purpose: the next one's index (its id)."""
        return sum(self._counted.values())

    async def _start_round(self, ctx: Context) -> None:
        await self._front(ctx, await self._rounds.start(ctx, self._version), False)

    async def _front(self, ctx: Context, jobs: list[EpisodeAssigned], closed: bool) -> None:
        """Queue the rounds' ``jobs`` first, in order; once a version's rounds have all
        ``closed``, the updates they held go on."""
        self._queue.extendleft(reversed(jobs))
        if closed:
            await self._request_ready(ctx)

    def _held(self) -> bool:
        """Whether the next step's update waits: it would replace a version whose rounds
        have not all ended (a warm-up step replaces nothing)."""
        step = self._stepped
        return step >= self._warmup and self._rounds.holds(step - self._warmup)

    async def _ended(self, ctx: Context, ev: EpisodeFinished | EpisodeAborted) -> None:
        if self._rounds.owns(ev.episode):
            played = self._stepped * self._per_update()
            await self._front(ctx, *await self._rounds.ended(ctx, ev, played))
            return
        gid = self._owner.pop(ev.episode)
        group = self._groups[gid]
        group.ended += 1
        if isinstance(ev, EpisodeFinished):
            group.outcomes[ev.episode] = outcome(ev.score, ev.success, self._grpo.reward)
        if group.ended == len(group.episodes):
            await self._group_done(ctx, gid, group)

    def _per_update(self) -> int:
        return self._grpo.group_size * self._grpo.groups_per_update

    async def _group_done(self, ctx: Context, gid: str, group: _Group) -> None:
        kept = [i for i, e in enumerate(group.episodes) if e in group.outcomes]
        episodes = [group.episodes[i] for i in kept]
        rollouts = [group.rollouts[i] for i in kept]
        outcomes = [group.outcomes[e] for e in episodes]
        similar = [self._similar.get(e, []) for e in episodes]
        for e in group.episodes:
            self._similar.pop(e, None)
        scored = called(self._method, "score", self._method.score, outcomes, rollouts, similar)
        scored = checked_scored(scored, len(episodes), self._method)
        rewards, advantages = scored.rewards, scored.advantages
        mean, std = group_stats(rewards) if rewards else (0.0, 0.0)
        step = group.index // self._grpo.groups_per_update
        await ctx.emit(
            AdvantagesComputed(
                group=gid,
                update=step - self._warmup,
                family=group.task.family,
                variant=group.task.variant,
                episodes=tuple(episodes),
                rewards=rewards,
                advantages=advantages,
                rule=scored.rule,
                eps=ADV_EPS,
                mean=mean,
                std=std,
                outcomes=scored.outcomes,
                intrinsic=scored.intrinsic,
                intrinsic_coef=scored.intrinsic_coef,
                rollouts=tuple(rollouts) if self._method.records_rollouts else (),
            )
        )
        del self._groups[gid]
        batch = _Batch(tuple(episodes), advantages, tuple(rollouts))
        self._pending.setdefault(step, {})[group.index] = batch
        await self._request_ready(ctx)

    async def _request_ready(self, ctx: Context) -> None:
        """Request every next step whose groups have all ended, in order, unless it is
        :meth:`_held`."""
        per = self._grpo.groups_per_update
        while len(self._pending.get(self._stepped, ())) == per and not self._held():
            await self._request(ctx, self._pending.pop(self._stepped))

    async def _request(self, ctx: Context, groups: dict[int, _Batch]) -> None:
        """Step ``self._stepped``'s update from its ``groups``, in group order (a warm-up step
        trains nothing)."""
        episodes: list[str] = []
        advantages: list[float] = []
        rollouts: list[str] = []
        for g in sorted(groups):  # group order, not completion order
            episodes += groups[g].episodes
            advantages += groups[g].advantages
            rollouts += groups[g].rollouts
        step = self._stepped
        self._stepped += 1
        made = called(self._method, "step_events()", self._method.step_events, step)
        for ev in checked_step_events(made, self._method):
            await ctx.emit(ev)
            if isinstance(ev, MergeDue) and not self._legacy_merges:
                self._merging.add(ev.step)
        if step < self._warmup:
            return  # warm-up: the bank fills, the policy waits
        req = gradient_request(
            self._grpo,
            step - self._warmup,
            episodes,
            advantages,
            rollouts if self._method.records_rollouts else (),
        )
        if self._legacy_requests:
            req = msgspec.structs.replace(req, skip_zero_advantage=False, scoring=None)
        elif req.scoring != self._scoring:
            req = msgspec.structs.replace(req, scoring=self._scoring)
        given = called(self._method, "loss()", self._method.loss, req)
        await ctx.emit(checked_loss(given, req, self._method))


def _passes_unplanned(history: Sequence[Envelope[Event]]) -> bool:
    """Whether ``history`` holds a merge pass that a memory actor went past without planning
    it (:class:`MergePlanned`): a log written before that event existed. A memory actor
    answers its messages in order, so an answer to a later message means the pass was
    handled; one it never reached is owed to it on resume, and planned then."""
    memory = {env.actor for env in history if isinstance(env.event, _MEMORY_ANSWERS)}
    planned = {env.cause for env in history if isinstance(env.event, MergePlanned)}
    due = [env.seq for env in history if isinstance(env.event, MergeDue)]
    answered = max(
        (env.cause for env in history if env.actor in memory and env.cause is not None),
        default=-1,
    )
    return any(seq not in planned and seq < answered for seq in due)
