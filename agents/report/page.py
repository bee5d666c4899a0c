"""``coevo report RUN [RUN ...]``: one self-contained HTML page about one or more runs.

Every number comes from the runs' logs, folded by :func:`agents.report.curves.fold_curves`,
:func:`agents.report.curves.fold_coevolution` and :func:`fold_entries` (the bank's entries with
what the log says of each: the call that wrote it, its parents, its retrievals, its credits).
The plots are inline SVG drawn by matplotlib, the page has no script and loads nothing, so it
opens offline and can be mailed as one file. Several runs share every plot, one colour each
(ten colours: past ten runs they repeat, and the page says so). A section a run has no data
for (a GRPO run has no bank) says so instead of drawing an empty plot.
"""

from __future__ import annotations

import html
import io
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agents.audit.shown import pasteable, safe_line
from agents.events.extractor import CreditAssigned, ExtractorCalled
from agents.events.memory import TipEvicted, TipsRetrieved, TipStored
from agents.report.curves import (
    Coevolution,
    Curves,
    block_size,
    fold_coevolution,
    fold_curves,
    train_ended,
)
from agents.report.plots import (
    COLORS,
    bank_figures,
    credit_figure,
    retrieval_figure,
    success_figure,
    updates_figure,
)
from engine.events import Envelope, Event
from engine.lifecycle import RunStarted
from stores.rundir import LOG_DIR, run_state

TOP = 8  # entries listed as most credited and as most harmful, per run
SKIPPED = frozenset({"action_requested", "action_sampled", "step_taken", "episode_started"})
"""Bulky kinds no section reads: left out while reading, so a big log fits in memory."""


@dataclass
class Entry:
    """One bank entry (or EMPO2 tip) as the log tells it.

    Attributes:
        credits: ``(episode, credit)`` of every guided episode that used it.
        fate: "" while in the bank, else the eviction's reason.
    """

    tip_id: int
    slot: str
    text: str
    call: str
    episode: str
    parents: tuple[int, ...]
    seq: int
    credits: list[tuple[str, float]] = field(default_factory=list[tuple[str, float]])
    retrieved: int = 0
    fate: str = ""

    @property
    def total(self) -> float:
        return sum(c for _, c in self.credits)


@dataclass(frozen=True)
class Call:
    """An extractor call that wrote entries: its task ("extract" or "merge"), its source (the
    episode or merge step), the extractor version that answered, and its seq."""

    task: str
    source: str
    version: int
    seq: int


@dataclass
class RunData:
    """What the report shows of one run."""

    label: str
    path: Path
    method: str
    seed: int | None
    scenario: str
    events: int
    status: str
    train_episodes: int
    curves: Curves
    coevolution: Coevolution
    entries: dict[int, Entry]
    calls: dict[str, Call]
    shown: str = ""
    """Its name in the figures, kept apart from the other runs' (set by :func:`render`)."""


def _h(text: str) -> str:
    """``text`` (a world's, a run's name) for the page: HTML-escaped, with what a reader could
    not see or no page may hold (ESC, NUL, a right-to-left override) escaped as ``coevo
    serve`` shows it (:func:`agents.audit.shown.safe_line`; line breaks and tabs kept)."""
    return html.escape(safe_line(text, "\n\t"))


def read_method(scenario_toml: str) -> str:
    """The ``run.method`` of a run's resolved scenario (its log's metadata stores it; "?" when
    it does not parse)."""
    try:
        doc = tomllib.loads(scenario_toml)
    except tomllib.TOMLDecodeError:
        return "?"
    method = doc.get("run", {}).get("method", "?")
    kind = doc.get("agent", {}).get("kind", "policy")
    return str(method) if kind == "policy" else f"{method} ({kind} agent)"


def fold_run(
    label: str, run_dir: Path, scenario_toml: str, envelopes: Iterable[Envelope[Event]]
) -> RunData:
    """Read a run's log once and fold everything the report shows (``scenario_toml``: the
    resolved scenario its log's metadata stores)."""
    events: list[Envelope[Event]] = []
    count = 0
    for env in envelopes:
        count += 1
        if env.event.__struct_config__.tag not in SKIPPED:
            events.append(env)
    plain = [env.event for env in events]
    train = sum(map(train_ended, plain))
    start = plain[0] if plain and isinstance(plain[0], RunStarted) else None
    entries, calls = fold_entries(events)
    return RunData(
        label=label,
        path=run_dir,
        method=read_method(scenario_toml),
        seed=start.seed if start else None,
        scenario=start.scenario if start else "?",
        events=count,
        status=_status(plain[-1] if plain else None, run_dir / LOG_DIR),
        train_episodes=train,
        curves=fold_curves(plain, block=block_size(train)),
        coevolution=fold_coevolution(plain),
        entries=entries,
        calls=calls,
    )


