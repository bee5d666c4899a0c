"""The error tree of coevo: one root, a few precise leaves.

Every error a user can cause (bad scenario, missing run, corrupted log) derives from
:class:`CoevoError`; the CLI prints its message on one line and exits with its ``exit_code``.
Internal invariants use ``assert`` and are bugs, not members of this tree.
"""

from __future__ import annotations


class CoevoError(Exception):
    """Root of every error coevo raises on purpose. ``exit_code`` is what the CLI returns;
    ``restartable`` False marks a failure no restart of the actor that raised it can mend
    (what it needs outside the run is gone): supervision then stops the run at once, whatever
    the actor's spec allows."""

    exit_code: int = 1
    restartable: bool = True


class ScenarioInvalid(CoevoError):
    """A scenario file cannot be used: unreadable, not TOML, or not valid against the schema.

    The message names the file and, where known, the key path (``$.run.episodes``). Raised before
    anything runs; a run never starts from an invalid scenario.
    """

    exit_code = 2

    def __init__(self, source: str, message: str) -> None:
        self.source = source
        self.detail = message
        super().__init__(f"{source}: {message}")


class ModelUnavailable(CoevoError):
    """A model directory or checkpoint could not be loaded (missing, not a transformers model,
    weights that do not fit), or the device it was asked on does not exist.

    Raised before actors start or by the actor loading it; unlike :class:`ScenarioInvalid`, the
    scenario file itself is valid.
    """

    exit_code = 2


class ClusterUnavailable(CoevoError):
    """The Ray cluster a scenario names (``[runtime.ray] address``) cannot be joined: nothing
    answers at its address, or Ray refused to connect. The scenario is valid; the cluster is
    not there (start it, or fix the address)."""

    exit_code = 2


class RunNotFound(CoevoError):
    """A path given as a run directory holds no coevo event log (or does not exist)."""

    exit_code = 2


class LogError(CoevoError):
    """Base of the errors raised by an event log."""


class LogCorrupted(LogError):
    """A stored record failed its checksum or could not be decoded.

    ``seq`` is the sequence number of the first bad record. Never raised for a record that merely
    belongs to an older schema version (those are upcast), only for bytes that are not what was
    written. ``before``: the events before this seq still read (a reader decodes a record's
    part whole, so a bad envelope inside one hides the part's earlier envelopes too).
    """

    def __init__(self, seq: int, reason: str) -> None:
        self.seq = seq
        self.reason = reason
        self.before = seq
        super().__init__(f"event log corrupted at seq {seq}: {reason}")


class EventSchemaChanged(LogCorrupted):
    """A record whose bytes are as written (its checksum holds) that its event class no longer
    reads: the class changed (a field's type, a new version) without an upcaster from the
    recorded version. Not damage: the message says how to read such logs."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(
            seq,
            f"{reason}; the record is as it was written (its checksum holds), so its event "
            "class has changed since: give the class a new version and register an upcaster "
            "from the recorded one (@engine.events.upcaster(tag, version), docs/ARCHITECTURE.md)",
        )


class LogDamaged(LogError):
    """The log's file is damaged below its records: truncated, meta pages that disagree, pages
    LMDB cannot read or would abort on. (A record that fails its checksum is
    :class:`LogCorrupted`.)"""


class SequenceConflict(LogError):
    """An append did not start at the log's next sequence number (another writer got there first,
    or the caller's view of the log is stale). Nothing of the batch was written."""

    def __init__(self, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"sequence conflict: append starts at seq {actual}, but the log's next seq is "
            f"{expected}"
        )


class NotALog(LogError):
    """The path holds an LMDB file, but not a coevo event log (another program's database).
    Bad input, like :class:`RunNotFound`; unlike :class:`LogCorrupted`, nothing says it ever
    was a coevo log."""

    exit_code = 2


class LogWriteFailed(LogError):
    """The file system refused a commit to the log: the disk is full (LMDB reports it as an
    I/O error), a quota or file size limit was reached, or the device failed.

    Nothing of that commit was stored; unlike :class:`LogCorrupted`, the stored bytes are intact
    and the log still reads and verifies up to the commit before. ``seq`` is the first seq of the
    commit that failed (None for metadata).
    """

    def __init__(self, path: str, seq: int | None, reason: str) -> None:
        self.seq = seq
        what = f"events from seq {seq}" if seq is not None else "metadata"
        super().__init__(
            f"cannot write the event log at {path}: {reason} ({_hint(reason)}); {what} not "
            "stored, the log keeps every commit before"
        )


def _hint(reason: str) -> str:
    """The likely cause of a refused write, from the system's words (LMDB reports a full
    disk as an I/O error)."""
    for words, hint in (
        ("Cannot allocate memory", "out of memory?"),
        ("File too large", "a file-size limit: ulimit -f?"),
        ("quota", "a disk quota?"),
        ("Read-only file system", "a read-only file system"),
        ("Operation not permitted", "a file made immutable or append-only: lsattr?"),
        ("Permission denied", "the files' permissions"),
        ("File name too long", "a path longer than the file system holds: a shorter run path"),
    ):
        if words.lower() in reason.lower():
            return hint
    return "disk full, or a file-size limit?"


