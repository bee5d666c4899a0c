"""Single events with neutral contents, for tests that need one and care about few of its
fields (no Hypothesis needed)."""

from __future__ import annotations

from typing import Any

from agents.events.policy import PolicyUpdated

__all__ = ["policy_updated"]


def policy_updated(version: int, **fields: Any) -> PolicyUpdated:
    """A :class:`PolicyUpdated` that made policy ``version`` (update ``version - 1``): one
    sample, zero loss and gradient, ratio 1, digest ``"d"``, checkpoint ``v{version}``, no
    time; ``fields`` override any of these or set the optional ones."""
    base: dict[str, Any] = dict(
        policy_version=version,
        update=version - 1,
        samples=1,
        stale=0,
        loss=0.0,
        grad_norm=0.0,
        clip_frac=0.0,
        kl=0.0,
        ratio_mean=1.0,
        ref_kl=0.0,
        digest="d",
        checkpoint=f"v{version}",
        seconds=0.0,
    )
    return PolicyUpdated(**{**base, **fields})
