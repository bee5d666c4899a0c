"""The scenario fuzz records its figures with ``tests/faults/fault_counts.py`` when it runs
at a larger scale (``make test-faults``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))  # fault_counts
