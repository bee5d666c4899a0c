"""The policy's model core: score admissible actions or generate text with a causal LM, and
compute the log-probs a learner trains on.

Two ways to act, both recorded with token ids and log-probs:

- **score** (how small models act in text worlds, as in GLAM): every admissible action is
  scored by the sum of its token log-probs after the prompt, and one is sampled from the
  softmax of those scores over the candidates (divided by the temperature). The action's
  log-prob under the policy is that softmax's, so the learner's ratio is over actions.
- **generate** (real instruction-tuned LLMs): the response is sampled token by token; its
  log-prob is the sum of its tokens' (tempered) log-probs.

Scoring packs every request of a batch into the rows of one forward pass
(:mod:`agents.models.packing`): each candidate attends to its prompt and to itself only, at the
positions it would have after the prompt alone, so one forward pass scores every candidate
without repeating a prompt, and requests whose prompts begin alike share those places. The
output layer runs only at the places whose logits score a token (:func:`scored_logits`).

Every draw uses a uniform number from the request's own ``random.Random``, so what is sampled
does not depend on which requests shared a forward pass.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import math
import random
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from agents.events.policy import LAYOUTS
from agents.models.packing import Ids, Packed, pack, pack_rows

# model types whose causal LM computes its logits as ``lm_head(the base model's output)`` and
# nothing more (no soft-capping or scaling), so the head can be applied to the scored places only
HEAD_ONLY = frozenset({"qwen2", "qwen3", "llama", "mistral"})


def scored_logits(
    model: Any, packed: Packed, device: torch.device, *, layout: str = "kept"
) -> torch.Tensor:
    """The logits at every scored place, (N, V).

    Where the output layer runs, by ``layout`` (:data:`LAYOUTS`; "rows" packs one request per
    row, :func:`agents.models.packing.pack_rows`, the others :func:`agents.models.packing.pack`):

    - "kept": at the scored places only. For the model types in :data:`HEAD_ONLY` the head is
      applied to the decoder's output there; any other model is asked for those places
      (``logits_to_keep`` as a mask: the model applies its own soft-capping or scaling), and
      one whose ``forward`` does not take it runs its head everywhere.
    - "packed" (before 2026-12-05): as "kept" for :data:`HEAD_ONLY`, everywhere for others.
    - "rows" (before 2026-12-01): everywhere.

    The three give the same numbers up to float32 rounding; the older are kept to re-execute
    the updates of logs written with them bit for bit (a model outside :data:`HEAD_ONLY` took
    gigabytes for a large vocabulary at every place of every row).
    """
    kwargs = {
        "input_ids": packed.input_ids.to(device),
        "attention_mask": packed.attention.to(device),
        "position_ids": packed.positions.to(device),
        "use_cache": False,  # one pass: no key-value cache to build
    }
    rows, at = packed.rows.to(device), packed.at.to(device)
    if layout != "rows" and getattr(model.config, "model_type", None) in HEAD_ONLY:
        # the decoder and the head through their accessors, not ``.model`` and ``.lm_head``:
        # on a peft-adapted model ``.model`` is the whole causal LM, not its decoder
        hidden = model.get_decoder()(**kwargs).last_hidden_state  # (B, L, H)
        return model.get_output_embeddings()(hidden[rows, at])  # (N, V)
    if layout == "kept" and keeps_logits(model):
        keep = torch.zeros(packed.input_ids.shape, dtype=torch.bool, device=device)
        keep[rows, at] = True  # a place repeats when a prompt's last scores several candidates
        rank = keep.flatten().cumsum(0) - 1  # each kept place's row in the kept logits
        return kept_logits(model, kwargs, keep)[rank[rows * keep.shape[1] + at]]  # (N, V)
    return model(**kwargs).logits[rows, at]  # (B, L, V) -> (N, V)


def kept_logits(model: Any, kwargs: dict[str, Any], keep: torch.Tensor) -> torch.Tensor:
    """The model's logits at the places ``keep`` (B, L, bool) marks, (K, V) in row order:
    its forward pass with ``logits_to_keep`` as that mask (the head runs there only).

    Raises:
        ValueError: the model answered with logits of another shape (a ``forward`` that takes
            the keyword but not a mask).
    """
    kept = model(**kwargs, logits_to_keep=keep).logits
    if kept.dim() != 2 or kept.shape[0] != int(keep.sum()):
        raise ValueError(
            f"{type(model).__name__} answered logits_to_keep (a mask of {int(keep.sum())} "
            f"places) with logits of shape {tuple(kept.shape)}"
        )
    return kept


def keeps_logits(model: Any) -> bool:
    """Whether ``model``'s ``forward`` takes ``logits_to_keep`` (a peft-adapted model's: its
    base model's, to which it passes the keyword on)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _takes_logits_to_keep(type(base))


