"""Single events with neutral contents, for tests that need one and care about few of its
fields (no Hypothesis needed)."""

from __future__ import annotations

from typing import Any

from agents.events.episodes import EpisodeFinished
from agents.events.extractor import ExtractorCalled
from agents.events.policy import ActionSampled, PolicyUpdated

__all__ = ["action_sampled", "episode_finished", "extractor_called", "policy_updated"]


def action_sampled(episode: str, turn: int, **fields: Any) -> ActionSampled:
    """An :class:`ActionSampled` of turn ``turn`` of ``episode`` by policy version 0: worker
    ``"w"``, prompt ``(1, 2)``, response ``(3,)`` with log-prob -1, temperature 1; ``fields``
    override any of these or set the optional ones."""
    base: dict[str, Any] = dict(
        episode=episode,
        worker="w",
        turn=turn,
        policy_version=0,
        action="a",
        prompt_ids=(1, 2),
        response_ids=(3,),
        token_logps=(-1.0,),
        logp=-1.0,
        temperature=1.0,
    )
    return ActionSampled(**{**base, **fields})


def episode_finished(episode: str, **fields: Any) -> EpisodeFinished:
    """A failed training episode ``episode`` of 2 steps (worker ``"w"``, family ``"heat"``,
    variant 0, score and reward 0); ``fields`` override any of these."""
    base: dict[str, Any] = dict(
        episode=episode,
        worker="w",
        family="heat",
        variant=0,
        split="train",
        steps=2,
        score=0.0,
        success=False,
        total_reward=0.0,
    )
    return EpisodeFinished(**{**base, **fields})


def extractor_called(call: str, **fields: Any) -> ExtractorCalled:
    """Extractor call ``call`` by extractor version 0 that read episode ``"ep000001"`` for
    slot ``"s"``: prompt ``(1,)``, response ``(2,)`` with log-prob -0.1, text ``"t"``, no
    operations; ``fields`` override any of these or set the optional ones."""
    base: dict[str, Any] = dict(
        call=call,
        task="extract",
        source="ep000001",
        slot="s",
        prompt_ids=(1,),
        response_ids=(2,),
        token_logps=(-0.1,),
        text="t",
        temperature=1.0,
        extractor_version=0,
    )
    return ExtractorCalled(**{**base, **fields})


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
