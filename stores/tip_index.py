"""Vector search over tip embeddings: the store behind EMPO2's tip memory.

A :class:`VectorIndex` maps integer keys (tip ids) to unit vectors and answers k-nearest-neighbour
queries by cosine similarity. :class:`UsearchIndex` is the store a run uses (numpy brute force in
float32 on one BLAS thread up to a size threshold, usearch HNSW above it); :class:`ExactIndex` is
its in-memory twin: numpy brute force in float64, the reference model in tests.

Answers are ordered best first; keys with equal similarity come smaller key first. Similarities
are clipped to ``[-1, 1]`` (float32 rounding can otherwise give ``1 + 1e-7`` for a duplicate).

Determinism: both backends give the same answers for the same sequence of calls. For
:class:`UsearchIndex` this holds because its HNSW graph is built and updated on one thread, at
points fixed by the calls (usearch's HNSW build is order-dependent, and concurrent insertion is
not reproducible); searches may use many threads, as they do not change the graph. In the exact
regime (``len(index) <= exact_below``) its answers
equal :class:`ExactIndex`'s up to float32 rounding of the similarities (about 1e-7): only keys
whose similarities differ by less than that may come in another order. Above it, answers are
approximate (HNSW): recall below 1, and ties at the k-th place are not resolved by key.

Neither index is safe for concurrent calls: one owner (the memory actor) calls it, from one
thread at a time (``trio.to_thread.run_sync``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, runtime_checkable

import numpy as np
import numpy.typing as npt
from threadpoolctl import ThreadpoolController  # pyright: ignore[reportMissingTypeStubs]

if TYPE_CHECKING:  # usearch loads when an index is made: its native library, loaded before
    # ray.init joins a cluster, makes Ray's GCS client abort (std::regex_error)
    from usearch.index import BatchMatches, Index, Matches

UNIT_TOLERANCE = 1e-3
"""How far a row's L2 norm may be from 1 before ``add``/``search`` refuse it."""

SIMILARITY_BLOCK = 1 << 22
"""At most this many similarities are held at once by an exact search (float64: 32 MiB)."""

EXACT_BELOW = 1000
""":class:`UsearchIndex`'s default size up to which search is exact. Measured on MiniLM
embeddings of real EMPO2 tip keys (docs/BENCHMARKS.md, issue 19): one HNSW query is faster than
one exact query at every size from 100 vectors (exact's fixed cost per call, ~45 us, is more than
HNSW's), but up to 1,000 vectors exact costs at most ~0.1 ms more per query (0.16 against
0.07 ms; a MiniLM query embedding costs ~25 ms) and gives exact answers with ties cut by key,
and it needs no graph (inserting into one costs ~0.1 ms a vector). Above it, exact grows
linearly (0.28 ms at 2,000, 1.4 ms at 20,000) while HNSW stays at 0.08-0.27 ms. 1,000 is also
EMPO2's slot capacity: its memories are always exact."""
CONNECTIVITY = 16
EXPANSION_ADD = 128
EXPANSION_SEARCH = 64
""":class:`UsearchIndex`'s default HNSW settings (M, efConstruction, ef): recall@10 1.000 on
real tip-key embeddings at 1,000-20,000 vectors (0.27 ms a query at 20,000); M 8, ef 16 was
faster (0.12 ms) but fell to 0.947 at 2,000. On random directions (no structure) the same
settings reach only ~0.4 at 10,000 (docs/BENCHMARKS.md): raise ``expansion_search`` there."""

Hits = list[list[tuple[int, float]]]
"""Per query, ``(key, cosine similarity)`` pairs, best first."""


@runtime_checkable
class VectorIndex(Protocol):
    """A set of ``key -> unit vector`` answering cosine k-NN queries.

    Keys are distinct non-negative ints (below 2**64). Vectors are float32 rows of length
    ``dim``, L2-normalised by the caller (norm within :data:`UNIT_TOLERANCE` of 1).
    """

    dim: int

    def add(self, keys: Sequence[int], vectors: np.ndarray) -> None:
        """Insert ``vectors[i]`` under ``keys[i]``; all or nothing.

        Raises:
            ValueError: a key is already present, repeated, or negative; ``vectors`` is not a
                float32 ``(len(keys), dim)`` array of finite unit rows.
        """
        ...

    def remove(self, keys: Sequence[int]) -> None:
        """Delete ``keys``; all or nothing. A removed key may be added again.

        Raises:
            KeyError: a key is not present.
            ValueError: a key is repeated.
        """
        ...

    def prepare(self) -> None:
        """Build what a search at the current size uses, as :meth:`search` would (a backend
        whose structure is built on first need); answers nothing. Replaying a run's searches
        without their queries (a bank rebuilt from its log) calls it where each one was."""
        ...

    def search(self, queries: np.ndarray, k: int) -> Hits:
        """The up to ``k`` most similar keys per query row, best first, ties by smaller key.

        Args:
            queries: float32 ``(q, dim)``, finite unit rows.
            k: how many neighbours per query (0 gives empty lists).

        Returns:
            ``q`` lists of ``(key, cosine similarity)``; empty lists for an empty index.

        Raises:
            ValueError: ``k`` is negative or ``queries`` has the wrong shape, dtype or norms.
        """
        ...

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...


