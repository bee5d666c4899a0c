"""Prompts encoded a batch at a time give exactly the ids of :func:`encode_prompt`: with the
chat template's layout reused (the embedded model's template), and with a template that
changes contents (trims them), which the encoder detects and renders every time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.models.embedded import CHAT_TEMPLATE, build_tokenizer, word_pieces
from agents.models.prompts import PromptEncoder, encode_prompt, strip_tips, turn_messages

WORDS = ["open", "box", "take", "key", "the", "red", "goal", "light", "bulb", "you", "see"]
TRIMMING = CHAT_TEMPLATE.replace("m['content']", "(m['content'] | trim)")


@pytest.fixture(scope="module")
def tokenizer():
    texts = [" ".join(WORDS), "goal: now: > <tip> </tip> | . , \n {} '\""]
    return build_tokenizer(*word_pieces(texts), 1024)


texts = st.lists(st.sampled_from([*WORDS, " ", "\n", ".", "{", "}", "'"]), max_size=8).map("".join)
conversations = st.builds(
    lambda goal, obs, tips, history: turn_messages(goal, history, obs, tips=tips),
    texts,
    texts,
    st.lists(texts, max_size=2),
    st.lists(st.tuples(texts, texts), max_size=3),
)


@given(batch=st.lists(conversations, max_size=6))
def test_a_batch_encodes_as_encode_prompt_bit_for_bit(tokenizer, batch) -> None:
    encoder = PromptEncoder(tokenizer)
    assert encoder.encode(batch) == [encode_prompt(tokenizer, c) for c in batch]
    assert encoder._layouts.get(("system", "user")) is not None or not batch  # reused


@given(batch=st.lists(conversations, min_size=1, max_size=4))
def test_a_template_that_changes_contents_is_rendered_every_time(tokenizer, batch) -> None:
    trimming = build_tokenizer(*word_pieces([" ".join(WORDS), "goal: now: <tip> </tip>"]), 1024)
    trimming.chat_template = TRIMMING
    encoder = PromptEncoder(trimming)
    assert encoder.encode(batch) == [encode_prompt(trimming, c) for c in batch]
    assert encoder._layouts[("system", "user")] is None


def test_a_conversation_without_tips_encodes_as_its_stripped_form(tokenizer) -> None:
    shown = turn_messages("light the bulb", [], "you see a key", tips=["take key"])
    bare = strip_tips(shown, ["take key"])
    assert PromptEncoder(tokenizer).encode([bare]) == [
        encode_prompt(tokenizer, turn_messages("light the bulb", [], "you see a key"))
    ]
