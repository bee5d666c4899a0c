"""The world interface's old home, kept as an alias for plug-in worlds written before it moved
to :mod:`engine.world` (docs/ENVIRONMENTS.md). New code imports :mod:`engine.world`."""

from engine.world import SPLITS, ExtraMissing, Observation, Task, TextWorld

__all__ = ["SPLITS", "ExtraMissing", "Observation", "Task", "TextWorld"]
