"""The plots of ``coevo report`` (:mod:`agents.report.page`): one matplotlib figure per section,
every run in its own colour, returned as inline SVG.

Figures are built with :class:`matplotlib.figure.Figure` directly (no pyplot, no global state),
so rendering is safe in any thread and leaves nothing open.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from matplotlib.ticker import MaxNLocator

from agents.report.curves import rolling_mean

if TYPE_CHECKING:
    from agents.report.page import RunData

COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
OP_COLORS = {"stored": "#2ca02c", "evicted": "#d62728", "rejected": "#7f7f7f"}


def plain_text() -> None:
    """Draw every text as written: matplotlib reads a pair of ``$`` as math, so a run or a
    family named ``m$\\frac{$x`` stopped ``coevo report`` and ``coevo probe`` with a
    traceback, and ``p$x^2$q`` lost its dollars. (Texts take the setting when created.)"""
    import matplotlib

    matplotlib.rcParams["text.parse_math"] = False


def legend_label(name: str) -> str:
    """``name`` as a legend entry or a panel's title: what a reader could not see escaped as
    on the page (:func:`agents.audit.shown.safe_line`: an ESC reached the SVG raw), a leading
    space for one that starts with ``_``, which matplotlib leaves out of a legend, and a name
    longer than :data:`LABEL_CHARS` cut in its middle (its start and its end, the seed, kept):
    a run directory of 150 characters squeezed the panels to nothing (matplotlib warned that
    its layout could not be applied). The page's table gives each run's whole name."""
    from agents.audit.shown import safe_line

    name = safe_line(name)
    if len(name) > LABEL_CHARS:
        half = (LABEL_CHARS - 1) // 2
        name = f"{name[:half]}…{name[-half:]}"
    return f" {name}" if name.startswith("_") else name


LABEL_CHARS = 49
"""The longest run name a figure shows whole (:func:`legend_label`)."""


def _alike(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` begin with alike."""
    return next(
        (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def shown_name(run: RunData) -> str:
    """``run``'s name in the figures: the page's (:func:`figure_names`), else its own cut."""
    return run.shown or legend_label(run.label)


def figure_names(names: Sequence[str]) -> list[str]:
    """Each of ``names`` as the figures show it (:func:`legend_label`), kept apart: where
    cutting made two names one (``...-lr0.001-...-seed3`` and ``...-lr0.003-...-seed3``
    both read ``grpo-minilab-embedded-ti…up8-unlock-circuit-seed3``), such a name shows its
    start, the part where it first differs from the others, and its end; any still alike
    are numbered as the page's table lists them."""
    from agents.audit.shown import safe_line

    cut = [legend_label(n) for n in names]
    whole = [safe_line(n) for n in names]
    shown = list(cut)
    for i, name in enumerate(whole):
        twins = [w for j, w in enumerate(whole) if cut[j] == cut[i] and w != name]
        if not twins:
            continue
        d = max(_alike(name, t) for t in twins)  # where it first differs from one of them
        if d + 12 >= len(name) - 12:  # near its end: the start, then the rest from there
            shown[i] = f"{name[:10]}…{name[max(10, d - 8) :]}"
        else:
            start = name[: d + 12] if d + 12 <= 30 else f"{name[:10]}…{name[d - 8 : d + 12]}"
            shown[i] = f"{start}…{name[-12:]}"
    return [f"{i + 1}. {s}" if shown.count(s) > 1 else s for i, s in enumerate(shown)]


def _figure(rows: int, cols: int, height: float = 3.3) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    plain_text()
    fig = Figure(figsize=(11.5, height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _finish(fig: Any, axes: Sequence[Any], name: str) -> str:
    from agents.report.page import svg_of

    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return svg_of(fig, name)


def _empty(ax: Any, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", color="#888", transform=ax.transAxes)


def _lines(
    ax: Any,
    runs: Sequence[RunData],
    rows_of: Callable[[RunData], Sequence[tuple[float, float]]],
    **style: Any,
) -> bool:
    """One line per run from its ``(x, y)`` rows; False when no run has any. A run of one
    row is drawn as a marker (one point of a line alone is not drawn at all: a run of one
    update showed four empty panels)."""
    drawn = False
    for i, r in enumerate(runs):
        rows = rows_of(r)
        if rows:
            xs, ys = zip(*rows, strict=True)
            alone = {"marker": "o"} if len(rows) == 1 and style.get("marker") is None else {}
            ax.plot(xs, ys, color=COLORS[i % 10], label=shown_name(r), **{**style, **alone})
            drawn = True
    return drawn


def success_figure(runs: Sequence[RunData]) -> str:
    """Train and held-out success and return vs training episodes."""
    fig, axes = _figure(2, 2)
    panels = (
        ("train success", lambda r: [(x, s) for x, s, _ in r.curves.train], 1),
        ("train return (final score)", lambda r: [(x, v) for x, _, v in r.curves.train], 2),
        ("held-out success", lambda r: [(x, s) for x, _, s, _ in r.curves.heldout], 1),
        ("held-out return (final score)", lambda r: [(x, v) for x, _, _, v in r.curves.heldout], 2),
    )
    for ax, (title, rows_of, col) in zip(axes, panels, strict=True):
        heldout = title.startswith("held-out")
        if not _lines(ax, runs, rows_of, marker="o" if heldout else None, markersize=4):
            _empty(ax)
        if heldout:
            for i, r in enumerate(runs):
                rows = [(row[0], row[col + 1]) for row in r.curves.heldout_memory]
                if rows:
                    xs, ys = zip(*rows, strict=True)
                    ax.plot(
                        xs, ys, color=COLORS[i % 10], ls="--", marker="s", markersize=3,
                        label=f"{shown_name(r)}, with bank",
                    )  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel("training episodes")
        ax.set_ylim(-0.03, 1.03)
    return _finish(fig, axes, "success")


def updates_figure(runs: Sequence[RunData]) -> str:
    """Loss, gradient norm, clip fraction and approximate KL per policy update."""
    fig, axes = _figure(2, 2, height=3.0)
    panels = (("loss", 1), ("gradient norm (before clipping)", 2), ("clip fraction", 3))
    for ax, (title, col) in zip(axes, (*panels, ("approx. KL", 4)), strict=True):
        _lines(ax, runs, lambda r, c=col: [(u[0], u[c]) for u in r.curves.updates], lw=1.2)
        ax.set_title(title)
        ax.set_xlabel("policy version")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _finish(fig, axes, "updates")


def bank_figures(runs: Sequence[RunData]) -> str:
    """Bank size over training for every run, then one operations panel per run with a bank."""
    with_bank = [(i, r) for i, r in enumerate(runs) if r.coevolution.bank_ops]
    panels = 1 + len(with_bank)
    cols = min(3, panels)
    fig, axes = _figure((panels + cols - 1) // cols, cols, height=3.2)
    size = axes[0]
    if not _lines(size, runs, lambda r: r.coevolution.bank, drawstyle="steps-post"):
        _empty(size, "no entry stored in a training bank")  # (every proposal refused, say)
    size.set_title("entries in the training bank")
    size.set_xlabel("training episodes")
    for ax, (i, r) in zip(axes[1:], with_bank, strict=False):
        _ops_panel(ax, r, COLORS[i % 10])
    for ax in axes[panels:]:
        ax.set_visible(False)
    return _finish(fig, axes[:panels], "bank")


def _ops_panel(ax: Any, r: RunData, color: str) -> None:
    """Stacked bars: the bank's operations per block of training episodes."""
    block = max(r.curves.block, 1)
    kinds = sorted({what for _, what in r.coevolution.bank_ops})
    counts: dict[str, Counter[int]] = {k: Counter() for k in kinds}
    for x, what in r.coevolution.bank_ops:
        counts[what][x // block] += 1
    blocks = range(max(x for x, _ in r.coevolution.bank_ops) // block + 1)
    bottom = [0] * len(blocks)
    shades = {"stored": 0, "evicted": 0, "rejected": 0}
    for kind in kinds:
        family = kind.split(":")[0]
        alpha = 1.0 - 0.25 * shades[family]
        shades[family] += 1
        heights = [counts[kind][b] for b in blocks]
        ax.bar(
            [b * block for b in blocks],
            heights,
            width=block * 0.9,
            align="edge",
            bottom=bottom,
            color=OP_COLORS[family],
            alpha=max(alpha, 0.3),
            label=kind,
        )
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_title(f"{shown_name(r)}: operations per {block} episodes", color=color, fontsize=10)
    ax.set_xlabel("training episodes")


def retrieval_figure(runs: Sequence[RunData]) -> str:
    """Retrievals per block, entries shown per retrieval, and how often each entry was shown."""
    fig, axes = _figure(1, 3, height=3.4)
    per_block, shown, dist = axes
    for i, r in enumerate(runs):
        # each retrieval in the block of its episode's end, drawn at the block's end as the
        # train curve's blocks are; the last block, not yet whole, left out as there
        block = max(r.curves.block, 1)
        whole = r.train_episodes // block
        n: Counter[int] = Counter()
        tips: Counter[int] = Counter()
        for x, k, _ in r.coevolution.retrievals:
            n[(x - 1) // block] += 1
            tips[(x - 1) // block] += k
        keys = [k for k in sorted(n) if k < whole]
        if not keys:
            continue
        color = COLORS[i % 10]
        every = range(whole)  # blocks without a retrieval count 0
        per_block.plot(
            [(k + 1) * block for k in every],
            [n[k] for k in every],
            color=color,
            label=shown_name(r),
        )
        shown.plot([(k + 1) * block for k in keys], [tips[k] / n[k] for k in keys], color=color)
        counts = sorted((e.retrieved for e in r.entries.values()), reverse=True)
        if counts:
            dist.plot(range(1, len(counts) + 1), counts, color=color, drawstyle="steps-post")
    per_block.set_title("retrievals per block of training episodes")
    shown.set_title("entries shown per retrieval (mean)")
    dist.set_title("times each entry was shown (ranked)")
    dist.set_xlabel("entries, most shown first")
    for ax in (per_block, shown):
        ax.set_xlabel("training episodes")
    return _finish(fig, axes, "retrieval")


def credit_figure(runs: Sequence[RunData]) -> str:
    """Credit per entry (histogram), credit over training, and the extractor's loss."""
    fig, axes = _figure(1, 3, height=3.4)
    hist, over, loss = axes
    totals = {i: [e.total for e in r.entries.values() if e.credits] for i, r in enumerate(runs)}
    values = [v for vs in totals.values() for v in vs]
    if values:
        lo, hi = min(values), max(values)
        if hi - lo <= abs(lo) * 1e-12:  # one value (or all within rounding): numpy's 10 bins
            pad = max(0.5, abs(lo) * 1e-6)  # over lo +/- 0.5 do not exist past ~5e14
            lo, hi = lo - pad, hi + pad
        bins = [lo + (hi - lo) * k / 20 for k in range(21)]
        for i, vs in totals.items():
            if vs:
                hist.hist(
                    vs,
                    bins=bins,
                    color=COLORS[i % 10],
                    alpha=0.55,
                    label=shown_name(runs[i]),
                )
    hist.set_title("total credit per entry")
    hist.set_xlabel("sum of credits")
    hist.set_ylabel("entries")
    for i, r in enumerate(runs):
        c = r.coevolution
        color = COLORS[i % 10]
        if c.credits:
            xs = [x for x, _ in c.credits]
            over.plot(
                xs,
                rolling_mean([v for _, v in c.credits], 64),
                color=color,
                label=shown_name(r),
            )
        if c.extractor:
            xs = [row[0] for row in c.extractor]
            over.plot(xs, [row[1] for row in c.extractor], "o", color=color, markersize=4)
            loss.plot(range(1, len(xs) + 1), [row[2] for row in c.extractor], color=color)
            loss.plot(range(1, len(xs) + 1), [row[2] for row in c.extractor], ".", color=color)
    over.set_title("credit (rolling mean of 64) and batch reward")
    over.set_xlabel("training episodes")
    over.set_ylim(-1.05, 1.05)
    loss.set_title("extractor loss per update")
    loss.set_xlabel("extractor version")
    loss.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _finish(fig, axes, "credit")
