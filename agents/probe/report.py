"""What ``coevo probe`` writes: a markdown report, the result as JSON, a PNG plot, and one
console line per bank (:mod:`agents.probe.coevolution` computes them)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import msgspec

from agents.audit.shown import safe_line
from agents.probe.coevolution import BankResult, ProbeResult
from agents.report.intervals import Interval
from stores.rundir import replace_file

REPORT = "probe.md"
JSON = "probe.json"
PNG = "probe.png"
OPS = ("add", "update", "merge", "rewrite", "discard", "return")


def write_probe(result: ProbeResult, out: Path) -> list[Path]:
    """Write the report, JSON and plot into ``out`` (created); returns their paths.

    Raises:
        OSError: ``out`` cannot be written.
    """
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / REPORT, out / JSON, out / PNG]
    replace_file(paths[0], markdown(result).encode("utf-8"))
    replace_file(paths[1], to_json(result) + b"\n")
    plot(result, paths[2])
    return paths


def to_json(result: ProbeResult) -> bytes:
    return msgspec.json.encode(result, order="deterministic")


def line(r: BankResult) -> str:
    """One bank's console line: who wrote it, its size and the policy's success with it."""
    fams = "  ".join(f"{safe_line(f)} {i.value:.3f}" for f, i in r.by_family.items())
    if r.stats is None:
        bank = "no entries shown"
    else:
        ops = ", ".join(f"{r.stats.ops.get(k, 0)} {k}" for k in OPS[:5])
        bank = f"bank {r.stats.size:4d} entries ({ops})"
    aborted = f"  ({r.aborted} aborted as failures: {safe_line(r.abort)})" if r.aborted else ""
    cut = f"  ({_cut(r)})" if r.cut else ""
    return f"{r.label:<8} {bank}  success {_ci(r.success)}  {fams}{aborted}{cut}"


def _md(text: str) -> str:
    """A world's name in the report's Markdown: escaped as on a terminal, and its ``|`` kept
    from splitting a table's cell (a family ``a|b`` shifted every column after it)."""
    return safe_line(text).replace("|", "\\|")


def _cut(r: BankResult) -> str:
    return (
        f"{r.cut:,} of {r.turns:,} turns' prompts cut in the middle to fit the policy's "
        "positions: a long goal may be lost"
    )


def markdown(result: ProbeResult) -> str:
    """The report: what was held fixed, every bank, the comparisons and the verdict."""
    families = sorted(result.tasks)
    lines = [
        "# Co-evolution probe",
        "",
        f"**{result.verdict}**",
        "",
        f"- run: `{result.run}`"
        + (f"; frozen control (its extractor): `{result.control}`" if result.control else ""),
        f"- fixed policy: {result.policy}",
        f"- {result.episodes} held-out episodes per bank, the same tasks and seeds for every "
        f"bank (probe seed {result.seed}): "
        + ", ".join(f"{_md(f)} {n}" for f, n in sorted(result.tasks.items())),
        f"- banks rebuilt from the run's {result.extractions} logged extraction requests and "
        f"{result.merge_passes} merge passes, each answered by the bank's extractor",
        *(
            [f"- the run's scenario read with `--set {' '.join(result.overrides)}`"]
            if result.overrides
            else []
        ),
        "",
        "## Success per bank (mean over episodes, 95% Wilson interval)",
        "",
        "| bank | extractor | entries | "
        + " / ".join(OPS[:5])
        + " | malformed | shown / distinct | success | "
        + " | ".join(map(_md, families))
        + " |",
        "|---|---|---:|---|---:|---|---|" + "---|" * len(families),
    ]
    lines += [_row(r, families) for r in result.banks]
    lines += [
        f"\n{r.label}: {r.aborted} of {len(r.outcomes)} episodes aborted (their world failed; "
        f"counted as failures), the first: `{safe_line(r.abort)}`"
        for r in result.banks
        if r.aborted
    ]
    lines += [f"\n{r.label}: {_cut(r)}" for r in result.banks if r.cut]
    if result.comparisons:
        lines += [
            "",
            "## Trained versions against the frozen extractor (same episodes)",
            "",
            "| bank | reference | intervals apart | paired difference of success |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {c.bank} | {c.reference} | {'yes' if c.above else 'no'} | "
            f"{c.difference.value:+.3f} [{c.difference.low:+.3f}, {c.difference.high:+.3f}] |"
            for c in result.comparisons
        ]
    lines += ["", f"![success per bank]({PNG})", "", _HOW]
    return "\n".join(lines) + "\n"


_HOW = """## How it is measured

Every bank is rebuilt from the same episodes: the run's logged extraction requests (the
episode, its outcome and the entry its actor was shown), in log order, answered by that bank's
extractor with the logged per-request seeds, and the merge passes at the logged points,
answered by the same extractor on chunks of the rebuilt bank. One fixed policy then plays the
same held-out tasks with the same seeds once per bank, each episode shown the entry the
"diverse" retrieval picks at its start, as the method's guided episodes are, and once with no
bank. "Intervals apart" means the trained version's 95% interval lies entirely above the
reference's; co-evolution is shown when that holds for the last version against every frozen
extractor. The paired difference resamples the same episodes under both banks."""


def _row(r: BankResult, families: list[str]) -> str:
    fam = " | ".join(_ci(r.by_family[f]) if f in r.by_family else "" for f in families)
    if r.stats is None:
        return f"| {r.label} | | | | | | {_ci(r.success)} | {fam} |"
    ops = " / ".join(str(r.stats.ops.get(k, 0)) for k in OPS[:5])
    calls = sum(r.stats.calls.values())
    return (
        f"| {r.label} | {r.origin} | {r.stats.size} | {ops} | {r.stats.malformed}/{calls} | "
        f"{r.shown:.2f} / {r.distinct} | {_ci(r.success)} | {fam} |"
    )


def plot(result: ProbeResult, path: Path) -> None:
    """Success per bank, overall and per family, with the 95% intervals (PNG)."""
    from matplotlib.figure import Figure

    from agents.report.plots import legend_label, plain_text

    plain_text()
    fig = Figure(figsize=(11, 4), layout="constrained")
    overall, per_family = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})
    labels = [r.label for r in result.banks]
    colors = ("#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
    families = sorted(result.tasks)
    width = 0.8 / max(len(result.banks), 1)
    for k, r in enumerate(result.banks):
        color = colors[k % len(colors)]
        _point(overall, k, r.success, color)
        for x, f in enumerate(families):
            if f in r.by_family:
                at = x + (k - len(labels) / 2 + 0.5) * width
                _point(
                    per_family, at, r.by_family[f], color, legend_label(r.label) if x == 0 else None
                )
    overall.set_xticks(range(len(labels)), [safe_line(x) for x in labels], rotation=30)
    overall.set_ylabel("held-out success")
    overall.set_title("all families")
    per_family.set_xticks(range(len(families)), [safe_line(f) for f in families])
    per_family.set_title("per family")
    per_family.legend(fontsize=8)
    for ax in (overall, per_family):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    fig.suptitle(
        safe_line(f"probe of {Path(result.run).name}: {result.episodes} episodes per bank")
    )
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    replace_file(path, png.getvalue())


def _point(ax: Any, x: float, i: Interval, color: str, label: str | None = None) -> None:
    ax.errorbar(
        [x],
        [i.value],
        yerr=[[i.value - i.low], [i.high - i.value]],
        fmt="o",
        capsize=4,
        color=color,
        label=label,
    )


def _ci(i: Interval) -> str:
    return f"{i.value:.3f} [{i.low:.3f}, {i.high:.3f}]"
