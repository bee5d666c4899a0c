"""The fault sweeps' figures as a file: each test of ``make test-faults`` (``tests/faults`` and
the ``faults``-marked sweeps elsewhere) records what it did and saw here, so that the numbers
docs/RELIABILITY.md quotes can be regenerated rather than copied from a console.

The file is JSON, at ``$COEVO_FAULT_COUNTS`` (default ``runs/faults/counts.json`` under the
repository). Each test's entry, keyed by its pytest node id, replaces that test's previous one
and names the commit (and whether the tree had changes) it ran on; ``totals`` sums every
entry's counts. The keys, where they apply:

- ``stops``: signals sent to a run or a resume, or a run's failure (``stops_before_first_commit``:
  the stops that ended a resume before it had committed anything: the log stays as it was);
- ``lost``: stops after which the final log did not begin with the log as it was;
- ``duplicated``: facts recorded more than once in a final log (``resume_kit.duplicates``);
- ``abandoned``: episodes abandoned by a resume and run again;
- ``damaged_copies``, ``commands``, ``refused_one_line``, ``unaffected``: the log damage sweep
  (a command on a damaged copy refuses it in one line, or prints what it prints on the intact
  log);
- ``fuzz_cases``, ``fuzz_refused``: scenario files (and ``--set`` lines) validated by the fuzz
  (recorded only at ``COEVO_FUZZ_SCALE`` above 1, as ``make test-faults`` runs it);
- ``runs_at_once``, ``writers``: two runs started at once on one directory, and how many wrote;
- ``resumes_refused``: a second resume started while another one loads, refused;
- ``tracebacks``: outputs that held a Python traceback (a user would have seen it).

String values (a setting such as ``COEVO_FUZZ_SCALE``) are kept in the entry, not totalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENV = "COEVO_FAULT_COUNTS"
DEFAULT = ROOT / "runs" / "faults" / "counts.json"


def path() -> Path:
    """Where the counts go: ``$COEVO_FAULT_COUNTS``, else :data:`DEFAULT`."""
    return Path(os.environ.get(ENV) or DEFAULT)


def current_test() -> str:
    """The node id of the test running now (pytest sets ``PYTEST_CURRENT_TEST``)."""
    return os.environ.get("PYTEST_CURRENT_TEST", "unknown").rsplit(" (", 1)[0]


def _commit() -> tuple[str, bool]:
    """The checked-out commit and whether the working tree differs from it ("" if no git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, cwd=ROOT, check=True, timeout=30,
        ).stdout.strip()  # fmt: skip
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, cwd=ROOT, check=True, timeout=30,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):  # no git, or not a checkout: say nothing
        return "", False
    return head, bool(status.strip())


@contextlib.contextmanager
def _locked(file: Path) -> Iterator[None]:
    file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(file.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def record(test: str | None = None, **counts: int | float | str) -> dict[str, Any]:
    """Store ``counts`` as the entry of ``test`` (default: the running test), replacing its
    previous one, and recompute the totals.

    Returns:
        The whole file's contents after the update.
    """
    file = path()
    commit, dirty = _commit()
    entry = {
        "commit": commit,
        "dirty": dirty,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "counts": counts,
    }
    with _locked(file):
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none yet, or unreadable: start again
            data = {}
        tests: dict[str, Any] = data.get("tests", {})
        tests[test or current_test()] = entry
        totals: dict[str, float] = {}
        for item in tests.values():
            for key, value in item["counts"].items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    totals[key] = totals.get(key, 0) + value
        data = {
            "about": "written by make test-faults; see tests/faults/fault_counts.py",
            "totals": dict(sorted(totals.items())),
            "tests": dict(sorted(tests.items())),
        }
        tmp = file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        tmp.replace(file)
    return data
