"""Reading scenario files: bytes -> TOML -> overrides -> typed :class:`Scenario`.

Every way a file can be wrong ends in :class:`ScenarioInvalid` with the file name and, where
there is one, the key path; nothing here lets a traceback reach the user.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import re
import stat
import tomllib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgspec
import structlog
import tomli_w

from agents.methods.registry import BUILTIN, installed_methods
from engine.errors import ScenarioInvalid
from scenarios.schema import Scenario

if TYPE_CHECKING:
    from agents.methods.settings import ComplementaryConfig
    from engine.eventlog import RunMeta
    from engine.world import Task

MAX_BYTES = 1_000_000
MAX_DEPTH = 32
"""The deepest a scenario nests tables and arrays (the shipped ones: 4)."""


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Read, override and validate a scenario file.

    Args:
        path: the TOML file.
        overrides: ``key.path=value`` strings; the value is a TOML value (``3``, ``true``,
            ``"text"``, ``[1, 2]``) or else taken as a bare string.

    Raises:
        ScenarioInvalid: unreadable, too large, not UTF-8, not TOML, or not a valid scenario.
    """
    return read_scenario(path, overrides)[0]


def read_scenario(
    path: str | Path, overrides: list[str] | tuple[str, ...] = ()
) -> tuple[Scenario, list[str]]:
    """:func:`load_scenario`, and the tables the file sets that nothing will read
    (:func:`unread_tables`: for a file a person wrote; a run's resolved ``scenario.toml``
    holds every table)."""
    source = str(path)
    doc = parse_toml(read_text(path), source)
    for item in overrides:
        apply_override(doc, item, source)
    try:
        scenario = to_scenario(doc, source)
        refuse_futile(scenario, source)
    except ScenarioInvalid as exc:
        raise _naming_override(exc, overrides) from None
    return scenario, unread_tables(doc, scenario)


def _naming_override(exc: ScenarioInvalid, overrides: Sequence[str]) -> ScenarioInvalid:
    """``exc``, saying which ``--set`` gave the value it is about (the file holds another):
    the last override whose key is the error's key path, or above or below it; else one of
    another setting the message names as part of the cause (``of $.grpo.group_size = 5``)."""
    found = re.search(r"`(\$[^`]*)`", exc.detail) or re.match(r"(\$[^\s:]*)", exc.detail)
    top = re.fullmatch(r"Object contains unknown field `([^`]*)`", exc.detail)  # no path
    if found is not None:
        at = found.group(1)
    elif top is not None:
        at = f"$.{top.group(1)}"
    else:
        return exc
    named = [p.rstrip(".") for p in re.findall(r"\$\.[\w.\[\]]+", exc.detail)]
    keyed = [(item, "$." + ".".join(_split_override(item, exc.source)[0])) for item in overrides]
    for path in dict.fromkeys([at, *named]):
        for item, key in reversed(keyed):
            pairs = ((path, key), (key, path))
            if any(a == b or a.startswith((b + ".", b + "[")) for a, b in pairs):
                said = item if len(item) <= 120 else f"{item[:120]}... ({len(item):,} characters)"
                return ScenarioInvalid(exc.source, f"{exc.detail} (given by --set {said})")
    return exc


