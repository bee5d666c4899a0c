"""Model checkpoints: loading a local Hugging Face model directory, writing a policy version as a
safetensors checkpoint that ``from_pretrained`` loads, and reading one back into a live model.

Nothing on disk is pickled: weights and the optimiser's state are safetensors, config and tokenizer
are JSON. :class:`DirCheckpoints` is the store a run uses (``checkpoints/v000012/`` in the run
directory); :class:`MemoryCheckpoints` is its in-memory twin for tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol, cast

from engine.errors import CheckpointNotWritten, ModelUnavailable, RunDirectoryMoved
from stores.rundir import path_identity

if TYPE_CHECKING:  # torch, safetensors and transformers are imported where they are used:
    import torch  # commands that only check settings or read logs never load them

_LOADING = threading.Lock()
"""``from_pretrained`` patches torch globally while it builds a model (empty weights), so two
threads loading at once corrupt each other's models: loads take turns."""


END_IDS = "coevo_end_ids"
"""The attribute of a tokenizer loaded from a model directory that holds the other ids its
model ends a response with (:func:`agents.models.prompts.end_ids`)."""


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


PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
"""File patterns of pickled weights: named in errors, never opened."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""A model directory needs one of these (a fast tokenizer, sentencepiece, or BPE vocabulary)."""


def check_model_dir(path: Path, setting: str = "model") -> Path:
    """See :func:`_checked`; returns ``path``, expanded."""
    return _checked(path, setting)[0]


def _checked(path: Path, setting: str = "model") -> tuple[Path, Any]:
    """Check, without loading any weights, that ``path`` holds a causal LM coevo can load.

    It must be a directory with a ``config.json`` naming a causal-LM ``model_type`` that
    transformers knows, a tokenizer (one of :data:`TOKENIZER_FILES`), and safetensors weights
    (``model.safetensors``, or shards listed in ``model.safetensors.index.json``) whose tensor
    names and shapes are the ones that config builds (compared on torch's meta device: nothing
    is allocated; an untied ``lm_head`` may not be left out). Pickled weights
    (``pytorch_model.bin``, ``*.pt``) are refused, never opened. The tokenizer is loaded and
    checked as coevo uses it (:func:`_check_tokenizer`: eos, chat template with the system
    message, size, the reading of ``tokenizer.json``).

    Args:
        path: the directory (a leading ``~`` or ``~user`` is expanded).
        setting: the scenario setting that named it (for the message).

    Returns:
        ``path``, expanded, and the tokenizer that was checked (what :func:`load_model_dir`
        uses rather than loading it again).

    Raises:
        ModelUnavailable: one line naming ``setting``, the path and what is wrong.
    """
    where = f"{setting} = {str(path)!r}"
    try:
        path = path.expanduser()
    except RuntimeError as exc:  # ~user of no such user, or no home directory
        raise ModelUnavailable(f"{where}: cannot expand '~' ({_one_line(exc)})") from None
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        raise ModelUnavailable(f"{where}: {what} (a model is a Hugging Face model directory)")
    config = _read_config(path, where)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelUnavailable(f"{where}: no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    shards = _safetensors_files(path, where)
    expected, unexplained = _expected_shapes(config, where)
    found: dict[str, tuple[int, ...]] = {}
    for shard in shards:
        found.update(_tensor_shapes(shard, where))
    if not renamed_on_load(config):  # else the load's own report is checked (load_model_dir)
        _compare_shapes(expected, found, where, _tied(config), unexplained)
    return path, _check_tokenizer(path, config, where)


def renamed_on_load(config: Any) -> bool:
    """Whether transformers renames or fuses this architecture's stored weights as it loads
    them (GPT-NeoX's ``embed_out`` becomes ``lm_head``; Mixtral's and Qwen2-MoE's experts are
    fused): the file's names are then not the built model's, and comparing them refused valid
    checkpoints. Such a model is checked by what its load reports instead."""
    from transformers import conversion_mapping
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    mapping = cast(
        "Callable[[str], object]",
        conversion_mapping.get_checkpoint_conversion_mapping,  # pyright: ignore[reportUnknownMemberType]
    )
    model_type = getattr(config, "model_type", "")
    names = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, ""), model_type]
    return any(n and mapping(n) is not None for n in names)


