"""The embedded model's pure parts: spec checks, play on train variants only, the word-level
tokenizer (coverage, exact round trips, the chat template), samples and batches."""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from types import SimpleNamespace

import msgspec
import pytest
import torch

from agents.acting.scripted import Explorer, RandomAgent, hindsight_note, parse_note
from agents.models.embedded import (
    SPECIAL_TOKENS,
    EmbeddedSpec,
    _prepare,
    build_tokenizer,
    cache_key,
    episode_texts,
    make_samples,
    probe_lines,
    prompt_texts,
    split_words,
    step_kinds,
    word_pieces,
)
from agents.models.pretrain import (
    BUCKET,
    Sample,
    batch_plan,
    collate,
    lr_at,
    pretrain_loss,
    reflection_steps,
    train,
)
from agents.models.pretrain_play import (
    Episode,
    PlayFailed,
    play,
    play_mix,
    pretrain_episodes,
    reflection_conversation,
    split_train,
    turn_conversations,
)
from agents.models.prompts import (
    PromptEncoder,
    decode_response,
    encode_prompt,
    encode_response,
    reflection_messages,
    turn_messages,
)
from engine.errors import ModelUnavailable
from engine.world import Observation, Task
from scenarios.worlds.minilab import MiniLab

SMALL = EmbeddedSpec(episodes_per_family=12, eval_variants=3, note_episodes_per_family=12)


@pytest.fixture(scope="module")
def world() -> MiniLab:
    return MiniLab()


@pytest.fixture(scope="module")
def default_play(world: MiniLab) -> list[Episode]:
    """The pre-training play of the default spec (about half a second)."""
    return pretrain_episodes(world, EmbeddedSpec())


@pytest.fixture(scope="module")
def tokenizer(default_play: list[Episode]):
    texts = [t for ep in default_play for t in episode_texts(ep)]
    return build_tokenizer(*word_pieces(texts + list(prompt_texts(default_play[0]))), 1024)


@pytest.fixture(scope="module")
def episodes(world: MiniLab) -> list[Episode]:
    return pretrain_episodes(world, SMALL)


def heldout_play(world: MiniLab) -> list[Episode]:
    """Every held-out variant, played once by the Explorer and once by a random agent."""
    return [
        play(world, task, 0, agent(random.Random(f"{task.variant}/{name}")), name)
        for family in world.families()
        for task in world.tasks(family, "heldout")
        for name, agent in (("explorer", Explorer), ("random", RandomAgent))
    ]


