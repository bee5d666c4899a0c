"""Methods against the GRPO baseline, measured from run logs: held-out success without memory
(overall and per family, the hard families called out), the adaptation test (held-out tasks
played several times in a row with memory and no weight update), learning curves as a PNG.

    .venv/bin/python bench/method_results.py --method empo2=scenarios/empo2.toml \\
        --baseline grpo=scenarios/grpo.toml --seeds 0 1 2 --parallel 3

Runs go to ``--runs/<name>-seed<N>``; a run directory that already holds a finished run is
read, not rerun (so the baseline's runs from ``bench/grpo_results.py`` can be reused with
``--reuse grpo=runs/bench/20261130-123247``). Runs of one call are started ``--parallel`` at a
time as separate ``coevo run`` processes. The markdown table and the PNG go to ``--out``.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from extractor_report import Coevolution, coevolution_table, fold_coevolution, plot_coevolution

from agents.events.episodes import EpisodeAssigned, episode_success
from agents.events.extractor import ExtractorCalled
from agents.events.policy import AdaptRoundFinished, EvalRoundFinished, EvalRoundStarted
from engine.eventlog import RunMeta
from engine.events import Envelope, Event
from engine.lifecycle import RunResumed, RunStopped
from stores.lmdb_env import writer_alive
from stores.lmdb_log import LmdbEventLog

ROOT = Path(__file__).resolve().parents[1]
_T = TypeVar("_T", int, str)
HARD = ("circuit", "paint")


@dataclass
class RunFacts:
    """What one run measured, folded from its log."""

    name: str
    seed: int
    rounds: list[tuple[int, int, float]] = field(default_factory=list)  # (episodes, v, success)
    memory_rounds: list[tuple[int, int, float]] = field(default_factory=list)  # with the bank
    # round -> family -> (successes, episodes)
    by_family: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    adapt: list[AdaptRoundFinished] = field(default_factory=list)
    wall: float = 0.0

    def family_success(
        self, round_: int, families: tuple[str, ...] | None = None
    ) -> tuple[int, int]:
        """Successes and episodes of a held-out round, of ``families`` (None: every one)."""
        wins = n = 0
        for fam, (w, k) in self.by_family.get(round_, {}).items():
            if families is None or fam in families:
                wins, n = wins + w, n + k
        return wins, n


def fold(name: str, seed: int, events: list[Event], wall: float) -> RunFacts:
    """The facts of one run (pure)."""
    facts = RunFacts(name, seed, wall=wall)
    round_of: dict[str, int] = {}
    family_of: dict[str, str] = {}
    current = -1
    for ev in events:
        if isinstance(ev, EvalRoundStarted):
            current = ev.round
        elif isinstance(ev, EpisodeAssigned) and ev.purpose == "eval" and not ev.scope:
            round_of[ev.episode] = current
            family_of[ev.episode] = ev.family
        elif isinstance(ev, EvalRoundFinished) and ev.memory:
            facts.memory_rounds.append((ev.train_episodes, ev.policy_version, ev.success))
        elif isinstance(ev, EvalRoundFinished):
            facts.rounds.append((ev.train_episodes, ev.policy_version, ev.success))
        elif isinstance(ev, AdaptRoundFinished):
            facts.adapt.append(ev)
    for episode, success in episode_success(events).items():  # an aborted one: a failure
        if episode in round_of:
            fams = facts.by_family.setdefault(round_of[episode], {})
            row = fams.setdefault(family_of[episode], [0, 0])
            row[0] += int(success)
            row[1] += 1
    facts.rounds.sort(key=lambda row: row[1])  # rounds may end out of order
    facts.memory_rounds.sort(key=lambda row: row[1])
    return facts


def read_run(path: Path) -> tuple[list[Event], float] | None:
    """A finished run's events and the wall seconds its sessions ran (:func:`running_seconds`),
    or None when there is no finished run."""
    if not (path / "log").exists():
        return None
    log = LmdbEventLog.open(path / "log", writable=False)
    try:
        envs = list(log.read(0, None))
    finally:
        log.close()
    last = envs[-1].event if envs else None
    if not isinstance(last, RunStopped) or last.reason != "completed":
        return None  # (one stopped by a signal ends with run_stopped too: not finished)
    return [e.event for e in envs], running_seconds(envs)


def run_meta(run: Path) -> RunMeta | None:
    """The metadata of the run whose directory is ``run`` (its log's; None when it has
    none), without reading its events."""
    log = LmdbEventLog.open(run / "log", writable=False)
    try:
        return log.read_meta()
    finally:
        log.close()


def written_by(meta: RunMeta | None, events: Sequence[Event]) -> list[str]:
    """The coevo versions that wrote a run: the one that made it (``meta``'s; "unknown" for a
    log without metadata) and each that resumed it (its :class:`RunResumed` events)."""
    made = meta.coevo_version if meta is not None else "unknown"
    return sorted({made, *(e.coevo_version for e in events if isinstance(e, RunResumed))} - {""})


def running_seconds(envs: Sequence[Envelope[Event]]) -> float:
    """Wall seconds from each session's first event to its last, summed: a resumed run's time
    stopped between its sessions is not time it ran."""
    if not envs:
        return 0.0
    total, start, last = 0, envs[0].t, envs[0].t
    for env in envs[1:]:
        if isinstance(env.event, RunResumed):
            total += last - start
            start = env.t
        last = env.t
    return (total + last - start) / 1e9


def terminated(signum: int, frame: object) -> None:
    """A SIGTERM handler that stops as Ctrl-C does (a scheduler's stop, kill's): the script's
    children are stopped, not left running as orphans."""
    raise KeyboardInterrupt


def run_all(jobs: Sequence[tuple[Any, ...]], parallel: int) -> None:
    """Run ``(scenario, out, seed[, sets])`` jobs, ``parallel`` at a time, each a ``coevo run``
    (``sets``: ``key.path=value`` overrides)."""
    import signal

    coevo = str(Path(sys.executable).with_name("coevo"))
    pending = list(jobs)
    running: list[tuple[subprocess.Popen[bytes], Path]] = []
    stopped = False
    held = [_hold(parent) for parent in sorted({Path(job[1]).parent for job in jobs})]
    before = signal.signal(signal.SIGTERM, terminated)
    try:
        while pending or running:
            while pending and len(running) < parallel:
                scenario, out, seed, *more = pending.pop(0)
                print(f"start {out.name}", flush=True)
                sets = [f"seed={seed}", *(more[0] if more else [])]
                cmd = [coevo, "run", str(scenario), "--out", str(out), "--quiet"]
                cmd += [arg for s in sets for arg in ("--set", s)]
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
                running.append((proc, out))
            time.sleep(2)
            for proc, out in list(running):
                if proc.poll() is not None:
                    running.remove((proc, out))
                    print(f"done {out.name}: exit {proc.returncode}", flush=True)
                    if proc.returncode != 0:
                        raise SystemExit(f"{out} failed with exit {proc.returncode}")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: said in one line below, no traceback
        stopped = True
    finally:  # a failed job, a stop: the other runs stop too (each resumable), none orphaned
        signal.signal(signal.SIGTERM, before)
        for proc, _ in running:
            proc.terminate()
        for proc, out in running:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            print(f"stopped {out.name} (coevo resume {out} continues it)", flush=True)
        for lock in held:  # once no run of this script writes there
            lock.close()
    if stopped:
        raise SystemExit(
            "coevo: stopped: the runs it had started were stopped (resume each, or remove it to "
            "start it again); the same command then goes on with the rest"
        )


def _hold(runs: Path) -> Any:
    """The lock of the directory ``runs`` for this script's runs in it (``.running.lock``,
    held until its file is closed); stop (one line) when another process holds it: two
    scripts started the same run in the ~20 s before its log exists, and one failed late."""
    import fcntl

    runs.mkdir(parents=True, exist_ok=True)
    lock = (runs / ".running.lock").open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise SystemExit(
            f"coevo: error: another process runs runs in {runs} (it holds {runs}/.running.lock): "
            "wait for it, or name another directory"
        ) from None
    return lock


def positive(text: str) -> int:
    """An argparse type: a whole number >= 1 (``--parallel 0`` waited forever)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def tag(text: str) -> str:
    """An argparse type: the name of a table's files, letters, digits, ``.``, ``_`` and ``-``
    (``--tag 'my tag'`` wrote ``![](my tag.png)``, no Markdown image)."""
    import argparse

    if not re.fullmatch(r"[A-Za-z0-9._-]+", text) or text.startswith("."):
        raise argparse.ArgumentTypeError(
            f"{text!r}: letters, digits, '.', '_' and '-' only (it names files and images)"
        )
    return text


