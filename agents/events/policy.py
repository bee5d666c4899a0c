"""Policy events: what the policy was asked, what it sampled, and how it was trained.

A turn of a policy-driven episode is ``ActionRequested`` (the env worker, with the prompt it
built) then ``ActionSampled`` (the inference actor: the chosen action with its token ids and
log-probs, and the policy version that chose it), then the world's ``StepTaken``. A GRPO update
is ``AdvantagesComputed`` per group and one ``GradientRequested`` (the trainer), then
``PolicyUpdated`` (the learner). Model output is data: replay folds these events and never
re-runs a model, and every advantage can be re-derived from the logged rewards.

Fields say ``policy_version``, because ``version`` is an event class's schema version.
"""

from __future__ import annotations

from engine.events import Event, event


@event
class ActionRequested(Event, tag="action_requested", frozen=True, kw_only=True):
    """An env worker asks the policy for the next action of ``episode``.

    ``messages`` is the prompt as ``(role, content)`` pairs, exactly as rendered; ``tips`` are
    the memory entries shown in it (already inside the user message). ``seed`` names the
    request's own random stream, so what is sampled never depends on how requests were batched.
    """

    episode: str
    worker: str
    turn: int
    messages: tuple[tuple[str, str], ...]
    admissible: tuple[str, ...]
    seed: int
    greedy: bool = False
    tips: tuple[str, ...] = ()


@event
class ActionSampled(Event, tag="action_sampled", frozen=True, kw_only=True):
    """The policy's answer to one :class:`ActionRequested`.

    Attributes:
        policy_version: the policy version that sampled it.
        action: the action text sent to the world.
        prompt_ids: the prompt's token ids.
        response_ids: the response's token ids (the action, then end-of-sequence).
        token_logps: the log-prob of each response token under the sampling policy.
        candidates: token ids of every admissible action ("score" mode; empty in "generate").
        candidate_scores: the sum of token log-probs of each candidate ("score" mode).
        choice: the index of the chosen candidate ("score" mode; -1 in "generate").
        logp: the log-prob of the whole action under the sampling policy: in "score" mode the
            log-softmax over candidates (at the temperature used), in "generate" mode the sum of
            ``token_logps``.
        temperature: the sampling temperature (0 for greedy).
        mode: "score" or "generate".
        valid: False when a generated action was not admissible (the world then answers
            "you can not do that.").
        bare_prompt_ids: when the prompt showed tips, its token ids with the tip spans removed
            (what EMPO2's off-policy distillation trains the current policy on); else empty.
        prompt_cut: how many tokens the prompt lost from its middle to fit the model's
            positions with the response (``agents.models.prompts.cut_middle``); 0: none.
    """

    episode: str
    worker: str
    turn: int
    policy_version: int
    action: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    token_logps: tuple[float, ...]
    candidates: tuple[tuple[int, ...], ...] = ()
    candidate_scores: tuple[float, ...] = ()
    choice: int = -1
    logp: float
    temperature: float
    mode: str = "score"
    valid: bool = True
    bare_prompt_ids: tuple[int, ...] = ()
    prompt_cut: int = 0


@event
class AdvantagesComputed(Event, tag="advantages_computed", frozen=True, kw_only=True):
    """The advantages of one group of rollouts of the same task (pure function of ``rewards``).

    ``rule`` names the formula (e.g. ``"grpo-std"`` or ``"grpo-mean"``); ``eps`` is the
    denominator's epsilon. Every turn of ``episodes[i]`` gets ``advantages[i]``.

    With EMPO2's novelty bonus, ``rewards[i] = outcomes[i] + intrinsic_coef * intrinsic[i]``:
    the outcome and the intrinsic reward are recorded apart (both empty without the bonus,
    when ``rewards`` are the outcomes). ``rollouts[i]`` is the episode's rollout mode.

    ``mean`` and ``std`` are the whole group's rewards'
    (``agents.methods.advantages.group_stats``); with guided and free subgroups
    (Complementary RL) each subgroup's advantages are taken against its own mean, which
    ``advantages`` reflect and these do not.
    """

    group: str
    update: int
    family: str
    variant: int
    episodes: tuple[str, ...]
    rewards: tuple[float, ...]
    advantages: tuple[float, ...]
    rule: str
    eps: float
    mean: float
    std: float
    outcomes: tuple[float, ...] = ()
    intrinsic: tuple[float, ...] = ()
    intrinsic_coef: float = 0.0
    rollouts: tuple[str, ...] = ()


LAYOUTS = ("kept", "packed", "rows")
"""Where an update's forward pass runs the output layer, as its event records it
(``GradientRequested.scoring``, ``ExtractorUpdated.scoring``; computed by
``agents.models.policy.scored_logits`` and ``response_logps``): "kept" since 2026-12-05,
"packed" and "rows" before."""

SCORING = LAYOUTS[0]
"""The layout a new update computes in (a resumed run goes on with its log's)."""

UNRECORDED_LAYOUTS = ("packed", "rows")
"""The layouts a request that records none (written before 2026-12-02) may have used."""


