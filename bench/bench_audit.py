"""``coevo audit`` on a large log: index build, incremental refresh, and per-question latency.

Builds a synthetic Complementary RL log of ``--events`` events (default 1,000,000) with the mix
of a real run (``runs/methods-b16/complementary-seed0``: per episode of ~16 turns an
assignment, a start, three events per turn, an end and an extraction; half the episodes guided
by one entry, with its retrieval and credit; a group's advantages every 8 episodes, a policy
update every 32, an extractor update every 16 credited calls, merges now and then). Entries are
retrieved with a Zipf-like skew, so the most used one has thousands of uses (the worst case of a
tip audit). Payloads are the real run's sizes (prompts of a few hundred characters, token ids).

Then it measures: the first index build (one pass over the log), a refresh after appending a
10,000-event tail (a live run), and the latency of ``audit_tip`` and ``audit_episode`` (over
sampled ids, in a warm process: what a question costs once ``coevo`` has started), and one
``coevo audit RUN credit`` pass.

Run: ``.venv/bin/python bench/bench_audit.py [--events N] [--out DIR] [--questions Q]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from agents.audit.answers import audit_tip
from agents.audit.credit import audit_credit
from agents.audit.episode import audit_episode
from agents.audit.index import INDEX_DIR, index_ident, refresh
from agents.audit.inputs import AuditSettings, gather
from agents.events.episodes import EpisodeAssigned, EpisodeFinished, EpisodeStarted, StepTaken
from agents.events.extractor import (
    ExtractionRequested,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
    MergeRequested,
)
from agents.events.memory import RetrievalRequested, TipEvicted, TipsRetrieved, TipStored
from agents.events.policy import (
    ActionRequested,
    ActionSampled,
    AdvantagesComputed,
    GradientRequested,
)
from agents.learning.credit_actor import CreditBook, CreditSettings
from agents.methods.builtin import Complementary
from agents.methods.settings import ComplementaryConfig, GrpoConfig
from agents.testing.events import policy_updated
from engine.eventlog import new_run_meta
from engine.events import Envelope, Event
from stores.fact_index import LmdbFactIndex
from stores.lmdb_log import LmdbEventLog

SLOT = "train/heat"
ADMISSIBLE = (
    *(f"take {x}" for x in ("apple", "clay jug", "glass bottle", "metal can")),
    "look",
    "inventory",
    "turn on burner",
    "turn on oven",
    "turn on stove",
)
OBS = (
    "you are in a small lab. you see a burner, an oven and a stove. on the table you see an apple."
)
SETTINGS = CreditSettings(batch=16)


class Synth:
    """Generates the synthetic run; the credit actor's real fold makes its credit events."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seq = 0
        self.book = CreditBook()
        self.tips: list[tuple[int, str]] = []  # live entries: (id, call)
        self.next_tip = 0
        self.episode_no = 0
        self.group: list[tuple[str, bool, float]] = []
        self.groups = 0
        self.version = 0

    def env(self, ev: Event, cause: int | None = None) -> Envelope[Event]:
        e = Envelope(seq=self.seq, run="bench", t=self.seq, actor="a", event=ev, cause=cause)
        self.seq += 1
        return e

    def episode(self) -> Iterator[Envelope[Event]]:
        n = self.episode_no
        self.episode_no += 1
        ep = f"ep{n:07d}"
        guided = bool(self.tips) and n % 8 < 4
        yield self.env(
            EpisodeAssigned(
                episode=ep,
                index=n,
                worker=f"worker-{n % 32}",
                family="heat",
                variant=n % 97,
                split="train",
                seed=n,
                rollout="guided" if guided else "plain",
                extract=True,
            )
        )
        yield self.env(
            EpisodeStarted(
                episode=ep,
                worker="w",
                goal="heat the metal can.",
                observation=OBS,
                admissible=ADMISSIBLE,
            )
        )
        if guided:
            # Zipf-like: low positions of the live list (old entries) are picked far more often
            tip, call = self.tips[min(int(self.rng.paretovariate(1.2)) - 1, len(self.tips) - 1)]
            yield self.env(
                RetrievalRequested(
                    episode=ep, worker="w", turn=0, slot=SLOT, query=OBS, rule="diverse", k=1
                )
            )
            ev = TipsRetrieved(
                episode=ep,
                worker="w",
                turn=0,
                slot=SLOT,
                tip_ids=(tip,),
                similarities=(0.7,),
                ranks=(0,),
                tips=("take metal can, then turn on stove",),
                similar=1,
                slot_size=len(self.tips),
                scores=(-1.0,),
                calls=(call,),
            )
            yield self.env(ev)
            self.book.decide(ev, SETTINGS)
        turns = self.rng.randint(8, 24)
        prompt = tuple(range(150))
        for t in range(turns):
            yield self.env(
                ActionRequested(
                    episode=ep,
                    worker="w",
                    turn=t,
                    messages=(("system", OBS), ("user", OBS * 3)),
                    admissible=ADMISSIBLE,
                    seed=t,
                )
            )
            yield self.env(
                ActionSampled(
                    episode=ep,
                    worker="w",
                    turn=t,
                    policy_version=self.version,
                    action="look",
                    prompt_ids=prompt,
                    response_ids=(5, 2),
                    token_logps=(-0.5, -0.01),
                    candidates=tuple((i, i + 1) for i in range(9)),
                    candidate_scores=tuple(-float(i) for i in range(9)),
                    choice=0,
                    logp=-0.5,
                    temperature=1.0,
                )
            )
            yield self.env(
                StepTaken(
                    episode=ep,
                    turn=t,
                    action="look",
                    observation=OBS,
                    admissible=ADMISSIBLE,
                    reward=0.0,
                    done=t == turns - 1,
                    score=0.0,
                )
            )
        success = self.rng.random() < 0.4
        fin = EpisodeFinished(
            episode=ep,
            worker="w",
            family="heat",
            variant=n % 97,
            split="train",
            steps=turns,
            score=1.0 if success else 0.1,
            success=success,
            total_reward=float(success),
        )
        fin_env = self.env(fin)
        yield fin_env
        for out in self.book.decide(fin, SETTINGS):
            yield self.env(out, fin_env.seq)
            if isinstance(out, ExtractorGradientRequested):
                yield self.env(
                    ExtractorUpdated(
                        extractor_version=out.update + 1,
                        update=out.update,
                        samples=16,
                        loss=0.0,
                        grad_norm=0.0,
                        clip_frac=0.0,
                        digest="e",
                        checkpoint="c",
                        seconds=1.0,
                    )
                )
        yield from self.extract(ep, success)
        yield from self.grouped(ep, guided, fin.score)

    def extract(self, ep: str, success: bool) -> Iterator[Envelope[Event]]:
        req = self.env(
            ExtractionRequested(
                episode=ep,
                worker="w",
                slot=SLOT,
                entry=-1,
                messages=(("user", OBS * 4),),
                success=success,
                score=1.0,
                seed=0,
            )
        )
        yield req
        parents = (
            (self.tips.pop(self.rng.randrange(len(self.tips)))[0],)
            if self.tips and self.rng.random() < 0.1
            else ()
        )
        call = f"x{req.seq}"
        called = self.env(
            ExtractorCalled(
                call=call,
                task="extract",
                source=ep,
                slot=SLOT,
                prompt_ids=tuple(range(300)),
                response_ids=tuple(range(20)),
                token_logps=(-1.0,) * 20,
                text="take metal can",
                temperature=1.0,
                extractor_version=0,
                ops=(("update" if parents else "add", parents, "take metal can"),),
            ),
            req.seq,
        )
        yield called
        for p in parents:
            yield self.env(TipEvicted(tip_id=p, slot=SLOT, reason="update"), called.seq)
        if self.rng.random() < 0.6 or parents:
            tip = self.next_tip
            self.next_tip += 1
            self.tips.append((tip, call))
            yield self.env(
                TipStored(
                    tip_id=tip,
                    slot=SLOT,
                    episode=ep,
                    text=f"note {tip}: take metal can",
                    score=0.0,
                    key="k",
                    call=call,
                    parents=parents,
                ),
                called.seq,
            )

    def grouped(self, ep: str, guided: bool, reward: float) -> Iterator[Envelope[Event]]:
        self.group.append((ep, guided, reward))
        if len(self.group) < 8:
            return
        eps = tuple(e for e, _, _ in self.group)
        rolls = tuple("guided" if g else "plain" for _, g, _ in self.group)
        rewards = tuple(r for _, _, r in self.group)
        self.group = []
        yield self.env(
            AdvantagesComputed(
                group=f"g{self.groups}",
                update=self.groups // 4,
                family="heat",
                variant=1,
                episodes=eps,
                rewards=rewards,
                advantages=(0.0,) * 8,
                rule="subgroup-mean-weighted-score",
                eps=1e-6,
                mean=0.0,
                std=0.0,
                rollouts=rolls,
            )
        )
        self.groups += 1
        if self.groups % 4 == 0:
            u = self.groups // 4 - 1
            yield self.env(GradientRequested(update=u, episodes=eps * 4, advantages=(0.0,) * 32))
            self.version += 1
            yield self.env(
                policy_updated(
                    self.version, update=u, samples=500, grad_norm=1.0, checkpoint="c", seconds=1.0
                )
            )
            yield self.env(MergeRequested(step=u, slot=SLOT, entries=(), messages=(), seed=0))

    def stream(self, events: int) -> Iterator[Envelope[Event]]:
        while self.seq < events:
            yield from self.episode()