PROBE_WORDS = "you are in the kitchen look around open the door take the key go north 1 2"
"""Words of the kind coevo's prompts hold, which a model's tokenizer must encode and decode
back as its ``tokenizer.json`` does."""
_SYSTEM_MARK = "coevo-system-probe"


def _check_tokenizer(path: Path, config: Any, where: str) -> Any:
    """The tokenizer transformers builds from ``path`` is one coevo can act with: it loads,
    ends responses (an eos token), renders prompts (a chat template that keeps the system
    message, where coevo's instructions and tips go), fits the model's embedding, and reads
    text as the directory's ``tokenizer.json`` does (transformers may rebuild a tokenizer from
    its class, not the file: a word-level ``tokenizer.json`` under a Qwen2 config encoded
    most words as nothing).

    Returns:
        The tokenizer.

    Raises:
        ModelUnavailable: one line naming what is wrong.
    """
    from transformers import AutoTokenizer

    try:
        with _LOADING, quiet_transformers():
            tokenizer = _auto(AutoTokenizer).from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers' and tokenizers' errors share no base
        files = ", ".join(
            n for n in (*TOKENIZER_FILES, "tokenizer_config.json") if (path / n).is_file()
        )
        raise ModelUnavailable(
            f"{where}: the tokenizer ({files}) cannot be loaded: {_one_line(exc)}"
        ) from None
    if tokenizer.eos_token_id is None:
        raise ModelUnavailable(f"{where}: the tokenizer has no eos token: responses could not end")
    vocab = getattr(_text_config(config), "vocab_size", None)
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        past = tokenizer.convert_ids_to_tokens(list(range(vocab, min(len(tokenizer), vocab + 3))))
        raise ModelUnavailable(
            f"{where}: the tokenizer has {len(tokenizer)} tokens, the model's embedding "
            f"{vocab} (config.json vocab_size): ids past it cannot be read (from id {vocab}: "
            f"{', '.join(map(repr, past))}{', ...' if len(tokenizer) > vocab + 3 else ''}: the "
            "tokenizer's own, or tokens transformers adds for its class, as Qwen2's "
            "<|endoftext|>)"
        )
    if not getattr(tokenizer, "chat_template", None):
        raise ModelUnavailable(
            f"{where}: the tokenizer has no chat template (coevo renders every prompt with it: "
            "add chat_template.jinja or tokenizer_config.json's chat_template)"
        )
    messages = [{"role": "system", "content": _SYSTEM_MARK}, {"role": "user", "content": "look"}]
    try:
        shown = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja's TemplateError and whatever a template raises
        raise ModelUnavailable(
            f"{where}: the chat template refuses a system message (coevo's instructions and "
            f"tips go there): {_one_line(exc)}"
        ) from None
    if _SYSTEM_MARK not in str(shown):
        raise ModelUnavailable(
            f"{where}: the chat template leaves the system message out (coevo's instructions "
            "and tips go there)"
        )
    _same_reading(path, tokenizer, str(getattr(config, "model_type", "")), where)
    ends = _eos_ids(path, config)
    if (turn_end := _turn_end(tokenizer, ends)) is not None:
        tokenizer.eos_token = turn_end
    setattr(tokenizer, END_IDS, frozenset(i for i in ends if 0 <= i < len(tokenizer)))
    return tokenizer


