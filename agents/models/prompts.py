"""What the policy reads and writes: the chat messages of a turn and of a reflection, and their
token ids.

One format serves every model. Messages are plain ``{"role", "content"}`` dicts rendered by the
tokenizer's own chat template: a local Hugging Face checkpoint brings its template; the embedded
default's tokenizer (:mod:`agents.models.embedded`) carries a small one of its own. A response (an
action, a reflection) is its text followed by the tokenizer's end-of-sequence token, so scoring
``"open box"`` never also scores ``"open box and ..."``.

Tips (EMPO2's memory, Complementary RL's experience entries) are appended, each on its own line
inside ``<tip> ... </tip>``, to the user message (the default) or to the system message: a
scenario's ``[prompt]`` table says which (``memory``), and sets the system message's text
(``system``). Rendering the same turn with ``tips=()`` gives the prompt with the tip lines removed,
which is what off-policy distillation trains on (:func:`strip_tips`).

A content is text. The only special tokens of a prompt are the ones the chat template writes
around the contents and the ``<tip>`` / ``</tip>`` around each shown tip (where the tokenizer
has such tokens, as the embedded default's has): a goal, an observation, an action or a tip that
holds the text of a special token (``<|im_end|>``, ``<eom>``) is tokenized as those characters
(:class:`PromptEncoder`, :func:`encode_response`). Otherwise a world could end the user's
message and write a system message of its own, or an action could end its own candidate early.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar, cast

from stores.model_dirs import END_IDS

T = TypeVar("T", bound=Sequence[int])

TIP_OPEN, TIP_CLOSE = "<tip>", "</tip>"
"""What stands before and after each tip a prompt shows."""

TURN_SYSTEM = "you act in a text lab to reach the goal. answer with one action."
REFLECT_SYSTEM = "you read an episode of a text lab and write a short note for the next try."

MemoryPlace = Literal["user", "system"]
"""The message a turn's tips are appended to."""

Message = Mapping[str, str]
Step = tuple[str, str]
"""One past turn as the policy sees it: (action, the observation that answered it)."""

SHOWN_CHARS = 8_000
"""The most characters of one text from the world (a goal, an observation) that a prompt
shows. A longer one keeps its first quarter and its last three quarters with a "..." line
(:data:`CUT_TEXT`) between them: the policy's position limit would cut the prompt's middle
anyway (:func:`cut_middle`), and a world that answers with hundreds of kilobytes made every
prompt of the window that long to record, tokenize and embed (a run twenty times slower)."""


class Tokenizer(Protocol):
    """The part of a ``transformers`` tokenizer that prompts use."""

    eos_token_id: int | None

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...


def turn_messages(
    goal: str,
    history: Sequence[Step],
    observation: str,
    *,
    admissible: Sequence[str] | None = None,
    tips: Sequence[str] = (),
    window: int = 4,
    system: str = TURN_SYSTEM,
    memory: MemoryPlace = "user",
) -> list[dict[str, str]]:
    """The messages that ask for the next action.

    Args:
        goal: the task's goal text.
        history: the episode's earlier turns, oldest first; only the last ``window`` are shown.
        observation: what the world said last (the first observation on turn 0). The goal and
            each observation show at most :data:`SHOWN_CHARS` characters (:func:`shown`).
        admissible: the actions to list in the prompt; None lists none (when the policy scores
            the admissible actions it does not need to read them).
        tips: memory entries to show, each inside ``<tip> ... </tip>``.
        window: how many past turns to show (0 shows none).
        system: the system message's text.
        memory: the message the tips are appended to.

    Returns:
        A system and a user message.

    Raises:
        ValueError: ``window`` is negative.
    """
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    lines = [f"goal: {shown(goal)}"]
    past = history[max(0, len(history) - window) :] if window else ()
    lines += [f"> {action}\n{shown(answer)}" for action, answer in past]
    lines.append(f"now: {shown(observation)}")
    if admissible is not None:
        lines.append(f"actions: {' | '.join(admissible)}")
    user = "\n".join(lines)
    if memory == "user":
        user += tip_lines(tips)
    else:
        system += tip_lines(tips)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]


