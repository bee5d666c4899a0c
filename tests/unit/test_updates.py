"""One update of a real (tiny) model, end to end through the learner's and the extractor's step:
its direction follows the advantage's sign, an update without signal leaves the weights alone,
dropout never makes an on-policy ratio differ from 1, CISPO's token mean is over the whole batch,
and every turn trains with its own episode's advantage and distill flag."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import torch
from transformers import Qwen2ForCausalLM

from agents.events.episodes import EpisodeAbandoned
from agents.events.extractor import ExtractorCalled, ExtractorGradientRequested
from agents.events.policy import ActionSampled, GradientRequested
from agents.learning.learner import SampleBuffer
from agents.learning.update import Sample, Trainee, grpo_step
from agents.memory.extractor import ExtractorModel, ExtractorSettings, extractor_step
from agents.models.policy import chosen_action_logps, response_logps
from agents.models.tuning import deterministic_algorithms
from agents.testing.events import action_sampled as turn
from agents.testing.events import episode_finished as ended
from agents.testing.models import tiny_qwen2
from engine.events import Envelope, Event
from stores.checkpoints import param_digest

CPU = torch.device("cpu")
TOKENIZER = SimpleNamespace(pad_token_id=0)
PROMPTS = [[3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13, 14]]
CANDIDATES = [[[5, 6], [7], [8, 9, 10]], [[11], [12, 13]], [[1, 2], [3, 4], [15], [16]]]
RESPONSES = [[20, 21, 1], [22, 1], [23, 24, 25, 1]]


def tiny_model(dropout: float = 0.0) -> Qwen2ForCausalLM:
    """A tiny Qwen2, in eval mode as a loaded model is (``stores.model_dirs.load_model_dir``)."""
    return tiny_qwen2(layers=2, heads=4, kv_heads=2, attention_dropout=dropout)


def score_turns(model: Qwen2ForCausalLM, episode: str = "ep0") -> list[ActionSampled]:
    """One "score" turn per prompt, choosing candidate 0, with its behaviour log-prob."""
    with torch.no_grad():
        logp = chosen_action_logps(
            model, PROMPTS, CANDIDATES, [0] * 3, temperature=1.0, pad_id=0, device=CPU
        )[:, 0]
    return [
        ActionSampled(
            episode=episode,
            worker="w",
            turn=i,
            policy_version=0,
            action=f"a{i}",
            prompt_ids=tuple(PROMPTS[i]),
            response_ids=tuple(CANDIDATES[i][0]),
            token_logps=(),
            candidates=tuple(tuple(c) for c in CANDIDATES[i]),
            choice=0,
            logp=float(logp[i]),
            temperature=1.0,
        )
        for i in range(3)
    ]


def generate_turns(model: Qwen2ForCausalLM, episode: str = "ep0") -> list[ActionSampled]:
    """One "generate" turn per prompt, with its behaviour token log-probs."""
    with torch.no_grad():
        logp, _ = response_logps(model, PROMPTS, RESPONSES, temperature=1.0, pad_id=0, device=CPU)
    return [
        ActionSampled(
            episode=episode,
            worker="w",
            turn=i,
            policy_version=0,
            action=f"a{i}",
            prompt_ids=tuple(PROMPTS[i]),
            response_ids=tuple(RESPONSES[i]),
            token_logps=tuple(logp[i, : len(RESPONSES[i])].tolist()),
            logp=float(logp[i, : len(RESPONSES[i])].sum()),
            temperature=1.0,
            mode="generate",
        )
        for i in range(3)
    ]


TURNS = {"score": score_turns, "generate": generate_turns}


def request(**kw: object) -> GradientRequested:
    base: dict[str, object] = dict(
        update=0, episodes=("ep0",), advantages=(1.0,), lr=1e-3, minibatch=64, max_grad_norm=1e6
    )
    return GradientRequested(**{**base, **kw})  # type: ignore[arg-type]


def action_logps(model: Qwen2ForCausalLM, turns: list[ActionSampled]) -> torch.Tensor:
    """Each turn's log-prob of its action under ``model`` now: (B,)."""
    with torch.no_grad():
        if turns[0].mode == "score":
            return chosen_action_logps(
                model,
                [t.prompt_ids for t in turns],
                [t.candidates for t in turns],
                [t.choice for t in turns],
                temperature=1.0,
                pad_id=0,
                device=CPU,
            )[:, 0]
        logp, mask = response_logps(
            model,
            [t.prompt_ids for t in turns],
            [t.response_ids for t in turns],
            temperature=1.0,
            pad_id=0,
            device=CPU,
        )
        return (logp * mask).sum(-1)


# ---------------------------------------------------------------------------------------------
# The learner's step


