"""The extractor actor: Complementary RL's second model, which writes the experience bank and is
trained on the credit its entries earn.

It answers :class:`ExtractionRequested` (a finished episode) and :class:`MergeRequested` (a
chunk of the bank) by generation, in batches, with one :class:`ExtractorCalled` each: the
prompt and response token ids and log-probs and the bank operations parsed from the response
(the memory actor applies them). On :class:`ExtractorGradientRequested` it makes one CISPO
update on the named calls' responses (:func:`extractor_step`), writes a checkpoint and emits
:class:`ExtractorUpdated`. Its weights are its own: it starts from a copy of a base model and
never shares parameters with the policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agents.acting.inference import refuse_non_finite_logps, write_replies
from agents.events.episodes import finished_attempts, live_attempts
from agents.events.extractor import (
    ExtractionRequested,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
    MergeRequested,
    Op,
)
from agents.events.policy import SCORING
from agents.learning.update import adamw, refuse_non_finite
from agents.memory.extraction import (
    MAX_CONTENT_CHARS,
    Add,
    Discard,
    ExtractOp,
    Merge,
    MergeOp,
    Parsed,
    Return,
    Rewrite,
    Update,
    parse_extraction,
    parse_merge,
    shown_ids,
    to_bank_ids,
    tried_operations,
)
from agents.methods.cispo import cispo_loss
from agents.models.backend import Backend, HfBackend
from agents.models.policy import response_logps
from agents.models.prompts import position_limit
from agents.models.tuning import (
    MemoryUse,
    deterministic_algorithms,
    learning_mode,
    memory_use,
    reset_peak,
    trainable,
)
from engine.actor import Actor, Context
from engine.errors import ModelUnavailable, ResumeDiverged
from engine.events import Envelope, Event
from stores.checkpoints import (
    Checkpoints,
    optimizer_tensors,
    param_digest,
    restore_checkpoint,
    trained_state,
)

Request = ExtractionRequested | MergeRequested


@dataclass(frozen=True)
class ExtractorSettings:
    """How the extractor writes (a scenario's ``[complementary]`` extractor keys).

    Attributes:
        temperature: sampling temperature of its responses.
        max_new_tokens: longest response.
        max_ops: operations kept per extraction.
        plain_add: read an extraction answer with no operation syntax at all as one ``add``
            of its text (a base model that writes notes, not operations, still fills the bank).
        device: the torch device of its model.
    """

    temperature: float = 1.0
    max_new_tokens: int = 64
    max_ops: int = 3
    plain_add: bool = True
    device: torch.device = torch.device("cpu")  # noqa: RUF009 (immutable)


class ExtractorModel:
    """The extractor's model, tokenizer and optimiser (blocking; run in a thread).

    Args:
        model: a causal LM (its own copy; the one trained).
        tokenizer: its tokenizer.
        settings: how it writes.
        backend: what samples its answers; None: ``HfBackend(model)``, which samples from the
            trained module itself (another backend must be given the weights after each update).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        settings: ExtractorSettings,
        *,
        backend: Backend | None = None,
    ) -> None:
        self.model = model.eval()
        self.backend = backend or HfBackend(self.model, settings.device)
        self.tokenizer = tokenizer
        self.settings = settings
        self.version = 0
        self.digest = ""  # of the current weights, once computed (the actor does at start)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.max_positions = position_limit(self.model)  # prompts past it lose their middle
        self.optimizer: torch.optim.Optimizer | None = None

    def optimiser(self, lr: float) -> torch.optim.Optimizer:
        """The AdamW optimiser, created on first use; ``lr`` applies from this step on."""
        self.optimizer = adamw(self.model, self.optimizer, lr)
        return self.optimizer

    def memory(self) -> MemoryUse:
        """What the trained state costs now."""
        return memory_use(self.model, self.optimizer, self.settings.device)

    def sync(self) -> None:
        """Give the backend the trained weights, unless it samples from the trained module."""
        if getattr(self.backend, "model", None) is not self.model:
            self.backend.load(trained_state(self.model))

    def answer(self, requests: Sequence[Request], calls: Sequence[str]) -> list[ExtractorCalled]:
        """One :class:`ExtractorCalled` per request, generated in one batch."""
        s = self.settings
        replies = write_replies(
            self.backend,
            self.tokenizer,
            requests,
            temperature=s.temperature,
            max_new_tokens=s.max_new_tokens,
            max_positions=self.max_positions,
        )
        out = []
        for req, call, reply in zip(requests, calls, replies, strict=True):
            refuse_non_finite_logps(reply.logps, f"call {call}", self.version, "extractor")
            text = reply.text
            if isinstance(req, ExtractionRequested):
                ids = [req.entry] if req.entry >= 0 else []
                parsed = parse_extraction(text, known_ids=shown_ids(len(ids)), max_ops=s.max_ops)
                if (
                    s.plain_add
                    and parsed.malformed
                    and 0 < len(text) <= MAX_CONTENT_CHARS
                    and not tried_operations(text)
                ):
                    note = "no operation syntax: read as one add"
                    parsed = Parsed((Add(text),), (*parsed.errors, note), False, "plain")
                task, source = "extract", req.episode
            else:
                ids = list(req.entries)
                parsed = parse_merge(text, chunk_ids=shown_ids(len(ids)))
                task, source = "merge", f"merge{req.step}"
            parsed = to_bank_ids(parsed, ids)
            out.append(
                ExtractorCalled(
                    call=call,
                    task=task,
                    source=source,
                    slot=req.slot,
                    prompt_ids=tuple(reply.prompt),
                    response_ids=tuple(reply.ids),
                    token_logps=tuple(reply.logps),
                    text=text,
                    temperature=s.temperature,
                    extractor_version=self.version,
                    ops=tuple(_op_triple(op) for op in parsed.ops),
                    errors=tuple(parsed.errors),
                    malformed=parsed.malformed,
                    prompt_cut=reply.cut,
                )
            )
        return out


