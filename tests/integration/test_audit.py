"""``coevo audit`` on a small recorded run with known answers (``audit_golden``): an entry's
lineage, uses, credits and extractor update; an episode turn by turn; every credit and
advantage re-derived exactly and under counterfactual rules; a live run's new tail; and bad
input as one-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from audit_golden import TOML, Stream, golden_stream, write_run

from agents.audit.index import INDEX_DIR, index_ident
from agents.events.extractor import CreditAssigned
from agents.events.memory import TipsRetrieved, TipStored
from engine.events import Envelope
from scenarios.cli import main
from stores.fact_index import LmdbFactIndex
from stores.lmdb_env import DATA_FILE, LOCK_FILE
from stores.lmdb_log import LmdbEventLog

STREAM = golden_stream()
XA, XB, XM, XC = (STREAM.calls[n] for n in ("xA", "xB", "xM", "xC"))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("golden"), STREAM.envs)


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["audit", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def audit_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = audit(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_a_merged_entry_names_its_call_its_parents_and_its_replacement(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = audit_json(capsys, str(run), "tip", "2")
    o = a["origin"]
    assert (o["kind"], o["call"], o["task"], o["op"], o["merge_step"], o["entries"]) == (
        "extractor",
        XM,
        "merge",
        "merge",
        0,
        [0, 1],
    )
    parents = a["lineage"]["parents"]
    assert [(p["tip"], p["call"], p["source"], p["evicted"]) for p in parents] == [
        (0, XA, "ep000", "merge"),
        (1, XB, "ep001", "merge"),
    ]
    assert a["children"] == [4] and a["evicted"] == "update" and a["evicted_by"] == XC


def test_an_entry_merged_into_a_text_the_bank_held_names_the_call_and_where_it_lives_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A merge whose result the bank already held (refused as a duplicate) evicted its entries
    and stored nothing: their audit said only "evicted (merge)", though the refusal names
    the call and the entry they live on in."""
    from audit_golden import SLOT, TEXTS

    from agents.events.extractor import ExtractorCalled, MergeRequested
    from agents.events.memory import TipEvicted, TipRejected

    s = Stream()
    s.extract("ep000", True, "xA", ("add", ()), 0)
    s.extract("ep001", True, "xB", ("add", ()), 1)
    s.extract("ep002", True, "xC", ("add", ()), 2)
    req = s.add(
        MergeRequested(step=0, slot=SLOT, entries=(1, 2), messages=(("user", "m"),), seed=0)
    )
    call = s.add(
        ExtractorCalled(
            call="xM", task="merge", source="merge0", slot=SLOT, prompt_ids=(1,),
            response_ids=(2,), token_logps=(-1.0,), text=TEXTS[0], temperature=1.0,
            extractor_version=0, ops=(("merge", (1, 2), TEXTS[0]),),
        ),
        cause=req,
    )  # fmt: skip
    for tip in (1, 2):
        s.add(TipEvicted(tip_id=tip, slot=SLOT, reason="merge"), cause=call)
    s.add(
        TipRejected(episode="merge0", slot=SLOT, reason="duplicate", duplicate_of=0, call="xM"),
        cause=call,
    )
    s.add(TipEvicted(tip_id=0, slot=SLOT, reason="fifo"))  # caused by no call
    run = write_run(tmp_path, s.envs)
    a = audit_json(capsys, str(run), "tip", "1")
    assert (a["evicted"], a["evicted_by"], a["evicted_into"]) == ("merge", "xM", [0])
    code, out, _ = audit(capsys, str(run), "tip", "2")
    assert code == 0 and (
        "(merge) by extractor call xM, whose result was refused as a duplicate of entry 0" in out
    ), out
    a = audit_json(capsys, str(run), "tip", "0")
    assert (a["evicted"], a["evicted_by"], a["evicted_into"]) == ("fifo", "", [])


