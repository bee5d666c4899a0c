"""The experience extractor's words (Complementary RL): the prompts that ask it for operations on
the experience bank, and the parsing of what it answers.

Pure: no I/O, no model. The extractor starts from the same small base model that was
pre-trained to write reflection notes (:func:`agents.models.prompts.reflection_messages`), so its
user message is a reflection prompt plus one line naming the entry the actor used. Prompts show
entries by position (``entry 1``, ``entry 2``, ...), answers name them so, and
:func:`to_bank_ids` turns the parsed positions into the bank's ids.

Two answer formats are accepted, whichever yields more valid operations (JSON on a tie):

- JSON, as the paper's released code: a list of objects, a single object, or an object holding
  the list under ``"operations"`` / ``"ops"``; bare, inside a ````` fence, or embedded in
  surrounding text. Ids come as ``"ids"`` (an integer or a list of integers) or ``"id"``::

      [{"op": "add", "content": "heat the water first"},
       {"op": "update", "ids": [3, 5], "content": "..."}, {"op": "return"}]
      [{"op": "merge", "ids": [3, 5], "content": "..."}, {"op": "rewrite", "id": 4,
        "content": "..."}, {"op": "discard", "ids": [2, 7]}]

- lines, a compact format a tiny model can learn: one operation a line, ids separated by
  commas or spaces, an optional list marker (``-``, ``*``, ``1.``, ``1)``) in front::

      add: heat the water first        merge 3,5: ...
      update 3,5: ...                  rewrite 4: ...
      return                           discard 2,7

  A line with an operation's shape but an unknown word (``delete 3: x``, ``note: x``) is an
  unknown operation; any other line (prose) is reported as not an operation and does not count
  towards ``max_ops``.

Operation words are case-insensitive. Anything after ``return``, and after ``discard``'s ids, is
ignored. Content is stripped and must hold 1 to :data:`MAX_CONTENT_CHARS` characters.

Partial answers keep their valid operations; every rejected piece gets one error, prefixed with
where it is (``op 2`` for the second JSON object, ``line 3`` for the third line of the answer,
inside the fence if there is one). Rejected are: unknown operations, a wrong number of ids,
non-integer ids, duplicate ids, ids outside the known ids (or the chunk), an id already used by
an earlier kept operation (so kept operations touch disjoint entries and may be applied in any
order), missing, empty or over-long content, and for extraction every operation past
``max_ops``. JSON that did not decode whole (a truncated list whose complete objects were kept)
adds its first decoding error, e.g.
``invalid JSON: Expecting ',' delimiter: line 1 column 41 (char 40)``.
``return`` means "change nothing": it is kept only when it is the only valid operation. An
answer with no valid operation is malformed. Parsing never raises on any string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from agents.models.prompts import Step, reflection_messages

SHOWN_ID = 1
"""Prompts show entries by position, counting from this, not by their bank ids: a model this
small cannot copy a three-digit id it read hundreds of tokens earlier, while ``1`` is one token
(the same positions are what the operation stage teaches, :mod:`agents.models.extractor_base`)."""
MAX_CONTENT_CHARS = 1000
"""The longest entry text accepted, in characters (after stripping)."""
MAX_JSON_STARTS = 64
"""At most this many ``[`` / ``{`` positions are tried as the start of a JSON value (bounds the
work on bracket-heavy garbage)."""

EXTRACT_SYSTEM = (
    "you read an episode of a text lab and keep the notes for the next try. write at most "
    "{max_ops} lines, each one of: add: <note> | update <ids>: <note> | return"
)
MERGE_SYSTEM = (
    "you read notes of a text lab and tidy them. write one line per change, each one of: "
    "merge <ids>: <note> | rewrite <id>: <note> | discard <ids> | return"
)


# ---------------------------------------------------------------------------------------------
# Operations


@dataclass(frozen=True, slots=True)
class Add:
    """Store a new entry with text ``content``."""

    content: str


@dataclass(frozen=True, slots=True)
class Update:
    """Replace the entries ``ids`` (one or more, distinct) by one entry with text ``content``."""

    ids: tuple[int, ...]
    content: str


@dataclass(frozen=True, slots=True)
class Return:
    """Change nothing."""


@dataclass(frozen=True, slots=True)
class Merge:
    """Replace the entries ``ids`` (two or more, distinct) by one entry with text ``content``."""

    ids: tuple[int, ...]
    content: str


@dataclass(frozen=True, slots=True)
class Rewrite:
    """Replace the text of entry ``id`` by ``content``."""

    id: int
    content: str


@dataclass(frozen=True, slots=True)
class Discard:
    """Remove the entries ``ids`` (one or more, distinct)."""

    ids: tuple[int, ...]


ExtractOp = Add | Update | Return
MergeOp = Merge | Rewrite | Discard | Return


@dataclass(frozen=True)
class Parsed:
    """What was understood of one extractor answer.

    Attributes:
        ops: the valid operations in answer order (:data:`ExtractOp` or :data:`MergeOp`).
        errors: one message per rejected piece, in answer order, e.g.
            ``"op 2: id 9 is not a known entry"``; for a malformed answer, why.
        malformed: nothing usable at all (``ops == ()``).
        syntax: ``"json"`` or ``"lines"``, the format the operations were read in; ``""``
            when no operation was found in either.
    """

    ops: tuple[ExtractOp | MergeOp, ...]
    errors: tuple[str, ...]
    malformed: bool
    syntax: str


# ---------------------------------------------------------------------------------------------
# Prompts


def extract_messages(
    goal: str,
    first_observation: str,
    history: Sequence[Step],
    *,
    success: bool,
    entry: str | None,
    max_ops: int = 3,
    system: str = EXTRACT_SYSTEM,
) -> list[dict[str, str]]:
    """The messages that ask the extractor for operations on the bank after an episode.

    The user message is :func:`agents.models.prompts.reflection_messages`' (goal, start, every turn,
    outcome) followed by ``entry 1: <text>`` for the entry the actor used, or ``entry: none``.
    Answers name it as ``1`` (:data:`SHOWN_ID`); :func:`to_bank_ids` maps that back.

    Args:
        goal: the task's goal text.
        first_observation: the observation after reset.
        history: every turn of the episode as ``(action, observation)``, oldest first.
        success: whether the episode reached its goal.
        entry: the text of the entry in the actor's prompt, or None (a free episode).
        max_ops: the most operations to ask for (tell :func:`parse_extraction` the same).
        system: the system message's text (the scenario's ``[prompt] extract``); ``{max_ops}``
            in it is replaced by ``max_ops``.

    Returns:
        A system and a user message.

    Raises:
        ValueError: ``max_ops < 1``.
    """
    _check_max_ops(max_ops)
    user = reflection_messages(goal, first_observation, history, success=success)[1]["content"]
    used = f"entry {SHOWN_ID}: {entry}" if entry is not None else "entry: none"
    return [
        {"role": "system", "content": system.replace("{max_ops}", str(max_ops))},
        {"role": "user", "content": f"{user}\n{used}"},
    ]


def merge_messages(texts: Sequence[str], system: str = MERGE_SYSTEM) -> list[dict[str, str]]:
    """The messages that ask the extractor to merge, rewrite or discard a chunk of entries.

    Args:
        texts: the chunk's entry texts, shown ``entry <k>: <text>`` with ``k`` counting from
            1; answers name the entries by ``k`` (:func:`to_bank_ids` maps them back).
        system: the system message's text (the scenario's ``[prompt] merge``).

    Returns:
        A system and a user message.

    Raises:
        ValueError: ``texts`` is empty.
    """
    if not texts:
        raise ValueError("texts must not be empty")
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "\n".join(f"entry {k}: {t}" for k, t in enumerate(texts, 1))},
    ]


def shown_ids(count: int) -> range:
    """The ids a prompt showing ``count`` entries names them by: ``1 .. count``."""
    return range(SHOWN_ID, SHOWN_ID + count)


def to_bank_ids(parsed: Parsed, ids: Sequence[int]) -> Parsed:
    """``parsed`` with every id ``k`` an answer named (``1 .. len(ids)``, as the prompt showed
    the entries) replaced by the bank's id ``ids[k - 1]``.

    Raises:
        ValueError: an operation names an id outside ``1 .. len(ids)`` (the parser, told
            :func:`shown_ids`, never keeps one).
    """

    def bank(k: int) -> int:
        if not SHOWN_ID <= k < SHOWN_ID + len(ids):
            raise ValueError(f"id {k} was not shown (1 .. {len(ids)})")
        return ids[k - SHOWN_ID]

    ops: list[ExtractOp | MergeOp] = []
    for op in parsed.ops:
        if isinstance(op, Update | Merge | Discard):
            op = replace(op, ids=tuple(bank(k) for k in op.ids))
        elif isinstance(op, Rewrite):
            op = replace(op, id=bank(op.id))
        ops.append(op)
    return replace(parsed, ops=tuple(ops))


# ---------------------------------------------------------------------------------------------
# Parsing: the public entry points


class _Form(NamedTuple):
    """What an operation word takes: between ``min_ids`` and ``max_ids`` ids (None: no bound),
    and content or not."""

    min_ids: int
    max_ids: int | None
    content: bool


_EXTRACT: dict[str, _Form] = {
    "add": _Form(0, 0, True),
    "update": _Form(1, None, True),
    "return": _Form(0, 0, False),
}
_MERGE: dict[str, _Form] = {
    "merge": _Form(2, None, True),
    "rewrite": _Form(1, 1, True),
    "discard": _Form(1, None, False),
    "return": _Form(0, 0, False),
}


class _Rules(NamedTuple):
    grammar: dict[str, _Form]
    allowed: frozenset[int]
    outside: str  # the error for an id not in ``allowed``, formatted with the id
    max_ops: int | None


def parse_extraction(text: str, *, known_ids: Collection[int], max_ops: int = 3) -> Parsed:
    """Read an extraction answer: ``add``, ``update``, ``return`` (see the module docstring).

    Args:
        text: the extractor's answer, any string.
        known_ids: the ids ``update`` may reference (the entries shown to the extractor).
        max_ops: operations past this many (valid or not) are dropped with an error.

    Returns:
        The valid :data:`ExtractOp`\\s, the errors, and whether the answer was malformed.

    Raises:
        ValueError: ``max_ops < 1`` (never because of ``text``).
    """
    _check_max_ops(max_ops)
    rules = _Rules(_EXTRACT, frozenset(known_ids), "id {} is not a known entry", max_ops)
    return _parse(text, rules)


def tried_operations(text: str) -> bool:
    """Whether an extraction answer tried to write operations, well or not: JSON (an object,
    a list, or something that fails to decode as one), or a line that starts with an operation
    word (``add``, ``update``, ``return``) or with a word, ids and a colon (``delete 3: x``).
    Prose, and notes under a heading ("Tip: ..."), did not: what ``plain_add`` may read as one
    add (a malformed operation changes nothing)."""
    body = _unfence(text)
    items, json_error = _json_items(body)
    if items is not None or json_error is not None:
        return True
    for raw in body.splitlines():
        line = _line_body(raw)
        word = _WORD.match(line)
        if word is not None and (word.group(1).lower() in _EXTRACT or _WITH_IDS.match(line)):
            return True
    return False


def parse_merge(text: str, *, chunk_ids: Collection[int]) -> Parsed:
    """Read a merge answer: ``merge``, ``rewrite``, ``discard``, ``return``.

    There is no operation cap: kept operations touch disjoint ids of the chunk, so there are at
    most ``len(chunk_ids)`` of them.

    Args:
        text: the extractor's answer, any string.
        chunk_ids: the ids of the chunk shown to the extractor.

    Returns:
        The valid :data:`MergeOp`\\s, the errors, and whether the answer was malformed.
    """
    return _parse(text, _Rules(_MERGE, frozenset(chunk_ids), "id {} is not in the chunk", None))


def _check_max_ops(max_ops: int) -> None:
    if max_ops < 1:
        raise ValueError(f"max_ops must be >= 1, got {max_ops}")


def _parse(text: str, rules: _Rules) -> Parsed:
    body = _unfence(text)
    if not body.strip():
        return Parsed(ops=(), errors=("empty output",), malformed=True, syntax="")
    candidates: list[Parsed] = []
    items, json_error = _json_items(body)
    if items:
        pieces = [_json_piece(item, f"op {n}") for n, item in enumerate(items, 1)]
        parsed = _resolve("json", pieces, rules)
        if json_error is not None:  # e.g. a truncated list whose complete objects were kept
            parsed = replace(parsed, errors=(*parsed.errors, json_error))
        candidates.append(parsed)
    lines = _line_pieces(body, rules.grammar)
    if lines is not None:
        candidates.append(_resolve("lines", lines, rules))
    if not candidates:
        why = "empty operation list" if items == [] else json_error or "no operation found"
        return Parsed(ops=(), errors=(why,), malformed=True, syntax="")
    return max(candidates, key=lambda p: len(p.ops))  # the first (JSON) on a tie


# ---------------------------------------------------------------------------------------------
# Parsing: pieces of either format, then one validation


@dataclass(frozen=True)
class _Piece:
    """One operation as written, before validation; ``error`` if its syntax is already wrong."""

    where: str
    kind: str
    ids: tuple[int, ...] = ()
    content: str | None = None
    error: str | None = None


def _resolve(syntax: str, pieces: Sequence[_Piece | str], rules: _Rules) -> Parsed:
    """Validate pieces in order; a plain string is a line that is no operation at all (an error
    that does not count towards ``max_ops``)."""
    kept: list[tuple[int, ExtractOp | MergeOp]] = []
    returns: list[tuple[int, str]] = []
    errors: list[tuple[int, str]] = []
    used: dict[int, str] = {}
    counted = 0
    for pos, piece in enumerate(pieces):
        if isinstance(piece, str):
            errors.append((pos, piece))
            continue
        counted += 1
        if rules.max_ops is not None and counted > rules.max_ops:
            errors.append((pos, f"{piece.where}: more than {rules.max_ops} operations, dropped"))
            continue
        op = _check(piece, rules, used)
        if isinstance(op, str):
            errors.append((pos, f"{piece.where}: {op}"))
        elif isinstance(op, Return):
            returns.append((pos, piece.where))
        else:
            kept.append((pos, op))
    if kept:
        errors += [(p, f"{w}: return among other operations, dropped") for p, w in returns]
    elif returns:
        kept = [(returns[0][0], Return())]
        errors += [(p, f"{w}: duplicate return, dropped") for p, w in returns[1:]]
    errors.sort(key=lambda e: e[0])
    ops = tuple(op for _, op in kept)
    return Parsed(ops=ops, errors=tuple(e for _, e in errors), malformed=not ops, syntax=syntax)


def _check(piece: _Piece, rules: _Rules, used: dict[int, str]) -> ExtractOp | MergeOp | str:
    """The operation of a piece, or why it is rejected; records the ids a kept one uses."""
    form = rules.grammar.get(piece.kind)
    if piece.kind and form is None:
        return f"unknown operation {_short(piece.kind)}"
    if piece.error is not None:
        return piece.error
    assert form is not None  # a piece without an error names its operation
    if piece.kind == "return":
        return Return()
    ids = piece.ids
    why = _check_ids(piece.kind, form, ids, rules, used) or _check_content(piece, form)
    if why:
        return why
    for i in ids:
        used[i] = piece.where
    content = (piece.content or "").strip()
    if piece.kind == "add":
        return Add(content)
    if piece.kind == "update":
        return Update(ids, content)
    if piece.kind == "merge":
        return Merge(ids, content)
    if piece.kind == "rewrite":
        return Rewrite(ids[0], content)
    return Discard(ids)


def _check_ids(
    kind: str, form: _Form, ids: tuple[int, ...], rules: _Rules, used: dict[int, str]
) -> str | None:
    if form.max_ids == 0 and ids:
        return f"{kind} takes no ids"
    if form.min_ids == form.max_ids and len(ids) != form.min_ids:
        return f"{kind} takes exactly {form.min_ids} id, got {len(ids)}"
    if len(ids) < form.min_ids:
        plural = "s" if form.min_ids > 1 else ""
        return f"{kind} needs at least {form.min_ids} id{plural}, got {len(ids)}"
    seen: set[int] = set()
    for i in ids:
        if i in seen:
            return f"duplicate id {i}"
        seen.add(i)
        if i not in rules.allowed:
            return rules.outside.format(i)
        if i in used:
            return f"id {i} already used by {used[i]}"
    return None


def _check_content(piece: _Piece, form: _Form) -> str | None:
    if not form.content:
        return None
    if piece.content is None:
        return 'missing "content"'
    size = len(piece.content.strip())
    if size == 0:
        return "empty content"
    if size > MAX_CONTENT_CHARS:
        return f"content has {size} characters, over the cap of {MAX_CONTENT_CHARS}"
    return None


def _short(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# JSON


_FENCE = re.compile(r"```[^\n`]*\n?(.*?)(?:```|\Z)", re.S)
_OPEN = re.compile(r"[\[{]")
_JSON_TYPES = {
    "dict": "object",
    "list": "array",
    "str": "string",
    "int": "number",
    "float": "number",
    "bool": "boolean",
    "NoneType": "null",
}


def _unfence(text: str) -> str:
    """The inside of the first ````` fence (to its end or the text's end), if there is one."""
    match = _FENCE.search(text)
    return text if match is None else match.group(1)


def _json_items(body: str) -> tuple[list[object] | None, str | None]:
    """Every top-level JSON object in ``body``, and the elements of every top-level list that
    holds an object (so the complete objects of a truncated list are recovered). None if no such
    value was found, with the first decoding error if there was one."""
    decoder = json.JSONDecoder()
    items: list[object] = []
    found = False
    error: str | None = None
    pos = 0
    for _ in range(MAX_JSON_STARTS):
        match = _OPEN.search(body, pos)
        if match is None:
            break
        try:
            value, end = decoder.raw_decode(body, match.start())
        except (ValueError, RecursionError) as exc:  # ValueError: also over-long int literals
            error = error or _json_error(exc)
            pos = match.start() + 1
            continue
        value = _unwrap(value)
        if isinstance(value, list) and (not value or any(isinstance(v, dict) for v in value)):
            items.extend(value)
        elif isinstance(value, dict):
            items.append(value)
        else:
            pos = match.start() + 1
            continue
        found = True
        pos = end
    return (items if found else None), error


def _unwrap(value: object) -> object:
    """``{"operations": [...]}`` (or ``"ops"``) without an ``"op"`` key is its list."""
    if isinstance(value, dict) and "op" not in value:
        for key in ("operations", "ops"):
            if isinstance(value.get(key), list):
                return value[key]
    return value


def _json_error(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "invalid JSON: nested too deeply"
    return f"invalid JSON: {exc}"


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value).__name__, type(value).__name__)


def _json_piece(item: object, where: str) -> _Piece:
    if not isinstance(item, dict):
        return _Piece(where, "", error=f"expected an object, got {_json_type(item)}")
    op = item.get("op")
    if not isinstance(op, str):
        why = 'missing "op"' if op is None else f'"op" must be a string, got {_json_type(op)}'
        return _Piece(where, "", error=why)
    raw = item.get("ids", item.get("id"))
    ids: tuple[int, ...] | None = ()
    if isinstance(raw, int) and not isinstance(raw, bool):
        ids = (raw,)
    elif isinstance(raw, list) and all(_is_int(v) for v in raw):
        ids = tuple(raw)
    elif raw is not None:
        ids = None
    kind = op.strip().lower()
    if ids is None and kind != "return":
        return _Piece(where, kind, error=f"ids must be integers, got {_short(raw)}")
    content = item.get("content")
    if content is not None and not isinstance(content, str):
        return _Piece(where, kind, error=f"content must be a string, got {_json_type(content)}")
    return _Piece(where, kind, ids or (), content)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------------------------------------
# Lines


_MARKER = re.compile(r"(?:[-*•]|[0-9]{1,3}[.)])\s+")
_SHAPE = re.compile(r"([A-Za-z]+)(?![A-Za-z0-9_])\s*(?:[-+0-9][-+0-9,\s]*)?(?::|$)")
_WORD = re.compile(r"([A-Za-z]+)(?![A-Za-z0-9_])")
_INT = re.compile(r"[+-]?[0-9]{1,18}")
_WITH_IDS = re.compile(r"[A-Za-z]+\s+[-+]?[0-9][-+0-9,\s]*:")  # a word, ids, a colon


def _line_pieces(body: str, grammar: dict[str, _Form]) -> list[_Piece | str] | None:
    """One piece per non-blank line: a :class:`_Piece` for a line that starts with an operation
    word of ``grammar`` or has an operation's shape (a word, maybe ids, then ``:`` or the end of
    the line: an unknown operation), an error string for any other line (prose, not counted
    towards ``max_ops``); None if no line is an operation."""
    pieces: list[_Piece | str] = []
    any_op = False
    for n, raw in enumerate(body.splitlines(), 1):
        line = _line_body(raw)
        if not line:
            continue
        word = _WORD.match(line)
        kind = word.group(1).lower() if word is not None else ""
        if word is not None and kind in grammar:
            pieces.append(_line_piece(f"line {n}", kind, line[word.end() :], grammar[kind]))
        elif word is not None and _SHAPE.match(line):
            pieces.append(_Piece(f"line {n}", kind))
        else:
            pieces.append(f"line {n}: not an operation: {_short(line)}")
            continue
        any_op = True
    return pieces if any_op else None


def _line_body(raw: str) -> str:
    """A line of an answer without its surrounding spaces and its list marker (``-``, ``1.``)."""
    line = raw.strip()
    marker = _MARKER.match(line)
    return line[marker.end() :] if marker is not None else line


def _line_piece(where: str, kind: str, rest: str, form: _Form) -> _Piece:
    if kind == "return":
        return _Piece(where, kind)
    ids_text, colon, content = rest.partition(":")
    if form.content and not colon:
        usage = kind + (" <id>" if form.max_ids == 1 else " <ids>" if form.max_ids != 0 else "")
        return _Piece(where, kind, error=f"expected '{usage}: <text>'")
    tokens = [t for t in re.split(r"[\s,]+", ids_text.strip()) if t]
    if not all(_INT.fullmatch(t) for t in tokens):
        return _Piece(where, kind, error=f"ids must be integers, got {_short(ids_text.strip())}")
    ids = tuple(int(t) for t in tokens)
    return _Piece(where, kind, ids, content if form.content else None)
