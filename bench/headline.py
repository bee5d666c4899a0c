"""docs/RESULTS.md's headline table in one command: GRPO, EMPO2, Complementary RL, its frozen-
extractor control and the combination, several seeds each, final figures from the last
evaluation round of every run (``eval.final_episodes`` held-out episodes by the last policy,
without memory; Complementary RL's also with its bank; EMPO2's adaptation test), as means with
95% bootstrap intervals over seeds and episodes (:mod:`agents.report.intervals`), the hard family on
its own, and the ratios the issue sets goals for.

    .venv/bin/python bench/headline.py --seeds 0 1 2 3 4 --parallel 2

Runs go to ``--runs/<method>-seed<N>`` (a finished run there is read, not rerun), the table to
``--out/headline.md`` with ``headline.json`` (the figures, where they came from, and every
seed's held-out outcomes, from which each interval can be computed again; a ratio's bound
that is unbounded, "inf" in the table, is null there) and
``headline.png``, and the learning curves to ``headline_curves.png`` (``--tag`` names them
otherwise); ``--out`` is the
``--runs`` directory unless named (``--out docs/results`` publishes). ``--methods`` picks
some of them; ``--set NAME:key=value`` changes a method's scenario (as ``coevo run --set``).

``--records DIR`` keeps what the table needs of every finished run it reads, one small JSON
file per run (``DIR/<method>-seed<N>.json``: the run's metadata and resolved scenario, its
last evaluation's outcomes, its curves and modes), and reads a run from there when its
directory under ``--runs`` is gone: a test whose runs take several machines' sessions keeps
them in the repository, not the runs. ``--keep-only`` writes the records of the runs finished
so far and stops, starting no run and making no table (a test set down before its runs is
not looked at until all have finished).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import msgspec
from headline_logs import Modes, modes_of, modes_table, ratio
from method_results import (
    RunFacts,
    check_families,
    check_families_first,
    check_seeds_first,
    directories_first,
    fold,
    once_each,
    plot,
    positive,
    provenance,
    provenance_line,
    read_run,
    refuse_reused,
    refuse_run_own,
    run_all,
    run_meta,
    tag,
    terminated,
    unfinished,
    written_by,
)

from agents.events.episodes import EpisodeAssigned, episode_success
from agents.events.policy import EvalRoundFinished
from agents.report.intervals import (
    Groups,
    Interval,
    bootstrap_mean,
    paired_mean,
)
from engine.eventlog import RunMeta
from engine.events import Event

ROOT = Path(__file__).resolve().parents[1]
METHODS = {
    "grpo": "scenarios/grpo.toml",
    "empo2": "scenarios/empo2.toml",
    "complementary": "scenarios/complementary.toml",
    "complementary-frozen": "scenarios/complementary_frozen.toml",
    "complementary-distill": "scenarios/complementary_distill.toml",
}
BASELINE = "grpo"


@dataclass
class Final:
    """One run's last evaluation: per episode of each kind, ``(family, success)``; the
    adaptation test's success per task, by attempt."""

    plain: list[tuple[str, bool]] = field(default_factory=list[tuple[str, bool]])
    bank: list[tuple[str, bool]] = field(default_factory=list[tuple[str, bool]])
    adapt: dict[str, list[bool]] = field(default_factory=dict[str, list[bool]])