class CheckpointNotWritten(CoevoError):
    """A model version's checkpoint could not be written (a full disk, a file-size limit):
    its update is not recorded, the log keeps every event before it, and a resume continues
    the run once the cause is gone (the half-written ``.partial`` is removed by the next
    save)."""

    def __init__(self, path: str, reason: str) -> None:
        then = (
            "coevo copy RUN DEST to a shorter path, and coevo resume DEST, continue the run"
            if "File name too long" in reason  # a resume in place fails the same way
            else "coevo resume continues the run"
        )
        super().__init__(
            f"cannot write the checkpoint {path}: {reason} ({_hint(reason)}); its update is "
            f"not recorded, and {then}"
        )


class RunDirectoryMoved(CoevoError):
    """The run's directory was moved, replaced or deleted while the run wrote into it: what
    the run writes by path (checkpoints, curves) would go to a new directory at the old path,
    apart from the log (which follows the directory it was opened in). No restart mends it."""

    restartable = False


class LogLocked(LogError):
    """A second writer tried to open a log that already has one. Readers are never refused.

    ``holder`` says who holds the lock (``"written by pid N"``).
    """

    def __init__(self, message: str, holder: str = "") -> None:
        self.holder = holder
        super().__init__(message)


class LogDenied(LogError):
    """This user may not open the log as asked (a file of it, or its directory, not readable
    or writable): bad input, as every path this user may not use, not a failed write."""

    exit_code = 2


class LogClosed(LogError):
    """The log was used after ``close()``."""


class SchemaTooNew(LogError):
    """The log was written by a newer coevo whose event schema this version cannot read."""


class ReplayDiverged(CoevoError):
    """Re-folding the log did not reproduce a projection checksum recorded during the run.

    ``seq`` is the last event the differing checksum covers: the divergence lies after the
    previous checksum (which agreed) and at or before ``seq``.
    """

    def __init__(self, seq: int, projection: str, recorded: str, derived: str) -> None:
        self.seq = seq
        self.projection = projection
        super().__init__(
            f"replay diverged at seq {seq}: projection {projection!r} recorded digest "
            f"{recorded[:16]}, re-fold gives {derived[:16]}"
        )


class LogInconsistent(CoevoError):
    """The log's records are intact, but its events contradict one another: a fact recorded
    twice (an episode finished twice, a request answered twice), two sessions resumed after
    the same seq or a session that does not start where the log ended, or events after the
    run completed. What two writers on one run leave behind.

    Unlike :class:`LogCorrupted` (bytes that are not what was written) and
    :class:`ReplayDiverged` (a projection's checksum), every record decodes and every checksum
    may agree. ``seq`` is the event that repeats or contradicts an earlier one.
    """

    def __init__(self, seq: int, reason: str) -> None:
        self.seq = seq
        self.reason = reason
        super().__init__(f"event log inconsistent at seq {seq}: {reason}")


class EventInvalid(CoevoError):
    """An actor emitted an event that cannot be recorded: a field holds a value of a type the
    event does not declare (None for a string, a numpy scalar for a float), so it would not
    encode, or would encode and never decode back. msgspec Structs do not check types on
    construction; ``Context.emit`` checks each event before it is queued, so no event that
    cannot be decoded is ever committed. Raised in the emitting actor (which fails, and is
    supervised as any failing actor); unlike :class:`LogCorrupted`, the log never holds it.
    """


class NothingToResume(CoevoError):
    """``coevo resume`` was pointed at a run that completed: its log ends with a
    ``run_stopped`` event whose reason is "completed". (A directory that is not a run is
    :class:`RunNotFound`.)"""

    exit_code = 2


class ResumeDiverged(CoevoError):
    """An actor rebuilding its state for ``coevo resume`` found that the log and the code do
    not agree on what the run did (its replay would emit events other than those the log
    holds, or a checkpoint the log refers to is missing). Unlike :class:`ReplayDiverged`, it
    is about an actor's private state, not a projection checksum."""


class ActorCrashed(CoevoError):
    """An actor failed and its supervision policy stopped the run (after any restarts)."""

    def __init__(self, actor: str, error: str) -> None:
        self.actor = actor
        self.error = error
        super().__init__(f"actor {actor!r} failed: {error}")


class AuditQueryInvalid(CoevoError):
    """``coevo audit`` was asked about something the run's log does not hold (a tip or episode
    id it never recorded) or under a rule or setting that does not exist.

    Raised before anything is printed; unlike :class:`RunNotFound`, the run itself is there.
    """

    exit_code = 2


class UpdateDiverged(CoevoError):
    """Re-executing a recorded model update (``coevo replay --reexecute-learner``) did not
    reproduce what the log records: the parameters' digest, the samples trained on, or the
    checkpoint on disk.

    Unlike :class:`ReplayDiverged` (a projection's checksum, found by re-folding events), this
    is found by re-running a model's training step; ``update`` names the first update that
    differs (every earlier one matched bit for bit).
    """

    def __init__(self, model: str, update: int, seq: int, reason: str, start: bool = False) -> None:
        self.model = model
        self.update = update
        self.seq = seq
        self.start = start
        """The weights it started from are not the run's (another base model), not an
        update's arithmetic."""
        super().__init__(f"{model} update {update} (seq {seq}) diverged: {reason}")
