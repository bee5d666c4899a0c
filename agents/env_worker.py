"""The env worker: runs the episodes assigned to it, one at a time, and records every turn.

One world instance per worker. A world that declares ``blocking = False`` (the built-in one,
microseconds per step) is stepped on the event loop; any other world is stepped in a worker
thread. A world that raises ends the episode with :class:`EpisodeAborted`; the worker then builds
a fresh world and takes the next assignment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents.episode_events import (
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from agents.scripted import Agent
from engine.actor import Actor, Context
from engine.seeds import derive_rng
from scenarios.worlds.base import Observation, Task, TextWorld

AgentFactory = Callable[[Any], Agent]
"""Builds an agent for one episode from that episode's ``random.Random``."""


class EnvWorker(Actor):
    """Runs assigned episodes in its own world with a fresh agent per episode."""

    subscribes = (EpisodeAssigned,)

    def __init__(self, make_world: Callable[[], TextWorld], make_agent: AgentFactory) -> None:
        self._make_world = make_world
        self._make_agent = make_agent

    async def run(self, ctx: Context) -> None:
        world = await ctx.to_thread(self._make_world)
        try:
            async for env in ctx.events():
                assert isinstance(env.event, EpisodeAssigned)
                try:
                    await self._episode(ctx, world, env.event)
                except Exception as exc:  # the world failed: record, rebuild, go on
                    await ctx.emit(
                        EpisodeAborted(
                            episode=env.event.episode,
                            worker=ctx.name,
                            reason=f"{type(exc).__name__}: {exc}",
                            purpose=env.event.purpose,
                        )
                    )
                    ctx.log.warning("episode aborted", episode=env.event.episode, error=str(exc))
                    await ctx.to_thread(world.close)
                    world = await ctx.to_thread(self._make_world)
        finally:
            world.close()

    async def _episode(self, ctx: Context, world: TextWorld, job: EpisodeAssigned) -> None:
        blocking = getattr(world, "blocking", True)

        async def call(fn: Callable[..., Observation], *args: Any) -> Observation:
            return await ctx.to_thread(fn, *args) if blocking else fn(*args)

        task = Task(family=job.family, variant=job.variant, split=job.split)
        obs = await call(world.reset, task, job.seed)
        agent = self._make_agent(derive_rng(job.seed, "agent"))
        agent.reset(obs.goal, obs)
        await ctx.emit(
            EpisodeStarted(
                episode=job.episode,
                worker=ctx.name,
                goal=obs.goal,
                observation=obs.text,
                admissible=obs.admissible,
            )
        )
        turn = 0
        total = 0.0
        while not obs.done:
            action = agent.act(obs)
            obs = await call(world.step, action)
            total += obs.reward
            await ctx.emit(
                StepTaken(
                    episode=job.episode,
                    turn=turn,
                    action=action,
                    observation=obs.text,
                    admissible=obs.admissible,
                    reward=obs.reward,
                    done=obs.done,
                    score=obs.score,
                )
            )
            turn += 1
        await ctx.emit(
            EpisodeFinished(
                episode=job.episode,
                worker=ctx.name,
                family=job.family,
                variant=job.variant,
                split=job.split,
                steps=turn,
                score=obs.score,
                success=obs.success,
                total_reward=total,
                purpose=job.purpose,
            )
        )
