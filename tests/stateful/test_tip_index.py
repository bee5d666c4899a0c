"""UsearchIndex (exact regime: small sizes) and ExactIndex, its brute-force twin, against a
model kept by the test itself (a dict of key -> pool row, with the Protocol's rules for what
is refused, and cosines computed here in float64): any interleaving of adds, removes, re-adds
and searches, valid or not, leaves both with the model's keys and gives the model's answers.

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
    """``got`` answers the query as ``want`` (the model's) does, up to near-ties.

    Args:
        got: an index's answer.
        want: the model's answer.
        truth: the model's similarity of every key in the index to the query.
    """
    assert len(got) == len(want)
    assert len({key for key, _ in got}) == len(got)
    for (key, sim), (_, want_sim) in zip(got, want, strict=True):
        assert abs(sim - truth[key]) <= TOL, (key, sim, truth[key])
        assert abs(truth[key] - want_sim) <= TOL, (got, want)
    for (key_a, sim_a), (key_b, sim_b) in itertools.pairwise(got):
        assert sim_a > sim_b or (sim_a == sim_b and key_a < key_b), got


def model_answer(held: dict[int, int], query: np.ndarray, k: int) -> tuple[Hits, dict[int, float]]:
    """The ``k`` best ``(key, cosine)`` of the keys ``held`` (key -> pool row) for ``query``,
    by similarity then key, and every held key's cosine: plain float64 arithmetic here."""
    q = query.astype(np.float64) / np.linalg.norm(query.astype(np.float64))
    truth = {}
    for key, row in held.items():
        v = POOL[row].astype(np.float64)
        truth[key] = float(np.clip(q @ (v / np.linalg.norm(v)), -1.0, 1.0))
    ranked = sorted(truth.items(), key=lambda item: (-item[1], item[0]))
    return ranked[:k], truth


def refusal(keys: list[int], held: dict[int, int], adding: bool) -> type[Exception] | None:
    """What the Protocol says an ``add`` (or ``remove``) of ``keys`` raises, given ``held``."""
    if len(set(keys)) != len(keys):
        return ValueError
    if adding:
        return ValueError if any(k in held for k in keys) else None
    return KeyError if any(k not in held for k in keys) else None


class UsearchVsExact(RuleBasedStateMachine):
    """Drive a UsearchIndex and an ExactIndex in lock-step with the model."""

    @initialize()
    def create(self) -> None:
        self.usearch = UsearchIndex(DIM)
        self.exact = ExactIndex(DIM)
        self.held: dict[int, int] = {}  # the model: key -> pool row

    def both(self, method: str, keys: list[int], *args: object) -> bool:
        """Call ``method`` on both: each succeeds or fails as the model says. True if done."""
        expected = refusal(keys, self.held, adding=method == "add")
        for index in (self.usearch, self.exact):
            try:
                getattr(index, method)(keys, *args)
                outcome = None
            except (KeyError, ValueError) as exc:
                outcome = type(exc)
            assert outcome is expected, (index, method, keys, outcome, expected)
        return expected is None

    @rule(keys=st.lists(KEYS, max_size=5), rows=st.lists(ROWS, min_size=5, max_size=5))
    def add(self, keys: list[int], rows: list[int]) -> None:
        if self.both("add", keys, POOL[rows[: len(keys)]]):
            self.held.update(zip(keys, rows, strict=False))

    @rule(keys=st.lists(KEYS, max_size=4))
    def remove(self, keys: list[int]) -> None:
        if self.both("remove", keys):
            for key in keys:
                del self.held[key]

    @rule(data=st.data())
    def readd_present(self, data: st.DataObject) -> None:
        """Remove a present key and add it back with another vector."""
        if not self.held:
            return
        key = data.draw(st.sampled_from(sorted(self.held)))
        row = data.draw(ROWS)
        assert self.both("remove", [key])
        del self.held[key]
        assert self.both("add", [key], POOL[row : row + 1])
        self.held[key] = row

    @rule(
        rows=st.lists(ROWS, min_size=1, max_size=3),
        seed=st.integers(0, 2**32 - 1),
        k=st.integers(0, 12),
    )
    def search(self, rows: list[int], seed: int, k: int) -> None:
        noise = np.random.default_rng(seed).standard_normal((len(rows), DIM))
        queries = np.concatenate([POOL[rows], noise / np.linalg.norm(noise, axis=1)[:, None]])
        queries = queries.astype(np.float32)
        for index in (self.usearch, self.exact):
            for got, query in zip(index.search(queries, k), queries, strict=True):
                want, truth = model_answer(self.held, query, k)
                assert_same_answer(got, want, truth)

    @invariant()
    def same_keys(self) -> None:
        for index in (self.usearch, self.exact):
            assert len(index) == len(self.held)
            for key in range(31):
                assert (key in index) == (key in self.held)


UsearchVsExact.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestUsearchVsExact = UsearchVsExact.TestCase