def final_of(events: list[Event]) -> Final:
    """The episodes of the run's last round. The trainer creates each round's episodes with
    consecutive indices, and the last round's (without and with the bank) after every other
    evaluation episode, so they are the evaluation episodes with the highest indices, as many
    as its :class:`EvalRoundFinished` counts; its adaptation test's scopes name its number."""
    rounds = [ev for ev in events if isinstance(ev, EvalRoundFinished)]
    last = max((r.round for r in rounds), default=-1)
    size = {r.memory: r.episodes for r in rounds if r.round == last}
    # an episode assigned again (its attempt abandoned by a stop or a worker lost) is one
    # episode, its last ending its outcome: counted once, or the round's first ones fall out
    once = {
        ev.episode: (ev.index, ev.episode, ev.scope, ev.family)
        for ev in events
        if isinstance(ev, EpisodeAssigned) and ev.purpose == "eval"
    }
    assigned = sorted(once.values())
    plain = [a for a in assigned if not a[2]][-size.get(False, 0) or len(assigned) :]
    bank = [a for a in assigned if a[2] == "train"][-size.get(True, 0) or len(assigned) :]
    adapt = [a for a in assigned if a[2].startswith(f"adapt{last}-")]
    success = episode_success(events)  # an aborted episode is a failure
    out = Final()
    out.plain = [(fam, success[ep]) for _, ep, _, fam in plain if ep in success and False in size]
    out.bank = [(fam, success[ep]) for _, ep, _, fam in bank if ep in success and True in size]
    for _, ep, scope, _ in adapt:  # attempts in index order
        if ep in success:
            out.adapt.setdefault(scope, []).append(success[ep])
    return out


class Record(msgspec.Struct, kw_only=True):
    """What the table needs of one finished run (``--records``): read from its log once, or
    from the record when the run is no longer on this machine."""

    name: str
    seed: int
    meta: RunMeta | None
    versions: list[str] = msgspec.field(default_factory=list[str])  # that wrote it, resumes too
    final: Final
    modes: Modes
    facts: RunFacts
    digest: str = ""  # sha256 of the record without it: an edit of its outcomes is seen


def record_of(name: str, seed: int, run: Path, records: Path | None) -> Record | None:
    """The record of the finished run ``run`` (written under ``records`` when given); read
    from ``records`` when ``run`` holds no finished run; None when neither has it."""
    kept = None if records is None else records / f"{name}-seed{seed}.json"
    got = read_run(run)
    if got is None:
        if kept is None or not kept.exists() or run.exists():  # an unfinished run is no record
            return None
        return read_record(kept)
    meta = run_meta(run)
    if kept is not None:
        _same_run(run, meta, kept)
    events, wall = got
    record = Record(
        name=name,
        seed=seed,
        meta=meta,
        versions=written_by(meta, events),
        final=final_of(events),
        modes=modes_of(events),
        facts=fold(name, seed, events, wall),
    )
    record.digest = _digest(record)
    if kept is not None:  # whole or not at all: a stop mid-write leaves the old one
        kept.parent.mkdir(parents=True, exist_ok=True)
        part = kept.with_name(f".{kept.name}.part")
        part.write_bytes(msgspec.json.encode(record) + b"\n")
        os.replace(part, kept)
    return record


def _recorded_as_asked(
    name: str, seed: int, run: Path, records: Path, sets: list[str]
) -> Record | None:
    """The record of ``name``'s seed ``seed`` when its run under ``run`` is gone (None when
    there is none, or the run is there), checked to be of the method's scenario with ``sets``
    (:func:`refuse_reused` on the scenario it records)."""
    record = record_of(name, seed, run, records)
    if record is not None:
        where = records / f"{name}-seed{seed}.json"
        recorded = record.meta.scenario_toml if record.meta is not None else ""
        refuse_reused(where, ROOT / METHODS[name], sets, METHODS[name], "--records", recorded)
    return record


def _same_run(run: Path, meta: RunMeta | None, kept: Path) -> bool:
    """Whether ``kept`` is the record of the finished run ``run`` (False: there is none yet);
    stop (one line) when it is another run's (another test's, in a shared directory), or no
    record at all."""
    if not kept.exists() and not kept.is_symlink():
        return False
    there = read_record(kept).meta
    if meta is None or there is None or there.run_id != meta.run_id:
        raise SystemExit(
            f"{kept} holds the record of another run than {run}'s (run id "
            f"{there.run_id if there else '?'}, not {meta.run_id if meta else '?'}): name "
            "another --records (one per test), or remove it if that run is not wanted"
        )
    return True


