"""How a model is trained, apart from the loss: LoRA adapters (``peft``), the dtype it trains in,
activation checkpointing, and what the trained state costs in memory.

- **LoRA** (:class:`LoraSettings`, :func:`with_lora`): low-rank adapters on the named linear
  layers; the base weights are frozen and only the adapters train, so the optimiser holds moments
  for the adapters only and a checkpoint is the adapters' safetensors (``adapter_model.safetensors``
  and ``adapter_config.json``, which ``peft.PeftModel.from_pretrained`` loads on the base model).
  The adapters' random initialisation is drawn from a seed (:func:`lora_seed`) with a generator of
  their own, so the learner, the inference actor and a re-execution build the same version 0
  (whichever threads load them at once) without touching torch's global generator.
- **bfloat16** (:func:`check_train_dtype`): the frozen base weights are stored in bf16 (half the
  memory) while the adapters stay float32 (peft's default), so no trained weight is ever rounded
  to bf16. Full-parameter training keeps float32: an AdamW step of 1e-6 on a bf16 weight of
  magnitude 1 is below its resolution (2^-8) and is lost.
- **Activation checkpointing** (:func:`learning_mode`): transformers checkpoints a decoder layer
  only when that layer is in training mode, while coevo's learner keeps the model in eval mode
  (dropout off, so an on-policy ratio is exactly 1). :func:`learning_mode` puts everything in eval
  mode and then flags only the checkpointed layers as training: their activations are recomputed
  in the backward pass, and no dropout runs.

Torch and peft are imported inside the functions: the scenario schema imports
:class:`LoraSettings`, and scenarios without a policy never load torch.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

from engine.errors import ModelUnavailable
from engine.seeds import derive_seed

if TYPE_CHECKING:
    import torch

TrainDtype = Literal["float32", "bfloat16"]

_SEEDING = threading.Lock()
"""Models are loaded in worker threads, and forking torch's global RNG is not thread-safe: the
adapters of two models are added in turn."""

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
"""Qwen2's (and Llama's) attention projections: the layers LoRA adapts unless told otherwise."""


class LoraSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """LoRA adapters for a trained model (``[policy] lora``, ``[complementary] lora``).

    Attributes:
        r: the adapters' rank (0: no adapters, every parameter trains).
        alpha: their scale is ``alpha / r``.
        targets: names of the linear modules adapted (the last part of a module's name, as
            peft's ``target_modules``); every one must exist in the model.
        dropout: dropout on the adapters' input (applies only in training mode, which the
            learner never uses: kept for scenarios that set it).
    """

    r: Annotated[int, Meta(ge=0, le=4096)] = 0
    alpha: Annotated[int, Meta(ge=1, le=100_000)] = 32
    targets: Annotated[list[str], Meta(min_length=1, max_length=64)] = msgspec.field(
        default_factory=lambda: list(DEFAULT_TARGETS)
    )
    dropout: Annotated[float, Meta(ge=0, lt=1)] = 0.0

    def used(self) -> LoraSettings | None:
        """These settings when they ask for adapters (``r > 0``), else None."""
        return self if self.r > 0 else None


def lora_seed(run_seed: int, name: str) -> int:
    """The seed of the adapters' initialisation of model ``name`` ("policy" or "extractor")."""
    return derive_seed(run_seed, "lora", name)


def with_lora(model: Any, settings: LoraSettings, seed: int) -> Any:
    """``model`` with LoRA adapters on ``settings.targets``, its base weights frozen, in eval mode.

    The adapters' ``A`` matrices are drawn (as peft does, Kaiming-uniform) from a generator of
    their own seeded with ``seed``, in parameter-name order; what peft draws from torch's global
    RNG is undone (a forked RNG). ``B`` starts at zero, so the adapted model computes what the
    base does.

    Raises:
        ModelUnavailable: a target names no module of the model.
        ValueError: ``settings.r`` is 0 (no adapters).
    """
    import torch
    from peft import LoraConfig, get_peft_model

    if settings.r < 1:
        raise ValueError("lora.r must be >= 1 to add adapters")
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(settings.targets) - names)
    if missing:
        raise ModelUnavailable(
            f"lora targets {missing} name no module of the model "
            f"(its linear layers, which LoRA can adapt: {sorted(_linear_names(model))[:12]})"
        )
    conv1d = any(  # transformers' Conv1D stores its weight transposed: peft must be told
        type(module).__name__ == "Conv1D" and name.rsplit(".", 1)[-1] in settings.targets
        for name, module in model.named_modules()
    )
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        target_modules=list(settings.targets),
        lora_dropout=settings.dropout,
        bias="none",
        fan_in_fan_out=conv1d,
    )
    device = next(model.parameters()).device
    devices = [device] if device.type == "cuda" else []
    with _SEEDING, torch.random.fork_rng(devices=devices), warnings.catch_warnings():
        # peft 0.21 reads `is_gradient_checkpointing`, which transformers 5 deprecates
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
        )
        adapted = get_peft_model(model, config)  # draws A from the global RNG, then restored
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if ".lora_A." in name:  # peft's own initialisation, from the seed's generator
                torch.nn.init.kaiming_uniform_(param, a=math.sqrt(5), generator=generator)
    return adapted.eval()


