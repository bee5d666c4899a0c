"""Model checkpoints: the torch device a scenario names, a live model's weights (their digest,
what a checkpoint of it holds, loading one back into it), and writing a policy version as a
safetensors checkpoint that ``from_pretrained`` loads. Checking and loading a local Hugging Face
model directory is :mod:`stores.model_dirs`.

Nothing on disk is pickled: weights and the optimiser's state are safetensors, config and tokenizer
are JSON. :class:`DirCheckpoints` is the store a run uses (``checkpoints/v000012/`` in the run
directory); :class:`MemoryCheckpoints` is its in-memory twin for tests.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from engine.errors import CheckpointNotWritten, ModelUnavailable, RunDirectoryMoved
from stores.model_dirs import one_line, safetensors_files, tensor_shapes
from stores.rundir import path_identity

if TYPE_CHECKING:  # torch, safetensors and transformers are imported where they are used:
    import torch  # commands that only check settings or read logs never load them


def resolve_device(name: str) -> torch.device:
    """The torch device for a scenario's ``policy.device`` ("auto": cuda when available).

    Raises:
        ModelUnavailable: cuda was asked for and is not available, or not that device.
    """
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ModelUnavailable(f"device {name!r}: torch sees no CUDA device")
    device = torch.device(name)
    _, _, number = name.partition(":")  # "cuda:N" (the schema's pattern)
    if name.startswith("cuda") and number:
        count = torch.cuda.device_count()
        if int(number) >= count:
            raise ModelUnavailable(
                f"device {name!r}: torch sees {count} CUDA device(s) (cuda:0 to cuda:{count - 1})"
            )
    return device


def check_device(name: str) -> None:
    """Check a scenario's ``policy.device`` as :func:`resolve_device` would, without importing
    torch for the devices that always exist ("cpu", and "auto", which falls back to it).

    Raises:
        ModelUnavailable: cuda was asked for and is not available, or not that device.
    """
    if name not in ("cpu", "auto"):
        resolve_device(name)


def param_digest(model: Any) -> str:
    """blake2b-128 of every parameter, in name order (names and float32 bytes).

    A model with peft adapters (:func:`is_adapted`) hashes its frozen base weights once (kept on
    the model) and then its adapters on every call: the same weights give the same digest, and
    an update of a 7B model's adapters does not re-read 7B frozen parameters.
    """
    if not is_adapted(model):
        return _digest_of(model.state_dict())
    base = getattr(model, _BASE_DIGEST, None)
    if base is None:
        adapters = set(adapter_names(model))
        base = _digest_of({k: v for k, v in model.state_dict().items() if k not in adapters})
        setattr(model, _BASE_DIGEST, base)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"base:{base}".encode())
    h.update(_digest_of(trained_state(model)).encode())
    return h.hexdigest()


_BASE_DIGEST = "_coevo_base_digest"


def _digest_of(state: dict[str, torch.Tensor]) -> str:
    import torch

    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(state.items()):
        h.update(name.encode())
        h.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def is_adapted(model: Any) -> bool:
    """True when ``model`` carries peft adapters (its trained state is the adapters only)."""
    return hasattr(model, "peft_config")


def adapter_names(model: Any) -> list[str]:
    """The ``state_dict`` names of an adapted model's adapter tensors (LoRA's, the only kind
    coevo adds; trainable or not, as peft's loader leaves them)."""
    return [name for name, _ in model.named_parameters() if ".lora_" in name]


def trained_state(model: Any) -> dict[str, torch.Tensor]:
    """What a checkpoint of ``model`` holds: its adapters (peft's names, as
    ``adapter_model.safetensors`` stores them) when it has some, else its whole state dict."""
    if not is_adapted(model):
        return dict(model.state_dict())
    from peft import get_peft_model_state_dict  # pyright: ignore[reportUnknownVariableType]

    return get_peft_model_state_dict(model)


