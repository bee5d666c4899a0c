"""The domain's invariants over event streams (docs/TESTING.md), registered by name when this
package is imported (the ``coevo.invariants`` entry point ``builtin`` names it):

- ``recorded-once``: no fact recorded twice (:mod:`agents.events.recorded_once`);
- ``episodes``: assigned, started, turns in order, one end (:mod:`agents.invariants.episodes`);
- ``requests``: every request answered exactly once (:mod:`agents.invariants.requests`);
- ``versions``: both models' version chains (:mod:`agents.invariants.versions`);
- ``lineage``, ``retrievals``: the memory's entries (:mod:`agents.invariants.memory`);
- ``credit``: credits and advantages re-derive (:mod:`agents.invariants.credit`).

The engine's ``sessions`` is in :mod:`engine.invariants`.
"""

from __future__ import annotations

from agents.events.recorded_once import RecordedOnce
from agents.invariants.credit import Credit
from agents.invariants.episodes import Episodes
from agents.invariants.memory import Lineage, Retrievals
from agents.invariants.requests import Requests
from agents.invariants.versions import Versions
from engine.invariants import invariant

invariant("recorded-once")(RecordedOnce)

__all__ = ["Credit", "Episodes", "Lineage", "RecordedOnce", "Requests", "Retrievals", "Versions"]
