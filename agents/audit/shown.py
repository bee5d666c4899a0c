"""How a world's text (and a run's path) is shown to a reader: on a terminal, in a page, as a
word of a command to paste. Light to import: every command's messages use it."""

from __future__ import annotations


def safe_line(line: str, keep: str = "") -> str:
    """``line`` with every character a terminal would act on or a reader could not see
    (escape sequences, bell, carriage return, a line break inside a world's goal or action,
    C1 controls, right-to-left overrides, zero-width and other format characters, spaces
    other than the space) written as its escape (``\\x1b``, ``\\u202e``): the texts come from a
    world. ``keep``: characters left as they are (a page's text blocks keep line breaks and
    tabs)."""
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in line)


def pasteable(path: object) -> str:
    """``path`` as one word of a command to paste into a shell: quoted when it needs it
    (``runs/my run``), and ``./-ins`` for ``-ins``, which no option parser takes for an
    option."""
    import shlex

    text = str(path)
    return shlex.quote(f"./{text}" if text.startswith("-") else text)