@pytest.mark.parametrize("mode", ["score", "generate"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_update_moves_each_action_the_way_its_advantage_says(mode: str, sign: float) -> None:
    model = tiny_model()
    turns = TURNS[mode](model)
    before = action_logps(model, turns)
    trainee = Trainee(model, TOKENIZER, CPU, reference=False)
    grpo_step(trainee, [Sample(t, sign) for t in turns], request(), seed=0)
    moved = action_logps(model, turns) - before
    assert bool((sign * moved > 0).all()), moved


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_an_update_with_dropout_in_the_model_is_on_policy_with_ratio_one(mode: str) -> None:
    """Dropout stays off while training: the first minibatch, before any step, sees exactly the
    behaviour log-probs (ratio 1, KL 0), and gradients still flow."""
    model = tiny_model(dropout=0.5)
    turns = TURNS[mode](model)
    trainee = Trainee(model, TOKENIZER, CPU, reference=False)
    stats = grpo_step(trainee, [Sample(t, 1.0) for t in turns], request(), seed=0)
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-5)
    assert stats.kl == pytest.approx(0.0, abs=1e-6)
    assert stats.clip_frac == 0.0 and stats.grad_norm > 0
    assert not model.training


def no_signal(mode: str, turns: list[ActionSampled]) -> tuple[list[Sample], GradientRequested]:
    if mode == "zero-advantage":
        return [Sample(t, 0.0) for t in turns], request()
    # every response holds a token below the threshold: all masked out of the loss
    highest = max(max(t.token_logps) for t in turns)
    return [Sample(t, 1.0) for t in turns], request(low_prob_delta=highest / 2)


@pytest.mark.parametrize("mode", ["zero-advantage", "all-masked"])
def test_an_update_without_signal_leaves_the_weights_unchanged(mode: str) -> None:
    """AdamW's momentum from an earlier update must not move the weights when an update has
    no signal (and no KL term)."""
    model = tiny_model()
    turns = generate_turns(model)
    trainee = Trainee(model, TOKENIZER, CPU, reference=False)
    grpo_step(trainee, [Sample(t, 1.0) for t in turns], request(), seed=0)  # builds momentum
    digest = param_digest(model)
    samples, req = no_signal(mode, turns)
    stats = grpo_step(trainee, samples, msgspec.structs.replace(req, update=1), seed=1)
    assert param_digest(model) == digest
    assert stats.grad_norm == 0.0 and stats.samples == len(turns)


@pytest.mark.parametrize(
    ("mode", "aggregation", "low_prob"),
    [
        ("score", "seq-mean-token-mean", False),
        ("score", "token-mean", False),
        ("generate", "seq-mean-token-mean", False),
        ("generate", "token-mean", False),
        ("generate", "seq-mean-token-sum", False),
        ("generate", "token-mean", True),
        ("generate", "seq-mean-token-mean", True),
    ],
)
def test_turns_with_advantage_zero_skip_the_passes_and_the_gradient_stays(
    mode: str, aggregation: str, low_prob: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``skip_zero_advantage`` a mixed minibatch runs its forward and backward passes on
    the turns with a nonzero advantage only, and its loss and gradient are those of the whole
    minibatch (its normaliser still counts the others, low-probability masking included). Two
    epochs over one minibatch: the first (which measures the sampler's gap) runs every turn,
    the second only the signal."""
    import agents.learning.update as update

    turns = TURNS[mode](tiny_model())
    samples = [Sample(t, 1.0 - 0.5 * t.turn) for t in turns]  # 1.0, 0.5, 0.0
    samples += [Sample(msgspec.structs.replace(t, episode="ep1"), 0.0) for t in turns]
    delta = None
    if low_prob:  # drop the response with the lowest token, in both episodes
        delta = sorted(min(t.token_logps) for t in turns)[1]
    rows: list[int] = []
    for name in ("chosen_action_logps", "response_logps"):
        real = getattr(update, name)

        def counted(model: object, prompts: list, *a: object, _real=real, **kw: object) -> object:
            rows.append(len(prompts))
            return _real(model, prompts, *a, **kw)

        monkeypatch.setattr(update, name, counted)
    results = {}
    for skip in (False, True):
        rows.clear()
        model = tiny_model()
        req = request(
            epochs=2, aggregation=aggregation, low_prob_delta=delta, skip_zero_advantage=skip
        )
        stats = grpo_step(Trainee(model, TOKENIZER, CPU, reference=False), samples, req, seed=0)
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results[skip] = (list(rows), stats.loss, grads)
    assert results[False][0] == [6, 6]
    assert results[True][0] == [6, 2]  # the second epoch: the two turns with advantage != 0
    assert results[True][1] == pytest.approx(results[False][1], rel=1e-5)
    torch.testing.assert_close(results[True][2], results[False][2], rtol=1e-4, atol=1e-7)
    if mode == "score" and aggregation == "token-mean":  # a KL term: every turn feeds it
        rows.clear()
        model = tiny_model()
        req = request(epochs=2, kl_coef=0.1, skip_zero_advantage=True)
        grpo_step(Trainee(model, TOKENIZER, CPU, reference=True), samples, req, seed=0)
        assert rows == [6] * 4  # the trainee's and the reference's pass, twice


# ---------------------------------------------------------------------------------------------
# The extractor's step


def extractor(dropout: float = 0.0) -> ExtractorModel:
    return ExtractorModel(tiny_model(dropout), TOKENIZER, ExtractorSettings())


def calls_of(ext: ExtractorModel) -> list[ExtractorCalled]:
    """One extraction call per prompt, its response sampled by ``ext`` as it is now."""
    with torch.no_grad():
        logp, _ = response_logps(
            ext.model, PROMPTS, RESPONSES, temperature=1.0, pad_id=0, device=CPU
        )
    return [
        ExtractorCalled(
            call=f"x{i}",
            task="extract",
            source=f"ep{i}",
            slot="train/heat",
            prompt_ids=tuple(PROMPTS[i]),
            response_ids=tuple(RESPONSES[i]),
            token_logps=tuple(logp[i, : len(RESPONSES[i])].tolist()),
            text="t",
            temperature=1.0,
            extractor_version=0,
        )
        for i in range(3)
    ]


def ext_request(
    calls: list[ExtractorCalled], advantages: list[float], weights: list[float] | None = None
) -> ExtractorGradientRequested:
    return ExtractorGradientRequested(
        update=0,
        step=0,
        calls=tuple(c.call for c in calls),
        rewards=tuple(advantages),
        advantages=tuple(advantages),
        weights=tuple(weights or [1.0] * len(calls)),
        credits=(),
        lr=1e-3,
        max_grad_norm=1e6,
    )


def response_sums(ext: ExtractorModel, calls: list[ExtractorCalled]) -> torch.Tensor:
    with torch.no_grad():
        logp, mask = response_logps(
            ext.model,
            [c.prompt_ids for c in calls],
            [c.response_ids for c in calls],
            temperature=1.0,
            pad_id=0,
            device=CPU,
        )
    return (logp * mask).sum(-1)  # (B,)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_cispo_update_moves_each_response_the_way_its_advantage_says(sign: float) -> None:
    ext = extractor()
    calls = calls_of(ext)
    before = response_sums(ext, calls)
    extractor_step(ext, calls, ext_request(calls, [sign] * 3))
    moved = response_sums(ext, calls) - before
    assert bool((sign * moved > 0).all()), moved


def test_a_cispo_update_with_dropout_in_the_model_is_on_policy() -> None:
    """On-policy the clipped weight is 1, so the loss is minus the advantage-weighted token
    mean of the behaviour log-probs; dropout in training mode would change every log-prob."""
    ext = extractor(dropout=0.5)
    calls = calls_of(ext)
    advantages = [1.0, -0.5, 2.0]
    stats = extractor_step(ext, calls, ext_request(calls, advantages))
    tokens = sum(len(c.response_ids) for c in calls)
    expected = -sum(a * sum(c.token_logps) for a, c in zip(advantages, calls, strict=True))
    assert stats.loss == pytest.approx(expected / tokens, abs=1e-5)
    assert stats.clip_frac == 0.0 and stats.grad_norm > 0
    assert not ext.model.training


def test_an_extractor_update_without_signal_leaves_the_weights_unchanged() -> None:
    ext = extractor()
    calls = calls_of(ext)
    extractor_step(ext, calls, ext_request(calls, [1.0, -1.0, 0.5]))  # builds momentum
    digest = param_digest(ext.model)
    stats = extractor_step(ext, calls, ext_request(calls, [1.0, -1.0, 0.5], [0.0, 0.0, 0.0]))
    assert param_digest(ext.model) == digest and stats.samples == 0
    extractor_step(ext, calls, ext_request(calls, [0.0, 0.0, 0.0]))
    assert param_digest(ext.model) == digest


def test_a_cooled_down_call_still_counts_in_cispos_token_mean() -> None:
    """``J = sum_i sum_t ... / sum_i |m_i|`` over the whole batch: a call in cooldown (weight
    0) adds nothing above the line but its tokens below it, so leaving it out of the loss
    must not scale up the other calls' gradients."""
    ext = extractor()
    calls = calls_of(ext)
    alone = copy.deepcopy(ext)
    with_cooled = extractor_step(ext, calls, ext_request(calls, [1.0, -1.0, 0.5], [1, 1, 0]))
    kept = calls[:2]
    without = extractor_step(alone, kept, ext_request(kept, [1.0, -1.0]))
    share = sum(len(c.response_ids) for c in kept) / sum(len(c.response_ids) for c in calls)
    assert with_cooled.samples == without.samples == 2
    assert with_cooled.loss == pytest.approx(without.loss * share, rel=1e-5)
    assert with_cooled.grad_norm == pytest.approx(without.grad_norm * share, rel=1e-4)


# ---------------------------------------------------------------------------------------------
# Samples: each turn with its own episode's advantage and distill flag


def test_each_turn_gets_its_own_episodes_advantage_and_distill_flag() -> None:
    buffer = SampleBuffer()
    stream = [turn("a", 0), turn("b", 0), turn("c", 0), turn("a", 1), turn("c", 1), turn("b", 1)]
    stream += [turn("a", 2), ended("b"), ended("a"), ended("c")]
    for seq, ev in enumerate(stream):
        buffer.observe(Envelope(seq=seq, run="r", t=0, actor="x", event=ev))
    req = request(
        episodes=("c", "a", "b"),
        advantages=(0.5, -1.25, 2.0),
        rollouts=("plain", "distill", "tips"),
    )
    samples, stale = buffer.collect(req)
    got = sorted((s.turn.episode, s.turn.turn, s.adv, s.distill) for s in samples)
    assert stale == 0
    assert got == [
        ("a", 0, -1.25, True),
        ("a", 1, -1.25, True),
        ("a", 2, -1.25, True),
        ("b", 0, 2.0, False),
        ("b", 1, 2.0, False),
        ("c", 0, 0.5, False),
        ("c", 1, 0.5, False),
    ]


def test_a_sample_for_an_abandoned_attempt_is_not_trained_on() -> None:
    """A worker lost mid-episode: its attempt is abandoned and the episode played again; the
    inference's answer to the lost attempt's request, committed after the abandon, is dropped,
    and the re-run's samples are kept."""
    log: list[tuple[Event, int | None]] = [
        (turn("a", 0), 0),  # the lost attempt's turn 0 (its request at seq 0)
        (EpisodeAbandoned(episode="a", worker="w", reason="worker restarted"), None),
        (turn("a", 1), 0),  # answers a request made before the abandon: the lost attempt's
        (turn("a", 0), 3),  # the re-run's turns answer requests made after it
        (turn("a", 1), 4),
        (ended("a"), None),
    ]
    buffer = SampleBuffer()
    for seq, (ev, cause) in enumerate(log, start=1):
        buffer.observe(Envelope(seq=seq, run="r", t=0, actor="x", event=ev, cause=cause))
    samples, _ = buffer.collect(request(episodes=("a",), advantages=(1.0,), rollouts=("plain",)))
    assert [s.turn.turn for s in samples] == [0, 1]


def test_an_update_runs_with_deterministic_algorithms_and_restores_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With several torch threads, the backward pass of packed scoring's gather (repeated
    places) adds with atomic adds in parallel unless torch's deterministic algorithms are on:
    its last bits then changed from run to run on a busy machine (seen with 2 threads)."""
    import agents.learning.update as update_module

    seen: list[bool] = []
    one_step = update_module._one_step  # the spy wraps the private step

    def spying(*args: object, **kwargs: object) -> object:
        seen.append(torch.are_deterministic_algorithms_enabled())
        return one_step(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(update_module, "_one_step", spying)
    model = tiny_model()
    samples = [Sample(t, 1.0) for t in score_turns(model)]
    assert not torch.are_deterministic_algorithms_enabled()
    grpo_step(Trainee(model, TOKENIZER, CPU, reference=False), samples, request(), seed=0)
    assert seen and all(seen)
    assert not torch.are_deterministic_algorithms_enabled()


def test_an_extractor_update_runs_with_deterministic_algorithms_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agents.memory.extractor as extractor_module

    seen: list[bool] = []
    loss = extractor_module.cispo_loss

    def spying(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.are_deterministic_algorithms_enabled())
        return loss(*args, **kwargs)

    monkeypatch.setattr(extractor_module, "cispo_loss", spying)
    ext = extractor()
    calls = calls_of(ext)
    extractor_step(ext, calls, ext_request(calls, [1.0] * 3))
    assert seen == [True] and not torch.are_deterministic_algorithms_enabled()


def test_overlapping_updates_keep_deterministic_algorithms_on_until_the_last_ends() -> None:
    """The policy's and the extractor's updates run in threads of one process and may
    overlap: the first to end must not switch the setting off under the other."""
    first, second = deterministic_algorithms(), deterministic_algorithms()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert torch.are_deterministic_algorithms_enabled()
    second.__exit__(None, None, None)
    assert not torch.are_deterministic_algorithms_enabled()
