"""EMPO2's pure pieces: rollout modes, the novelty bonus, tip stripping, the off-policy ratio's
two inputs and low-probability masking in the learner."""

from __future__ import annotations

import copy
import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from agents.acting.inference import ActSettings, PolicyRunner
from agents.events.policy import ActionRequested, GradientRequested
from agents.learning.trainer import GrpoTrainer
from agents.learning.update import Sample, Trainee, grpo_step, sample_logps
from agents.methods.builtin import Empo2
from agents.methods.empo2 import draw_rollout, intrinsic_reward, rollout_of
from agents.methods.settings import Empo2Config, EvalConfig, GrpoConfig
from agents.models.embedded import (
    EmbeddedSpec,
    build_tokenizer,
    episode_texts,
    prompt_texts,
    word_pieces,
)
from agents.models.policy import chosen_action_logps
from agents.models.pretrain_play import pretrain_episodes
from agents.models.prompts import encode_prompt, strip_tips, turn_messages
from agents.testing.models import tiny_qwen2
from scenarios.worlds.minilab import MiniLab

# ---------------------------------------------------------------------------------------------
# Rollout modes


@pytest.mark.parametrize(
    ("u_memory", "u_off", "expected"),
    [(0.0, 0.0, "distill"), (0.24, 0.66, "distill"), (0.24, 0.67, "tips"), (0.25, 0.0, "plain")],
)
def test_draw_rollout_thresholds(u_memory: float, u_off: float, expected: str) -> None:
    assert draw_rollout(u_memory, u_off, p=0.25, q=2 / 3) == expected


def test_draw_rollout_rejects_probabilities_outside_0_1() -> None:
    with pytest.raises(ValueError, match=r"p and q must be in \[0, 1\]"):
        draw_rollout(0.1, 0.1, p=1.5, q=0.5)


@pytest.mark.parametrize(("p", "q"), [(0.25, 2 / 3), (0.7, 0.3), (0.0, 0.5), (1.0, 1.0)])
def test_rollout_frequencies_match_p_and_q(p: float, q: float) -> None:
    n = 20_000
    counts = Counter(rollout_of(7, "update", k, p, q) for k in range(n))
    memory = counts["tips"] + counts["distill"]
    # binomial standard errors are below 0.0035 and 0.006 here; allow 4 of them
    assert abs(memory / n - p) < 0.014
    if memory:
        assert abs(counts["distill"] / memory - q) < 0.025


def test_rollout_of_is_a_function_of_seed_draw_and_key() -> None:
    first = [rollout_of(3, "episode", k, 0.5, 0.5) for k in range(200)]
    assert first == [rollout_of(3, "episode", k, 0.5, 0.5) for k in range(200)]
    assert first != [rollout_of(4, "episode", k, 0.5, 0.5) for k in range(200)]
    assert first != [rollout_of(3, "update", k, 0.5, 0.5) for k in range(200)]


# ---------------------------------------------------------------------------------------------
# The novelty bonus


def test_intrinsic_reward_is_the_mean_of_one_over_n_plus_one() -> None:
    assert intrinsic_reward([0, 1, 3]) == pytest.approx((1 + 1 / 2 + 1 / 4) / 3)
    assert intrinsic_reward([0]) == 1.0
    assert intrinsic_reward([]) == 0.0


def test_intrinsic_reward_caps_the_count() -> None:
    assert intrinsic_reward([25, 10]) == pytest.approx(1 / 11)
    assert intrinsic_reward([25], cap=3) == pytest.approx(1 / 4)


def test_intrinsic_reward_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        intrinsic_reward([1, -1])


# ---------------------------------------------------------------------------------------------
# Tip stripping


@pytest.fixture(scope="module")
def tokenizer():
    world = MiniLab()
    play = pretrain_episodes(world, EmbeddedSpec(episodes_per_family=12, eval_variants=3))
    texts = [t for ep in play for t in episode_texts(ep)] + list(prompt_texts(play[0]))
    return build_tokenizer(*word_pieces(texts), 1024)


