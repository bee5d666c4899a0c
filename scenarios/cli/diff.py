"""``coevo diff RUN_A RUN_B``: two runs compared: their scenarios setting by setting (with the
defaults of the world and method both name, and the settings a stored scenario predates),
the code versions of their sessions, and their events stream by stream up to the first
divergence, shown field by field. Exit 0 when the logs do not diverge, 1 when they do."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from scenarios.cli.common import answered, naming, open_run, scenario_dict, version

if TYPE_CHECKING:
    from engine.events import Envelope, Event

__all__ = ["cmd_diff"]


def _common(toml_a: str, toml_b: str) -> tuple[str | None, str | None]:
    """The world and the method both runs name (None where they differ): whose option
    defaults the comparison fills in."""
    a, b = scenario_dict(toml_a), scenario_dict(toml_b)

    def same(table: str, key: str) -> str | None:
        x, y = (_key(d, table, key) for d in (a, b))
        return x if isinstance(x, str) and x == y else None

    return same("world", "name"), same("run", "method")


def _key(doc: dict[str, Any], table: str, key: str) -> object:
    found = doc.get(table)
    return cast("dict[str, object]", found).get(key) if isinstance(found, dict) else None


def cmd_diff(args: argparse.Namespace) -> int:
    """Exit 0 when the logs do not diverge, 1 when they do."""
    import msgspec

    from agents.analysis.diff import describe, diverging_seqs, scenario_changes
    from agents.audit.index import fetch
    from scenarios.cli.console import reporting
    from scenarios.schema import table_defaults

    log_a, log_b = open_run(args.run_a), None
    try:
        log_b = open_run(args.run_b)
        with naming(log_a.path):
            meta_a = log_a.read_meta()
        with naming(log_b.path):
            meta_b = log_b.read_meta()
        toml_a = meta_a.scenario_toml if meta_a else ""
        toml_b = meta_b.scenario_toml if meta_b else ""
        changes = scenario_changes(
            toml_a,
            toml_b,
            table_defaults(*_common(toml_a, toml_b)),
            (_before(toml_a), _before(toml_b)),
        )
        versions = {m.coevo_version for m in (meta_a, meta_b) if m is not None}
        counts = (log_a.next_seq, log_b.next_seq)
        code: tuple[list[str], list[str]] = ([], [])
        with naming(log_a.path), naming(log_b.path):
            found = diverging_seqs(
                _sessions(reporting(log_a, f"comparing {args.run_a}").read(0, counts[0]), code[0]),
                _sessions(reporting(log_b, f"comparing {args.run_b}").read(0, counts[1]), code[1]),
            )
            divergence = None
            if found is not None:
                stream, seq_a, seq_b, names_a, names_b = found
                env_a = fetch(log_a, [seq_a])[seq_a] if seq_a is not None else None
                env_b = fetch(log_b, [seq_b])[seq_b] if seq_b is not None else None
                divergence = describe(stream, env_a, env_b, (names_a, names_b))
    finally:
        log_a.close()
        if log_b is not None:
            log_b.close()
    if args.json:
        out = {
            "scenario": changes,
            "code": {"a": code[0], "b": code[1]},
            "events": counts,
            "divergence": divergence,
        }
        return answered(1 if divergence else 0, msgspec.json.encode(out).decode() + "\n")
    note = ""
    if any(c.default_a or c.default_b for c in changes) and versions - {version()}:
        note = (
            f"  (defaults are this coevo's, {version()}; a run made by coevo "
            f"{', '.join(sorted(versions - {version()}))} may have had others)"
        )
    made = ""  # what else made them, when the code differs
    if len({*code[0], *code[1]}) > 1:
        made = f"code: A {_versions_text(code[0])}; B {_versions_text(code[1])}"
    lines = _diff_lines(args.run_a, args.run_b, changes, counts, divergence, note, made)
    return answered(1 if divergence else 0, "".join(f"{line}\n" for line in lines))


def _sessions(envs: Iterable[Envelope[Event]], versions: list[str]) -> Iterator[Envelope[Event]]:
    """``envs`` as they are, the coevo version of each session (``run_started``, then each
    ``run_resumed``) appended to ``versions`` as they pass: two runs made, or resumed, by
    other code can differ for that reason alone, which the events' comparison leaves out."""
    from engine.lifecycle import RunResumed, RunStarted

    for env in envs:
        if isinstance(env.event, RunStarted | RunResumed):
            versions.append(env.event.coevo_version)
        yield env


def _versions_text(versions: list[str]) -> str:
    """A run's sessions' versions, each once in the order they ran (``0.1.0+g1a2b, then
    0.1.0+g3c4d.dirty``); one recorded before versions were is "(not recorded)"."""
    shown = [v or "(not recorded)" for v in dict.fromkeys(versions)]
    return ", then ".join(shown) if shown else "(no session)"