def once_each(flag: str, seeds: Sequence[_T], each: str = "one run per seed") -> list[_T]:
    """``seeds`` (or methods) when none is given twice; else stop (one line): a seed given
    twice was counted twice, and two runs went into one directory."""
    if twice := sorted({s for s in seeds if list(seeds).count(s) > 1}):
        raise SystemExit(f"coevo: error: {flag}: {twice} given more than once ({each})")
    return list(seeds)


def directories_first(*given: tuple[str, Path | None]) -> None:
    """Stop (one line) before anything runs when a ``(flag, path)`` given names no directory
    this script could make or write in: a file, a path under a file, a dangling symbolic link
    (each a traceback, some after every run had trained)."""
    for flag, where in given:
        if where is None:
            continue
        if where.is_symlink() and not where.exists():
            raise SystemExit(f"coevo: error: {flag} {where}: a symbolic link to nothing")
        there = where
        while not there.exists() and there != there.parent:
            there = there.parent
        if not there.is_dir():
            what = "not a directory" if there == where else f"under {there}, not a directory"
            raise SystemExit(f"coevo: error: {flag} {where}: {what}")


def check_seeds_first(scenarios: Sequence[tuple[Path, list[str]]], seeds: Sequence[int]) -> None:
    """Stop (one line) before anything runs when a seed is one no run takes (a seed of -1
    was refused when its turn came, after the seeds before it had trained)."""
    from engine.errors import CoevoError
    from scenarios.loader import load_scenario

    for scenario, sets in scenarios:
        for seed in sorted({min(seeds), max(seeds)}) if seeds else ():
            try:
                load_scenario(scenario, [*sets, f"seed={seed}"])
            except CoevoError as exc:
                raise SystemExit(f"coevo: error: --seeds {seed}: {exc}") from None


