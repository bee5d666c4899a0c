"""The public event strategies (``engine.strategies``): every registered event type has one,
derived from its schema, and what it draws is an event the log can record and read back."""

from __future__ import annotations

import decimal
import subprocess
import sys
from typing import Annotated, Literal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.events import Codec, Envelope, Event, event_types
from engine.strategies import event_strategy, events, register_strategy, strategy_gaps

CODEC = Codec()
TYPES = sorted(event_types().values(), key=lambda c: str(c.__struct_config__.tag))


def test_every_registered_event_type_has_a_strategy() -> None:
    """A new event type whose fields have no derivation fails here until it registers one."""
    assert len(TYPES) >= 30
    assert strategy_gaps() == {}


@pytest.mark.parametrize("cls", TYPES, ids=lambda c: str(c.__struct_config__.tag))
@settings(max_examples=15)
@given(data=st.data())
def test_each_type_draws_events_that_round_trip(cls: type[Event], data: st.DataObject) -> None:
    ev = data.draw(event_strategy(cls))
    assert type(ev) is cls
    CODEC.check(ev)
    env = Envelope(seq=3, run="r", t=0, actor="a", event=ev, v=cls.version)
    assert CODEC.decode(CODEC.encode(env), 3) == env


class Ledger(Event, tag="test_ledger", frozen=True, kw_only=True):
    """A plug-in's event (not registered in the union, so other tests never see it)."""

    amount: decimal.Decimal
    note: str = ""


class Ledgers(Event, tag="test_ledgers", frozen=True, kw_only=True):
    """Two fields without a derivation."""

    amount: decimal.Decimal
    owed: tuple[decimal.Decimal, ...] = ()


class Bounded(Event, tag="test_bounded", frozen=True, kw_only=True):
    level: Annotated[int, msgspec.Meta(ge=1, le=3)]
    colour: Literal["red", "blue"]
    ratio: Annotated[float, msgspec.Meta(gt=0.0, lt=1.0)]
    tags: Annotated[tuple[str, ...], msgspec.Meta(max_length=2)] = ()


def test_a_type_without_a_derivation_is_a_gap_until_it_registers_one() -> None:
    assert list(strategy_gaps([Ledger])) == ["Ledger"]
    assert "Ledger.amount" in strategy_gaps([Ledger])["Ledger"]
    with pytest.raises(TypeError, match="register_strategy"):
        event_strategy(Ledger)
    register_strategy(Ledger, amount=st.decimals(allow_nan=False, allow_infinity=False))
    assert strategy_gaps([Ledger]) == {}


def test_every_field_without_a_derivation_is_named_at_once() -> None:
    """A plug-in's author learns every field to register in one go, not one per try."""
    gap = strategy_gaps([Ledgers])["Ledgers"]
    assert "Ledgers.amount" in gap and "Ledgers.owed" in gap


class Stepped(Event, tag="test_stepped", frozen=True, kw_only=True):
    """Bounds the derivation ignored: a pattern's length, an int's multiple."""

    word: Annotated[str, msgspec.Meta(pattern="^[a-z]+$", min_length=2, max_length=3)]
    five: Annotated[int, msgspec.Meta(multiple_of=5, ge=-12, lt=40)]


class Digested(Event, tag="test_digested", frozen=True, kw_only=True):
    blob: Annotated[bytes, msgspec.Meta(min_length=4, max_length=6)]


@settings(max_examples=40)
@given(ev=event_strategy(Digested))
def test_a_bytes_fields_length_bounds_are_kept(ev: Digested) -> None:
    """``b''`` was drawn for a field of at least 4 bytes: an event ``emit`` refuses."""
    assert msgspec.json.decode(msgspec.json.encode(ev), type=Digested) == ev
    assert 4 <= len(ev.blob) <= 6


class Halves(Event, tag="test_halves", frozen=True, kw_only=True):
    half: Annotated[float, msgspec.Meta(multiple_of=0.5)]


@settings(max_examples=60)
@given(ev=event_strategy(Stepped))
def test_a_patterns_length_and_an_ints_multiple_are_kept(ev: Stepped) -> None:
    """Drawn events the codec refused ("Expected int that's a multiple of 5"; a 4-letter
    word for max_length 3), and strategy_gaps said nothing."""
    assert msgspec.json.decode(msgspec.json.encode(ev), type=Stepped) == ev  # validated
    assert 2 <= len(ev.word) <= 3 and ev.five % 5 == 0 and -12 <= ev.five < 40


def test_a_float_multiple_has_no_derivation_and_says_so() -> None:
    assert "multiple of 0.5" in strategy_gaps([Halves])["Halves"]


@settings(max_examples=60)
@given(ev=event_strategy(Bounded))
def test_schema_bounds_and_literals_are_kept(ev: Bounded) -> None:
    assert 1 <= ev.level <= 3
    assert ev.colour in ("red", "blue")
    assert 0.0 < ev.ratio < 1.0
    assert len(ev.tags) <= 2


@settings(max_examples=30)
@given(ev=events())
def test_any_registered_event_is_drawn_from_one_strategy(ev: Event) -> None:
    assert type(ev) in TYPES


def test_without_hypothesis_the_import_says_how_to_get_it_in_one_line() -> None:
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "try:\n    import engine.strategies\n"
        "except ModuleNotFoundError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "coevo's strategies need Hypothesis: pip install 'coevo[testing]'\n"


def test_the_users_testing_api_refuses_what_it_would_misread() -> None:
    """``event_strategy(int)`` was a bare AssertionError; ``runs(memory="bogus")`` a bare
    KeyError; a misspelt op in ``runs(ops=...)`` was never drawn, without a word; a
    ``check_only`` string was read letter by letter ("unknown invariant 'l'")."""
    from agents.testing.streams import runs
    from scenarios.harness import RunMachine

    with pytest.raises(TypeError, match="event_strategy takes an event class, got <class 'int'>"):
        event_strategy(int)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"runs\(memory='bogus'\): one of none, tips, extractor"):
        runs(memory="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"'strat', 'finsh': no such operation"):
        runs(ops=("assign", "strat", "finsh"))
    with pytest.raises(ValueError, match=r"runs\(ops='assign'\): a sequence of operations"):
        runs(ops="assign")
    with pytest.raises(ValueError, match=r"runs\(max_ops=-1\): the longest program"):
        runs(max_ops=-1)  # (hypothesis said "Cannot have max_value=-1 < min_value=0")
    with pytest.raises(ValueError, match=r"runs\(completed='yes'\): True, False, or None"):
        runs(completed="yes")  # type: ignore[arg-type]  (it was drawn as true)

    class Letters(RunMachine):
        scenario = 'name = "x"\n[agent]\nkind = "random"\n'
        check_only = "lamp-lit"  # type: ignore[assignment]

    with pytest.raises(TypeError, match=r"check_only = 'lamp-lit': a tuple of invariant names"):
        Letters()


def test_a_field_strategy_of_the_wrong_type_is_named_when_it_draws() -> None:
    """An outside tester: ``event_strategy(TipStored, slot=st.just(3))`` drew events whose
    ``slot`` was an int (the schema says str) without a word; the log would refuse them."""
    from hypothesis import find

    from agents.events.memory import TipStored

    wrong = event_strategy(TipStored, slot=st.just(3))
    with pytest.raises(ValueError, match=r"event_strategy\(TipStored, slot=\.\.\.\) drew an event"):
        find(wrong, lambda _: True)
    right = find(event_strategy(TipStored, slot=st.just("train/heat/0")), lambda _: True)
    assert right.slot == "train/heat/0"