@dataclass(frozen=True, slots=True)
class StepStats:
    samples: int
    loss: float
    grad_norm: float
    clip_frac: float


def extractor_step(
    ext: ExtractorModel,
    calls: Sequence[ExtractorCalled],
    req: ExtractorGradientRequested,
    layout: str = SCORING,
) -> StepStats:
    """One CISPO step on the calls' responses, each with advantage ``A(m) * w(m)``.

    Calls whose ``A(m) * w(m)`` is 0 (cooldown) or with no response tokens add nothing to the
    loss and are left out of the forward pass, but their tokens still count in the token mean
    (:func:`agents.methods.cispo.cispo_loss`'s ``tokens``). With none left there is no signal: no
    optimiser step, the weights (and AdamW's moments) are unchanged. The model stays in eval
    mode (dropout off), so the on-policy ratio is exactly 1. ``layout``: where the forward
    pass runs the output layer (:func:`agents.models.policy.response_logps`; the update's
    ``ExtractorUpdated.scoring``).
    """
    adv_of = {c: a * w for c, a, w in zip(req.calls, req.advantages, req.weights, strict=True)}
    batch = [c for c in calls if adv_of[c.call] != 0.0 and c.response_ids]
    if not batch:
        return StepStats(samples=0, loss=0.0, grad_norm=0.0, clip_frac=0.0)
    with deterministic_algorithms():  # as grpo_step: bit for bit with several threads too
        model, device = ext.model, ext.settings.device
        learning_mode(model)
        opt = ext.optimiser(req.lr)
        logp, mask = response_logps(
            model,
            [c.prompt_ids for c in batch],
            [c.response_ids for c in batch],
            temperature=batch[0].temperature,
            pad_id=ext.pad_id,
            device=device,
            layout=layout,
        )  # (B, T)
        old = torch.zeros_like(logp)
        for b, c in enumerate(batch):
            old[b, : len(c.token_logps)] = torch.tensor(c.token_logps, dtype=torch.float32)
        adv = torch.tensor([adv_of[c.call] for c in batch], dtype=torch.float32, device=device)
        tokens = sum(len(c.response_ids) for c in calls)  # sum_i |m_i| over the whole batch
        out = cispo_loss(
            logp, old, adv, mask, clip_low=req.clip_low, clip_high=req.clip_high, tokens=tokens
        )
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable(model), req.max_grad_norm)
        refuse_non_finite("extractor", req.update, out.loss, grad_norm)
        opt.step()
    return StepStats(len(batch), float(out.loss.detach()), float(grad_norm), out.clip_frac)


