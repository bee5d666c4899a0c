"""Packing scoring requests into the rows of one forward pass.

A request is a prompt and its candidate responses. Each candidate must see the prompt and
itself, never another candidate, at the positions it would have after the prompt alone; so the
prompt is stored once and every candidate after it, under a block mask (as in GLAM).

Requests share rows too. Their prompts are sorted, so that prompts with a common beginning (the
system message and chat template every prompt starts with; a task's goal and first observation,
which a GRPO group's episodes share) are neighbours, and a row is filled in that order: a
request stores only what its prompt does not share with the one before it in the row, and its
tokens attend to the shared places as to their own. A row is as wide as the longest request;
one that would overflow starts the next row.

Every token of a request sees exactly the tokens, at exactly the positions, it would see alone in
a row of its own, so the scores are the same numbers up to the order of floating-point sums (the
attention's sums run over a row's places, and where a request's places are in its row changes how
they are grouped): equal to about float32's rounding, not bit for bit (``tests/unit/
test_packing.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

Ids = Sequence[int]


@dataclass(frozen=True, slots=True)
class Packed:
    """Requests (a prompt and its candidates each) packed into rows.

    Attributes:
        input_ids: (B, L) token ids, right-padded.
        attention: (B, 1, L, L) additive float mask (0 where attention is allowed).
        positions: (B, L) position ids (each request's as if it were alone).
        rows, at, tokens: for every candidate token, its row, the place whose logits predict
            it, and the token id; each (N,).
        owner: (N,) the flat index, over every request's candidates in request order, of the
            candidate each token belongs to.
        counts: the number of candidates of each request, in request order.
    """

    input_ids: torch.Tensor
    attention: torch.Tensor
    positions: torch.Tensor
    rows: torch.Tensor
    at: torch.Tensor
    tokens: torch.Tensor
    owner: torch.Tensor
    counts: tuple[int, ...]


def request_lengths(prompts: Sequence[Ids], candidates: Sequence[Sequence[Ids]]) -> list[int]:
    """The places each request takes in a row of its own: its prompt and every candidate.

    Raises:
        ValueError: the lengths differ, a prompt is empty, a candidate list is empty or a
            candidate is empty.
    """
    if len(prompts) != len(candidates):
        raise ValueError(f"{len(prompts)} prompts but {len(candidates)} candidate lists")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt must have at least one token")
    if any(not cands or any(len(c) == 0 for c in cands) for cands in candidates):
        raise ValueError("every request needs at least one non-empty candidate")
    pairs = zip(prompts, candidates, strict=True)
    return [len(p) + sum(len(c) for c in cands) for p, cands in pairs]


def _shared(a: Ids, b: Ids) -> int:
    """The length of the common beginning of ``a`` and ``b``."""
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


Span = tuple[int, int]
"""Places ``[start, end)`` of a row."""


def _prefix(spans: Sequence[Span], depth: int) -> list[Span]:
    """The spans holding a prompt's first ``depth`` tokens (``spans`` hold all of it, in
    order)."""
    out: list[Span] = []
    left = depth
    for start, end in spans:
        if left <= 0:
            break
        out.append((start, min(end, start + left)))
        left -= end - start
    return out


@dataclass
class _Row:
    """A row being filled: its ids, positions and mask rows, and the last prompt's spans."""

    width: int
    ids: list[int]
    positions: list[int]
    allowed: np.ndarray  # (width, width) bool
    last: Ids = ()
    last_spans: tuple[Span, ...] = ()

    def place(self, seen: Sequence[Span], ids: Ids, first_position: int) -> int:
        """Append ``ids`` attending to the places ``seen`` and causally to themselves; return
        where they start."""
        start, n = len(self.ids), len(ids)
        self.ids += ids
        self.positions += range(first_position, first_position + n)
        for a, b in seen:
            self.allowed[start : start + n, a:b] = True
        self.allowed[start : start + n, start : start + n] = np.tri(n, dtype=bool)
        return start


def assign(prompts: Sequence[Ids], lengths: Sequence[int], width: int) -> list[list[int]]:
    """Which requests share each row, each row's in prompt order.

    Prompts are sorted; ``common`` is what they all begin with. A run of neighbours that share
    more than ``common`` with the one before is an item (cut where it would not fit a row);
    items go, first fit by decreasing size, into rows of ``width`` places, each counted as if
    it shared only ``common`` with the rest of its row: an upper bound, since in a row in
    prompt order every request shares at least that with the one before.

    Raises:
        ValueError: a request is longer than ``width``.
    """
    if max(lengths) > width:
        raise ValueError(f"a request of {max(lengths)} places does not fit a row of {width}")
    order = sorted(range(len(prompts)), key=lambda i: (list(prompts[i]), i))
    common = _shared(prompts[order[0]], prompts[order[-1]])
    items: list[tuple[int, list[int]]] = []  # (places beyond the common part, requests)
    for prev, i in zip([None, *order], order, strict=False):
        shared = _shared(prompts[prev], prompts[i]) if prev is not None else 0
        size, members = items[-1] if items else (0, [])
        if shared > common and size + lengths[i] - shared <= width - common:
            items[-1] = (size + lengths[i] - shared, [*members, i])
        else:
            items.append((lengths[i] - common, [i]))
    free: list[int] = []  # per row: places left
    rows: list[list[int]] = []
    for size, members in sorted(items, key=lambda it: -it[0]):
        r = next((r for r, f in enumerate(free) if f >= size), len(free))
        if r == len(free):
            free.append(width - common)
            rows.append([])
        free[r] -= size
        rows[r] += members
    rank = {i: k for k, i in enumerate(order)}
    return [sorted(row, key=rank.__getitem__) for row in rows]