@event
class GradientRequested(Event, tag="gradient_requested", frozen=True, kw_only=True):
    """The trainer asks the learner for update ``update`` (it produces version ``update + 1``).

    The samples are every turn of ``episodes``, each with its episode's advantage; the loss
    settings are recorded so that an update can be re-derived from the log alone.
    ``rollouts[i]`` is EMPO2's rollout mode of ``episodes[i]`` (empty: all "plain"): the turns
    of a "distill" episode are trained with the tips removed from the current policy's prompt
    (``ActionSampled.bare_prompt_ids``) against the tip-conditioned behaviour log-probs.
    ``low_prob_delta``: EMPO2's sequence-level low-probability masking threshold (None: off).
    ``tis_cap``: truncated importance sampling against the sampler's log-probs with this cap
    (``agents.methods.tis``; None: off, the ratio is taken against the sampler's log-probs).
    ``skip_zero_advantage``: a minibatch's turns with advantage 0 skip the forward and backward
    passes (they add 0 to the loss; its normaliser still counts them: the same gradient up to
    float rounding); False in logs written before it existed, whose updates re-execute as
    they ran. ``scoring``: how the learner lays turns out in its forward pass and where its
    output layer runs (:data:`LAYOUTS`: "kept", at the places it trains on,
    for "score" and "generate" turns; "packed" before 2026-12-05, "rows" before 2026-12-01);
    None in logs written before it was recorded (2026-12-02), which used "packed" or "rows":
    re-execution finds which one reproduces each update's digest.
    """

    update: int
    episodes: tuple[str, ...]
    advantages: tuple[float, ...]
    mode: str = "on-policy"
    rollouts: tuple[str, ...] = ()
    low_prob_delta: float | None = None
    epochs: int = 1
    minibatch: int = 64
    lr: float = 1e-3
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    kl_coef: float = 0.0
    aggregation: str = "seq-mean-token-mean"
    max_grad_norm: float = 1.0
    max_staleness: int = 1
    tis_cap: float | None = None
    skip_zero_advantage: bool = False
    scoring: str | None = None


@event
class PolicyUpdated(Event, tag="policy_updated", frozen=True, kw_only=True):
    """The learner applied update ``update``: the policy is now ``policy_version``.

    Attributes:
        samples: turns trained on; ``stale`` of the requested turns were dropped because they
            were sampled by a version older than the staleness bound allows.
        loss, grad_norm, clip_frac, kl, ratio_mean: means over the update's minibatches
            (``grad_norm`` before clipping; ``kl`` the approximate KL to the sampling policy).
        ref_kl: the KL to the frozen reference (0 when ``kl_coef`` is 0).
        digest: blake2b of the new parameters, in name order.
        checkpoint: the directory of the safetensors checkpoint written, relative to the run.
        seconds: wall time of the update.
        seed: the seed that shuffled the minibatches (None in logs written before it was
            recorded: ``agents.learning.learner.update_seed`` re-derives it from the run seed).
        parent_digest: the digest of the parameters the update started from (version 0: the
            base model); "" in older logs.
        gap_tokens, gap_abs_mean, gap_abs_max, gap_kl: the gap between the learner's
            log-probs before the update's first step and the sampler's recorded ones, over
            ``gap_tokens`` tokens of the samples the current version drew (every such sample's
            with ``tis_cap``, else the first minibatch's; ``agents.methods.tis.SamplerGap``);
            None in older logs and when none was compared.
        tis_clip_frac: the fraction of tokens whose importance weight ``tis_cap`` truncated
            (None: truncated importance sampling off).
        trainable_params, total_params, optimizer_bytes, peak_bytes: what the trained state
            costs (``agents.models.tuning.MemoryUse``; ``peak_bytes`` on CUDA only); None in
            older logs.
        threads: the torch CPU threads the update ran with (its floating-point sums, and so
            its digest, depend on them; re-execution runs with as many). None in older logs:
            the scenario's ``[policy] threads``.
        low_prob_masked: how many of the ``samples`` EMPO2's low-probability mask
            (``[empo2] low_prob_mask``) dropped from the loss; None with the mask off and in
            older logs.
    """

    policy_version: int
    update: int
    samples: int
    stale: int
    loss: float
    grad_norm: float
    clip_frac: float
    kl: float
    ratio_mean: float
    ref_kl: float
    digest: str
    checkpoint: str
    seconds: float
    seed: int | None = None
    parent_digest: str = ""
    gap_tokens: int | None = None
    gap_abs_mean: float | None = None
    gap_abs_max: float | None = None
    gap_kl: float | None = None
    tis_clip_frac: float | None = None
    trainable_params: int | None = None
    total_params: int | None = None
    optimizer_bytes: int | None = None
    peak_bytes: int | None = None
    threads: int | None = None
    low_prob_masked: int | None = None


@event
class EvalRoundStarted(Event, tag="eval_round_started", frozen=True, kw_only=True):
    """An evaluation round on held-out variants begins, with the policy at ``policy_version``.

    ``memory``: the episodes are shown the training bank's entries (Complementary RL's
    evaluation with its bank; a round without memory of the same number plays the same tasks).
    ``holds_updates``: the trainer requests no policy update until every round at this
    version has ended (EMPO2's adaptation round too), so no other version plays in it; False
    in logs written before 2026-12-05, whose rounds could be played partly by the versions
    that landed meanwhile.
    """

    round: int
    policy_version: int
    episodes: int
    memory: bool = False
    holds_updates: bool = False


@event
class EvalRoundFinished(Event, tag="eval_round_finished", frozen=True, kw_only=True):
    """An evaluation round ended: its success rate and mean score over ``episodes``
    (``memory`` as in :class:`EvalRoundStarted`)."""

    round: int
    policy_version: int
    episodes: int
    success: float
    score: float
    train_episodes: int
    memory: bool = False


@event
class AdaptRoundFinished(Event, tag="adapt_round_finished", frozen=True, kw_only=True):
    """EMPO2's adaptation test ended: ``tasks`` held-out tasks, each played ``attempts`` times
    in a row by the policy at ``policy_version`` with a memory of its own and no weight update.

    ``success[a]`` and ``score[a]`` are the rates at attempt ``a`` (attempt 0: empty memory);
    ``aborted`` episodes count as failures.
    """

    round: int
    policy_version: int
    tasks: int
    attempts: int
    success: tuple[float, ...]
    score: tuple[float, ...]
    aborted: int