def _digest(record: Record) -> str:
    import hashlib

    unsigned = msgspec.structs.replace(record, digest="")
    return hashlib.sha256(msgspec.json.encode(unsigned)).hexdigest()


def read_record(kept: Path) -> Record:
    """The record ``kept`` (``--records``), whose scenario is the one its hash was made of:
    a record without it, or edited, was counted as a run of any settings asked.

    Raises:
        SystemExit: one line, naming the file.
    """
    from scenarios.loader import scenario_hash

    try:
        record = msgspec.json.decode(kept.read_bytes(), type=Record)
    except (msgspec.MsgspecError, OSError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else exc
        raise SystemExit(f"{kept}: not a record of a run ({why})") from None
    meta = record.meta
    if meta is None or not meta.scenario_toml:
        raise SystemExit(f"{kept}: not a record of a run (it holds no run metadata or scenario)")
    if scenario_hash(meta.scenario_toml) != meta.scenario_hash:
        raise SystemExit(
            f"{kept}: its scenario is not the one its run recorded (the hash differs: edited?)"
        )
    if record.digest != _digest(record):
        raise SystemExit(f"{kept}: it is not as it was written (its digest differs: edited?)")
    if kept.name != f"{record.name}-seed{record.seed}.json":
        raise SystemExit(
            f"{kept}: it is the record of {record.name}-seed{record.seed} (renamed or copied?)"
        )
    return record


def groups(finals: list[Final], what: str, families: tuple[str, ...] = ()) -> Groups:
    """Per seed, the 0/1 successes of ``what`` ("plain" or "bank"), of ``families`` only when
    given; seeds without any are left out."""
    out = []
    for f in finals:
        rows = getattr(f, what)
        values = [float(ok) for fam, ok in rows if not families or fam in families]
        if values:
            out.append(values)
    return out


def attempt(finals: list[Final], k: int) -> Groups:
    """Per seed, the 0/1 success of attempt ``k`` of every adaptation task."""
    return [[float(a[k]) for a in f.adapt.values() if len(a) > k] for f in finals if f.adapt]


def paired(finals: list[Final]) -> Groups:
    """Per seed, the bank round's success minus the round without memory, task by task: the
    two rounds play the same tasks in the same order (the trainer's ``_start_round``); a
    seed whose two rounds do not line up family by family is left out."""
    out = []
    for f in finals:
        same = len(f.bank) == len(f.plain) and all(
            a[0] == b[0] for a, b in zip(f.bank, f.plain, strict=False)
        )
        if f.bank and same:
            out.append([float(b[1]) - float(a[1]) for a, b in zip(f.plain, f.bank, strict=True)])
    return out


def _cell(groups_: Groups) -> Interval | None:
    return bootstrap_mean(groups_) if groups_ else None


def summarize(finals: dict[str, list[Final]], hard: tuple[str, ...]) -> dict:
    """Every figure of the table, as intervals (None where a method has no such measure)."""
    base = finals.get(BASELINE, [])
    out: dict = {}
    for name, runs in finals.items():
        row = {
            "seeds": len(runs),
            "plain": _cell(groups(runs, "plain")),
            "hard": _cell(groups(runs, "plain", hard)),
            "bank": _cell(groups(runs, "bank")),
            "bank_hard": _cell(groups(runs, "bank", hard)),
            "attempts": [_cell(attempt(runs, k)) for k in range(_attempts(runs))],
        }
        if diffs := paired(runs):
            row["bank_minus_plain"] = paired_mean(diffs)
            row["paired_seeds"] = len(diffs)  # a seed whose rounds do not line up is left out
        if name != BASELINE and base:
            row["plain_vs_grpo"] = ratio(groups(runs, "plain"), groups(base, "plain"))
            row["hard_vs_grpo"] = ratio(groups(runs, "plain", hard), groups(base, "plain", hard))
            row["bank_vs_grpo"] = ratio(groups(runs, "bank"), groups(base, "plain"))
        if row["attempts"]:
            row["adapt_last_vs_first"] = ratio(
                attempt(runs, -1 % _attempts(runs)), attempt(runs, 0)
            )
        out[name] = row
    return out


def _paired_of(row: dict) -> str:
    """Where the pairing left seeds out (their two rounds did not play the same tasks in
    order), how many it used."""
    used, seeds = row.get("paired_seeds", row["seeds"]), row["seeds"]
    return "" if used == seeds else f" ({used} of the {seeds} seeds: the others' rounds differ)"


def _attempts(runs: list[Final]) -> int:
    return min((len(a) for f in runs for a in f.adapt.values()), default=0)


def _fmt(x: Interval | None) -> str:
    return "-" if x is None else str(x)


def table(summary: dict, hard: tuple[str, ...]) -> list[str]:
    hard_name = "+".join(hard)
    lines = [
        f"| method | seeds | held-out, no memory | {hard_name}, no memory | with its memory "
        f"| {hard_name}, with its bank | vs GRPO, no memory | vs GRPO, {hard_name} "
        "| vs GRPO, with memory |",
        "|---|---:|---|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        memory = row["bank"] or (row["attempts"][-1] if row["attempts"] else None)
        lines.append(
            f"| {name} | {row['seeds']} | {_fmt(row['plain'])} | {_fmt(row['hard'])} | "
            f"{_fmt(memory)} | {_fmt(row['bank_hard'])} | {_fmt(row.get('plain_vs_grpo'))} | "
            f"{_fmt(row.get('hard_vs_grpo'))} | {_fmt(row.get('bank_vs_grpo'))} |"
        )
    if shown := {n: r["bank_minus_plain"] for n, r in summary.items() if "bank_minus_plain" in r}:
        lines += [
            "",
            "With its bank minus without, paired over the same held-out tasks (seeds, then "
            "tasks, resampled): "
            + "; ".join(
                f"{name} {cell.value:+.3f} [{cell.low:+.3f}, {cell.high:+.3f}]"
                + _paired_of(summary[name])
                for name, cell in shown.items()
            )
            + ".",
        ]
    if few := [name for name, row in summary.items() if row["seeds"] < 3]:
        lines += [
            "",
            f"{', '.join(few)}: fewer than 3 seeds; the intervals resample their episodes, and "
            "say little of how another seed would do.",
        ]
    adapt = {n: r for n, r in summary.items() if r["attempts"]}
    if adapt:
        lines += [
            "",
            "| method | adaptation attempt | success | last / first |",
            "|---|---:|---|---|",
        ]
        for name, row in adapt.items():
            for k, cell in enumerate(row["attempts"]):
                ratio = _fmt(row["adapt_last_vs_first"]) if k == len(row["attempts"]) - 1 else ""
                lines.append(f"| {name} | {k + 1} | {_fmt(cell)} | {ratio} |")
    return lines


def bars(summary: dict, path: Path) -> Path:
    """Held-out success without and with memory per method, with the intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(names)), 4))
    for k, (key, label) in enumerate((("plain", "no memory"), ("memory", "with its memory"))):
        xs, ys, errs = [], [], [[], []]
        for i, name in enumerate(names):
            row = summary[name]
            cell = (
                row["plain"]
                if key == "plain"
                else row["bank"] or (row["attempts"][-1] if row["attempts"] else None)
            )
            if cell is None:
                continue
            xs.append(i + (k - 0.5) * 0.38)
            ys.append(cell.value)
            errs[0].append(cell.value - cell.low)
            errs[1].append(cell.high - cell.value)
        ax.bar(xs, ys, width=0.36, yerr=errs, capsize=3, label=label)
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_ylabel("held-out success (95% interval)")
    ax.set_ylim(0, 1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def probe_runs(runs: Path, seeds: list[int], episodes: int) -> list[dict]:
    """``coevo probe`` of every seed's Complementary RL run against its frozen control's
    (``probe.json`` under ``<run>/probe-<episodes>``; reused when there: a probe of another
    number of episodes was reused as this one's)."""
    import signal

    before = signal.signal(signal.SIGTERM, terminated)
    try:
        return _probes(runs, seeds, episodes)
    except KeyboardInterrupt:  # subprocess.run killed its probe: no orphan, no traceback
        raise SystemExit("coevo: stopped while probing: its probe was stopped") from None
    finally:
        signal.signal(signal.SIGTERM, before)


def _probes(runs: Path, seeds: list[int], episodes: int) -> list[dict]:
    coevo = str(Path(sys.executable).with_name("coevo"))
    out = []
    for seed in seeds:
        run = runs / f"complementary-seed{seed}"
        control = runs / f"complementary-frozen-seed{seed}"
        report = run / f"probe-{episodes}" / "probe.json"
        if not report.exists():
            print(f"probe {run.name}", flush=True)
            cmd = [coevo, "probe", str(run), "--control", str(control), "--json"]
            cmd += ["--episodes", str(episodes), "--out", str(report.parent)]
            done = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
            if done.returncode != 0:  # (its own line said why, on stderr)
                raise SystemExit(f"coevo probe of {run} failed with exit {done.returncode}")
        out.append(json.loads(report.read_text()))
    return out


def probe_summary(reports: list[dict]) -> tuple[list[str], dict]:
    """The probes pooled over seeds: each bank's success, and the last version against
    version 0 on the same episodes (paired): both with seeds, then episodes, resampled (the
    paired interval once resampled every seed's pairs as one pool)."""
    labels: dict[str, list[list[float]]] = {}
    for report in reports:
        for bank in report["banks"]:
            labels.setdefault(_role(bank, report), []).append(bank["outcomes"])
    diffs = []  # per seed, the pairs' differences
    for report in reports:
        by = {_role(b, report): b["outcomes"] for b in report["banks"]}
        if "last" in by and "v0" in by:  # (a run whose extractor never updated has no last)
            diffs.append([a - b for a, b in zip(by["last"], by["v0"], strict=True)])
    cells = {role: bootstrap_mean(groups) for role, groups in labels.items()}
    if not diffs:
        lines = [
            f"coevo probe of {len(reports)} seeds: no run's extractor was updated (every bank "
            "is version 0's): co-evolution not measured"
        ]
        return lines, {"cells": cells, "last_minus_v0": None, "shown": False}
    paired = paired_mean(diffs)
    shown = cells["last"].above(cells["v0"]) and (
        "control" not in cells or cells["last"].above(cells["control"])
    )
    lines = [
        f"coevo probe of {len(reports)} seeds ({reports[0]['episodes']} held-out episodes per "
        "bank and seed, the run's final policy):",
        "",
        "| bank | success |",
        "|---|---|",
        *[f"| {role} | {cell} |" for role, cell in cells.items()],
        "",
        f"last version - version 0, paired over the same episodes: {paired}; co-evolution "
        f"{'shown' if shown else 'not shown'} (the last version's interval "
        f"{'lies' if shown else 'does not lie'} above every frozen extractor's).",
    ]
    return lines, {"cells": cells, "last_minus_v0": paired, "shown": shown}


def _role(bank: dict, report: dict) -> str:
    """A bank's role across seeds: "no bank", "v0", "control", "last" (the run's newest
    version) or "mid"."""
    label = bank["label"]
    if label in ("no bank", "v0", "control"):
        return label
    versions = [b["version"] for b in report["banks"] if b["version"] is not None]
    return "last" if bank["version"] == max(versions) else "mid"


def _jsonable(value: object) -> object:
    """``value`` as JSON holds it: an interval as its figures, and a number JSON cannot write
    as null (a ratio's bound is infinite where a resample of its bottom side had no success;
    ``json`` wrote ``Infinity``, which strict readers refuse and others read as a number)."""
    if isinstance(value, Interval):
        value = {"value": value.value, "low": value.low, "high": value.high, "n": value.episodes}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def keep_only(
    runs: Path, records: Path, methods: list[str], seeds: list[int], extra: dict[str, list[str]]
) -> str:
    """``--keep-only``: write the records of the runs under ``runs`` finished so far (each
    checked to be of its method's scenario with ``extra``), and say how many are kept,
    without a word of their outcomes."""
    kept = waiting = 0
    for seed in seeds:
        for name in methods:
            out = runs / f"{name}-seed{seed}"
            sets = [f"seed={seed}", *extra.get(name, [])]
            if (done := _kept_before(out, records / f"{name}-seed{seed}.json")) is not None:
                recorded = done.meta.scenario_toml if done.meta is not None else ""
                refuse_reused(out, ROOT / METHODS[name], sets, METHODS[name], "--runs", recorded)
                kept += 1  # (its log not read again at each call: minutes at 120 runs)
                continue
            if read_run(out) is None:
                if out.exists() or _recorded_as_asked(name, seed, out, records, sets) is None:
                    waiting += 1  # (only its record here: read and checked, not merely found)
                continue
            refuse_reused(out, ROOT / METHODS[name], sets, METHODS[name], "--runs")
            if not _same_run(out, run_meta(out), records / f"{name}-seed{seed}.json"):
                record_of(name, seed, out, records)
            kept += 1
    total = len(seeds) * len(methods)
    return f"kept {kept} records under {records}; {total - waiting} of {total} runs finished"


def _kept_before(run: Path, kept: Path) -> Record | None:
    """The record ``kept`` when it is the record of the run in ``run`` (the same run id: a
    record is written of a finished run only), found without reading the run's events; None
    otherwise, left to the checks that read them."""
    if not (run / "log").exists() or not kept.exists():
        return None
    try:
        record = read_record(kept)
    except SystemExit:  # what is wrong with it is said where the run is read
        return None
    meta = run_meta(run)
    same = meta is not None and record.meta is not None and record.meta.run_id == meta.run_id
    return record if same else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--methods", nargs="+", action="extend", choices=list(METHODS))
    parser.add_argument("--seeds", type=int, nargs="+", action="extend")
    parser.add_argument("--parallel", type=positive, default=2, help="runs at once")
    parser.add_argument("--hard", nargs="+", default=["circuit"], help="families called hard")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "headline")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the table, JSON and PNGs go (default: --runs; docs/results only when named)",
    )
    parser.add_argument("--set", action="append", default=[], help="METHOD:key.path=value")
    parser.add_argument("--tag", type=tag, default="headline", help="the file names under --out")
    parser.add_argument(
        "--records",
        type=Path,
        default=None,
        help="keep a record of every finished run read here, and read a run from its record "
        "when its directory under --runs is gone",
    )
    parser.add_argument(
        "--keep-only",
        action="store_true",
        help="write the records of the runs finished so far and stop: start no run, make no "
        "table (needs --records)",
    )
    parser.add_argument(
        "--probe",
        type=int,
        default=300,
        help="held-out episodes per bank of the coevo probe of each Complementary RL seed "
        "against its frozen control (0: no probe)",
    )
    args = parser.parse_args()
    args.seeds = [0, 1, 2, 3, 4] if args.seeds is None else args.seeds  # (a second flag adds)
    args.methods = list(METHODS) if args.methods is None else args.methods
    seeds = once_each("--seeds", args.seeds)
    args.methods = once_each("--methods", args.methods, "one row per method")
    out_dir = args.out if args.out is not None else args.runs
    extra: dict[str, list[str]] = {}
    for item in args.set:
        name, _, assignment = item.partition(":")
        if not assignment or name not in args.methods:  # it was dropped without a word
            raise SystemExit(
                f"--set {item}: METHOD:key.path=value, METHOD one of --methods "
                f"({', '.join(args.methods)})"
            )
        refuse_run_own(item, assignment)
        extra.setdefault(name, []).append(assignment)
    if args.keep_only and args.records is None:
        raise SystemExit("--keep-only writes records: name --records DIR")
    directories_first(("--runs", args.runs), ("--out", out_dir), ("--records", args.records))
    scenarios = [(ROOT / METHODS[n], extra.get(n, [])) for n in args.methods]
    check_families_first(args.hard, scenarios)
    check_seeds_first(scenarios, seeds)
    if args.keep_only:
        raise SystemExit(keep_only(args.runs, args.records, args.methods, seeds, extra))
    jobs, reused = [], {}
    for seed in args.seeds:  # seed by seed: every method's first seeds finish first
        for name in args.methods:
            out = args.runs / f"{name}-seed{seed}"
            sets = [f"seed={seed}", *extra.get(name, [])]
            if read_run(out) is not None:
                refuse_reused(out, ROOT / METHODS[name], sets, METHODS[name], "--runs")
                if args.records is not None:  # another run's record: said now, not after runs
                    _same_run(out, run_meta(out), args.records / f"{name}-seed{seed}.json")
            elif (
                args.records is not None
                and (kept := _recorded_as_asked(name, seed, out, args.records, sets)) is not None
            ):
                reused[name, seed] = kept
            else:
                if out.exists():
                    raise SystemExit(unfinished(out))
                jobs.append((ROOT / METHODS[name], out, seed, extra.get(name, [])))
    both = {"complementary", "complementary-frozen"} <= set(args.methods)
    probed = (
        {n for n, _ in reused if n.startswith("complementary")} if args.probe and both else set()
    )
    if probed:  # its runs are gone: probed after every run had trained, a traceback
        raise SystemExit(
            "coevo: error: --probe plays each Complementary RL seed's run against its frozen "
            f"control, and {' and '.join(sorted(probed))} seeds are records here, their runs "
            "gone: --probe 0"
        )
    args.runs.mkdir(parents=True, exist_ok=True)
    run_all(jobs, args.parallel)
    finals: dict[str, list[Final]] = {}
    modes: dict[str, list[Modes]] = {}
    facts = {}
    read, recorded, versions = [], [], set()
    for name in args.methods:
        for seed in args.seeds:
            run = args.runs / f"{name}-seed{seed}"
            got = reused.get((name, seed)) or record_of(name, seed, run, args.records)
            assert got is not None
            finals.setdefault(name, []).append(got.final)
            modes.setdefault(name, []).append(got.modes)
            facts.setdefault(name, []).append(got.facts)
            versions.update(got.versions)  # (the code of a resume too)
            if (name, seed) in reused:
                recorded.append(got.meta)
            else:
                read.append(run)
    hard = tuple(args.hard)
    check_families(hard, facts)
    summary = summarize(finals, hard)
    made = provenance({name: seeds for name in args.methods}, read, recorded, sorted(versions))
    lines = [provenance_line(made), "", *table(summary, hard)]
    png = bars(summary, out_dir / f"{args.tag}.png")
    curves = plot(facts, hard, out_dir / f"{args.tag}_curves.png")
    lines += ["", f"![]({png.name})", "", f"![]({curves.name})", "", *modes_table(modes)]
    if args.probe and both:
        probe_lines, summary["probe"] = probe_summary(probe_runs(args.runs, args.seeds, args.probe))
        lines += ["", *probe_lines]
    outcomes = {
        name: [
            {"seed": seed, "plain": f.plain, "bank": f.bank, "adapt": f.adapt}
            for seed, f in zip(seeds, runs, strict=True)
        ]
        for name, runs in finals.items()
    }
    doc = json.dumps({"provenance": made, **_jsonable(summary)}, indent=1, allow_nan=False)
    every = json.dumps(outcomes, separators=(",", ":"))  # one line: thousands of pairs
    (out_dir / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    (out_dir / f"{args.tag}.json").write_text(f'{doc[:-2]},\n "outcomes": {every}\n}}\n')
    print("\n".join(lines))


if __name__ == "__main__":
    main()