class ExtractorActor(Actor):
    """Writes bank operations for finished episodes and merge chunks; trains on credit.

    Each checkpoint holds the optimiser's state too, so a resumed run (:meth:`recover`)
    continues from the newest version the log names with the moments it had.

    Args:
        load: builds the :class:`ExtractorModel` (called in a worker thread at start).
        checkpoints: where its versions are written.
        batch_max: most requests answered together.
        batch_wait: seconds to wait for more requests after the first.
    """

    subscribes = (
        ExtractionRequested,
        MergeRequested,
        ExtractorCalled,
        ExtractorGradientRequested,
        ExtractorUpdated,
    )

    def __init__(
        self,
        load: Callable[[], ExtractorModel],
        checkpoints: Checkpoints,
        *,
        batch_max: int = 16,
        batch_wait: float = 0.002,
    ) -> None:
        self._load = load
        self._checkpoints = checkpoints
        self._batch_max = batch_max
        self._batch_wait = batch_wait
        self._ext: ExtractorModel | None = None  # set by recover
        self._calls: dict[str, ExtractorCalled] = {}  # every call (an update names some)
        self._committed = 0  # the newest version whose ExtractorUpdated came back from the log
        self._backlog: list[Envelope[Event]] = []  # what a resumed run still owes, in order

    async def run(self, ctx: Context) -> None:
        ext = self._ext or await ctx.to_thread(self._load)
        if not ext.digest:
            ext.digest = await ctx.to_thread(param_digest, ext.model)
        for k in range(0, len(self._backlog), self._batch_max):  # in order, batched as live
            await self._serve(ctx, ext, self._backlog[k : k + self._batch_max])
        self._backlog = []
        inbox = ctx.events()
        async for first in inbox:
            batch, _ = await inbox.gather(first, self._batch_max, self._batch_wait)
            await self._serve(ctx, ext, batch)

    async def recover(self, ctx: Context, history: Sequence[Envelope[Event]]) -> None:
        """Fold the log's calls, load the newest version it names (weights and optimiser),
        and owe :meth:`run` every request and update the log does not answer. On resume, an
        extraction request of an attempt that did not finish is not owed: its episode is
        abandoned and played again. Restarted mid-run (``ctx.attempt > 0``: its process was
        lost, ``ActorSpec.recover_on_restart``), one of an attempt still running is owed too:
        that episode waits for the answer (:func:`agents.events.episodes.live_attempts`).

        Raises:
            ResumeDiverged: the newest checkpoint the log names is missing, damaged, not the
                version the log says (its weights' digest), or without its optimiser state.
        """
        latest: ExtractorUpdated | None = None
        done: set[int] = set()
        for env in history:
            ev = env.event
            if isinstance(ev, ExtractorCalled):
                self._calls[ev.call] = ev
            elif isinstance(ev, ExtractorUpdated):
                latest = ev
                done.add(ev.update)
        of_attempt = live_attempts(history) if ctx.attempt else finished_attempts(history)
        for env in history:
            ev = env.event
            if isinstance(ev, ExtractorGradientRequested):
                owed = ev.update not in done
            elif isinstance(ev, ExtractionRequested):
                owed = call_id(env.seq) not in self._calls and of_attempt(ev.episode, env.seq)
            else:
                owed = isinstance(ev, MergeRequested) and call_id(env.seq) not in self._calls
            if owed:
                self._backlog.append(env)
        ext = await ctx.to_thread(self._load)
        if latest is not None:
            try:
                await ctx.to_thread(self._restore, ext, latest)
            except ModelUnavailable as exc:
                raise ResumeDiverged(f"the extractor cannot resume: {exc}") from None
            self._committed = latest.extractor_version
            ctx.log.info("extractor rebuilt", version=ext.version, owed=len(self._backlog))
        self._ext = ext

    def _restore(self, ext: ExtractorModel, latest: ExtractorUpdated) -> None:
        restore_checkpoint(
            self._checkpoints, latest.checkpoint, ext.model, ext.optimiser(0.0), latest.digest
        )
        ext.version = latest.extractor_version
        ext.digest = latest.digest
        ext.sync()

    async def _serve(self, ctx: Context, ext: ExtractorModel, batch: list[Envelope[Event]]) -> None:
        """Answer the batch's requests together (with the weights as they are), then fold its
        calls and make its updates, in order."""
        requests = [env for env in batch if isinstance(env.event, Request)]
        if requests:
            await self._answer(ctx, ext, requests)
        for env in batch:
            ev = env.event
            if isinstance(ev, ExtractorCalled):
                self._calls[ev.call] = ev
            elif isinstance(ev, ExtractorUpdated):
                self._committed = ev.extractor_version
            elif isinstance(ev, ExtractorGradientRequested):
                await self._update(ctx, ext, ev)

    async def _answer(self, ctx: Context, ext: ExtractorModel, envs: list[Envelope[Event]]) -> None:
        requests = [env.event for env in envs]
        ids = [call_id(env.seq) for env in envs]
        answers = await ctx.to_thread(ext.answer, requests, ids)
        for env, answer in zip(envs, answers, strict=True):
            await ctx.emit(answer, cause=env.seq, corr=env.corr)

    async def _update(
        self, ctx: Context, ext: ExtractorModel, req: ExtractorGradientRequested
    ) -> None:
        start = time.perf_counter()
        chosen = [self._calls[c] for c in req.calls]
        reset_peak(ext.settings.device)
        stats = await ctx.to_thread(extractor_step, ext, chosen, req, SCORING)
        memory = ext.memory()
        await ctx.to_thread(ext.sync)
        ext.version += 1
        name = await ctx.to_thread(self._save, ext, req.lr)
        digest = await ctx.to_thread(param_digest, ext.model)
        parent, ext.digest = ext.digest, digest
        await ctx.emit(
            ExtractorUpdated(
                extractor_version=ext.version,
                update=req.update,
                samples=stats.samples,
                loss=stats.loss,
                grad_norm=stats.grad_norm,
                clip_frac=stats.clip_frac,
                digest=digest,
                checkpoint=name,
                seconds=time.perf_counter() - start,
                parent_digest=parent,
                trainable_params=memory.trainable_params,
                total_params=memory.total_params,
                optimizer_bytes=memory.optimizer_bytes,
                peak_bytes=memory.peak_bytes,
                scoring=SCORING,
            )
        )

    def _save(self, ext: ExtractorModel, lr: float) -> str:
        """Write the current version with the optimiser's state; keep every version the log
        may still name as its newest (blocking)."""
        moments = optimizer_tensors(ext.model, ext.optimiser(lr))
        return self._checkpoints.save(
            ext.version, ext.model, ext.tokenizer, moments, protect_from=self._committed
        )


def call_id(seq: int) -> str:
    """The id of the extractor call answering the request at ``seq``."""
    return f"x{seq}"


def _op_triple(op: ExtractOp | MergeOp) -> Op:
    """An operation of :mod:`agents.memory.extraction` as the ``(op, ids, content)`` the log
    keeps."""
    if isinstance(op, Add):
        return ("add", (), op.content)
    if isinstance(op, Update | Merge):
        return ("update" if isinstance(op, Update) else "merge", tuple(op.ids), op.content)
    if isinstance(op, Rewrite):
        return ("rewrite", (op.id,), op.content)
    if isinstance(op, Discard):
        return ("discard", tuple(op.ids), "")
    assert isinstance(op, Return)
    return ("return", (), "")