def _status(last: Event | None, log_dir: Path) -> str:
    """How the run ended, or whether it is live or was killed (:func:`run_state`)."""
    state = run_state(last, log_dir)
    if state == "live":
        return "no run_stopped yet: live (a process writes its log)"
    if state == "killed":
        return "no run_stopped yet: killed (no process writes its log; coevo resume continues it)"
    return state


def fold_entries(envelopes: Iterable[Envelope[Event]]) -> tuple[dict[int, Entry], dict[str, Call]]:
    """The training bank's entries and the calls that wrote them (pure)."""
    entries: dict[int, Entry] = {}
    calls: dict[str, Call] = {}
    for env in envelopes:
        ev = env.event
        if isinstance(ev, ExtractorCalled):
            calls[ev.call] = Call(ev.task, ev.source, ev.extractor_version, env.seq)
        elif isinstance(ev, TipStored) and ev.slot.startswith("train/"):
            entries[ev.tip_id] = Entry(
                ev.tip_id, ev.slot, ev.text, ev.call, ev.episode, ev.parents, env.seq
            )
        elif isinstance(ev, TipEvicted) and ev.tip_id in entries:
            entries[ev.tip_id].fate = ev.reason
        elif isinstance(ev, TipsRetrieved) and ev.slot.startswith("train/"):
            for tip in ev.tip_ids:
                if tip in entries:
                    entries[tip].retrieved += 1
        elif isinstance(ev, CreditAssigned) and ev.entry in entries:
            entries[ev.entry].credits.append((ev.episode, ev.credit))
    return entries, {c: calls[c] for c in {e.call for e in entries.values()} if c in calls}


PAGE_HEAD = '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>coevo report: '
"""How every page :func:`render` writes begins (``coevo report --out`` replaces only such a
file)."""


def render(runs: list[RunData]) -> str:
    """The whole page."""
    from agents.report.plots import figure_names

    for run, shown in zip(runs, figure_names([r.label for r in runs]), strict=True):
        run.shown = shown
    sections = [
        _section("runs", "Runs", [_runs_table(runs)]),
        _section("success", "Success and return vs training episodes", _success(runs)),
        _section("updates", "Policy updates", _updates(runs)),
        _section("bank", "Bank size and operations", _bank(runs)),
        _section("retrieval", "Retrieval usage", _retrieval(runs)),
        _section("credit", "Credit and the extractor's reward", _credit(runs)),
        _section("entries", "Most-credited and most-harmful entries", _entries(runs)),
    ]
    names = ", ".join(_h(r.label) for r in runs)
    toc = " · ".join(
        f'<a href="#{key}">{_h(title)}</a>'
        for key, title in (
            ("runs", "runs"),
            ("success", "success"),
            ("updates", "updates"),
            ("bank", "bank"),
            ("retrieval", "retrieval"),
            ("credit", "credit"),
            ("entries", "entries"),
        )
    )
    return (
        f"{PAGE_HEAD}{names}</title><style>{CSS}</style></head><body>"
        f"<h1>coevo report: {names}</h1><nav>{toc}</nav>{''.join(sections)}</body></html>\n"
    )


def _section(key: str, title: str, parts: list[str]) -> str:
    return f'<section id="{key}"><h2>{_h(title)}</h2>{"".join(parts)}</section>'


def _none(text: str) -> str:
    return f'<p class="none">{_h(text)}</p>'


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{_h(caption)}</figcaption></figure>"


def _runs_table(runs: list[RunData]) -> str:
    head = (
        "<tr><th>run</th><th>scenario</th><th>method</th><th>seed</th><th>events</th>"
        "<th>training episodes</th><th>policy updates</th><th>held-out success</th>"
        "<th>status</th></tr>"
    )
    rows = []
    for i, r in enumerate(runs):
        held = r.curves.heldout
        success = f"{held[0][2]:.1%} → {held[-1][2]:.1%} (v{held[-1][1]})" if held else "-"
        lost = r.curves.train_aborted
        aborted = f"<br><small>{lost:,} aborted (failures)</small>" if lost else ""
        rows.append(
            f'<tr><td><span class="swatch c{i % 10}"></span>{_h(r.label)}<br>'
            f"<small>{_h(str(r.path))}</small></td><td>{_h(r.scenario)}</td>"
            f"<td>{_h(r.method)}</td><td>{r.seed if r.seed is not None else '-'}</td>"
            f"<td>{r.events:,}</td><td>{r.train_episodes:,}{aborted}</td>"
            f"<td>{len(r.curves.updates)}</td><td>{success}</td>"
            f"<td>{_h(r.status)}</td></tr>"
        )
    shared = (
        _none(
            f"{len(runs)} runs and {len(COLORS)} colours: runs {len(COLORS) + 1} on share the "
            f"colours of the first {len(COLORS)} (a run's colour is its row's swatch); report "
            f"at most {len(COLORS)} runs at once to tell every one apart in the plots."
        )
        if len(runs) > len(COLORS)
        else ""
    )
    return f"<table>{head}{''.join(rows)}</table>{shared}"


