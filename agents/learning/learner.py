"""The learner actor: turns a :class:`GradientRequested` into a new policy version.

It keeps every :class:`ActionSampled` of training episodes until a request names their episode,
then trains on those turns with the request's advantages and loss settings, writes the new
weights as a safetensors checkpoint and emits :class:`PolicyUpdated`. Samples older than the
request's staleness bound are dropped and counted, never trained on. The training runs in a
worker thread, or with ``[policy] learner_threads`` in a process of its own
(:mod:`agents.learning.trainee_host`); either way the actor goes on reading its events.

The update itself, free of actors and events, is :func:`agents.learning.update.grpo_step`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from agents.events.episodes import EpisodeAbandoned, EpisodeAborted, EpisodeFinished
from agents.events.policy import ActionSampled, GradientRequested, PolicyUpdated
from agents.learning.trainee_host import (
    STALL_TIMEOUT,
    LocalTrainee,
    TraineeHost,
    TraineeProcess,
)
from agents.learning.update import Sample, Trainee
from agents.methods.base import mode_of
from engine.actor import Actor, Context, task_nursery
from engine.errors import ModelUnavailable, ResumeDiverged
from engine.events import Envelope, Event
from engine.seeds import derive_rng
from stores.checkpoints import Checkpoints


@dataclass(frozen=True, slots=True)
class _Job:
    """A request with the samples collected for it when it was folded (at its place in the
    log, as re-execution's fold collects them) and the version it trains."""

    req: GradientRequested
    samples: list[Sample]
    stale: int
    version: int  # the policy version it trains; its result is version + 1


class Learner(Actor):
    """Trains on requested episodes and publishes each new version as a checkpoint.

    Each checkpoint holds the optimiser's state too, so a resumed run (:meth:`recover`)
    continues from the newest version the log names with the moments it had.

    Args:
        load: builds the :class:`Trainee` (blocking; at start).
        checkpoints: where new versions are written.
        process_threads: None trains in this process's worker threads (with its torch
            threads); N trains in a process of its own with N torch threads
            (:class:`agents.learning.trainee_host.TraineeProcess`: ``load`` and
            ``checkpoints`` must pickle).
        host: the trainee's host, already started (a process launched while the run was
            assembled, so that it loads meanwhile); None: one is made at start.
        process_stall: with ``process_threads``, seconds a call may go without a sign of life
            from the process before it counts as lost (``TraineeProcess.stall_timeout``).
    """

    subscribes = (
        ActionSampled,
        EpisodeFinished,
        EpisodeAborted,
        EpisodeAbandoned,
        GradientRequested,
        PolicyUpdated,
    )

    def __init__(
        self,
        load: Callable[[], Trainee],
        checkpoints: Checkpoints,
        process_threads: int | None = None,
        host: TraineeHost | None = None,
        process_stall: float = STALL_TIMEOUT,
    ) -> None:
        if process_threads is not None and process_threads < 1:
            raise ValueError(f"process_threads must be None or >= 1, got {process_threads}")
        self._load = load
        self._checkpoints = checkpoints
        self._process_threads = process_threads
        self._process_stall = process_stall
        self._buffer = SampleBuffer()
        self._committed = 0  # the newest version whose PolicyUpdated came back from the log
        self._backlog: list[_Job] = []  # requests a resumed run still owes
        self._host = host  # one started for this learner already, or the one recover opened
        self._parent = ""  # the digest the next update starts from

    async def run(self, ctx: Context) -> None:
        """Fold the events into the sample buffer and queue each request, with its samples
        collected at once, for :meth:`_train`, which loads the trainee, then serves them in
        order: the mailbox is read while the trainee loads and trains, so the run never waits
        on a busy learner to take its events."""
        host = self._host or self._new_host()
        self._host = None
        send, todo = trio.open_memory_channel[_Job](math.inf)
        try:
            async with task_nursery() as nursery:
                nursery.start_soon(self._train, ctx, host, todo)
                with send:
                    for job in self._backlog:
                        send.send_nowait(job)
                    self._backlog.clear()
                    async for env in ctx.events():
                        if isinstance(env.event, PolicyUpdated):
                            self._committed = env.event.policy_version
                        req = self._buffer.observe(env)
                        if req is not None:
                            send.send_nowait(self._collect(req))
        finally:
            with trio.CancelScope(shield=True):
                await ctx.to_thread(host.close)

    def _new_host(self) -> TraineeHost:
        if self._process_threads is None:
            return LocalTrainee(self._load, self._checkpoints)
        process = TraineeProcess(self._process_threads, self._process_stall)
        process.start(self._load, self._checkpoints)
        return process

    async def _open(self, ctx: Context, host: TraineeHost) -> None:
        """Load the trainee (a process of its own: wait until it is ready, said once)."""
        loading = host if isinstance(host, TraineeProcess) and not host.ready else None
        await ctx.to_thread(host.open)
        if loading is not None:
            ctx.log.info("learner process ready", pid=loading.pid, threads=loading.threads)

    async def _train(
        self,
        ctx: Context,
        host: TraineeHost,
        todo: trio.MemoryReceiveChannel[_Job],
    ) -> None:
        with todo:
            await self._open(ctx, host)
            if not self._parent:
                self._parent = await ctx.to_thread(host.digest)
            async for job in todo:
                await self._update(ctx, host, job)

    def _collect(self, req: GradientRequested) -> _Job:
        """The request's samples, collected now (its episodes' turns folded so far; a turn
        folded later is not its), and the version it trains: one per request, in order."""
        samples, stale = self._buffer.collect(req)
        job = _Job(req, samples, stale, self._buffer.version)
        self._buffer.version += 1
        return job

    async def recover(self, ctx: Context, history: Sequence[Envelope[Event]]) -> None:
        """Fold the log's samples and requests, load the newest version it names (weights and
        optimiser), and keep the requests no :class:`PolicyUpdated` answered for :meth:`run`.

        Raises:
            ResumeDiverged: the newest checkpoint the log names is missing, damaged, not the
                version the log says (its weights' digest), or without its optimiser state.
        """
        done = {env.event.update for env in history if isinstance(env.event, PolicyUpdated)}
        latest: PolicyUpdated | None = None
        for env in history:
            ev = env.event
            req = self._buffer.observe(env)
            if req is not None:
                job = self._collect(req)
                if req.update not in done:
                    self._backlog.append(job)
            elif isinstance(ev, PolicyUpdated):
                latest = ev
                self._committed = ev.policy_version
        host = self._host or self._new_host()
        try:
            await self._open(ctx, host)
            if latest is not None:
                await ctx.to_thread(host.restore, latest.checkpoint, latest.digest)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                await ctx.to_thread(host.close)
            if isinstance(exc, ModelUnavailable):
                raise ResumeDiverged(f"the learner cannot resume: {exc}") from None
            raise
        if latest is not None:
            self._parent = latest.digest
            ctx.log.info("learner resumed", version=latest.policy_version)
        self._host = host

    async def _update(self, ctx: Context, host: TraineeHost, job: _Job) -> None:
        """Train, save and announce the next version."""
        start = time.perf_counter()
        req, stale, version = job.req, job.stale, job.version + 1
        seed = update_seed(ctx.run_seed, req.update)
        done = await ctx.to_thread(host.update, job.samples, req, seed, version, self._committed)
        stats, memory = done.stats, done.memory
        gap = stats.gap
        await ctx.emit(
            PolicyUpdated(
                policy_version=version,
                update=req.update,
                samples=stats.samples,
                stale=stale,
                loss=stats.loss,
                grad_norm=stats.grad_norm,
                clip_frac=stats.clip_frac,
                kl=stats.kl,
                ratio_mean=stats.ratio_mean,
                ref_kl=stats.ref_kl,
                digest=done.digest,
                checkpoint=done.checkpoint,
                seconds=time.perf_counter() - start,
                seed=seed,
                parent_digest=self._parent,
                gap_tokens=gap.tokens if gap else None,
                gap_abs_mean=gap.abs_mean if gap else None,
                gap_abs_max=gap.abs_max if gap else None,
                gap_kl=gap.kl if gap else None,
                tis_clip_frac=stats.tis_clip_frac,
                low_prob_masked=stats.low_prob_masked,
                trainable_params=memory.trainable_params,
                total_params=memory.total_params,
                optimizer_bytes=memory.optimizer_bytes,
                peak_bytes=memory.peak_bytes,
                threads=done.threads,
            )
        )
        self._parent = done.digest


def update_seed(run_seed: int, update: int) -> int:
    """The seed that shuffles update ``update``'s minibatches (recorded in
    :attr:`PolicyUpdated.seed`; logs older than that field re-derive it with this)."""
    return derive_rng(run_seed, "update", update).getrandbits(63)


class SampleBuffer:
    """What the learner keeps between requests: the turns of finished training episodes, as a
    fold of the events it subscribes to (the learner and ``coevo replay --reexecute-learner``
    share it, so both train on the same samples).

    Attributes:
        version: the policy version the next request trains (one per request collected before
            it: requests are served in order), which its staleness is counted against. Its
            owner advances it after each :meth:`collect`.
    """

    def __init__(self) -> None:
        self.turns: dict[str, list[ActionSampled]] = {}
        self.ended: set[str] = set()
        self.version = 0
        self._abandoned: dict[str, int] = {}  # episode -> seq of its last abandoned attempt

    def observe(self, env: Envelope[Event]) -> GradientRequested | None:
        """Fold one envelope; a :class:`GradientRequested` is returned for the caller to serve.
        A sample answering a request made before its episode's attempt was abandoned (a worker
        lost mid-episode, the inference answering after) belongs to the lost attempt and is
        dropped: the re-run samples its turns again."""
        ev = env.event
        if isinstance(ev, ActionSampled):
            lost = self._abandoned.get(ev.episode, -1)
            if env.cause is None or env.cause > lost:
                self.turns.setdefault(ev.episode, []).append(ev)
        elif isinstance(ev, EpisodeFinished | EpisodeAborted):
            if ev.purpose != "train" or isinstance(ev, EpisodeAborted):
                self.turns.pop(ev.episode, None)  # never trained on
            else:
                self.ended.add(ev.episode)
        elif isinstance(ev, EpisodeAbandoned):
            self.turns.pop(ev.episode, None)  # played again from the start
            self._abandoned[ev.episode] = env.seq
        elif isinstance(ev, GradientRequested):
            return ev
        return None

    def collect(self, req: GradientRequested) -> tuple[list[Sample], int]:
        """The request's samples (removed from the buffer) and how many were too stale to use.

        Raises:
            RuntimeError: the request names an episode that has not finished.
            ValueError: the request names an unknown rollout mode.
        """
        samples: list[Sample] = []
        stale = 0
        rollouts = req.rollouts or ("plain",) * len(req.episodes)
        for episode, adv, rollout in zip(req.episodes, req.advantages, rollouts, strict=True):
            if episode not in self.ended:
                raise RuntimeError(f"gradient requested for {episode}, which has not finished")
            self.ended.discard(episode)
            distill = mode_of(rollout).distill
            for turn in self.turns.pop(episode, []):
                if self.version - turn.policy_version > req.max_staleness:
                    stale += 1
                else:
                    samples.append(Sample(turn, adv, distill=distill))
        return samples, stale
