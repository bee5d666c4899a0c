"""Reading scenario files: bytes -> TOML -> overrides -> typed :class:`Scenario`.

Every way a file can be wrong ends in :class:`ScenarioInvalid` with the file name and, where
there is one, the key path; nothing here lets a traceback reach the user.
"""

from __future__ import annotations

import codecs
import hashlib
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import tomli_w

from engine.errors import ScenarioInvalid
from scenarios.schema import Scenario

MAX_BYTES = 1_000_000


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Read, override and validate a scenario file.

    Args:
        path: the TOML file.
        overrides: ``key.path=value`` strings; the value is a TOML value (``3``, ``true``,
            ``"text"``, ``[1, 2]``) or else taken as a bare string.

    Raises:
        ScenarioInvalid: unreadable, too large, not UTF-8, not TOML, or not a valid scenario.
    """
    source = str(path)
    doc = parse_toml(read_text(path), source)
    for item in overrides:
        apply_override(doc, item, source)
    return to_scenario(doc, source)


def read_text(path: str | Path) -> str:
    """The file's text (a UTF-8 byte-order mark dropped). Raises :class:`ScenarioInvalid` if it
    cannot be read as UTF-8."""
    source = str(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except IsADirectoryError:
        raise ScenarioInvalid(source, "is a directory, not a scenario file") from None
    except OSError as exc:
        raise ScenarioInvalid(source, f"cannot read: {exc.strerror or exc}") from None
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


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """Parse TOML text. Raises :class:`ScenarioInvalid` with TOML's line/column message."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioInvalid(source, f"not valid TOML: {exc}") from None


def apply_override(doc: dict[str, Any], item: str, source: str) -> None:
    """Apply one ``key.path=value`` override to the parsed document in place."""
    key, sep, raw = item.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(part.strip() for part in parts):
        raise ScenarioInvalid(source, f"override {item!r} is not of the form key.path=value")
    parts = [part.strip() for part in parts]
    table = doc
    for depth, part in enumerate(parts[:-1]):
        child = table.setdefault(part, {})
        if not isinstance(child, dict):
            where = "$." + ".".join(parts[: depth + 1])
            raise ScenarioInvalid(source, f"override {item!r}: {where} is not a table")
        table = child
    table[parts[-1]] = _parse_value(raw.strip())


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def to_scenario(doc: dict[str, Any], source: str) -> Scenario:
    """Validate a parsed document against the schema."""
    try:
        return msgspec.convert(doc, Scenario)
    except msgspec.ValidationError as exc:
        raise ScenarioInvalid(source, str(exc)) from None


def resolved_toml(scenario: Scenario) -> str:
    """The scenario with every default filled in, as TOML text (what a run directory keeps)."""
    return tomli_w.dumps(msgspec.to_builtins(scenario))


def scenario_hash(text: str) -> str:
    """sha256 of the resolved scenario text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