def tip_line(tip: str) -> str:
    """The line that shows ``tip`` in a prompt."""
    return f"{TIP_OPEN} {tip} {TIP_CLOSE}"


def tip_lines(tips: Sequence[str]) -> str:
    """What :func:`turn_messages` appends to the memory message for ``tips``: a line each."""
    return "".join(f"\n{tip_line(tip)}" for tip in tips)


def state_text(goal: str, history: Sequence[Step], observation: str, *, window: int = 4) -> str:
    """The state of an episode as memory sees it: the user message of a turn without actions
    or tips (a retrieval's query, and the key a tip is stored under)."""
    return turn_messages(goal, history, observation, window=window)[1]["content"]


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` as a prompt shows it: as it is up to ``limit`` characters, else its first
    quarter and the rest of ``limit`` from its end, with :data:`CUT_TEXT` between them
    (:data:`SHOWN_CHARS`)."""
    if len(text) <= limit:
        return text
    head = (limit - len(CUT_TEXT)) // 4
    tail = limit - len(CUT_TEXT) - head
    return f"{text[:head]}{CUT_TEXT}{text[len(text) - tail :]}"


def strip_tips(
    messages: Sequence[Message], tips: Sequence[str], memory: MemoryPlace = "user"
) -> list[dict[str, str]]:
    """``messages`` as :func:`turn_messages` renders them with ``tips=()``: the tip lines that
    it appended to the ``memory`` message (the last, a user message, or the first, the system
    message) removed (EMPO2's off-policy input).

    Raises:
        ValueError: that message is not of its role or does not end with those tips' lines.
    """
    out = [dict(m) for m in messages]
    if not tips:
        return out
    suffix = tip_lines(tips)
    target = out[-1] if memory == "user" else out[0]
    if target["role"] != memory or not target["content"].endswith(suffix):
        where = "last" if memory == "user" else "first"
        raise ValueError(f"the {where} message is not a {memory} message ending with these tips")
    target["content"] = target["content"][: -len(suffix)]
    return out


def reflection_messages(
    goal: str,
    first_observation: str,
    history: Sequence[Step],
    *,
    success: bool,
    system: str = REFLECT_SYSTEM,
) -> list[dict[str, str]]:
    """The messages that ask for a note on a finished episode (every turn is shown).

    Args:
        goal: the task's goal text.
        first_observation: the observation after reset.
        history: every turn of the episode, oldest first.
        success: whether the episode reached its goal.
        system: the system message's text (the scenario's ``[prompt] reflect``).

    Returns:
        A system and a user message.
    """
    lines = [f"goal: {shown(goal)}", f"start: {shown(first_observation)}"]
    lines += [f"> {action}\n{shown(answer)}" for action, answer in history]
    lines.append(f"outcome: {'success' if success else 'failure'}")
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "\n".join(lines)},
    ]


Pairs = tuple[tuple[str, str], ...]
"""Messages as events record them: ``(role, content)`` pairs."""


def to_pairs(messages: Sequence[Message]) -> Pairs:
    """``messages`` as the ``(role, content)`` pairs an event records."""
    return tuple((m["role"], m["content"]) for m in messages)


def from_pairs(pairs: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    """The messages an event's ``(role, content)`` pairs record."""
    return [{"role": role, "content": content} for role, content in pairs]


def encode_prompt(
    tokenizer: Tokenizer,
    messages: Sequence[Message],
    tips: Sequence[str] = (),
    memory: MemoryPlace = "user",
) -> list[int]:
    """The token ids of ``messages`` followed by the assistant's turn header: one conversation
    of :meth:`PromptEncoder.encode` (``tips`` are the tips shown in the ``memory`` message).

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    return PromptEncoder(tokenizer, memory).encode([messages], [tips])[0]


def encode_response(tokenizer: Tokenizer, text: str) -> list[int]:
    """The token ids of a response: ``text`` (a special token's text in it is read as its
    characters) then end-of-sequence.

    Raises:
        ValueError: the tokenizer has no end-of-sequence token.
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token: responses could not end")
    ids = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    return [*ids, tokenizer.eos_token_id]


def special_ids(tokenizer: Any) -> dict[str, int]:
    """The texts ``tokenizer`` reads as one special token wherever they stand, with their ids
    (its special added tokens)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {t.content: int(i) for i, t in added.items() if getattr(t, "special", False)}


def end_ids(tokenizer: Any) -> frozenset[int]:
    """The ids a generated response ends at: the tokenizer's eos (the end of a turn, which
    :func:`encode_response` writes) and every other eos id the model's generation config
    names, as transformers' ``generate`` stops at each (a model loaded from a directory:
    :func:`stores.model_dirs.load_model_dir`)."""
    return frozenset({tokenizer.eos_token_id, *getattr(tokenizer, END_IDS, ())})


def decode_response(tokenizer: Any, ids: Sequence[int]) -> str:
    """The text of a response: ``ids`` up to the first end-of-message (:func:`end_ids`),
    specials dropped. A decoded hindsight note is the note itself, so
    :func:`agents.acting.scripted.parse_note` reads it the same."""
    ends = end_ids(tokenizer)
    ids = list(ids)
    ids = ids[: next((i for i, t in enumerate(ids) if t in ends), len(ids))]
    return tokenizer.decode(ids, skip_special_tokens=True)


def position_limit(model: Any) -> int | None:
    """The most positions ``model`` was built for (its config's ``max_position_embeddings``),
    or None when it does not say (a remote backend with no local module)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None


def prompt_room(limit: int, reserve: int) -> int:
    """The most prompt tokens that leave ``reserve`` positions (a response) of ``limit``; at
    least half of ``limit``, so a reserve near the limit still leaves a prompt to read."""
    return max(limit - reserve, limit // 2)


def cut_middle(ids: Sequence[int], room: int, gap: Sequence[int] = ()) -> tuple[list[int], int]:
    """``ids`` in at most ``room`` tokens, and how many were left out.

    A prompt that does not fit loses its middle: the first quarter of ``room`` is kept (the
    system message and the goal) and the rest is taken from the end (the latest observation
    and the assistant's header, which the next token follows), with ``gap`` (the ids of a
    visible "..." line) between them. A prompt that fits is returned as it is.

    Raises:
        ValueError: ``room`` is smaller than ``gap`` plus two tokens.
    """
    ids = list(ids)
    if len(ids) <= room:
        return ids, 0
    if room < len(gap) + 2:
        raise ValueError(f"room for {room} prompt tokens cannot hold a cut prompt")
    head = (room - len(gap)) // 4 or 1
    tail = room - len(gap) - head
    return [*ids[:head], *gap, *ids[len(ids) - tail :]], len(ids) - head - tail


CUT_TEXT = "\n...\n"
"""What stands where a cut prompt's middle was (:func:`cut_middle`'s ``gap``, tokenized)."""


def cut_gap(tokenizer: Any) -> list[int]:
    """The ids that stand where a cut prompt's middle was (:data:`CUT_TEXT`)."""
    return list(tokenizer.encode(CUT_TEXT, add_special_tokens=False))


def scoring_room(candidates: Sequence[T], limit: int) -> tuple[list[T], int]:
    """A "score" request's candidates in ``limit`` positions: each keeps at most half of them
    (its first tokens; one that fits is the same object), and the room left for the prompt
    beside the longest (:func:`prompt_room`)."""
    half = limit // 2
    cands = [c if len(c) <= half else cast(T, c[:half]) for c in candidates]
    return cands, prompt_room(limit, max(map(len, cands), default=0))


def fit_scoring(
    prompt: Sequence[int], candidates: Sequence[T], limit: int, gap: Sequence[int] = ()
) -> tuple[list[int], list[T]]:
    """A "score" request in ``limit`` positions, as the inference actor cuts it
    (:func:`scoring_room`, then the prompt loses its middle, :func:`cut_middle`). What fits is
    returned as it is."""
    cands, room = scoring_room(candidates, limit)
    return cut_middle(prompt, room, gap)[0], cands


def fit_sample(
    prompt: Sequence[int], response: Sequence[int], limit: int, gap: Sequence[int] = ()
) -> tuple[list[int], list[int], bool]:
    """A (prompt, response) pair of a training sample in ``limit`` positions, cut as inference
    cuts what it is asked: a response longer than half of them keeps that many tokens (its
    first ones and its last, the end of the message), and the prompt loses its middle
    (:func:`cut_middle`) to leave the response its room. A pair that fits is returned as it
    is; the flag says whether anything was cut."""
    prompt, response = list(prompt), list(response)
    if len(prompt) + len(response) <= limit:
        return prompt, response, False
    if len(response) > limit // 2:
        response = [*response[: limit // 2 - 1], response[-1]]
    prompt, _ = cut_middle(prompt, prompt_room(limit, len(response)), gap)
    return prompt, response, True


_MARK = "\x1ecoevo-content-{}\x1e"
_PROBES = ("", " two  words \n and a line ", "{{ braces }} {% raw %} 'quotes' \"too\"\t")


class PromptEncoder:
    """The token ids of conversations followed by the assistant's turn header, a batch at a
    time.

    The chat template is rendered once per sequence of roles, with a marker for each content;
    if the rendering is then exactly the marked text with each marker replaced by its content
    (checked on probe contents: empty, with surrounding spaces, newlines, braces and quotes),
    later conversations with those roles are written by that replacement, not by the template.
    A template that changes contents (trims them, say) fails the check and renders every
    conversation itself. A template whose output depends on what a content says (not only on
    the roles) would not be caught by the check: this encoder is for templates that place the
    contents as they are (the embedded model's, and Qwen2's or Llama's plain messages).

    A content is text: where one holds the text of one of the tokenizer's special tokens that
    is not a tip's ``<tip>`` or ``</tip>`` (:func:`tip_line`), the conversation is tokenized
    in pieces, the template's special tokens (and the tips') as themselves and the text between
    them with the special tokens' texts read as characters. A conversation whose contents hold
    no such text is tokenized whole, as the tokenizer reads the rendered text (the same ids as
    before contents were checked).

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        memory: the message the tips shown are appended to (:func:`turn_messages`).
    """

    def __init__(self, tokenizer: Any, memory: MemoryPlace = "user") -> None:
        self.tokenizer = tokenizer
        self.memory = memory
        self._layouts: dict[tuple[str, ...], tuple[str, ...] | None] = {}
        self._specials = special_ids(tokenizer)
        texts = sorted(self._specials, key=len, reverse=True)  # the longest where two start
        self._find = re.compile("|".join(map(re.escape, texts))) if texts else None

    def encode(
        self,
        conversations: Sequence[Sequence[Message]],
        tips: Sequence[Sequence[str]] | None = None,
    ) -> list[list[int]]:
        """The ids of each conversation, in order; ``tips[k]`` are the tips the ``k``-th shows
        (None: none shows any).

        Raises:
            ValueError: the tokenizer has no chat template; ``tips`` is not one per
                conversation.
        """
        if not conversations:
            return []
        if tips is not None and len(tips) != len(conversations):
            raise ValueError(f"{len(tips)} tip lists for {len(conversations)} conversations")
        pieces = [self._pieces(c, tips[k] if tips else ()) for k, c in enumerate(conversations)]
        whole = [p for p in pieces if isinstance(p, str)]
        texts = [t for p in pieces if not isinstance(p, str) for t in p if isinstance(t, str)]
        done = iter(self._tokenize(whole))
        split = iter(self._tokenize(texts, split_special_tokens=True))
        out: list[list[int]] = []
        for p in pieces:
            if isinstance(p, str):
                out.append(next(done))
                continue
            ids: list[int] = []
            for t in p:
                ids += next(split) if isinstance(t, str) else [t]
            out.append(ids)
        return out

    def _tokenize(self, texts: list[str], **kwargs: Any) -> list[list[int]]:
        if not texts:  # the tokenizer refuses an empty batch
            return []
        rows = self.tokenizer(texts, add_special_tokens=False, verbose=False, **kwargs)
        return [list(row) for row in rows["input_ids"]]

    def _pieces(self, conversation: Sequence[Message], tips: Sequence[str]) -> str | list:
        """The rendered conversation: its text when no content holds a special token's text
        that is not a tip's own, else its pieces: text to read as characters, and the ids of
        the special tokens the template and the tips place."""
        forged = self._forged(conversation, tips)
        if not any(forged):
            return self.render(conversation)
        mark = "\ue000"  # stands for each forged text while the template renders
        while any(mark in m["content"] for m in conversation):
            mark += "\ue000"
        marked, found = [], []
        for m, spans in zip(conversation, forged, strict=True):
            content, kept, last = m["content"], [], 0
            for a, b in spans:
                kept += (content[last:a], mark)
                found.append(content[a:b])
                last = b
            marked.append({**m, "content": "".join([*kept, content[last:]])})
        rendered = self.render(marked)
        if rendered.count(mark) != len(found):
            raise ValueError("the chat template changed a content's text: cannot place it")
        back = iter(found)

        def text(a: int, b: int) -> str:  # the forged texts back in place of their marks
            first, *rest = rendered[a:b].split(mark)
            return first + "".join(next(back) + part for part in rest)

        assert self._find is not None  # it found the forged texts
        out: list[str | int] = []
        last = 0
        for match in self._find.finditer(rendered):
            out += (text(last, match.start()), self._specials[match.group()])
            last = match.end()
        out.append(text(last, len(rendered)))
        return [p for p in out if p != ""]

    def _forged(
        self, conversation: Sequence[Message], tips: Sequence[str]
    ) -> list[list[tuple[int, int]]]:
        """For each message, where its content holds a special token's text that is not one
        of the ``tips``' own ``<tip>`` and ``</tip>`` (start and end offsets)."""
        if self._find is None:
            return [[] for _ in conversation]
        where = len(conversation) - 1 if self.memory == "user" else 0
        out = []
        for i, m in enumerate(conversation):
            content = m["content"]
            own = _tip_marks(content, tips) if i == where and tips else {}
            out.append(
                [
                    match.span()
                    for match in self._find.finditer(content)
                    if own.get(match.start()) != match.group()
                ]
            )
        return out

    def render(self, conversation: Sequence[Message]) -> str:
        """The text the chat template makes of ``conversation`` with the assistant's header."""
        roles = tuple(m["role"] for m in conversation)
        if roles not in self._layouts:
            self._layouts[roles] = self._layout(roles)
        parts = self._layouts[roles]
        if parts is None:
            return self._template(conversation)
        out = [parts[0]]
        for m, part in zip(conversation, parts[1:], strict=True):
            out += (m["content"], part)
        return "".join(out)

    def _template(self, conversation: Sequence[Message]) -> str:
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in conversation], add_generation_prompt=True, tokenize=False
        )

    def _layout(self, roles: tuple[str, ...]) -> tuple[str, ...] | None:
        """The text around each content, or None if the template does not keep contents as
        they are."""
        marks = [_MARK.format(k) for k in range(len(roles))]
        text = self._template(
            [{"role": r, "content": m} for r, m in zip(roles, marks, strict=True)]
        )
        parts: list[str] = []
        for mark in marks:
            before, found, text = text.partition(mark)
            if not found or mark in text:
                return None
            parts.append(before)
        parts.append(text)
        for probe in _PROBES:
            contents = [f"{probe}{k}" for k in range(len(roles))]
            expected = parts[0] + "".join(c + p for c, p in zip(contents, parts[1:], strict=True))
            messages = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)]
            if self._template(messages) != expected:
                return None
        return tuple(parts)


def _tip_marks(content: str, tips: Sequence[str]) -> dict[int, str]:
    """Where ``content``'s tip lines (it ends with them, one per tip) have their ``<tip>`` and
    ``</tip>``: offset -> text; none if it does not end with those lines."""
    suffix = tip_lines(tips)
    if not content.endswith(suffix):
        return {}
    marks, at = {}, len(content) - len(suffix)
    for tip in tips:
        marks[at + 1] = TIP_OPEN
        at += 1 + len(tip_line(tip))
        marks[at - len(TIP_CLOSE)] = TIP_CLOSE
    return marks
