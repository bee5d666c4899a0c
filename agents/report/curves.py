"""Learning curves of a run, folded from its log: train success per block of episodes, held-out
success per evaluation round, and the learner's numbers per update; and the co-evolution of its
memory: the bank's size and operations, retrievals, credit and the extractor's reward.

:func:`fold_curves` and :func:`fold_coevolution` are pure (events in, rows out);
:func:`write_curves` writes the CSV files and one PNG into the run directory; :func:`report`
does both for a finished run and returns the summary lines the CLI prints. ``coevo report``
(:mod:`agents.report.page`) and the benchmarks plot the same rows.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agents.events.episodes import (
    EpisodeAbandoned,
    EpisodeAborted,
    EpisodeAssigned,
    EpisodeFinished,
)
from agents.events.extractor import (
    CreditAssigned,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
)
from agents.events.memory import TipEvicted, TipRejected, TipsRetrieved, TipStored
from agents.events.policy import AdaptRoundFinished, EvalRoundFinished, PolicyUpdated
from agents.report.intervals import proportion_interval
from engine.events import Event
from stores.rundir import replace_file

TRAIN_CSV = "curve_train.csv"
EVAL_CSV = "curve_heldout.csv"
UPDATES_CSV = "updates.csv"
ADAPT_CSV = "adaptation.csv"
PNG = "curves.png"
CURVE_FILES = (TRAIN_CSV, EVAL_CSV, UPDATES_CSV, PNG)
"""What every learning run's directory holds once its curves are written."""


@dataclass
class Curves:
    """The rows of the three curves.

    Attributes:
        train: ``(episodes, success, score)`` per block of ``block`` training episodes
            (``episodes`` counts training episodes up to the end of the block). An aborted
            training episode (its world failed) counts as a failure with score 0, as held-out
            evaluation counts one.
        train_aborted: how many training episodes were aborted.
        heldout: ``(train_episodes, version, success, score)`` per evaluation round.
        updates: ``(version, loss, grad_norm, clip_frac, kl, samples, seconds)`` per update.
        adapt: ``(version, attempt, success, score)`` per attempt of each adaptation round
            (EMPO2's test: attempt 1 has an empty memory).
        heldout_memory: as ``heldout``, for rounds played with the bank (Complementary RL).
        heldout_episodes: episodes of the ``heldout`` round of each policy version.
    """

    block: int
    train: list[tuple[int, float, float]] = field(default_factory=list[tuple[int, float, float]])
    train_aborted: int = 0
    heldout: list[tuple[int, int, float, float]] = field(
        default_factory=list[tuple[int, int, float, float]]
    )
    updates: list[tuple[int, float, float, float, float, int, float]] = field(
        default_factory=list[tuple[int, float, float, float, float, int, float]]
    )
    adapt: list[tuple[int, int, float, float]] = field(
        default_factory=list[tuple[int, int, float, float]]
    )
    heldout_memory: list[tuple[int, int, float, float]] = field(
        default_factory=list[tuple[int, int, float, float]]
    )
    heldout_episodes: dict[int, int] = field(default_factory=dict[int, int])


def train_ended(ev: Event) -> bool:
    """Whether ``ev`` ends a training episode: finished, or aborted (its world failed)."""
    return isinstance(ev, EpisodeFinished | EpisodeAborted) and ev.purpose == "train"