def _eos_ids(path: Path, config: Any) -> set[int]:
    """The eos ids the model's generation config (or config.json) names: transformers'
    ``generate`` stops at each of them (Qwen2.5-Instruct's ``<|im_end|>`` and
    ``<|endoftext|>``, Llama-3-Instruct's ``<|eot_id|>`` and ``<|end_of_text|>``)."""
    ends: Any = None
    generation = path / "generation_config.json"
    if generation.is_file():
        try:
            ends = json.loads(generation.read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            ends = None
    if ends is None:
        ends = getattr(_text_config(config), "eos_token_id", None)
    if isinstance(ends, int) and not isinstance(ends, bool):
        return {ends}
    listed = cast("list[object]", ends) if isinstance(ends, list | tuple) else []
    return {e for e in listed if isinstance(e, int) and not isinstance(e, bool)}


def _turn_end(tokenizer: Any, ids: set[int]) -> str | None:
    """The token an instruct model ends its turns with, when it is not the tokenizer's eos:
    the token the chat template writes right after an assistant message, when the model's
    eos ``ids`` name it (Gemma-it's, Phi-3's and Llama-3-Instruct's ``<|end|>``/``<|eot_id|>``
    beside an ``<|endoftext|>`` eos). coevo ends every response it scores with the tokenizer's
    eos: with the other one, scored actions were trained to end as the model never does.
    None: the tokenizer's eos is the turn's end, or the model names no other."""
    if not ids - {tokenizer.eos_token_id}:
        return None
    mark = "coevo-turn-probe"
    turn = [{"role": "user", "content": "look"}, {"role": "assistant", "content": mark}]
    try:
        shown = str(tokenizer.apply_chat_template(turn, tokenize=False))
    except Exception:  # a template that renders no assistant turn: keep the eos
        return None
    after = shown.split(mark, 1)[1] if mark in shown else ""
    first = next(iter(tokenizer.encode(after.lstrip(), add_special_tokens=False)), None)
    if first is None or first not in ids or first == tokenizer.eos_token_id:
        return None
    return str(tokenizer.convert_ids_to_tokens(first))


def _same_reading(path: Path, tokenizer: Any, model_type: str, where: str) -> None:
    """Refuse a tokenizer that loses words of :data:`PROBE_WORDS` (encoded and decoded back):
    one that loses words ``tokenizer.json`` itself keeps (transformers rebuilt it), or one
    whose own vocabulary has no tokens for them (a small word-level vocabulary: the world's
    words reached the model as unknown tokens, and different actions as the same ids)."""
    words = PROBE_WORDS.split()

    def kept(decoded: str) -> list[str]:
        return [word for word in words if word in decoded.split()]

    ids = tokenizer.encode(PROBE_WORDS, add_special_tokens=False)
    loaded = kept(tokenizer.decode(ids, skip_special_tokens=True))
    if len(loaded) == len(words):
        return
    file = path / "tokenizer.json"
    by_file: list[str] | None = None
    if file.is_file():
        from tokenizers import Tokenizer

        try:
            own = Tokenizer.from_file(str(file))
            by_file = kept(own.decode(own.encode(PROBE_WORDS, add_special_tokens=False).ids))
        except Exception:  # transformers read it its own way: nothing to compare with
            by_file = None
    if by_file is not None and len(loaded) < len(by_file):
        raise ModelUnavailable(
            f"{where}: the tokenizer transformers builds here ({type(tokenizer).__name__}) "
            f"keeps {len(loaded)} of {len(words)} probe words where tokenizer.json "
            f"keeps {len(by_file)}: transformers rebuilds a {model_type} checkpoint's tokenizer "
            "as its own class from the file's vocabulary and merges, not as written (a "
            f"tokenizer of the kind {model_type} uses, e.g. a byte-level BPE, reads back as it "
            "is)"
        )
    lost = [w for w in dict.fromkeys(words) if w not in loaded]
    raise ModelUnavailable(
        f"{where}: the tokenizer reads back {len(loaded)} of {len(words)} probe words of the "
        f"kind coevo's prompts hold (lost: {', '.join(lost[:5])}"
        f"{', ...' if len(lost) > 5 else ''}): its vocabulary has no tokens for them, so the "
        "world's text would reach the model as unknown tokens"
    )


def positions_of(path: Path) -> int | None:
    """The most positions the model in ``path`` was built for (``max_position_embeddings`` of
    its ``config.json``, or of its text config, under the name its model type gives it:
    GPT-2's ``n_positions``, as the loaded config's attribute reads), None where it does not
    say."""
    try:
        doc = json.loads((path / "config.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    doc = cast("dict[str, Any]", doc)
    text = doc.get("text_config")
    found = _positions_in(doc)
    if found is None and isinstance(text, dict):
        found = _positions_in(cast("dict[str, Any]", text))
    return found if isinstance(found, int) and not isinstance(found, bool) and found > 0 else None


def _positions_in(doc: dict[str, Any]) -> object:
    """``max_position_embeddings`` of a config's JSON, or the key its model type's config class
    maps that name to (``attribute_map``)."""
    if "max_position_embeddings" in doc:
        return doc["max_position_embeddings"]
    try:
        from transformers import CONFIG_MAPPING

        mapping = CONFIG_MAPPING[doc["model_type"]].attribute_map
    except Exception:  # no or an unknown model type: nothing else to look for
        return None
    key = mapping.get("max_position_embeddings")
    return doc.get(key) if isinstance(key, str) else None


def _text_config(config: Any) -> Any:
    """The part of a model's config that describes its language model (a multimodal config
    nests it; a causal LM's is the config itself)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _tied(config: Any) -> bool:
    """Whether the model's output layer is its input embedding (then a checkpoint need not
    store ``lm_head``); transformers' own default, True, where the config does not say."""
    default = getattr(config, "tie_word_embeddings", True)
    return bool(getattr(_text_config(config), "tie_word_embeddings", default))


MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
)
"""The files of a model directory that transformers reads to build the model and its tokenizer
(besides the ``*.safetensors`` weights): what :func:`model_files` digests."""


def model_files(path: Path) -> dict[str, str]:
    """The sha256 of each file of the model directory ``path`` that defines the model (its
    config, its tokenizer and chat template, its weights), by name: a README added does not
    change it; a tokenizer or weights replaced do. Reads every weights file (about 1 GB/s).

    Raises:
        ModelUnavailable: a file cannot be read.
    """
    names = [n for n in MODEL_FILES if (path / n).is_file()]
    names += sorted(p.name for p in path.glob("*.safetensors") if p.is_file())
    found: dict[str, str] = {}
    for name in names:
        try:
            with (path / name).open("rb") as f:
                found[name] = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as exc:
            raise ModelUnavailable(f"{path / name}: cannot read: {exc.strerror}") from None
    return found


def files_changed(then: dict[str, str], now: dict[str, str]) -> list[str]:
    """What differs between two :func:`model_files` of a directory, one phrase per file
    (``tokenizer.json changed``, ``chat_template.jinja added``), sorted by name."""
    out: list[str] = []
    for name in sorted(then.keys() | now.keys()):
        if name not in now:
            out.append(f"{name} removed")
        elif name not in then:
            out.append(f"{name} added")
        elif then[name] != now[name]:
            out.append(f"{name} changed")
    return out


class _Auto(Protocol):
    """What this module calls on transformers' ``Auto*`` classes; models, configs and tokenizers are
    ``Any`` here. transformers leaves ``**kwargs`` unannotated (strict mode reads its signatures as
    partially unknown) and annotates ``cls`` of ``AutoModelForCausalLM.from_pretrained`` so that
    pyright cannot bind it to the class."""

    def from_pretrained(self, path: Path, /, **kwargs: Any) -> Any: ...

    def from_config(self, config: Any, /, **kwargs: Any) -> Any: ...


def _auto(cls: object) -> _Auto:
    return cast(_Auto, cls)


def _read_config(path: Path, where: str) -> Any:
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    file = path / "config.json"
    if not file.is_file():
        raise ModelUnavailable(f"{where}: not a model directory (no config.json)")
    try:
        doc = json.loads(file.read_bytes())
    except (ValueError, OSError) as exc:  # UnicodeDecodeError and JSONDecodeError included
        raise ModelUnavailable(f"{where}: config.json is not JSON ({_one_line(exc)})") from None
    except RecursionError:  # json recurses once per level of nesting
        raise ModelUnavailable(f"{where}: config.json is nested too deeply") from None
    model_type = cast("dict[str, object]", doc).get("model_type") if isinstance(doc, dict) else None
    if not isinstance(model_type, str) or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelUnavailable(
            f"{where}: config.json has model_type {model_type!r}, not a causal language model "
            "that transformers knows"
        )
    try:
        with quiet_transformers():
            return _auto(AutoConfig).from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers' own validation errors have no common base
        raise ModelUnavailable(f"{where}: config.json is invalid: {_one_line(exc)}") from None


def _safetensors_files(path: Path, where: str) -> list[Path]:
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_bytes())["weight_map"].values()))
        except (ValueError, OSError, KeyError, TypeError, AttributeError) as exc:
            raise ModelUnavailable(f"{where}: {index.name} is invalid ({_one_line(exc)})") from None
        except RecursionError:  # json recurses once per level of nesting
            raise ModelUnavailable(f"{where}: {index.name} is nested too deeply") from None
        missing = [n for n in names if not (path / Path(str(n)).name).is_file()]
        if missing or not names:
            raise ModelUnavailable(f"{where}: {index.name} lists missing shards {missing}")
        return [path / Path(str(n)).name for n in names]
    pickles = sorted({p.name for pattern in PICKLE_WEIGHTS for p in path.glob(pattern)})
    if pickles:
        raise ModelUnavailable(
            f"{where}: weights only in pickle format ({', '.join(pickles)}); coevo loads "
            "safetensors only and never unpickles (convert with save_pretrained, "
            "safe_serialization=True)"
        )
    raise ModelUnavailable(f"{where}: no weights (no model.safetensors)")


