"""Local Hugging Face model directories: checking one without loading its weights (its config,
tokenizer and safetensors names and shapes, compared on torch's meta device), loading it
offline, and the digests of the files that define its model.

Nothing is unpickled: weights are read from safetensors only (pickled ones are named in errors,
never opened), config and tokenizer are JSON. :func:`check_model_dir` is what ``validate`` and
every run check before anything is built; :func:`load_model_dir` is how a model is loaded.
Checkpoints a run writes are :mod:`stores.checkpoints`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol, cast

from engine.errors import ModelUnavailable

if TYPE_CHECKING:  # torch, safetensors and transformers are imported where they are used:
    import torch  # commands that only check settings or read logs never load them

_LOADING = threading.Lock()
"""``from_pretrained`` patches torch globally while it builds a model (empty weights), so two
threads loading at once corrupt each other's models: loads take turns."""


END_IDS = "coevo_end_ids"
"""The attribute of a tokenizer loaded from a model directory that holds the other ids its
model ends a response with (:func:`agents.models.prompts.end_ids`)."""


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
        raise ModelUnavailable(f"{where}: cannot expand '~' ({one_line(exc)})") from None
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        raise ModelUnavailable(f"{where}: {what} (a model is a Hugging Face model directory)")
    config = _read_config(path, where)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelUnavailable(f"{where}: no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    shards = safetensors_files(path, where)
    expected, unexplained = _expected_shapes(config, where)
    found: dict[str, tuple[int, ...]] = {}
    for shard in shards:
        found.update(tensor_shapes(shard, where))
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
            f"{where}: the tokenizer ({files}) cannot be loaded: {one_line(exc)}"
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
            f"tips go there): {one_line(exc)}"
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
        raise ModelUnavailable(f"{where}: config.json is not JSON ({one_line(exc)})") from None
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
        raise ModelUnavailable(f"{where}: config.json is invalid: {one_line(exc)}") from None


def safetensors_files(path: Path, where: str) -> list[Path]:
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_bytes())["weight_map"].values()))
        except (ValueError, OSError, KeyError, TypeError, AttributeError) as exc:
            raise ModelUnavailable(f"{where}: {index.name} is invalid ({one_line(exc)})") from None
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


def tensor_shapes(file: Path, where: str) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes from a safetensors header (the data is not read)."""
    try:
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as f:  # pyright: ignore[reportUnknownVariableType]
            keys: list[str] = list(f.keys())  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
            return {k: tuple(f.get_slice(k).get_shape()) for k in keys}  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
    except Exception as exc:  # SafetensorError, OSError: a damaged or foreign file
        said = one_line(exc)
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
        raise ModelUnavailable(f"{where}: config.json does not build: {one_line(exc)}") from None

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


def one_line(exc: BaseException, limit: int = 300) -> str:
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
        raise ModelUnavailable(f"{where}: cannot load: {one_line(exc)}") from None
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
