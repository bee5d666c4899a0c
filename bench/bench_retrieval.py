"""Tip retrieval: UsearchIndex (HNSW) next to ExactIndex (numpy brute force), and the embedders.

For each data set and size, both indexes are built from the same unit vectors (dim 384 by
default) and asked the same queries:

- build: one ``add`` of every vector (UsearchIndex inserts on one thread, by design);
- single query: ``search`` of one ``(1, dim)`` row at a time, k = 10, p50 and p95 over the
  queries;
- batched: one ``search`` of all queries at once, in queries per second;
- recall@10: the share of ExactIndex's 10 keys that UsearchIndex returns, over the batch.

Data sets: *random* (independent Gaussian directions, the hardest case for HNSW) and
*clustered* (each vector a random one of ``--centres`` unit centres plus isotropic noise of the
same norm, so a point's cosine to its centre is about 0.7, roughly how close MiniLM places
paraphrases; queries are fresh points around the same centres). Sizes at or below the index's
``exact_below`` (``stores.tip_index.EXACT_BELOW``) run in UsearchIndex's exact regime.

Embedders: texts per second embedding observation-like texts, one at a time and in batches of
32; MiniLM at torch's default thread count and, when asked, at other counts (the benchmark sets
torch's global count; the library never does).

Run: ``.venv/bin/python bench/bench_retrieval.py [--sizes N ...] [--datasets D ...]``; the
defaults (1k and 10k tips, both data sets, embedders) take about 1.5 min on the 2-core VM, and
``--sizes 100000`` takes 3-9 min per data set (the one-threaded HNSW build).

On real EMPO2 texts (``--runs RUN ...``, e.g. ``runs/headline/empo2-seed*``; bench/real_tips.py):

- ``--sweep``: MiniLM embeddings of the runs' tip keys, filled up with other logged retrieval
  queries (texts of the same kind) to the largest of ``--real-sizes``; queries are other logged
  queries. First the HNSW settings grid (``--hnsw M:efConstruction``, ``--efs``) at the largest
  size, then, with the fastest setting that reaches recall@10 ``--goal``, single-query latency of
  exact float32 search (one BLAS thread) and of HNSW at each size, alternated ``--rounds`` times
  (medians): the threshold is the largest size where exact is still the faster.
- ``--embedders``: each (embedder, query_chars) of ``real_tips.VARIANTS`` against full MiniLM
  on whole texts (what the runs used): texts/s on logged queries (torch threads 1, rounds
  alternated, median) and the share of the reference's retrieved tips each variant also
  retrieves, per slot (top 10; top 3 above similarity 0.5) and pooled over the sampled slots.

Embeddings are cached under ``--cache`` (keyed by the texts).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents.models.embedder import Embedder, HashingEmbedder, MiniLMEmbedder
from stores.tip_index import EXACT_BELOW, ExactIndex, UsearchIndex, VectorIndex

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_tips

K = 10


@dataclass(frozen=True)
class IndexRow:
    dataset: str
    size: int
    backend: str
    build_s: float
    p50_ms: float
    p95_ms: float
    batch_qps: float
    recall: float | None


@dataclass(frozen=True)
class EmbedRow:
    embedder: str
    threads: int
    batch: int
    texts: int
    texts_per_s: float


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` scaled to unit L2 norm, as float32."""
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def make_dataset(
    name: str, n: int, queries: int, dim: int, centres: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(vectors (n, dim), queries (queries, dim))``, float32 unit rows."""
    rng = np.random.default_rng(seed)
    if name == "random":
        return (
            unit_rows(rng.standard_normal((n, dim))),
            unit_rows(rng.standard_normal((queries, dim))),
        )
    middle = unit_rows(rng.standard_normal((centres, dim))).astype(np.float64)

    def around(count: int) -> np.ndarray:
        labels = rng.integers(0, centres, count)
        return unit_rows(middle[labels] + rng.standard_normal((count, dim)) / np.sqrt(dim))

    return around(n), around(queries)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure_index(
    index: VectorIndex, vectors: np.ndarray, queries: np.ndarray, singles: int
) -> tuple[float, list[float], float, list[list[tuple[int, float]]]]:
    """``(build s, single-query latencies s, batched queries/s, batched answers)``."""
    build = timed(lambda: index.add(range(len(vectors)), vectors))
    latencies = [timed(lambda i=i: index.search(queries[i : i + 1], K)) for i in range(singles)]
    start = time.perf_counter()
    answers = index.search(queries, K)
    qps = len(queries) / (time.perf_counter() - start)
    return build, latencies, qps, answers


def recall_at_k(
    got: Sequence[Sequence[tuple[int, float]]], want: Sequence[Sequence[tuple[int, float]]]
) -> float:
    found = sum(len({k for k, _ in g} & {k for k, _ in w}) for g, w in zip(got, want, strict=True))
    return found / sum(len(w) for w in want)


def bench_size(dataset: str, size: int, args: argparse.Namespace) -> list[IndexRow]:
    """Both backends on one data set of ``size`` vectors."""
    vectors, queries = make_dataset(dataset, size, args.queries, args.dim, args.centres, args.seed)
    rows: list[IndexRow] = []
    answers: dict[str, list[list[tuple[int, float]]]] = {}
    for backend in ("exact", "usearch"):
        index: VectorIndex = (
            ExactIndex(args.dim)
            if backend == "exact"
            else UsearchIndex(
                args.dim,
                search_threads=args.search_threads,
                expansion_search=args.expansion_search,
            )
        )
        build, latencies, qps, answers[backend] = measure_index(
            index, vectors, queries, args.singles
        )
        ms = sorted(1e3 * s for s in latencies)
        recall = None
        if backend == "usearch":
            recall = recall_at_k(answers["usearch"], answers["exact"])
            backend = "usearch" if size > EXACT_BELOW else "usearch (exact regime)"
            if args.expansion_search != 64 and size > EXACT_BELOW:
                backend = f"usearch, ef {args.expansion_search}"
        p95 = ms[int(0.95 * (len(ms) - 1))]
        rows.append(
            IndexRow(dataset, size, backend, build, statistics.median(ms), p95, qps, recall)
        )
        print(rows[-1], flush=True)
        del index
        gc.collect()
    return rows


def bench_indexes(args: argparse.Namespace) -> list[IndexRow]:
    return [
        row
        for dataset in args.datasets
        for size in args.sizes
        for row in bench_size(dataset, size, args)
    ]


def observation_texts(n: int, seed: int) -> list[str]:
    """Observation-like texts: a goal, an action, what the agent sees."""
    rng = np.random.default_rng(seed)
    colours = ["green", "red", "blue", "yellow", "white"]
    things = ["bulb", "crate", "battery", "wire", "switch", "door", "key", "lamp", "box"]
    verbs = ["light", "open", "charge", "connect", "find", "unlock"]

    def pick(words: list[str]) -> str:
        return words[int(rng.integers(len(words)))]

    return [
        f"goal: {pick(verbs)} the {pick(colours)} {pick(things)}.\n"
        f"> {pick(verbs)} {pick(things)}\n"
        f"you see a {pick(things)}, a {pick(colours)} {pick(things)} and a {pick(things)}."
        for _ in range(n)
    ]


def texts_per_second(
    embedder: Embedder, texts: list[str], batch: int, budget_s: float
) -> tuple[int, float]:
    """Embed ``texts`` ``batch`` at a time until done or ``budget_s`` has passed."""
    embedder.embed(texts[:batch])  # warm-up
    done, start = 0, time.perf_counter()
    while done < len(texts) and time.perf_counter() - start < budget_s:
        embedder.embed(texts[done : done + batch])
        done += batch
    return done, done / (time.perf_counter() - start)


def bench_embedders(args: argparse.Namespace) -> list[EmbedRow]:
    import torch

    texts = observation_texts(args.texts, args.seed)
    rows: list[EmbedRow] = []
    default = torch.get_num_threads()
    hashing = HashingEmbedder()
    for batch in (1, 32):
        count, rate = texts_per_second(hashing, texts, batch, args.embed_budget)
        rows.append(EmbedRow("hashing (dim 256)", 1, batch, count, rate))
    minilm = MiniLMEmbedder()
    for threads in [default, *[t for t in args.torch_threads if t != default]]:
        torch.set_num_threads(threads)  # benchmark only: the library never sets this
        for batch in (1, 32):
            count, rate = texts_per_second(minilm, texts, batch, args.embed_budget)
            rows.append(EmbedRow("minilm", threads, batch, count, rate))
            print(rows[-1], flush=True)
    torch.set_num_threads(default)
    return rows


def print_tables(index_rows: list[IndexRow], embed_rows: list[EmbedRow]) -> None:
    if index_rows:
        print("| data | tips | index | build s | p50 ms | p95 ms | batched q/s | recall@10 |")
        print("|---|---:|---|---:|---:|---:|---:|---:|")
        for r in index_rows:
            recall = "" if r.recall is None else f"{r.recall:.3f}"
            print(
                f"| {r.dataset} | {r.size:,} | {r.backend} | {r.build_s:.2f} | {r.p50_ms:.3f} "
                f"| {r.p95_ms:.3f} | {r.batch_qps:,.0f} | {recall} |"
            )
    if embed_rows:
        print()
        print("| embedder | torch threads | batch | texts | texts/s |")
        print("|---|---:|---:|---:|---:|")
        for e in embed_rows:
            threads = "-" if e.embedder.startswith("hashing") else str(e.threads)
            print(f"| {e.embedder} | {threads} | {e.batch} | {e.texts} | {e.texts_per_s:,.0f} |")


def real(args: argparse.Namespace) -> None:
    """The measurements on real run texts (``--sweep``, ``--embedders``)."""
    import torch

    torch.set_num_threads(1)  # benchmark only; a run sets [policy] threads (default 1)
    print(f"load average {os.getloadavg()}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}", flush=True)
    logged = real_tips.read_runs(args.runs)
    print(
        f"{len(args.runs)} runs: {len(logged.keys)} distinct keys, {len(logged.tips)} tips, "
        f"{len(logged.queries)} distinct queries of {logged.retrievals} retrievals",
        flush=True,
    )
    if args.sweep:
        sweep_real(logged, args)
    if args.embedders:
        rows = real_tips.embedders(
            logged, args.cache, args.per_slot, args.speed_texts, args.rounds, args.seed
        )
        print(f"\nload average {os.getloadavg()}, {time.strftime('%H:%M:%S %Z')}")
        print(
            "| embedder | query_chars | texts/s | top 10 per slot | top 3 > 0.5 | top 10 pooled |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r.embedder} | {r.query_chars or '-'} | {r.texts_per_s:.1f} | {r.top10:.3f} "
                f"| {r.shown:.3f} | {r.pooled:.3f} |"
            )


def sweep_real(logged: real_tips.Logged, args: argparse.Namespace) -> None:
    """The HNSW grid at the largest size, then the exact/HNSW threshold over the sizes."""
    from agents.models.embedder import MiniLMEmbedder

    indexed, asked = real_tips.corpus(logged, max(args.real_sizes), args.real_queries, args.seed)
    minilm = MiniLMEmbedder()
    vectors = real_tips.embed_cached(minilm, "minilm-indexed", indexed, args.cache)
    queries = real_tips.embed_cached(minilm, "minilm-asked", asked, args.cache)
    settings = [tuple(int(x) for x in s.split(":")) for s in args.hnsw]
    grid = real_tips.sweep(
        vectors, queries, [max(args.real_sizes)], settings, args.efs, args.rounds
    )
    best = real_tips.choose(grid, args.goal)
    print_sweep("HNSW settings", grid)
    if best is None:
        print(f"no setting reached recall@10 {args.goal}")
        return
    print(f"fastest reaching {args.goal}: M {best.m}, efConstruction {best.ef_add}, ef {best.ef}")
    sizes = [n for n in args.real_sizes if n != best.size]
    by_size = real_tips.sweep(
        vectors, queries, sizes, [(best.m, best.ef_add)], [best.ef], args.rounds
    )
    rows = [*by_size, best]
    print_sweep("exact vs HNSW by size", rows)
    faster = [r.size for r in rows if r.exact_ms <= r.hnsw_ms]
    print(f"exact is faster up to {max(faster) if faster else 0:,} keys (of the sizes tried)")


def print_sweep(title: str, rows: Sequence[real_tips.SweepRow]) -> None:
    print(f"\n{title}, load average {os.getloadavg()}, {time.strftime('%H:%M:%S %Z')}")
    print("| keys | M | efConstruction | ef | build s | recall@10 | HNSW ms | exact ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.size:,} | {r.m} | {r.ef_add} | {r.ef} | {r.build_s:.1f} | {r.recall:.3f} "
            f"| {r.hnsw_ms:.3f} | {r.exact_ms:.3f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--datasets", nargs="*", default=["random", "clustered"])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--centres", type=int, default=300)
    parser.add_argument("--queries", type=int, default=1000, help="batched queries")
    parser.add_argument("--singles", type=int, default=200, help="single-query timings")
    parser.add_argument("--search-threads", type=int, default=1)
    parser.add_argument("--expansion-search", type=int, default=64, help="usearch ef")
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--embed-budget", type=float, default=8.0, help="seconds per row")
    parser.add_argument("--torch-threads", type=int, nargs="*", default=[1])
    parser.add_argument("--no-embedders", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", nargs="*", default=[], help="EMPO2 run directories")
    parser.add_argument("--sweep", action="store_true", help="threshold and HNSW sweep (--runs)")
    parser.add_argument("--embedders", action="store_true", help="embedder variants (--runs)")
    parser.add_argument(
        "--real-sizes", type=int, nargs="*", default=[1000, 2000, 4000, 8000, 12000, 16000, 20000]
    )
    parser.add_argument("--hnsw", nargs="*", default=["16:128", "32:256"], help="M:efConstruction")
    parser.add_argument("--efs", type=int, nargs="*", default=[64, 128, 256, 512])
    parser.add_argument("--goal", type=float, default=0.95, help="recall@10 the HNSW must reach")
    parser.add_argument("--real-queries", type=int, default=1000)
    parser.add_argument("--per-slot", type=int, default=20, help="queries per slot (quality)")
    parser.add_argument("--speed-texts", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path("runs/bench-retrieval-cache"))
    args = parser.parse_args()
    if args.runs:
        real(args)
        return
    print(
        f"python {platform.python_version()}, {os.cpu_count()} cpus, "
        f"load average {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        flush=True,
    )
    start = time.perf_counter()
    index_rows = bench_indexes(args)
    embed_rows = [] if args.no_embedders else bench_embedders(args)
    print(f"\ntotal {time.perf_counter() - start:.0f} s, load average {os.getloadavg()[0]:.2f}\n")
    print_tables(index_rows, embed_rows)


if __name__ == "__main__":
    main()
