"""What the headline runs' logs say about why: how training episodes fared in each rollout mode
(plain, with tips, distilled, guided by an entry), how far each kind of update moved the policy,
and the adaptation test with the untrained policy (the first round) beside the last.

Used by ``bench/headline.py``; pure folds of events, pooled over seeds with
:mod:`agents.report.intervals`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from agents.events.episodes import EpisodeAssigned, episode_success
from agents.events.policy import GradientRequested, PolicyUpdated
from agents.methods.base import mode_of
from agents.report.intervals import Groups, Interval, bootstrap_mean, bootstrap_ratio
from engine.events import Event


@dataclass
class Modes:
    """One run: training episodes' successes by rollout mode, each update's KL by the mode of
    its episodes, and the first adaptation round's success per task by attempt."""

    success: dict[str, list[float]] = field(default_factory=dict[str, list[float]])
    kl: dict[str, list[float]] = field(default_factory=dict[str, list[float]])
    first_adapt: dict[str, list[bool]] = field(default_factory=dict[str, list[bool]])


def modes_of(events: list[Event]) -> Modes:
    """The :class:`Modes` of one run's events. Complementary RL's free episodes of the warm-up
    (before any was guided) are counted apart from the free halves of later groups."""
    out = Modes()
    assigned = {ev.episode: ev for ev in events if isinstance(ev, EpisodeAssigned)}
    guided = [j.index for j in assigned.values() if j.purpose == "train" and j.rollout != "plain"]
    first_guided = (
        min(guided, default=0) if any(mode_of(j.rollout).guided for j in assigned.values()) else 0
    )
    updates = {ev.update: ev for ev in events if isinstance(ev, PolicyUpdated)}
    for episode, success in episode_success(events).items():  # an aborted one: a failure
        job = assigned.get(episode)
        if job is None:
            continue
        if job.purpose == "train":
            warm = job.rollout == "plain" and job.index < first_guided  # Complementary RL
            mode = "plain (warm-up)" if warm else job.rollout
            out.success.setdefault(mode, []).append(float(success))
        elif job.scope.startswith("adapt0-"):
            out.first_adapt.setdefault(job.scope, []).append(success)
    for ev in events:
        if isinstance(ev, GradientRequested) and ev.update in updates:
            mode = Counter(ev.rollouts or ("plain",)).most_common(1)[0][0]
            if ev.rollouts and len(set(ev.rollouts)) > 1:
                mode = "mixed"  # Complementary RL: guided and free halves
            out.kl.setdefault(mode, []).append(updates[ev.update].kl)
    return out


def ratio(top: Groups, bottom: Groups) -> Interval | None:
    """``mean(top) / mean(bottom)`` with its interval, None where either side is empty or
    ``bottom`` never succeeded (no ratio to give)."""
    if not top or not bottom or not any(v for g in bottom for v in g):
        return None
    return bootstrap_ratio(top, bottom)


def modes_table(runs: dict[str, list[Modes]]) -> list[str]:
    """Per method: training success by rollout mode (episodes pooled over seeds, 95% interval),
    the mean approximate KL of its updates by mode, and the first adaptation round."""
    lines = [
        "| method | rollout mode | training episodes | success | updates | mean KL of an update |",
        "|---|---|---:|---|---:|---:|",
    ]
    for name, items in runs.items():
        modes = sorted({m for it in items for m in it.success} | {m for it in items for m in it.kl})
        for mode in modes:
            groups = [it.success[mode] for it in items if it.success.get(mode)]
            kls = [k for it in items for k in it.kl.get(mode, [])]
            cell = str(bootstrap_mean(groups)) if groups else "-"
            kl = f"{statistics.mean(kls):.2g}" if kls else "-"  # GRPO's 1.5e-5 read 0.0000
            lines.append(
                f"| {name} | {mode} | {sum(map(len, groups))} | {cell} | {len(kls)} | {kl} |"
            )
    adapting = {n: its for n, its in runs.items() if any(it.first_adapt for it in its)}
    if adapting:
        lines += [
            "",
            "| method | first round (version 0): success by attempt | last / first |",
            "|---|---|---|",
        ]
        for name, items in adapting.items():
            k = min(len(a) for it in items for a in it.first_adapt.values())
            by_attempt = [
                [[float(a[i]) for a in it.first_adapt.values()] for it in items] for i in range(k)
            ]
            cells = " -> ".join(str(bootstrap_mean(g)) for g in by_attempt)
            gain = ratio(by_attempt[-1], by_attempt[0]) if k > 1 else None
            lines.append(f"| {name} | {cells} | {'-' if gain is None else gain} |")
    return lines