@functools.cache
def _takes_logits_to_keep(cls: type) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


def candidate_scores(
    model: Any, packed: Packed, device: torch.device, *, layout: str = "kept"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score packed candidates in one forward pass (with or without grad, as the caller's
    context decides); ``layout``: see :func:`scored_logits`.

    Returns:
        ``(scores, token_logp)``: the sum of token log-probs of every candidate, flat in
        request order (sum(counts),), and the log-prob of every candidate token (N,).
    """
    picked = scored_logits(model, packed, device, layout=layout)  # (N, V)
    token_logp = picked.float().log_softmax(-1).gather(1, packed.tokens.to(device)[:, None])[:, 0]
    scores = torch.zeros(sum(packed.counts), dtype=torch.float32, device=device)
    return scores.index_add(0, packed.owner.to(device), token_logp), token_logp


PROBE_PLACES = 2048
"""The longest prompt :func:`packed_scoring_fault` scores: a window longer than it (a real
model's of 4,096 positions, say) is not probed, and a prompt longer than that window would
score wrong unseen."""


@contextmanager
def _evaluating(model: Any) -> Generator[None]:
    """``model`` in eval mode without gradients for a check's forward passes, then back in
    the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def output_fault(model: Any, device: torch.device) -> str | None:
    """What is wrong with ``model``'s outputs, or None: a forward pass over a short prompt
    of random tokens must give finite logits. Weights holding NaN or inf (a damaged model
    directory or checkpoint) give NaN scores that would choose actions without a sign."""
    vocab = int(model.get_input_embeddings().num_embeddings)
    if vocab < 8:
        return None
    draw = random.Random(0)
    ids = torch.tensor([[draw.randrange(3, vocab) for _ in range(16)]], device=device)
    with _evaluating(model):
        logits = model(input_ids=ids).logits.float()
    if bool(torch.isfinite(logits).all()):
        return None
    bad = logits[~torch.isfinite(logits)][0].item()
    return (
        f"its forward pass gives a logit of {bad} on a 16-token prompt: its weights hold NaN "
        "or inf (a damaged model directory or checkpoint), or its outputs overflow float32"
    )


def packed_scoring_fault(model: Any, device: torch.device, pad_id: int) -> str | None:
    """What is wrong with scoring ``model``'s candidates packed (:func:`candidate_scores`), or
    None: packing replaces the model's own attention mask with a block mask, which is right
    for full causal attention only. A model that attends otherwise (a sliding window shorter
    than the prompt, local attention, a recurrent model that ignores the mask) scored wrong
    without a sign, and some architectures fail on the mask. Two requests whose prompts share
    a beginning, twice as long as any window the config names (up to :data:`PROBE_PLACES`),
    are scored packed and each candidate alone by the model's own forward pass; they must
    agree to float32 rounding (1e-4 nats).
    """
    config = getattr(model, "config", None)
    vocab = int(model.get_input_embeddings().num_embeddings)
    limit = getattr(config, "max_position_embeddings", None)
    limit = limit if isinstance(limit, int) and limit > 0 else 4096
    keys = ["attention_window", "window_size"]
    if getattr(config, "use_sliding_window", True) is not False:  # Qwen2's: named, not used
        keys.append("sliding_window")
    windows = [getattr(config, k, None) for k in keys]
    window = max([w for w in windows if isinstance(w, int) and w > 0] or [0])
    # twice the window, so that most of what a candidate would see lies outside it (16 places
    # past it changed a random model's scores by less than 1e-3); past PROBE_PLACES a window
    # is not probed: what one forward pass of a large model costs
    length = min(limit - 8, max(48, 2 * window + 16), PROBE_PLACES)
    if length < 8 or vocab < 8:
        return None
    draw = random.Random(0)
    prompt = [draw.randrange(3, vocab) for _ in range(length)]
    other = prompt[: length // 2] + [draw.randrange(3, vocab) for _ in range(length // 3)]
    cands = [[draw.randrange(3, vocab) for _ in range(n)] for n in (1, 3)]
    prompts, candidates = [prompt, other], [cands, cands]
    with _evaluating(model):
        try:
            packed, _ = candidate_scores(model, pack(prompts, candidates, pad_id), device)
        except Exception as exc:  # an architecture that cannot take the block mask
            said = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            return f"scoring candidates packed fails on this architecture ({said})"
        alone, top = [], 0.0
        for p, cs in zip(prompts, candidates, strict=True):
            for c in cs:
                ids = torch.tensor([[*p, *c]], device=device)
                # the logits of the candidate's places only (a large vocabulary's over
                # thousands of places would take gigabytes)
                out = model(input_ids=ids, logits_to_keep=len(c) + 1)
                logits = out.logits[0, -len(c) - 1 : -1].float()
                top = max(top, float(logits.abs().max()))
                logp = logits.log_softmax(-1)
                alone.append(sum(float(logp[t, tok]) for t, tok in enumerate(c)))
    worst = max(abs(float(a) - b) for a, b in zip(packed.tolist(), alone, strict=True))
    # float32 rounding: under 1e-6 here, at 48 to 2,048 places, for logits of ordinary size;
    # it grows with their size (logits in the tens of thousands round to 1e-3). NaN differs.
    if not worst <= 1e-4 + 1e-6 * top:
        return (
            f"scoring candidates packed differs from the model's own forward pass by up to "
            f"{worst:.3g} nats (a {length}-token prompt; its attention is not full causal "
            "attention: a sliding window, local attention or a recurrent model)"
        )
    return None


CANDIDATE_PLACES = 1024
"""The most candidate tokens of one request scored in one forward pass. A world that offers
thousands of actions would otherwise make one row of all of them, whose (L, L) attention grows
with the square of its width; its candidates are scored in chunks instead, each after the
prompt in a pass of its own, and the scores joined. Requests under it are scored as before,
in one pass, bit for bit.

With gradient (a learner), split passes are checkpointed (:func:`torch.utils.checkpoint.
checkpoint`): a pass keeps only its scores, and the backward pass runs each pass's forward
again, one at a time, so the activations held are one pass's, not every pass's, at the cost
of one more forward pass for those requests."""


def scores_in_passes(
    model: Any,
    prompts: Sequence[Ids],
    candidates: Sequence[Sequence[Ids]],
    pad_id: int,
    device: torch.device,
    *,
    layout: str = "kept",
    with_tokens: bool = True,
    budget: int | None = None,
) -> tuple[torch.Tensor, list[list[float]]]:
    """:func:`candidate_scores` of every request's candidates (with or without grad, as the
    caller's context decides), a request whose candidates take more than ``budget`` tokens
    split over passes of its own (a candidate never sees another, so the scores are those of
    one pass up to float rounding).

    Args:
        layout: how the pass lays requests out and where its output layer runs
            (:data:`LAYOUTS`, :func:`scored_logits`).
        with_tokens: also return each candidate's token log-probs (else empty lists).
        budget: candidate tokens per pass (None: :data:`CANDIDATE_PLACES`).

    Returns:
        The score of every candidate, flat in request order (sum of the candidate counts,),
        and the token log-probs of each candidate in the same order (floats, float64 from
        float32, with no grad).
    """
    budget = CANDIDATE_PLACES if budget is None else budget
    sizes = [sum(len(c) for c in cands) for cands in candidates]
    if all(size <= budget for size in sizes):  # every request in one pass, as always
        return _one_pass(model, prompts, candidates, pad_id, device, layout, with_tokens)
    small = [i for i, size in enumerate(sizes) if size <= budget]
    passes = [[(i, 0, len(candidates[i])) for i in small]] if small else []
    for i, size in enumerate(sizes):  # (request, first, end candidate) of each pass
        if size > budget:
            first = taken = 0
            for k, cand in enumerate(candidates[i]):
                if k > first and taken + len(cand) > budget:
                    passes.append([(i, first, k)])
                    first, taken = k, 0
                taken += len(cand)
            passes.append([(i, first, len(candidates[i]))])
    pieces: dict[tuple[int, int], tuple[torch.Tensor, list[list[float]]]] = {}
    for chunk in passes:
        flat, tokens = _one_pass(
            model,
            [prompts[i] for i, _, _ in chunk],
            [candidates[i][a:b] for i, a, b in chunk],
            pad_id,
            device,
            layout,
            with_tokens,
            recompute=torch.is_grad_enabled(),
        )
        at = 0
        for i, a, b in chunk:
            pieces[(i, a)] = (flat[at : at + b - a], tokens[at : at + b - a])
            at += b - a
    ordered = [pieces[key] for key in sorted(pieces)]
    return torch.cat([f for f, _ in ordered]), [t for _, toks in ordered for t in toks]


def _one_pass(
    model: Any,
    prompts: Sequence[Ids],
    candidates: Sequence[Sequence[Ids]],
    pad_id: int,
    device: torch.device,
    layout: str,
    with_tokens: bool,
    recompute: bool = False,
) -> tuple[torch.Tensor, list[list[float]]]:
    """:func:`candidate_scores` of one packing of every request, and each candidate's token
    log-probs (empty lists unless ``with_tokens``); with ``recompute``, checkpointed (the
    pass's activations are not kept for the backward pass, which runs its forward again).

    The packing is made inside the checkpointed call, from the token lists: a checkpoint keeps
    its arguments until the backward pass, and a :class:`~agents.models.packing.Packed`
    holds an (B, 1, L, L) float mask, so an update over a world offering thousands of actions
    (dozens of passes a request) held every pass's mask (hundreds of MB a request)."""
    if recompute:
        flat, token_logp, owner = checkpoint(
            _packed_scores, model, prompts, candidates, pad_id, device, layout,
            use_reentrant=False,
        )  # fmt: skip
    else:
        flat, token_logp, owner = _packed_scores(model, prompts, candidates, pad_id, device, layout)
    tokens: list[list[float]] = [[] for _ in range(len(flat))]
    if with_tokens:
        logps = token_logp.detach().double().cpu().tolist()
        for k, lp in zip(owner.tolist(), logps, strict=True):
            tokens[k].append(lp)
    return flat, tokens


def _packed_scores(
    model: Any,
    prompts: Sequence[Ids],
    candidates: Sequence[Sequence[Ids]],
    pad_id: int,
    device: torch.device,
    layout: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`candidate_scores` of the requests packed by ``layout``, and each scored token's
    candidate (``Packed.owner``)."""
    packed = (pack_rows if layout == "rows" else pack)(prompts, candidates, pad_id)
    return (*candidate_scores(model, packed, device, layout=layout), packed.owner)


def split_rows(flat: torch.Tensor, counts: Sequence[int]) -> list[torch.Tensor]:
    """Split a flat per-candidate tensor into one tensor per row."""
    return list(torch.split(flat, list(counts)))


def sample_index(scores: Sequence[float], temperature: float, u: float) -> tuple[int, float]:
    """Draw one index from ``softmax(scores / temperature)`` by inverting its CDF at ``u``.

    Args:
        scores: unnormalised log-scores.
        temperature: > 0 samples; 0 takes the first maximum (greedy).
        u: a uniform number in [0, 1) from the request's own stream.

    Returns:
        The index and its log-prob under the tempered softmax (under temperature 1 when greedy).

    Raises:
        ValueError: no scores, a negative temperature or ``u`` outside [0, 1).
    """
    if not scores:
        raise ValueError("no scores to sample from")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must be in [0, 1), got {u}")
    if temperature == 0:
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
        return best, log_softmax(scores, 1.0)[best]
    logps = log_softmax(scores, temperature)
    cdf: list[float] = []
    acc = 0.0
    for lp in logps:
        acc += math.exp(lp)
        cdf.append(acc)
    index = min(bisect.bisect_right(cdf, u * acc), len(scores) - 1)
    return index, logps[index]


def log_softmax(scores: Sequence[float], temperature: float) -> list[float]:
    """``log softmax(scores / temperature)`` in float64."""
    scaled = [s / temperature for s in scores]
    top = max(scaled)
    norm = top + math.log(sum(math.exp(s - top) for s in scaled))
    return [s - norm for s in scaled]


@dataclass(frozen=True, slots=True)
class Choice:
    """One scored decision: the chosen candidate and the numbers behind it."""

    index: int
    logp: float
    scores: tuple[float, ...]
    token_logps: tuple[float, ...]


def score_and_choose(
    model: Any,
    prompts: Sequence[Ids],
    candidates: Sequence[Sequence[Ids]],
    rngs: Sequence[random.Random],
    *,
    temperature: float,
    pad_id: int,
    device: torch.device,
) -> list[Choice]:
    """Score every request's candidates in one forward pass (more for a request with very
    many, :func:`scores_in_passes`) and draw one per request."""
    with torch.no_grad():
        flat, tokens = scores_in_passes(model, prompts, candidates, pad_id, device)
    by_candidate = [tuple(t) for t in tokens]
    counts = [len(c) for c in candidates]
    choices = []
    first = 0
    for row, scores in enumerate(split_rows(flat.double().cpu(), counts)):
        s = tuple(scores.tolist())
        index, logp = sample_index(s, temperature, rngs[row].random())
        choices.append(
            Choice(index=index, logp=logp, scores=s, token_logps=by_candidate[first + index])
        )
        first += counts[row]
    return choices


def chosen_action_logps(
    model: Any,
    prompts: Sequence[Ids],
    candidates: Sequence[Sequence[Ids]],
    choices: Sequence[int],
    *,
    temperature: float,
    pad_id: int,
    device: torch.device,
    layout: str = "kept",
) -> torch.Tensor:
    """Log-prob of each chosen candidate under the candidate softmax, with grad: (B, 1).

    ``layout`` (:data:`LAYOUTS`, :func:`scored_logits`): "kept", or "packed" and "rows" as
    coevo scored before, the same numbers up to float32 rounding, kept to re-execute the
    updates of logs written then bit for bit.

    Raises:
        ValueError: an unknown ``layout``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown scoring layout {layout!r}, expected one of {LAYOUTS}")
    flat, _ = scores_in_passes(
        model, prompts, candidates, pad_id, device, layout=layout, with_tokens=False
    )  # (sum(counts),)
    t = temperature if temperature > 0 else 1.0
    rows = split_rows(flat, [len(c) for c in candidates])
    out = [(row / t).log_softmax(0)[k] for row, k in zip(rows, choices, strict=True)]
    return torch.stack(out)[:, None]  # (B, 1)


def response_logps(
    model: Any,
    prompts: Sequence[Ids],
    responses: Sequence[Ids],
    *,
    temperature: float,
    pad_id: int,
    device: torch.device,
    layout: str = "kept",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of each response after its prompt, with grad.

    ``layout`` (:data:`LAYOUTS`): "kept" runs the output layer at the places that predict a
    response token only (for a model whose ``forward`` takes ``logits_to_keep``); the older
    layouts ran it at every place of every row, as their logs' updates re-execute.

    Returns:
        ``(logp, mask)``, both (B, T) with T the longest response; mask is 1 on real tokens.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    longest = max(len(r) for r in responses)
    batch = len(prompts)
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attn = torch.zeros((batch, width), dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[b, : len(p) + len(r)] = torch.tensor([*p, *r])
        attn[b, : len(p) + len(r)] = 1
    kwargs = {"input_ids": ids.to(device), "attention_mask": attn.to(device)}
    spans = [(len(p) - 1, len(r)) for p, r in zip(prompts, responses, strict=True)]
    if layout == "kept" and keeps_logits(model):
        keep = torch.zeros((batch, width), dtype=torch.bool, device=device)
        for b, (first, n) in enumerate(spans):
            keep[b, first : first + n] = True
        per_row = list(torch.split(kept_logits(model, kwargs, keep), [n for _, n in spans]))
    else:
        logits = model(**kwargs).logits  # (B, L, V)
        per_row = [logits[b, first : first + n] for b, (first, n) in enumerate(spans)]
    t = temperature if temperature > 0 else 1.0
    logp = torch.zeros((batch, longest), dtype=torch.float32, device=device)
    mask = torch.zeros((batch, longest), dtype=torch.float32, device=device)
    for b, (r, picked) in enumerate(zip(responses, per_row, strict=True)):
        n = len(r)
        rows = (picked.float() / t).log_softmax(-1)  # (n, V)
        logp[b, :n] = rows.gather(1, torch.tensor(r, device=device)[:, None])[:, 0]
        mask[b, :n] = 1.0
    return logp, mask


def generate(
    model: Any,
    prompts: Sequence[Ids],
    rngs: Sequence[random.Random],
    *,
    temperature: float,
    max_new_tokens: int,
    eos_ids: frozenset[int],
    pad_id: int,
    device: torch.device,
) -> list[tuple[list[int], list[float]]]:
    """Sample a response per prompt, token by token with a KV cache (prompts left-padded).

    Each token is drawn by inverting the tempered softmax's CDF at a uniform number from the
    row's own stream (greedy at temperature 0; its log-probs are then at temperature 1).

    Returns:
        Per prompt: the response ids (ending with the first of ``eos_ids`` it drew, unless cut
        at ``max_new_tokens``)
        and each token's log-prob under the sampling distribution.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    batch, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attn = torch.zeros((batch, width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :] = torch.tensor(list(p))
        attn[b, width - len(p) :] = 1
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    out: list[tuple[list[int], list[float]]] = [([], []) for _ in prompts]
    done = [False] * batch
    with torch.no_grad():
        last_only = {"logits_to_keep": 1} if keeps_logits(model) else {}
        step = model(  # the prompts: logits at their last place (a vocabulary's at every one
            input_ids=ids.to(device),  # of thousands took gigabytes)
            attention_mask=attn.to(device),
            position_ids=positions.to(device),
            use_cache=True,
            **last_only,
        )
        for _ in range(max_new_tokens):
            last = step.logits[:, -1].float()  # (B, V)
            nxt = [
                _draw(last[b], temperature, rngs[b], out[b]) if not done[b] else pad_id
                for b in range(batch)
            ]
            done = [d or n in eos_ids for d, n in zip(done, nxt, strict=True)]
            if all(done):
                break
            attn = torch.cat([attn, torch.ones((batch, 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
            step = model(
                input_ids=torch.tensor(nxt, device=device)[:, None],
                attention_mask=attn.to(device),
                position_ids=positions.to(device),
                cache=step.cache,
                use_cache=True,
            )
    return out


def _draw(
    logits: torch.Tensor, temperature: float, rng: random.Random, out: tuple[list[int], list[float]]
) -> int:
    """Draw one token from ``logits`` (V,) and append it and its log-prob to ``out``."""
    if temperature == 0:
        logp = logits.log_softmax(-1)
        token = int(logp.argmax())
    else:
        logp = (logits / temperature).log_softmax(-1)
        cdf = logp.double().exp().cumsum(0)
        token = int(torch.searchsorted(cdf, rng.random() * float(cdf[-1]), right=True))
        token = min(token, logits.shape[0] - 1)
    out[0].append(token)
    out[1].append(float(logp[token]))
    return token
