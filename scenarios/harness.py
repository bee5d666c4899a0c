"""A stateful harness for plug-in authors: a scenario's run driven through the real runtime (its
actors as the scenario assembles them, the in-memory event log) as a Hypothesis state machine,
with every invariant that applies to the run checked after every step (docs/TESTING.md).

Subclass :class:`RunMachine`, set ``scenario`` to a scenario's TOML text (a plug-in world or
method named by import path), and take its ``TestCase``. Each rule plays one session of the run
for a drawn number of committed events and stops it as a signal would; the next one resumes
it as ``coevo resume`` does. The invariants are fed every committed batch as the runtime
commits it (an observer); the first violation stops the run and is reported at teardown, at
its seq and with the events involved (a report by the step that saw it made Hypothesis's
replays flaky: which session commits a batch depends on thread timing); otherwise the run is
played to its end at teardown and whatever a completed run owes is checked too. Add rules of
your own, and invariants (registered with :func:`engine.invariants.invariant`, scoped to your
world or method) for what your plug-in promises.

Needs Hypothesis (``pip install 'coevo[testing]'``).
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import trio

from engine.entrypoints import COEVO_PACKAGES
from engine.eventlog import MemoryEventLog, new_run_meta
from engine.events import Envelope, Event
from engine.invariants import InvariantBroken, InvariantViolated, check_all, registered
from engine.lifecycle import RunFailed, RunResumed, RunStarted, RunStopped
from engine.runtime import Runtime
from scenarios.assemble import assemble
from scenarios.checks import context_of, invariants_for
from scenarios.loader import parse_toml, resolved_toml, scenario_hash, to_scenario

try:
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, rule
except ModuleNotFoundError:  # the optional extra: say how to get it, in one line
    raise ModuleNotFoundError(
        "coevo's stateful harness needs Hypothesis: pip install 'coevo[testing]'"
    ) from None

__all__ = ["RunMachine"]

SOURCE = "RunMachine.scenario"


class RunMachine(RuleBasedStateMachine):
    """A run of :attr:`scenario`, stopped and resumed at drawn points, its invariants checked
    after every committed batch.

    Attributes:
        scenario: the scenario's TOML text (set it in the subclass).
        check_only: the invariants to check (empty: every registered one that applies).
        log: the run's in-memory event log.
        sessions: the sessions played so far.
        completed: the run recorded its completion.
    """

    scenario: ClassVar[str] = ""
    check_only: ClassVar[Sequence[str]] = ()

    def __init__(self) -> None:
        super().__init__()
        if not self.scenario:
            raise TypeError(f"{type(self).__name__}: set `scenario` to a scenario's TOML text")
        if isinstance(self.check_only, str):  # its letters were read as invariant names
            raise TypeError(
                f"{type(self).__name__}: check_only = {self.check_only!r}: a tuple of invariant "
                f"names, as ({self.check_only!r},)"
            )
        self._scenario = to_scenario(parse_toml(self.scenario, SOURCE), SOURCE)
        text = resolved_toml(self._scenario)
        self._started = RunStarted(
            run_id="harness",
            scenario=self._scenario.name,
            scenario_hash=scenario_hash(text),
            seed=self._scenario.seed,
            coevo_version="0",
        )
        meta = new_run_meta(
            "harness",
            scenario_name=self._scenario.name,
            seed=self._scenario.seed,
            coevo_version="0",
            scenario_toml=text,
            scenario_hash=self._started.scenario_hash,
        )
        self.log = MemoryEventLog()
        self.log.write_meta(meta)
        ctx, notes = context_of(self._scenario, meta)
        if notes:
            raise RuntimeError("; ".join(notes))
        self._checks, _, left_out = invariants_for(ctx, self.check_only)
        known = registered()
        for why in left_out:  # coevo check names these; a test run said nothing of them
            own = known.get(why.split(":", 1)[0])
            module = getattr(own.factory, "__module__", "") if own else ""
            # coevo's own left out of a run it does not apply to is not worth a word
            # (``lineage`` of a GRPO run); a plug-in's is, since it was meant to be checked
            if module.split(".")[0] not in COEVO_PACKAGES:
                warnings.warn(
                    f"{type(self).__name__}: invariant {why} (so it is not checked: a world or "
                    "method it is registered for must be named as the scenario names it)",
                    stacklevel=2,
                )
        self._failure: InvariantViolated | InvariantBroken | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="coevo-harness-")
        self.sessions = 0
        self.completed = False

    @property
    def events(self) -> list[Envelope[Event]]:
        """The run's events so far."""
        return list(self.log.read())

    def play(self, events: int | None) -> None:
        """One session: start the run (or resume it) and stop it once ``events`` more events
        are committed (None: let it complete). Does nothing once the run completed."""
        if self.completed or self._failure is not None:
            return
        assembly = assemble(self._scenario, SOURCE, run_dir=Path(self._dir.name))
        history = self.events
        resumed = None
        if history:
            last = history[-1].event
            ended = isinstance(last, RunStopped | RunFailed)
            previous = str(last.__struct_config__.tag) if ended else ""
            resumed = RunResumed(after=history[-1].seq, previous=previous, coevo_version="0")
        target = None if events is None else self.log.next_seq + events
        runtime: Any = None

        def observe(batch: list[Envelope[Event]]) -> None:
            self._check(batch)
            if self._failure is not None or (target is not None and batch[-1].seq >= target):
                runtime.request_stop()

        runtime = Runtime(
            self.log,
            self._started,
            assembly.specs,
            assembly.projections,
            seed=self._scenario.seed,
            config=assembly.config,
            observers=[observe],
            resumed=resumed,
            history=history,
        )
        outcome = trio.run(runtime.run)
        self.sessions += 1
        self.completed = outcome.reason == "completed"
        if outcome.reason == "failed":
            raise AssertionError(f"session {self.sessions} failed: {outcome.error}")

    def _check(self, batch: list[Envelope[Event]]) -> None:
        if self._failure is None:
            try:
                check_all(self._checks, batch, False)
            except (InvariantViolated, InvariantBroken) as exc:  # a bug in one: named, as
                self._failure = exc  # coevo check names it

    def _raise(self) -> None:
        if self._failure is not None:
            raise AssertionError(self._explain(self._failure))

    def _explain(self, exc: InvariantViolated | InvariantBroken) -> str:
        from scenarios.cli.console import envelope_line

        if isinstance(exc, InvariantBroken):
            return str(exc)

        lines = [f"invariant {exc.invariant} violated at seq {exc.seq}: {exc.detail}"]
        for seq in exc.involved:
            lines += [envelope_line(env, width=None) for env in self.log.read(seq, seq + 1)]
        return "\n".join(lines)

    @rule(events=st.integers(1, 400))
    def run_for_a_while_then_stop(self, events: int) -> None:
        """Play (or resume) the run until ``events`` more are committed, then stop it."""
        self.play(events)

    def teardown(self) -> None:
        """Play the run to its end, then report the first violation any batch showed, and
        what a completed run owes must be there.

        A violation is reported here, not by the step whose session saw it: which session
        commits the violating batch depends on thread timing (the writer commits on its own
        thread), so a step-time report made Hypothesis replay a different number of steps and
        end in ``FlakyStrategyDefinition`` ("inconsistent data generation") instead of the
        violation. Every step draws the same on a replay, and the violation is what fails.
        """
        try:
            if self._failure is None:
                self.play(None)
            self._raise()
            if not self.completed:
                raise AssertionError("the run did not complete")
            try:
                check_all(self._checks, None, True)
            except (InvariantViolated, InvariantBroken) as exc:
                raise AssertionError(self._explain(exc)) from None
            self._raise_if_all_aborted()
        finally:
            self._dir.cleanup()

    def _raise_if_all_aborted(self) -> None:
        """Fail as ``coevo run`` does (exit 1) when the run finished no episode: every one
        was aborted (a world whose every observation is refused passed the harness)."""
        from agents.events.episodes import EpisodeAborted, EpisodeFinished

        events = [env.event for env in self.log.read()]
        aborted = [e for e in events if isinstance(e, EpisodeAborted)]
        if aborted and not any(isinstance(e, EpisodeFinished) for e in events):
            raise AssertionError(
                f"all {len(aborted)} episodes of the run were aborted (the first: "
                f"{aborted[0].reason})"
            )
