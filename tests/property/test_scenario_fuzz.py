"""Fuzzing `coevo validate` with mutated copies of every shipped scenario.

Each case writes a mutated file and runs ``scenarios.cli.main(["validate", path])`` in process.
Whatever the mutation, the outcome is exit 0 (still a valid scenario) or exit 2 with exactly
one line ``coevo: error: <path>: ...`` on stderr and nothing on stdout; an exception escaping
``main`` is a traceback a user would see, and fails the test. Mutations that certainly break a
scenario (a wrong type, an unknown key, a value out of range) must be exit 2 and name the key
path (``$.run.episodes``). ``COEVO_FUZZ_SCALE`` multiplies the number of cases
(``make test-faults`` runs ten times as many).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fault_counts
import msgspec.inspect as mi
import pytest
import tomli_w
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scenarios.cli import main
from scenarios.schema import Scenario

ROOT = Path(__file__).resolve().parents[2]
SEEDS = sorted((ROOT / "scenarios").glob("*.toml"))
SEED_DOCS = {p.name: tomllib.loads(p.read_text(encoding="utf-8")) for p in SEEDS}
SCALE = int(os.environ.get("COEVO_FUZZ_SCALE", "1"))
FOREIGN_WORLDS = {n for n, d in SEED_DOCS.items() if d.get("world", {}).get("name") != "minilab"}


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples * SCALE,
        deadline=None,
        derandomize=True,  # the same cases every run: a failure here is reproducible
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


# --- the schema, as (path, type info) of every leaf -------------------------------------------


@dataclass(frozen=True)
class Leaf:
    """A scalar, list or dict field of the schema, with its path from the document's root."""

    path: tuple[str, ...]
    info: mi.Type

    @property
    def dotted(self) -> str:
        return "$." + ".".join(self.path)


def table(info: mi.Type) -> mi.StructType | None:
    """The table a field is: a struct, or an optional one (``[runtime.ray.inference]``)."""
    if isinstance(info, mi.UnionType):
        structs = [t for t in info.types if isinstance(t, mi.StructType)]
        rest = [t for t in info.types if not isinstance(t, mi.StructType | mi.NoneType)]
        return structs[0] if len(structs) == 1 and not rest else None
    return info if isinstance(info, mi.StructType) else None


def leaves(info: mi.StructType, prefix: tuple[str, ...] = ()) -> Iterator[Leaf]:
    for f in info.fields:
        if (sub := table(f.type)) is not None:
            yield from leaves(sub, (*prefix, f.name))
        else:
            yield Leaf((*prefix, f.name), f.type)


def tables(info: mi.StructType, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield prefix
    for f in info.fields:
        if (sub := table(f.type)) is not None:
            yield from tables(sub, (*prefix, f.name))


SCHEMA = mi.type_info(Scenario)
assert isinstance(SCHEMA, mi.StructType)
LEAVES = tuple(leaves(SCHEMA))
TABLES = tuple(tables(SCHEMA))
NUMERIC = tuple(leaf for leaf in LEAVES if isinstance(leaf.info, mi.IntType | mi.FloatType))


def wrong_types(info: mi.Type) -> st.SearchStrategy[Any]:
    """Values of a TOML type that ``info`` never accepts."""
    import datetime as dt

    text = st.text(max_size=12)
    ints = st.integers(-(10**6), 10**6)
    floats = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer())
    others: list[st.SearchStrategy[Any]] = [
        st.lists(ints, min_size=1, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b"]), ints, min_size=1),
        st.just(dt.date(2024, 1, 2)),
        st.just(dt.datetime(2024, 1, 2, 3, 4, 5)),
    ]
    if isinstance(info, mi.IntType):
        return st.one_of(text, floats, st.booleans(), *others)
    if isinstance(info, mi.FloatType):
        return st.one_of(text, st.booleans(), *others)
    if isinstance(info, mi.BoolType):
        return st.one_of(text, ints, floats, *others)
    if isinstance(info, mi.StrType | mi.LiteralType):
        return st.one_of(ints, floats, st.booleans(), *others)
    if isinstance(info, mi.ListType):  # a list of names
        return st.one_of(text, ints, st.lists(ints, min_size=1, max_size=3), others[1])
    assert isinstance(info, mi.DictType), info
    return st.one_of(text, ints, floats, st.booleans(), others[0])


def out_of_range(info: mi.IntType | mi.FloatType) -> st.SearchStrategy[Any]:
    """Values of the right TOML type outside the field's range, huge ones and NaN."""
    low = info.ge if info.ge is not None else info.gt
    high = info.le if info.le is not None else info.lt
    assert low is not None and high is not None, "every number in the schema has a range"
    if isinstance(info, mi.IntType):
        below = st.integers(-(2**70), int(low) - 1) if info.ge is not None else st.just(int(low))
        above = st.integers(int(high) + 1, 2**70) if info.le is not None else st.just(int(high))
        huge = st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**30, -(10**30)])
        return st.one_of(below, above, huge.filter(lambda v: not low <= v <= high))
    below_f = st.floats(max_value=float(low), exclude_max=info.ge is not None, allow_nan=False)
    above_f = st.floats(min_value=float(high), exclude_min=info.le is not None, allow_nan=False)
    special = st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308])
    return st.one_of(below_f, above_f, special.filter(lambda v: not low <= v <= high))


