"""Evidence that a change of code layout changed no behaviour: run a tiny deterministic scenario
per method (GRPO, EMPO2, Complementary RL; ``tests/faults/resume_kit.py``'s, with
``max_staleness = 0`` and ``policy.batch_max = 1``) and print, per method, the final policy digest
and a fingerprint of the events (the multiset of canonical encodings, minus the runtime's own
events, timing fields and the worker that ran an episode: ``resume_kit.comparable``).

Run it before and after a change and compare the JSON::

    python bench/same_behaviour.py --out /tmp/before > /tmp/before.json
    python bench/same_behaviour.py --out /tmp/after > /tmp/after.json

It uses only the ``coevo`` command line and ``stores.lmdb_log``, and names events by their
registered kind, so the same script runs on either side of a move of the agents' modules. EMPO2
and Complementary RL are not deterministic even so (their memory's writes race its reads:
docs/RELIABILITY.md); for them, compare the old runs' updates re-executed by the new code
(``coevo replay RUN --reexecute-learner``) instead.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "faults"))

from resume_kit import COMPLEMENTARY, EMPO2, GRPO  # noqa: E402

from stores.lmdb_log import LmdbEventLog  # noqa: E402

SCENARIOS = {"grpo": GRPO, "empo2": EMPO2, "complementary": COMPLEMENTARY}
UNCOMPARED = frozenset({"seconds", "worker", "run_id"})


def cli_module() -> str:
    """The module of the ``coevo`` command line on this side of the move."""
    return "scenarios.cli" if importlib.util.find_spec("scenarios.cli") else "engine.cli"


def fingerprint(run: Path) -> dict[str, Any]:
    """The run's final digest, and the sha256 of its comparable events' sorted encodings."""
    log = LmdbEventLog.open(run / "log", writable=False)
    try:
        envs = list(log.read(0, None))
    finally:
        log.close()
    kinds: Counter[str] = Counter()
    bodies: list[bytes] = []
    digests: list[str] = []
    for env in envs:
        kind = str(env.event.__struct_config__.tag)
        if kind == "policy_updated":
            digests.append(env.event.digest)  # type: ignore[attr-defined]
        if env.actor == "runtime":
            continue
        body: dict[str, Any] = msgspec.to_builtins(env.event)
        for key in UNCOMPARED:
            body.pop(key, None)
        kinds[kind] += 1
        bodies.append(msgspec.json.encode([kind, body], order="deterministic"))
    events = hashlib.sha256(b"\n".join(sorted(bodies))).hexdigest()
    return {"digests": digests, "events": events, "count": len(bodies), "kinds": dict(kinds)}


def run(method: str, out: Path) -> dict[str, Any]:
    scenario = out / f"{method}.toml"
    scenario.write_text(SCENARIOS[method])
    started = time.monotonic()
    args = ["run", str(scenario), "--out", str(out / method), "--quiet"]
    proc = subprocess.run(
        [sys.executable, "-m", cli_module(), *args],
        cwd=ROOT,
        env={**os.environ, "COEVO_CACHE": str(out / "cache"), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{method}: exit {proc.returncode}\n{proc.stderr.decode()[-3000:]}")
    return {**fingerprint(out / method), "seconds": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="runs and model cache")
    parser.add_argument("--methods", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {method: run(method, args.out) for method in args.methods}
    print(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
