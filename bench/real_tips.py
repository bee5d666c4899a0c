"""Real EMPO2 texts for the retrieval benchmarks: tip keys, tips and retrieval queries read from
run logs, and their embeddings cached on disk (MiniLM over ~17k texts takes minutes here).

A tip is stored and found by its *key* (the episode's final state rendered as a turn's query,
``TipStored.key``); retrievals search with ``RetrievalRequested.query`` (a turn's state), so keys
and queries are texts of one kind, and the vectors an index holds are key embeddings.
"""

from __future__ import annotations

import gc
import hashlib
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agents.events.memory import RetrievalRequested, TipStored
from agents.models.embedder import Embedder
from scenarios.cli.common import open_run
from stores.tip_index import ExactIndex, Hits, UsearchIndex, VectorIndex


@dataclass
class Logged:
    """What the runs logged: distinct texts, and each slot's keys and queries."""

    keys: list[str] = field(default_factory=list)  # distinct TipStored keys, log order
    tips: list[str] = field(default_factory=list)  # distinct tip texts
    queries: list[str] = field(default_factory=list)  # distinct retrieval queries
    slot_keys: dict[str, list[str]] = field(default_factory=dict)  # run/slot -> distinct keys
    slot_queries: dict[str, list[str]] = field(default_factory=dict)  # run/slot -> queries
    retrievals: int = 0  # RetrievalRequested events read


def read_runs(runs: Sequence[str | Path]) -> Logged:
    """The keys, tips and queries of the runs at ``runs`` (coevo run directories)."""
    out = Logged()
    keys: dict[str, None] = {}
    tips: dict[str, None] = {}
    queries: dict[str, None] = {}
    for run in runs:
        log = open_run(str(run))
        for env in log.read():
            ev = env.event
            if isinstance(ev, TipStored):
                keys.setdefault(ev.key)
                tips.setdefault(ev.text)
                slot = out.slot_keys.setdefault(f"{run}:{ev.slot}", [])
                if ev.key not in slot:
                    slot.append(ev.key)
            elif isinstance(ev, RetrievalRequested):
                out.retrievals += 1
                queries.setdefault(ev.query)
                out.slot_queries.setdefault(f"{run}:{ev.slot}", []).append(ev.query)
    out.keys, out.tips, out.queries = list(keys), list(tips), list(queries)
    return out


def corpus(logged: Logged, size: int, queries: int, seed: int) -> tuple[list[str], list[str]]:
    """``(indexed, asked)``: every distinct key first, then distinct queries drawn at random up
    to ``size`` texts in all; ``asked`` are ``queries`` other distinct queries (held out)."""
    keys = set(logged.keys)
    pool = [q for q in logged.queries if q not in keys]
    random.Random(seed).shuffle(pool)
    fill = max(0, size - len(logged.keys))
    if fill + queries > len(pool):
        raise ValueError(f"the runs hold {len(pool)} other queries, {fill + queries} needed")
    return logged.keys[:size] + pool[:fill], pool[fill : fill + queries]


def embed_cached(embedder: Embedder, label: str, texts: Sequence[str], cache: Path) -> np.ndarray:
    """``embedder.embed(texts)``, kept in ``cache`` under a digest of ``label`` and the texts."""
    digest = hashlib.sha256(label.encode())
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
    where = cache / f"{label}-{digest.hexdigest()[:16]}.npy"
    if where.exists():
        return np.load(where)
    cache.mkdir(parents=True, exist_ok=True)
    vectors = (
        np.concatenate([embedder.embed(texts[k : k + 256]) for k in range(0, len(texts), 256)])
        if texts
        else np.zeros((0, embedder.dim), dtype=np.float32)
    )
    np.save(where, vectors)
    return vectors


# --- the index on real key embeddings -------------------------------------------------------


def recall(got: Hits, want: Hits) -> float:
    """Share of ``want``'s keys (per query) that ``got`` holds too."""
    found = sum(len({k for k, _ in g} & {k for k, _ in w}) for g, w in zip(got, want, strict=True))
    return found / max(1, sum(len(w) for w in want))