def refuse_futile(scenario: Scenario, source: str) -> None:
    """Refuse settings a new run would accept and then spend its time on for nothing: a
    subgroup of one (Complementary RL: its advantage is always 0, so it never trains), an
    extractor update of one call (its advantage is its reward less the batch's mean: 0), a
    final round or an adaptation test without evaluation rounds (they are played in the last
    round, and ``eval.every = 0`` plays none). Checked for a scenario a person gives, not for
    a run's stored one (``stored_scenario``): runs made before the check still read.

    Raises:
        ScenarioInvalid: one of those.
    """
    e = scenario.eval
    for key, value in (("final_episodes", e.final_episodes), ("adapt_attempts", e.adapt_attempts)):
        if value and not e.every:
            raise ScenarioInvalid(
                source,
                f"$.eval.{key} = {value}: played in the last evaluation round, and "
                "eval.every = 0 plays none; set eval.every (e.g. to the run's number of "
                "updates for a first and a last round only)",
            )
    if (found := _complementary(scenario)) is None:
        return
    (c, at), size = found, scenario.grpo.group_size
    guided = c.guided_count(size)
    if c.subgroups and 1 in (guided, size - guided):
        split = (
            f"Complementary RL splits a group into a guided and a free subgroup ({guided} and "
            f"{size - guided} episodes), and an episode alone in its subgroup always has "
            "advantage 0 (it never trains)"
        )
        ablation = f"{at[2:]}.subgroups = false"
        if c.guided_fraction == 0.5:  # the method's split: the group is too small
            detail = f"$.grpo.group_size = {size}: {split}; use at least 4, or {ablation}"
        else:
            detail = (
                f"{at}.guided_fraction = {c.guided_fraction} of $.grpo.group_size = {size}: "
                f"{split}; give each subgroup 2 episodes or more (or none), or set {ablation}"
            )
        raise ScenarioInvalid(source, detail)
    if c.batch == 1:
        raise ScenarioInvalid(
            source,
            f"{at}.batch = 1: a call's advantage is its reward less its batch's "
            "mean, always 0 in a batch of one, so the extractor would never learn; use at "
            "least 2 (a batch the run never fills keeps the extractor as it starts)",
        )


SINCE: dict[tuple[str, str], Any] = {
    ("complementary", "reweight_counts"): "weighted",
    ("empo2", "query_chars"): 0,  # (0: every character embedded, as before the setting)
    ("complementary", "query_chars"): 0,
    ("eval", "own_seeds"): False,
    ("complementary", "guided_fraction"): 0.5,  # half of each group, as since the start
}
"""Settings added after runs were recorded, by table and key, with the value that reproduces
the runs recorded before them. A run's stored scenario is its resolved TOML (every key), so a
key it lacks was not there yet: reading it as today's default would re-derive, resume or
check that run under a rule it did not follow."""