def load_weights(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``model`` in place; only tied weights may be missing from it. An
    adapted model takes its adapters' state (:func:`trained_state`), all of them.

    Raises:
        ModelUnavailable: keys do not match the model.
    """
    if is_adapted(model):
        _load_adapters(model, state)
        return
    if names := _stored_names(model):  # (an architecture transformers renames as it loads)
        state = {names.get(k, k): v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    if unexpected or any(key not in tied and "lm_head" not in key for key in missing):
        raise ModelUnavailable(
            f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}"
        )
    if missing and hasattr(model, "tie_weights"):
        model.tie_weights()


def _own_names(model: Any) -> dict[str, Any]:
    """``save_pretrained``'s argument that stores a model's tensors under its own names: by
    default transformers reverts its renames and fusions of an architecture (GPT-NeoX's
    ``lm_head`` as ``embed_out``, Mixtral's fused experts one by one), and such a checkpoint
    did not load back into the model by name (every GPT-NeoX run failed at its first weight
    sync). ``from_pretrained`` reads both layouts; a LoRA model's saver (peft's) takes none."""
    import inspect

    takes = "save_original_format" in inspect.signature(model.save_pretrained).parameters
    return {"save_original_format": False} if takes else {}


def _stored_names(model: Any) -> dict[str, str]:
    """The model's parameter names by the names ``save_pretrained`` stores them under, where
    they differ: it reverts transformers' renames of an architecture (GPT-NeoX's ``lm_head``
    is stored as ``embed_out``, what its load renames), so a checkpoint of such a model did
    not load back into it by name. Empty when the model has no renames, or converts more than
    names (fused experts), which a name map cannot undo. Worked out once per model (kept on
    it): every weight sync asks."""
    known = getattr(model, _STORED_NAMES, None)
    if known is not None:
        return known
    import torch
    from transformers.core_model_loading import revert_weight_conversion

    marks = {k: torch.empty(0) for k in model.state_dict()}  # one object per name: tied
    names: dict[str, str] = {}  # weights stay apart
    try:
        revert = cast("Callable[[Any, dict[str, Any]], dict[str, Any]]", revert_weight_conversion)
        stored = revert(model, dict(marks))
    except Exception:  # a converter that needs the tensors themselves
        stored = {}
    by_id = {id(t): k for k, t in marks.items()}
    if all(id(t) in by_id for t in stored.values()):
        names = {k: by_id[id(t)] for k, t in stored.items() if by_id[id(t)] != k}
    setattr(model, _STORED_NAMES, names)
    return names


_STORED_NAMES = "_coevo_stored_names"


def _load_adapters(model: Any, state: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict  # pyright: ignore[reportUnknownVariableType]

    wanted = set(trained_state(model))
    if set(state) != wanted:
        missing, unexpected = sorted(wanted - set(state)), sorted(set(state) - wanted)
        raise ModelUnavailable(
            f"checkpoint does not match the model's adapters: {len(missing)} missing "
            f"{missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]}"
        )
    set_peft_model_state_dict(model, state)


WEIGHTS_FILE = "model.safetensors"
ADAPTER_FILE = "adapter_model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"


def checkpoint_misfit(model_dir: Path, checkpoint: Path) -> str | None:
    """The first tensor a checkpoint and a model directory both hold in different shapes
    (read from their safetensors headers, no data), as ``name: (a, b) in the checkpoint,
    (c, d) in the model``; None when every tensor both hold agrees, or the checkpoint's
    weights are not on disk (a LoRA checkpoint's adapters share no name with the model).

    Raises:
        ModelUnavailable: a weights file is not valid safetensors.
    """
    file = weights_file(checkpoint)
    if not file.is_file():
        return None
    theirs = tensor_shapes(file, str(checkpoint))
    ours: dict[str, tuple[int, ...]] = {}
    for shard in safetensors_files(model_dir, str(model_dir)):
        ours.update(tensor_shapes(shard, str(model_dir)))
    for name, shape in theirs.items():
        if name in ours and ours[name] != shape:
            return f"{name}: {shape} in the checkpoint, {ours[name]} in the model"
    return None


def weights_file(directory: Path) -> Path:
    """The weights of a checkpoint directory: its adapters (``adapter_model.safetensors``, a
    LoRA run's) if there, else ``model.safetensors``."""
    adapter = directory / ADAPTER_FILE
    return adapter if adapter.is_file() else directory / WEIGHTS_FILE


def optimizer_tensors(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimiser's per-parameter state as named tensors (``"<param>::<key>"``), for a
    safetensors file: AdamW's ``step``, ``exp_avg`` and ``exp_avg_sq``."""
    import torch

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


def restore_checkpoint(
    checkpoints: Checkpoints,
    name: str,
    model: Any,
    optimizer: torch.optim.Optimizer,
    digest: str,
) -> None:
    """Load checkpoint ``name`` into ``model`` and ``optimizer`` for a resume, and check that it
    is what the log says it is: the loaded weights have ``digest`` (recorded when the version
    was written) and the optimiser's state is there. The log's word alone would let a
    resume continue from flipped bytes, from another version in this one's place, or with
    fresh moments after ``optimizer.safetensors`` was deleted.

    Raises:
        ModelUnavailable: the checkpoint is missing or damaged, its weights' digest is not the
            log's, or its optimiser state is missing; one line naming the file.
    """
    load_weights(model, checkpoints.load(name))
    got = param_digest(model)
    file = ADAPTER_FILE if is_adapted(model) else WEIGHTS_FILE
    if got != digest:
        raise ModelUnavailable(
            f"{checkpoints.locate(name, file)}: the weights have digest {got}, the "
            f"log records {digest} for {name} (changed since it was written, or another "
            "version in its place)"
        )
    state = checkpoints.load_optimizer(name)
    if state is None:
        raise ModelUnavailable(
            f"{checkpoints.locate(name, OPTIMIZER_FILE)} is missing: the optimiser's state of "
            f"{name} (resuming without it would train with fresh moments)"
        )
    restore_optimizer(model, optimizer, state)


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
        """The optimiser tensors saved with ``name``, or None if none were.

        Raises:
            ModelUnavailable: they were saved but cannot be read back.
        """
        ...

    def load(self, name: str) -> dict[str, torch.Tensor]:
        """The state dict of the checkpoint ``name``.

        Raises:
            ModelUnavailable: no such checkpoint.
        """
        ...

    def locate(self, name: str, file: str) -> str:
        """Where ``file`` of checkpoint ``name`` is kept, for messages."""
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
        self.root = Path(root)
        self.keep = keep
        self._home = path_identity(self.root.parent)  # the run directory it writes into

    def _check_home(self, version: int) -> None:
        """Raise unless the run directory is still the one this store was made in: after a
        move, save_pretrained would create the old path anew, and the checkpoints would live
        apart from the log that names them.

        Raises:
            RunDirectoryMoved: it was moved, deleted or replaced.
        """
        home = self.root.parent
        if self._home is None:  # made before its directory existed: the first save makes it
            self._home = path_identity(home) if home.is_dir() else None
            return
        if path_identity(home) != self._home:
            raise RunDirectoryMoved(
                f"the run directory {home} was moved, deleted or replaced while the run wrote "
                f"into it: version {version}'s checkpoint is not written (nothing is created "
                "at the old path); the log is complete up to here wherever the directory went, "
                "and coevo resume continues it there"
            )

    def save(
        self,
        version: int,
        model: Any,
        tokenizer: Any,
        optimizer: dict[str, torch.Tensor] | None = None,
        *,
        protect_from: int | None = None,
    ) -> str:
        """Write ``version`` (with the optimiser's tensors, if given) atomically: into
        ``.vNNNNNN.partial/``, every file and the directory fsynced, then renamed to
        ``vNNNNNN/`` and the parent fsynced. The name is returned (and so can reach the log)
        only after that: a crash at any point leaves either no ``vNNNNNN/`` or a complete one,
        and a ``.partial`` that the next save of this store removes. Pruning then keeps the
        newest ``keep`` versions and every version >= ``protect_from``."""
        self._check_home(version)
        name = f"v{version:06d}"
        final = self.root / name
        partial = self.root / f".{name}.partial"
        from safetensors import SafetensorError
        from safetensors.torch import save_file  # pyright: ignore[reportUnknownVariableType]
        from transformers.utils import logging as hf_logging

        shutil.rmtree(partial, ignore_errors=True)
        hf_logging.disable_progress_bar()
        try:
            model.save_pretrained(partial, safe_serialization=True, **_own_names(model))
            tokenizer.save_pretrained(partial)
            if optimizer is not None:
                save_file(optimizer, str(partial / OPTIMIZER_FILE))
            share_as_umask(partial)
            _fsync_tree(partial)
        except (OSError, SafetensorError) as exc:  # its words for an OSError: "File too large"
            raise CheckpointNotWritten(str(partial), one_line(exc)) from None
        if final.exists():  # written before a crash, never referenced: set aside, then replace
            stale = self.root / f".{name}.stale"
            shutil.rmtree(stale, ignore_errors=True)
            final.rename(stale)
            partial.rename(final)
            shutil.rmtree(stale)
        else:
            partial.rename(final)
        _fsync_dir(self.root)
        self._check_home(version)  # moved meanwhile: the name must not reach the log
        self._prune(protect_from)
        return f"{self.root.name}/{name}"

    def load_optimizer(self, name: str) -> dict[str, torch.Tensor] | None:
        from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

        path = self.root / Path(name).name / OPTIMIZER_FILE
        if not path.is_file():
            return None
        try:
            return load_file(str(path))
        except Exception as exc:  # SafetensorError, OSError: damaged since it was written
            raise ModelUnavailable(
                f"optimizer state of {name} is damaged: {one_line(exc)}"
            ) from None

    def locate(self, name: str, file: str) -> str:
        return str(self.root / Path(name).name / file)

    def load(self, name: str) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

        path = weights_file(self.root / Path(name).name)
        if not path.is_file():
            raise ModelUnavailable(f"no checkpoint {name} ({path} is missing)")
        try:
            return load_file(str(path))
        except Exception as exc:  # SafetensorError, OSError: damaged since it was written
            raise ModelUnavailable(f"checkpoint {name} is damaged: {one_line(exc)}") from None

    def _prune(self, protect_from: int | None) -> None:
        versions = sorted(p for p in self.root.glob("v[0-9]*") if p.is_dir())
        for old in versions[: -self.keep]:
            if protect_from is None or int(old.name[1:]) < protect_from:
                shutil.rmtree(old)
        for leftover in self.root.glob(".v[0-9]*.partial"):  # of a save a crash interrupted
            shutil.rmtree(leftover, ignore_errors=True)


def share_as_umask(root: Path) -> None:
    """Give ``root`` and everything under it the modes a plain file or directory created here
    gets (0666 / 0777 less the umask): safetensors writes its files 0600 and ``mkdtemp`` its
    directory 0700, so another user of a shared run directory or model cache could not read
    a checkpoint or the embedded model."""
    mask = os.umask(0)
    os.umask(mask)
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def _fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then each directory (deepest first)."""
    dirs = [root]
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            dirs.append(path)
        else:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for directory in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
        _fsync_dir(directory)


def _fsync_dir(path: Path) -> None:
    """fsync a directory, making the entries created or renamed in it durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        self.saved[name] = {k: v.detach().clone() for k, v in trained_state(model).items()}
        if optimizer is not None:
            self.optimizers[name] = {k: v.clone() for k, v in optimizer.items()}
        return name

    def load_optimizer(self, name: str) -> dict[str, torch.Tensor] | None:
        saved = self.optimizers.get(name)
        return None if saved is None else {k: v.clone() for k, v in saved.items()}

    def locate(self, name: str, file: str) -> str:
        return f"{name}/{file} (in memory)"

    def load(self, name: str) -> dict[str, torch.Tensor]:
        try:
            return {k: v.clone() for k, v in self.saved[name].items()}
        except KeyError:
            raise ModelUnavailable(f"no checkpoint {name}") from None