RUN_OWN = ("seed", "run.method")
"""Settings a ``--set`` of these scripts may not give: each run's seed is ``--seeds``' and its
method the row's (``--set grpo:seed=5`` made every seed the same run, counted as several)."""


def refuse_run_own(item: str, assignment: str) -> None:
    """Stop (one line) when ``assignment`` (``key.path=value``, from the ``--set`` ``item``)
    sets one of :data:`RUN_OWN`."""
    from engine.errors import CoevoError
    from scenarios.loader import override_key

    try:
        key = override_key(assignment)
    except CoevoError:  # malformed: the scenario's load names it
        return
    if inside := [own for own in RUN_OWN if own.startswith(key + ".")]:  # run={...}
        raise SystemExit(
            f"coevo: error: --set {item}: a --set of the whole [{key}] table may set "
            f"{inside[0]}, each run's own: set its other keys one by one"
        )
    if key in RUN_OWN:
        raise SystemExit(
            f"coevo: error: --set {item}: {key} is each run's own (the seed is --seeds', the "
            "method the scenario's the row names): a --set of it made every seed one run"
        )


def check_families(hard: Sequence[str], facts: dict[str, list[RunFacts]]) -> None:
    """Stop (one line) when a ``--hard`` family is in no run's held-out rounds: a misspelt
    family filled the table with "-" and drew a success of 0 for it."""
    seen = {fam for runs in facts.values() for f in runs for r in f.by_family.values() for fam in r}
    if missing := [fam for fam in hard if fam not in seen]:
        raise SystemExit(
            f"coevo: error: --hard {' '.join(missing)}: no held-out episode of the runs is of "
            f"that family (they have: {', '.join(sorted(seen)) or 'none'})"
        )