def load_version(
    path: Path, base: Callable[[], Path], dtype: TrainDtype, device: torch.device
) -> tuple[Any, Any]:
    """A policy version's checkpoint at ``path`` as the run's actors had it: the whole model,
    or (a LoRA run's checkpoint holds only adapters) its adapters on the base model, which
    ``base`` names when asked, in the run's ``dtype``. ``coevo probe`` and ``audit whatif``
    load versions so.

    Returns:
        ``(model, tokenizer)``.

    Raises:
        ModelUnavailable: a directory does not hold a loadable model.
    """
    from stores.checkpoints import ADAPTER_FILE
    from stores.model_dirs import load_model_dir

    if not (path / ADAPTER_FILE).is_file():
        return load_model_dir(path, device)
    net, tokenizer = load_model_dir(base(), device)
    return load_adapted(net.to(torch_dtype(dtype)), str(path)), tokenizer


def load_adapted(base: Any, directory: str) -> Any:
    """A LoRA checkpoint (``adapter_model.safetensors`` and ``adapter_config.json``, as the
    learner writes them) loaded on ``base``, in eval mode: peft's own loader, for using a trained
    policy outside coevo.

    Raises:
        ModelUnavailable: the directory holds no adapters for this model.
    """
    from peft import PeftModel

    with warnings.catch_warnings():
        # peft 0.21 reads `is_gradient_checkpointing`, which transformers 5 deprecates
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
        )
        try:
            return PeftModel.from_pretrained(base, directory).eval()
        except (ValueError, OSError, KeyError, RuntimeError) as exc:
            raise ModelUnavailable(f"{directory}: no adapters for this model ({exc})") from None


def _linear_names(model: Any) -> set[str]:
    """The names of the layers LoRA can adapt: ``nn.Linear``, and transformers' ``Conv1D``
    (GPT-2's ``c_attn``, ``c_proj``, ``c_fc``, a linear layer stored transposed)."""
    import torch

    return {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"
    }


def check_train_dtype(
    dtype: TrainDtype, device: torch.device, lora: bool, bf16_supported: bool
) -> None:
    """Refuse a training dtype this setup cannot train in, with one line saying why.

    Args:
        dtype: "float32" or "bfloat16".
        device: where the model trains.
        lora: adapters train (bf16 then holds only the frozen base weights).
        bf16_supported: the CUDA device computes in bf16 (``torch.cuda.is_bf16_supported()``;
            ignored on CPU, where torch computes bf16 in software).

    Raises:
        ModelUnavailable: bf16 without LoRA, or on a CUDA device without bf16.
    """
    if dtype == "float32":
        return
    if not lora:
        raise ModelUnavailable(
            'dtype = "bfloat16" needs lora: the adapters train in float32 over bf16 base '
            "weights; a full-parameter learner keeps float32 (an AdamW step below 2^-8 of a "
            "weight is lost in bf16)"
        )
    if device.type == "cuda" and not bf16_supported:
        raise ModelUnavailable(
            f'dtype = "bfloat16": device {device} does not compute in bf16 '
            "(torch.cuda.is_bf16_supported() is False); use float32"
        )


def torch_dtype(dtype: TrainDtype) -> torch.dtype:
    """The torch dtype of a scenario's dtype name."""
    import torch

    return torch.bfloat16 if dtype == "bfloat16" else torch.float32


