"""Processes as tests see them, from Linux's ``/proc``: whether one still runs, and a
process's children (a run's learner process, say)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["alive", "children"]


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie nobody reaped yet counts as ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found
