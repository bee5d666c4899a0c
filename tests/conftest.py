"""What every test session shares: the Hypothesis profiles, and in CI, no unexpected skips.

Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE`` (the Makefile sets it; unset: Hypothesis'
own default). They are loaded here, before the test modules build their ``settings(...)``, which
inherit every value they do not set:

- ``ci`` (``make test``, ``make test-slow``): the same examples every run (derandomized), no
  deadline (a loaded 2-core machine must not fail a test for being slow), no example database,
  and the blob that reproduces a failure printed with it.
- ``faults`` (``make test-faults``): random examples, ten times Hypothesis' default number where a
  test does not set its own, no deadline; failures are kept in ``.hypothesis/`` and replayed first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "faults",
    max_examples=1000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

EXPECTED_SKIPS: dict[str, str] = {}
"""The skip reasons CI accepts, each with why it is expected there. Any other skip fails a session
run with ``CI`` set (``.ci/run`` runs with ``CI=true``): a test that skips in CI checks nothing,
and a missing dependency must not pass for a green run. Empty: on CI's machine (Linux, root,
``make install-envs`` for the ScienceWorld and TextWorld extras, and Java and Chromium installed
by ``.ci/run``) every test of the suite runs. A reason is matched exactly, as ``-rs`` prints it
(e.g. ``"needs a CUDA device"`` for a test that can only run on an accelerator)."""

_UNEXPECTED = pytest.StashKey[list[str]]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the session's Ray instance run first, in their order. They run in a pytest
    process of their own (tests/integration/test_ray_backend.py: in a whole suite's process
    ``ray.init`` aborts), where this keeps them ahead of anything else collected there."""
    items.sort(key=lambda item: "ray_address" not in getattr(item, "fixturenames", ()))


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Shut the session's Ray instance down after the last test that uses it, so that it does
    not run beside the rest of the suite."""
    uses = "ray_address" in getattr(item, "fixturenames", ())
    if uses and "ray_address" not in getattr(nextitem, "fixturenames", ()):
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """One local Ray instance shared by the session's Ray tests, started on first use and shut
    down at the end (a Ray instance takes seconds to start on 2 cores): its address, for runs
    in subprocesses to join. Skips where Ray is not installed (``pip install -e '.[ray]'``;
    CI installs it, and fails on the skip)."""
    ray = pytest.importorskip("ray")
    # 4 logical CPUs on 2 cores: the tests' env workers reserve fractions of one
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # (path, line, "Skipped: reason")
        return longrepr[2].removeprefix("Skipped: ")
    return str(longrepr)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI, fail a session that passed if a test skipped for a reason not in EXPECTED_SKIPS."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not _in_ci() or reporter is None:
        return
    unexpected = [
        f"{report.nodeid}: {reason}"
        for report in reporter.stats.get("skipped", [])
        if (reason := _skip_reason(report)) not in EXPECTED_SKIPS
    ]
    session.config.stash[_UNEXPECTED] = unexpected
    if unexpected and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    unexpected = terminalreporter.config.stash.get(_UNEXPECTED, [])
    if unexpected:
        terminalreporter.section("unexpected skips (CI is set)", sep="=", red=True, bold=True)
        for line in unexpected:
            terminalreporter.line(line)
        terminalreporter.line(
            f"{len(unexpected)} unexpected skip(s) fail this CI run; the expected ones are "
            "listed in EXPECTED_SKIPS in tests/conftest.py"
        )
