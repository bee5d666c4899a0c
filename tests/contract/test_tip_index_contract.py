"""The VectorIndex Protocol, once: every backend must pass the same abstract test case."""

from __future__ import annotations

import numpy as np
import pytest

from stores.tip_index import ExactIndex, UsearchIndex, VectorIndex, make_index

DIM = 4


def unit(*rows: list[float]) -> np.ndarray:
    """float32 rows, L2-normalised."""
    array = np.array(rows, dtype=np.float64)
    return (array / np.linalg.norm(array, axis=1, keepdims=True)).astype(np.float32)


E0, E1, E2 = unit([1, 0, 0, 0]), unit([0, 1, 0, 0]), unit([0, 0, 1, 0])


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` scaled to unit norm, float32."""
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def recall(got: list[list[tuple[int, float]]], want: list[list[tuple[int, float]]]) -> float:
    """Share of ``want``'s keys that ``got`` holds too."""
    found = sum(len({k for k, _ in g} & {k for k, _ in w}) for g, w in zip(got, want, strict=True))
    return found / sum(len(w) for w in want)


class IndexContract:
    """Abstract test case of the VectorIndex Protocol. Subclasses implement :meth:`make`."""

    def make(self, dim: int) -> VectorIndex:
        """A new, empty index of vectors of length ``dim``."""
        raise NotImplementedError

    @pytest.fixture
    def index(self) -> VectorIndex:
        return self.make(DIM)

    def keys_of(self, hits: list[tuple[int, float]]) -> list[int]:
        return [key for key, _ in hits]

    def test_satisfies_the_protocol(self, index: VectorIndex) -> None:
        assert isinstance(index, VectorIndex)
        assert index.dim == DIM

    def test_empty_index_answers_empty_lists(self, index: VectorIndex) -> None:
        assert len(index) == 0
        assert 0 not in index
        assert index.search(unit([1, 0, 0, 0], [0, 1, 0, 0]), 5) == [[], []]

    def test_similarity_is_the_cosine(self, index: VectorIndex) -> None:
        index.add([10, 11, 12], unit([1, 0, 0, 0], [0.6, 0.8, 0, 0], [-1, 0, 0, 0]))
        [hits] = index.search(E0, 3)
        assert self.keys_of(hits) == [10, 11, 12]
        assert [sim for _, sim in hits] == pytest.approx([1.0, 0.6, -1.0], abs=1e-6)
        assert all(type(sim) is float and type(key) is int for key, sim in hits)

    def test_k_larger_than_size_gives_everything_best_first(self, index: VectorIndex) -> None:
        index.add([1, 2], unit([1, 1, 0, 0], [1, 0, 0, 0]))
        [hits] = index.search(E0, 50)
        assert self.keys_of(hits) == [2, 1]

    def test_k_cuts_and_zero_k_answers_nothing(self, index: VectorIndex) -> None:
        index.add([1, 2, 3], unit([1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 0, 0]))
        assert self.keys_of(index.search(E0, 2)[0]) == [1, 2]
        assert index.search(E0, 0) == [[]]

    def test_ties_come_smaller_key_first(self, index: VectorIndex) -> None:
        index.add([7, 3, 5, 9, 20, 1, 15, 2], np.concatenate([E1, E1, E1, E0, E1, E1, E1, E1]))
        [hits] = index.search(E1, 8)
        assert self.keys_of(hits) == [1, 2, 3, 5, 7, 15, 20, 9]
        [cut] = index.search(E1, 3)  # the cut at k falls inside the tie
        assert self.keys_of(cut) == [1, 2, 3]

    def test_each_query_row_gets_its_own_answer(self, index: VectorIndex) -> None:
        index.add([1, 2, 3], np.concatenate([E0, E1, E2]))
        hits = index.search(np.concatenate([E2, E0]), 1)
        assert [self.keys_of(h) for h in hits] == [[3], [1]]
        assert index.search(np.zeros((0, DIM), dtype=np.float32), 3) == []

    def test_remove_then_readd_with_another_vector(self, index: VectorIndex) -> None:
        index.add([1, 2], np.concatenate([E0, E1]))
        index.remove([1])
        assert len(index) == 1 and 1 not in index and 2 in index
        assert self.keys_of(index.search(E0, 5)[0]) == [2]
        index.add([1], E2)
        assert len(index) == 2 and 1 in index
        assert self.keys_of(index.search(E2, 1)[0]) == [1]
        assert index.search(E0, 5)[0][0][1] == pytest.approx(0.0, abs=1e-6)

    def test_adding_a_present_key_fails_and_adds_nothing(self, index: VectorIndex) -> None:
        index.add([1], E0)
        with pytest.raises(ValueError, match=r"^key 1 is already in the index$"):
            index.add([2, 1], np.concatenate([E1, E1]))
        assert len(index) == 1 and 2 not in index

    @pytest.mark.parametrize(
        ("keys", "message"),
        [
            ([1, 1], r"^keys must be distinct within one call$"),
            ([-1, 2], r"^keys must be in \[0, 2\*\*64\), got -1$"),
            ([1, "2"], r"^keys must be ints, got '2'$"),
            ([1, True], r"^keys must be ints, got True$"),
        ],
    )
    def test_bad_keys_are_refused(self, index: VectorIndex, keys: list[int], message: str) -> None:
        with pytest.raises(ValueError, match=message):
            index.add(keys, np.concatenate([E0, E1]))
        assert len(index) == 0

    @pytest.mark.parametrize(
        ("vectors", "message"),
        [
            (E0.astype(np.float64), r"^vectors must have dtype float32, got float64$"),
            (unit([1, 0, 0, 0, 0]), r"^vectors must have shape \(1, 4\), got \(1, 5\)$"),
            (E0[0], r"^vectors must have shape \(1, 4\), got \(4,\)$"),
            (np.concatenate([E0, E1]), r"^vectors must have shape \(1, 4\), got \(2, 4\)$"),
            (2 * E0, r"^vectors rows must be L2-normalised: row 0 has norm 2$"),
            (0 * E0, r"^vectors rows must be L2-normalised: row 0 has norm 0$"),
            (np.nan * E0, r"^vectors must be finite \(found NaN or inf\)$"),
            ([[1.0, 0.0, 0.0, 0.0]], r"^vectors must be a numpy array, got list$"),
        ],
    )
    def test_bad_vectors_are_refused(
        self, index: VectorIndex, vectors: np.ndarray, message: str
    ) -> None:
        with pytest.raises(ValueError, match=message):
            index.add([1], vectors)
        assert len(index) == 0 and 1 not in index

    def test_removing_a_missing_key_fails_and_removes_nothing(self, index: VectorIndex) -> None:
        index.add([1, 2], np.concatenate([E0, E1]))
        with pytest.raises(KeyError) as caught:
            index.remove([2, 3])
        assert caught.value.args == (3,)
        assert len(index) == 2 and 2 in index
        with pytest.raises(ValueError, match="distinct"):
            index.remove([1, 1])
        assert len(index) == 2

    def test_bad_queries_and_k_are_refused(self, index: VectorIndex) -> None:
        index.add([1], E0)
        with pytest.raises(ValueError, match=r"^queries must have shape \(n, 4\), got \(4,\)$"):
            index.search(E0[0], 1)
        with pytest.raises(ValueError, match=r"^queries must have dtype float32, got float64$"):
            index.search(E0.astype(np.float64), 1)
        with pytest.raises(ValueError, match=r"^k must be a non-negative int, got -1$"):
            index.search(E0, -1)

    def test_contains_is_false_for_non_keys(self, index: VectorIndex) -> None:
        index.add([1], E0)
        assert 1 in index and np.uint64(1) in index
        for other in ("1", 1.0, True, None, -1, 2**70):
            assert other not in index

    def test_empty_calls_change_nothing(self, index: VectorIndex) -> None:
        index.add([], np.zeros((0, DIM), dtype=np.float32))
        index.remove([])
        assert len(index) == 0


class TestExactIndex(IndexContract):
    def make(self, dim: int) -> VectorIndex:
        return ExactIndex(dim)

    def test_grows_past_its_initial_capacity(self) -> None:
        rng = np.random.default_rng(3)
        vectors = rng.standard_normal((100, 8)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        index = ExactIndex(8)
        for key in range(100):
            index.add([key], vectors[key : key + 1])
        index.remove(list(range(0, 100, 2)))
        hits = index.search(vectors[1::2], 1)
        assert [h[0][0] for h in hits] == list(range(1, 100, 2))


class TestUsearchIndex(IndexContract):
    def make(self, dim: int) -> VectorIndex:
        return UsearchIndex(dim)

    def test_exact_up_to_the_threshold_then_approximate(self) -> None:
        index = UsearchIndex(DIM, exact_below=2)
        index.add([1, 2], np.concatenate([E0, E1]))
        assert index.exact
        index.add([3], E2)
        assert not index.exact
        assert [k for k, _ in index.search(E2, 1)[0]] == [3]

    def test_hnsw_finds_the_neighbours_of_an_easy_set(self) -> None:
        """Approximate regime: a 1,000-vector, 16-dim set has recall@10 of at least 0.95."""
        rng = np.random.default_rng(7)
        vectors = rng.standard_normal((1000, 16)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        hnsw, exact = UsearchIndex(16, exact_below=0), ExactIndex(16)
        for index in (hnsw, exact):
            index.add(list(range(1000)), vectors)
        queries = vectors[:50] + 0.1 * rng.standard_normal((50, 16)).astype(np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        got, want = hnsw.search(queries, 10), exact.search(queries, 10)
        found = [{k for k, _ in g} & {k for k, _ in w} for g, w in zip(got, want, strict=True)]
        assert sum(map(len, found)) / (10 * len(found)) >= 0.95

    def test_hnsw_answers_repeat_for_the_same_calls(self) -> None:
        """Same adds, removes and searches in the same order: the same answers, bit for bit."""
        rng = np.random.default_rng(11)
        vectors = rng.standard_normal((3000, 24)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)

        def run() -> list[list[tuple[int, float]]]:
            index = UsearchIndex(24, exact_below=0, connectivity=8, search_threads=0)
            for start in range(0, 3000, 500):
                index.add(list(range(start, start + 500)), vectors[start : start + 500])
            index.remove(list(range(0, 3000, 7)))
            index.add(list(range(0, 700, 7)), vectors[1:701:7])
            return index.search(vectors[:200], 10)

        assert run() == run()

    def test_bad_knobs_are_refused(self) -> None:
        with pytest.raises(ValueError, match=r"^connectivity must be >= 1, got 0$"):
            UsearchIndex(4, connectivity=0)
        with pytest.raises(ValueError, match=r"^exact_below must be >= 0, got -1$"):
            UsearchIndex(4, exact_below=-1)
        with pytest.raises(ValueError, match=r"^expansion_search must be >= 1, got 0$"):
            UsearchIndex(4).expansion_search = 0

    def test_passing_the_threshold_between_searches_builds_no_graph(self) -> None:
        """A bank stores one tip over its capacity, then evicts the oldest: the index is past
        its threshold only between searches, so it never builds a graph; :meth:`prepare`
        builds one only past the threshold, as a search would."""
        vectors = unit_rows(np.random.default_rng(3).standard_normal((40, 8)))
        index = UsearchIndex(8, exact_below=10)
        index.add(list(range(10)), vectors[:10])
        for key in range(10, 40):
            index.add([key], vectors[key : key + 1])
            index.remove([key - 10])
            index.prepare()
            assert index.search(vectors[key : key + 1], 1)[0][0][0] == key
        assert not index.has_graph
        index.add([40], vectors[:1])
        index.prepare()
        assert index.has_graph and not index.exact

    def test_exact_regime_answers_as_the_twin(self) -> None:
        """Below the threshold: ExactIndex's keys in ExactIndex's order, similarities within
        float32 rounding, after adds and removes (no graph is ever built)."""
        vectors = unit_rows(np.random.default_rng(5).standard_normal((600, 32)))
        index, twin = UsearchIndex(32, exact_below=600), ExactIndex(32)
        for target in (index, twin):
            target.add(list(range(600)), vectors)
            target.remove(list(range(0, 600, 3)))
            target.add([1000, 1001], vectors[:2])  # duplicates of keys 0's and 1's vectors
        assert index.exact and not index.has_graph
        queries = unit_rows(np.random.default_rng(6).standard_normal((40, 32)))
        for got, want in zip(index.search(queries, 25), twin.search(queries, 25), strict=True):
            assert [k for k, _ in got] == [k for k, _ in want]
            assert np.allclose([s for _, s in got], [s for _, s in want], atol=1e-6)
        tied = index.search(vectors[1:2], 3)[0]  # key 1 and its duplicate 1001: smaller first
        assert [k for k, _ in tied][:2] == [1, 1001]

    def test_switches_regime_across_the_threshold_both_ways(self) -> None:
        """The first search past the threshold builds the graph; a remove back below it makes
        searches exact again (the twin's answers) while the graph is kept up to date; every
        key added or removed on either side is found or gone in both regimes."""
        vectors = unit_rows(np.random.default_rng(8).standard_normal((300, 16)))
        index, twin = UsearchIndex(16, exact_below=200), ExactIndex(16)
        for target in (index, twin):
            target.add(list(range(150)), vectors[:150])
        assert index.exact and not index.has_graph
        for target in (index, twin):
            target.add(list(range(150, 260)), vectors[150:260])
        assert not index.exact and not index.has_graph  # no search yet
        assert [h[0][0] for h in index.search(vectors[:260], 1)] == list(range(260))
        assert index.has_graph
        for target in (index, twin):
            target.remove(list(range(0, 260, 2)))  # 130 left: exact again
        assert index.exact and index.has_graph and len(index) == 130
        queries = vectors[:40]
        got, want = index.search(queries, 10), twin.search(queries, 10)
        assert [[k for k, _ in g] for g in got] == [[k for k, _ in w] for w in want]
        for target in (index, twin):
            target.add(list(range(300, 400)), np.concatenate([vectors[260:300]] * 3)[:100])
        assert not index.exact and len(index) == 230
        odd_and_new = [*range(1, 260, 2), *range(300, 400)]
        assert all(key in index for key in odd_and_new) and 0 not in index
        found = {h[0][0] for h in index.search(vectors[1:260:2], 1)}
        assert found == set(range(1, 260, 2))  # removed keys are never returned
        newest = index.search(vectors[260:300], 3)
        assert all({300 + i, 340 + i} <= {k for k, _ in hits} for i, hits in enumerate(newest))

    def test_answers_repeat_across_the_threshold(self) -> None:
        """The same calls crossing the threshold give the same answers, bit for bit."""
        vectors = unit_rows(np.random.default_rng(9).standard_normal((900, 24)))

        def run() -> list[list[tuple[int, float]]]:
            index = UsearchIndex(24, exact_below=400, connectivity=8)
            answers = []
            for start in range(0, 900, 300):
                index.add(list(range(start, start + 300)), vectors[start : start + 300])
                answers += index.search(vectors[:50], 10)
            index.remove(list(range(0, 900, 2)))
            return answers + index.search(vectors[:50], 10)

        assert run() == run()

    def test_a_wider_search_finds_at_least_as_much(self) -> None:
        """``expansion_search`` set on a built graph is used by its next searches."""
        rng = np.random.default_rng(10)
        vectors = unit_rows(rng.standard_normal((2000, 64)))
        queries = unit_rows(rng.standard_normal((50, 64)))
        index, twin = UsearchIndex(64, exact_below=0, connectivity=4), ExactIndex(64)
        index.add(list(range(2000)), vectors)
        twin.add(list(range(2000)), vectors)
        want = twin.search(queries, 10)
        index.expansion_search = 10
        narrow = recall(index.search(queries, 10), want)
        index.expansion_search = 2000
        assert index.expansion_search == 2000
        assert recall(index.search(queries, 10), want) >= narrow
        assert recall(index.search(queries, 10), want) == 1.0


def test_make_index_names_each_backend() -> None:
    assert isinstance(make_index("exact", 3), ExactIndex)
    usearch = make_index("usearch", 3, exact_below=5)
    assert isinstance(usearch, UsearchIndex) and usearch.exact_below == 5
    with pytest.raises(ValueError, match=r"^unknown index kind 'faiss'"):
        make_index("faiss", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^the exact index takes no options"):
        make_index("exact", 3, exact_below=5)
