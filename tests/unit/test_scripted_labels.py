"""An episode no policy played (a scripted explorer's: policy version -1) is labelled as such
in the audit's turns and the browser's list, not as "policy v-1"."""

from __future__ import annotations

from agents.audit.episode import Turn
from agents.audit.index import Assigned, Outcome
from agents.audit.render import _turn  # pyright: ignore[reportPrivateUsage]
from agents.browse.data import _row  # pyright: ignore[reportPrivateUsage]


def test_a_scripted_turn_and_episode_name_no_policy_version() -> None:
    scripted, played = (
        Turn(turn=0, observation="o", admissible=("a",), policy_version=-1),
        Turn(turn=0, observation="o", admissible=("a",), policy_version=3),
    )
    assert "no policy: scripted" in _turn(scripted)[0] and "v-1" not in _turn(scripted)[0]
    assert "policy v3" in _turn(played)[0]
    a = Assigned(
        seq=0, index=0, family="heat", variant=0, split="train", purpose="train", rollout="plain"
    )
    end = Outcome(seq=5, purpose="train", success=True, score=1.0, steps=3)
    assert _row("ep000000", a, end, -1).version == "-"
    assert _row("ep000000", a, end, None).version == "-"
    assert _row("ep000000", a, end, 2).version == "2"
