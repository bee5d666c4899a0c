"""The ``coevo`` process's entry (``scenarios.cli.entry.run``): an interrupt at any moment ends
with one line and exit 130, under ``python -m`` as under the console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ESCAPED = """
import scenarios.cli.commands as cli

command_line = cli.main


def main(argv=None):
    code = command_line(argv)
    try:  # what a Ctrl-C during a dataclass's or namedtuple's creation leaves behind
        exec("raise KeyboardInterrupt")
    except KeyboardInterrupt:
        pass
    return code


cli.main = main
"""

IMPORT_INTERRUPTED = """
import builtins

real = builtins.__import__

def interrupted(name, *args, **kwargs):
    if name == "scenarios.cli.commands":
        raise KeyboardInterrupt
    return real(name, *args, **kwargs)

builtins.__import__ = interrupted
"""


def run_module(tmp_path: Path, prelude: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m entry ARGS``, where module ``entry`` runs ``prelude`` then the console."""
    (tmp_path / "entry.py").write_text(prelude + "\nfrom scenarios.cli.entry import run\n\nrun()\n")
    return subprocess.run(
        [sys.executable, "-m", "entry", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_interrupt_caught_after_it_escaped_an_exec_does_not_end_the_process_by_sigint(
    tmp_path: Path,
) -> None:
    """CPython marks such an interrupt unhandled and, under ``python -m``, would end the
    process by SIGINT (-2) whatever its exit code; the console clears the mark."""
    done = run_module(tmp_path, ESCAPED, "validate", "scenarios/quickstart.toml")
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    bad = run_module(tmp_path, ESCAPED, "validate", "no-such.toml")
    assert bad.returncode == 2 and bad.stderr.startswith("coevo: error:"), bad.stderr


def test_an_interrupt_while_the_command_line_imports_is_one_line_and_130(tmp_path: Path) -> None:
    done = run_module(tmp_path, IMPORT_INTERRUPTED, "validate", "scenarios/quickstart.toml")
    assert (done.returncode, done.stderr) == (130, "coevo: interrupted\n")


@pytest.mark.parametrize("command", [["coevo"], [sys.executable, "-m", "scenarios.cli"]])
def test_both_entries_run_the_command_line(command: list[str]) -> None:
    script = Path(sys.executable).parent / "coevo"
    if command == ["coevo"]:
        if not script.is_file():
            pytest.skip("the console script is not installed beside this interpreter")
        command = [str(script)]
    done = subprocess.run(
        [*command, "validate", "no-such.toml"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stderr.startswith("coevo: error:"), done.stderr