def since_lacking(doc: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """The :data:`SINCE` settings a stored scenario ``doc`` (parsed TOML) lacks in a table it
    has, with the values the run was made with."""
    return {
        (table, key): value
        for (table, key), value in SINCE.items()
        if isinstance(section := doc.get(table), dict) and key not in section
    }


def stored_source(where: str) -> str:
    """How messages name the scenario :func:`stored_scenario` reads of the run at ``where``."""
    return f"{where} (its scenario)"


def stored_scenario(
    meta: RunMeta | None,
    where: str,
    overrides: list[str] | tuple[str, ...] = (),
    ignored: Sequence[str] = (),
) -> Scenario:
    """The scenario a run was started with, as its log's metadata stores it, with
    ``overrides`` (``key.path=value``: what differs on this machine, such as where a base model
    lies or the device). An override that nothing in the run reads, or that is under one of
    ``ignored`` (the tables or keys the command asking never reads, as ``grpo`` or
    ``eval.every``: a replay of episodes trains nothing), is warned of.

    The run directory's ``scenario.toml`` is a copy for people to read: edited, deleted or
    replaced by another run's, it changes nothing any command reads of the run.

    Raises:
        ScenarioInvalid: the log holds no metadata, an override is malformed, or the scenario
            does not validate here (a plug-in method or world that no longer loads).
    """
    source = stored_source(where)
    if meta is None:
        raise ScenarioInvalid(source, "the run's log holds no run metadata")
    doc = parse_toml(meta.scenario_toml, source)
    for (table, key), value in since_lacking(doc).items():
        doc[table][key] = value
    for item in overrides:
        apply_override(doc, item, source)
    try:
        scenario = to_scenario(doc, source)
    except ScenarioInvalid as exc:  # the log's scenario validated: the --set is at issue
        raise _naming_override(exc, overrides) from None
    _warn_unread_overrides(overrides, scenario, source, ignored)
    return scenario


def _warn_unread_overrides(
    overrides: Sequence[str], scenario: Scenario, source: str, ignored: Sequence[str] = ()
) -> None:
    """A warning naming each ``--set`` given for a stored run that sets what its method and
    agent never read (:func:`unread_tables`), or what the command never reads (``ignored``):
    accepted without a word, it read as a change the replay or probe had made."""
    doc: dict[str, Any] = {}
    for item in overrides:
        apply_override(doc, item, source)
    keys = [(item, override_key(item)) for item in overrides]

    def under(key: str, table: str) -> bool:
        return key == table or key.startswith(table + ".")

    # (a table the scenario leaves unread is named only where a --set is in it)
    unread = [t for t in unread_tables(doc, scenario) if any(under(k, t) for _, k in keys)]
    unasked = [t for t in ignored if t not in unread and any(under(k, t) for _, k in keys)]
    if unasked:
        given = [i for i, k in keys if any(under(k, t) for t in unasked)]
        structlog.get_logger("coevo").warning(
            f"{source}: --set {' '.join(given)}: this command reads nothing of "
            f"{', '.join(f'[{t}]' if '.' not in t else t for t in unasked)} (it plays "
            "episodes and trains nothing): it changes nothing"
        )
    if not unread:
        return
    given = [i for i, k in keys if any(under(k, t) for t in unread)]
    named = ", ".join(t if t in UNREAD_KEYS else f"[{t}]" for t in unread)
    structlog.get_logger("coevo").warning(
        f"{source}: --set {' '.join(given)}: nothing reads {named} in this run (method "
        f"{scenario.run.method!r}, agent {scenario.agent.kind!r}): it changes nothing"
    )


def warn_settings(
    source: str,
    scenario: Scenario,
    unread: list[str],
    played: int,
    tasks: Sequence[Task] = (),
) -> None:
    """Log a warning for each setting a valid scenario holds that is likely not what its
    author meant (after it was found valid: a refused one says only why): tables and keys
    nothing reads (``unread``), fewer episodes than ``run.episodes`` asks (a learning run
    plays whole steps of ``group_size * groups_per_update``; ``played``), a ``world.pool``
    larger than a family's variants (``tasks``, the run's), and training on the variants
    held-out evaluation plays."""
    log = structlog.get_logger("coevo")
    pool = scenario.world.pool
    counts = Counter(t.family for t in tasks)
    short = {f: n for f, n in counts.items() if pool and n < pool}
    if short:
        named = ", ".join(f"{f} ({n})" for f, n in short.items())
        log.warning(
            f"{source}: world.pool = {pool} is more than the {scenario.world.split} variants "
            f"of {named}: training draws from all of them"
        )
    if unread:
        named = ", ".join(t if t in UNREAD_KEYS else f"[{t}]" for t in unread)
        instead = "".join(
            f"; {UNREAD_KEYS[t][1]} is read instead" for t in unread if t in UNREAD_KEYS
        )
        plugin = scenario.run.method not in {"rollout", *BUILTIN}
        if plugin and (built := [t for t in ("empo2", "complementary") if t in unread]):
            instead += f"; a plug-in method built on [{built[0]}] reads its settings from [method]"
        if "complementary.ops" in unread:
            instead += '; complementary.extractor = "embedded-ops" reads it'
        if "runtime.ray" in unread:
            backend = scenario.runtime.backend
            instead += f'; runtime.backend = "ray" reads it (this run is {backend!r})'
        log.warning(
            f"{source}: nothing reads {named} in this scenario{instead}",
            method=scenario.run.method,
            agent=scenario.agent.kind,
        )
    asked = scenario.run.episodes
    if played != asked:
        g = scenario.grpo
        log.warning(
            f"{source}: run.episodes = {asked} is not a whole number of steps of "
            f"{g.group_size * g.groups_per_update} episodes (grpo.group_size * "
            f"grpo.groups_per_update): the run plays {played}"
        )
    _warn_unguided(source, scenario, log)
    greedy = scenario.policy.temperature == 0
    if scenario.run.method == "grpo" and scenario.agent.kind == "policy" and greedy:
        log.warning(
            f"{source}: policy.temperature = 0 acts greedily: a group's episodes play one task "
            "alike unless the world has randomness of its own (minilab has none), and then "
            "every advantage is 0 and no update changes the policy"
        )
    e = scenario.eval
    evaluates = e.every > 0  # the final round and the adaptation test are played in rounds
    learns = scenario.run.method != "rollout"
    if learns and evaluates and scenario.world.split == e.split == "heldout":
        log.warning(
            f'{source}: world.split = "heldout" trains on the variants that held-out '
            f'evaluation plays (eval.split = "heldout"): its success is not held out'
        )
    if learns and evaluates and scenario.world.split == e.split == "train":
        log.warning(
            f'{source}: eval.split = "train" evaluates on the variants training plays '
            f'(world.split = "train"): what the run calls held-out success (the progress '
            "line, curve_heldout.csv, the report) is then success on trained variants"
        )


def _complementary(scenario: Scenario) -> tuple[ComplementaryConfig, str] | None:
    """A Complementary RL run's settings (its own or a plug-in's built on it) and the key path
    of their table (``$.complementary`` or ``$.method``); None for another method."""
    from scenarios.methods import built_on_complementary, complementary_settings, section_path

    if scenario.run.method != "complementary" and not built_on_complementary(scenario):
        return None
    return complementary_settings(scenario), section_path(scenario, "complementary")


def _warn_unguided(source: str, scenario: Scenario, log: Any) -> None:
    """Warn of a Complementary RL run whose groups have no guided episode: the extractor is
    credited only for those, so it never trains (the bank is still filled and evaluated)."""
    if (found := _complementary(scenario)) is None:
        return
    c, at = found
    if c.guided_count(scenario.grpo.group_size) == 0:
        log.warning(
            f"{source}: {at[2:]}.guided_fraction = {c.guided_fraction} of grpo.group_size = "
            f"{scenario.grpo.group_size} guides no episode: the extractor is credited for "
            "guided episodes only, so it never trains (the bank is still written and used "
            "in evaluation)"
        )


UNREAD_KEYS = {"grpo.std_norm": ("complementary", "complementary.subgroup_std")}
"""Keys of a table a method reads that this method does not: the method that does not, and
the key it reads instead (Complementary RL normalises its subgroups' advantages by its own)."""


def unread_tables(doc: dict[str, Any], scenario: Scenario) -> list[str]:
    """The tables a scenario file sets that its built-in method and agent never read (the
    settings of another method, or a policy's for a scripted agent), then the keys of a read
    table it does not read (:data:`UNREAD_KEYS`, as ``table.key``), a rollout's ``[method]``
    options and ``[policy.embedded]`` beside a model directory: accepted, since one file may
    serve several runs (``--set run.method=grpo`` for the baseline), but said."""
    method = scenario.run.method
    unread: list[str] = []
    if scenario.agent.kind != "policy":
        unread += [t for t in ("policy", "prompt") if t in doc]
    if method in {"rollout", *BUILTIN}:  # a plug-in method may read any of them
        readers = {"grpo": set(BUILTIN), "eval": set(BUILTIN)}
        readers |= {m: {m} for m in ("empo2", "complementary")}
        unread += [t for t, read_by in readers.items() if t in doc and method not in read_by]
    else:  # a plug-in built on EMPO2 or Complementary RL reads that method's settings from
        from scenarios.methods import built_on_complementary, built_on_empo2  # [method]

        built = {"empo2": built_on_empo2, "complementary": built_on_complementary}
        unread += [t for t, on in built.items() if t in doc and on(scenario)]
    if method == "rollout" and doc.get("method"):  # a plug-in's options (a built-in refuses)
        unread.append("method")
    policy = cast("dict[str, Any]", doc.get("policy") or {})
    embedded = bool(policy.get("embedded")) and "policy" not in unread
    if embedded and scenario.policy.model != "embedded":
        unread.append("policy.embedded")  # the built-in model's settings, for a model directory
    comp = scenario.complementary
    if method == "complementary" and comp.ops and comp.extractor != "embedded-ops":
        unread.append("complementary.ops")  # the operation-format stage's settings
    runtime = cast("dict[str, Any]", doc.get("runtime") or {})  # validated: a table
    if runtime.get("ray") and scenario.runtime.backend != "ray":
        unread.append("runtime.ray")  # the placements of a local run: a GPU asked for, unused
    for name, (not_by, _) in UNREAD_KEYS.items():
        table, key = name.split(".")
        if method == not_by and table not in unread and key in (doc.get(table) or {}):
            unread.append(name)
    return unread


def _shipped(name: str) -> str:
    """Where coevo's own scenario ``name`` (``quickstart``, ``empo2.toml``) lies, said for a
    path that does not exist (an installed coevo keeps them beside this module); "" when
    there is none of that name."""
    base = Path(name).name
    if Path(name).parent != Path(".") or not base:
        return ""
    shipped = Path(__file__).resolve().parent / (base if base.endswith(".toml") else base + ".toml")
    return f" (coevo's own scenario of that name: {shipped})" if shipped.is_file() else ""


def read_text(path: str | Path) -> str:
    """The file's text (a UTF-8 byte-order mark dropped). Raises :class:`ScenarioInvalid` if it
    cannot be read as UTF-8."""
    source = str(path)
    try:  # non-blocking: opening a FIFO waits for a writer, forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except IsADirectoryError:
        raise ScenarioInvalid(source, "is a directory, not a scenario file") from None
    except FileNotFoundError as exc:
        raise ScenarioInvalid(source, f"cannot read: {exc.strerror}{_shipped(source)}") from None
    except OSError as exc:
        raise ScenarioInvalid(source, f"cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ScenarioInvalid(source, "is a directory, not a scenario file")
        if not stat.S_ISREG(mode):
            raise ScenarioInvalid(source, "not a regular file (a FIFO, socket or device?)")
        data = b""
        while len(data) <= MAX_BYTES and (more := os.read(fd, MAX_BYTES + 1 - len(data))):
            data += more
    except OSError as exc:
        raise ScenarioInvalid(source, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ScenarioInvalid(source, f"larger than {MAX_BYTES} bytes; not a scenario file")
    for bom, encoding in _FOREIGN_BOMS:
        if data.startswith(bom):
            raise ScenarioInvalid(
                source, f"not UTF-8 text (a {encoding} byte-order mark); save it as UTF-8"
            )
    if (nul := data.find(b"\0")) >= 0:  # never in TOML; UTF-16 text without a mark has many
        raise ScenarioInvalid(source, f"not UTF-8 text (NUL byte at offset {nul}: UTF-16? binary?)")
    try:
        return data.removeprefix(codecs.BOM_UTF8).decode("utf-8")  # editors may add a BOM
    except UnicodeDecodeError as exc:
        raise ScenarioInvalid(source, f"not UTF-8 text (bad byte at offset {exc.start})") from None


_FOREIGN_BOMS = (  # UTF-32 first: its little-endian mark starts like UTF-16's
    (codecs.BOM_UTF32_LE, "UTF-32 little-endian"),
    (codecs.BOM_UTF32_BE, "UTF-32 big-endian"),
    (codecs.BOM_UTF16_LE, "UTF-16 little-endian"),
    (codecs.BOM_UTF16_BE, "UTF-16 big-endian"),
)


class _Tiny:
    """A float written as non-zero that reads as 0.0 (``1e-400``), as the parse leaves it for
    :func:`_tiny_at` to find (and name its key)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def said(self) -> str:
        return (
            f"{self.text} is too small for a float: it would read as 0, which means something "
            "else in many settings (no limit, greedy); write 0 for zero, or a larger number"
        )


def _float(text: str) -> float | _Tiny:
    """A TOML float (tomllib's ``parse_float``); one that underflows to 0.0 is kept as
    :class:`_Tiny`, to be refused: it would take 0's meaning unnoticed (``step_timeout =
    1e-400``: no limit)."""
    value = float(text)
    if value == 0.0 and any(c in "123456789" for c in text.lower().partition("e")[0]):
        return _Tiny(text)
    return value


def _loads(text: str) -> dict[str, Any]:
    return tomllib.loads(text, parse_float=_float)


def _tiny_at(node: object, where: str) -> tuple[str, _Tiny] | None:
    """The key path (under ``where``) and value of the first :class:`_Tiny` in ``node``."""
    if isinstance(node, _Tiny):
        return where, node
    items: list[tuple[str, object]] = []
    if isinstance(node, dict):
        items = [(f"{where}.{k}", v) for k, v in cast("dict[str, object]", node).items()]
    elif isinstance(node, list):
        items = [(f"{where}[{i}]", v) for i, v in enumerate(cast("list[object]", node))]
    for at, value in items:
        if (found := _tiny_at(value, at)) is not None:
            return found
    return None


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """Parse TOML text. Raises :class:`ScenarioInvalid` with TOML's line/column message, or
    when it nests deeper than :data:`MAX_DEPTH`, or holds a float too small to tell from 0."""
    try:
        doc = _loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioInvalid(source, f"not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per level of nesting
        raise ScenarioInvalid(source, f"nested too deeply (at most {MAX_DEPTH} levels)") from None
    _check_depth(doc, source)
    if (tiny := _tiny_at(doc, "$")) is not None:
        raise ScenarioInvalid(source, f"{tiny[0]}: {tiny[1].said()}")
    return doc


def _check_depth(doc: dict[str, Any], source: str, where: str = "$") -> None:
    """Refuse tables and arrays nested deeper than :data:`MAX_DEPTH` (what reads a scenario
    recurses: the schema, the resolved TOML, a world's options), naming the key path."""
    stack: list[tuple[object, str, int]] = [(doc, where, 1)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ScenarioInvalid(source, f"{path}: nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            table = cast("dict[str, object]", value)
            stack += [(v, f"{path}.{k}", depth + 1) for k, v in table.items()]
        elif isinstance(value, list):
            stack += [(v, path, depth + 1) for v in cast("list[object]", value)]


def apply_override(doc: dict[str, Any], item: str, source: str) -> None:
    """Apply one ``key.path=value`` override to the parsed document in place. A part of the
    key may be quoted as in TOML (``world.options."a.b"=1`` sets the key ``a.b``)."""
    parts, raw = _split_override(item, source)
    table = doc
    for depth, part in enumerate(parts[:-1]):
        child: object = table.setdefault(part, {})
        if not isinstance(child, dict):
            where = "$." + ".".join(parts[: depth + 1])
            raise ScenarioInvalid(source, f"override {item!r}: {where} is not a table")
        table = cast("dict[str, Any]", child)
    where = "$." + ".".join(parts)
    table[parts[-1]] = value = _parse_value(raw.strip(), f"override {item!r}: {where}", source)
    _check_depth({parts[-1]: value}, source, "$." + ".".join(parts[:-1]) if parts[:-1] else "$")


def override_key(item: str) -> str:
    """The dotted key path of a ``--set key.path=value`` already applied (a quoted part as
    TOML reads it)."""
    return ".".join(_split_override(item, "--set")[0])


def _split_override(item: str, source: str) -> tuple[list[str], str]:
    """The key's parts and the raw value of ``key.path=value``: the key read as a TOML dotted
    key when it quotes a part (a quoted part may hold ``.`` or ``=``), else split at each
    ``.``, every part stripped.

    Raises:
        ScenarioInvalid: no ``=`` after the key, an empty part, or a quoted key TOML cannot
            read.
    """
    bad = ScenarioInvalid(source, f"override {item!r} is not of the form key.path=value")
    at = _equals_outside_quotes(item)
    if at < 0:
        raise bad
    key, raw = item[:at].strip(), item[at + 1 :]
    if '"' in key or "'" in key:
        try:
            table: object = tomllib.loads(f"{key} = 0")
        except tomllib.TOMLDecodeError:
            raise ScenarioInvalid(
                source, f'override {item!r}: {key} is not a TOML key (quote a part as "a.b")'
            ) from None
        parts: list[str] = []
        while isinstance(table, dict) and len(cast("dict[str, object]", table)) == 1:
            ((name, table),) = cast("dict[str, object]", table).items()
            parts.append(name)
        return parts, raw
    parts = [part.strip() for part in key.split(".")]
    if not all(parts):
        raise bad
    return parts, raw


def _equals_outside_quotes(item: str) -> int:
    """The index of the first ``=`` of ``item`` outside quotes, or -1."""
    quote = ""
    for at, char in enumerate(item):
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "=":
            return at
    return -1


def _parse_value(raw: str, where: str, source: str) -> Any:
    """A ``--set`` value: a TOML value, or else the text as a bare string. A TOML value with
    text after it (``5 x``, ``"a" b``, ``5 # note``) or a value of several lines is refused:
    the text would be dropped, or the value taken as a string unnoticed."""
    if "\n" in raw or "\r" in raw:
        raise ScenarioInvalid(source, f"{where}: a value is one line")
    try:
        value = _loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError as exc:
        if str(exc).startswith("Expected newline or end of document after a statement"):
            raise ScenarioInvalid(
                source, f"{where}: text after the value (quote the whole value for a string)"
            ) from None
        return raw
    except RecursionError:  # tomllib recurses once per level of nesting
        raise ScenarioInvalid(source, f"{where}: nested too deeply") from None
    if _parses(f"v = {raw} x"):  # what follows the value is a comment
        raise ScenarioInvalid(source, f"{where}: a comment after the value")
    if (tiny := _tiny_at(value, "")) is not None:
        raise ScenarioInvalid(source, f"{where}{tiny[0]}: {tiny[1].said()}")
    return value


def _parses(text: str) -> bool:
    try:
        _loads(text)
    except (tomllib.TOMLDecodeError, RecursionError):
        return False
    return True


def to_scenario(doc: dict[str, Any], source: str) -> Scenario:
    """Validate a parsed document against the schema."""
    try:
        scenario = msgspec.convert(doc, Scenario)
    except msgspec.ValidationError as exc:
        raise ScenarioInvalid(source, _shortened(_worded(str(exc), doc))) from None
    method = scenario.run.method
    installed = installed_methods()
    if method not in {"rollout", *BUILTIN, *installed} and ":" not in method:
        raise ScenarioInvalid(
            source,
            f"$.run.method: unknown method {method!r}: use "
            f"{', '.join(sorted({'rollout', *BUILTIN, *installed}))} "
            "or an import path 'package.module:Class'",
        )
    if scenario.runtime.backend == "ray" and (why := bad_ray_address(scenario.runtime.ray.address)):
        raise ScenarioInvalid(source, f"$.runtime.ray.address: {why}")
    return scenario


def _choices_at(path: str) -> tuple[object, ...]:
    """The values the schema allows at ``path`` (``$.world.split``, ``$.tracking.sinks[0]``)
    where it is a choice of literals (msgspec's "Invalid enum value 'test'" named none of
    them), else ()."""
    import msgspec.inspect as mi

    info: Any = mi.type_info(Scenario)
    for name, _ in re.findall(r"\.([^.\[]+)|(\[\d+\])", path.removeprefix("$")):
        if not name:  # an item of a list
            info = getattr(info, "item_type", None)
            continue
        fields = {f.name: f for f in getattr(info, "fields", ())}
        if name not in fields:
            return ()
        info = fields[name].type
    return tuple(sorted(info.values, key=str)) if isinstance(info, mi.LiteralType) else ()


def _worded(message: str, doc: dict[str, Any]) -> str:
    """msgspec's range message in plain words: a bound of ``-0.0`` reads 0, and a NaN that
    failed a range says it is NaN (``Expected `float` > 0.0`` read as if nan were out of
    range)."""
    message = re.sub(r"(?<=[<>] )-0\.0\b|(?<=[<>]= )-0\.0\b", "0", message)
    where = re.search(r" - at `(\$[^`]*)`$", message)
    if where and message.startswith("Invalid enum value ") and (allowed := _choices_at(where[1])):
        shown = ", ".join(repr(v) for v in allowed)
        return f"{message[: where.start()]} (one of {shown}){message[where.start() :]}"
    if where and message.startswith("Expected `float` ") and _is_nan(_value_at(doc, where[1])):
        return f"{message[: where.start()]}, got nan (not a number){message[where.start() :]}"
    if where and re.match(r"Expected `(float|int)`, got `str`", message):
        value = _value_at(doc, where[1])
        if isinstance(value, str) and _number_text(value):  # `.001`, `1.`: text to TOML
            hint = f"{value!r} is text to TOML, which writes a number as 0.001, 1.0 or 1e-3"
            return f"{message[: where.start()]} ({hint}){message[where.start() :]}"
    return message


def _number_text(value: str) -> bool:
    """Whether ``value``, which TOML read as text, is a number to Python (a --set's
    ``.001``)."""
    try:
        float(value)
    except ValueError:
        return False
    return True


def _value_at(doc: Any, path: str) -> Any:
    """The value at msgspec's error path ``$.a.b[0].c`` in ``doc`` (None if it is not there)."""
    for key, index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path[1:]):
        try:
            doc = doc[key] if key else doc[int(index)]
        except (KeyError, IndexError, TypeError):
            return None
    return doc


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and value != value


def _shortened(message: str, most: int = 80) -> str:
    """``message`` with each quoted value longer than ``most`` characters cut (msgspec
    quotes a bad value whole: a 20,000-character one made a 20,000-character error line)."""

    def cut(found: re.Match[str]) -> str:
        value = found.group(1)
        return f"'{value[:most]}...' ({len(value):,} characters)"

    return re.sub("'([^']{" + str(most + 1) + ",})'", cut, message)


def bad_ray_address(address: str) -> str:
    """Why ``address`` cannot name the Ray cluster a run joins, or "": "local", "auto" and
    ``HOST:PORT`` (a port 1-65535) can; a Ray Client address (``ray://``) cannot (the driver
    must be a node of the cluster, docs/DEPLOY.md)."""
    if address in ("local", "auto"):
        return ""
    if address.startswith("ray://"):
        return (
            f"{address!r} is a Ray Client address, which coevo does not support: run coevo on "
            "a node of the cluster with its HOST:PORT (or auto)"
        )
    host, colon, port = address.rpartition(":")
    if not colon or not host.strip() or "/" in address or any(c.isspace() for c in address):
        return f"{address!r} is not local, auto or a cluster's HOST:PORT"
    if not (port.isdigit() and 1 <= int(port) <= 65535):
        return f"{address!r}: the port must be a number from 1 to 65535"
    return ""


def resolved_toml(scenario: Scenario) -> str:
    """The scenario with every default filled in, as TOML text (what a run directory keeps).
    A table left out that is None by default (``[runtime.ray.inference]``: not placed) stays
    out: TOML has no null, and reading the text back gives None again."""
    return tomli_w.dumps(_without_none(msgspec.to_builtins(scenario)))


def _without_none(table: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _without_none(cast(dict[str, Any], v)) if isinstance(v, dict) else v
        for k, v in table.items()
        if v is not None
    }


def scenario_hash(text: str) -> str:
    """sha256 of the resolved scenario text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