def check_families_first(hard: Sequence[str], scenarios: Sequence[tuple[Path, list[str]]]) -> None:
    """Stop (one line) before anything runs when every scenario (with its ``--set`` values)
    lists its world's families and a ``--hard`` family is in none of them (a typo was refused
    only once every run had trained); a scenario that takes all its world offers is checked
    after the runs (:func:`check_families`)."""
    from engine.errors import CoevoError
    from scenarios.loader import load_scenario

    listed: set[str] = set()
    for scenario, sets in scenarios:
        try:
            families = load_scenario(scenario, sets).world.families
        except CoevoError as exc:  # a --set the scenario refuses: its line, as a run's
            raise SystemExit(f"coevo: error: {exc}") from None
        if not families:
            return
        listed.update(families)
    if missing := [fam for fam in hard if fam not in listed]:
        raise SystemExit(
            f"coevo: error: --hard {' '.join(missing)}: no scenario plays that family (they "
            f"list: {', '.join(sorted(listed))})"
        )


def provenance(
    seeds: dict[str, list[int]],
    runs: Sequence[Path],
    recorded: Sequence[RunMeta | None] = (),
    versions: Sequence[str] = (),
) -> dict[str, Any]:
    """Where a table came from: the code's commit (and whether the work tree differed), the
    time (UTC), the command, each method's seeds, when the ``runs`` it read were created
    (reused runs may be older than the code that reads them) and the coevo versions that made
    them ("+g<commit>", ".dirty" for a work tree with changes), with ``recorded``, the
    metadata of the runs read from their records rather than their logs, and ``versions``,
    others that wrote them (a resume's)."""
    import datetime

    def utc(ns: float) -> str:
        return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).strftime("%Y-%m-%d %H:%M")

    metas = [*recorded, *(run_meta(run) for run in runs)]
    created = [m.created_ns for m in metas if m is not None and m.created_ns]
    made_by = {m.coevo_version if m is not None else "unknown" for m in metas}
    made_by.update(versions)  # the resumes' (a run resumed by other code than made it)

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),  # pastes as given
        "seeds": seeds,
        "runs_created": f"{utc(min(created))} to {utc(max(created))} UTC" if created else "unknown",
        "runs_made_by": sorted(made_by),
    }


def provenance_line(facts: dict[str, Any]) -> str:
    """:func:`provenance` as the first line of a table's markdown."""
    seeds = "; ".join(f"{k} {v}" for k, v in facts["seeds"].items())
    fence = "``" if "`" in facts["command"] else "`"  # a backtick in it ends a one-tick span
    made_by = facts.get("runs_made_by") or ["unknown"]
    return (
        f"Table made {facts['date']} by commit {facts['commit']} from runs created "
        f"{facts['runs_created']} by coevo {', '.join(made_by)}, seeds: {seeds}; {fence} "
        f"{facts['command']} {fence}"
    )


def outcomes(f: RunFacts, round_: int) -> list[float]:
    """One run's held-out episodes of a round as 1.0 (success) and 0.0, for
    :func:`agents.report.intervals.bootstrap_mean`."""
    wins, n = f.family_success(round_)
    return [1.0] * wins + [0.0] * (n - wins)


