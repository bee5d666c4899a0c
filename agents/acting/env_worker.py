"""The env worker: runs the episodes assigned to it, one at a time, and records every turn.

One world instance per worker. The agent is either scripted (an :class:`Agent` built per
episode, acting synchronously) or the policy: the worker then renders each turn's prompt, emits
:class:`ActionRequested` and waits for the inference actor's :class:`ActionSampled`. When the
job's rollout mode reads memory (:data:`agents.methods.base.ROLLOUTS`: EMPO2's tips each turn,
Complementary RL's entry once) it first asks the memory (:class:`RetrievalRequested`, answered
by :class:`TipsRetrieved`) and shows what it found in the prompt;
when the assignment says ``reflect``, it asks the policy for a tip on the finished episode
(:class:`ReflectionRequested`) and moves on without waiting for it.

A world that declares ``blocking = False`` (the built-in one, microseconds per step) is stepped
on the event loop; any other world is stepped in a worker thread, and a ``reset`` or ``step``
that does not return within ``step_timeout`` seconds counts as hung: its thread is abandoned
(Python cannot stop it) with the world it holds. A world that raises or hangs ends the episode
with :class:`EpisodeAborted`; the worker then builds a fresh world and takes the next assignment.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
import trio

from agents.acting.scripted import Agent
from agents.acting.world_calls import checked_observation
from agents.events.episodes import (
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
    EpisodeStarted,
    StepTaken,
)
from agents.events.extractor import ExtractionRequested
from agents.events.memory import ReflectionRequested, RetrievalRequested, TipsRetrieved, slot_of
from agents.events.policy import ActionRequested, ActionSampled
from agents.memory.extraction import EXTRACT_SYSTEM, extract_messages
from agents.methods.base import mode_of
from agents.models.prompts import (
    REFLECT_SYSTEM,
    TURN_SYSTEM,
    MemoryPlace,
    Step,
    reflection_messages,
    state_text,
    to_pairs,
    turn_messages,
)
from engine.actor import Actor, Context, task_nursery
from engine.events import Envelope, Event
from engine.seeds import derive_rng, derive_seed
from engine.world import Observation, Task, TextWorld

PACE_TURNS = 16
"""How many turns that awaited nothing (a scripted agent in a world stepped on the event loop)
an episode plays between two :meth:`engine.actor.Context.pace`: the writer commits and a stop
signal is taken between them (every turn cost a third of the explore scenario's speed)."""

SLOW_CALL_S = 30.0
"""Seconds after which a blocking world call that has not returned is said (``world call
slow``), and again every :data:`SLOW_CALL_EVERY_S`: with the default ``[world] step_timeout``
(600 s) a world that hangs (a stopped JVM or game compiler) held its worker ten minutes
without a word."""

SLOW_CALL_EVERY_S = 60.0

SLOW_ANSWER_S = 60.0
"""Seconds after which an episode's request that has no answer yet (an action, a retrieval) is
said (``answer slow``), and again every :data:`SLOW_ANSWER_EVERY_S`: a plug-in memory that
never answered a retrieval held its episode, and so the run, with no word at all."""

SLOW_ANSWER_EVERY_S = 120.0

CLOSE_GRACE_S = 10.0
"""The most seconds a worker waits for its world's last ``close`` as the run ends or stops
(a JVM exits in a few): one that hangs is abandoned then rather than after ``[world]
step_timeout``, which held a stop for that long (600 s by default) on a world whose earlier
call had hung with a lock its ``close`` needs."""

AgentFactory = Callable[[Any], Agent]
"""Builds an agent for one episode from that episode's ``random.Random``."""


@dataclass(frozen=True)
class PromptSettings:
    """How a policy-driven worker renders prompts (see :func:`agents.models.prompts.turn_messages`).

    Attributes:
        window: past turns shown.
        list_actions: list the admissible actions in the prompt.
        greedy_eval: act greedily in evaluation episodes (purpose "eval").
        system: the system message's text.
        memory: the message the memory's entries are appended to ("user" or "system").
        reflect: the system text of a reflection's prompt (EMPO2's tips).
        extract: the system text of an extraction's prompt (Complementary RL's extractor).
        max_ops: the most operations an extraction's prompt asks for.
    """

    window: int = 4
    list_actions: bool = False
    greedy_eval: bool = False
    system: str = TURN_SYSTEM
    memory: MemoryPlace = "user"
    reflect: str = REFLECT_SYSTEM
    extract: str = EXTRACT_SYSTEM
    max_ops: int = 3


class EnvWorker(Actor):
    """Runs assigned episodes in its own world, with a scripted agent or the policy.

    Args:
        make_world: builds the worker's world (in a worker thread).
        make_agent: builds a scripted agent per episode; None means the policy acts.
        prompt: prompt settings when the policy acts.
        step_timeout: seconds a blocking world's ``reset``, ``step`` or ``close`` may take
            before it counts as hung (None: no limit).
        max_turns: the most turns of an episode; one not done by then finishes truncated
            (0: no limit).
    """

    subscribes = (EpisodeAssigned, ActionSampled, TipsRetrieved)

    def __init__(
        self,
        make_world: Callable[[], TextWorld],
        make_agent: AgentFactory | None,
        prompt: PromptSettings | None = None,
        step_timeout: float | None = None,
        max_turns: int = 0,
    ) -> None:
        if step_timeout is not None and not step_timeout > 0:
            raise ValueError(f"step_timeout must be > 0 or None, got {step_timeout}")
        if max_turns < 0:
            raise ValueError(f"max_turns must be >= 0, got {max_turns}")
        self._max_turns = max_turns
        self._make_world = make_world
        self._make_agent = make_agent
        self._prompt = prompt or PromptSettings()
        self._timeout = step_timeout
        self._log = structlog.get_logger("coevo")
        self._cwd = os.getcwd()  # the run's: a world call that changes it is undone
        self._cwd_said = False
        self._many_said = False

    def _many_actions(self, count: int, where: str) -> None:
        """Say once, on the first turn that offers more than :data:`MANY_ACTIONS`, that the
        policy's every turn and update grow with the list: a world offering 10,000 ran for
        minutes with no word, which read as a hang."""
        if count > MANY_ACTIONS and not self._many_said:
            self._many_said = True
            self._log.warning(
                "many admissible actions: the policy scores every one each turn, in acting "
                "and in each update (or lists them in its prompt, policy.mode = 'generate'), "
                "so turns and updates slow down in proportion",
                actions=count,
                at=where,
            )

    def _keep_cwd(self, what: str) -> None:
        """Put back the working directory that world call ``what`` changed (a plug-in's
        ``os.chdir``: the run's relative paths, its checkpoints among them, then led
        elsewhere, and the run's end took its directory for moved), saying so once."""
        try:
            now = os.getcwd()
        except OSError:  # changed to a directory since deleted
            now = ""
        if now == self._cwd:
            return
        with contextlib.suppress(OSError):
            os.chdir(self._cwd)
        if not self._cwd_said:
            self._cwd_said = True
            self._log.warning(
                "world changed the working directory; changed back",
                call=what,
                to=now or "(a deleted directory)",
                back_to=self._cwd,
            )

    async def run(self, ctx: Context) -> None:
        self._log = ctx.log
        world: TextWorld | None = await self._build()
        inbox = ctx.events()
        try:
            async for env in inbox:
                if isinstance(env.event, ActionSampled | TipsRetrieved):
                    continue  # an answer for an episode lost in a restart
                assert isinstance(env.event, EpisodeAssigned)
                assert world is not None  # (a failed rebuild ended the loop)
                try:
                    await self._episode(ctx, world, env.event, inbox)
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
                    closed, world = world, None  # not closed again if the rebuild fails
                    await self._close(ctx, closed)
                    world = await self._build()
        finally:
            if world is not None:
                with trio.CancelScope(shield=True):  # a JVM may take seconds to exit
                    await self._close(ctx, world, CLOSE_GRACE_S)

    async def _build(self) -> TextWorld:
        """A new world, built in a thread under ``step_timeout``.

        Raises:
            TimeoutError: the constructor did not return in time (the actor fails with it).
        """
        try:
            return await self._blocking(self._make_world, what="the world's constructor")
        finally:
            self._keep_cwd("the world's constructor")

    async def _blocking(
        self, fn: Callable[..., Any], *args: Any, what: str = "", limit: float | None = None
    ) -> Any:
        """``fn(*args)`` in a worker thread, abandoned after ``step_timeout`` seconds (or
        ``limit``, if that is shorter).

        Each call has a thread limiter of its own: an abandoned thread keeps its limiter's
        token until it returns (never, for a world that hangs), and on trio's default limiter
        (40 tokens, shared by every thread the run starts) 40 hangs stalled the whole run, its
        shutdown included. A worker has one call in flight at a time, so its own is enough.

        Raises:
            TimeoutError: ``fn`` did not return in time (its thread keeps running).
        """
        limiter = trio.CapacityLimiter(1)
        bounds = [t for t in (self._timeout, limit) if t is not None]
        deadline = min(bounds, default=math.inf)
        name = what or f"world.{getattr(fn, '__name__', 'call')}"
        async with task_nursery() as nursery:
            nursery.start_soon(self._said_slow, name, deadline)
            try:
                with trio.move_on_after(deadline):
                    return await trio.to_thread.run_sync(
                        fn, *args, abandon_on_cancel=bool(bounds), limiter=limiter
                    )
            finally:
                nursery.cancel_scope.cancel()
        why = "world.step_timeout" if deadline == self._timeout else "as the run ends"
        raise TimeoutError(
            f"{name} did not return within {deadline:g} s ({why}); "
            "its thread and world were abandoned"
        )

    async def _said_slow(self, name: str, deadline: float) -> None:
        """Say (warn) that the call ``name`` has not returned, after :data:`SLOW_CALL_S` and
        every :data:`SLOW_CALL_EVERY_S` after that, until it returns or is abandoned."""
        waited, wait = 0.0, SLOW_CALL_S
        while waited + wait < deadline:
            await trio.sleep(wait)
            waited += wait
            until = f"{deadline:g} s ([world] step_timeout)" if math.isfinite(deadline) else ""
            self._log.warning(
                "world call slow",
                call=name,
                waited_s=round(waited),
                abandoned_after=until or "never (no step_timeout)",
            )
            wait = SLOW_CALL_EVERY_S

    async def _close(self, ctx: Context, world: TextWorld, limit: float | None = None) -> None:
        """Close a world (within ``limit`` seconds, if given, or ``step_timeout``); a hung one
        is left to its abandoned thread, one that fails to close is dropped all the same (it is
        never used again)."""
        try:
            await self._blocking(world.close, limit=limit)
        except TimeoutError as exc:
            ctx.log.warning("world close abandoned", error=str(exc))
        except SystemExit as exc:  # a plug-in's sys.exit() must not end the run
            ctx.log.warning("world close failed", error=f"sys.exit({exc.code!r})")
        except KeyboardInterrupt:  # raised in a worker thread: the world's, not a signal
            ctx.log.warning("world close failed", error="KeyboardInterrupt")
        except trio.Cancelled:
            raise
        except BaseException as exc:  # the world is dropped: nothing more to do than say so
            ctx.log.warning("world close failed", error=f"{type(exc).__name__}: {exc}")

    async def _episode(
        self, ctx: Context, world: TextWorld, job: EpisodeAssigned, inbox: Any
    ) -> None:
        blocking = getattr(world, "blocking", True)

        async def call(fn: Callable[..., Observation], what: str, *args: Any) -> Observation:
            try:
                out = await self._blocking(fn, *args) if blocking else fn(*args)
            except SystemExit as exc:  # a plug-in's sys.exit() ends the episode, not the run
                raise RuntimeError(f"world.{fn.__name__} called sys.exit({exc.code!r})") from None
            except KeyboardInterrupt:
                if not blocking and ctx.ctrl_c_possible():  # it may be the user's Ctrl-C
                    raise
                # raised in a worker thread, where no signal lands, or on the loop while the
                # runtime takes SIGINT itself: the world's own doing
                raise RuntimeError(f"world.{fn.__name__} raised KeyboardInterrupt") from None
            except trio.Cancelled:
                raise
            except Exception:
                raise
            except BaseException as exc:  # a plug-in's own BaseException: the episode's end
                raise RuntimeError(
                    f"world.{fn.__name__} raised {type(exc).__name__}: {exc}"
                ) from None
            finally:
                self._keep_cwd(what)
            return checked_observation(out, what)

        task = Task(family=job.family, variant=job.variant, split=job.split)
        reset = f"world.reset({job.family}/{job.variant} {job.split}, seed {job.seed})"
        obs = await call(world.reset, reset, task, job.seed)
        if self._make_agent is not None:
            agent = self._make_agent(derive_rng(job.seed, "agent"))
            agent.reset(obs.goal, obs)
        else:
            agent = _PolicyAgent(ctx, job, inbox, self._prompt, obs)
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
        # a scripted agent in a world stepped on the event loop awaits nothing between turns
        idle = not blocking and not isinstance(agent, _PolicyAgent)
        while not obs.done and not (self._max_turns and turn >= self._max_turns):
            if isinstance(agent, _PolicyAgent):
                self._many_actions(len(obs.admissible), reset if turn == 0 else f"turn {turn}")
                action = await agent.act(obs, turn)
            else:
                action = agent.act(obs)
            obs = await call(world.step, f"world.step({action!r}) on turn {turn}", action)
            if isinstance(agent, _PolicyAgent):
                agent.history.append((action, obs.text))
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
            if idle and turn % PACE_TURNS == PACE_TURNS - 1:
                await ctx.pace()
            turn += 1
        if isinstance(agent, _PolicyAgent) and job.reflect:
            await agent.reflect(obs)
        if isinstance(agent, _PolicyAgent) and job.extract:
            await agent.extract(obs)
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
                truncated=not obs.done,
            )
        )


