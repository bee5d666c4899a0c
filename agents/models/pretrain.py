"""Supervised training of the local models, shared by the embedded policy model
(:mod:`agents.models.embedded`) and the extractor's operation stage
(:mod:`agents.models.extractor_base`):
samples, length-bucketed batches, the loss, the learning-rate schedule, the training loop, and
the locked, atomic build cache both keep their models in.

Pure but for :func:`train` (which updates a model in place) and :func:`cached_build` (the
shell: files, a lock, a temporary directory renamed into place).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import structlog
import torch
from transformers.utils import logging as hf_logging

from agents.models.specs import TrainSpec
from agents.models.tuning import torch_threads
from engine.errors import ModelUnavailable
from stores.checkpoints import share_as_umask

BUCKET = 8
"""Batches drawn together and grouped by length, so that little of a batch is padding."""


Progress = Callable[[int, int, float], None]
"""Called as ``progress(step, steps, loss)`` after each training step."""


class Sample(NamedTuple):
    """One training pair; ``kind`` is ``"turn"`` or ``"reflection"``."""

    kind: str
    prompt: tuple[int, ...]
    response: tuple[int, ...]


def reflection_steps(steps: int, share: float) -> list[bool]:
    """Which steps train on a reflection batch: exactly ``floor(steps * share)``, spread."""
    return [math.floor((i + 1) * share) > math.floor(i * share) for i in range(steps)]


def _cycle(n: int, rng: random.Random) -> Iterator[int]:
    while True:
        order = list(range(n))
        rng.shuffle(order)
        yield from order


def _buckets(order: Iterator[int], lengths: Sequence[int], size: int, rng: random.Random) -> list:
    drawn = sorted((next(order) for _ in range(BUCKET * size)), key=lambda i: lengths[i])
    batches = [drawn[k : k + size] for k in range(0, len(drawn), size)]
    rng.shuffle(batches)
    return batches


def batch_plan(
    lengths: Mapping[str, Sequence[int]], spec: TrainSpec, kinds: Sequence[str]
) -> list[tuple[str, list[int]]]:
    """Per step, its kind (``kinds[step]``) and ``batch_size`` indices into that kind's samples,
    whose token counts are ``lengths[kind]``: each kind cycled in a fresh shuffled order per
    pass, :data:`BUCKET` batches at a time grouped by length.

    Raises:
        ValueError: a kind some step trains on has no samples (its cycle never yielded: the
            build hung).
    """
    if empty := sorted({kind for kind in kinds if not lengths.get(kind)}):
        raise ValueError(f"no {' or '.join(empty)} samples to train on")
    rng = random.Random(f"coevo.embedded/batches/{spec.seed}")
    orders = {kind: _cycle(len(lengths[kind]), rng) for kind in lengths}
    queued: dict[str, list[list[int]]] = {kind: [] for kind in lengths}
    plan = []
    for kind in kinds:
        if not queued[kind]:
            queued[kind] = _buckets(orders[kind], lengths[kind], spec.batch_size, rng)
        plan.append((kind, queued[kind].pop()))
    return plan


def collate(samples: Sequence[Sample], pad_id: int) -> tuple[torch.Tensor, ...]:
    """``ids`` and ``attention`` (B, T), right-padded; ``response`` and ``prompt`` (B, T - 1):
    1 where the next token ``ids[:, 1:]`` is a response (or prompt) token."""
    width = max(len(s.prompt) + len(s.response) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)  # (B, T)
    attention = torch.zeros_like(ids)  # (B, T)
    response = torch.zeros((len(samples), width - 1), dtype=torch.float32)  # (B, T-1)
    prompt = torch.zeros_like(response)  # (B, T-1)
    for b, sample in enumerate(samples):
        n, m = len(sample.prompt), len(sample.response)
        ids[b, : n + m] = torch.tensor(sample.prompt + sample.response)
        attention[b, : n + m] = 1
        prompt[b, : n - 1] = 1
        response[b, n - 1 : n + m - 1] = 1
    return ids, attention, response, prompt


def next_token_losses(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each next token: logits (B, T, V) and ids (B, T) -> (B, T - 1)."""
    pred = logits[:, :-1].float()  # (B, T-1, V)
    return torch.nn.functional.cross_entropy(pred.transpose(1, 2), ids[:, 1:], reduction="none")