def _missing(runs: list[RunData], has: list[bool], what: str) -> list[str]:
    """A line naming the runs without data for a section (empty when all have some)."""
    lacking = [f"{r.label} ({r.method})" for r, ok in zip(runs, has, strict=True) if not ok]
    return [_none(f"{what}: {', '.join(lacking)}.")] if lacking else []


def _plotted(
    runs: list[RunData],
    has: list[bool],
    missing: str,
    draw: Callable[[list[RunData]], str],
    caption: str,
) -> list[str]:
    """A section's figure, ``draw(runs)`` with ``caption``, drawn when any run has data
    (``has``), and a line naming the runs without (``missing``)."""
    out = _missing(runs, has, missing)
    if any(has):
        out.insert(0, _figure(draw(runs), caption))
    return out


def _blocks(runs: list[RunData]) -> str:
    """The train curves' block sizes: one number when the runs drawn share it, else each
    run's (the sizes were sorted as text, unattributed, and a run without a train curve
    counted)."""
    drawn = [r for r in runs if r.curves.train]
    sizes = {r.curves.block for r in drawn}
    if len(sizes) <= 1:
        said = str(sizes.pop()) if sizes else ""
    else:
        said = ", ".join(f"{r.curves.block} ({r.label})" for r in drawn)
    return f"Train curves: mean over blocks of {said} training episodes. " if said else ""


def _success(runs: list[RunData]) -> list[str]:
    return _plotted(
        runs,
        [bool(r.curves.train or r.curves.heldout) for r in runs],
        "No finished training episode or evaluation round in",
        success_figure,
        f"{_blocks(runs)}Held-out: each evaluation round on held-out variants (dashed: "
        "played with the bank; its point at 0 training episodes read an empty bank, entries "
        "coming from training episodes). Return is the episode's final score.",
    )


def _updates(runs: list[RunData]) -> list[str]:
    return _plotted(
        runs,
        [bool(r.curves.updates) for r in runs],
        "No policy update in",
        updates_figure,
        "Per update (means over its minibatches): loss, gradient norm before clipping, "
        "fraction of clipped ratios, approximate KL to the sampling policy.",
    )


def _bank(runs: list[RunData]) -> list[str]:
    out = _plotted(
        runs,
        [bool(r.coevolution.bank_ops) for r in runs],
        "No bank or memory (nothing stored) in",
        bank_figures,
        "Entries in the training bank, and what happened to it per block of training "
        "episodes: stored, evicted (by reason), rejected (by reason).",
    )
    for r in runs:
        ops, calls = r.coevolution.ops, r.coevolution.calls
        if ops or calls:  # calls that wrote nothing usable are said too (every one malformed)
            done = ", ".join(f"{op} {n}" for op, n in sorted(ops.items())) or "none"
            out.append(
                _none(
                    f"{r.label}: {calls} extractor calls "
                    f"({r.coevolution.malformed} malformed, {r.coevolution.plain} read as "
                    f"one add); operations: {done}."
                )
            )
    return out


def _retrieval(runs: list[RunData]) -> list[str]:
    return _plotted(
        runs,
        [bool(r.coevolution.retrievals) for r in runs],
        "No retrieval by a training episode (evaluation and adaptation rounds are left out) in",
        retrieval_figure,
        "Training retrievals per block of training episodes, entries shown per "
        "retrieval, and how often each entry was shown.",
    )


def _credit(runs: list[RunData]) -> list[str]:
    return _plotted(
        runs,
        [bool(r.coevolution.credits) for r in runs],
        "No credit (no extractor-written entry guided an episode) in",
        credit_figure,
        "Distribution of the total credit per entry; the credits' rolling mean (64) "
        "over training with each extractor update's mean batch reward (dots); "
        "the extractor's CISPO loss per update.",
    )