# ---------------------------------------------------------------------------------------------
# The spec


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"world": ""}, "world must be a non-empty name"),
        ({"hidden_size": 0}, "hidden_size must be between 1 and 8192, got 0"),
        ({"steps": -3}, "steps must be between 1 and 10000000, got -3"),
        ({"batch_size": 0}, "batch_size must be between 1 and 65536, got 0"),
        ({"window": -1}, "window must be between 0 and 100, got -1"),
        ({"eval_variants": -1}, "eval_variants must be between 0 and 100000, got -1"),
        ({"hidden_size": 10**9}, "hidden_size must be between 1 and 8192, got 1000000000"),
        ({"layers": 10**6}, "layers must be between 1 and 128, got 1000000"),
        ({"explorer_share": 1.5}, "explorer_share must be between 0 and 1, got 1.5"),
        ({"reflection_share": -0.1}, "reflection_share must be between 0 and 1, got -0.1"),
        (
            {"hidden_size": 100, "heads": 3},
            "hidden_size must be a multiple of 2 * heads (rotary heads have an even size), "
            "got 100 and 3",
        ),
        (
            {"hidden_size": 36, "heads": 4},
            "hidden_size must be a multiple of 2 * heads (rotary heads have an even size), "
            "got 36 and 4",
        ),
        ({"heads": 4, "kv_heads": 3}, "heads must be a multiple of kv_heads, got 4 and 3"),
        ({"lr": 0.0}, "lr must be > 0 and <= 1, got 0.0"),
        ({"lr": float("nan")}, "lr must be > 0 and <= 1, got nan"),
        ({"lr": 1e9}, "lr must be > 0 and <= 1, got 1000000000.0"),  # built a model of NaN
        ({"steps": 10, "warmup": 11}, "warmup must be <= steps, got 11 > 10"),
        ({"prompt_loss_weight": -1.0}, "prompt_loss_weight must be >= 0 and <= 100, got -1.0"),
        (
            {"prompt_loss_weight": 1e308},  # its loss overflowed, its last step's weights NaN
            "prompt_loss_weight must be >= 0 and <= 100, got 1e+308",
        ),
        (
            {"note_episodes_per_family": -1},
            "note_episodes_per_family must be between 0 and 1000000, got -1",
        ),
        ({"note_tries": 0}, "note_tries must be between 1 and 100000, got 0"),
        ({"entry_share": 2.0}, "entry_share must be between 0 and 1, got 2.0"),
        ({"probe_seeds": 0}, "probe_seeds must be between 1 and 1000, got 0"),
    ],
)
def test_spec_rejects_bad_fields_with_exact_messages(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        EmbeddedSpec(**fields)


def test_cache_key_follows_the_spec_not_the_order_of_options() -> None:
    options = {"families": ["fetch", "heat"], "train_variants": 50}
    first = EmbeddedSpec(world_options=options)
    assert cache_key(first) == cache_key(
        EmbeddedSpec(world_options=dict(reversed(options.items())))
    )
    assert re.fullmatch(r"[0-9a-f]{20}", cache_key(first))
    assert cache_key(first) != cache_key(EmbeddedSpec())
    assert cache_key(EmbeddedSpec(seed=1)) != cache_key(EmbeddedSpec())
    assert cache_key(EmbeddedSpec()) == cache_key(EmbeddedSpec())


# ---------------------------------------------------------------------------------------------
# Play


def test_pretraining_plays_only_train_variants_and_keeps_the_last_ones_back() -> None:
    world = MiniLab(train_variants=10)
    spec = EmbeddedSpec(episodes_per_family=25, eval_variants=3, note_episodes_per_family=6)
    played = pretrain_episodes(world, spec)
    assert len(played) == (25 + 6) * len(world.families())
    assert sum(ep.kind == "none" for ep in played) == 25 * len(world.families())
    assert {ep.task.split for ep in played} == {"train"}
    assert {ep.task.variant for ep in played} == set(range(7))  # 7, 8, 9 are kept back
    _, kept = split_train(world, "paint", 3)
    assert [t.variant for t in kept] == [7, 8, 9]


def test_split_train_needs_a_variant_left_for_pretraining() -> None:
    with pytest.raises(ValueError, match=r"^family 'fetch' has 3 train variants: .* lower\)$"):
        split_train(MiniLab(train_variants=3), "fetch", 3)


class Wordy(MiniLab):
    """MiniLab whose observations run to thousands of characters, whose odd variants cannot
    be reset, or whose texts hold a lone surrogate (as a plug-in world's may)."""

    def __init__(self, oddity: str, **options: object) -> None:
        super().__init__(**options)  # pyright: ignore[reportArgumentType]
        self.oddity = oddity

    def reset(self, task: Task, seed: int) -> Observation:
        if self.oddity == "reset" and task.variant % 2:
            raise RuntimeError(f"cannot reset variant {task.variant}")
        return self._odd(super().reset(task, seed))

    def step(self, action: str) -> Observation:
        return self._odd(super().step(action))

    def _odd(self, obs: Observation) -> Observation:
        extra = {"long": " the walls are long." * 200, "surrogate": " \ud800"}.get(self.oddity, "")
        return msgspec.structs.replace(obs, text=obs.text + extra)


def test_pretraining_samples_longer_than_the_model_are_cut_as_inference_cuts() -> None:
    """A world whose observations run to thousands of characters made the embedded model's
    build fail after its play (a sample of 3,050 tokens for 1,024 positions): its samples are
    cut as the inference actor cuts prompts, the middle of the prompt left out."""
    spec = EmbeddedSpec(
        world_options={"families": ["fetch"], "train_variants": 6},
        episodes_per_family=4,
        eval_variants=1,
        note_episodes_per_family=0,
    )
    tokenizer, pools, data = _prepare(Wordy("long", families=["fetch"], train_variants=6), spec)
    lengths = [len(s.prompt) + len(s.response) for pool in pools.values() for s in pool]
    assert max(lengths) <= 1024 == data["longest_sample"]
    assert data["cut_samples"] == len(lengths)  # every prompt holds a long observation
    gap = tokenizer.encode("\n...\n", add_special_tokens=False)
    turn = pools["turn"][0]
    assert any(turn.prompt[i : i + len(gap)] == tuple(gap) for i in range(len(turn.prompt)))
    assert turn.response[-1] == tokenizer.eos_token_id  # the response is whole
    _, _, untouched = _prepare(Wordy("", families=["fetch"], train_variants=6), spec)
    assert untouched["cut_samples"] == 0


@pytest.mark.parametrize(
    ("oddity", "says"),
    [
        ("reset", r"^world.reset\(fetch/1\) raised RuntimeError: cannot reset variant 1$"),
        ("surrogate", r"^world.reset\(fetch/0\) returned an observation whose text holds "),
    ],
)
def test_a_world_that_fails_in_scripted_play_says_where(oddity: str, says: str) -> None:
    world = Wordy(oddity, families=["fetch"], train_variants=6)
    with pytest.raises(PlayFailed, match=says):
        play_mix(world, world.tasks("fetch", "train"), 4, SMALL, "test")


def test_no_prompts_encode_to_no_ids(tokenizer) -> None:
    assert PromptEncoder(tokenizer).encode([]) == []  # eval_notes = 0 crashed the build's check


def test_play_is_seeded_mixed_and_not_filtered_by_outcome(
    world: MiniLab, default_play: list[Episode]
) -> None:
    assert pretrain_episodes(world, SMALL) == pretrain_episodes(world, SMALL)
    assert pretrain_episodes(world, SMALL) != pretrain_episodes(
        world,
        EmbeddedSpec(episodes_per_family=12, eval_variants=3, note_episodes_per_family=12, seed=1),
    )
    plain = [ep for ep in default_play if ep.kind == "none"]
    agents = Counter(ep.agent for ep in plain)
    assert 0.75 < agents["explorer"] / len(plain) < 0.85  # explorer_share 0.8
    assert {ep.agent for ep in default_play if ep.kind != "none"} == {"explorer"}
    outcomes = Counter((ep.task.family, ep.success) for ep in plain)
    for family in ("heat", "unlock", "circuit", "paint"):  # failures kept, successes too
        assert outcomes[family, False] > 0 and outcomes[family, True] > 0


# ---------------------------------------------------------------------------------------------
# The tokenizer


def test_every_word_of_the_world_is_one_token(tokenizer, default_play: list[Episode]) -> None:
    vocab = tokenizer.get_vocab()
    texts = {t for ep in default_play for t in episode_texts(ep)}
    words = {w for t in texts for w in split_words(t)}
    assert 130 <= len(words) <= 250  # minilab's 129 words, some with a leading space or newline
    assert words <= set(vocab)
    assert 263 + len(words) <= len(tokenizer) <= 263 + 3 * len(words)  # specials, bytes, merges
    assert [vocab[t] for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert tokenizer.eos_token == "<eom>" and tokenizer.pad_token == "<pad>"


def test_word_pieces_are_deterministic(default_play: list[Episode]) -> None:
    texts = [t for ep in default_play[:100] for t in episode_texts(ep)]
    assert word_pieces(texts) == word_pieces(list(reversed(texts)))


def test_heldout_text_has_no_unknown_word(world: MiniLab, tokenizer) -> None:
    heldout = heldout_play(world)
    texts = {t for ep in heldout for t in episode_texts(ep)}
    texts |= {t for ep in heldout[:10] for t in prompt_texts(ep)}
    assert {w for t in texts for w in split_words(t)} - set(tokenizer.get_vocab()) == set()
    ids = tokenizer(sorted(texts), add_special_tokens=False)["input_ids"]
    assert [len(row) for row in ids] == [len(split_words(t)) for t in sorted(texts)]


def test_decoding_gives_the_text_back_exactly(tokenizer, episodes: list[Episode]) -> None:
    texts = {t for ep in episodes for t in episode_texts(ep)}
    texts |= {t for ep in episodes[:5] for t in prompt_texts(ep)}
    texts |= {"an unseen Word, 42 + ü!"}  # spelled in pieces, never lost
    for text in texts:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_split_words_keeps_punctuation_apart() -> None:
    assert split_words("plan: open box, take apple.\nfound: x.") == [
        "plan", ":", "Ġopen", "Ġbox", ",", "Ġtake", "Ġapple", ".Ċ", "found", ":", "Ġx", ".",
    ]  # fmt: skip


def test_a_decoded_note_parses_to_the_same_plan_and_avoid_list(
    tokenizer, default_play: list[Episode]
) -> None:
    notes = {hindsight_note(ep.transcript) for ep in default_play}
    assert any(parse_note(note)[0] for note in notes) and any(parse_note(n)[1] for n in notes)
    for note in notes:
        ids = encode_response(tokenizer, note)
        assert ids[-1] == tokenizer.eos_token_id
        decoded = decode_response(tokenizer, [*ids, *tokenizer.encode("open box")])
        assert decoded == note
        assert parse_note(decoded) == parse_note(note)


def test_chat_template_renders_roles_and_the_assistant_header(tokenizer) -> None:
    messages = turn_messages(
        "heat the clay jug.", [("look", "you see an oven.")], "you see an oven."
    )
    ids = encode_prompt(tokenizer, messages)
    rendered = tokenizer.decode(ids)
    assert rendered == tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert rendered.startswith("<system>you act in a text lab")
    assert "<eom><user>goal: heat the clay jug.\n> look\nyou see an oven.\nnow: " in rendered
    assert rendered.endswith("<eom><assistant>")
    with pytest.raises(Exception, match="unknown role: tool"):
        encode_prompt(tokenizer, [{"role": "tool", "content": "look"}])


def test_tips_are_one_token_each_around_whole_words(tokenizer) -> None:
    note = "plan: open box, take apple.\nfound: apple after open box."
    tips = [note, "avoid: look."]
    messages = turn_messages("find the apple.", [], "you see a box.", tips=tips)
    ids = encode_prompt(tokenizer, messages, tips)
    vocab = tokenizer.get_vocab()
    assert ids.count(vocab["<tip>"]) == 2 and ids.count(vocab["</tip>"]) == 2
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens[tokens.index("<tip>") + 1 : tokens.index("<tip>") + 4] == ["Ġplan", ":", "Ġopen"]
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )


# ---------------------------------------------------------------------------------------------
# Samples and batches


def test_turn_samples_are_the_prompt_of_each_turn_and_the_action(
    tokenizer, episodes: list[Episode]
) -> None:
    window = 2
    pools = make_samples(tokenizer, episodes[:6], window)
    turns = [(ep, t) for ep in episodes[:6] for t in range(len(ep.transcript))]
    assert len(pools["turn"]) == len(turns)
    for sample, (ep, t) in zip(pools["turn"], turns, strict=True):
        history = ep.history
        observation = history[t - 1][1] if t else ep.first
        messages = turn_messages(ep.goal, history[:t], observation, tips=ep.tips, window=window)
        assert list(sample.prompt) == encode_prompt(tokenizer, messages, ep.tips)
        assert decode_response(tokenizer, sample.response) == ep.transcript[t][0]
        assert sample.response[-1] == tokenizer.eos_token_id


def test_reflection_samples_are_the_episode_and_its_hindsight_note(
    tokenizer, episodes: list[Episode]
) -> None:
    pools = make_samples(tokenizer, episodes, SMALL.window)
    assert len(pools["reflection"]) == len(episodes)
    for sample, ep in zip(pools["reflection"], episodes, strict=True):
        messages = reflection_messages(ep.goal, ep.first, ep.history, success=ep.success)
        assert list(sample.prompt) == encode_prompt(tokenizer, messages)
        assert decode_response(tokenizer, sample.response) == hindsight_note(ep.transcript)


def test_batch_encoding_is_the_templates_text_as_the_tokenizer_reads_it(
    tokenizer, episodes: list[Episode]
) -> None:
    """The pre-training prompts of a world whose texts hold no special token's text are the
    ids the build trained on before contents were checked (a cached model stays valid)."""
    chosen = [*episodes[:4], *(ep for ep in episodes if ep.tips)][:8]
    assert any(ep.tips for ep in chosen)  # tips' own <tip> and </tip> are special tokens
    conversations = [c for ep in chosen for c in turn_conversations(ep, 4)]
    conversations += [reflection_conversation(ep) for ep in chosen]
    texts = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
        for c in conversations
    ]
    pools = make_samples(tokenizer, chosen, 4)
    assert [list(s.prompt) for s in pools["turn"] + pools["reflection"]] == [
        list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]
    ]


