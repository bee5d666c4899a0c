"""How a world's text (and a run's path) is shown to a reader: on a terminal, in a page, as a
word of a command to paste. Light to import: every command's messages use it."""

from __future__ import annotations

import unicodedata

HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Zs"})
"""The Unicode categories a reader cannot see, or a terminal acts on: controls, format
characters (a right-to-left override, a zero-width space), surrogates, and separators (every
space but the space itself is shown escaped). Characters this Python's Unicode data does not
know (an emoji newer than it, "Cn") and private-use ones ("Co") are shown as they are."""


def hidden(c: str) -> bool:
    """Whether the character ``c`` is one :data:`HIDDEN` covers (the space is not)."""
    return c != " " and unicodedata.category(c) in HIDDEN


def safe_line(line: str, keep: str = "") -> str:
    """``line`` with every character a terminal would act on or a reader could not see
    (:func:`hidden`: escape sequences, bell, carriage return, a line break inside a world's
    goal or action, C1 controls, right-to-left overrides, zero-width and other format
    characters, spaces other than the space) written as its escape (``\\x1b``, ``\\u202e``):
    the texts come from a world. ``keep``: characters left as they are (a page's text blocks
    keep line breaks and tabs)."""
    if line.isprintable():
        return line
    return "".join(repr(c)[1:-1] if hidden(c) and c not in keep else c for c in line)


def pasteable(path: object) -> str:
    """``path`` as one word of a command to paste into a shell: quoted when it needs it
    (``runs/my run``), ``./-ins`` for ``-ins`` (no option parser takes it for an option), and
    in bash's ``$'...'`` form when it holds a character :func:`safe_line` escapes (an ESC),
    so that the escaped word still names the path."""
    import shlex

    text = str(path)
    text = f"./{text}" if text.startswith("-") else text
    if not any(map(hidden, text)):
        return shlex.quote(text)
    out = []
    for c in text:
        if c in "\\'":
            out.append("\\" + c)
        elif hidden(c):
            n = ord(c)
            out.append(
                f"\\x{n:02x}" if n < 0x80 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"
            )
        else:
            out.append(c)
    return "$'" + "".join(out) + "'"


def purpose_text(purpose: str, scope: str) -> str:
    """An episode's purpose as a reader needs it: an adaptation test's episodes are evaluation
    episodes too, told apart from an evaluation round's by their memory's scope
    (``eval (adapt2-t5)``: the test of evaluation round 2, its sixth task; the round's
    ``adapt_round_finished`` names the policy version it tested)."""
    return f"{purpose} ({scope})" if scope.startswith("adapt") else purpose


def unused_text(end: str) -> str:
    """What a credit no update used (or an update not applied) shows, in a run whose last
    session ended ``end`` (:attr:`~agents.audit.answers.TipAudit.run_end`; "": it is running,
    or was killed, so one may still come): the terminal's audit and the browser's page say
    the same."""
    return f"none (the run {end} first)" if end else "not yet"


def update_text(update: int) -> str:
    """Which update trained an episode's group: "update N", or, for a warm-up step's group
    (``update`` < 0), that none did; the terminal's audit and the browser's page say the
    same."""
    return f"update {update}" if update >= 0 else "a warm-up step, not trained"


def number_text(x: float | None, digits: int = 3, width: int = 0, sign: str = "+") -> str:
    """``x`` signed to ``digits`` decimals ("-" for None; from a million on, in scientific
    notation); a value that rounds to zero is "+0.000", never "-0.000". ``sign=""``: a
    negative value's sign only."""
    if x is None:
        return "-".rjust(width)
    if abs(x) >= 1e6:  # a rule's 1e300: its 300 digits are no row
        return f"{x:{sign}.{digits}e}".rjust(width)
    shown = f"{x:{sign}.{digits}f}"
    if float(shown) == 0:
        shown = f"{0.0:{sign}.{digits}f}"
    return shown.rjust(width)


def score_text(x: float | None) -> str:
    """A world's score or reward as a reader sees it: two decimals at ordinary sizes, three
    significant digits past them (1e+100, not 101 digits; 5e-324, not 0.00); "-" for none."""
    if x is None:
        return "-"
    if x == 0:  # -0.0 too
        return "0.00"
    if 0.01 <= abs(x) < 1e6:
        return f"{x:.2f}"
    return f"{x:.3g}"
