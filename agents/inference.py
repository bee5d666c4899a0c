"""The inference actor: batches the env workers' action requests into shared forward passes.

Requests (:class:`ActionRequested`) are committed events; the actor takes the first, waits up to
``batch_wait`` for more (at most ``batch_max``), answers them all from one forward pass with one
:class:`ActionSampled` each, and loads a new policy version when a :class:`PolicyUpdated`
arrives (between batches, so every answer names the version that produced it). Each request
carries its own seed, so what is sampled does not depend on how requests were batched.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import trio

from agents.policy import generate, score_and_choose
from agents.policy_events import ActionRequested, ActionSampled, PolicyUpdated
from agents.prompts import encode_prompt, encode_response
from engine.actor import Actor, Context
from engine.events import Envelope, Event
from stores.checkpoints import Checkpoints, load_weights


@dataclass(frozen=True)
class ActSettings:
    """How the policy acts (a scenario's ``[policy]`` section).

    Attributes:
        mode: "score" or "generate".
        temperature: sampling temperature (0: greedy).
        max_new_tokens: longest generated response.
        device: the torch device of the model.
    """

    mode: str = "score"
    temperature: float = 1.0
    max_new_tokens: int = 24
    device: torch.device = torch.device("cpu")  # noqa: RUF009 (immutable)


class PolicyRunner:
    """A model and tokenizer that answer batches of requests (blocking; run in a thread).

    Args:
        model: a causal LM in eval mode.
        tokenizer: its tokenizer (with a chat template and an eos token).
        settings: how to act.
        version: the policy version the weights are.
    """

    def __init__(self, model: Any, tokenizer: Any, settings: ActSettings, version: int = 0) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.version = version
        self._pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._responses: dict[str, list[int]] = {}  # action text -> ids (worlds repeat them)

    def response_ids(self, text: str) -> list[int]:
        """The token ids of ``text`` as a response, cached (a world's actions recur)."""
        ids = self._responses.get(text)
        if ids is None:
            if len(self._responses) >= 65_536:
                self._responses.clear()
            ids = self._responses[text] = encode_response(self.tokenizer, text)
        return ids

    def answer(self, requests: Sequence[ActionRequested]) -> list[ActionSampled]:
        """One :class:`ActionSampled` per request, from one forward pass (one per token in
        "generate" mode)."""
        prompts = [
            encode_prompt(self.tokenizer, [{"role": r, "content": c} for r, c in req.messages])
            for req in requests
        ]
        rngs = [random.Random(req.seed) for req in requests]
        if self.settings.mode == "score":
            return self._score(requests, prompts, rngs)
        return self._generate(requests, prompts, rngs)

    def _temperature(self, req: ActionRequested) -> float:
        return 0.0 if req.greedy else self.settings.temperature

    def _score(
        self,
        requests: Sequence[ActionRequested],
        prompts: list[list[int]],
        rngs: list[random.Random],
    ) -> list[ActionSampled]:
        cands = [[self.response_ids(a) for a in req.admissible] for req in requests]
        out: list[ActionSampled] = []
        # one temperature per forward pass; greedy and sampled requests rarely mix
        for temp in sorted({self._temperature(r) for r in requests}):
            idx = [i for i, r in enumerate(requests) if self._temperature(r) == temp]
            choices = score_and_choose(
                self.model,
                [prompts[i] for i in idx],
                [cands[i] for i in idx],
                [rngs[i] for i in idx],
                temperature=temp,
                pad_id=self._pad,
                device=self.settings.device,
            )
            for i, ch in zip(idx, choices, strict=True):
                req = requests[i]
                out.append(
                    ActionSampled(
                        episode=req.episode,
                        worker=req.worker,
                        turn=req.turn,
                        policy_version=self.version,
                        action=req.admissible[ch.index],
                        prompt_ids=tuple(prompts[i]),
                        response_ids=tuple(cands[i][ch.index]),
                        token_logps=ch.token_logps,
                        candidates=tuple(tuple(c) for c in cands[i]),
                        candidate_scores=ch.scores,
                        choice=ch.index,
                        logp=ch.logp,
                        temperature=temp,
                        mode="score",
                    )
                )
        order = {(r.episode, r.turn): k for k, r in enumerate(requests)}
        return sorted(out, key=lambda s: order[(s.episode, s.turn)])

    def _generate(
        self,
        requests: Sequence[ActionRequested],
        prompts: list[list[int]],
        rngs: list[random.Random],
    ) -> list[ActionSampled]:
        eos = self.tokenizer.eos_token_id
        out: list[ActionSampled] = []
        for temp in sorted({self._temperature(r) for r in requests}):
            idx = [i for i, r in enumerate(requests) if self._temperature(r) == temp]
            drawn = generate(
                self.model,
                [prompts[i] for i in idx],
                [rngs[i] for i in idx],
                temperature=temp,
                max_new_tokens=self.settings.max_new_tokens,
                eos_id=eos,
                pad_id=self._pad,
                device=self.settings.device,
            )
            for i, (ids, logps) in zip(idx, drawn, strict=True):
                req = requests[i]
                text = self.tokenizer.decode(ids, skip_special_tokens=True).strip()
                out.append(
                    ActionSampled(
                        episode=req.episode,
                        worker=req.worker,
                        turn=req.turn,
                        policy_version=self.version,
                        action=text,
                        prompt_ids=tuple(prompts[i]),
                        response_ids=tuple(ids),
                        token_logps=tuple(logps),
                        logp=sum(logps),
                        temperature=temp,
                        mode="generate",
                        valid=text in req.admissible,
                    )
                )
        order = {(r.episode, r.turn): k for k, r in enumerate(requests)}
        return sorted(out, key=lambda s: order[(s.episode, s.turn)])

    def load(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Replace the weights with ``state``, now policy ``version``."""
        load_weights(self.model, {k: v.to(self.settings.device) for k, v in state.items()})
        self.version = version


class InferenceActor(Actor):
    """Answers :class:`ActionRequested` in batches; follows :class:`PolicyUpdated`.

    Args:
        load: builds the :class:`PolicyRunner` (called in a worker thread at start).
        checkpoints: where new policy versions are read from.
        batch_max: most requests per forward pass.
        batch_wait: seconds to wait for more requests after the first.
    """

    subscribes = (ActionRequested, PolicyUpdated)

    def __init__(
        self,
        load: Callable[[], PolicyRunner],
        checkpoints: Checkpoints,
        *,
        batch_max: int = 16,
        batch_wait: float = 0.002,
    ) -> None:
        if batch_max < 1:
            raise ValueError(f"batch_max must be >= 1, got {batch_max}")
        self._load = load
        self._checkpoints = checkpoints
        self._batch_max = batch_max
        self._batch_wait = batch_wait
        self.batches: list[int] = []  # sizes, for statistics

    async def run(self, ctx: Context) -> None:
        runner = await ctx.to_thread(self._load)
        inbox = ctx.events()
        pending: Envelope[Event] | None = None
        closed = False
        while not closed:
            env = pending or await _next(inbox)
            pending = None
            if env is None:
                return
            if isinstance(env.event, PolicyUpdated):
                await self._update(ctx, runner, env.event)
                continue
            batch = [env]
            with trio.move_on_after(self._batch_wait):
                while len(batch) < self._batch_max:
                    more = await _next(inbox)
                    closed = more is None
                    if more is None or isinstance(more.event, PolicyUpdated):
                        pending = more
                        break
                    batch.append(more)
            await self._answer(ctx, runner, batch)

    async def _answer(
        self, ctx: Context, runner: PolicyRunner, batch: list[Envelope[Event]]
    ) -> None:
        requests = [env.event for env in batch]
        assert all(isinstance(r, ActionRequested) for r in requests)
        self.batches.append(len(batch))
        answers = await ctx.to_thread(runner.answer, requests)
        for env, answer in zip(batch, answers, strict=True):
            await ctx.emit(answer, cause=env.seq, corr=env.corr)

    async def _update(self, ctx: Context, runner: PolicyRunner, ev: PolicyUpdated) -> None:
        state = await ctx.to_thread(self._checkpoints.load, ev.checkpoint)
        await ctx.to_thread(runner.load, state, ev.policy_version)
        ctx.log.debug("policy loaded", version=ev.policy_version)


async def _next(inbox: Any) -> Envelope[Event] | None:
    try:
        return await inbox.__anext__()
    except StopAsyncIteration:
        return None