def test_reflection_steps_spread_the_share_exactly() -> None:
    assert reflection_steps(8, 0.25) == [False, False, False, True] * 2
    assert sum(reflection_steps(1000, 0.3)) == 300
    assert not any(reflection_steps(10, 0.0)) and all(reflection_steps(10, 1.0))


def test_batch_plan_cycles_every_sample_and_groups_lengths() -> None:
    spec = EmbeddedSpec(steps=32, batch_size=4, reflection_share=0.5, warmup=0)
    lengths = {"turn": [i % 50 for i in range(4 * BUCKET)], "reflection": list(range(200))}
    plan = batch_plan(lengths, spec, step_kinds(spec))
    assert plan == batch_plan(lengths, spec, step_kinds(spec))
    assert [kind for kind, _ in plan] == ["turn", "reflection"] * 16
    turns = [i for kind, batch in plan if kind == "turn" for i in batch]
    assert Counter(Counter(turns).values()) == {2: 4 * BUCKET}  # 64 draws: two passes over 32
    assert all(len(batch) == 4 for _, batch in plan)
    first = [batch for kind, batch in plan[:16] if kind == "reflection"]
    spans = [max(b) - min(b) for b in first]
    assert max(spans) < 100  # sorted within a bucket of 32 draws out of 200


def test_collate_masks_the_response_tokens_to_predict(tokenizer, episodes: list[Episode]) -> None:
    samples = make_samples(tokenizer, episodes[:2], 4)["turn"][:5]
    ids, attention, response, prompt = collate(samples, tokenizer.pad_token_id)
    assert ids.shape[1] == max(len(s.prompt) + len(s.response) for s in samples)
    targets = ids[:, 1:]
    assert targets[response.bool()].tolist() == [t for s in samples for t in s.response]
    assert int(prompt.sum()) == sum(len(s.prompt) - 1 for s in samples)
    assert int(attention.sum()) == sum(len(s.prompt) + len(s.response) for s in samples)
    assert not (response.bool() & prompt.bool()).any()