def check_vectors(what: str, vectors: np.ndarray, rows: int | None, dim: int) -> None:
    """Validate a float32 ``(rows, dim)`` array of finite unit rows.

    Args:
        what: the argument's name, for the message ("vectors", "queries").
        vectors: the array.
        rows: the expected row count, or None for any.
        dim: the expected row length.

    Raises:
        ValueError: with a message naming ``what`` and what is wrong.
    """
    if not isinstance(vectors, np.ndarray):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"{what} must be a numpy array, got {type(vectors).__name__}")
    if vectors.dtype != np.float32:
        raise ValueError(f"{what} must have dtype float32, got {vectors.dtype}")
    expected = f"({'n' if rows is None else rows}, {dim})"
    if vectors.ndim != 2 or vectors.shape[1] != dim or rows not in (None, vectors.shape[0]):
        raise ValueError(f"{what} must have shape {expected}, got {vectors.shape}")
    if not np.isfinite(vectors).all():
        raise ValueError(f"{what} must be finite (found NaN or inf)")
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    bad = np.flatnonzero(np.abs(norms - 1.0) > UNIT_TOLERANCE)
    if bad.size:
        raise ValueError(
            f"{what} rows must be L2-normalised: row {int(bad[0])} has norm {norms[bad[0]]:.6g}"
        )


def check_keys(keys: Sequence[int]) -> np.ndarray:
    """The keys as a uint64 array, checked to be distinct non-negative ints.

    Raises:
        ValueError: a key is not an int, is negative or too large, or is repeated.
    """
    checked: list[int] = []
    for key in keys:
        value = as_key(key)
        if value is None:
            raise ValueError(f"keys must be ints, got {key!r}")
        if not 0 <= value < 2**64:
            raise ValueError(f"keys must be in [0, 2**64), got {key}")
        checked.append(value)
    array = np.array(checked, dtype=np.uint64)
    if len(np.unique(array)) != len(array):
        raise ValueError("keys must be distinct within one call")
    return array


def as_key(key: object) -> int | None:
    """``key`` as a Python int if it is an int or numpy integer (not a bool), else None."""
    if isinstance(key, bool) or not isinstance(key, int | np.integer):
        return None
    return int(cast("int | np.integer[Any]", key))


def check_k(k: int) -> None:
    """Raises: ValueError: ``k`` is not a non-negative int."""
    value = as_key(k)
    if value is None or value < 0:
        raise ValueError(f"k must be a non-negative int, got {k!r}")