def build(path: Path, events: int, seed: int = 0) -> int:
    """Write the synthetic log into ``path/log``; returns its event count."""
    meta = new_run_meta("bench", scenario_name="bench", seed=seed, coevo_version="bench")
    log = LmdbEventLog.create(path / "log", meta, durable=False)
    synth = Synth(seed)
    batch: list[Envelope[Event]] = []
    try:
        for env in synth.stream(events):
            batch.append(env)
            if len(batch) == 4096:
                log.append(batch)
                batch = []
        if batch:
            log.append(batch)
        return log.next_seq
    finally:
        log.close()


def _timed(fn: object, *args: object) -> float:
    start = time.perf_counter()
    fn(*args)  # type: ignore[operator]
    return time.perf_counter() - start


def _stats(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    return (
        f"{name:<28} n={len(ms):<4} median {statistics.median(ms):8.2f} ms   "
        f"p90 {ms[int(0.9 * (len(ms) - 1))]:8.2f} ms   max {ms[-1]:8.2f} ms"
    )


def measure(root: Path, questions: int, seed: int = 1) -> list[str]:
    """Index ``root``'s log from scratch, refresh after a tail, and time questions."""
    shutil.rmtree(root / INDEX_DIR, ignore_errors=True)
    log = LmdbEventLog.open(root / "log")
    lines = [f"log: {log.next_seq} events, {_size(root / 'log') / 1e6:.0f} MB"]
    index = LmdbFactIndex.open(root / INDEX_DIR, index_ident("bench"))
    try:
        build_s = _timed(refresh, log, index)
        lines.append(
            f"index build (one pass): {build_s:.1f} s ({log.next_seq / build_s:,.0f} events/s), "
            f"{_size(root / INDEX_DIR) / 1e6:.0f} MB"
        )
        lines += _questions(log, index, questions, seed)
    finally:
        index.close()
        log.close()
    lines.append(_tail(root))
    log = LmdbEventLog.open(root / "log")
    try:
        inputs_s = time.perf_counter()
        inputs = gather(log)
        base = AuditSettings(
            credit=SETTINGS, method=Complementary(GrpoConfig(), ComplementaryConfig())
        )
        audit_credit(inputs, base, base)
        lines.append(
            f"credit audit (full pass + re-derivation): {time.perf_counter() - inputs_s:.1f} s"
        )
    finally:
        log.close()
    return lines


def _questions(log: LmdbEventLog, index: LmdbFactIndex, questions: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    uses: dict[int, int] = {}
    for k, _ in index.scan(b"t"):
        tip = int.from_bytes(k[1:9], "big")
        uses[tip] = uses.get(tip, 0) + 1
    tips = sorted(uses)
    hottest = max(uses, key=uses.__getitem__)
    sample = [hottest, *rng.sample(tips, min(questions, len(tips)))]
    tip_s = [_timed(audit_tip, log, index, t) for t in sample]
    eps = sorted(k[1:].decode() for k, _ in index.scan(b"o"))  # one outcome per episode
    episodes = rng.sample(eps, min(questions, len(eps)))
    ep_s = [_timed(audit_episode, log, index, e) for e in episodes]
    hot = audit_tip(log, index, hottest)
    return [
        _stats("audit_tip (sampled + hottest)", tip_s),
        f"  hottest entry {hottest}: {len(hot.uses)} retrievals, {len(hot.credits)} credits, "
        f"{_timed(audit_tip, log, index, hottest) * 1000:.1f} ms",
        _stats("audit_episode (sampled)", ep_s),
    ]


def _tail(root: Path) -> str:
    """Append a 10,000-event tail (a live run going on) and time the refresh."""
    log = LmdbEventLog.open(root / "log", writable=True, durable=False)
    try:
        synth = Synth(7)
        synth.seq = log.next_seq
        synth.episode_no = 10**6
        batch = []
        for env in synth.stream(log.next_seq + 10_000):
            batch.append(env)
        log.append(batch)
        with LmdbFactIndex.open(root / INDEX_DIR, index_ident("bench")) as index:
            seconds = _timed(refresh, log, index)
        return f"refresh after a {len(batch)}-event tail: {seconds * 1000:.0f} ms"
    finally:
        log.close()


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def on_synthetic_log(
    prefix: str, events: int, out: str | None, measure: Callable[[Path], Iterable[str]]
) -> None:
    """Print ``measure``'s lines on the synthetic run of :func:`build` (in ``out``, built there
    if missing and kept; else in a temporary directory removed afterwards), after the machine's
    CPU, cores and load (the benchmarks of the audit, the browser and the tracker share it)."""
    root = Path(out) if out else Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if not (root / "log" / "data.mdb").exists():
            start = time.perf_counter()
            n = build(root, events)
            print(f"built {n} events in {time.perf_counter() - start:.0f} s")
        cpu = platform.processor() or platform.machine()
        print(f"{cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
        for line in measure(root):
            print(line)
    finally:
        if not out:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--questions", type=int, default=50)
    parser.add_argument("--out", help="keep the synthetic run here (reused if it exists)")
    args = parser.parse_args()
    on_synthetic_log(
        "bench-audit-", args.events, args.out, lambda root: measure(root, args.questions)
    )


if __name__ == "__main__":
    main()