def reused_differs(
    out: Path, scenario: Path, sets: list[str], recorded: str | None = None
) -> list[str]:
    """The settings (dotted keys) in which the finished run at ``out`` differs from
    ``scenario`` with ``sets``, which the table would count it as: a run of another scenario
    or other ``--set`` values was averaged in without a word. A key the run's own scenario
    lacks (a setting added to coevo since) is no difference, unless the run's method reads
    it and it changed what runs do (``scenarios.loader.SINCE``: the run did as its value
    there says). ``recorded``: the run's resolved scenario when it is read from a record
    (its log is not here); by default the one its log stores."""
    import tomllib

    from agents.analysis.diff import scenario_changes
    from engine.errors import CoevoError
    from scenarios.loader import load_scenario, resolved_toml, since_lacking

    if recorded is None:
        meta = run_meta(out)
        recorded = meta.scenario_toml if meta is not None else ""
    try:
        wanted = resolved_toml(load_scenario(scenario, sets))
    except CoevoError as exc:  # a --set the scenario refuses: its line, as a new run's
        raise SystemExit(f"coevo: error: {exc}") from None
    changes = scenario_changes(recorded, wanted)
    differing = [c.key for c in changes if c.a is not None]
    was, now = tomllib.loads(recorded or ""), tomllib.loads(wanted)
    method = was.get("run", {}).get("method")
    for (table, key), then in since_lacking(was).items():  # of the method it trained with
        if table == method and now.get(table, {}).get(key) != then:
            differing.append(f"{table}.{key}")
    return differing


def unfinished(out: Path, resume: bool = True) -> str:
    """The refusal of the directory ``out`` of a run :func:`read_run` finds unfinished: a run
    still being written (wait for it), one to resume (``resume``) or remove, or a directory
    that holds no run's log."""
    if not (out / "log").exists():
        return f"{out} holds no run (no log): remove it"
    if writer_alive(out / "log"):  # another process trains it now: removing it loses it
        return f"{out} holds a run still being written (a process writes its log): wait for it"
    return f"{out} holds an unfinished run: {'resume or ' if resume else ''}remove it"


def refuse_reused(
    out: Path, scenario: Path, sets: list[str], label: str, flag: str, recorded: str | None = None
) -> None:
    """Stop (one line) when the finished run at ``out`` was made with other settings than
    ``scenario`` (named ``label``) with ``sets`` (:func:`reused_differs`, ``recorded`` as
    there); ``flag`` names the option that chose its directory."""
    if differing := reused_differs(out, scenario, sets, recorded):
        more = f" and {len(differing) - 4} more" if len(differing) > 4 else ""
        raise SystemExit(
            f"{out} holds a finished run of another scenario than {label} with "
            f"{' '.join(sets)} ({', '.join(differing[:4])}{more} differ): remove it, or "
            f"name another {flag}"
        )


FINAL_EVAL = """name = "final-eval"
seed = {seed}
description = "held-out evaluation of a finished run's last policy, without memory"

[world]
name = "minilab"
families = {families}
split = "heldout"

[agent]
kind = "policy"

[run]
episodes = {episodes}
workers = 16
method = "rollout"

[policy]
model = "{model}"
threads = 1
batch_max = 16

[logging]
progress = false
"""


def final_eval(run: Path, families: tuple[str, ...], episodes: int) -> tuple[int, int]:
    """Successes and episodes of the run's last policy on ``episodes`` held-out episodes of
    ``families``, no memory (a ``rollout`` run of its last checkpoint; reused when present)."""
    out = run / f"final-eval-{'-'.join(families)}-{episodes}"
    if read_run(out) is None:
        model = max((run / "checkpoints").glob("v*"))
        scenario = run / f"{out.name}.toml"
        fams = "[" + ", ".join(f'"{f}"' for f in families) + "]"
        scenario.write_text(
            FINAL_EVAL.format(seed=7, families=fams, episodes=episodes, model=model.resolve())
        )
        run_all([(scenario, out, 7)], 1)
    got = read_run(out)
    assert got is not None
    done = episode_success(got[0])  # an aborted episode is a failure
    return sum(done.values()), len(done)


def final_table(
    facts: dict[str, list[RunFacts]], finals: dict[tuple[str, int], tuple[int, int]]
) -> list[str]:
    lines = ["| method | per seed | pooled |", "|---|---|---:|"]
    for name, runs in facts.items():
        cells = ", ".join(f"seed {f.seed}: {rate(*finals[name, f.seed])}" for f in runs)
        w = sum(finals[name, f.seed][0] for f in runs)
        n = sum(finals[name, f.seed][1] for f in runs)
        lines.append(f"| {name} | {cells} | {rate(w, n)} |")
    return lines


