"""``coevo serve`` on a large log: startup and page latency over HTTP.

Builds (or reuses, with ``--out``) the synthetic 1M-event Complementary RL log of
``bench/bench_audit.py``, then measures what a person waits for: the browser's startup (opening
the run and building its audit index the first time; opening it again once the index exists),
and the latency of each kind of page, fetched over HTTP from the real application served by
uvicorn on a loopback port in this process: the run list, the episode list (all episodes, and
filtered), sampled episode pages and entry pages (plus the most used entry's).

Run: ``.venv/bin/python bench/bench_browse.py [--events N] [--out DIR] [--pages P]``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import socket
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_audit import on_synthetic_log

from agents.audit.index import INDEX_DIR
from agents.browse.app import make_app
from scenarios.cli.serve import open_views


def _stats(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    return (
        f"{name:<34} n={len(ms):<4} median {statistics.median(ms):8.1f} ms   "
        f"p90 {ms[int(0.9 * (len(ms) - 1))]:8.1f} ms   max {ms[-1]:8.1f} ms"
    )


def _fetch(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as answer:
        answer.read()
        assert answer.status == 200, url
    return time.perf_counter() - start


def measure(root: Path, pages: int, seed: int = 1) -> list[str]:
    """Startup with and without an index, then page latencies over HTTP."""
    import uvicorn

    shutil.rmtree(root / INDEX_DIR, ignore_errors=True)
    start = time.perf_counter()
    views = open_views([str(root)])
    lines = [f"startup, index built (one pass): {time.perf_counter() - start:.1f} s"]
    for view in views.values():
        view.close()
    start = time.perf_counter()
    views = open_views([str(root)])
    lines.append(f"startup, index present: {(time.perf_counter() - start) * 1000:.0f} ms")
    (view,) = views.values()
    rng = random.Random(seed)
    episodes = [row.episode for row in view.episodes({})]
    uses: dict[int, int] = {}
    for k, _ in view.index.scan(b"t"):
        tip = int.from_bytes(k[1:9], "big")
        uses[tip] = uses.get(tip, 0) + 1
    hottest = max(uses, key=uses.__getitem__)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(make_app(views), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}/runs/{view.name}"
    try:
        lines.append(f"episodes: {len(episodes)}, entries: {len(uses)}")
        view._rows = (-1, [])  # the first list after startup reads every episode's row
        lines.append(f"episode list, first after startup: {_fetch(base) * 1000:.0f} ms")
        lines.append(_stats("run list /", [_fetch(base.rsplit("/runs", 1)[0]) for _ in range(5)]))
        lines.append(_stats("episode list (all, page 1)", [_fetch(base) for _ in range(5)]))
        lines.append(
            _stats("episode list (filtered)", [_fetch(base + "?rollout=guided&outcome=success")])
        )
        sample = rng.sample(episodes, min(pages, len(episodes)))
        lines.append(_stats("episode page", [_fetch(f"{base}/episodes/{e}") for e in sample]))
        tips = rng.sample(sorted(uses), min(pages, len(uses)))
        lines.append(_stats("entry page", [_fetch(f"{base}/entries/{t}") for t in tips]))
        hot = _fetch(f"{base}/entries/{hottest}")
        lines.append(f"most used entry {hottest} ({uses[hottest]} index rows): {hot * 1000:.0f} ms")
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        view.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--out", help="keep the synthetic run here (reused if it exists)")
    args = parser.parse_args()
    on_synthetic_log("bench-browse-", args.events, args.out, lambda root: measure(root, args.pages))


if __name__ == "__main__":
    main()