# --- running one case -------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str


def validate(tmp: Path, data: bytes, capsys: pytest.CaptureFixture[str], *sets: str) -> Outcome:
    path = tmp / "fuzzed.toml"
    path.write_bytes(data)
    args = ["validate", str(path)]
    for item in sets:
        args += ["--set", item]
    CASES["fuzz_cases"] += 1
    try:
        code = main(args)
    except BaseException:
        CASES["tracebacks"] += 1  # an exception escaping main: a user would see a traceback
        raise
    captured = capsys.readouterr()
    outcome = Outcome(code, captured.out, captured.err)
    CASES["fuzz_refused"] += code == 2
    CASES["tracebacks"] += "Traceback" in outcome.err
    assert code in (0, 2), outcome
    if code == 2:
        lines = outcome.err.splitlines()
        assert len(lines) == 1, outcome
        assert lines[0].startswith(f"coevo: error: {path}: "), outcome
        assert outcome.out == "", outcome
    assert "Traceback" not in outcome.err
    return outcome


CASES: Counter[str] = Counter()
"""What the fuzz ran: cases validated (a file, its ``--set`` lines), refused, tracebacks."""


@pytest.fixture(scope="module", autouse=True)
def counted() -> Iterator[None]:
    """At the larger scale of ``make test-faults``, record the module's figures
    (``tests/faults/fault_counts.py``) once all its tests have run."""
    CASES.clear()
    yield
    if SCALE > 1:
        fault_counts.record(
            "tests/property/test_scenario_fuzz.py",
            fuzz_cases=CASES["fuzz_cases"],
            fuzz_refused=CASES["fuzz_refused"],
            tracebacks=CASES["tracebacks"],
            COEVO_FUZZ_SCALE=str(SCALE),
        )


def dump(doc: dict[str, Any]) -> bytes:
    return tomli_w.dumps(doc).encode()