def _tensor_shapes(file: Path, where: str) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes from a safetensors header (the data is not read)."""
    try:
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as f:  # pyright: ignore[reportUnknownVariableType]
            keys: list[str] = list(f.keys())  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
            return {k: tuple(f.get_slice(k).get_shape()) for k in keys}  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
    except Exception as exc:  # SafetensorError, OSError: a damaged or foreign file
        said = _one_line(exc)
        if "Too many open files" in said:  # the process's limit, not the file (os error 24)
            raise ModelUnavailable(
                f"{where}: cannot open {file.name}: too many open files in this process "
                "(raise the limit: ulimit -n)"
            ) from None
        raise ModelUnavailable(
            f"{where}: {file.name} is not a valid safetensors file ({said})"
        ) from None


def _meta_model(config: Any) -> Any:
    """The causal LM ``config`` builds, on the meta device (no memory, no weights read).

    In float32, as the process is: building in the config's dtype (bfloat16, float16) sets
    torch's default dtype, process-wide, while it builds, and the run's other threads
    (inference scoring) made their tensors in it meanwhile and failed.

    Raises:
        Exception: whatever transformers raises for a config it cannot build.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with quiet_transformers(), torch.device("meta"):
        return _auto(AutoModelForCausalLM).from_config(config, dtype=torch.float32)