def pack(prompts: Sequence[Ids], candidates: Sequence[Sequence[Ids]], pad_id: int) -> Packed:
    """Pack requests into rows as the module docstring describes (rows by :func:`assign`, as
    wide as the longest request).

    Raises:
        ValueError: the lengths differ, a prompt is empty, a candidate list is empty or a
            candidate is empty.
    """
    lengths = request_lengths(prompts, candidates)
    width = max(lengths)
    first_candidate = np.cumsum([0, *(len(c) for c in candidates)])
    rows: list[_Row] = []
    scored: list[tuple[int, int, int, int]] = []  # (row, place, token, owner) per token
    for members in assign(prompts, lengths, width):
        row = _Row(width, [], [], np.zeros((width, width), dtype=bool))
        rows.append(row)
        for i in members:
            prompt, cands = prompts[i], candidates[i]
            shared = _shared(row.last, prompt)
            spans = _prefix(row.last_spans, shared)
            if shared < len(prompt):
                start = row.place(spans, prompt[shared:], shared)
                spans.append((start, start + len(prompt) - shared))
            row.last, row.last_spans = prompt, tuple(spans)
            last = spans[-1][1] - 1  # the place of the prompt's last token
            for k, cand in enumerate(cands):
                start = row.place(spans, cand, len(prompt))
                owner = int(first_candidate[i]) + k
                for t, token in enumerate(cand):
                    scored.append((len(rows) - 1, last if t == 0 else start + t - 1, token, owner))
        assert len(row.ids) <= width, "assign() bounds every row's places"
    return _tensors(rows, scored, pad_id, tuple(len(c) for c in candidates))


def pack_rows(prompts: Sequence[Ids], candidates: Sequence[Sequence[Ids]], pad_id: int) -> Packed:
    """One request per row, its prompt and then its candidates, nothing shared: the layout
    scoring used before :func:`pack` (coevo before 2026-12-01), kept so that the updates of
    logs written then re-execute bit for bit (``GradientRequested.scoring == "rows"``).

    Raises:
        ValueError: as :func:`pack`.
    """
    lengths = request_lengths(prompts, candidates)
    width = max(lengths)
    rows: list[_Row] = []
    scored: list[tuple[int, int, int, int]] = []
    owner = 0
    for i, (prompt, cands) in enumerate(zip(prompts, candidates, strict=True)):
        row = _Row(width, [], [], np.zeros((width, width), dtype=bool))
        rows.append(row)
        row.place((), prompt, 0)
        for cand in cands:
            start = row.place(((0, len(prompt)),), cand, len(prompt))
            for t, token in enumerate(cand):
                scored.append((i, len(prompt) - 1 if t == 0 else start + t - 1, token, owner))
            owner += 1
    return _tensors(rows, scored, pad_id, tuple(len(c) for c in candidates))


def _tensors(
    rows: Sequence[_Row],
    scored: Sequence[tuple[int, int, int, int]],
    pad_id: int,
    counts: tuple[int, ...],
) -> Packed:
    width = rows[0].width
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    positions = np.zeros((len(rows), width), dtype=np.int64)
    allowed = np.stack([row.allowed for row in rows])  # (B, L, L)
    for b, row in enumerate(rows):
        ids[b, : len(row.ids)] = row.ids
        positions[b, : len(row.positions)] = row.positions
        pad = np.arange(len(row.ids), width)
        allowed[b, pad, pad] = True  # padding sees itself: no row of the mask is empty (no NaN)
    attention = torch.zeros((len(rows), 1, width, width), dtype=torch.float32)
    attention.masked_fill_(~torch.from_numpy(allowed)[:, None], torch.finfo(attention.dtype).min)
    row_of, at, tokens, owner = (torch.tensor(col) for col in zip(*scored, strict=True))
    return Packed(
        input_ids=torch.from_numpy(ids),
        attention=attention,
        positions=torch.from_numpy(positions),
        rows=row_of,
        at=at,
        tokens=tokens,
        owner=owner,
        counts=counts,
    )
