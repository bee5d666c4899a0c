"""Seeds derived from the run seed and an identity, never from scheduling order.

Every actor and every episode gets ``derive_seed(run_seed, *identity)``: a stable 63-bit hash of
the run seed and the identity path, the same in every process and on every platform (no use of
Python's salted ``hash``).
"""

from __future__ import annotations

import hashlib
import random

_MASK = (1 << 63) - 1


def derive_seed(root: int, *identity: str | int) -> int:
    """A seed for ``identity`` (e.g. ``("episode", 17)``) under run seed ``root``.

    Args:
        root: the run seed.
        *identity: the path naming what the seed is for.

    Returns:
        An int in ``[0, 2**63)``.
    """
    text = "/".join([str(root), *(str(part) for part in identity)])
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _MASK


def derive_rng(root: int, *identity: str | int) -> random.Random:
    """A ``random.Random`` seeded with :func:`derive_seed` (never the global RNG)."""
    return random.Random(derive_seed(root, *identity))