def single_ms(index: VectorIndex, queries: np.ndarray, k: int) -> float:
    """Median ms of ``search`` of one query row at a time, over ``queries``."""
    times = []
    for i in range(len(queries)):
        start = time.perf_counter()
        index.search(queries[i : i + 1], k)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def hnsw(vectors: np.ndarray, m: int, ef_add: int) -> tuple[UsearchIndex, float]:
    """A UsearchIndex always in its HNSW regime holding ``vectors``; its build seconds."""
    index = UsearchIndex(vectors.shape[1], connectivity=m, expansion_add=ef_add, exact_below=0)
    start = time.perf_counter()
    index.add(range(len(vectors)), vectors)
    return index, time.perf_counter() - start


@dataclass(frozen=True)
class SweepRow:
    size: int
    m: int
    ef_add: int
    ef: int
    build_s: float
    hnsw_ms: float  # median of rounds of per-query medians
    exact_ms: float
    recall: float


def sweep(
    indexed: np.ndarray,
    asked: np.ndarray,
    sizes: Sequence[int],
    settings: Sequence[tuple[int, int]],
    efs: Sequence[int],
    rounds: int,
    k: int = 10,
) -> list[SweepRow]:
    """For each size (the first ``size`` indexed rows) and HNSW setting ``(M, efConstruction)``
    and search width ``ef``: recall@k against ExactIndex, and single-query latency of HNSW and
    of UsearchIndex's exact regime (float32, one BLAS thread), timed alternately ``rounds``
    times (medians)."""
    rows: list[SweepRow] = []
    for size in sizes:
        vectors = indexed[:size]
        truth = ExactIndex(vectors.shape[1])
        truth.add(range(size), vectors)
        want = truth.search(asked, k)
        exact = UsearchIndex(vectors.shape[1], exact_below=size)
        exact.add(range(size), vectors)
        assert exact.exact and not exact.has_graph
        for m, ef_add in settings:
            graph, build = hnsw(vectors, m, ef_add)
            for ef in efs:
                graph.expansion_search = ef
                got = graph.search(asked, k)
                times: dict[str, list[float]] = {"hnsw": [], "exact": []}
                for _ in range(rounds):
                    times["exact"].append(single_ms(exact, asked, k))
                    times["hnsw"].append(single_ms(graph, asked, k))
                row = SweepRow(
                    size,
                    m,
                    ef_add,
                    ef,
                    build,
                    statistics.median(times["hnsw"]),
                    statistics.median(times["exact"]),
                    recall(got, want),
                )
                rows.append(row)
                print(row, flush=True)
            del graph
            gc.collect()
    return rows


# --- embedders against the full model on logged queries --------------------------------------


def slot_sample(logged: Logged, per_slot: int, min_keys: int, seed: int) -> dict[str, list[str]]:
    """Up to ``per_slot`` distinct logged queries of each slot holding ``min_keys`` keys."""
    rng = random.Random(seed)
    out = {}
    for slot, queries in sorted(logged.slot_queries.items()):
        if len(logged.slot_keys.get(slot, ())) < min_keys:
            continue
        distinct = list(dict.fromkeys(queries))
        rng.shuffle(distinct)
        out[slot] = distinct[:per_slot]
    return out


def top(keys: np.ndarray, queries: np.ndarray, k: int, threshold: float | None) -> list[set[int]]:
    """Per query, the row numbers of its ``k`` most similar keys (above ``threshold``)."""
    sims = queries @ keys.T  # (q, n)
    out = []
    for row in sims:
        best = np.argsort(-row, kind="stable")[:k]
        out.append({int(i) for i in best if threshold is None or row[i] > threshold})
    return out