def _diff_lines(
    a: str,
    b: str,
    changes: Any,
    counts: tuple[int, int],
    div: Any,
    note: str = "",
    made: str = "",
) -> list[str]:
    lines = [f"A: {a} ({counts[0]} events)", f"B: {b} ({counts[1]} events)"]
    if changes:
        lines.append(f"scenario: {len(changes)} difference{'s' * (len(changes) > 1)}")
        lines += [
            f"  {c.key}: {_value(c.a, c.default_a, c.before_a)} -> "
            f"{_value(c.b, c.default_b, c.before_b)}"
            for c in changes
        ]
        lines += [note] if note else []
    else:
        lines.append("scenario: the same")
    lines += [made] if made else []
    if div is None:
        lines.append("events: the same, stream by stream (leaving out wall-clock fields)")
        return lines
    where = div.seq_a if div.seq_a is not None else div.seq_b
    lines.append(
        f"events: first divergence at seq {where}, stream {div.stream} ({', '.join(div.differing)})"
    )
    for side, env in (("A", div.a), ("B", div.b)):
        if env is None:
            lines.append(f"  {side}: (the stream has no more events)")
        else:
            lines.append(f"  {side}: {_event_line(env, div.differing)}")
    if div.a is not None and div.b is not None:  # where in each field, past what a line shows
        for key in div.differing:
            found = _first_difference(div.a["event"].get(key), div.b["event"].get(key))
            if found:
                lines.append(f"  {key}: first differs {found}")
    return lines


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    """Where two field values first differ, and how (``at [23]: A -100.31357, B -100.31359``):
    a long list or text differs past what an event's line shows."""
    import msgspec

    from agents.audit.shown import safe_line

    def shown(x: Any) -> str:  # JSON escapes control characters, not format ones (U+200B)
        text = safe_line(msgspec.json.encode(x).decode())
        return text if len(text) <= 60 else text[:59] + "…"

    if isinstance(a, list | tuple) and isinstance(b, list | tuple):  # decoded events: tuples
        xs, ys = list(cast("Sequence[Any]", a)), list(cast("Sequence[Any]", b))
        for i, (x, y) in enumerate(zip(xs, ys, strict=False)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
        if len(xs) != len(ys):
            return f"at {path or 'its end'}: A has {len(xs)} items, B {len(ys)}"
        return ""
    if isinstance(a, dict) and isinstance(b, dict):
        da, db = cast("dict[str, Any]", a), cast("dict[str, Any]", b)
        for k in [*da, *(k for k in db if k not in da)]:
            if da.get(k) != db.get(k):
                return _first_difference(da.get(k), db.get(k), f"{path}.{k}")
        return ""
    if isinstance(a, str) and isinstance(b, str) and a != b:
        pairs = enumerate(zip(a, b, strict=False))
        i = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
        lo = max(i - 20, 0)
        where = f"{path}, character {i}" if path else f"character {i}"
        return f"at {where}: A {shown(a[lo : i + 30])}, B {shown(b[lo : i + 30])}"
    if a != b:
        return f"at {path or 'the value'}: A {shown(a)}, B {shown(b)}"
    return ""


def _value(value: Any, default: bool = False, before: bool = False) -> str:
    if value is None:
        return "(missing)"
    if before:
        return f"{value!r} (recorded before the setting)"
    return f"{value!r} (default)" if default else repr(value)


def _before(toml: str) -> dict[str, Any]:
    """The settings a run's stored scenario lacks because it was recorded before they
    existed, by dotted key, with the values it ran as (``scenarios.loader.SINCE``)."""
    from engine.errors import ScenarioInvalid
    from scenarios.loader import parse_toml, since_lacking

    try:
        doc = parse_toml(toml, "scenario")
    except ScenarioInvalid:  # not TOML: scenario_changes says so
        return {}
    return {f"{table}.{key}": value for (table, key), value in since_lacking(doc).items()}


def _event_line(env: dict[str, Any], differing: tuple[str, ...]) -> str:
    """An envelope of a divergence: where it is, and the differing fields first (a world's
    text as the terminal shows it, its control characters escaped)."""
    import msgspec

    from agents.audit.shown import safe_line

    event = dict(env["event"])
    kind = event.pop("kind")
    where = f"{env['actor']} {kind}" + (f" {env['corr']}" if env["corr"] else "")
    first = [k for k in differing if k in event] + [k for k in event if k not in differing]
    body = " ".join(f"{k}={msgspec.json.encode(event[k]).decode()[:80]}" for k in first)
    line = f"seq {env['seq']} {where} (cause {env['cause']}): {body}"
    return safe_line(line if len(line) <= 300 else line[:299] + "…")