def _expected_shapes(
    config: Any, where: str
) -> tuple[dict[str, tuple[int, ...]], Callable[[set[str]], set[str]]]:
    """Parameter names and shapes of the model ``config`` builds, on the meta device, and
    which of a file's tensors the model has no place for its load would not ignore: old
    buffers it leaves unread (GPT-2's ``attn.bias`` masks, older Llama conversions'
    ``rotary_emb.inv_freq``, the rules of the model's own ``_adjust_missing_and_unexpected_keys``).
    """
    try:
        model = _meta_model(config)
    except Exception as exc:  # a config transformers accepts but cannot build
        raise ModelUnavailable(f"{where}: config.json does not build: {_one_line(exc)}") from None

    def unexplained(names: set[str]) -> set[str]:
        info = SimpleNamespace(missing_keys=set[str](), unexpected_keys=set(names))
        try:  # what from_pretrained asks of the model itself (a private method: where it is
            model._adjust_missing_and_unexpected_keys(info)  # gone, nothing is ignored)
        except Exception:
            return set(names)
        return set(cast("set[str]", info.unexpected_keys))

    return {k: tuple(v.shape) for k, v in model.state_dict().items()}, unexplained


def _smallest_qwen2() -> Any:
    """A smallest config of the embedded model's architecture (its module names are what is
    read of it)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=8,
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
    )


def module_names(path: Path | None) -> set[str]:
    """The last parts of the module names of the model ``path`` holds (what LoRA targets
    name), built from its config on the meta device (None: the embedded model's architecture,
    a Qwen2); empty when the config cannot be read or built (its own check says why)."""
    try:
        config = _smallest_qwen2() if path is None else _read_config(path, str(path))
        model = _meta_model(config)
    except Exception:  # ModelUnavailable, or a config transformers cannot build
        return set()
    return {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name}


def _compare_shapes(
    expected: dict[str, tuple[int, ...]],
    found: dict[str, tuple[int, ...]],
    where: str,
    tied: bool,
    unexplained: Callable[[set[str]], set[str]] = set,
) -> None:
    """Every stored tensor must be a parameter of the same shape; only tied output weights
    (``tied``) may be missing: an untied ``lm_head`` left out was drawn at random at every load,
    so the sampler and the learner were different models. A file's names may lack the
    base-model prefix the causal LM's carry (``model.``, ``transformer.``: a base model's
    checkpoint), or carry one they do not."""
    by_suffix = {k.split(".", 1)[-1]: k for k in expected}
    matched: set[str] = set()  # the expected names the file's tensors fill
    unmatched: set[str] = set()
    for name, shape in sorted(found.items()):
        cut = name.split(".", 1)[-1]  # (a file whose names carry a prefix the model's do not)
        key = next((k for k in (name, by_suffix.get(name), cut) if k in expected), None)
        if key is None:
            unmatched.add(name)
            continue
        if expected[key] != shape:
            raise ModelUnavailable(
                f"{where}: weights do not fit config.json: {name} has shape {list(shape)}, "
                f"the config builds {list(expected[key])}"
            )
        matched.add(key)
    if unmatched and (left := sorted(unexplained(unmatched))):
        raise ModelUnavailable(
            f"{where}: weights do not fit config.json: unexpected tensor {left[0]!r}"
        )
    missing = [k for k in expected if k not in matched and not (tied and "lm_head" in k)]
    if missing and all("lm_head" in k for k in missing):
        raise ModelUnavailable(
            f"{where}: weights do not fit config.json: no {missing[0]!r}, and the config does "
            "not tie it to the input embedding (tie_word_embeddings is false): it would be "
            "drawn at random at every load"
        )
    if missing:
        raise ModelUnavailable(
            f"{where}: weights do not fit config.json: {len(missing)} tensors missing "
            f"(first {missing[0]!r})"
        )


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, at most ``limit`` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextmanager
def quiet_transformers() -> Generator[None]:
    """transformers' warnings and load reports (printed to stderr) off while checking."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def load_model_dir(path: str | Path, device: torch.device) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a local directory, offline, from safetensors only
    (checked first by :func:`check_model_dir`; ``use_safetensors=True`` all the same).

    Returns:
        ``(model, tokenizer)``, the model in float32 on ``device`` in eval mode.

    Raises:
        ModelUnavailable: the directory is missing or does not hold a loadable model.
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a run has its own progress display
    where, tokenizer = _checked(Path(path))
    try:
        with _LOADING, quiet_transformers():  # its load report: the line below says it
            model, info = _auto(AutoModelForCausalLM).from_pretrained(
                where,
                local_files_only=True,
                dtype=torch.float32,
                use_safetensors=True,
                output_loading_info=True,
            )
    except Exception as exc:  # transformers, tokenizers and safetensors errors share no base
        raise ModelUnavailable(f"{where}: cannot load: {_one_line(exc)}") from None
    _check_loading_info(info, where, _tied(model.config))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer


