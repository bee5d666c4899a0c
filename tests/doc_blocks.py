"""The fenced code blocks of a docs page, for tests and benches that run a page's worked
example as it stands (docs/ENVIRONMENTS.md's world, docs/METHODS.md's method)."""

from __future__ import annotations

import re
from pathlib import Path


def doc_block(doc: Path, first_line: str) -> str:
    """The one fenced ``python`` or ``toml`` block of ``doc`` whose first line is
    ``first_line``.

    Raises:
        ValueError: no such block, or more than one.
    """
    blocks = re.findall(r"```(?:python|toml)\n(.*?)```", doc.read_text(), flags=re.S)
    found = [b for b in blocks if b.startswith(first_line)]
    if len(found) != 1:
        raise ValueError(f"{doc}: {len(found)} blocks start with {first_line!r}, expected one")
    return found[0]