def agreement(
    logged: Logged,
    asked: dict[str, list[str]],
    vectors: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
    k: int,
    threshold: float | None,
) -> float:
    """Over every sampled query: the share of the reference's retrieved tips (its top ``k`` keys
    of the query's slot, above ``threshold``) that ``vectors`` retrieves too. ``vectors`` and
    ``reference`` map each text to its embedding."""
    want_total, found = 0, 0
    for slot, queries in asked.items():
        keys = logged.slot_keys[slot]
        ref = top(
            np.stack([reference[t] for t in keys]),
            np.stack([reference[q] for q in queries]),
            k,
            threshold,
        )
        got = top(
            np.stack([vectors[t] for t in keys]),
            np.stack([vectors[q] for q in queries]),
            k,
            threshold,
        )
        want_total += sum(map(len, ref))
        found += sum(len(r & g) for r, g in zip(ref, got, strict=True))
    return found / max(1, want_total)


def texts_per_s(embedder: Embedder, texts: Sequence[str]) -> float:
    """Texts per second of one ``embed`` call over ``texts``."""
    start = time.perf_counter()
    embedder.embed(texts)
    return len(texts) / (time.perf_counter() - start)


def choose(rows: Sequence[SweepRow], goal: float) -> SweepRow | None:
    """The fastest HNSW row reaching recall ``goal`` (None if none does)."""
    good = [r for r in rows if r.recall >= goal]
    return min(good, key=lambda r: r.hnsw_ms) if good else None


VARIANTS: tuple[tuple[str, int], ...] = (
    ("minilm", 0),
    ("minilm-int8", 0),
    ("minilm", 512),
    ("minilm", 1024),
    ("minilm-int8", 512),
)
"""(embedder, query_chars) pairs compared; the first is the reference (what the runs used)."""


@dataclass(frozen=True)
class EmbedRow:
    embedder: str
    query_chars: int
    texts_per_s: float  # median of rounds
    top10: float  # share of the reference's top-10 keys of the query's slot also found
    shown: float  # the same for the threshold rule (top 3 above 0.5, empo2.toml)
    pooled: float  # top 10 among the keys of every sampled slot together


def embedders(
    logged: Logged,
    cache: Path,
    per_slot: int,
    speed_texts: int,
    rounds: int,
    seed: int,
) -> list[EmbedRow]:
    """Each variant's speed on logged queries and its agreement with the reference."""
    from agents.models.embedder import BoundedEmbedder, make_embedder

    asked = slot_sample(logged, per_slot, 10, seed)
    texts = list(
        dict.fromkeys(
            [k for slot in asked for k in logged.slot_keys[slot]]
            + [q for qs in asked.values() for q in qs]
        )
    )
    print(
        f"quality: {len(asked)} slots, {sum(map(len, asked.values()))} queries, {len(texts)} texts",
        flush=True,
    )
    models = {name: make_embedder(name) for name in dict.fromkeys(n for n, _ in VARIANTS)}  # type: ignore[arg-type]
    made = {v: BoundedEmbedder(models[v[0]], v[1]) for v in VARIANTS}
    vectors = {
        v: dict(zip(texts, embed_cached(e, f"{v[0]}-{v[1]}", texts, cache), strict=True))
        for v, e in made.items()
    }
    sample = random.Random(seed).sample(logged.queries, speed_texts)
    rates: dict[tuple[str, int], list[float]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for v, e in made.items():
            rates[v].append(texts_per_s(e, sample))
        print({f"{n}/{c}": round(r[-1], 1) for (n, c), r in rates.items()}, flush=True)
    ref = vectors[VARIANTS[0]]
    all_queries = [q for qs in asked.values() for q in qs]
    pooled = Logged(
        slot_keys={"all": list(dict.fromkeys(k for s in asked for k in logged.slot_keys[s]))}
    )
    return [
        EmbedRow(
            name,
            chars,
            statistics.median(rates[(name, chars)]),
            agreement(logged, asked, vectors[(name, chars)], ref, 10, None),
            agreement(logged, asked, vectors[(name, chars)], ref, 3, 0.5),
            agreement(pooled, {"all": all_queries}, vectors[(name, chars)], ref, 10, None),
        )
        for name, chars in VARIANTS
    ]
