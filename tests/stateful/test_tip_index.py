"""UsearchIndex (exact regime: small sizes) against ExactIndex, its brute-force twin: any
interleaving of adds, removes, re-adds and searches, valid or not, leaves both with the same keys
and gives the same answers.

Vectors come from a small 8-dim pool with exact duplicates, near-duplicates and antipodes, so
ties and near-ties are common. Answers are compared up to :data:`TOL`: at each rank both must
hold a key of the same true similarity (so keys within ``TOL`` of each other may swap), every
reported similarity must be the true cosine, and each answer must be ordered by similarity then
key in its own numbers (exact duplicates tie exactly, so they come smaller key first).
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from stores.tip_index import ExactIndex, UsearchIndex

DIM = 8
TOL = 1e-6
KEYS = st.integers(0, 30)


def _pool() -> np.ndarray:
    rng = np.random.default_rng(20240611)
    base = rng.standard_normal((10, DIM))
    near = base[:4] + 1e-4 * rng.standard_normal((4, DIM))  # near-duplicates
    rows = np.concatenate([base, base[:4], near, -base[:2], np.eye(DIM)[:2]])
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


POOL = _pool()
ROWS = st.integers(0, len(POOL) - 1)

Hits = list[tuple[int, float]]


def assert_same_answer(got: Hits, want: Hits, truth: dict[int, float]) -> None:
    """``got`` (usearch) answers the query as ``want`` (exact) does, up to near-ties.

    Args:
        got: usearch's answer.
        want: the twin's answer.
        truth: the twin's similarity of every key in the index to the query.
    """
    assert len(got) == len(want)
    assert len({key for key, _ in got}) == len(got)
    for (key, sim), (_, want_sim) in zip(got, want, strict=True):
        assert abs(sim - truth[key]) <= TOL, (key, sim, truth[key])
        assert abs(truth[key] - want_sim) <= TOL, (got, want)
    for (key_a, sim_a), (key_b, sim_b) in itertools.pairwise(got):
        assert sim_a > sim_b or (sim_a == sim_b and key_a < key_b), got


class UsearchVsExact(RuleBasedStateMachine):
    """Drive a UsearchIndex and an ExactIndex in lock-step."""

    @initialize()
    def create(self) -> None:
        self.usearch = UsearchIndex(DIM)
        self.exact = ExactIndex(DIM)

    def both(self, method: str, *args: object) -> None:
        """Call ``method`` on both: both succeed, or both fail with the same error type."""
        outcomes: list[object] = []
        for index in (self.usearch, self.exact):
            try:
                getattr(index, method)(*args)
                outcomes.append(None)
            except (KeyError, ValueError) as exc:
                outcomes.append(type(exc))
        assert outcomes[0] == outcomes[1], outcomes

    @rule(keys=st.lists(KEYS, max_size=5), rows=st.lists(ROWS, min_size=5, max_size=5))
    def add(self, keys: list[int], rows: list[int]) -> None:
        self.both("add", keys, POOL[rows[: len(keys)]])

    @rule(keys=st.lists(KEYS, max_size=4))
    def remove(self, keys: list[int]) -> None:
        self.both("remove", keys)

    @rule(data=st.data())
    def readd_present(self, data: st.DataObject) -> None:
        """Remove a present key and add it back with another vector."""
        present = sorted(k for k in range(31) if k in self.exact)
        if not present:
            return
        key = data.draw(st.sampled_from(present))
        row = data.draw(ROWS)
        self.both("remove", [key])
        self.both("add", [key], POOL[row : row + 1])

    @rule(
        rows=st.lists(ROWS, min_size=1, max_size=3),
        seed=st.integers(0, 2**32 - 1),
        k=st.integers(0, 12),
    )
    def search(self, rows: list[int], seed: int, k: int) -> None:
        noise = np.random.default_rng(seed).standard_normal((len(rows), DIM))
        queries = np.concatenate([POOL[rows], noise / np.linalg.norm(noise, axis=1)[:, None]])
        queries = queries.astype(np.float32)
        got = self.usearch.search(queries, k)
        want = self.exact.search(queries, k)
        truths = self.exact.search(queries, len(self.exact))
        for g, w, t in zip(got, want, truths, strict=True):
            assert_same_answer(g, w, dict(t))
            assert_same_answer(w, w, dict(t))  # the twin's own order, by the same rules

    @invariant()
    def same_keys(self) -> None:
        assert len(self.usearch) == len(self.exact)
        for key in range(31):
            assert (key in self.usearch) == (key in self.exact)


UsearchVsExact.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestUsearchVsExact = UsearchVsExact.TestCase
