"""The inference actor: batches the env workers' action requests into shared forward passes.

Requests (:class:`ActionRequested`) are committed events; the actor takes the first, waits up to
``batch_wait`` for more (at most ``batch_max``), answers them all from one forward pass with one
:class:`ActionSampled` each, and loads a new policy version when a :class:`PolicyUpdated`
arrives (after the batches in flight are answered and before the next starts, so every answer
names the version that produced it). Each request carries its own seed, so what is sampled does
not depend on how requests were batched.

Up to ``in_flight`` batches run at once, each in its own worker thread: while one batch is in
its forward pass, the workers it does not hold step their worlds and the next batch gathers and
starts on another core. The forward passes share the model's weights (read only) and the
tokenizer is used by one thread at a time.

EMPO2's reflections (:class:`ReflectionRequested`) are answered here too, by generation, with
one :class:`TipProposed` each: the tip is written by the same policy that acts.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import torch
import trio

from agents.events.episodes import finished_attempts
from agents.events.memory import ReflectionRequested, TipProposed
from agents.events.policy import ActionRequested, ActionSampled, PolicyUpdated
from agents.models.backend import Backend, HfBackend
from agents.models.prompts import (
    MemoryPlace,
    PromptEncoder,
    cut_gap,
    cut_middle,
    decode_response,
    encode_response,
    end_ids,
    from_pairs,
    position_limit,
    prompt_room,
    scoring_room,
    strip_tips,
)
from engine.actor import Actor, Context, task_nursery
from engine.errors import CoevoError
from engine.events import Envelope, Event
from stores.checkpoints import Checkpoints


@dataclass(frozen=True)
class ActSettings:
    """How the policy acts (a scenario's ``[policy]`` section).

    Attributes:
        mode: "score" or "generate".
        temperature: sampling temperature (0: greedy).
        max_new_tokens: longest generated response.
        tip_tokens: longest reflection (EMPO2's tip).
        tip_temperature: sampling temperature of reflections (0: greedy).
        device: the torch device of the model.
        memory: the message of a prompt its tips were appended to (``[prompt] memory``): where
            they are removed from for the off-policy (distillation) prompt.
    """

    mode: str = "score"
    temperature: float = 1.0
    max_new_tokens: int = 24
    tip_tokens: int = 64
    tip_temperature: float = 0.0
    device: torch.device = torch.device("cpu")  # noqa: RUF009 (immutable)
    memory: MemoryPlace = "user"


class Written(Protocol):
    """A request for free text: its prompt as ``(role, content)`` pairs and its own seed."""

    @property
    def messages(self) -> tuple[tuple[str, str], ...]: ...

    @property
    def seed(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Reply:
    """Generated free text: the prompt's ids (cut to fit, see :func:`cut_middle`), the
    response's ids, log-probs and text, and how many prompt tokens the cut left out."""

    prompt: list[int]
    ids: list[int]
    logps: list[float]
    text: str
    cut: int = 0


def write_replies(
    backend: Backend,
    tokenizer: Any,
    requests: Sequence[Written],
    *,
    temperature: float,
    max_new_tokens: int,
    max_positions: int | None = None,
    lock: AbstractContextManager[Any] | None = None,
) -> list[Reply]:
    """Generate one reply per request in one batch, each from the request's own seed (the
    policy's reflections, the extractor's answers); ``lock`` is held while the tokenizer is
    used (not while the model generates). With ``max_positions``, a prompt that would leave
    less than ``max_new_tokens`` of it loses its middle (:func:`cut_middle`)."""
    lock = lock or nullcontext()
    with lock:
        prompts = PromptEncoder(tokenizer).encode([from_pairs(req.messages) for req in requests])
        gap = cut_gap(tokenizer) if max_positions is not None else []
    cuts = [0] * len(prompts)
    if max_positions is not None:
        room = prompt_room(max_positions, max_new_tokens)
        for i, prompt in enumerate(prompts):
            prompts[i], cuts[i] = cut_middle(prompt, room, gap)
    drawn = backend.generate(
        prompts,
        [random.Random(req.seed) for req in requests],
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        eos_ids=end_ids(tokenizer),
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
    )
    with lock:
        return [
            Reply(prompt, ids, logps, decode_response(tokenizer, ids).strip(), cut)
            for prompt, (ids, logps), cut in zip(prompts, drawn, cuts, strict=True)
        ]


class PolicyNotFinite(CoevoError):
    """The policy's (or the extractor's) forward pass gave a log-probability that is not a
    number (NaN) or not finite: nothing is recorded from it and the run fails (exit 1),
    rather than acting on NaN scores (the last action always chosen) for a whole run."""

    exit_code = 1


def refuse_non_finite_logps(
    logps: Sequence[float], what: str, version: int, model: str = "policy"
) -> None:
    """Raise :class:`PolicyNotFinite` unless every value of ``logps`` (an answer's log-probs,
    for ``what``, by ``model``: the policy or the extractor) is finite."""
    bad = next((x for x in logps if not math.isfinite(x)), None)
    if bad is None:
        return
    raise PolicyNotFinite(
        f"the {model} (version {version}) gave a log-probability of {bad} for {what}: its "
        "weights hold NaN or inf (a damaged model directory or checkpoint) or its logits "
        "overflow float32; nothing was recorded from it"
    )


class PolicyRunner:
    """A model and tokenizer that answer batches of requests (blocking; run in a thread).

    Several threads may answer batches at once: the tokenizer (and the caches around it) is
    used under a lock, the forward passes run unlocked. :meth:`load` must not run while a batch
    is being answered (the inference actor waits for the batches in flight).

    A prompt never takes the model past the positions it was built for: one that would leave
    too little room for its response (the longest admissible action in "score" mode,
    ``max_new_tokens`` in "generate" mode, ``tip_tokens`` for a reflection) loses its middle
    (:func:`agents.models.prompts.cut_middle`), and its event says how many tokens
    (``prompt_cut``); an admissible action longer than half the positions is scored by its
    first half. A world's 20,000-character observation is read, cut, instead of taking the
    run's memory.

    Args:
        model: a causal LM in eval mode, sampled through the in-process ``"hf"`` backend unless
            ``backend`` is given.
        tokenizer: its tokenizer (with a chat template and an eos token).
        settings: how to act.
        version: the policy version the weights are.
        backend: what samples (:mod:`agents.models.backend`); None: ``HfBackend(model)``.
        max_positions: the most positions a prompt and its response may take; None: the
            model config's ``max_position_embeddings`` (no limit when it has none).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        settings: ActSettings,
        version: int = 0,
        *,
        backend: Backend | None = None,
        max_positions: int | None = None,
    ) -> None:
        self.model = model
        self.backend = backend or HfBackend(model, settings.device)
        self.tokenizer = tokenizer
        self.settings = settings
        self.version = version
        self.max_positions = max_positions if max_positions is not None else position_limit(model)
        self.prompts_cut = 0  # prompts that lost their middle so far
        self.alike: tuple[str, str] | None = None  # two actions the tokenizer encodes alike
        self._pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._ends = end_ids(tokenizer)
        self._prompts = PromptEncoder(tokenizer, settings.memory)
        self._gap = cut_gap(tokenizer) if self.max_positions is not None else []
        self._responses: dict[str, list[int]] = {}  # action text -> ids (worlds repeat them)
        self._tokenizing = threading.Lock()

    def _response_ids(self, text: str) -> list[int]:
        """The token ids of ``text`` as a response, cached (a world's actions recur); called
        with the tokenizer's lock held."""
        ids = self._responses.get(text)
        if ids is None:
            if len(self._responses) >= 65_536:
                self._responses.clear()
            ids = self._responses[text] = encode_response(self.tokenizer, text)
        return ids

    def answer(self, requests: Sequence[ActionRequested]) -> list[ActionSampled]:
        """One :class:`ActionSampled` per request, in request order, from one forward pass per
        temperature (one per token in "generate" mode); every prompt of the batch, and every
        prompt without its tips, tokenized in one call."""
        score = self.settings.mode == "score"
        with self._tokenizing:
            encoded = self._prompts.encode(
                [from_pairs(r.messages) for r in requests], [r.tips for r in requests]
            )
            cands = [
                [self._response_ids(a) for a in r.admissible] if score else [] for r in requests
            ]
        if score and self.alike is None:
            self.alike = _encoded_alike(requests, cands)
        rooms = [self._room(c) for c in cands]
        cuts = [0] * len(requests)
        for i, room in enumerate(rooms):
            if room is not None:
                encoded[i], cuts[i] = cut_middle(encoded[i], room, self._gap)
        out: list[ActionSampled | None] = [None] * len(requests)
        temperature = [0.0 if r.greedy else self.settings.temperature for r in requests]
        # one temperature per forward pass; greedy and sampled requests rarely mix
        for temp in sorted(set(temperature)):
            idx = [i for i, t in enumerate(temperature) if t == temp]
            group = [requests[i] for i in idx]
            prompts = [encoded[i] for i in idx]
            rngs = [random.Random(req.seed) for req in group]
            if score:
                answers = self._score(group, prompts, [cands[i] for i in idx], rngs, temp)
            else:
                answers = self._generate(group, prompts, rngs, temp)
            for i, answer in zip(idx, answers, strict=True):
                out[i] = msgspec.structs.replace(answer, prompt_cut=cuts[i]) if cuts[i] else answer
        with self._tokenizing:  # batches in flight answer in several threads
            self.prompts_cut += sum(1 for c in cuts if c)
        answers = [a for a in out if a is not None]
        for a in answers:
            refuse_non_finite_logps(
                (a.logp, *a.token_logps, *(a.candidate_scores or ())),
                f"episode {a.episode}'s turn {a.turn}",
                self.version,
            )
        return self._with_bare_prompts(requests, answers, rooms)

    def _room(self, cands: list[list[int]]) -> int | None:
        """The most prompt tokens a request may take, given its candidates ("score" mode; cut
        in place to half the positions each) or ``max_new_tokens``; None: no limit."""
        limit = self.max_positions
        if limit is None:
            return None
        if self.settings.mode != "score":
            return prompt_room(limit, self.settings.max_new_tokens)
        cands[:], room = scoring_room(cands, limit)
        return room

    def _with_bare_prompts(
        self,
        requests: Sequence[ActionRequested],
        answers: list[ActionSampled],
        rooms: Sequence[int | None],
    ) -> list[ActionSampled]:
        """``answers`` with the prompt ids of each tipped request without its tips (cut to the
        same room as the prompt with them)."""
        tipped = [i for i, req in enumerate(requests) if req.tips]
        memory = self.settings.memory
        with self._tokenizing:
            bare = self._prompts.encode(
                [
                    strip_tips(from_pairs(requests[i].messages), requests[i].tips, memory)
                    for i in tipped
                ]
            )
        for i, ids in zip(tipped, bare, strict=True):
            room = rooms[i]
            if room is not None:
                ids, _ = cut_middle(ids, room, self._gap)
            answers[i] = msgspec.structs.replace(answers[i], bare_prompt_ids=tuple(ids))
        return answers

    def reflect(self, requests: Sequence[ReflectionRequested]) -> list[TipProposed]:
        """One :class:`TipProposed` per request, in request order, generated in one batch."""
        temp = self.settings.tip_temperature
        replies = write_replies(
            self.backend,
            self.tokenizer,
            requests,
            temperature=temp,
            max_new_tokens=self.settings.tip_tokens,
            max_positions=self.max_positions,
            lock=self._tokenizing,
        )
        with self._tokenizing:
            self.prompts_cut += sum(1 for reply in replies if reply.cut)
        for req, reply in zip(requests, replies, strict=True):
            refuse_non_finite_logps(reply.logps, f"episode {req.episode}'s tip", self.version)
        return [
            TipProposed(
                episode=req.episode,
                slot=req.slot,
                key=req.key,
                score=req.score,
                text=reply.text,
                prompt_ids=tuple(reply.prompt),
                response_ids=tuple(reply.ids),
                token_logps=tuple(reply.logps),
                temperature=temp,
                policy_version=self.version,
                prompt_cut=reply.cut,
            )
            for req, reply in zip(requests, replies, strict=True)
        ]

    def _score(
        self,
        requests: Sequence[ActionRequested],
        prompts: list[list[int]],
        cands: list[list[list[int]]],
        rngs: list[random.Random],
        temp: float,
    ) -> list[ActionSampled]:
        choices = self.backend.score(prompts, cands, rngs, temperature=temp, pad_id=self._pad)
        return [
            _sampled(
                req,
                self.version,
                temp,
                prompt,
                req.admissible[ch.index],
                cand[ch.index],
                ch.token_logps,
                ch.logp,
                candidates=tuple(tuple(c) for c in cand),
                candidate_scores=ch.scores,
                choice=ch.index,
                mode="score",
            )
            for req, prompt, cand, ch in zip(requests, prompts, cands, choices, strict=True)
        ]

    def _generate(
        self,
        requests: Sequence[ActionRequested],
        prompts: list[list[int]],
        rngs: list[random.Random],
        temp: float,
    ) -> list[ActionSampled]:
        drawn = self.backend.generate(
            prompts,
            rngs,
            temperature=temp,
            max_new_tokens=self.settings.max_new_tokens,
            eos_ids=self._ends,
            pad_id=self._pad,
        )
        out = []
        for req, prompt, (ids, logps) in zip(requests, prompts, drawn, strict=True):
            with self._tokenizing:
                text = decode_response(self.tokenizer, ids).strip()
            out.append(
                _sampled(
                    req,
                    self.version,
                    temp,
                    prompt,
                    text,
                    ids,
                    tuple(logps),
                    sum(logps),
                    mode="generate",
                    valid=text in req.admissible,
                )
            )
        return out

    def load(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Replace the weights (or the adapters) with ``state``, now policy ``version``."""
        self.backend.load(state)
        self.version = version


class InferenceActor(Actor):
    """Answers :class:`ActionRequested` in batches; follows :class:`PolicyUpdated`.

    Args:
        load: builds the :class:`PolicyRunner` (called in a worker thread at start).
        checkpoints: where new policy versions are read from.
        batch_max: most requests per forward pass.
        batch_wait: seconds to wait for more requests after the first.
        in_flight: most batches answered at once (each in its own worker thread).
    """

    subscribes = (ActionRequested, ReflectionRequested, PolicyUpdated)

    def __init__(
        self,
        load: Callable[[], PolicyRunner],
        checkpoints: Checkpoints,
        *,
        batch_max: int = 16,
        batch_wait: float = 0.002,
        in_flight: int = 1,
    ) -> None:
        if batch_max < 1:
            raise ValueError(f"batch_max must be >= 1, got {batch_max}")
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        self._load = load
        self._checkpoints = checkpoints
        self._batch_max = batch_max
        self._batch_wait = batch_wait
        self._in_flight = in_flight
        self.batches: list[int] = []  # sizes, for statistics
        self._runner: PolicyRunner | None = None
        self._owed: list[Envelope[Event]] = []  # a resumed run's unanswered reflections
        self._cut_told = False  # whether the first cut prompt was logged
        self._alike_told = False  # whether actions the tokenizer encodes alike were logged

    async def recover(self, ctx: Context, history: Sequence[Envelope[Event]]) -> None:
        """Load the newest policy version the log names, and owe an answer to each reflection
        of a finished episode that has none (an action request without its answer belongs to
        an episode the resumed run abandons and re-runs)."""
        latest: PolicyUpdated | None = None
        answered: set[int | None] = set()
        for env in history:
            if isinstance(env.event, PolicyUpdated):
                latest = env.event
            elif isinstance(env.event, TipProposed):
                answered.add(env.cause)
        of_finished = finished_attempts(history)
        self._owed = [
            env
            for env in history
            if isinstance(env.event, ReflectionRequested)
            and env.seq not in answered
            and of_finished(env.event.episode, env.seq)
        ]
        runner = await ctx.to_thread(self._load)
        if latest is not None:
            await self._update(ctx, runner, latest)
        self._runner = runner

    async def run(self, ctx: Context) -> None:
        runner = self._runner or await ctx.to_thread(self._load)
        if self._in_flight > 1 and rope_changes_in_forward(getattr(runner, "model", None)):
            ctx.log.warning(
                "one batch at a time: the model's rotary embedding changes in its forward pass",
                batches_in_flight=self._in_flight,
            )
            self._in_flight = 1
        for k in range(0, len(self._owed), self._batch_max):  # in order, batched as live
            await self._answer(ctx, runner, self._owed[k : k + self._batch_max])
        self._owed = []
        inbox = ctx.events()
        slots = trio.Semaphore(self._in_flight)
        pending: Envelope[Event] | None = None
        async with task_nursery() as batches:
            while True:
                env = pending or await _next(inbox)
                pending = None
                if env is None:
                    return
                if isinstance(env.event, PolicyUpdated):
                    for _ in range(self._in_flight):  # every batch in flight answered
                        await slots.acquire()
                    await self._update(ctx, runner, env.event)
                    for _ in range(self._in_flight):
                        slots.release()
                    continue
                await slots.acquire()  # requests queue meanwhile: the next batch takes them
                batch, pending = await inbox.gather(
                    env, self._batch_max, self._batch_wait, stop=_is_update
                )
                batches.start_soon(self._answer_then_release, ctx, runner, batch, slots)

    async def _answer_then_release(
        self,
        ctx: Context,
        runner: PolicyRunner,
        batch: list[Envelope[Event]],
        slots: trio.Semaphore,
    ) -> None:
        try:
            await self._answer(ctx, runner, batch)
        finally:
            slots.release()

    async def _answer(
        self, ctx: Context, runner: PolicyRunner, batch: list[Envelope[Event]]
    ) -> None:
        acts = [env for env in batch if isinstance(env.event, ActionRequested)]
        reflections = [env for env in batch if isinstance(env.event, ReflectionRequested)]
        self.batches.append(len(batch))
        answered: list[ActionSampled | TipProposed] = []
        if acts:
            answers = await ctx.to_thread(runner.answer, [env.event for env in acts])
            for env, answer in zip(acts, answers, strict=True):
                await ctx.emit(answer, cause=env.seq, corr=env.corr)
            answered += answers
        if reflections:
            tips = await ctx.to_thread(runner.reflect, [env.event for env in reflections])
            for env, tip in zip(reflections, tips, strict=True):
                await ctx.emit(tip, cause=env.seq, corr=env.corr)
            answered += tips
        alike = getattr(runner, "alike", None)  # a runner of another kind may not tell
        if alike is not None and not self._alike_told:
            self._alike_told = True
            ctx.log.warning(
                "the tokenizer encodes two different actions alike, so the policy cannot tell "
                "them apart (scored alike, chosen alike often): a tokenizer that loses "
                "characters or words",
                actions=list(alike),
            )
        cut = next((a for a in answered if a.prompt_cut), None)
        if cut is not None and not self._cut_told:
            self._cut_told = True
            ctx.log.warning(
                "prompts too long for the model lose their middle (prompt_cut in their events)",
                max_positions=runner.max_positions,
                episode=cut.episode,
                tokens_cut=cut.prompt_cut,
            )

    async def _update(self, ctx: Context, runner: PolicyRunner, ev: PolicyUpdated) -> None:
        state = await ctx.to_thread(self._checkpoints.load, ev.checkpoint)
        await ctx.to_thread(runner.load, state, ev.policy_version)
        ctx.log.debug("policy loaded", version=ev.policy_version)


_CHANGING_ROPE = frozenset({"dynamic", "longrope"})
"""Rotary embeddings that ``transformers`` recomputes, in the module, during a forward pass
(by the sequence length): two batches in flight at once would race on them."""


def rope_changes_in_forward(model: Any) -> bool:
    """Whether ``model``'s rotary embedding changes its own state in a forward pass."""
    config = getattr(model, "config", None)
    found: list[Any] = []
    for name in ("rope_parameters", "rope_scaling"):
        _rope_types(getattr(config, name, None), found)
    return any(t in _CHANGING_ROPE for t in found)


def _rope_types(params: Any, found: list[Any]) -> None:
    if isinstance(params, dict):
        for key, value in params.items():
            if key in ("rope_type", "type"):
                found.append(value)
            else:
                _rope_types(value, found)


def _encoded_alike(
    requests: Sequence[ActionRequested], cands: Sequence[Sequence[list[int]]]
) -> tuple[str, str] | None:
    """Two different admissible actions of one request whose token ids are the same, or None."""
    for request, ids in zip(requests, cands, strict=True):
        seen: dict[tuple[int, ...], str] = {}
        for action, tokens in zip(request.admissible, ids, strict=True):
            other = seen.setdefault(tuple(tokens), action)
            if other != action:
                return other, action
    return None


def _is_update(ev: Event) -> bool:
    return isinstance(ev, PolicyUpdated)


async def _next(inbox: Any) -> Envelope[Event] | None:
    try:
        return await inbox.__anext__()
    except StopAsyncIteration:
        return None


def _sampled(
    req: ActionRequested,
    version: int,
    temp: float,
    prompt: list[int],
    action: str,
    response: Sequence[int],
    token_logps: tuple[float, ...],
    logp: float,
    **extra: Any,
) -> ActionSampled:
    return ActionSampled(
        episode=req.episode,
        worker=req.worker,
        turn=req.turn,
        policy_version=version,
        action=action,
        prompt_ids=tuple(prompt),
        response_ids=tuple(response),
        token_logps=token_logps,
        logp=logp,
        temperature=temp,
        **extra,
    )