def fold_curves(events: Iterable[Event], block: int = 64) -> Curves:
    """Fold a run's events into its curves (pure).

    Raises:
        ValueError: ``block`` is not positive.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    curves = Curves(block=block)
    n = 0
    wins = 0
    score = 0.0
    for ev in events:
        if train_ended(ev):
            n += 1
            if isinstance(ev, EpisodeFinished):
                wins += int(ev.success)
                score += ev.score
            else:
                curves.train_aborted += 1
            if n % block == 0:
                curves.train.append((n, wins / block, score / block))
                wins, score = 0, 0.0
        elif isinstance(ev, EvalRoundFinished) and not ev.memory:
            curves.heldout.append((ev.train_episodes, ev.policy_version, ev.success, ev.score))
            curves.heldout_episodes[ev.policy_version] = ev.episodes
        elif isinstance(ev, EvalRoundFinished):
            curves.heldout_memory.append(
                (ev.train_episodes, ev.policy_version, ev.success, ev.score)
            )
        elif isinstance(ev, AdaptRoundFinished):
            for a, (won, scored) in enumerate(zip(ev.success, ev.score, strict=True)):
                curves.adapt.append((ev.policy_version, a + 1, won, scored))
        elif isinstance(ev, PolicyUpdated):
            curves.updates.append(
                (
                    ev.policy_version,
                    ev.loss,
                    ev.grad_norm,
                    ev.clip_frac,
                    ev.kl,
                    ev.samples,
                    ev.seconds,
                )
            )
    curves.heldout.sort(key=lambda row: row[1])  # rounds may end out of order
    curves.heldout_memory.sort(key=lambda row: row[1])
    return curves


@dataclass
class Coevolution:
    """A run's memory and extractor facts; ``x`` is the training episodes ended so far.

    Attributes:
        credits: ``(x, credit)`` per credit, in order.
        bank: ``(x, entries)`` after each change of the training bank (scope "train"; EMPO2's
            adaptation rounds write memories of their own, left out).
        bank_ops: ``(x, what)`` per change or refusal in the training bank: "stored",
            "evicted:<reason>", "rejected:<reason>".
        retrievals: ``(x, entries shown, entries in the slot)`` per retrieval of a training
            episode, ``x`` the training episodes ended once its episode ended (the episode's
            place in the train curve's blocks, as ``coevo export``'s ``retrieval/count``); an
            abandoned attempt's and an episode's that never ended are left out, and so is an
            evaluation round played with the bank (it reads the training slots too).
        extractor: ``(x, mean reward of the batch, loss, samples)`` per extractor update.
        ops: operation counts of all extractor calls.
        calls: extraction and merge calls; ``malformed`` of them had no usable operation,
            ``plain`` were read as one add.
        updates: extractor updates, ``trained`` of them with a gradient (samples > 0).
    """

    credits: list[tuple[int, float]] = field(default_factory=list[tuple[int, float]])
    bank: list[tuple[int, int]] = field(default_factory=list[tuple[int, int]])
    bank_ops: list[tuple[int, str]] = field(default_factory=list[tuple[int, str]])
    retrievals: list[tuple[int, int, int]] = field(default_factory=list[tuple[int, int, int]])
    extractor: list[tuple[int, float, float, int]] = field(
        default_factory=list[tuple[int, float, float, int]]
    )
    ops: Counter[str] = field(default_factory=Counter[str])
    calls: int = 0
    malformed: int = 0
    plain: int = 0
    updates: int = 0
    trained: int = 0


def fold_coevolution(events: Iterable[Event]) -> Coevolution:
    """The memory and extractor facts of a run (pure)."""
    c = Coevolution()
    ended = 0
    size = 0
    train_slots: set[str] = set()
    rewards: dict[int, float] = {}
    evaluated: set[str] = set()  # episodes not of training: their retrievals are left out
    running: dict[str, list[tuple[int, int]]] = {}  # a running episode's retrievals
    for ev in events:
        if isinstance(ev, EpisodeAssigned) and ev.purpose != "train":
            evaluated.add(ev.episode)
        elif isinstance(ev, EpisodeFinished | EpisodeAborted) and train_ended(ev):
            ended += 1
            c.retrievals += [(ended, *r) for r in running.pop(ev.episode, ())]
        elif isinstance(ev, EpisodeAbandoned):
            running.pop(ev.episode, None)  # the attempt's retrievals are not the episode's
        elif isinstance(ev, CreditAssigned):
            c.credits.append((ended, ev.credit))
        elif isinstance(ev, TipStored | TipEvicted | TipRejected) and _in_training(ev.slot):
            if isinstance(ev, TipStored):
                size += 1
                c.bank_ops.append((ended, "stored"))
            elif isinstance(ev, TipEvicted):
                size -= 1
                c.bank_ops.append((ended, f"evicted:{ev.reason}"))
            else:
                c.bank_ops.append((ended, f"rejected:{ev.reason}"))
            if not isinstance(ev, TipRejected):
                c.bank.append((ended, size))
                train_slots.add(ev.slot)
        elif (
            isinstance(ev, TipsRetrieved) and _in_training(ev.slot) and ev.episode not in evaluated
        ):
            running.setdefault(ev.episode, []).append((len(ev.tip_ids), ev.slot_size))
        elif isinstance(ev, ExtractorCalled):
            c.calls += 1
            c.malformed += int(ev.malformed)
            c.plain += int(any(e.startswith("no operation syntax") for e in ev.errors))
            c.ops.update(op for op, _, _ in ev.ops)
        elif isinstance(ev, ExtractorGradientRequested):
            rewards[ev.update] = math.fsum(ev.rewards) / max(len(ev.rewards), 1)
        elif isinstance(ev, ExtractorUpdated):
            c.updates += 1
            c.trained += int(ev.samples > 0)
            c.extractor.append((ended, rewards.pop(ev.update, 0.0), ev.loss, ev.samples))
    return c


def _in_training(slot: str) -> bool:
    return slot.split("/", 1)[0] == "train"


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start).

    Raises:
        ValueError: ``window`` is not positive.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def write_curves(run_dir: Path, curves: Curves, title: str = "") -> list[Path]:
    """Write the CSV files and the PNG into ``run_dir``; returns their paths."""
    paths = [
        _csv(run_dir / TRAIN_CSV, ("episodes", "success", "score"), curves.train),
        _csv(run_dir / EVAL_CSV, ("train_episodes", "version", "success", "score"), curves.heldout),
        _csv(
            run_dir / UPDATES_CSV,
            ("version", "loss", "grad_norm", "clip_frac", "kl", "samples", "seconds"),
            curves.updates,
        ),
    ]
    if curves.adapt:
        header = ("version", "attempt", "success", "score")
        paths.append(_csv(run_dir / ADAPT_CSV, header, curves.adapt))
    paths.append(plot_curves(run_dir / PNG, curves, title))
    return paths


def _csv(path: Path, header: tuple[str, ...], rows: Iterable[tuple[float, ...]]) -> Path:
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(header)
    writer.writerows(rows)
    replace_file(path, text.getvalue().encode("utf-8"))
    return path


def plot_curves(path: Path, curves: Curves, title: str = "") -> Path:
    """Success vs training episodes (train blocks and held-out rounds), and the loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agents.audit.shown import safe_line
    from agents.report.plots import plain_text

    plain_text()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    if curves.train:
        xs, ys, _ = zip(*curves.train, strict=True)
        ax.plot(xs, ys, _few(xs), label=f"train (blocks of {curves.block})", alpha=0.7)
    if curves.heldout:
        xs, _, ys, _ = zip(*curves.heldout, strict=True)
        ax.plot(xs, ys, marker="o", label="held-out")
    ax.set_xlabel("training episodes")
    ax.set_ylabel("success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if curves.train or curves.heldout:
        ax.legend()
    if curves.updates:
        versions = [row[0] for row in curves.updates]
        ax2.plot(versions, [row[1] for row in curves.updates], _few(versions), label="loss")
        ax2.plot(versions, [row[4] for row in curves.updates], _few(versions), label="approx KL")
        ax2.set_xlabel("policy version")
        ax2.grid(alpha=0.3)
        ax2.legend()
    fig.suptitle(safe_line(title))
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    replace_file(path, png.getvalue())
    return path


def _few(xs: Sequence[object]) -> str:
    """The line's format: with markers when it has few points (one point of a line alone is
    not drawn at all)."""
    return "o-" if len(xs) < 4 else "-"


def summary_lines(curves: Curves) -> list[str]:
    """What the CLI prints at the end of a learning run."""
    lines = []

    def rate(success: float, n: int | None) -> str:  # one run's block or round: its interval
        if not n:  # says how little two of them can tell
            return f"{success:.1%}"
        low, high = proportion_interval(success, n)
        return f"{success:.1%} [{low:.0%}, {high:.0%}]"

    if curves.heldout:
        first, last = curves.heldout[0], curves.heldout[-1]
        sizes = [curves.heldout_episodes.get(row[1]) for row in (first, last)]
        of = [f" of {n}" if n else "" for n in sizes]
        lines.append(
            f"held-out success: {rate(first[2], sizes[0])}{of[0]} at version {first[1]} -> "
            f"{rate(last[2], sizes[1])}{of[1]} at version {last[1]} ({len(curves.heldout)} "
            "rounds" + (", 95% intervals)" if any(sizes) else ")")
        )
    if curves.train:
        lines.append(
            f"train success: first block {rate(curves.train[0][1], curves.block)}, last block "
            f"{rate(curves.train[-1][1], curves.block)} (blocks of {curves.block}, 95% intervals)"
        )
    if curves.train_aborted:
        lines.append(
            f"aborted: {curves.train_aborted} training episodes (their world failed: counted as "
            "failures in the train curve; no group trains on them)"
        )
    if curves.updates:
        secs = sum(row[6] for row in curves.updates)
        lines.append(f"updates: {len(curves.updates)}, {secs:.1f} s in the learner")
    if curves.heldout_memory:
        # a round before any training episode ended read an empty bank (entries come from
        # training episodes): a measurement without memory, not one with the bank
        filled = [row for row in curves.heldout_memory if row[0] > 0]
        first, last = (filled or curves.heldout_memory)[0], curves.heldout_memory[-1]
        empty = len(filled) < len(curves.heldout_memory)
        said = (
            f"{last[2]:.1%} at version {last[1]}"
            if first is last  # one round with a filled bank: no change to show
            else f"{first[2]:.1%} at version {first[1]} -> {last[2]:.1%} at version {last[1]}"
        )
        lines.append(
            f"held-out success with the bank: {said}"
            + (
                " (not counted: the earlier round, played before any training episode ended, "
                "with an empty bank)"
                if empty
                else ""
            )
        )
    versions = sorted({row[0] for row in curves.adapt})
    for v in versions:
        rates = " -> ".join(f"{row[2]:.1%}" for row in curves.adapt if row[0] == v)
        lines.append(f"adaptation at version {v} (memory, no update), success by attempt: {rates}")
    return lines


def block_size(train_episodes: int) -> int:
    """Training episodes per point of the train curves: 64, fewer for a short run (a tenth of
    its training episodes), so that a run shorter than 64 has a train curve too."""
    return max(1, min(64, train_episodes // 10))


_FOLDED = (EpisodeFinished, EpisodeAborted, EvalRoundFinished, AdaptRoundFinished, PolicyUpdated)


def report(run_dir: Path, events: Iterable[Event], title: str = "") -> list[str]:
    """Fold ``events`` (:func:`block_size` training episodes a point, as ``coevo report``
    draws them), write the curves into ``run_dir``, return the summary lines."""
    kept = [ev for ev in events if isinstance(ev, _FOLDED)]
    curves = fold_curves(kept, block_size(sum(map(train_ended, kept))))
    if not (curves.updates or curves.heldout):
        return []
    paths = write_curves(run_dir, curves, title)
    return [*summary_lines(curves), f"curves: {', '.join(p.name for p in paths)} in {run_dir}"]