def rate(wins: int, n: int) -> str:
    return f"{wins / n:.3f} ({wins}/{n})" if n else "-"


def table(facts: dict[str, list[RunFacts]], families: tuple[str, ...]) -> list[str]:
    """Held-out success without memory at the first and last round, overall and on the hard
    families, per run, then pooled per method."""
    lines = [
        "| method | seed | held-out v0 | held-out final | hard families v0 | hard families final "
        "| wall |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, runs in facts.items():
        pooled = [0, 0, 0, 0]
        for f in runs:
            first, last = f.rounds[0], f.rounds[-1]
            h0 = f.family_success(0, families)
            h1 = f.family_success(len(f.rounds) - 1, families)
            pooled = [pooled[0] + h0[0], pooled[1] + h0[1], pooled[2] + h1[0], pooled[3] + h1[1]]
            lines.append(
                f"| {name} | {f.seed} | {first[2]:.3f} | {last[2]:.3f} (v{last[1]}) | "
                f"{rate(*h0)} | {rate(*h1)} | {f.wall:.0f} s |"
            )
        first = _pooled([outcomes(f, 0) for f in runs])
        last = _pooled([outcomes(f, len(f.rounds) - 1) for f in runs])
        lines.append(
            f"| **{name}** | all seeds | {first} | {last} | {rate(pooled[0], pooled[1])} | "
            f"{rate(pooled[2], pooled[3])} | |"
        )
        if all(f.memory_rounds for f in runs):
            # a round before any training episode ended read an empty bank: no bank measured
            empty = any(f.memory_rounds[0][0] == 0 for f in runs)
            m0 = (
                "- (empty bank)"
                if empty
                else f"{statistics.mean(f.memory_rounds[0][2] for f in runs):.3f}"
            )
            m1 = statistics.mean(f.memory_rounds[-1][2] for f in runs)
            lines.append(f"| **{name}, with its bank** | mean of seeds | {m0} | {m1:.3f} | | | |")
    lines += [
        "",
        "All seeds: the mean of every held-out episode of the round, its 95% bootstrap "
        "interval (seeds, then episodes, resampled; where every episode failed, or every one "
        "succeeded, the Wilson interval of them pooled) and the episodes counted.",
    ]
    return lines


def _pooled(groups: list[list[float]]) -> str:
    """Held-out episodes of several seeds as a table cell: mean [95% interval] (episodes)."""
    from agents.report.intervals import bootstrap_mean

    if not all(groups):
        return "-"
    return f"{bootstrap_mean(groups)} ({sum(map(len, groups))} ep.)"


def adapt_table(facts: dict[str, list[RunFacts]]) -> list[str]:
    """Success by attempt in each adaptation round, per run, and pooled (none: no run had
    an adaptation test)."""
    if not any(f.adapt for runs in facts.values() for f in runs):
        return []
    lines = ["| method | seed | version | tasks | success by attempt (1 = empty memory) |"]
    lines.append("|---|---:|---:|---:|---|")
    for name, runs in facts.items():
        pooled: dict[str, list[float]] = {}
        for f in runs:
            for a in f.adapt:
                by = " -> ".join(f"{s:.3f}" for s in a.success)
                lines.append(f"| {name} | {f.seed} | v{a.policy_version} | {a.tasks} | {by} |")
                key = "first" if a.policy_version == 0 else "last"
                pooled.setdefault(key, [0.0] * a.attempts)
                pooled[key] = [p + s * a.tasks for p, s in zip(pooled[key], a.success, strict=True)]
        for key, wins in pooled.items():
            n = sum(
                a.tasks
                for f in runs
                for a in f.adapt
                if (a.policy_version == 0) == (key == "first")
            )
            by = " -> ".join(f"{w / n:.3f}" for w in wins)
            lines.append(f"| **{name}** | pooled | {key} round | {n} | {by} |")
    return lines


def plot(facts: dict[str, list[RunFacts]], families: tuple[str, ...], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    palette = [f"tab:{c}" for c in ("blue", "orange", "green", "red", "purple", "brown")]
    if len(facts) > len(palette):
        raise ValueError(f"at most {len(palette)} methods per plot, got {len(facts)}")
    for (name, runs), color in zip(facts.items(), palette, strict=False):
        for f in runs:
            xs = [r[0] for r in f.rounds]
            axes[0].plot(xs, [r[2] for r in f.rounds], color=color, alpha=0.35, marker=".")
            hard = [f.family_success(i, families) for i in range(len(f.rounds))]
            axes[1].plot(
                xs, [w / n if n else math.nan for w, n in hard], color=color, alpha=0.35, marker="."
            )
        # the mean over seeds at the training episodes every seed evaluated at (seeds of
        # other lengths or schedules: an index into the first seed's rounds ran past another's)
        at = [{r[0]: i for i, r in enumerate(f.rounds)} for f in runs]
        xs = sorted(set.intersection(*(set(a) for a in at)))
        means = [
            statistics.mean(f.rounds[a[x]][2] for f, a in zip(runs, at, strict=True)) for x in xs
        ]
        axes[0].plot(xs, means, color=color, linewidth=2.5, label=f"{name} (mean of {len(runs)})")
        if all(f.memory_rounds for f in runs):
            bank_at = [{r[0]: r[2] for r in f.memory_rounds} for f in runs]
            bank_xs = sorted(set.intersection(*(set(b) for b in bank_at)))
            bank = [statistics.mean(b[x] for b in bank_at) for x in bank_xs]
            axes[0].plot(
                bank_xs,
                bank,
                color=color,
                linewidth=1.8,
                linestyle="--",
                label=f"{name}, with its bank",
            )
        pooled = []
        for x in xs:
            counts = [f.family_success(a[x], families) for f, a in zip(runs, at, strict=True)]
            w, n = sum(c[0] for c in counts), sum(c[1] for c in counts)
            pooled.append(w / n if n else math.nan)  # no point where no such episode was played
        axes[1].plot(xs, pooled, color=color, linewidth=2.5, label=f"{name} (pooled)")
    axes[0].set_title("held-out success without memory (dashed: with the bank)")
    axes[1].set_title(f"held-out success, {'+'.join(families)}")
    for ax in axes:
        ax.set_xlabel("training episodes")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--method", action="append", default=[], help="NAME=SCENARIO")
    parser.add_argument("--baseline", default="grpo=scenarios/grpo.toml", help="NAME=SCENARIO")
    parser.add_argument("--reuse", action="append", default=[], help="NAME=DIR of NAME-seedN runs")
    parser.add_argument("--seeds", type=int, nargs="+", action="extend", default=None)
    parser.add_argument(
        "--seeds-of", action="append", default=[], help="NAME=0,1: other seeds for one method"
    )
    parser.add_argument("--parallel", type=positive, default=1, help="runs at once")
    parser.add_argument("--hard", nargs="+", default=["circuit"], help="families called hard")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "methods")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the table and PNGs go (default: --runs; docs/results only when named)",
    )
    parser.add_argument(
        "--tag", type=tag, default="methods", help="file names of the table and PNG"
    )
    parser.add_argument(
        "--final-eval",
        type=int,
        default=0,
        help="held-out episodes of the hard families "
        "played by each run's last policy without memory (0: skip)",
    )
    args = parser.parse_args()
    args.seeds = [0, 1, 2] if args.seeds is None else args.seeds  # (a second --seeds adds)
    given = [("--baseline", args.baseline), *(("--method", m) for m in args.method)]
    for flag, item in [*given, *(("--reuse", r) for r in args.reuse)]:
        if "=" not in item:
            what = "NAME=DIR" if flag == "--reuse" else "NAME=SCENARIO"
            raise SystemExit(f"coevo: error: {flag} {item!r}: expected {what}")
    names = [item.split("=", 1)[0] for item in [args.baseline, *args.method]]
    once_each("--baseline and --method", names, "one scenario per name")  # the last one won
    specs = dict(item.split("=", 1) for item in [args.baseline, *args.method])
    reused = dict(r.split("=", 1) for r in args.reuse)
    for name in reused.keys() - specs.keys():  # its runs were never read: every seed trained
        raise SystemExit(
            f"coevo: error: --reuse {name}={reused[name]}: {name!r} is no --method or "
            f"--baseline ({', '.join(specs)})"
        )
    where = {name: args.runs for name in specs} | reused
    seeds = {name: once_each("--seeds", args.seeds) for name in specs}
    for item in args.seeds_of:
        name, _, listed = item.partition("=")
        if name not in specs:
            raise SystemExit(
                f"coevo: error: --seeds-of {item!r}: {name!r} is no --method or --baseline "
                f"({', '.join(specs)})"
            )
        if not re.fullmatch(r"[0-9]+(,[0-9]+)*", listed):  # int() read "٣" as 3, "1_0" as 10
            raise SystemExit(
                f"coevo: error: --seeds-of {item!r}: expected NAME=SEED,SEED,... (whole numbers)"
            )
        seeds[name] = once_each(f"--seeds-of {name}", [int(x) for x in listed.split(",")])
    out_dir = args.out if args.out is not None else args.runs
    directories_first(("--runs", args.runs), ("--out", out_dir))
    check_families_first(args.hard, [(Path(scenario), []) for scenario in specs.values()])
    for name, scenario in specs.items():
        check_seeds_first([(Path(scenario), [])], seeds[name])
    jobs = []
    for name, scenario in specs.items():
        for seed in seeds[name]:
            out = Path(where[name]) / f"{name}-seed{seed}"
            if read_run(out) is None:
                if out.exists():
                    raise SystemExit(unfinished(out, resume=False))
                jobs.append((Path(scenario), out, seed))
            else:
                flag = "--reuse" if name in reused else "--runs"
                refuse_reused(out, Path(scenario), [f"seed={seed}"], scenario, flag)
    args.runs.mkdir(parents=True, exist_ok=True)
    run_all(jobs, args.parallel)
    facts: dict[str, list[RunFacts]] = {}
    coevolution: dict[str, list[tuple[int, Coevolution]]] = {}
    versions: set[str] = set()  # that wrote the runs, resumes too (provenance's line)
    read = [Path(where[name]) / f"{name}-seed{seed}" for name in specs for seed in seeds[name]]
    for name in specs:
        for seed in seeds[name]:
            run = Path(where[name]) / f"{name}-seed{seed}"
            got = read_run(run)
            assert got is not None
            versions.update(written_by(run_meta(run), got[0]))
            facts.setdefault(name, []).append(fold(name, seed, *got))
            if any(isinstance(ev, ExtractorCalled) for ev in got[0]):
                coevolution.setdefault(name, []).append((seed, fold_coevolution(got[0])))
    hard = tuple(args.hard)
    check_families(hard, facts)
    png = plot(facts, hard, out_dir / f"{args.tag}.png")
    adapt = adapt_table(facts)
    made = provenance(seeds, read, versions=sorted(versions))
    lines = [provenance_line(made), "", *table(facts, hard), ""]
    lines += [*adapt, "", f"![]({png.name})"] if adapt else [f"![]({png.name})"]
    if args.final_eval:
        finals = {
            (name, seed): final_eval(
                Path(where[name]) / f"{name}-seed{seed}", hard, args.final_eval
            )
            for name in specs
            for seed in seeds[name]
        }
        lines += [
            "",
            f"Last policy, {args.final_eval} held-out episodes of {'+'.join(hard)} "
            "each, no memory:",
            "",
            *final_table(facts, finals),
        ]
    if coevolution:
        extractor_png = plot_coevolution(coevolution, out_dir / f"{args.tag}_extractor.png")
        lines += ["", *coevolution_table(coevolution), "", f"![]({extractor_png.name})"]
    (out_dir / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
