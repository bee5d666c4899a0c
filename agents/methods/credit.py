"""Complementary RL's credit to the experience extractor, its count-aware reweighting, and the
diversified retrieval that decides which entry an actor sees (ALGORITHMS.md section 3).

Plain Python floats (``math.fsum``, no torch), pure: every quantity can be re-derived from the
logged credits and counts. An extractor *call* is named by a string id (its request id); the
entry an experience-guided episode used was produced by one call, and that call is credited
with the episode's outcome.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence


def episode_credit(success: bool) -> float:
    """The credit of one experience-guided episode: +1.0 for success, -1.0 for failure."""
    return 1.0 if success else -1.0


def relative_credit(reward: float, free_rewards: Sequence[float]) -> float:
    """A guided episode's credit relative to its group's experience-free subgroup: its reward
    minus the free episodes' mean reward (0.0 mean when the group has no free episode).

    Credits an entry only for what it added over playing the same task without one; the
    paper's +1 / -1 credits an entry for tasks the policy solves anyway. A counterfactual
    rule: it needs the whole group, so only a reader of the finished log can apply it
    (``coevo audit RUN credit --rule relative``).

    Raises:
        ValueError: a reward is not finite.
    """
    if not all(math.isfinite(r) for r in (reward, *free_rewards)):
        raise ValueError(f"rewards must be finite, got {reward} and {list(free_rewards)}")
    baseline = math.fsum(free_rewards) / len(free_rewards) if free_rewards else 0.0
    return reward - baseline


def call_rewards(credits: Iterable[tuple[str, float]]) -> dict[str, float]:
    """r(m): per extractor call, the mean of every credit it received so far.

    The mean is ``math.fsum`` based, so it is bit-for-bit independent of the order of the
    credits (the stream may interleave calls in any order).

    Args:
        credits: ``(call id, credit)`` pairs, every credit so far (accumulated across steps).

    Returns:
        ``{call id: mean credit}``, in order of each call's first credit.

    Raises:
        ValueError: a credit is not finite.
    """
    per_call: dict[str, list[float]] = {}
    for call, value in credits:
        if not math.isfinite(value):
            raise ValueError(f"credit of call {call!r} must be finite, got {value}")
        per_call.setdefault(call, []).append(value)
    return {call: math.fsum(values) / len(values) for call, values in per_call.items()}


def extractor_advantages(rewards: Mapping[str, float], batch: Sequence[str]) -> list[float]:
    """A(m) = r(m) - mean of r over the extractor batch.

    A batch whose rewards are all equal gets exactly 0.0 everywhere (no rounding residue).

    Args:
        rewards: r(m) per call id, e.g. from :func:`call_rewards`.
        batch: the call ids of one extractor update, each once.

    Returns:
        One advantage per call of ``batch``, in the same order.

    Raises:
        ValueError: ``batch`` is empty, repeats a call, or names a call without a reward.
    """
    if not batch:
        raise ValueError("batch must not be empty")
    if len(set(batch)) != len(batch):
        twice = next(m for i, m in enumerate(batch) if m in batch[:i])
        raise ValueError(f"batch holds call {twice!r} more than once")
    missing = [m for m in batch if m not in rewards]
    if missing:
        raise ValueError(f"calls without a reward: {missing}")
    r = [rewards[m] for m in batch]
    if max(r) == min(r):
        return [0.0] * len(r)
    mean = math.fsum(r) / len(r)
    return [x - mean for x in r]


def reweight(
    trained_count: int,
    last_trained_step: int | None,
    step: int,
    *,
    cooldown: int = 1,
    alpha: float = 0.5,
) -> float:
    """w(m), the count-aware weight that multiplies A(m).

    ``0.0`` while the call is cooling down, i.e. it was trained on within the last ``cooldown``
    steps: ``last_trained_step is not None and step - last_trained_step <= cooldown``. With
    the default cooldown 1, a call trained at step 4 weighs 0 at steps 4 and 5 and
    ``(1 + trained_count) ** -alpha`` from step 6 on; cooldown 0 only zeroes the step it was
    trained at. Steps are any one counter the caller keeps (e.g. extractor updates), the same for
    ``last_trained_step`` and ``step``.

    Args:
        trained_count: how many updates have trained on the call (``c_train(m)``).
        last_trained_step: the step of the latest of them, None if never trained on.
        step: the step being weighted for.
        cooldown: ``delta``, the steps after a training during which the weight is 0.
        alpha: the count exponent.

    Returns:
        The weight, in [0, 1].

    Raises:
        ValueError: a negative count, cooldown or alpha (or a non-finite alpha), a
            ``last_trained_step`` after ``step``, or a count that disagrees with
            ``last_trained_step`` (0 with a step, or positive with None).
    """
    if trained_count < 0:
        raise ValueError(f"trained_count must be >= 0, got {trained_count}")
    if cooldown < 0:
        raise ValueError(f"cooldown must be >= 0, got {cooldown}")
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
    if (trained_count == 0) != (last_trained_step is None):
        raise ValueError(
            f"trained_count {trained_count} disagrees with last_trained_step {last_trained_step}"
        )
    if last_trained_step is not None:
        if last_trained_step > step:
            raise ValueError(f"last_trained_step {last_trained_step} is after step {step}")
        if step - last_trained_step <= cooldown:
            return 0.0
    return (1 + trained_count) ** -alpha


def diversified_scores(
    ranks: Sequence[int],
    retrieve_counts: Sequence[int],
    recently_used: Sequence[bool],
    lam: float = 0.4,
) -> list[float]:
    """score(m) = -rank - lam * log(1 + retrieve_count) - [recently used], per candidate.

    Args:
        ranks: each candidate's rank in the similarity search, 0 for the best.
        retrieve_counts: how many times each candidate was retrieved before.
        recently_used: whether each candidate was retrieved in the last window.
        lam: the weight of the retrieval count (lambda).

    Returns:
        One score per candidate, in the same order (higher is better).

    Raises:
        ValueError: the lengths differ, a negative rank or count, or a negative or non-finite
            ``lam``.
    """
    if not len(ranks) == len(retrieve_counts) == len(recently_used):
        raise ValueError(
            f"ranks, retrieve_counts and recently_used must have one value per candidate, got "
            f"{len(ranks)}, {len(retrieve_counts)} and {len(recently_used)}"
        )
    if any(r < 0 for r in ranks):
        raise ValueError(f"ranks must be >= 0, got {list(ranks)}")
    if any(c < 0 for c in retrieve_counts):
        raise ValueError(f"retrieve_counts must be >= 0, got {list(retrieve_counts)}")
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be finite and >= 0, got {lam}")
    return [
        -rank - lam * math.log1p(count) - (1.0 if recent else 0.0)
        for rank, count, recent in zip(ranks, retrieve_counts, recently_used, strict=True)
    ]


def pick(
    candidates: Sequence[int],
    k: int,
    *,
    retrieve_counts: Mapping[int, int],
    recently_used: Collection[int],
    lam: float = 0.4,
) -> list[int]:
    """The ``k`` best entries by :func:`diversified_scores`.

    ``candidates`` are entry ids in the order of the similarity search (best first), so an
    entry's rank is its position. Ties in score go to the better (lower) rank; ranks are
    distinct, so the order is total and the result deterministic.

    Args:
        candidates: distinct entry ids, best match first (the paper asks for 16x ``k``).
        k: how many to pick.
        retrieve_counts: retrievals so far per entry id; a missing id counts 0.
        recently_used: the ids retrieved in the last window.
        lam: as in :func:`diversified_scores`.

    Returns:
        Up to ``k`` entry ids, best score first.

    Raises:
        ValueError: ``k < 1``, repeated candidates, or as :func:`diversified_scores`.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"candidates must be distinct, got {list(candidates)}")
    scores = diversified_scores(
        range(len(candidates)),
        [retrieve_counts.get(m, 0) for m in candidates],
        [m in recently_used for m in candidates],
        lam,
    )
    order = sorted(range(len(candidates)), key=lambda i: (-scores[i], i))
    return [candidates[i] for i in order[:k]]
