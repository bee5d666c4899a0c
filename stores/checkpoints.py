"""Model checkpoints: loading a local Hugging Face model directory, writing a policy version as a
safetensors checkpoint that ``from_pretrained`` loads, and reading one back into a live model.

Nothing on disk is pickled: weights and the optimiser's state are safetensors, config and
tokenizer are JSON.
:class:`DirCheckpoints` is the store a run uses (``checkpoints/v000012/`` in the run directory);
:class:`MemoryCheckpoints` is its in-memory twin for tests.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file
from transformers.utils import logging as hf_logging

from engine.errors import ModelUnavailable

_LOADING = threading.Lock()
"""``from_pretrained`` patches torch globally while it builds a model (empty weights), so two
threads loading at once corrupt each other's models: loads take turns."""


def resolve_device(name: str) -> torch.device:
    """The torch device for a scenario's ``policy.device`` ("auto": cuda when available).

    Raises:
        ModelUnavailable: cuda was asked for and is not available.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ModelUnavailable(f"policy.device = {name!r} but torch sees no CUDA device")
    return torch.device(name)


def load_model_dir(path: str | Path, device: torch.device) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a local directory, offline.

    Returns:
        ``(model, tokenizer)``, the model in float32 on ``device`` in eval mode.

    Raises:
        ModelUnavailable: the directory is missing or does not hold a loadable model.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_logging.disable_progress_bar()  # a run has its own progress display
    where = Path(path)
    if not (where / "config.json").is_file():
        raise ModelUnavailable(f"{where}: not a model directory (no config.json)")
    try:
        with _LOADING:
            tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                where, local_files_only=True, dtype=torch.float32, use_safetensors=True
            )
    except (OSError, ValueError, KeyError) as exc:
        raise ModelUnavailable(f"{where}: cannot load: {exc}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer


def param_digest(model: Any) -> str:
    """blake2b-128 of every parameter, in name order (names and float32 bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def load_weights(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``model`` in place; only tied weights may be missing from it.

    Raises:
        ModelUnavailable: keys do not match the model.
    """
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    if unexpected or any(key not in tied and "lm_head" not in key for key in missing):
        raise ModelUnavailable(
            f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}"
        )
    if missing and hasattr(model, "tie_weights"):
        model.tie_weights()


OPTIMIZER_FILE = "optimizer.safetensors"


def optimizer_tensors(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimiser's per-parameter state as named tensors (``"<param>::<key>"``), for a
    safetensors file: AdamW's ``step``, ``exp_avg`` and ``exp_avg_sq``."""
    names = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, torch.Tensor] = {}
    for param, state in optimizer.state.items():
        for key, value in state.items():
            tensor = value if torch.is_tensor(value) else torch.tensor(value)
            out[f"{names[id(param)]}::{key}"] = tensor.detach().to("cpu").contiguous().clone()
    return out


def restore_optimizer(
    model: Any, optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor]
) -> None:
    """Put the state :func:`optimizer_tensors` wrote back into ``optimizer`` (over ``model``'s
    parameters); ``step`` stays on the CPU, as torch keeps it.

    Raises:
        ModelUnavailable: a name does not match the model's parameters.
    """
    params = dict(model.named_parameters())
    for name, tensor in tensors.items():
        pname, _, key = name.rpartition("::")
        if pname not in params:
            raise ModelUnavailable(f"optimizer state names {pname!r}, not a model parameter")
        param = params[pname]
        optimizer.state[param][key] = tensor if key == "step" else tensor.to(param.device)


class Checkpoints(Protocol):
    """Where policy versions are written and read back."""

    def save(
        self,
        version: int,
        model: Any,
        tokenizer: Any,
        optimizer: dict[str, torch.Tensor] | None = None,
        *,
        protect_from: int | None = None,
    ) -> str:
        """Write ``model`` (and the optimiser's tensors) as ``version``; returns the
        checkpoint's name. Pruning never removes a version >= ``protect_from`` (the oldest
        one the log may still name as its newest)."""
        ...

    def load_optimizer(self, name: str) -> dict[str, torch.Tensor] | None:
        """The optimiser tensors saved with ``name``, or None if none were."""
        ...

    def load(self, name: str) -> dict[str, torch.Tensor]:
        """The state dict of the checkpoint ``name``.

        Raises:
            ModelUnavailable: no such checkpoint.
        """
        ...


class DirCheckpoints:
    """Checkpoints as ``root/vNNNNNN/`` directories that ``from_pretrained`` loads.

    Args:
        root: the directory (created on first save).
        keep: the newest checkpoints kept; older ones are deleted after each save.
    """

    def __init__(self, root: Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = root
        self.keep = keep

    def save(
        self,
        version: int,
        model: Any,
        tokenizer: Any,
        optimizer: dict[str, torch.Tensor] | None = None,
        *,
        protect_from: int | None = None,
    ) -> str:
        name = f"v{version:06d}"
        final = self.root / name
        partial = self.root / f".{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        hf_logging.disable_progress_bar()
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        if optimizer is not None:
            save_file(optimizer, str(partial / OPTIMIZER_FILE))
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        self._prune(protect_from)
        return f"{self.root.name}/{name}"

    def load_optimizer(self, name: str) -> dict[str, torch.Tensor] | None:
        path = self.root / Path(name).name / OPTIMIZER_FILE
        return load_file(str(path)) if path.is_file() else None

    def load(self, name: str) -> dict[str, torch.Tensor]:
        path = self.root / Path(name).name / "model.safetensors"
        if not path.is_file():
            raise ModelUnavailable(f"no checkpoint {name} ({path} is missing)")
        return load_file(str(path))

    def _prune(self, protect_from: int | None) -> None:
        versions = sorted(p for p in self.root.glob("v[0-9]*") if p.is_dir())
        for old in versions[: -self.keep]:
            if protect_from is None or int(old.name[1:]) < protect_from:
                shutil.rmtree(old)


class MemoryCheckpoints:
    """The in-memory twin of :class:`DirCheckpoints` (copies of state dicts)."""

    def __init__(self) -> None:
        self.saved: dict[str, dict[str, torch.Tensor]] = {}
        self.optimizers: dict[str, dict[str, torch.Tensor]] = {}

    def save(
        self,
        version: int,
        model: Any,
        tokenizer: Any,
        optimizer: dict[str, torch.Tensor] | None = None,
        *,
        protect_from: int | None = None,
    ) -> str:
        name = f"checkpoints/v{version:06d}"
        self.saved[name] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if optimizer is not None:
            self.optimizers[name] = {k: v.clone() for k, v in optimizer.items()}
        return name

    def load_optimizer(self, name: str) -> dict[str, torch.Tensor] | None:
        saved = self.optimizers.get(name)
        return None if saved is None else {k: v.clone() for k, v in saved.items()}

    def load(self, name: str) -> dict[str, torch.Tensor]:
        try:
            return {k: v.clone() for k, v in self.saved[name].items()}
        except KeyError:
            raise ModelUnavailable(f"no checkpoint {name}") from None
