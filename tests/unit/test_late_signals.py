"""A SIGTERM outside the runtime's own handling (before a run's actors start, after they end)
while trio runs: trio holds it off its internals as it holds a Ctrl-C off them."""

from __future__ import annotations

import signal

import pytest
import trio

from scenarios.cli.drive import _trio_run_stoppable
from scenarios.cli.entry import Terminated, _terminate


@pytest.fixture
def command_line_handlers():
    """SIGTERM as the command line handles it (:mod:`scenarios.cli.entry`)."""
    saved = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, saved)


@pytest.mark.usefixtures("command_line_handlers")
def test_a_sigterm_in_trios_own_code_is_raised_after_it_not_inside_it() -> None:
    """The command line's handler raised ``Terminated`` wherever the process was: in trio's
    teardown (a SIGTERM as a run completed) that left the loop waiting for ever."""
    done: list[str] = []

    @trio.lowlevel.enable_ki_protection
    def critical() -> None:  # as trio's internals are
        signal.raise_signal(signal.SIGTERM)
        done.append("critical ran to its end")

    async def main() -> None:
        critical()
        await trio.sleep(0)
        done.append("the task went on past a checkpoint")

    with pytest.raises(Terminated):
        _trio_run_stoppable(main)
    assert done == ["critical ran to its end"]
    assert signal.getsignal(signal.SIGTERM) is _terminate  # the command line's again


@pytest.mark.usefixtures("command_line_handlers")
def test_a_run_that_ends_untouched_returns_its_result_and_a_ctrl_c_stays_one() -> None:
    async def answer() -> int:
        await trio.sleep(0)
        return 42

    assert _trio_run_stoppable(answer) == 42

    async def interrupted() -> None:
        signal.raise_signal(signal.SIGINT)
        await trio.sleep(0)

    with pytest.raises(KeyboardInterrupt) as info:
        _trio_run_stoppable(interrupted)
    assert not isinstance(info.value, Terminated)


def test_a_second_stop_signal_in_a_finaliser_prints_no_traceback() -> None:
    """A second Ctrl-C 0.15-0.4 s after the first landed in a trio nursery's ``__del__`` and
    Python printed "Exception ignored in ... KeyboardInterrupt" with a traceback (a double
    SIGTERM during a resume, in an import lock's callback). Any other exception a finaliser
    raises is still printed."""
    import subprocess
    import sys

    code = """
import scenarios.cli.commands as commands
from scenarios.cli import entry

class Finalised:
    def __init__(self, exc):
        self.exc = exc
    def __del__(self):
        raise self.exc

def main(argv):
    Finalised(entry.Terminated())  # collected at once: raised in its __del__
    Finalised(KeyboardInterrupt())
    Finalised(ValueError("a plug-in's own defect"))
    return 0

commands.main = main
entry.run([])
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "Terminated" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr
    assert proc.stderr.count("Exception ignored in") == 1, proc.stderr
    assert "ValueError: a plug-in's own defect" in proc.stderr