def with_value(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with ``path`` set to ``value`` (tables made where missing)."""
    out = tomllib.loads(tomli_w.dumps(doc))
    table = out
    for part in path[:-1]:
        child = table.setdefault(part, {})
        if not isinstance(child, dict):
            child = table[part] = {}
        table = child
    table[path[-1]] = value
    return out


seeds = st.sampled_from(sorted(SEED_DOCS))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def test_every_shipped_scenario_is_a_seed_and_the_minilab_ones_validate(
    tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert len(SEED_DOCS) >= 10
    for name, doc in SEED_DOCS.items():
        outcome = validate(tmp, dump(doc), capsys)
        if doc.get("world", {}).get("name", "minilab") == "minilab":
            assert outcome.code == 0, (name, outcome)


# --- schema-level mutations: always an error naming the key path ------------------------------


@fuzz_settings(250)
@given(seed=seeds, leaf=st.sampled_from(LEAVES), data=st.data())
def test_a_value_of_the_wrong_type_names_its_key_path(
    tmp: Path, capsys: pytest.CaptureFixture[str], seed: str, leaf: Leaf, data: st.DataObject
) -> None:
    value = data.draw(wrong_types(leaf.info), label="value")
    outcome = validate(tmp, dump(with_value(SEED_DOCS[seed], leaf.path, value)), capsys)
    assert outcome.code == 2
    assert f"- at `{leaf.dotted}" in outcome.err, outcome


@fuzz_settings(250)
@given(seed=seeds, leaf=st.sampled_from(NUMERIC), data=st.data())
def test_a_number_out_of_range_names_its_key_path(
    tmp: Path, capsys: pytest.CaptureFixture[str], seed: str, leaf: Leaf, data: st.DataObject
) -> None:
    assert isinstance(leaf.info, mi.IntType | mi.FloatType)
    value = data.draw(out_of_range(leaf.info), label="value")
    outcome = validate(tmp, dump(with_value(SEED_DOCS[seed], leaf.path, value)), capsys)
    assert outcome.code == 2
    assert f"- at `{leaf.dotted}`" in outcome.err, outcome


KEY = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)


@fuzz_settings(100)
@given(seed=seeds, table=st.sampled_from(TABLES), key=KEY, value=st.integers() | st.text())
def test_an_unknown_key_is_named_with_its_table(
    tmp: Path,
    capsys: pytest.CaptureFixture[str],
    seed: str,
    table: tuple[str, ...],
    key: str,
    value: Any,
) -> None:
    known = {leaf.path[-1] for leaf in LEAVES if leaf.path[:-1] == table}
    known |= {t[-1] for t in TABLES if len(t) == len(table) + 1 and t[:-1] == table}
    if key in known:
        key += "_x"
    outcome = validate(tmp, dump(with_value(SEED_DOCS[seed], (*table, key), value)), capsys)
    assert outcome.code == 2
    assert f"unknown field `{key}`" in outcome.err, outcome
    if table:
        assert f"- at `$.{'.'.join(table)}`" in outcome.err, outcome


@fuzz_settings(100)
@given(seed=seeds, data=st.data())
def test_removing_keys_is_valid_or_one_clean_error(
    tmp: Path, capsys: pytest.CaptureFixture[str], seed: str, data: st.DataObject
) -> None:
    doc = tomllib.loads(tomli_w.dumps(SEED_DOCS[seed]))
    present = [(k,) for k in doc] + [
        (k, sub) for k, v in doc.items() if isinstance(v, dict) for sub in v
    ]
    drop = data.draw(st.lists(st.sampled_from(present), min_size=1, max_size=4, unique=True))
    for path in drop:
        table = doc
        for part in path[:-1]:
            table = table.get(part, {})
        table.pop(path[-1], None)
    outcome = validate(tmp, dump(doc), capsys)
    if ("name",) in drop:
        assert outcome.code == 2
        assert "missing required field `name`" in outcome.err, outcome


# --- value-level mutations inside the free-form tables ----------------------------------------

ANY_VALUE = st.one_of(
    st.integers(-(2**64), 2**64),
    st.floats(),
    st.booleans(),
    st.text(max_size=20),
    st.lists(st.integers(-5, 5) | st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(-5, 5), max_size=2),
)
MINILAB_OPTIONS = ["families", "train_variants", "heldout_variants", "max_steps"]
EMBEDDED_FIELDS = sorted(
    f.name
    for f in mi.type_info(__import__("agents.models.embedded").models.embedded.EmbeddedSpec).fields  # type: ignore[attr-defined]
)


@fuzz_settings(100)
@given(
    seed=st.sampled_from(sorted(n for n in SEED_DOCS if n not in FOREIGN_WORLDS)),
    where=st.sampled_from(["world.options", "policy.embedded"]),
    data=st.data(),
)
def test_world_options_and_embedded_fields_are_checked_by_validate(
    tmp: Path, capsys: pytest.CaptureFixture[str], seed: str, where: str, data: st.DataObject
) -> None:
    uses_model = SEED_DOCS[seed].get("agent", {}).get("kind") == "policy"
    assume(where == "world.options" or uses_model)  # embedded fields are checked where used
    names = MINILAB_OPTIONS if where == "world.options" else EMBEDDED_FIELDS
    key = data.draw(st.sampled_from([*names, "bogus"]), label="key")
    value = data.draw(ANY_VALUE, label="value")
    path = (*where.split("."), key)
    outcome = validate(tmp, dump(with_value(SEED_DOCS[seed], path, value)), capsys)
    if key == "bogus":
        assert outcome.code == 2
        assert f": $.{where}: " in outcome.err, outcome
    if outcome.code == 2:  # an option can also leave the world without tasks ($.world)
        assert f": $.{where.split('.')[0]}" in outcome.err, outcome


# --- byte-level mutations: encodings, garbage, truncation -------------------------------------

ENCODINGS = ["latin-1", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "cp1252", "utf-8-sig"]


@fuzz_settings(80)
@given(seed=seeds, encoding=st.sampled_from(ENCODINGS), accent=st.sampled_from("éüñçø"))
def test_a_file_in_another_encoding_is_one_clean_error(
    tmp: Path, capsys: pytest.CaptureFixture[str], seed: str, encoding: str, accent: str
) -> None:
    doc = with_value(SEED_DOCS[seed], ("description",), f"caf{accent} au lait")
    outcome = validate(tmp, tomli_w.dumps(doc).encode(encoding), capsys)
    if encoding == "utf-8-sig":  # a UTF-8 byte-order mark is UTF-8 all the same
        assert outcome.code == validate(tmp, dump(doc), capsys).code
    else:
        assert outcome.code == 2
        assert "not UTF-8" in outcome.err, outcome


@fuzz_settings(100)
@given(seed=seeds, data=st.data())
def test_garbage_and_truncation_are_one_clean_error(
    tmp: Path, capsys: pytest.CaptureFixture[str], seed: str, data: st.DataObject
) -> None:
    text = dump(SEED_DOCS[seed])
    how = data.draw(st.sampled_from(["truncate", "splice", "replace", "flip", "nul"]), label="how")
    at = data.draw(st.integers(0, len(text)), label="at")
    garbage = data.draw(st.binary(min_size=1, max_size=64), label="garbage")
    if how == "truncate":
        text = text[:at]
    elif how == "splice":
        text = text[:at] + garbage + text[at:]
    elif how == "replace":
        text = garbage if at % 2 else garbage * 1000
    elif how == "flip":
        i = min(at, len(text) - 1)
        text = text[:i] + bytes([text[i] ^ (1 << (garbage[0] % 8))]) + text[i + 1 :]
    else:
        text = text[:at] + b"\x00" + text[at:]
    validate(tmp, text, capsys)


# --- overrides ----------------------------------------------------------------------------------


@fuzz_settings(80)
@given(
    seed=seeds,
    leaf=st.sampled_from(LEAVES),
    raw=st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20
    )
    | st.sampled_from(["nan", "inf", "-inf", "1e999", "99999999999999999999", "[1,", "{a=1}"]),
)
def test_overrides_are_valid_or_one_clean_error(
    tmp: Path, capsys: pytest.CaptureFixture[str], seed: str, leaf: Leaf, raw: str
) -> None:
    key = ".".join(leaf.path)
    outcome = validate(tmp, dump(SEED_DOCS[seed]), capsys, f"{key}={raw}")
    if outcome.code == 2 and seed not in FOREIGN_WORLDS:  # the override broke it: it is named
        assert f"$.{key}" in outcome.err or f"$.{leaf.path[0]}" in outcome.err, outcome


# --- the same through a real process --------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b'name = "x"\n[run]\nepisodes = 99999999999999999999999\n', "$.run.episodes"),
        ('name = "x"\n'.encode("utf-16"), "not UTF-8"),
        (bytes(range(256)) * 4, "not UTF-8"),
    ],
)
def test_a_real_coevo_process_prints_one_line_and_exits_2(
    tmp_path: Path, data: bytes, fragment: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(data)
    coevo = str(Path(sys.executable).parent / "coevo")
    proc = subprocess.run(
        [coevo, "validate", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"coevo: error: {path}: ")
    assert fragment in lines[0]