def enable_checkpointing(model: Any) -> None:
    """Recompute each decoder layer's activations in the backward pass (non-reentrant) instead
    of keeping them; :func:`learning_mode` arms it.

    Raises:
        ModelUnavailable: the model does not support activation checkpointing.
    """
    from stores.checkpoints import is_adapted

    base = model.get_base_model() if is_adapted(model) else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ModelUnavailable(f"gradient_checkpointing: {type(base).__name__} does not support it")
    base.activation_checkpointing_enable()
    base.config.use_cache = False  # a checkpointed layer cannot cache; generation asks for it


def learning_mode(model: Any) -> None:
    """Eval mode (no dropout), with the decoder layers that checkpoint activations flagged as
    training so that transformers engages their checkpointing (a no-op without checkpointing)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model.eval()
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
            module.training = True


def trainable(model: Any) -> list[torch.nn.Parameter]:
    """The parameters an optimiser updates, in the model's order (all of them without LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]


@dataclass(frozen=True, slots=True)
class MemoryUse:
    """What a trained model's state costs (recorded in the update events).

    Attributes:
        trainable_params: parameters the optimiser updates.
        total_params: every parameter of the model.
        optimizer_bytes: bytes of the optimiser's state (AdamW: two moments per trainable
            parameter, plus step counters).
        peak_bytes: the device's peak allocation during the update (CUDA only; None on CPU).
    """

    trainable_params: int
    total_params: int
    optimizer_bytes: int
    peak_bytes: int | None


def memory_use(model: Any, optimizer: Any, device: torch.device) -> MemoryUse:
    """The :class:`MemoryUse` of ``model`` and ``optimizer`` now (the peak since the last
    :func:`reset_peak`)."""
    import torch

    params = list(model.parameters())
    state_bytes = sum(
        value.numel() * value.element_size()
        for state in (optimizer.state.values() if optimizer is not None else ())
        for value in state.values()
        if torch.is_tensor(value)
    )
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return MemoryUse(
        trainable_params=sum(p.numel() for p in params if p.requires_grad),
        total_params=sum(p.numel() for p in params),
        optimizer_bytes=state_bytes,
        peak_bytes=peak,
    )


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch CPU threads (None: as they are), then restore
    them. Torch's count is process-wide: only for a process's one user of torch at a time (a
    build, a re-execution)."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _Deterministic:
    """How many blocks run under :func:`deterministic_algorithms` now, across threads (the
    policy's and the extractor's updates can overlap), and the setting to restore after the
    last."""

    lock: ClassVar[threading.Lock] = threading.Lock()
    depth: ClassVar[int] = 0
    saved: ClassVar[tuple[bool, bool]] = (False, False)  # (enabled, warn_only) before the first


@contextmanager
def deterministic_algorithms() -> Iterator[None]:
    """Run the block with torch's deterministic algorithms; the setting before the first of
    the blocks running at once is restored after the last. On CPU this makes an indexed
    accumulation (``index_put_`` with ``accumulate``: the backward pass of advanced indexing
    with repeated indices) run serially, in index order, as it does with one thread, instead
    of by atomic adds in parallel with several threads: the same bits from run to run
    whatever the load. The setting is process-wide; model updates are its only
    multi-threaded users here (inference runs no backward pass)."""
    import torch

    with _Deterministic.lock:
        if _Deterministic.depth == 0:
            _Deterministic.saved = (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            )
            torch.use_deterministic_algorithms(True)
        _Deterministic.depth += 1
    try:
        yield
    finally:
        with _Deterministic.lock:
            _Deterministic.depth -= 1
            if _Deterministic.depth == 0:
                enabled, warn_only = _Deterministic.saved
                torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def reset_peak(device: torch.device) -> None:
    """Start measuring the device's peak allocation afresh (CUDA only)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def prepare(
    model: Any,
    *,
    lora: LoraSettings | None,
    dtype: TrainDtype,
    checkpointing: bool,
    seed: int,
) -> Any:
    """A loaded float32 model made ready to act and train as a scenario says: its base weights
    in ``dtype``, activation checkpointing enabled, LoRA adapters drawn from ``seed``.

    Raises:
        ModelUnavailable: a LoRA target names no module, or the model cannot checkpoint.
    """
    if dtype != "float32":
        model = model.to(torch_dtype(dtype))
    if checkpointing:
        enable_checkpointing(model)
    if lora is not None:
        model = with_lora(model, lora, seed)
    return model