def _entries(runs: list[RunData]) -> list[str]:
    out = []
    for i, r in enumerate(runs):
        credited = [e for e in r.entries.values() if e.credits]
        out.append(f'<h3><span class="swatch c{i % 10}"></span>{_h(r.label)}</h3>')
        if not credited:
            out.append(_none(f"No entry of {r.label} ({r.method}) earned credit."))
            continue
        best = sorted(credited, key=lambda e: (-e.total, e.tip_id))[:TOP]
        worst = sorted(credited, key=lambda e: (e.total, e.tip_id))[:TOP]
        best = [e for e in best if e.total > 0]
        worst = [e for e in worst if e.total < 0]
        shown = {e.tip_id for e in best + worst}
        for title, chosen in (("most credited", best), ("most harmful", worst)):
            out.append(f"<h4>{title}</h4>")
            out += [_entry_card(r, i, e, shown) for e in chosen] or [_none("none")]
    return out


def _entry_card(r: RunData, i: int, e: Entry, shown: set[int]) -> str:
    anchor = f"r{i}-tip{e.tip_id}"
    plus = sum(1 for _, c in e.credits if c > 0)
    minus = sum(1 for _, c in e.credits if c < 0)
    call = r.calls.get(e.call)
    if call is not None:
        writer = (
            f"extractor call {e.call} ({call.task} of {_h(call.source)}, extractor "
            f"v{call.version}, seq {call.seq})"
        )
    else:
        writer = f"reflection on {_h(e.episode)}" if not e.call else e.call
    parents = ", ".join(
        f'<a href="#r{i}-tip{p}">#{p}</a>' if p in shown else f"#{p}" for p in e.parents
    )
    credits = ", ".join(f"{_h(ep)} {c:+.2f}" for ep, c in e.credits[:24])
    more = f" … and {len(e.credits) - 24} more" if len(e.credits) > 24 else ""
    command = f"coevo audit {pasteable(r.path)} tip {e.tip_id}"  # to paste in a shell
    return (
        f'<div class="entry" id="{anchor}"><p><a href="#{anchor}">#{e.tip_id}</a> in '
        f"{_h(e.slot)}: total credit <b>{e.total:+.2f}</b> from {len(e.credits)} "
        f"credited training episodes ({plus} positive, {minus} negative), shown {e.retrieved}× "
        "(every retrieval: evaluation and abandoned attempts too), "
        f"{'evicted (' + _h(e.fate) + ')' if e.fate else 'still in the bank'}</p>"
        f"<blockquote>{_h(e.text)}</blockquote><dl>"
        f"<dt>written by</dt><dd>{writer}, stored at seq {e.seq}</dd>"
        + (f"<dt>parents</dt><dd>{parents}</dd>" if e.parents else "")
        + f"<dt>credits</dt><dd>{credits}{more}</dd>"
        f"<dt>lineage</dt><dd><code>{_h(command)}</code></dd></dl></div>"
    )


def svg_of(fig: object, salt: str) -> str:
    """A matplotlib figure as an inline ``<svg>`` element (ids unique per ``salt``, no date)."""
    import matplotlib
    from matplotlib.figure import Figure

    assert isinstance(fig, Figure)
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    start, end = text.find(" <metadata>"), text.find("</metadata>\n")
    if 0 <= start < end:  # RDF naming the generator: namespaces only, no use in a page
        text = text[:start] + text[end + len("</metadata>\n") :]
    return text


CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1180px;
       padding: 0 20px 60px; color: #1d1d1f; }
h1 { font-size: 24px; margin: 24px 0 6px; } h2 { border-bottom: 1px solid #ddd; margin-top: 36px; }
nav a { margin-right: 4px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 5px 8px; text-align: left;
         vertical-align: top; }
small { color: #666; }
figure { margin: 12px 0; } figure svg { width: 100%; height: auto; }
figcaption { color: #555; font-size: 13px; }
p.none { color: #666; font-style: italic; }
.entry { border: 1px solid #e0e0e0; border-radius: 6px; padding: 4px 14px; margin: 10px 0; }
.entry:target { border-color: #1f77b4; box-shadow: 0 0 0 2px #cfe3f5; }
blockquote { margin: 6px 0; padding: 6px 12px; background: #f6f6f6; white-space: pre-wrap; }
dl { display: grid; grid-template-columns: 110px 1fr; gap: 2px 10px; font-size: 13px; }
dt { color: #666; } dd { margin: 0; overflow-wrap: anywhere; }
code { background: #f0f0f0; padding: 1px 4px; border-radius: 3px; }
.swatch { display: inline-block; width: 11px; height: 11px; border-radius: 2px; margin-right: 6px; }
.c0 { background: #1f77b4; } .c1 { background: #ff7f0e; } .c2 { background: #2ca02c; }
.c3 { background: #d62728; } .c4 { background: #9467bd; } .c5 { background: #8c564b; }
.c6 { background: #e377c2; } .c7 { background: #7f7f7f; } .c8 { background: #bcbd22; }
.c9 { background: #17becf; }
"""