def pretrain_loss(
    losses: torch.Tensor, response: torch.Tensor, prompt: torch.Tensor, prompt_weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss to minimise and the mean response loss, from (B, T - 1) token losses."""
    response_loss = (losses * response).sum() / response.sum()
    if not prompt_weight:
        return response_loss, response_loss
    prompt_loss = (losses * prompt).sum() / prompt.sum().clamp(min=1)
    return response_loss + prompt_weight * prompt_loss, response_loss


def lr_at(step: int, spec: TrainSpec) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to a tenth of ``lr``."""
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    progress = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    return spec.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def _log() -> Any:
    return structlog.get_logger("coevo").bind(actor="pretrain")


def _curve(values: Sequence[float], points: int = 20) -> dict:
    """Mean loss over the first and last tenth of the steps, and ``points`` chunk means."""
    if not values:
        return {"steps": 0}
    tenth, chunk = max(1, len(values) // 10), max(1, math.ceil(len(values) / points))
    chunks = [values[i : i + chunk] for i in range(0, len(values), chunk)]
    return {
        "steps": len(values),
        "first": round(sum(values[:tenth]) / tenth, 4),
        "last": round(sum(values[-tenth:]) / tenth, 4),
        "curve": [round(sum(c) / len(c), 4) for c in chunks],
    }


def train(
    model: Any,
    pools: dict[str, list[Sample]],
    spec: TrainSpec,
    kinds: Sequence[str],
    pad_id: int,
    progress: Progress | None,
) -> dict:
    """Train ``model`` in place on ``pools`` (samples by kind), step ``i`` on a batch of kind
    ``kinds[i]``; the response-loss curve per kind and the token count."""
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.01)
    lengths = {
        kind: [len(s.prompt) + len(s.response) for s in pool] for kind, pool in pools.items()
    }
    curves: dict[str, list[float]] = {kind: [] for kind in pools}
    tokens = 0
    model.train()
    for step, (kind, indices) in enumerate(batch_plan(lengths, spec, kinds)):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec)
        ids, attention, response, prompt = collate([pools[kind][i] for i in indices], pad_id)
        losses = next_token_losses(model(input_ids=ids, attention_mask=attention).logits, ids)
        loss, response_loss = pretrain_loss(losses, response, prompt, spec.prompt_loss_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        curves[kind].append(response_loss.item())
        if not all(map(math.isfinite, (loss.item(), curves[kind][-1], norm))):
            _diverged(spec, step, f"loss {loss.item()}, gradient norm {norm}")  # before the step
        opt.step()
        tokens += int(attention.sum())
        if progress is not None:
            progress(step + 1, spec.steps, curves[kind][-1])
        if (step + 1) % max(1, spec.steps // 10) == 0:
            _log().info("pretrain.step", step=step + 1, steps=spec.steps, loss=curves[kind][-1])
    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):  # (not seen yet)
        _diverged(spec, spec.steps - 1, "weights not finite after it")
    model.eval()
    return {"tokens": tokens, "loss": {kind: _curve(values) for kind, values in curves.items()}}


def _diverged(spec: TrainSpec, step: int, what: str) -> NoReturn:
    """Stop a pre-training that has diverged: its model would be NaN, cached, and refused by
    every run as a damaged one."""
    raise ModelUnavailable(
        f"pre-training diverged at step {step + 1} of {spec.steps} ({what}; lr {spec.lr:g}, "
        f"prompt_loss_weight {spec.prompt_loss_weight:g}: smaller ones train); nothing was cached"
    )


def default_cache_root() -> Path:
    """``$COEVO_CACHE`` (``~`` expanded), else ``~/.cache/coevo``.

    Raises:
        ModelUnavailable: no ``$COEVO_CACHE`` and no home directory to put the cache in.
    """
    given = os.environ.get("COEVO_CACHE")
    if given:
        try:
            return Path(given).expanduser()
        except RuntimeError as exc:  # "~someone" with no such user
            raise ModelUnavailable(f"COEVO_CACHE={given!r}: {exc}") from None
    if os.environ.get("HOME") == "":  # Path.home() would be "": a cache in the working dir
        raise ModelUnavailable(
            "no directory for the model cache: HOME is empty and COEVO_CACHE is not set "
            "(set COEVO_CACHE to a writable directory)"
        )
    return Path.home() / ".cache" / "coevo"


MANIFEST = "files.sha256"
"""A cached build's last file: the SHA-256 of every other file in it, checked at each use."""


def _digests(path: Path) -> dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.iterdir())
        if f.is_file() and f.name != MANIFEST
    }


