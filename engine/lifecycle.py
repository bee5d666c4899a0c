"""Engine lifecycle events: the run, its actors, and the checkpoints of replay.

These are the only events the engine itself emits (as actor "runtime"); everything about
episodes, policies and memories lives with the agents that emit it.
"""

from __future__ import annotations

from engine.events import Event, event


@event
class RunStarted(Event, tag="run_started", frozen=True, kw_only=True):
    """The run began. Mirrors the run metadata stored beside the log."""

    run_id: str
    scenario: str
    scenario_hash: str
    seed: int
    coevo_version: str


@event
class RunStopped(Event, tag="run_stopped", frozen=True, kw_only=True):
    """The run ended without an error: ``reason`` is "completed", "signal" or "requested"."""

    reason: str
    signal: str = ""
    exit_code: int = 0


@event
class RunResumed(Event, tag="run_resumed", frozen=True, kw_only=True):
    """``coevo resume`` continued the run after event ``after``, the last one the previous
    session committed. ``previous`` is how that session ended: the kind of its final event
    ("run_stopped", "run_failed") or "" when it was killed before writing one."""

    after: int
    previous: str = ""
    coevo_version: str = ""


@event
class RunFailed(Event, tag="run_failed", frozen=True, kw_only=True):
    """The run ended because of an error (an actor past its restarts, a store failure)."""

    error_type: str
    message: str
    actor: str = ""
    exit_code: int = 1


@event
class ActorStarted(Event, tag="actor_started", frozen=True, kw_only=True):
    """An actor's task began (``attempt`` 0 at first, n after its n-th restart)."""

    actor: str
    actor_type: str
    seed: int
    attempt: int = 0


@event
class ActorFailed(Event, tag="actor_failed", frozen=True, kw_only=True):
    """An actor raised. ``action`` is what supervision did: "restart" or "stop"."""

    actor: str
    attempt: int
    error_type: str
    message: str
    traceback: str
    action: str


@event
class ActorRestarted(Event, tag="actor_restarted", frozen=True, kw_only=True):
    """A failed actor was started again from its factory.

    Attributes:
        reason: the failure, ``Type: first line of its message`` (empty in logs written
            before it was recorded); the ``ActorFailed`` before it has the whole traceback.
    """

    actor: str
    attempt: int
    reason: str = ""


@event
class ProjectionChecked(Event, tag="projection_checked", frozen=True, kw_only=True):
    """Digests of every projection's state after folding every event with seq <= ``upto``.

    The runtime writes it immediately after event ``upto`` (at seq ``upto + 1``), so
    ``coevo replay --verify`` compares its re-fold against it without knowing the cadence.
    """

    upto: int
    digests: dict[str, str]


@event
class SnapshotTaken(Event, tag="snapshot_taken", frozen=True, kw_only=True):
    """The projections' encoded states after event ``upto`` were stored beside the log."""

    upto: int
    digests: dict[str, str]
    size: int