NOTES = [
    "plan: open box, take apple.\nfound: apple after open box.",
    "avoid: turn on oven.",
    "found: iron wire after open chest, battery after open crate.",
]

histories = st.lists(
    st.tuples(st.sampled_from(["open box", "look", "take apple"]), st.sampled_from(["ok.", "no."])),
    max_size=6,
)


@given(history=histories, tips=st.lists(st.sampled_from(NOTES), min_size=1, max_size=3))
def test_stripping_tips_gives_the_no_memory_prompt_token_for_token(
    tokenizer, history: list[tuple[str, str]], tips: list[str]
) -> None:
    shown = turn_messages("find the apple.", history, "you see a box.", tips=tips)
    bare = turn_messages("find the apple.", history, "you see a box.")
    assert strip_tips(shown, tips) == bare
    assert encode_prompt(tokenizer, strip_tips(shown, tips)) == encode_prompt(tokenizer, bare)


def test_deleting_tip_token_spans_is_not_the_no_memory_prompt(tokenizer) -> None:
    """Why stripping re-renders the text: byte-level BPE merges the observation's last "."
    with the newline the tip line starts with, so cutting tokens would leave ".\\n"."""
    shown = encode_prompt(
        tokenizer, turn_messages("find the apple.", [], "you see a box.", tips=NOTES[:1]), NOTES[:1]
    )
    vocab = tokenizer.get_vocab()
    start, end = shown.index(vocab["<tip>"]), shown.index(vocab["</tip>"])
    cut = shown[:start] + shown[end + 1 :]
    bare = encode_prompt(tokenizer, turn_messages("find the apple.", [], "you see a box."))
    assert cut != bare and len(cut) == len(bare)


def test_strip_tips_refuses_tips_that_are_not_at_the_end() -> None:
    shown = turn_messages("g.", [], "o.", tips=["a."])
    with pytest.raises(ValueError, match="not a user message ending with these tips"):
        strip_tips(shown, ["b."])


# ---------------------------------------------------------------------------------------------
# The off-policy ratio's two inputs, and masking


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_qwen2(len(tokenizer), positions=512, pad_token_id=tokenizer.pad_token_id)


def tipped_requests() -> list[ActionRequested]:
    """One turn per note, the note shown as a tip."""
    requests = []
    for turn, tip in enumerate(NOTES):
        messages = turn_messages("find the apple.", [], "you see a box.", tips=[tip])
        requests.append(
            ActionRequested(
                episode="ep0",
                worker="w",
                turn=turn,
                messages=tuple((m["role"], m["content"]) for m in messages),
                admissible=("open box", "take apple", "open bin"),
                seed=turn,
                tips=(tip,),
            )
        )
    return requests


@pytest.fixture(scope="module")
def sampled(model, tokenizer):
    """Turns answered by the runner with tips shown (so they carry ``bare_prompt_ids``)."""
    runner = PolicyRunner(model, tokenizer, ActSettings(temperature=1.0))
    return runner.answer(tipped_requests())


def test_the_runner_records_the_prompt_without_tips(sampled, tokenizer) -> None:
    bare = encode_prompt(tokenizer, turn_messages("find the apple.", [], "you see a box."))
    for s in sampled:
        assert s.bare_prompt_ids == tuple(bare)
        assert len(s.prompt_ids) > len(bare)


def test_distill_samples_score_the_bare_prompt_against_the_tipped_behaviour(
    model, tokenizer, sampled
) -> None:
    pad = tokenizer.pad_token_id
    cpu = torch.device("cpu")
    distill = [Sample(s, 1.0, distill=True) for s in sampled]
    logp, old, _ = sample_logps(model, distill, pad, cpu)
    bare = chosen_action_logps(
        model,
        [s.bare_prompt_ids for s in sampled],
        [s.candidates for s in sampled],
        [s.choice for s in sampled],
        temperature=1.0,
        pad_id=pad,
        device=cpu,
    )
    assert torch.allclose(logp, bare)
    recorded = torch.tensor([s.logp for s in sampled])  # pi_old(a | s, tips), from the event
    assert torch.equal(old[:, 0], recorded)
    on_policy, old2, _ = sample_logps(model, [Sample(s, 1.0) for s in sampled], pad, cpu)
    # with tips, the current policy is the behaviour policy: ratio 1
    assert torch.allclose(on_policy, old2, atol=1e-5)
    assert not torch.allclose(logp, on_policy, rtol=0, atol=1e-6)  # the tips mattered