def _state(path: Path, required: Sequence[str]) -> str:
    """ "intact", "missing" (not built, or a required file is gone) or "damaged" (a file
    differs from the manifest, or the manifest is gone: every build writes one, and a build
    made before manifests has another key)."""
    if not all((path / name).is_file() for name in required):
        return "missing"
    try:
        noted = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return "damaged"
    return "intact" if noted == _digests(path) else "damaged"


@contextmanager
def _locked(path: Path, key: str) -> Generator[None]:
    """The build lock of ``key`` at ``path``, waited for (saying so) while another process
    builds it."""
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log().info("pretrain.waiting", key=key, why="another process is building it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cached_build(
    root: Path,
    key: str,
    required: Sequence[str],
    build_into: Callable[[Path], object],
    threads: int | None = None,
) -> Path:
    """``root / key``, built by ``build_into(tmp)`` on first use.

    The build goes to a temporary directory, renamed into place once every file of
    ``required`` is there (the last one written last), under an exclusive file lock: two
    processes never build one key at once, and a partial build is never returned (a leftover
    one is removed before building again).

    Raises:
        ValueError: bad ``threads``.
    """
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    final = root / key
    try:
        str(root).encode("utf-8")
    except UnicodeEncodeError:  # found only once the build was written, minutes later
        raise ModelUnavailable(
            f"the model cache {str(root)!r} cannot be used: its path holds bytes that are not "
            "UTF-8 (COEVO_CACHE chooses another directory)"
        ) from None
    longest = os.pathconf("/", "PC_PATH_MAX") - 1  # bytes, less the terminating NUL
    if len(os.fsencode(final.absolute())) + BUILD_PATHS > longest:  # found once built
        too_long = OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
        raise _cache_unusable(root, too_long, f" (a build writes up to {BUILD_PATHS} bytes more)")
    try:
        state = _state(final, required)
    except OSError as exc:  # a cache this user may not enter: say it is the cache
        raise _cache_unusable(root, exc) from None
    if state == "intact":
        return final
    with contextlib.ExitStack() as held:
        try:
            root.mkdir(parents=True, exist_ok=True)
            held.enter_context(_locked(root / f"{key}.lock", key))
        except OSError as exc:  # read-only, not a directory, gone: say it is the cache
            damaged = f" (its build {key} is damaged and must be built again)" * (
                state == "damaged"
            )
            raise _cache_unusable(root, exc, damaged) from None
        held.enter_context(torch_threads(threads))
        try:
            return _build_locked(root, key, required, build_into)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG):
                raise _cache_unusable(root, exc) from None
            raise
        except Exception as exc:  # safetensors' own error for a full disk
            if "No space left on device" in str(exc):
                full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                raise _cache_unusable(root, full) from None
            raise


BUILD_PATHS = 64
"""Bytes a build adds below its key's path: its temporary directory's suffix and its longest
file name (``.<key>.s7n3zjtx/generation_config.json``), with room to spare. A cache whose
path left less built the whole model, then failed writing it, blamed on the scenario."""


def _cache_unusable(root: Path, exc: OSError, more: str = "") -> ModelUnavailable:
    return ModelUnavailable(
        f"the model cache {root} cannot be used: {exc.strerror or exc}{more} (COEVO_CACHE "
        "chooses another directory)"
    )


def _build_locked(
    root: Path,
    key: str,
    required: Sequence[str],
    build_into: Callable[[Path], object],
) -> Path:
    """:func:`cached_build`'s work once it holds the key's lock."""
    final = root / key
    state = _state(final, required)
    if state == "intact":
        return final
    if state == "damaged":
        _log().warning("pretrain.damaged", key=key, path=str(final), action="built again")
    for stale in [*root.glob(f".{key}.*"), *([final] if final.exists() else [])]:
        shutil.rmtree(stale)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar: the build logs
    try:
        _log().info("pretrain.build", key=key, path=str(final))
        build_into(tmp)
        (tmp / MANIFEST).write_text(json.dumps(_digests(tmp), indent=1) + "\n")
        share_as_umask(tmp)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _log().info("pretrain.built", key=key, path=str(final))
    return final
