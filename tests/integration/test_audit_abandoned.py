"""The audit of an episode whose first attempt was abandoned and run again (a resumed run, a
restarted worker: the same episode id twice in the log): every view shows its last attempt,
and an entry shown only in the lost attempt is not counted as guiding the episode."""

from __future__ import annotations

from pathlib import Path

import pytest
from audit_golden import golden_stream, write_run

from agents.audit.answers import audit_tip
from agents.audit.episode import EpisodeAudit, audit_episode
from agents.audit.index import fetch, open_index, refs
from agents.audit.whatif import recorded
from scenarios.cli import main
from stores.lmdb_log import LmdbEventLog

LOST = "the oven is open."


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = golden_stream()
    # ep008 is shown entry 3 and lost; its second attempt is shown entry 4 and succeeds
    s.episode("ep008", 8, success=False, tip=3, observation=LOST, abandon=True)
    s.episode("ep008", 8, success=True, tip=4, call=s.calls["xC"])
    s.episode("ep009", 9, success=False, abort="RuntimeError: the simulator lost its state")
    return write_run(tmp_path_factory.mktemp("abandoned"), s.envs)


def test_every_view_of_an_episode_run_twice_is_its_last_attempt(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = LmdbEventLog.open(run / "log")
    index, _ = open_index(run, log)
    try:
        a = audit_episode(log, index, "ep008")
        assert a.abandoned == 1 and a.ended == "finished" and a.success
        assert [t.observation for t in a.turns] == ["you see a can and a stove."]
        assert [s.tip for t in a.turns for s in t.retrieved] == [4]
        found = refs(index, "e", "ep008")
        events = fetch(log, [seq for seq, _ in found])
        rec = recorded("ep008", [events[seq] for seq, _ in found])
        assert len(rec.requests) == 1 and rec.played.success
        assert set(rec.shown) == {4}
        lost = [u for u in audit_tip(log, index, 3).uses if u.episode == "ep008"]
        # its purpose is known though it never ended (it was "" before)
        assert [(u.abandoned, u.ended, u.purpose) for u in lost] == [(True, False, "train")]
        first = audit_tip(log, index, 3)
        assert "ep008" not in {u.episode for u in first.uses if not u.abandoned}
        kept = [u for u in audit_tip(log, index, 4).uses if u.episode == "ep008"]
        assert [(u.abandoned, u.success) for u in kept] == [(False, True)]
    finally:
        index.close()
        log.close()
    assert main(["audit", str(run), "episode", "ep008"]) == 0
    out = capsys.readouterr().out
    assert "1 earlier one abandoned" in out and LOST not in out
    assert main(["audit", str(run), "tip", "3"]) == 0
    out = capsys.readouterr().out
    assert "abandoned (the episode ran again)" in out and "1 of them in attempts later" in out


def _audited(run: Path, episode: str) -> EpisodeAudit:
    """``audit_episode`` of ``episode`` in ``run``, its log and index closed after."""
    log = LmdbEventLog.open(run / "log")
    index, _ = open_index(run, log)
    try:
        return audit_episode(log, index, episode)
    finally:
        index.close()
        log.close()


def test_an_aborted_episode_shows_the_action_its_world_failed_on(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The world failed on the episode's first action: the audit shows that action (what a
    researcher debugging the world needs), marked unanswered, and counts no step for it."""
    a = _audited(run, "ep009")
    assert a.ended == "RuntimeError: the simulator lost its state" and a.steps == 0
    assert [(t.turn, t.action, t.answered) for t in a.turns] == [(0, "take can", False)]
    assert main(["audit", str(run), "episode", "ep009"]) == 0
    out = capsys.readouterr().out
    said = "no step recorded (the run stopped, or the world failed, before it)"
    assert f"action: take can  logp -0.5000  -> {said}" in out, out


def test_an_update_a_run_ended_before_is_not_said_to_be_coming(run: Path) -> None:
    """``audit episode`` said "(not applied yet)" of the update of a run that had ended
    (failed, its update refused): it will never be applied by that run as it is."""
    import msgspec

    from agents.audit.episode import Update, run_end
    from agents.audit.render import render_episode

    a = _audited(run, "ep008")
    log = LmdbEventLog.open(run / "log")
    try:
        end = run_end(log)
    finally:
        log.close()
    assert a.run_end == end
    pending = Update(seq=40, update=0, advantage=0.5, rollout="plain")
    for ended, says in (
        ("", "(not applied yet)"),
        ("failed", "(not applied: the run failed before it)"),
        ("completed", "(not applied: the run completed before it)"),
    ):
        lines = render_episode(msgspec.structs.replace(a, update=pending, run_end=ended))
        assert any(line.endswith(says) for line in lines), lines


def test_a_warm_up_group_a_tiny_negative_kl_and_large_rewards_read_as_they_are(
    run: Path,
) -> None:
    """A warm-up group's advantage (``update`` -1) read as any other's, serve's page said
    "update -1"; a KL of -1.5e-8 printed "kl -0.0000"; a group's rewards of 1e14 in full."""
    import msgspec

    from agents.audit.episode import Advantage, Update
    from agents.audit.render import render_episode

    a = _audited(run, "ep008")
    warm = Advantage(
        seq=30, group="g00000", update=-1, rule="grpo", rollout="plain", outcome=1e14,
        intrinsic=0.0, intrinsic_coef=0.0, reward=1e14, advantage=0.5,
        group_rewards=(1e14, -3e13),
    )  # fmt: skip
    applied = Update(seq=40, update=0, advantage=0.5, rollout="plain", version=1, kl=-1.49e-8)
    lines = render_episode(msgspec.structs.replace(a, advantage=warm, update=applied))
    text = "\n".join(lines)
    assert "(group g00000: [1.0000e+14, -3.0000e+13])" in text
    assert "seq 30, a warm-up step, not trained)" in text
    assert "kl 0.0000, digest" in text and "-0.0000" not in text