def _request(**kw) -> GradientRequested:
    return GradientRequested(update=0, episodes=("ep0",), advantages=(1.0,), lr=1e-2, **kw)


def test_low_prob_masking_drops_unlikely_responses_from_the_loss(model, tokenizer) -> None:
    """Generate mode: a response is dropped when one of its sampled tokens was unlikely."""
    settings = ActSettings(mode="generate", temperature=1.0, max_new_tokens=6)
    turns = PolicyRunner(model, tokenizer, settings).answer(tipped_requests())
    samples = [Sample(s, 1.0, distill=True) for s in turns]
    trainee = Trainee(copy.deepcopy(model), tokenizer, torch.device("cpu"), reference=False)
    # a threshold below every behaviour token log-prob keeps everything: a real step
    lowest = min(min(s.token_logps) for s in turns)
    kept = grpo_step(trainee, samples, _request(low_prob_delta=lowest - 1.0), seed=0)
    assert kept.grad_norm > 0 and kept.low_prob_masked == 0
    # between: the responses whose least likely token is below it, counted
    middle = sorted(min(s.token_logps) for s in turns)[len(turns) // 2]
    some = grpo_step(trainee, samples, _request(low_prob_delta=middle), seed=0)
    assert some.low_prob_masked == sum(min(s.token_logps) < middle for s in turns) > 0
    assert grpo_step(trainee, samples, _request(), seed=0).low_prob_masked is None  # mask off
    # a threshold above every response's least likely token: nothing is trained on
    highest = max(min(s.token_logps) for s in turns)
    assert highest < 0
    masked = grpo_step(trainee, samples, _request(low_prob_delta=highest / 2), seed=0)
    assert masked.grad_norm == 0.0 and masked.loss == 0.0
    assert masked.low_prob_masked == len(samples)
    assert not math.isnan(masked.ratio_mean)


def test_low_prob_masking_is_refused_for_scored_actions(model, tokenizer, sampled) -> None:
    """A scored action's log-prob is over the admissible actions (about -log of their number),
    not a sampled token's: the threshold would mask by the size of the action list."""
    trainee = Trainee(copy.deepcopy(model), tokenizer, torch.device("cpu"), reference=False)
    samples = [Sample(s, 1.0) for s in sampled]
    with pytest.raises(ValueError, match='low-probability masking needs "generate" mode'):
        grpo_step(trainee, samples, _request(low_prob_delta=-5.0), seed=0)


# ---------------------------------------------------------------------------------------------
# Memory slots


@pytest.mark.parametrize(("memory", "slots"), [("variant", {""}), ("family", {"train/heat"})])
def test_the_memory_setting_names_the_slot_of_training_episodes(memory: str, slots: set) -> None:
    world = MiniLab()
    trainer = GrpoTrainer(
        world.tasks("heat", "train"),
        world.tasks("heat", "heldout"),
        64,
        ["w0"],
        GrpoConfig(group_size=4, groups_per_update=2),
        EvalConfig(every=0),
        Empo2(GrpoConfig(), Empo2Config(p=1.0, memory=memory)),  # type: ignore[arg-type]
    )
    ctx = SimpleNamespace(run_seed=3)
    for _ in range(4):
        trainer._plan_group(ctx)  # type: ignore[arg-type]
    jobs = list(trainer._queue)
    assert {j.slot for j in jobs} == slots  # "": the worker uses the variant's slot
    assert len({j.variant for j in jobs}) == 4 and all(j.reflect for j in jobs)
