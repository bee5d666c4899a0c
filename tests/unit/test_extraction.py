"""The extractor's prompts and the parsing of its answers (agents/memory/extraction.py): both
formats, partial and malformed answers with their exact errors, and never raising on any string."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.memory.extraction import (
    MAX_CONTENT_CHARS,
    Add,
    Discard,
    Merge,
    Parsed,
    Return,
    Rewrite,
    Update,
    extract_messages,
    merge_messages,
    parse_extraction,
    parse_merge,
    shown_ids,
    to_bank_ids,
)
from agents.models.prompts import reflection_messages

KNOWN = {3, 5}
CHUNK = {1, 2, 3, 4, 5}


def extract(text: str, **kwargs: object) -> Parsed:
    return parse_extraction(text, known_ids=KNOWN, **kwargs)  # type: ignore[arg-type]


def merge(text: str) -> Parsed:
    return parse_merge(text, chunk_ids=CHUNK)


# ---------------------------------------------------------------------------------------------
# prompts


def test_extract_messages_are_a_reflection_prompt_plus_the_entry_used() -> None:
    history = [("open door", "the door opens"), ("go hall", "you are in the hall")]
    messages = extract_messages(
        "boil water", "you are in the kitchen", history, success=False, entry="heat first"
    )
    reflection = reflection_messages("boil water", "you are in the kitchen", history, success=False)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == reflection[1]["content"] + "\nentry 1: heat first"
    assert messages[1]["content"].splitlines() == [
        "goal: boil water",
        "start: you are in the kitchen",
        "> open door",
        "the door opens",
        "> go hall",
        "you are in the hall",
        "outcome: failure",
        "entry 1: heat first",
    ]
    assert "at most 3 lines" in messages[0]["content"]


def test_extract_messages_without_an_entry_and_other_max_ops() -> None:
    messages = extract_messages("g", "s", [], success=True, entry=None, max_ops=2)
    assert messages[1]["content"] == "goal: g\nstart: s\noutcome: success\nentry: none"
    assert "at most 2 lines" in messages[0]["content"]
    with pytest.raises(ValueError, match="max_ops must be >= 1, got 0"):
        extract_messages("g", "s", [], success=True, entry=None, max_ops=0)


def test_merge_messages_list_the_chunk_by_position() -> None:
    messages = merge_messages(["take the key", "the key opens the box"])
    assert messages[1]["content"] == "entry 1: take the key\nentry 2: the key opens the box"
    assert "merge <ids>" in messages[0]["content"]
    with pytest.raises(ValueError, match="texts must not be empty"):
        merge_messages([])


def test_positions_named_by_an_answer_map_to_bank_ids() -> None:
    bank = [40, 17, 93]
    text = "merge 1,3: heat first\nrewrite 2: the key\nreturn"
    parsed = to_bank_ids(parse_merge(text, chunk_ids=shown_ids(3)), bank)
    assert parsed.ops == (Merge((40, 93), "heat first"), Rewrite(17, "the key"))
    parsed = to_bank_ids(parse_merge("discard 2", chunk_ids=shown_ids(3)), bank)
    assert parsed.ops == (Discard((17,)),)
    parsed = parse_extraction("update 1: x\nadd: y", known_ids=shown_ids(1), max_ops=3)
    assert to_bank_ids(parsed, [523]).ops == (Update((523,), "x"), Add("y"))
    refused = parse_extraction("update 523: x", known_ids=shown_ids(1), max_ops=3)
    assert refused.malformed and to_bank_ids(refused, [523]) == refused
    with pytest.raises(ValueError, match=r"id 4 was not shown \(1 .. 3\)"):
        to_bank_ids(replace(parsed, ops=(Discard((4,)),)), bank)


# ---------------------------------------------------------------------------------------------
# valid answers, both formats


def test_lines_valid() -> None:
    parsed = extract("add: heat the water first\nUPDATE 3, 5: open the door, then go")
    assert parsed == Parsed(
        ops=(Add("heat the water first"), Update((3, 5), "open the door, then go")),
        errors=(),
        malformed=False,
        syntax="lines",
    )


def test_lines_accept_list_markers_blank_lines_and_colons_in_content() -> None:
    parsed = extract("- add: note: keys open boxes\n\n2. update 3: x\n3) update 5 : y")
    assert parsed.ops == (Add("note: keys open boxes"), Update((3,), "x"), Update((5,), "y"))
    assert parsed.errors == ()


def test_json_valid_list_object_fence_and_embedded() -> None:
    ops = [{"op": "add", "content": "a"}, {"op": "update", "ids": [3, 5], "content": "b"}]
    expected = (Add("a"), Update((3, 5), "b"))
    for text in [
        json.dumps(ops),
        f"```json\n{json.dumps(ops, indent=2)}\n```",
        f"Here are my operations: {json.dumps(ops)} -- done.",
        json.dumps({"operations": ops}),
    ]:
        parsed = extract(text)
        assert (parsed.ops, parsed.errors, parsed.syntax) == (expected, (), "json"), text
    single = extract('{"op": "Update", "ids": 3, "content": " trimmed "}')
    assert single.ops == (Update((3,), "trimmed"),)
    assert extract('{"op": "update", "id": 5, "content": "c"}').ops == (Update((5,), "c"),)


def test_return_alone() -> None:
    for text in ["return", "RETURN: nothing new", '{"op": "return"}', '[{"op": "return"}]']:
        parsed = extract(text)
        assert (parsed.ops, parsed.errors, parsed.malformed) == ((Return(),), (), False), text


def test_return_with_other_operations_is_dropped() -> None:
    parsed = extract("add: a\nreturn")
    assert parsed.ops == (Add("a"),)
    assert parsed.errors == ("line 2: return among other operations, dropped",)
    parsed = extract("return\nreturn")
    assert parsed.ops == (Return(),)
    assert parsed.errors == ("line 2: duplicate return, dropped",)


def test_merge_lines_and_json() -> None:
    expected = (Merge((3, 5), "x"), Rewrite(4, "y"), Discard((1, 2)))
    lines = merge("merge 3,5: x\nrewrite 4: y\ndiscard 1 2: both stale")
    assert (lines.ops, lines.errors, lines.syntax) == (expected, (), "lines")
    text = json.dumps(
        [
            {"op": "MERGE", "ids": [3, 5], "content": "x"},
            {"op": "rewrite", "id": 4, "content": "y"},
            {"op": "discard", "ids": [1, 2]},
        ]
    )
    assert merge(text).ops == expected
    assert merge("return").ops == (Return(),)


# ---------------------------------------------------------------------------------------------
# partial answers: the valid operations are kept, each rejected piece gets one exact error


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("delete 3: x", "line 1: unknown operation 'delete'"),
        ("update 9: x", "line 1: id 9 is not a known entry"),
        ("update 3,3: x", "line 1: duplicate id 3"),
        ("update a,b: x", "line 1: ids must be integers, got 'a,b'"),
        ("update 3.5: x", "line 1: ids must be integers, got '3.5'"),
        ("update: x", "line 1: update needs at least 1 id, got 0"),
        ("update 3:   ", "line 1: empty content"),
        ("update 3 x", "line 1: expected 'update <ids>: <text>'"),
        ("add 3: x", "line 1: add takes no ids"),
        ("add heat it", "line 1: expected 'add: <text>'"),
        ("add: " + "x" * (MAX_CONTENT_CHARS + 1), "line 1: content has 1001 characters, over"),
        ('{"op": "delete", "ids": "x"}', "op 1: unknown operation 'delete'"),
        ('{"op": "update", "ids": ["3"], "content": "x"}', "op 1: ids must be integers, got ['3']"),
        ('{"op": "update", "ids": [true], "content": "x"}', "op 1: ids must be integers, got"),
        ('{"op": "update", "ids": [3.0], "content": "x"}', "op 1: ids must be integers, got"),
        ('{"op": "update", "ids": [3]}', 'op 1: missing "content"'),
        ('{"op": "add", "content": 7}', "op 1: content must be a string, got number"),
        ('{"op": 7}', 'op 1: "op" must be a string, got number'),
        ('{"content": "x"}', 'op 1: missing "op"'),
        ('[{"op": "add", "content": ""}]', "op 1: empty content"),
        ('[{"op": "update", "ids": [], "content": "x"}]', "op 1: update needs at least 1 id"),
    ],
)
def test_each_rejection_has_an_exact_error(text: str, error: str) -> None:
    # the same piece after a valid one: the valid one is kept, the bad one reported
    for answer in (text, _after_valid(text)):
        parsed = extract(answer)
        assert len(parsed.errors) == 1
        assert parsed.errors[0].startswith(_renumbered(error, answer is not text))
    alone = extract(text)
    assert (alone.ops, alone.malformed) == ((), True)
    partial = extract(_after_valid(text))
    assert (partial.ops, partial.malformed) == ((Add("ok"),), False)


def _after_valid(text: str) -> str:
    if text.startswith(("{", "[")):
        inner = text[1:-1] if text.startswith("[") else text
        return f'[{{"op": "add", "content": "ok"}}, {inner}]'
    return f"add: ok\n{text}"


def _renumbered(error: str, shifted: bool) -> str:
    if not shifted:
        return error
    return error.replace("line 1:", "line 2:").replace("op 1:", "op 2:")


def test_content_at_the_cap_is_kept() -> None:
    assert extract("add: " + "x" * MAX_CONTENT_CHARS).ops == (Add("x" * MAX_CONTENT_CHARS),)


def test_max_ops_drops_the_extra_operations_by_position() -> None:
    text = "add: a\nupdate 9: bad\nadd: b\nadd: c\nadd: d"
    parsed = extract(text)
    assert parsed.ops == (Add("a"), Add("b"))  # the invalid second one still counts
    assert parsed.errors == (
        "line 2: id 9 is not a known entry",
        "line 4: more than 3 operations, dropped",
        "line 5: more than 3 operations, dropped",
    )
    assert extract(text, max_ops=5).ops == (Add("a"), Add("b"), Add("c"), Add("d"))
    ops = json.dumps([{"op": "add", "content": str(i)} for i in range(4)])
    assert extract(ops).ops == (Add("0"), Add("1"), Add("2"))
    assert extract(ops).errors == ("op 4: more than 3 operations, dropped",)
    with pytest.raises(ValueError, match="max_ops must be >= 1, got 0"):
        extract("add: a", max_ops=0)


def test_lines_that_are_no_operation_are_reported_but_not_counted() -> None:
    parsed = extract("Sure, here you go:\nadd: a\nadd: b\nadd: c")
    assert parsed.ops == (Add("a"), Add("b"), Add("c"))
    assert parsed.errors == ("line 1: not an operation: 'Sure, here you go:'",)


def test_an_id_is_used_by_one_operation_only() -> None:
    parsed = extract("update 3: a\nupdate 5,3: b")
    assert parsed.ops == (Update((3,), "a"),)
    assert parsed.errors == ("line 2: id 3 already used by line 1",)
    parsed = merge("merge 1,2: a\ndiscard 2\nrewrite 3: c")
    assert parsed.ops == (Merge((1, 2), "a"), Rewrite(3, "c"))
    assert parsed.errors == ("line 2: id 2 already used by line 1",)
    # a rejected operation reserves nothing
    assert merge("merge 1,9: a\ndiscard 1").ops == (Discard((1,)),)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("merge 3: x", "line 1: merge needs at least 2 ids, got 1"),
        ("rewrite 3,4: x", "line 1: rewrite takes exactly 1 id, got 2"),
        ("rewrite: x", "line 1: rewrite takes exactly 1 id, got 0"),
        ("rewrite 4 x", "line 1: expected 'rewrite <id>: <text>'"),
        ("discard", "line 1: discard needs at least 1 id, got 0"),
        ("discard 9", "line 1: id 9 is not in the chunk"),
        ("discard 2,2", "line 1: duplicate id 2"),
        ("merge 1,2", "line 1: expected 'merge <ids>: <text>'"),
        ("add: x", "line 1: unknown operation 'add'"),
        (
            '{"op": "rewrite", "ids": [1, 2], "content": "x"}',
            "op 1: rewrite takes exactly 1 id, got 2",
        ),
        ('{"op": "merge", "ids": [1, 2]}', 'op 1: missing "content"'),
    ],
)
def test_merge_rejections(text: str, error: str) -> None:
    parsed = merge(text)
    assert (parsed.ops, parsed.errors, parsed.malformed) == ((), (error,), True)


def test_update_is_not_a_merge_operation_and_merge_not_an_extraction_one() -> None:
    assert extract("merge 3,5: x").errors == ("line 1: unknown operation 'merge'",)
    assert merge("update 3: x").errors == ("line 1: unknown operation 'update'",)


def test_truncated_json_keeps_the_complete_objects() -> None:
    text = '[{"op": "add", "content": "a"}, {"op": "update", "ids": [3], "content": "b"}, {"op'
    parsed = extract(text)
    assert parsed.ops == (Add("a"), Update((3,), "b"))
    assert parsed.errors == (
        "invalid JSON: Unterminated string starting at: line 1 column 80 (char 79)",
    )
    assert not parsed.malformed


def test_non_object_elements_of_a_json_list() -> None:
    parsed = extract('[{"op": "add", "content": "a"}, 7, "add: b"]')
    assert parsed.ops == (Add("a"),)
    assert parsed.errors == (
        "op 2: expected an object, got number",
        "op 3: expected an object, got string",
    )


# ---------------------------------------------------------------------------------------------
# malformed answers


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "empty output"),
        ("  \n\t ", "empty output"),
        ("```\n```", "empty output"),
        ("I think the agent should have opened the door.", "no operation found"),
        ("[]", "empty operation list"),
        ("[1, 2, 3]", "no operation found"),
        (
            '[{"op": "add", "cont',
            "invalid JSON: Unterminated string starting at: line 1 column 16 (char 15)",
        ),
        (
            '{"op": "add", "content": "a"',
            "invalid JSON: Expecting ',' delimiter: line 1 column 29 (char 28)",
        ),
        ("[" * 100_000, "invalid JSON: nested too deeply"),
    ],
)
def test_malformed(text: str, error: str) -> None:
    for parse in (extract, merge):
        assert parse(text) == Parsed(ops=(), errors=(error,), malformed=True, syntax="")


def test_an_answer_whose_every_operation_is_invalid_is_malformed() -> None:
    parsed = extract("update 9: x\nupdate 3: ")
    assert parsed.malformed and parsed.ops == ()
    assert parsed.errors == ("line 1: id 9 is not a known entry", "line 2: empty content")


def test_the_format_with_more_valid_operations_wins() -> None:
    # a stray list in prose decodes as JSON with no valid operation; the lines carry the answer
    parsed = extract('add: use [{"op": "x"}] carefully\nadd: b')
    assert parsed.syntax == "lines"
    assert parsed.ops == (Add('use [{"op": "x"}] carefully'), Add("b"))


# ---------------------------------------------------------------------------------------------
# never raises


def _check_never_raises(text: str) -> None:
    for parsed in (extract(text), merge(text), parse_extraction(text, known_ids=())):
        assert parsed.malformed == (parsed.ops == ())
        assert all(isinstance(e, str) and e for e in parsed.errors)
        if parsed.malformed:
            assert parsed.errors
        assert len([op for op in parsed.ops if not isinstance(op, Return)]) <= 5


_OP_LIKE = [
    *["add", "update", "return", "merge", "rewrite", "discard", "x", ":", ",", "3", "-1", " "],
    *["\n", "[", "]", "{", "}", '"op"', '"ids"', '"content"', '"add"', "```", "9" * 20],
]
_op_like = st.sampled_from(_OP_LIKE)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_never_raises_on_any_text(text: str) -> None:
    _check_never_raises(text)


@settings(max_examples=200, deadline=None)
@given(st.binary().map(lambda b: b.decode("utf-8", errors="replace")))
def test_never_raises_on_decoded_bytes(text: str) -> None:
    _check_never_raises(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(_op_like, max_size=40).map("".join))
def test_never_raises_on_operation_like_text(text: str) -> None:
    _check_never_raises(text)


def test_never_raises_on_huge_integers() -> None:
    digits = "1" * 5000  # past Python's int-from-string limit
    parsed = extract(f'[{{"op": "update", "ids": [{digits}], "content": "x"}}]')
    assert parsed.malformed
    assert parsed.errors[0].startswith("invalid JSON: Exceeds the limit")
    assert extract(f"update {digits}: x").errors == (
        "line 1: ids must be integers, got '" + digits[:36] + "...",
    )


@pytest.mark.parametrize(
    ("answer", "added"),
    [
        ("take the mug, then heat it in the oven", True),  # prose: a note
        ("Tip: open the oven first", True),  # a note under a heading
        ("Now: take the mug\nthen: heat it", True),
        ("update 7: a better tip", False),  # an entry it was not shown
        ("delete 3: the old one", False),  # an operation there is not
        ("add: ", False),  # an add without text
        ('[{"op": "update", "id": 9, "content": "x"}]', False),
        ("[]", False),
        ('[{"op": "add", "content": "trunc', False),  # JSON cut off
    ],
)
def test_plain_add_reads_notes_not_malformed_operations(
    monkeypatch: pytest.MonkeyPatch, answer: str, added: bool
) -> None:
    """plain_add stored any malformed answer as an entry ("update 7: better tip", a JSON
    list), where the docs promise that a malformed operation changes nothing and that only
    an answer with no operation syntax is read as one add."""
    from types import SimpleNamespace

    import agents.memory.extractor as extractor
    from agents.acting.inference import Reply
    from agents.events.extractor import ExtractionRequested

    reply = Reply(prompt=[1], ids=[2], logps=[-1.0], text=answer)
    monkeypatch.setattr(extractor, "write_replies", lambda *a, **k: [reply])
    model = SimpleNamespace(
        settings=extractor.ExtractorSettings(), backend=None, tokenizer=None,
        max_positions=64, version=0,
    )  # fmt: skip
    req = ExtractionRequested(
        episode="ep0", worker="w", slot="train/heat", entry=-1, messages=(("user", "?"),),
        success=True, score=1.0, seed=0,
    )  # fmt: skip
    (called,) = extractor.ExtractorModel.answer(model, [req], ["x0"])  # type: ignore[arg-type]
    assert (called.ops == (("add", (), answer),)) is added, called
    assert called.malformed is not added