def test_pretrain_loss_weights_prompt_tokens_only_when_asked() -> None:
    losses = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    response = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    prompt = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    loss, response_loss = pretrain_loss(losses, response, prompt, 0.0)
    assert loss.item() == response_loss.item() == 3.5
    loss, response_loss = pretrain_loss(losses, response, prompt, 0.5)
    assert loss.item() == 3.5 + 0.5 * 1.5 and response_loss.item() == 3.5


def test_learning_rate_warms_up_then_decays_to_a_tenth() -> None:
    spec = EmbeddedSpec(steps=100, warmup=10, lr=1e-3)
    assert lr_at(0, spec) == pytest.approx(1e-4)
    assert lr_at(9, spec) == pytest.approx(1e-3)
    assert lr_at(10, spec) == pytest.approx(1e-3)
    assert lr_at(100, spec) == pytest.approx(1e-4)
    rates = [lr_at(s, spec) for s in range(10, 100)]
    assert rates == sorted(rates, reverse=True)


def test_probe_lines_print_intervals_where_the_build_recorded_them() -> None:
    rates = {"none": 0.1, "variant": 0.4, "wrong": 0.1}
    every = {"variants": 9, "written": rates, "entry": rates}
    old = {"all": {**every, "helpful_vs_none": 4.0, "wrong_vs_none": 1.0}}  # cached before
    *_, line = probe_lines(old)
    assert line == "  helpful / none 4.0 (goal >= 2), wrong / none 1.0 (goal >= 0.9)"
    new = {
        "all": {
            **old["all"],
            "helpful_vs_none_interval": [2.7, 6.6],
            "wrong_vs_none_interval": [0.5, 1.6],
        }
    }
    *_, line = probe_lines(new)
    assert line == (
        "  helpful / none 4.0 [2.7, 6.6] (goal >= 2), wrong / none 1.0 [0.5, 1.6] (goal >= 0.9)"
    )