def rank(keys: np.ndarray, sims: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` best ``(key, similarity)`` pairs: similarity descending, then key ascending.

    Args:
        keys: uint64 ``(n,)``.
        sims: float ``(n,)``, already clipped to ``[-1, 1]``.
        k: how many to keep.
    """
    if k < len(sims):
        # Everything tied with the k-th best goes into the sort, so ties cut by key.
        kth = np.partition(sims, len(sims) - k)[len(sims) - k]
        keep = np.flatnonzero(sims >= kth)
        keys, sims = keys[keep], sims[keep]
    order = np.lexsort((keys, -sims))[:k]
    return [(int(keys[i]), float(sims[i])) for i in order]


class _Rows:
    """Unit rows under integer keys in one growing matrix (removal moves the last row into the
    hole): the storage of both exact searches.

    Args:
        dim: the row length.
        dtype: the matrix's float type.
    """

    def __init__(self, dim: int, dtype: type[np.floating[Any]]) -> None:
        self.dim = dim
        self.rows = np.zeros((0, dim), dtype=dtype)  # (capacity, dim), unit rows
        self.keys = np.zeros(0, dtype=np.uint64)  # (capacity,)
        self.where: dict[int, int] = {}  # key -> row

    def __len__(self) -> int:
        return len(self.where)

    def add(self, keys: npt.NDArray[np.uint64], vectors: np.ndarray) -> None:
        """Append ``vectors`` (checked unit rows) under ``keys`` (checked absent), renormalised
        in the matrix's type."""
        n = len(self.where)
        self._reserve(n + len(keys))
        rows = vectors.astype(self.rows.dtype)
        self.rows[n : n + len(keys)] = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        self.keys[n : n + len(keys)] = keys
        for offset, key in enumerate(keys):
            self.where[int(key)] = n + offset

    def remove(self, keys: npt.NDArray[np.uint64]) -> None:
        """Delete ``keys`` (checked present)."""
        for key in keys:
            row, last = self.where.pop(int(key)), len(self.where)
            if row != last:  # move the last row into the hole
                self.rows[row] = self.rows[last]
                self.keys[row] = self.keys[last]
                self.where[int(self.keys[row])] = row

    def search(self, queries: np.ndarray, k: int) -> Hits:
        """Brute force in the matrix's type: ``queries`` (checked unit rows) renormalised, one
        matrix product per block of queries, then :func:`rank`."""
        n = len(self.where)
        q = queries.astype(self.rows.dtype)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        rows, keys = self.rows[:n], self.keys[:n]
        hits: Hits = []
        step = max(1, SIMILARITY_BLOCK // n)  # queries per block: bounded memory
        for start in range(0, len(q), step):
            sims = np.clip(q[start : start + step] @ rows.T, -1.0, 1.0)  # (step, n)
            hits.extend(rank(keys, row.astype(np.float64), k) for row in sims)
        return hits

    def _reserve(self, size: int) -> None:
        if size <= len(self.keys):
            return
        capacity = max(size, 2 * len(self.keys), 16)
        rows = np.zeros((capacity, self.dim), dtype=self.rows.dtype)
        keys = np.zeros(capacity, dtype=np.uint64)
        rows[: len(self.where)] = self.rows[: len(self.where)]
        keys[: len(self.where)] = self.keys[: len(self.where)]
        self.rows, self.keys = rows, keys


class ExactIndex:
    """Brute-force cosine search in float64 over rows kept in a numpy matrix: the in-memory twin
    of :class:`UsearchIndex` and the reference model its tests compare against.

    Args:
        dim: the vector length.
    """

    def __init__(self, dim: int) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim
        self._rows = _Rows(dim, np.float64)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return as_key(key) in self._rows.where

    def add(self, keys: Sequence[int], vectors: np.ndarray) -> None:
        array = check_keys(keys)
        check_vectors("vectors", vectors, len(array), self.dim)
        present = [int(key) for key in array if int(key) in self._rows.where]
        if present:
            raise ValueError(f"key {present[0]} is already in the index")
        self._rows.add(array, vectors)

    def remove(self, keys: Sequence[int]) -> None:
        array = check_keys(keys)
        missing = [int(key) for key in array if int(key) not in self._rows.where]
        if missing:
            raise KeyError(missing[0])
        self._rows.remove(array)

    def prepare(self) -> None:
        """Nothing to build: every search is over the rows."""

    def search(self, queries: np.ndarray, k: int) -> Hits:
        check_k(k)
        check_vectors("queries", queries, None, self.dim)
        if len(self._rows) == 0 or k == 0:
            return [[] for _ in range(len(queries))]
        return self._rows.search(queries, k)


@functools.cache
def _blas() -> ThreadpoolController:
    """The process's thread pools (found once: threadpoolctl scans the loaded libraries)."""
    return ThreadpoolController()


def _one_blas_thread() -> AbstractContextManager[object]:
    """A context in which BLAS (numpy's matrix products) uses one thread, restored after."""
    limiter = _blas().limit(limits=1, user_api="blas")  # pyright: ignore[reportUnknownMemberType]
    return cast("AbstractContextManager[object]", limiter)


class UsearchIndex:
    """Exact float32 search (numpy, one BLAS thread) while it holds at most ``exact_below``
    vectors; usearch HNSW (cosine metric, float32 storage) above that.

    The vectors are always kept in a float32 matrix. The HNSW graph is built the first time a
    search finds the index past ``exact_below`` (from the matrix's rows, in their order, on one
    thread; :meth:`prepare`), then kept up to date by every ``add`` and ``remove``, also below
    the threshold (searches there are exact again), so an index around its threshold is not
    rebuilt. An index that only passes the threshold between searches (a bank that stores one
    tip over its capacity, then evicts the oldest) never builds one.

    Args:
        dim: the vector length.
        connectivity: HNSW edges per node (usearch's M); more is better recall, more memory.
        expansion_add: candidate list size while inserting (efConstruction).
        expansion_search: candidate list size while searching (ef); at least ``k`` is used.
        exact_below: search exhaustively while ``len(index) <= exact_below``
            (:data:`EXACT_BELOW`, measured; EMPO2's slots of at most 1,000 tips are always
            exact).
        search_threads: threads per HNSW ``search`` call (0: all cores); searches are
            reproducible with any count. Inserts always use one thread, which keeps the graph
            reproducible. Exact searches use one BLAS thread.
    """

    def __init__(
        self,
        dim: int,
        *,
        connectivity: int = CONNECTIVITY,
        expansion_add: int = EXPANSION_ADD,
        expansion_search: int = EXPANSION_SEARCH,
        exact_below: int = EXACT_BELOW,
        search_threads: int = 1,
    ) -> None:
        for name, value in (
            ("dim", dim),
            ("connectivity", connectivity),
            ("expansion_add", expansion_add),
            ("expansion_search", expansion_search),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name, value in (("exact_below", exact_below), ("search_threads", search_threads)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        self.dim = dim
        self.connectivity = connectivity
        self.expansion_add = expansion_add
        self._expansion_search = expansion_search
        self.exact_below = exact_below
        self.search_threads = search_threads
        self._rows = _Rows(dim, np.float32)
        self._graph: Index | None = None  # built when the index first outgrows exact_below

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return as_key(key) in self._rows.where

    @property
    def exact(self) -> bool:
        """Whether searches are exhaustive at the current size."""
        return len(self) <= self.exact_below

    @property
    def expansion_search(self) -> int:
        """The HNSW search width (ef); settable (a graph already built uses the new width)."""
        return self._expansion_search

    @expansion_search.setter
    def expansion_search(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"expansion_search must be >= 1, got {value}")
        self._expansion_search = value
        if self._graph is not None:
            self._graph.expansion_search = value

    @property
    def has_graph(self) -> bool:
        """Whether the HNSW graph has been built (a search once found more than
        ``exact_below`` vectors)."""
        return self._graph is not None

    def add(self, keys: Sequence[int], vectors: np.ndarray) -> None:
        array = check_keys(keys)
        check_vectors("vectors", vectors, len(array), self.dim)
        present = [int(key) for key in array if int(key) in self._rows.where]
        if present:
            raise ValueError(f"key {present[0]} is already in the index")
        if not len(array):
            return
        self._rows.add(array, vectors)
        n = len(self._rows)
        if self._graph is not None:
            self._graph.add(array, self._rows.rows[n - len(array) : n], threads=1)

    def prepare(self) -> None:
        """Build the HNSW graph if the index holds more than ``exact_below`` vectors and has
        none yet (a search does this first)."""
        n = len(self._rows)
        if self._graph is not None or n <= self.exact_below:
            return
        from usearch.index import Index

        self._graph = Index(
            ndim=self.dim,
            metric="cos",
            dtype="f32",
            connectivity=self.connectivity,
            expansion_add=self.expansion_add,
            expansion_search=self._expansion_search,
        )
        self._graph.add(self._rows.keys[:n].copy(), self._rows.rows[:n], threads=1)

    def remove(self, keys: Sequence[int]) -> None:
        array = check_keys(keys)
        missing = [int(key) for key in array if int(key) not in self._rows.where]
        if missing:
            raise KeyError(missing[0])
        self._rows.remove(array)
        if self._graph is not None and len(array):
            self._graph.remove(array)

    def search(self, queries: np.ndarray, k: int) -> Hits:
        check_k(k)
        check_vectors("queries", queries, None, self.dim)
        n = len(self)
        if n == 0 or k == 0 or len(queries) == 0:
            return [[] for _ in range(len(queries))]
        self.prepare()
        if n <= self.exact_below or self._graph is None:
            # one BLAS thread: with two, a 10k-row product was 10x slower on a busy 2-core VM
            with _one_blas_thread():
                return self._rows.search(queries, k)
        matches = self._graph.search(
            np.ascontiguousarray(queries), min(k, n), threads=self.search_threads
        )
        return _hits(matches, k)


def _hits(matches: Matches | BatchMatches, k: int) -> Hits:
    """Ranked hits from usearch's answer: a BatchMatches, or a Matches for a single query row
    (usearch unwraps a batch of one)."""
    from usearch.index import Matches

    if isinstance(matches, Matches):
        keys = matches.keys[None, :]
        distances = matches.distances[None, :]
        counts = [len(matches.keys)]
    else:
        keys, distances = matches.keys, matches.distances
        counts = [int(c) for c in matches.counts]
    sims = np.clip(1.0 - distances.astype(np.float64), -1.0, 1.0)
    return [rank(keys[i, :c], sims[i, :c], k) for i, c in enumerate(counts)]


def make_index(kind: Literal["usearch", "exact"], dim: int, **options: int) -> VectorIndex:
    """A new, empty index of the named backend.

    Args:
        kind: "usearch" (:class:`UsearchIndex`) or "exact" (:class:`ExactIndex`).
        dim: the vector length.
        **options: keyword arguments of :class:`UsearchIndex` (none for "exact").

    Raises:
        ValueError: unknown ``kind``, or options for "exact".
    """
    if kind == "usearch":
        return UsearchIndex(dim, **options)
    if kind == "exact":
        if options:
            raise ValueError(f"the exact index takes no options, got {sorted(options)}")
        return ExactIndex(dim)
    raise ValueError(f"unknown index kind {kind!r}; expected 'usearch' or 'exact'")
