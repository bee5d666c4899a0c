"""The typed schema of scenario files.

A scenario is TOML decoded into these Structs; unknown keys are rejected, every number has a
range, and errors carry the key path (``$.run.episodes``). Defaults are the embedded defaults:
a scenario file only states what differs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

PositiveInt = Annotated[int, Meta(ge=1, le=1_000_000_000)]
NonNegInt = Annotated[int, Meta(ge=0, le=1_000_000_000)]
Name = Annotated[str, Meta(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")]


class WorldConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which world, which of its task families, and options passed to its constructor.

    Attributes:
        name: a built-in world name (``minilab``) or an import path ``package.module:Class``.
        families: task families to draw episodes from (empty: all the world offers).
        split: variants to draw from: "train" or "heldout".
        options: keyword arguments for the world's constructor.
    """

    name: Annotated[str, Meta(min_length=1, max_length=300)] = "minilab"
    families: list[Name] = msgspec.field(default_factory=list[str])
    split: Literal["train", "heldout"] = "train"
    options: dict[str, Any] = msgspec.field(default_factory=dict[str, Any])


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The agent acting in the world (scripted here; learned policies come with the learner).

    Attributes:
        kind: "random" (uniform over admissible actions) or "explorer" (memoryless heuristic).
    """

    kind: Literal["random", "explorer"] = "random"


class RunConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The budget: how many episodes, on how many concurrent env workers."""

    episodes: Annotated[int, Meta(ge=1, le=10_000_000)] = 100
    workers: Annotated[int, Meta(ge=1, le=256)] = 4


class RuntimeSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Engine knobs (see ``engine.runtime.RuntimeConfig``) and supervision.

    Attributes:
        durable: fsync every commit (a crash of the machine loses nothing committed).
        batch_max: most events per commit.
        batch_wait_ms: how long the writer lingers to fill a batch.
        write_buffer: queued events before a source actor waits.
        mailbox: queued batches per actor before delivery waits.
        checksum_every: events between projection checksums (0: only at the end).
        snapshot_every: events between projection snapshots (0: never).
        on_failure: what supervision does when an actor raises: "restart" or "stop".
        max_restarts: restarts per actor before the run stops.
    """

    durable: bool = True
    batch_max: Annotated[int, Meta(ge=1, le=100_000)] = 1024
    batch_wait_ms: Annotated[float, Meta(ge=0, le=10_000)] = 0.0
    write_buffer: Annotated[int, Meta(ge=1, le=10_000_000)] = 8192
    mailbox: Annotated[int, Meta(ge=1, le=100_000)] = 64
    checksum_every: NonNegInt = 1000
    snapshot_every: NonNegInt = 20_000
    on_failure: Literal["restart", "stop"] = "restart"
    max_restarts: Annotated[int, Meta(ge=0, le=1000)] = 3


class LoggingConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Console verbosity (the JSON log file in the run directory always gets everything)."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    progress: bool = True


class Scenario(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A whole scenario file."""

    name: Name
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0
    description: Annotated[str, Meta(max_length=10_000)] = ""
    world: WorldConfig = msgspec.field(default_factory=WorldConfig)
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    run: RunConfig = msgspec.field(default_factory=RunConfig)
    runtime: RuntimeSection = msgspec.field(default_factory=RuntimeSection)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