def test_pretraining_whose_loss_is_not_a_number_stops_and_says_so() -> None:
    """A build whose loss turned NaN (an outside tester's ``lr = 1e9``) trained on to its end
    and cached a model of NaN weights, which the run then refused as a damaged model."""

    class Diverged(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> object:
            return SimpleNamespace(logits=self.w * torch.full((*input_ids.shape, 8), math.nan))

    pools = {"turn": [Sample("turn", (1, 2), (3, 4))] * 4}
    spec = EmbeddedSpec(steps=3, warmup=0, batch_size=2)
    with pytest.raises(ModelUnavailable, match=r"^pre-training diverged at step 1 of 3 \(loss nan"):
        train(Diverged(), pools, spec, ["turn"] * 3, pad_id=0, progress=None)


def test_a_pretraining_step_whose_gradient_is_not_a_number_stops_before_it_updates() -> None:
    """The loss is finite and the step's update makes the weights NaN: on the last step that
    went unseen (a re-attack: ``prompt_loss_weight = 1e308``, one step), and the NaN model was
    cached."""

    class Finite(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.w.register_hook(lambda grad: grad * math.nan)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> object:
            return SimpleNamespace(logits=self.w * torch.ones((*input_ids.shape, 8)))

    model = Finite()
    pools = {"turn": [Sample("turn", (1, 2), (3, 4))] * 4}
    spec = EmbeddedSpec(steps=1, warmup=0, batch_size=2)
    with pytest.raises(ModelUnavailable, match=r"^pre-training diverged at step 1 of 1 .*nan"):
        train(model, pools, spec, ["turn"], pad_id=0, progress=None)
    assert bool(torch.isfinite(model.w).all())  # not updated