def _check_loading_info(info: dict[str, Any], where: Path, tied: bool) -> None:
    """Refuse a load that left a parameter to its random start, or read a tensor into one of
    another shape or read none into it (what transformers reports; the file's names were
    compared before it loaded, except for an architecture it renames: :func:`renamed_on_load`).

    Raises:
        ModelUnavailable: a parameter is missing (a tied output layer aside), mismatched, or a
            stored tensor was not used.
    """
    missing = [k for k in info.get("missing_keys", ()) if not (tied and "lm_head" in k)]
    problems = [
        ("missing", missing),
        ("of another shape", [k for k, *_ in info.get("mismatched_keys", ())]),
        ("unused", list(info.get("unexpected_keys", ()))),
    ]
    for what, keys in problems:
        if keys:
            raise ModelUnavailable(
                f"{where}: weights do not fit config.json: {len(keys)} tensors {what} "
                f"(first {sorted(keys)[0]!r})"
            )


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
    theirs = _tensor_shapes(file, str(checkpoint))
    ours: dict[str, tuple[int, ...]] = {}
    for shard in _safetensors_files(model_dir, str(model_dir)):
        ours.update(_tensor_shapes(shard, str(model_dir)))
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
            raise CheckpointNotWritten(str(partial), _one_line(exc)) from None
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
                f"optimizer state of {name} is damaged: {_one_line(exc)}"
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
            raise ModelUnavailable(f"checkpoint {name} is damaged: {_one_line(exc)}") from None

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