MANY_ACTIONS = 1000
"""More admissible actions than this on a policy's turn are warned of, once per worker."""


class _PolicyAgent:
    """The policy as seen from one episode: renders the prompt, asks, waits for the answer."""

    def __init__(
        self,
        ctx: Context,
        job: EpisodeAssigned,
        inbox: Any,
        prompt: PromptSettings,
        first: Observation,
    ) -> None:
        self._ctx = ctx
        self._job = job
        self._inbox = inbox
        self._prompt = prompt
        self._goal = first.goal
        self._first = first.text
        self._mode = mode_of(job.rollout)
        once = self._mode.memory == "once"  # a guided episode reads its family's partition
        self._slot = job.slot or slot_of(job.scope, job.family, None if once else job.variant)
        self._entry: TipsRetrieved | None = None  # the bank entry of a guided episode
        self.history: list[Step] = []

    async def act(self, obs: Observation, turn: int) -> str:
        job = self._job
        tips: tuple[str, ...] = ()
        if self._mode.memory == "once":
            if self._entry is None:
                self._entry = await self._retrieve(obs, turn, rule="diverse", k=1)
            tips = self._entry.tips
        elif self._mode.memory == "each-turn":
            tips = (await self._retrieve(obs, turn)).tips
        messages = turn_messages(
            self._goal,
            self.history,
            obs.text,
            admissible=obs.admissible if self._prompt.list_actions else None,
            tips=tips,
            window=self._prompt.window,
            system=self._prompt.system,
            memory=self._prompt.memory,
        )
        await self._ctx.emit(
            ActionRequested(
                episode=job.episode,
                worker=self._ctx.name,
                turn=turn,
                messages=to_pairs(messages),
                admissible=obs.admissible,
                seed=derive_seed(job.seed, "act", turn),
                greedy=self._prompt.greedy_eval and job.purpose == "eval",
                tips=tips,
            )
        )
        answer = await self._wait(ActionSampled, turn)
        assert isinstance(answer, ActionSampled)
        return answer.action

    async def _retrieve(
        self, obs: Observation, turn: int, rule: str = "threshold", k: int = 0
    ) -> TipsRetrieved:
        job = self._job
        await self._ctx.emit(
            RetrievalRequested(
                episode=job.episode,
                worker=self._ctx.name,
                turn=turn,
                slot=self._slot,
                query=state_text(self._goal, self.history, obs.text, window=self._prompt.window),
                rule=rule,
                k=k,
                read_only=job.purpose != "train",  # evaluation never changes the bank
            )
        )
        found = await self._wait(TipsRetrieved, turn)
        assert isinstance(found, TipsRetrieved)
        return found

    async def extract(self, last: Observation) -> None:
        """Send the finished episode to the extractor's queue, with the entry it was shown."""
        job = self._job
        used = self._entry
        entry = (used.tip_ids[0], used.tips[0]) if used is not None and used.tip_ids else None
        messages = extract_messages(
            self._goal,
            self._first,
            self.history,
            success=last.success,
            entry=entry and entry[1],
            max_ops=self._prompt.max_ops,
            system=self._prompt.extract,
        )
        await self._ctx.emit(
            ExtractionRequested(
                episode=job.episode,
                worker=self._ctx.name,
                slot=slot_of(job.scope, job.family),
                entry=entry[0] if entry else -1,
                messages=to_pairs(messages),
                success=last.success,
                score=last.score,
                seed=derive_seed(job.seed, "extract"),
            )
        )

    async def reflect(self, last: Observation) -> None:
        """Ask the policy for a tip on the finished episode (answered to the memory actor)."""
        job = self._job
        messages = reflection_messages(
            self._goal, self._first, self.history, success=last.success, system=self._prompt.reflect
        )
        await self._ctx.emit(
            ReflectionRequested(
                episode=job.episode,
                worker=self._ctx.name,
                slot=self._slot,
                messages=to_pairs(messages),
                key=state_text(self._goal, self.history, last.text, window=self._prompt.window),
                score=last.score,
                success=last.success,
                seed=derive_seed(job.seed, "reflect"),
            )
        )

    async def _wait(self, kind: type[Event], turn: int) -> Event:
        """The next ``kind`` answer for this episode's ``turn``; late answers for an episode
        lost in a restart are skipped."""
        job = self._job
        waited, wait = 0.0, SLOW_ANSWER_S
        while True:
            env: Envelope[Event] | None = None
            with trio.move_on_after(wait):  # a mailbox receive is cancel-safe
                env = await self._inbox.__anext__()
            if env is None:
                waited, wait = waited + wait, SLOW_ANSWER_EVERY_S
                self._ctx.log.warning(
                    "answer slow",
                    waiting_for=kind.__struct_config__.tag,
                    episode=job.episode,
                    turn=turn,
                    waited_s=round(waited),
                )
                continue
            ev = env.event
            # every kind waited for carries the episode and turn it answers
            if isinstance(ev, kind) and (ev.episode, ev.turn) == (job.episode, turn):  # pyright: ignore[reportAttributeAccessIssue]
                return ev
            if isinstance(ev, EpisodeAssigned):
                raise RuntimeError(f"{ev.episode} assigned while {job.episode} is running")