def test_a_credited_entry_lists_its_uses_credits_and_the_update_that_consumed_them(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = audit_json(capsys, str(run), "tip", "2")
    assert [(u["episode"], u["turn"], u["rank"], u["alive"], u["success"]) for u in a["uses"]] == [
        ("ep002", 0, 0, True, True),
        ("ep003", 0, 0, True, False),
    ]
    assert [(c["episode"], c["call"], c["credit"], c["update"]) for c in a["credits"]] == [
        ("ep002", XM, 1.0, 0),
        ("ep003", XM, -1.0, 0),
    ]
    [u] = a["updates"]
    assert (u["update"], u["call"], u["reward"], u["advantage"], u["weight"], u["batch"]) == (
        0,
        XM,
        0.0,
        -0.5,
        1.0,
        2,
    )
    assert (u["version"], u["samples"], u["digest"]) == (1, 2, "e1")
    assert (a["guided"], a["guided_success"], a["credit_sum"]) == (2, 1, 0.0)


def test_an_updated_entry_s_lineage_goes_back_to_the_first_calls(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = audit_json(capsys, str(run), "tip", "4")
    assert (a["origin"]["call"], a["origin"]["op"], a["origin"]["episodes"]) == (
        XC,
        "update",
        ["ep005"],
    )
    node = a["lineage"]
    assert (node["tip"], [p["tip"] for p in node["parents"]]) == (4, [2])
    assert [g["tip"] for g in node["parents"][0]["parents"]] == [0, 1]
    assert [(c["episode"], c["credit"]) for c in a["credits"]] == [("ep006", 1.0)]
    assert [(u["reward"], u["advantage"]) for u in a["updates"]] == [(1.0, 0.5)]


def test_a_reflection_entry_is_used_but_never_credited(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = audit_json(capsys, str(run), "tip", "3")
    o = a["origin"]
    assert (o["kind"], o["source"], o["policy_version"], o["episode_success"]) == (
        "reflection",
        "ep004",
        1,
        False,
    )
    assert [u["episode"] for u in a["uses"]] == ["ep007"] and a["credits"] == []


def test_an_episode_turn_by_turn_with_its_advantage_update_and_credit(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = audit_json(capsys, str(run), "episode", "ep002")
    [t] = a["turns"]
    assert (t["observation"], t["action"], t["logp"], t["admissible"]) == (
        "you see a can and a stove.",
        "take can",
        -0.5,
        ["look", "take can"],
    )
    assert [(s["tip"], s["call"], s["similarity"]) for s in t["retrieved"]] == [(2, XM, 0.75)]
    assert (a["success"], a["rollout"]) == (True, "guided")
    adv = a["advantage"]
    assert (adv["outcome"], adv["reward"], adv["advantage"], adv["group"]) == (1.0, 1.0, 0.5, "g0")
    assert (a["update"]["update"], a["update"]["version"], a["update"]["advantage"]) == (0, 1, 0.5)
    c = a["credit"]
    assert (c["entry"], c["call"], c["credit"], c["update"], c["weight"], c["version"]) == (
        2,
        XM,
        1.0,
        0,
        1.0,
        1,
    )


def test_an_episode_shows_what_it_wrote(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = audit_json(capsys, str(run), "episode", "ep005")
    assert [(w["kind"], w["call"], w["stored"]) for w in a["written"]] == [("extractor", XC, [4])]
    b = audit_json(capsys, str(run), "episode", "ep004")
    assert [(w["kind"], w["stored"]) for w in b["written"]] == [("reflection", [3])]


def test_text_answers_name_the_facts(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = audit(capsys, str(run), "tip", "2")
    assert code == 0
    assert f"written by extractor call {XM}" in out and "retrieved 2 times in 2 episodes" in out
    code, out, _ = audit(capsys, str(run), "episode", "ep002")
    assert code == 0 and "advantage: +0.500000" in out and "-> policy v1" in out


def test_credit_and_advantages_re_derive_exactly(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = audit_json(capsys, str(run), "credit")
    assert a["match"] and not a["counterfactual"]
    counts = {c["kind"]: (c["recorded"], c["equal"]) for c in a["checks"]}
    assert counts == {
        "credit_assigned": (3, 3),
        "extractor_gradient_requested": (1, 1),
        "advantages_computed": (1, 1),
        "gradient_requested": (1, 1),
    }
    code, out, _ = audit(capsys, str(run), "credit")
    assert code == 0 and "every credit and advantage matches the log" in out
    assert "cooldown 1, counts pushed; advantages" in out.splitlines()[0]  # the run's rule
    other = audit_json(capsys, str(run), "credit", "--set", "counts=weighted")
    assert other["counterfactual"] and other["counts"] == "weighted"


def test_the_relative_rule_credits_against_the_free_half(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = audit_json(capsys, str(run), "credit", "--rule", "relative")
    assert a["counterfactual"] and a["rule"] == "relative"
    # ep002: 1 - mean(0, 1) = 0.5; ep003: -0.5; ep006 has no group: 0.0
    assert {e["tip"]: (e["recorded"], e["derived"]) for e in a["entries"]} == {
        2: (0.0, 0.0),
        4: (1.0, 0.0),
    }
    # ep006's +1 -> 0 and the pushes' moves to zero are no sign flips (they were counted)
    assert (a["credits_changed"], a["credit_sign_flips"]) == (3, 0)
    pushes = {x["call"]: (x["recorded_push"], x["derived_push"]) for x in a["calls"]}
    assert pushes == {XM: (-0.5, 0.0), XC: (0.5, 0.0)}
    assert a["calls_flipped"] == 0
    # a rule of the same numbers under another name: every credit equal (the name is not
    # compared), but still a counterfactual
    same = audit_json(capsys, str(run), "credit", "--rule", "score")  # +-1 as success here
    assert same["counterfactual"] and same["credits_changed"] == 0
    assert {c["kind"]: c["equal"] for c in same["checks"]}["credit_assigned"] == 3
    code, out, _ = audit(capsys, str(run), "credit", "--rule", "score")
    # the rule's name differs in every one: not "identical in every field"
    assert code == 0 and "3 the same but for the rule's name" in out, out
    # a counterfactual under the run's own rule compares every field of the credits:
    # "equal", as it is; its groups' rule has another name (std in place of mean)
    code, out, _ = audit(capsys, str(run), "credit", "--set", "std_norm=true")
    rows = {line.split()[0]: line for line in out.splitlines()[1:5]}
    assert code == 0 and "counterfactual" in out, out
    assert rows["credit_assigned"].endswith(" equal"), out
    assert rows["advantages_computed"].endswith(" the same but for the formula's name"), out


def test_one_entry_s_credits_per_episode_recorded_and_counterfactual(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The per-entry table gave a sum only: which episodes moved an entry's credit under
    another rule was not to be had from the audit."""
    a = audit_json(capsys, str(run), "credit", "--rule", "relative", "--entry", "4")
    rows = [(c["episode"], c["success"], c["recorded"], c["derived"]) for c in a["entry_credits"]]
    assert a["entry"] == 4 and rows == [("ep006", True, 1.0, 0.0)]  # no group: 0
    own = audit_json(capsys, str(run), "credit", "--entry", "2")
    rows = [(c["episode"], c["success"], c["recorded"], c["derived"]) for c in own["entry_credits"]]
    assert rows == [("ep002", True, 1.0, 1.0), ("ep003", False, -1.0, -1.0)]
    code, out, _ = audit(capsys, str(run), "credit", "--entry", "2")
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  entry 2: "))
    assert "2 credited episodes, sum +0.000 -> +0.000" in lines[at]
    _, one, _ = audit(capsys, str(run), "credit", "--entry", "4")
    assert "  entry 4: 1 credited episode, sum " in one
    assert lines[at + 1].split() == ["ep002", "success", "+1.000", "(0)", "->", "+1.000", "(0)"]
    assert lines[at + 2].split() == ["ep003", "failure", "-1.000", "(0)", "->", "-1.000", "(0)"]
    assert code == 0 and len(lines) == at + 3
    # a credit's update that never came (a batch of 3 never fills) is not shown as if made
    code, out, _ = audit(capsys, str(run), "credit", "--entry", "2", "--set", "batch=3")
    row = next(line for line in out.splitlines() if line.lstrip().startswith("ep002"))
    assert row.split()[2:] == ["+1.000", "(0)", "->", "+1.000", "(0,", "not", "made)"], out
    made = audit_json(capsys, str(run), "credit", "--entry", "2", "--set", "batch=3")
    assert [(c["recorded_made"], c["derived_made"]) for c in made["entry_credits"]] == [
        (True, False),
        (True, False),
    ]
    quoted = audit_json(capsys, str(run), "credit", "--set", 'counts="Weighted"')
    assert quoted["counts"] == "weighted"  # quoted as a run's --set writes text, any case
    plain = audit_json(capsys, str(run), "credit")  # not asked: none listed
    assert plain["entry"] is None and plain["entry_credits"] == []


OWN_RULES = """
from agents.methods.base import mode_of
from agents.methods.credit import relative_credit


def relative(episode, group):
    if group is None:
        return 0.0
    modes = group.rollouts or ("plain",) * len(group.episodes)
    free = [r for r, m in zip(group.rewards, modes) if not mode_of(m).guided]
    return relative_credit(group.rewards[group.episodes.index(episode.episode)], free)


def score(episode, group):
    return 2.0 * episode.score - 1.0


def broken(episode, group):
    return {}[episode.episode]


def nan(episode, group):
    return float("nan")


CALLED = []


def spy(episode, group):
    CALLED.append(episode.episode)
    return 1.0


def numpy_half(episode, group):
    import numpy

    return numpy.float32(0.5)


def past_floats(episode, group):
    return 10**400


def huge(episode, group):
    return 1e308


def decimal_past(episode, group):
    from decimal import Decimal

    return Decimal("1e400")


def decimal_half(episode, group):
    from decimal import Decimal

    return Decimal("0.5")


def yes(episode, group):
    return True


def numpy_yes(episode, group):
    import numpy

    return numpy.bool_(True)


class Stop(BaseException):
    pass


def base_exc(episode, group):
    raise Stop("not an Exception")


def _real(error, name):  # a number registered as a Real whose float() raises error
    import numbers

    def no_float(self):
        raise error

    real = type(name, (), {"__float__": no_float, "__repr__": lambda self: f"{name}()"})
    numbers.Real.register(real)
    return real()


def unfloatable(episode, group):
    return _real(TypeError("no float of me"), "Odd")


def raising_float(episode, group):
    return _real(RuntimeError("float boom"), "Boom")


def longdouble_past(episode, group):
    import numpy

    return numpy.longdouble("1e400")


def tensor(episode, group):
    class Tensor:
        def __repr__(self):
            return "tensor(0.5)"

    return Tensor()


def noisy(episode, group):
    print("RULE-NOISE", episode)
    return relative(episode, group)
"""


def test_a_credit_rule_of_ones_own_is_named_by_its_import_path(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--rule`` took only the built-in rules: a researcher's own rule, written again here
    for two of them, re-derives exactly what the built-in does."""
    (tmp_path / "my_rules.py").write_text(OWN_RULES)
    monkeypatch.syspath_prepend(str(tmp_path))
    for mine, builtin in (("my_rules:relative", "relative"), ("my_rules:score", "score")):
        a = audit_json(capsys, str(run), "credit", "--rule", mine)
        b = audit_json(capsys, str(run), "credit", "--rule", builtin)
        assert a["counterfactual"] and a["rule"] == mine

        def counts(x: Any) -> list[tuple[Any, ...]]:
            return [(c["kind"], c["recorded"], c["derived"], c["equal"]) for c in x["checks"]]

        assert counts(a) == counts(b)
        assert {k: v for k, v in a.items() if k not in ("rule", "checks")} == {
            k: v for k, v in b.items() if k not in ("rule", "checks")
        }
    for rule, says in (
        ("my_rules:broken", "credit rule 'my_rules:broken' raised KeyError on episode ep"),
        ("my_rules:nan", "gave nan for episode ep"),
        ("my_rules:absent", "credit rule module 'my_rules' has no function 'absent'"),
        ("no_such_rules:x", "cannot import credit rule module 'no_such_rules': ModuleNotFound"),
        ("my rules:x", "bad credit rule import path"),
        (
            "my_rules:past_floats",
            "gave 1" + "0" * 58 + "... (401 characters) for episode ep002: too large for a float",
        ),
        ("my_rules:decimal_past", "gave Decimal('1E+400') for episode ep002: too large for a"),
        ("my_rules:huge", "credit rule 'my_rules:huge': its credits are too large to add up"),
        ("my_rules:yes", "gave True for episode ep002: a bool, not a number"),
        ("my_rules:numpy_yes", "gave np.True_ for episode ep002: a bool, not a number"),
        ("my_rules:base_exc", "credit rule 'my_rules:base_exc' raised Stop on episode ep"),
        ("my_rules:unfloatable", "gave Odd() for episode ep002: not a real number (a Odd"),
        ("my_rules:raising_float", "gave Boom() for episode ep002, whose float() raised Runtim"),
        ("my_rules:longdouble_past", "for episode ep002: too large for a float"),
        ("my_rules:tensor", "gave tensor(0.5) for episode ep002: not a real number (a Tensor"),
        ("my_rules.py:half", "(a module's name, not its file: 'my_rules:half')"),
        ("engine:half", "('engine' is coevo's own package, at "),
    ):
        code, out, err = audit(capsys, str(run), "credit", "--rule", rule)
        assert code == 2 and out == "" and err.count("\n") == 1 and says in err, err
    # a typo in a module of coevo's own is a typo, not a module of the user's to rename
    code, _, err = audit(capsys, str(run), "credit", "--rule", "agents.audit.credit:nothing")
    assert code == 2 and "has no function 'nothing'" in err and "rename it" not in err, err
    # summed per entry too, where no extractor update is formed (a batch never filled)
    code, out, err = audit(
        capsys, str(run), "credit", "--rule", "my_rules:huge", "--set", "batch=99"
    )
    assert code == 2 and out == "" and "its credits are too large to add up" in err, err
    _, _, err = audit(capsys, str(run), "credit", "--rule", "no_such_rules:x")
    assert "(is its directory on PYTHONPATH? the current directory is" in err, err
    assert audit_json(capsys, str(run), "credit", "--rule", "my_rules:decimal_half")[
        "counterfactual"
    ]
    code, out, err = audit(capsys, str(run), "credit", "--rule", "my_rules:noisy", "--json")
    assert code == 0 and json.loads(out)["rule"] == "my_rules:noisy"  # its prints: stderr
    assert "RULE-NOISE" in err and "RULE-NOISE" not in out
    half = audit_json(capsys, str(run), "credit", "--rule", "my_rules:numpy_half")
    assert half["counterfactual"]  # a NumPy number is a number
    import my_rules  # pyright: ignore[reportMissingImports]

    my_rules.CALLED.clear()
    audit_json(capsys, str(run), "credit", "--rule", "my_rules:spy")
    # asked only for the guided training episodes, each once: the credited ones
    credited = sorted({e.event.episode for e in STREAM.envs if isinstance(e.event, CreditAssigned)})
    assert sorted(my_rules.CALLED) == credited and len(credited) == 3


def test_counterfactual_settings(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bigger = audit_json(capsys, str(run), "credit", "--set", "batch=3")
    assert bigger["requests"] == [1, 0]  # two calls never fill a batch of three
    std = audit_json(capsys, str(run), "credit", "--set", "std_norm=true")
    assert (std["samples"], std["samples_changed"], std["sample_sign_flips"]) == (4, 4, 0)
    flat = audit_json(capsys, str(run), "credit", "--set", "split=false")
    assert flat["samples_changed"] == 0  # balanced rewards: one group gives the same
    same = audit_json(capsys, str(run), "credit", "--set", "reweight=false")
    assert same["counterfactual"] and same["credits_changed"] == 0
    own = audit_json(capsys, str(run), "credit", "--set", "std_norm=false", "--set", "split=true")
    assert not own["counterfactual"] and own["match"]  # the run's own settings, set again


def test_a_run_without_extractor_credit_says_so_and_refuses_credit_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = Stream()
    s.episode("ep000", 0, success=True)
    s.episode("ep001", 1, success=False, tip=3, call="")  # a reflection's tip: no credit
    run = write_run(tmp_path, s.envs)
    code, out, _ = audit(capsys, str(run), "credit")
    assert code == 0 and "no extractor credit in this run" in out and "rule " not in out
    refused = [("--rule", "relative"), ("--set", "batch=3"), ("--set", "reweight=false")]
    refused += [("--rule", "success"), ("--set", "batch=2")]  # the run's own: refused all the same
    for args in refused:
        code, out, err = audit(capsys, str(run), "credit", *args)
        assert code == 2 and out == "" and "has no extractor credit to re-derive" in err, err


def test_the_subgroups_shown_are_the_run_s_own_unless_set(
    run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The header said ``split=True, weighted=True`` for a run whose scenario had neither
    unless ``--set`` gave them; and ``weighted=false`` changing no advantage read as groups
    none of which was equal (their rule's name differs)."""
    import audit_golden  # pyright: ignore[reportMissingImports]

    monkeypatch.setattr(
        audit_golden, "TOML", TOML + "subgroups = false\nsubgroup_weights = false\n"
    )
    unsplit = write_run(tmp_path, STREAM.envs)
    code, out, _ = audit(capsys, str(unsplit), "credit", "--json")  # not the recorded groups
    a = json.loads(out)
    assert code == 1 and not a["match"] and (a["split"], a["weighted"]) == (False, False)
    b = audit_json(capsys, str(unsplit), "credit", "--set", "split=true")
    assert (b["split"], b["weighted"]) == (True, False)
    flat = audit_json(capsys, str(run), "credit", "--set", "weighted=false")
    groups = next(c for c in flat["checks"] if c["kind"] == "advantages_computed")
    assert flat["samples_changed"] == 0 and groups["equal"] == groups["recorded"] > 0, groups
    _, out, _ = audit(capsys, str(run), "credit", "--set", "weighted=false")
    assert "the same but for the formula's name" in out
    # given as the run's own value (no counterfactual): shown as given, not as the default
    own = json.loads(audit(capsys, str(unsplit), "credit", "--set", "split=false", "--json")[1])
    assert not own["counterfactual"] and (own["split"], own["weighted"]) == (False, False)


def test_a_live_run_indexes_only_its_new_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = next(i for i, e in enumerate(STREAM.envs) if e.event.__struct_config__.tag == "merge_due")
    root = write_run(tmp_path, STREAM.envs[:cut])
    assert audit_json(capsys, str(root), "tip", "0")["uses"] == []
    with LmdbFactIndex.open(root / INDEX_DIR, index_ident("golden")) as index:
        assert index.upto == cut
    log = LmdbEventLog.open(root / "log", writable=True, durable=False)
    try:
        log.append(STREAM.envs[cut:])
        assert audit_json(capsys, str(root), "tip", "0")["evicted"] == "merge"
        extra = Envelope(
            seq=len(STREAM.envs),
            run="golden",
            t=0,
            actor="memory",
            event=TipsRetrieved(
                episode="ep008",
                worker="w0",
                turn=0,
                slot="train/heat",
                tip_ids=(4,),
                similarities=(0.5,),
                ranks=(0,),
                tips=("t",),
                similar=1,
                slot_size=3,
            ),
        )
        log.append([extra])
        uses = audit_json(capsys, str(root), "tip", "4")["uses"]
        assert [(u["episode"], u["ended"]) for u in uses] == [("ep006", True), ("ep008", False)]
    finally:
        log.close()
    with LmdbFactIndex.open(root / INDEX_DIR, index_ident("golden")) as index:
        assert index.upto == len(STREAM.envs) + 1


def test_an_index_place_that_is_empty_or_holds_other_files_is_refused(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--index ""`` meant the run's own index, and ``--index DIR`` of a directory holding
    the user's files wrote the index's ``data.mdb`` and ``lock.mdb`` among them."""
    code, out, err = audit(capsys, str(run), "tip", "2", "--index", "")
    assert (code, out) == (2, "") and err == (
        "coevo: error: --index is empty (''); give a path, or leave --index out\n"
    )
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    code, out, err = audit(capsys, str(run), "tip", "2", "--index", str(mine))
    assert (code, out, err.count("\n")) == (2, "", 1), err
    assert "holds notes.txt, not an audit index; name an empty directory" in err
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    code, out, err = audit(capsys, str(run), "tip", "2", "--index", str(tmp_path / "new"))
    assert code == 0 and "written by extractor call" in out  # a new one, and again
    assert audit(capsys, str(run), "tip", "2", "--index", str(tmp_path / "new"))[:2] == (0, out)


def test_an_unwritable_index_place_falls_back_to_memory(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    code, out, err = audit(capsys, str(run), "tip", "2", "--index", str(tmp_path / "file"))
    assert code == 0 and "written by extractor call" in out
    assert err.startswith(  # it said "([Errno 17] File exists: ...)"
        f"coevo: note: cannot keep the audit index in {tmp_path / 'file'} (a file, not a "
        "directory); indexing in memory"
    )


@pytest.mark.parametrize("writer_lock", [True, False])
def test_an_index_named_in_an_event_log_s_directory_is_refused_and_the_log_kept(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], writer_lock: bool
) -> None:
    """``--index RUN/log`` took the run's own log (open in the process) for a damaged index
    and removed it: every event lost, exit 0. ``--index OTHER/log`` wrote an index's databases
    into another run's log. Both are refused, the logs left as they were, with or without the
    writer's lock file in the log's directory (a copy may lack it)."""
    own, other = tmp_path / "own", tmp_path / "other"
    for place in (own, other):
        shutil.copytree(run, place)
        (place / "log" / LOCK_FILE).unlink(missing_ok=True)
        if writer_lock:
            (place / "log" / LOCK_FILE).write_bytes(b"")
    before = {p: (p / "log" / DATA_FILE).read_bytes() for p in (own, other)}
    for index in (own / "log", other / "log"):
        code, out, err = audit(capsys, str(own), "tip", "2", "--index", str(index))
        assert (code, out, err.count("\n")) == (2, "", 1), err
        assert err.startswith(f"coevo: error: {index}: ") and "not an audit index" in err
    for place, data in before.items():
        assert (place / "log" / DATA_FILE).read_bytes() == data
        assert sorted(p.name for p in (place / "log").iterdir() if p.suffix == ".mdb") == [
            DATA_FILE,
            "lock.mdb",
        ]


def test_an_entry_the_run_never_stored_is_told_with_the_ids_it_did(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "no entry 99 in this run" left a reader to guess which ids exist (the bank numbers
    them 0, 1, 2, ... as it stores them)."""
    stored = [e.event for e in STREAM.envs if isinstance(e.event, TipStored)]
    assert [t.tip_id for t in stored] == list(range(len(stored))) and len(stored) > 2
    for asked in (len(stored), 99, 1 << 40):
        code, out, err = audit(capsys, str(run), "tip", str(asked))
        assert (code, out) == (2, ""), err
        assert f"no entry {asked} in this run: its entries are 0-{len(stored) - 1}" in err, err


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("tip", "abc"), "entry id must be a non-negative integer"),
        (("tip", "²"), "entry id must be a non-negative integer"),  # isdigit() but not int()
        (("tip", "99"), "no entry 99 in this run"),
        (("tip", str(1 << 64)), f"no entry {1 << 64} in this run"),
        (("episode", "ep999"), "no episode 'ep999'"),
        (("credit", "--rule", "luck"), "unknown credit rule 'luck'"),
        (("credit", "--set", "beta=1"), "--set 'beta=1': no setting 'beta', KEY one of"),
        (("credit", "--set", "alpha"), "--set 'alpha': expected KEY=VALUE, KEY one of"),
        (("credit", "--set", "batch=0"), "--set batch=0: must be >= 1"),
        (("credit", "--set", "cooldown=1.5"), "--set cooldown=1.5: must be a whole number"),
        (("credit", "--set", "alpha=x"), "--set alpha=x: must be a number"),
        (  # which of the two won depended on their order
            ("credit", "--set", "alpha=0.7", "--set", "reweight=false"),
            "--set reweight=false and --set alpha=0.7: reweight sets alpha and cooldown",
        ),
        (
            ("credit", "--set", "reweight=true", "--set", "cooldown=2"),
            "--set reweight=true and --set cooldown=2: reweight sets",
        ),
        (("credit", "--set", "split=maybe"), "must be true or false"),
        (("credit", "--top", "-1"), "--top must be >= 0"),
        (("credit", "--set", "counts=all"), "--set counts=all: must be pushed or weighted"),
        (("credit", "--entry", "4", "--set", 'counts="Weighted"', "--set", "batch=0"), "batch=0"),
        (("credit", "--entry", "-3"), "entry id must be a non-negative integer"),
        (("credit", "--entry", "3"), "--entry 3: no credit to it, recorded or re-derived"),
        (("credit", "--entry", "7"), "--entry 7: no entry 7 in this run: its entries are 0-4"),
        (("credit", "--entry", "0", "--until", "10"), "--entry 0: no credit to it up to seq 10"),
        (
            ("credit", "--entry", "4", "--until", "10"),
            "--entry 4: no entry 4 in this run up to seq 10: its entries are 0-0",
        ),
    ],
)
def test_bad_questions_are_one_line_errors(
    run: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], fragment: str
) -> None:
    code, out, err = audit(capsys, str(run), *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("coevo: error: ") and fragment in err


def test_not_a_run_directory_is_a_one_line_error(tmp_path: Path) -> None:
    coevo = str(Path(sys.executable).parent / "coevo")
    proc = subprocess.run(
        [coevo, "audit", str(tmp_path), "tip", "1"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"coevo: error: {tmp_path}: not a coevo run directory (no log/data.mdb inside)"
    ]


def _copy_with_index(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / INDEX_DIR, ignore_errors=True)
    audit(capsys, str(copy), "tip", "2")  # builds the index
    return copy


def test_a_truncated_index_is_rebuilt_not_a_crash(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The index is a cache of the log: a truncated file made LMDB touch pages past its end
    and the process died of SIGBUS (``coevo serve`` with it). It is checked as the log is,
    and rebuilt from the log."""
    copy = _copy_with_index(run, tmp_path, capsys)
    want = audit(capsys, str(copy), "tip", "2")[1]
    data = copy / INDEX_DIR / "data.mdb"
    data.write_bytes(data.read_bytes()[:20_000])
    coevo = str(Path(sys.executable).parent / "coevo")
    proc = subprocess.run(
        [coevo, "audit", str(copy), "tip", "2"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == want
    assert proc.stderr.startswith("coevo: note: the audit index in ")
    assert "was damaged" in proc.stderr and "rebuilt it from the log" in proc.stderr
    assert audit(capsys, str(copy), "tip", "2") == (0, want, "")  # whole again


DAMAGE = """
import sys, lmdb
env = lmdb.open(sys.argv[1], max_dbs=2)
facts = env.open_db(b"facts")
with env.begin(write=True) as txn:
    for key, value in list(txn.cursor(facts)):
        txn.put(key, bytes([value[0] ^ 1]) + value[1:], db=facts)
"""


def _damage_every_fact(copy: Path) -> None:
    """Flip a bit of every fact's value, in a process of its own (as another program or the
    disk would: LMDB opens an environment once per process)."""
    subprocess.run([sys.executable, "-c", DAMAGE, str(copy / INDEX_DIR)], check=True)


def test_a_fact_that_fails_its_checksum_rebuilds_the_index(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged value on an intact page (which no page check sees) was decoded as it was:
    tracebacks, or a silently wrong answer. Every fact carries a CRC of its key and value."""
    copy = _copy_with_index(run, tmp_path, capsys)
    want = audit(capsys, str(copy), "episode", "ep002")
    _damage_every_fact(copy)
    code, out, err = audit(capsys, str(copy), "episode", "ep002")
    assert (code, out) == want[:2]
    assert err.startswith("coevo: note: the audit index in ") and "fails its CRC" in err


def test_the_browser_rebuilds_a_damaged_index_it_holds_open(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agents.browse.data import RunView

    copy = _copy_with_index(run, tmp_path, capsys)
    view = RunView.open("run", copy)
    try:
        want = view.entry("2")
        _damage_every_fact(copy)  # under the open view, as a disk would
        assert view.entry("2") == want
        assert "was damaged" in view.note and "rebuilt it from the log" in view.note
        assert view.episodes({})  # read again from the rebuilt index
    finally:
        view.close()


def test_a_credit_no_update_used_reads_not_yet_until_the_run_ended(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A completed run's credit that no update trained on was shown "pending", as if an
    update were still to come; then "none" where the browser's page said "none (the run
    completed first)" of the same credit (one wording now, ``unused_text``)."""
    from agents.audit.answers import TipAudit
    from agents.audit.render import render_tip

    a = msgspec.convert(audit_json(capsys, str(run), "tip", "2"), TipAudit)
    unused = msgspec.structs.replace(a.credits[0], update=-1)
    a = msgspec.structs.replace(a, credits=(unused,))
    # a failed or stopped run's credit waits for a resume, and says why it has none yet
    for end, said in (
        ("", "not yet"),
        ("completed", "none (the run completed first)"),
        ("failed", "none (the run failed first)"),
    ):
        rows = render_tip(msgspec.structs.replace(a, run_end=end))
        [row] = [r for r in rows if r.strip().startswith(str(unused.seq))]
        assert row.endswith(said), row
    step = msgspec.structs.replace(a.updates[0], version=-1)
    for end, said in (("", "(not applied yet)"), ("stopped", "the run stopped before it")):
        rows = render_tip(msgspec.structs.replace(a, updates=(step,), run_end=end))
        assert any(r.startswith("  extractor update") and said in r for r in rows), rows


def test_a_credit_not_recorded_yet_is_no_change_of_its_entry_s_sum(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--until`` just before a credit was recorded listed the entry as "+0.000 -> -1.000",
    a change, beside "credits changed: 0" (the recorded sum lacks the credit not yet written)."""
    first = next(e for e in STREAM.envs if isinstance(e.event, CreditAssigned))
    assert isinstance(first.event, CreditAssigned)
    code, out, err = audit(capsys, str(run), "credit", "--until", str(first.seq - 1))
    assert code == 0, err
    assert "credits changed: 0" in out
    [row] = [r for r in out.splitlines() if r.split()[:1] == [str(first.event.entry)]]
    assert row.endswith("(1 not recorded yet: not in the recorded sum)"), row
    data = audit_json(capsys, str(run), "credit", "--until", str(first.seq - 1))
    [entry] = [e for e in data["entries"] if e["tip"] == first.event.entry]
    assert entry["pending"] == 1


def test_an_update_that_gave_a_call_no_push_did_not_train_on_it() -> None:
    """A call an update weighed 0 (a cooldown) or gave advantage 0 (calls of one reward) was
    counted among "the updates that trained on it", which left its log-probs where they were."""
    from agents.audit.credit import _pushes  # pyright: ignore[reportPrivateUsage]
    from agents.events.extractor import ExtractorGradientRequested

    def request(update: int, adv: tuple[float, ...], w: tuple[float, ...]) -> Any:
        return ExtractorGradientRequested(
            update=update,
            step=update,
            calls=("x1", "x2"),
            rewards=(1.0, -1.0),
            advantages=adv,
            weights=w,
            credits=(),
            lr=1e-4,
        )

    pushes = _pushes([request(0, (0.0, 0.0), (1.0, 1.0)), request(1, (1.0, -1.0), (0.0, 0.5))])
    assert pushes == {"x1": (1.0, 0.0, 0), "x2": (-1.0, -0.5, 1)}


def test_an_index_made_from_another_copy_of_the_log_is_rebuilt(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run copied and resumed apart keeps its run id: an index that read further than this
    log (an older copy beside a newer index), or read the other copy's events, answered from
    events this log does not hold (a wrong episode, or an assertion's traceback)."""
    import shutil

    full = _copy_with_index(run, tmp_path / "full", capsys)
    want = audit(capsys, str(full), "tip", "4")[1]
    cut = next(i for i, e in enumerate(STREAM.envs) if e.event.__struct_config__.tag == "merge_due")
    older = write_run(tmp_path / "older", STREAM.envs[:cut])  # the same run, earlier
    shutil.copytree(full / INDEX_DIR, older / INDEX_DIR)
    code, out, err = audit(capsys, str(older), "tip", "0")
    assert code == 0 and json.loads(audit(capsys, str(older), "tip", "0", "--json")[1])
    assert err.startswith(f"coevo: note: the audit index in {older / INDEX_DIR} was made from ")
    assert f"(it reaches seq {len(STREAM.envs) - 1}, the log ends at seq {cut - 1})" in err
    fresh = write_run(tmp_path / "fresh", STREAM.envs[:cut])
    assert (code, out) == audit(capsys, str(fresh), "tip", "0")[:2]
    # as long, but its last event is another one (the other copy's, after a resume)
    other = [*STREAM.envs[:-1], msgspec.structs.replace(STREAM.envs[-1], t=STREAM.envs[-1].t + 1)]
    apart = write_run(tmp_path / "apart", other)
    shutil.copytree(full / INDEX_DIR, apart / INDEX_DIR)
    code, out, err = audit(capsys, str(apart), "tip", "4")
    assert code == 0 and out == want
    assert f"(its event {len(STREAM.envs) - 1} is not the log's); rebuilt it from this log" in err
    assert audit(capsys, str(apart), "tip", "4") == (0, want, "")


def test_an_index_of_a_log_written_anew_with_edited_events_is_rebuilt(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log written anew from the run's events with one changed in the middle (its
    metadata copied, so the run id and the last event the same) was answered from the index
    of the old one: stale outcomes, or an assertion's traceback."""
    import shutil

    from agents.events.episodes import EpisodeFinished

    full = _copy_with_index(run, tmp_path / "full", capsys)
    edited = [
        msgspec.structs.replace(e, event=msgspec.structs.replace(e.event, success=True, score=1.0))
        if isinstance(e.event, EpisodeFinished) and not e.event.success
        else e
        for e in STREAM.envs
    ]
    fresh = write_run(tmp_path / "fresh", edited)
    want = {tip: audit(capsys, str(fresh), "tip", str(tip)) for tip in range(5)}
    before = {tip: audit(capsys, str(full), "tip", str(tip))[1] for tip in range(5)}
    assert any(want[tip][1] != before[tip] for tip in want)  # the edit shows in some answer
    apart = write_run(tmp_path / "apart", edited)
    shutil.copytree(full / INDEX_DIR, apart / INDEX_DIR)
    code, out, err = audit(capsys, str(apart), "tip", "0")
    assert (code, out) == want[0][:2]
    assert "this log was written anew after it: an edited or rebuilt copy has its own id" in err
    assert err.endswith("rebuilt it from this log\n"), err
    for tip in range(5):
        assert audit(capsys, str(apart), "tip", str(tip)) == (0, want[tip][1], "")


def test_an_index_made_before_logs_had_ids_is_rebuilt_and_said_to_be_older(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index an older coevo made of this very log was said to come from "another copy of
    this run's log ... written anew"."""
    import shutil

    from agents.audit import index

    shutil.copytree(run / "log", tmp_path / "older" / "log")
    made = index._mark  # pyright: ignore[reportPrivateUsage]
    with monkeypatch.context() as m:  # the mark as a coevo before 2026-12-07 wrote it
        m.setattr(index, "_mark", lambda seq, t, log_id: made(seq, t, ""))
        want = audit(capsys, str(tmp_path / "older"), "tip", "4")
    code, out, err = audit(capsys, str(tmp_path / "older"), "tip", "4")
    assert (code, out) == want[:2]
    assert err == (
        f"coevo: note: the audit index in {tmp_path / 'older' / INDEX_DIR} was made by an older "
        "coevo, which did not record which log it read; rebuilt it from this log\n"
    )
    assert audit(capsys, str(tmp_path / "older"), "tip", "4") == (0, want[1], "")


def test_numbers_that_round_to_zero_are_unsigned_zeros_and_a_reflection_is_named() -> None:
    """A mean advantage of -1e-17 read "-0.0000"; an entry a reflection wrote was retrieved
    "(no extractor call; ...)"."""
    from agents.audit.episode import Shown, Turn
    from agents.audit.render import _turn  # pyright: ignore[reportPrivateUsage]
    from agents.audit.shown import number_text as _f

    assert [_f(-1e-17, 4), _f(-0.0), _f(-0.0004, 3, 9), _f(None, 3, 3)] == [
        "+0.0000", "+0.000", "   +0.000", "  -",
    ]  # fmt: skip
    assert _f(-0.0006) == "-0.001"
    seen = Shown(tip=5, call="", rank=0, similarity=0.9, score=None, text="t")
    turn = Turn(turn=0, observation="o", admissible=("a",), retrieved=(seen,), action="a")
    assert "retrieved entry 5 (written by a reflection; rank 0" in "\n".join(_turn(turn))


def test_a_re_ranking_score_is_shown_only_for_the_rule_that_has_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """EMPO2's threshold rule has no re-ranking score: every use of a tip read "score -" and
    every retrieved entry "score -", as if a score were missing."""
    from agents.audit.episode import Shown, Turn
    from agents.audit.render import _turn  # pyright: ignore[reportPrivateUsage]

    def turn(score: float | None) -> str:
        seen = Shown(tip=5, call="", rank=0, similarity=0.9, score=score, text="t")
        return _turn(Turn(turn=0, observation="o", admissible=("a",), retrieved=(seen,)))[3]

    assert turn(None).endswith("rank 0, similarity 0.900): 't'"), turn(None)
    assert turn(0.5).endswith("similarity 0.900, re-ranking score +0.50): 't'"), turn(0.5)
    head = "seq      episode    turn pos rank  similarity  "
    code, out, _ = audit(capsys, str(write_run(tmp_path / "a", STREAM.envs)), "tip", "4")
    uses = out.split(head)[1].splitlines()
    assert code == 0 and uses[0] == "re-rank  outcome" and "0.750    -0.25  success" in uses[1]
    plain = [  # the same retrievals by the threshold rule
        e.__replace__(event=e.event.__replace__(scores=()))
        if isinstance(e.event, TipsRetrieved)
        else e
        for e in STREAM.envs
    ]
    code, out, _ = audit(capsys, str(write_run(tmp_path / "b", plain)), "tip", "4")
    uses = out.split(head)[1].splitlines()
    assert code == 0 and uses[0] == "outcome" and "0.750  success 1.00" in uses[1], out


@pytest.mark.parametrize("group", [False, True])
def test_a_request_recorded_with_lists_of_other_lengths_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], group: bool
) -> None:
    """An extractor update request with one weight more than calls was a ``zip`` traceback
    in the audit and "a bug in the invariant" in ``coevo check``."""
    from agents.events.extractor import ExtractorGradientRequested
    from agents.events.policy import AdvantagesComputed

    kind = AdvantagesComputed if group else ExtractorGradientRequested
    at = next(i for i, e in enumerate(STREAM.envs) if isinstance(e.event, kind))
    ev = STREAM.envs[at].event
    if isinstance(ev, AdvantagesComputed):
        bad = ev.__replace__(rewards=ev.rewards[1:])
        said = f"group {ev.group}: recorded with {len(ev.episodes)} episodes and "
    else:
        assert isinstance(ev, ExtractorGradientRequested)
        bad = ev.__replace__(weights=(*ev.weights, 0.0))
        said = f"extractor update request {ev.update} at seq {at}: recorded with "
    envs = [*STREAM.envs]
    envs[at] = envs[at].__replace__(event=bad)
    run = write_run(tmp_path / "run", envs)
    code, _, err = audit(capsys, str(run), "credit")
    assert code == 2 and err.startswith("coevo: error: ") and said in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert main(["check", str(run), "--invariant", "credit"]) == 1
    checked = capsys.readouterr()
    assert f"cannot re-derive: {said}" in checked.out + checked.err
    assert "a bug in the invariant" not in checked.out + checked.err
    if group:  # at the group's own event (it was the last one the check kept)
        assert f"invariant credit violated at seq {at}: " in checked.out, checked.out


@pytest.mark.parametrize("held", [0, 3])
def test_a_retrieval_that_showed_nothing_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], held: int
) -> None:
    """A guided episode whose family's partition was still empty showed no retrieval line at
    all: it read as if it had never asked the bank."""
    at = next(i for i, e in enumerate(STREAM.envs) if isinstance(e.event, TipsRetrieved))
    ev = STREAM.envs[at].event
    assert isinstance(ev, TipsRetrieved)
    empty = ev.__replace__(
        tip_ids=(), similarities=(), ranks=(), tips=(), similar=0, slot_size=held, scores=(),
        calls=(),
    )  # fmt: skip
    envs = [*STREAM.envs]
    envs[at] = envs[at].__replace__(event=empty)
    code, out, err = audit(capsys, str(write_run(tmp_path / "run", envs)), "episode", ev.episode)
    said = (
        "retrieved nothing: the memory slot was empty"
        if not held
        else "retrieved nothing: none of the slot's 3 entries was similar enough"
    )
    assert code == 0 and said in out, out + err


def test_a_group_no_update_trained_on_is_left_out_of_the_advantage_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Complementary RL's warm-up groups have advantages and train nothing: "episodes whose
    advantage changes" counted them (48 of 128 where 32 of the 128 were warm-up)."""
    from agents.events.policy import AdvantagesComputed

    first = next(e for e in STREAM.envs if isinstance(e.event, AdvantagesComputed))
    assert isinstance(first.event, AdvantagesComputed)
    named = tuple(f"warm{i}" for i in range(len(first.event.episodes)))
    warm = first.event.__replace__(group="g-warm", episodes=named)
    from agents.events.episodes import EpisodeFinished

    ended = {
        e.event.episode: e
        for e in STREAM.envs
        if isinstance(e.event, EpisodeFinished) and e.event.episode in first.event.episodes
    }
    copies = [
        ended[ep].__replace__(event=ended[ep].event.__replace__(episode=new), corr=new)
        for ep, new in zip(first.event.episodes, named, strict=True)
    ]
    envs = [*STREAM.envs]
    at = envs.index(first)
    envs[at:at] = [*copies, first.__replace__(event=warm)]
    envs = [e.__replace__(seq=i) for i, e in enumerate(envs)]
    std = ("credit", "--set", "std_norm=true")
    base = audit_json(capsys, str(write_run(tmp_path / "a", STREAM.envs)), *std)
    more = audit_json(capsys, str(write_run(tmp_path / "b", envs)), *std)
    assert more["samples"] == base["samples"] == 4


def test_an_entry_s_uses_are_counted_by_purpose_when_evaluation_shows_it_too() -> None:
    """An entry shown in 10 training and 14 evaluation episodes read "retrieved 24 times in 24
    episodes (3 succeeded)": one success rate over both kinds of episode."""
    from agents.audit.answers import Use
    from agents.audit.render import _by_purpose

    def use(i: int, purpose: str, success: bool, abandoned: bool = False) -> Use:
        return Use(
            seq=i, episode=f"ep{i}", turn=0, position=0, rank=0, similarity=0.5, score=None,
            alive=True, purpose=purpose, ended=True, success=success, abandoned=abandoned,
        )  # fmt: skip

    uses = [use(i, "train", i == 0) for i in range(10)]
    uses += [use(10 + i, "eval", i < 2) for i in range(14)] + [use(99, "eval", True, True)]
    assert _by_purpose(uses) == ": train 10 (1 succeeded), eval 14 (2 succeeded)"
    assert _by_purpose(uses[:10]) == ""  # one purpose: the headline says it all


def test_an_episode_without_an_advantage_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An aborted guided episode read "not a trained episode, or its group has not ended",
    though its group had ended: it aborted, and updates train on finished episodes only."""
    s = Stream()
    s.episode("ep000", 0, success=False, abort="the world raised")
    s.episode("ep001", 1, success=True)
    run = write_run(tmp_path, s.envs)
    code, out, _ = audit(capsys, str(run), "episode", "ep000")
    assert code == 0 and "advantage: none (it aborted: an update trains on finished" in out, out
    code, out, _ = audit(capsys, str(run), "episode", "ep001")
    assert code == 0 and "advantage: none (not a trained episode, or its group" in out, out


def test_a_rule_of_ones_own_says_how_far_it_got(capsys: pytest.CaptureFixture[str]) -> None:
    """A slow rule ran for minutes without a word: a line every few seconds says how many
    episodes it was called for (the built-in rules are quick and say nothing)."""
    from agents.audit.derive import RULE_DONE
    from scenarios.cli.audit import _rule_progress  # pyright: ignore[reportPrivateUsage]

    def until(said: str) -> str:  # the lines that came, once one says ``said`` (or 10 s)
        seen, deadline = "", time.monotonic() + 10
        while said not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
            seen += capsys.readouterr().err
        return seen

    for quick in (None, "relative"):
        with _rule_progress(quick) as tick:
            assert tick is None
    with _rule_progress("my_rules:slow", every=0.05) as tick:
        assert tick is not None
        tick(7)
        err = until("called for 7 episodes so far (")
        assert "coevo: credit rule 'my_rules:slow': called for 7 episodes so far (" in err, err
        tick(RULE_DONE)  # the rule has answered every episode: the rest is the audit's
        time.sleep(0.2)
        capsys.readouterr()
        time.sleep(0.2)
        assert capsys.readouterr().err == ""
    # a rule stuck in its first call: the lines come all the same (they came as calls returned)
    with _rule_progress("my_rules:stuck", every=0.05):
        err = until("called for 0 episodes so far (")
        assert "'my_rules:stuck': called for 0 episodes so far (" in err, err
    time.sleep(0.2)
    capsys.readouterr()
    time.sleep(0.2)
    assert capsys.readouterr().err == ""  # and stop with the audit


def test_credit_as_the_run_stood_after_a_seq(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--until SEQ``: the credits re-derived from the log up to that event, as a live run's
    audit would have read them then (the credit actor's answers not yet written: pending)."""
    credits = [e.seq for e in STREAM.envs if isinstance(e.event, CreditAssigned)]
    before = credits[1] - 1  # the second credit's inputs are in; the credit is not
    a = audit_json(capsys, str(run), "credit", "--until", str(before))
    rows = {c["kind"]: c for c in a["checks"]}
    assert a["events"] == before + 1 and a["match"]
    assert (rows["credit_assigned"]["recorded"], rows["credit_assigned"]["equal"]) == (1, 1)
    whole = audit_json(capsys, str(run), "credit")
    past = audit(capsys, str(run), "credit", "--until", "99999", "--json")
    assert past[0] == 0 and json.loads(past[1]) == whole
    last = len(STREAM.envs) - 1
    assert (
        past[2]
        == f"coevo: note: --until 99999 is past the log's end: its last event is seq {last}\n"
    )
    assert audit(capsys, str(run), "credit", "--until", "-1")[0] == 2
    # before the first credit: none yet, not "none in this run", and a rule is not refused
    code, out, err = audit(capsys, str(run), "credit", "--until", "3")
    assert code == 0 and "no extractor credit up to seq 3;" in out, err
    early = audit_json(capsys, str(run), "credit", "--until", "3", "--rule", "score")
    assert early["partial"] and not early["credited"]


def test_huge_credits_are_shown_in_scientific_notation() -> None:
    """A rule's 10**300 filled a row with 300 digits."""
    from agents.audit.shown import number_text as _f

    assert _f(1e300) == "+1.000e+300" and _f(-2.5e6, 2) == "-2.50e+06" and _f(999.5) == "+999.500"


def test_a_turn_whose_prompt_was_cut_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The episode audit listed the entries a turn retrieved as shown, though its prompt had
    lost tokens from its middle to fit the model (tips among them): said only in the run's
    ``coevo.jsonl``."""
    s = Stream()
    s.episode("ep000", 0, success=True, tip=3, call="", prompt_cut=40)
    run = write_run(tmp_path, s.envs)
    [t] = audit_json(capsys, str(run), "episode", "ep000")["turns"]
    assert t["prompt_cut"] == 40
    _, out, _ = audit(capsys, str(run), "episode", "ep000")
    assert "prompt cut: 40 tokens from its middle to fit the model" in out, out


def test_an_audit_s_text_keeps_its_line_breaks_and_carriage_returns_visible() -> None:
    """Texts were collapsed to one line by whitespace: an entry "try 'wait\\r'" read
    ``'wait '``, an observation lost its form feed and an extractor's response its line
    break, while ``--json`` kept them."""
    from agents.audit.episode import Shown, Turn
    from agents.audit.render import _turn  # pyright: ignore[reportPrivateUsage]

    seen = Shown(tip=5, call="", rank=0, similarity=0.9, score=None, text="try 'wait\r'\nnow")
    lines = _turn(Turn(turn=0, observation="a\fb\tc", admissible=("a",), retrieved=(seen,)))
    assert "obs: 'a\\x0cb\\tc'" in lines[1], lines
    assert lines[3].endswith(": \"try 'wait\\r'\\nnow\""), lines
