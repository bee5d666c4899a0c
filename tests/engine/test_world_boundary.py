"""What a world returns is checked at the env worker (issue 16, items 10-12): an observation
of the wrong types aborts its episode with a message naming the world call, numpy scalars are
converted, and no event that cannot be decoded is ever committed."""

from __future__ import annotations

import functools
import math
import os
import threading
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import structlog
import trio

from agents.acting.env_worker import EnvWorker
from agents.acting.projections import EpisodeTable
from agents.acting.scheduler import Scheduler
from agents.acting.scripted import RandomAgent
from agents.acting.world_calls import checked_observation
from agents.events.episodes import EpisodeAborted, EpisodeFinished, StepTaken
from engine.actor import Actor, ActorSpec, Context
from engine.errors import EventInvalid
from engine.eventlog import MemoryEventLog
from engine.events import Codec, Envelope, Event, event
from engine.lifecycle import ActorFailed, RunFailed, RunStarted, RunStopped
from engine.projection import ActorStats
from engine.replay import verify_log
from engine.runtime import Runtime, RuntimeConfig
from engine.world import Observation, Task
from scenarios.worlds.minilab import MiniLab

STARTED = RunStarted(run_id="r", scenario="t", scenario_hash="h", seed=5, coevo_version="0")


class OddWorld(MiniLab):
    """MiniLab whose ``step`` changes fields of its observation on turn 2 of the episodes of
    even variants (every episode with ``always``); ``odd`` maps a field to the value it gets.
    Which episodes, not which worker or when, decides."""

    def __init__(self, odd: dict[str, Any], always: bool = False) -> None:
        super().__init__(families=("fetch",), train_variants=20)
        self.odd, self.always = odd, always
        self.chosen = False
        self.turn = 0

    def reset(self, task: Task, seed: int) -> Observation:
        self.chosen, self.turn = self.always or task.variant % 2 == 0, 0
        return super().reset(task, seed)

    def step(self, action: str) -> Observation:
        self.turn += 1
        obs = super().step(action)
        if self.chosen and self.turn == 2 and not obs.done:
            return msgspec.structs.replace(obs, **self.odd)
        return obs


def run_world(
    make_world: Any, episodes: int = 8, max_turns: int = 0, signals: bool = False
) -> tuple[list[Any], Any]:
    """Run ``episodes`` random-agent episodes on two workers; every committed event is read
    back (decoded) from the log."""
    tasks = MiniLab(families=("fetch",), train_variants=20).tasks("fetch", "train")
    names = ["w0", "w1"]
    specs = [
        ActorSpec(name="scheduler", factory=partial(Scheduler, tasks, episodes, names), driver=True)
    ]
    specs += [
        ActorSpec(
            name=name,
            factory=partial(EnvWorker, make_world, RandomAgent, max_turns=max_turns),
            accepts=lambda ev, name=name: getattr(ev, "worker", None) == name,
        )
        for name in names
    ]
    log = MemoryEventLog()
    config = RuntimeConfig(handle_signals=signals)
    runtime = Runtime(log, STARTED, specs, [ActorStats(), EpisodeTable()], seed=5, config=config)
    outcome = trio.run(runtime.run)
    assert verify_log(log, [ActorStats(), EpisodeTable()]).ok
    return [env.event for env in log.read()], outcome


PAST = (
    "(an advantage or a gradient the learner computes from it in float32, or a mean or a "
    "credit, would overflow): give the world's scores a smaller scale"
)


@pytest.mark.parametrize(
    ("odd", "says"),
    [
        ({"text": None}, "returned an observation whose text is None, not a string"),
        ({"goal": 7}, "returned an observation whose goal is 7, not a string"),
        ({"admissible": ("look", 3)}, "whose admissible[1] is 3, not a string"),
        ({"admissible": "look"}, "whose admissible is 'look', not a tuple of strings"),
        ({"reward": "1"}, "whose reward is '1' (a str), not a float or an int"),
        ({"reward": Decimal("0.5")}, "reward is Decimal('0.5') (a Decimal), not a float or an int"),
        ({"score": 1e308}, f"whose score is 1e+308, past +/-1e+15 {PAST}"),
        ({"reward": -(10**15 + 1)}, f"whose reward is -1000000000000001, past +/-1e+15 {PAST}"),
        ({"score": 1.0000000000000002e15}, f"score is 1000000000000000.2, past +/-1e+15 {PAST}"),
        ({"score": float("nan")}, "whose score is nan, not a finite number"),
        ({"reward": 10**400}, f"whose reward is {'1' + '0' * 56}..., too large for a float"),
        ({"score": 10**5000}, "whose score is an int of 16610 bits, too large for a float"),
        ({"done": 1}, "whose done is 1, not a bool"),
        ({"admissible": ()}, "returned no admissible action on a turn that is not done"),
        ({"admissible": ("look", "")}, "whose admissible[1] is '', an empty action"),
        ({"admissible": ("look", " \t")}, "whose admissible[1] is ' \\t', an empty action"),
        ({"admissible": ("go", "look", "go")}, "whose admissible[2] 'go' repeats admissible[0]"),
        ({"admissible": ("look", "\u200b")}, "whose admissible[1] is '\\u200b', an empty action"),
        (
            {"admissible": ("caf\xe9", "look", "cafe\u0301")},
            "whose admissible[2] 'cafe\\u0301' repeats admissible[0] 'caf\\xe9' in another "
            "Unicode spelling (the same text once NFC-normalized)",
        ),
        (
            {"text": "a \ud800 b"},
            "text holds '\\ud800' at character 2, a lone surrogate that UTF-8 cannot encode",
        ),
        (
            {"admissible": ("look", "g\udcffo")},
            "admissible[1] holds '\\udcff' at character 1, "
            "a lone surrogate that UTF-8 cannot encode",
        ),
    ],
    ids=[
        "text None",
        "goal int",
        "int action",
        "str actions",
        "str reward",
        "decimal reward",
        "score past the limit",
        "int reward past the limit",
        "a float just past the limit",
        "nan",
        "int past float",
        "int past repr",
        "int done",
        "no action",
        "empty action",
        "blank action",
        "repeated action",
        "invisible action",
        "action in two spellings",
        "surrogate text",
        "surrogate action",
    ],
)
def test_an_observation_of_the_wrong_types_aborts_its_episode_naming_the_call(
    odd: dict[str, Any], says: str
) -> None:
    events, outcome = run_world(partial(OddWorld, odd))
    assert outcome.reason == "completed"
    aborted = [e for e in events if isinstance(e, EpisodeAborted)]
    finished = [e for e in events if isinstance(e, EpisodeFinished)]
    assert aborted and len(aborted) + len(finished) == 8
    for ev in aborted:
        assert ev.reason.startswith("ObservationInvalid: world.step('"), ev.reason
        assert ev.reason.endswith(says) and " on turn 1 returned " in ev.reason, ev.reason


class Mine(BaseException):
    """A plug-in's own BaseException (not an Exception)."""


class Raising(MiniLab):
    """A world whose second step raises ``error`` (in a worker thread when ``blocking``, else
    on the event loop's thread), and whose close does too."""

    def __init__(self, error: BaseException, blocking: bool) -> None:
        super().__init__(families=("fetch",))
        self.error, self.blocking = error, blocking

    def reset(self, task: Task, seed: int) -> Observation:
        self.turn = 0
        return super().reset(task, seed)

    def step(self, action: str) -> Observation:
        self.turn += 1
        if self.turn == 2:
            raise self.error
        return super().step(action)

    def close(self) -> None:
        raise self.error


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize(
    ("error", "says"),
    [
        (Mine("its own"), "RuntimeError: world.step raised Mine: its own"),
        # on the loop's thread while the runtime takes SIGINT as a stop: not the user's Ctrl-C
        (KeyboardInterrupt(), "RuntimeError: world.step raised KeyboardInterrupt"),
    ],
)
def test_a_world_raising_a_base_exception_aborts_the_episode_only(
    error: BaseException, says: str, blocking: bool
) -> None:
    """A plug-in's own BaseException ended the run with a traceback and no final event; a
    non-blocking world's KeyboardInterrupt stopped the run as a Ctrl-C (exit 130), and its
    resume again. A blocking world's, raised in its thread where no signal lands, is the
    world's own even where the runtime does not take SIGINT itself."""
    events, outcome = run_world(partial(Raising, error, blocking), signals=not blocking)
    assert outcome.reason == "completed"
    aborted = [e for e in events if isinstance(e, EpisodeAborted)]
    assert len(aborted) == 8 and all(e.reason == says for e in aborted), aborted[0].reason


class NeverDone(MiniLab):
    """A world whose episodes never end (a plug-in's bug): every step says not done."""

    def step(self, action: str) -> Observation:
        obs = super().step(action)
        return msgspec.structs.replace(obs, done=False, admissible=obs.admissible or ("look",))


def test_an_episode_the_world_never_ends_finishes_truncated_at_max_turns() -> None:
    events, outcome = run_world(partial(NeverDone, families=("fetch",)), max_turns=7)
    assert outcome.reason == "completed"
    finished = [e for e in events if isinstance(e, EpisodeFinished)]
    assert len(finished) == 8
    assert all(e.truncated and e.steps == 7 for e in finished)
    steps = [e for e in events if isinstance(e, StepTaken)]
    assert len(steps) == 8 * 7 and not any(e.done for e in steps)
    ended, _ = run_world(partial(MiniLab, families=("fetch",)), max_turns=1000)
    finished = [e for e in ended if isinstance(e, EpisodeFinished)]
    assert finished and not any(e.truncated for e in finished)  # minilab ends its own


def test_max_turns_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_turns must be >= 0, got -1"):
        EnvWorker(MiniLab, RandomAgent, max_turns=-1)


def test_numpy_scalars_from_a_world_are_recorded_as_numbers_and_bools() -> None:
    odd = {"reward": np.float32(0.25), "score": np.float64(0.5), "done": np.bool_(False)}
    events, outcome = run_world(partial(OddWorld, odd, always=True))
    assert outcome.reason == "completed"
    assert not [e for e in events if isinstance(e, EpisodeAborted | ActorFailed)]
    steps = [e for e in events if isinstance(e, StepTaken) and e.turn == 1]
    assert steps and all(type(e.reward) is float and type(e.done) is bool for e in steps)
    assert {e.reward for e in steps} == {0.25}


def test_checked_observation_converts_numpy_and_names_a_non_observation() -> None:
    obs = Observation(
        text="t",
        admissible=np.array(["a", "b"]),  # type: ignore[arg-type]
        goal="g",
        reward=np.int64(1),  # type: ignore[arg-type]
        done=np.bool_(True),  # type: ignore[arg-type]
        score=np.float32(1.0),  # type: ignore[arg-type]
        success=np.bool_(True),  # type: ignore[arg-type]
    )
    checked = checked_observation(obs, "world.step('a')")
    assert checked == Observation(
        text="t", admissible=("a", "b"), goal="g", reward=1.0, done=True, score=1.0, success=True
    )
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(checked), type=Observation) == checked
    with pytest.raises(Exception, match=r"world.reset\(x\) returned \{'text': 't'\}, not an Obs"):
        checked_observation({"text": "t"}, "world.reset(x)")


class Emitter(Actor):
    """Emits one step whose observation is None, as a world's unchecked text would make it."""

    subscribes = ()

    async def run(self, ctx: Context) -> None:
        bad = StepTaken(
            episode="e", turn=0, action="a", observation=None,  # type: ignore[arg-type]
            admissible=(), reward=0.0, done=True, score=0.0,
        )  # fmt: skip
        await ctx.emit(bad)


def test_an_event_that_would_not_decode_fails_its_actor_and_is_never_committed() -> None:
    log = MemoryEventLog()
    specs = [ActorSpec(name="emitter", factory=Emitter, driver=True)]
    outcome = trio.run(Runtime(log, STARTED, specs, [ActorStats()], seed=5).run)
    assert (
        outcome.reason == "failed"
        and "EventInvalid: step_taken cannot be recorded" in outcome.error
    )
    events = [env.event for env in log.read()]  # every committed event decodes
    assert not [e for e in events if isinstance(e, StepTaken)]
    assert isinstance(events[-1], RunFailed) and not isinstance(events[-1], RunStopped)
    assert outcome.error.endswith("Expected `str`, got `None` - at `$.observation`")
    with pytest.raises(EventInvalid, match=r"run_started cannot be recorded: .* `\$.run_id`"):
        Codec().check(msgspec.structs.replace(events[0], run_id=None))  # type: ignore[arg-type]
    with pytest.raises(EventInvalid, match="numpy"):
        Codec().check(msgspec.structs.replace(events[0], seed=np.int64(5)))  # type: ignore[arg-type]


class Unregistered(Event, frozen=True, kw_only=True, tag="unregistered_in_a_test"):
    """An event class its author forgot to decorate with ``@event``."""

    note: str


class Impostor(Event, frozen=True, kw_only=True, tag="step_taken"):
    """A class that takes a registered class's tag."""

    note: str


def test_only_registered_events_are_recorded() -> None:
    """An Event subclass without ``@event`` encoded and decoded as its own class, so it was
    committed, and the log read it back by its tag as an unknown kind: every event after it
    was unreadable, and the run could not be resumed. A hook handing ``emit`` a string or None
    crashed the writer."""
    codec = Codec()
    with pytest.raises(EventInvalid, match="Unregistered cannot be recorded: it lacks @event"):
        codec.check(Unregistered(note="x"))
    with pytest.raises(EventInvalid, match="tag 'step_taken' belongs to StepTaken"):
        codec.check(Impostor(note="x"))
    for thing in ("x", None, 3):
        with pytest.raises(EventInvalid, match="is not an event"):
            codec.check(thing)  # type: ignore[arg-type]

    class Once(Actor):
        async def run(self, ctx: Context) -> None:
            await ctx.emit(Unregistered(note="lost"))

    log = MemoryEventLog()
    specs = [ActorSpec(name="emitter", factory=Once, driver=True)]
    outcome = trio.run(Runtime(log, STARTED, specs, [ActorStats()], seed=5).run)
    assert outcome.reason == "failed" and "EventInvalid: Unregistered" in outcome.error
    assert isinstance(list(log.read())[-1].event, RunFailed)


def test_an_actor_that_calls_sys_exit_or_a_factory_that_builds_no_actor_fails_its_run() -> None:
    """A plug-in hook calling ``sys.exit(5)`` ended coevo with exit 5, no word and no
    ``run_failed``; a factory returning 42 was an ``AttributeError`` traceback."""

    class Exits(Actor):
        async def run(self, ctx: Context) -> None:
            raise SystemExit(5)

    for factory, says in ((Exits, "ExitCalled: sys.exit(5) was called"), (lambda: 42, "42")):
        log = MemoryEventLog()
        specs = [ActorSpec(name="plug", factory=factory, driver=True)]  # type: ignore[arg-type]
        outcome = trio.run(Runtime(log, STARTED, specs, [ActorStats()], seed=5).run)
        assert outcome.reason == "failed" and says in outcome.error, outcome.error
        assert isinstance(list(log.read())[-1].event, RunFailed)


class Hung(MiniLab):
    """A blocking MiniLab whose every ``step`` hangs until ``release`` is set."""

    blocking = True
    release = threading.Event()

    def __init__(self) -> None:
        super().__init__(families=("fetch",), train_variants=20)

    def step(self, action: str) -> Observation:
        Hung.release.wait(120)
        return super().step(action)


def test_more_hung_world_calls_than_trios_thread_limit_do_not_stall_the_run() -> None:
    """Each hung call's thread is abandoned holding a thread-limiter token until it returns
    (never): on trio's default limiter (40 tokens) the 41st world call, the next world's
    construction and the runtime's shutdown waited forever (SIGTERM could not stop the run).
    Every world call now has a limiter of its own: 44 hung episodes abort, the run ends. (The
    timeout leaves a loaded machine time to build each world: only the step hangs.)"""
    tasks = MiniLab(families=("fetch",), train_variants=20).tasks("fetch", "train")
    names = ["w0", "w1"]
    specs = [ActorSpec(name="scheduler", factory=partial(Scheduler, tasks, 44, names), driver=True)]
    specs += [
        ActorSpec(
            name=name,
            factory=partial(EnvWorker, Hung, RandomAgent, step_timeout=0.25),
            accepts=lambda ev, name=name: getattr(ev, "worker", None) == name,
        )
        for name in names
    ]
    log = MemoryEventLog()
    runtime = Runtime(log, STARTED, specs, [ActorStats(), EpisodeTable()], seed=5)

    async def bounded() -> Any:
        with trio.fail_after(60):  # a stall fails the test instead of hanging it
            return await runtime.run()

    try:
        outcome = trio.run(bounded)
    finally:
        Hung.release.set()  # the abandoned threads return and end
    assert outcome.reason == "completed", outcome
    aborted = [e.event for e in log.read() if isinstance(e.event, EpisodeAborted)]
    assert len(aborted) == 44
    assert all("did not return within 0.25 s (world.step_timeout)" in a.reason for a in aborted)


class Slow(MiniLab):
    """MiniLab whose ``step`` takes 0.3 s (a blocking world)."""

    blocking = True

    def __init__(self) -> None:
        super().__init__(families=("fetch",), train_variants=20)

    def step(self, action: str) -> Observation:
        threading.Event().wait(0.3)
        return super().step(action)


def test_a_slow_world_call_is_said_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A world call that hung held its worker for the whole ``step_timeout`` (600 s by
    default) without a word (a stopped JVM or game compiler): it is said after a while, and
    again, until it returns or is abandoned."""
    from structlog.testing import capture_logs

    from agents.acting import env_worker

    monkeypatch.setattr(env_worker, "SLOW_CALL_S", 0.1)
    monkeypatch.setattr(env_worker, "SLOW_CALL_EVERY_S", 0.1)
    with capture_logs() as logs:
        events, outcome = run_world(Slow, episodes=1, max_turns=2)
    assert outcome.reason == "completed" and any(isinstance(e, EpisodeFinished) for e in events)
    slow = [entry for entry in logs if entry["event"] == "world call slow"]
    assert slow and slow[0]["call"] == "world.step" and slow[0]["waited_s"] == 0, slow
    assert slow[0]["abandoned_after"] == "never (no step_timeout)"


def test_an_answer_that_does_not_come_is_said_while_the_episode_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plug-in memory that never answered a retrieval held its episode, and the run, with
    no word at all: the wait is said after a while, and again, until the answer comes."""
    from types import SimpleNamespace

    from structlog.testing import capture_logs

    from agents.acting import env_worker
    from agents.events.episodes import EpisodeAssigned
    from agents.events.memory import TipsRetrieved
    from engine.world import Observation

    monkeypatch.setattr(env_worker, "SLOW_ANSWER_S", 0.1)
    monkeypatch.setattr(env_worker, "SLOW_ANSWER_EVERY_S", 0.1)
    job = EpisodeAssigned(
        episode="ep7", index=7, worker="w", family="f", variant=0, split="train", seed=1
    )
    answer = TipsRetrieved(
        episode="ep7", worker="w", turn=2, slot="s", tip_ids=(), similarities=(), ranks=(),
        tips=(), similar=0, slot_size=0,
    )  # fmt: skip

    class Late:  # the answer arrives 0.35 s after the first wait began
        arrives: float | None = None

        async def __anext__(self) -> SimpleNamespace:
            if self.arrives is None:
                self.arrives = trio.current_time() + 0.35
            await trio.sleep_until(self.arrives)
            return SimpleNamespace(event=answer)

    ctx = SimpleNamespace(log=structlog.get_logger("coevo"))
    first = Observation(text="o", admissible=("a",), goal="g")
    agent = env_worker._PolicyAgent(ctx, job, Late(), env_worker.PromptSettings(), first)  # pyright: ignore[reportPrivateUsage, reportArgumentType]

    async def wait() -> object:
        return await agent._wait(TipsRetrieved, 2)  # pyright: ignore[reportPrivateUsage]

    with capture_logs() as logs:
        got = trio.run(wait)
    assert got is answer
    said = [e for e in logs if e["event"] == "answer slow"]
    assert len(said) >= 2 and said[0]["waiting_for"] == "tips_retrieved", said
    assert (said[0]["episode"], said[0]["turn"]) == ("ep7", 2)


class Wanders(MiniLab):
    """MiniLab whose ``reset`` and ``step`` change the working directory (a simulator wrapper
    that ``chdir``s into its data)."""

    blocking = True
    elsewhere = "/"

    def __init__(self) -> None:
        super().__init__(families=("fetch",), train_variants=20)

    def reset(self, task: Any, seed: int) -> Observation:
        os.chdir(self.elsewhere)
        return super().reset(task, seed)

    def step(self, action: str) -> Observation:
        os.chdir(self.elsewhere)
        return super().step(action)


def test_a_world_that_changes_the_working_directory_is_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A world's ``os.chdir`` sent a run's checkpoints (a relative run directory) outside the
    run, and its end called the directory moved: each call's change is undone, said once per
    worker."""
    from structlog.testing import capture_logs

    monkeypatch.chdir(tmp_path)
    with capture_logs() as logs:
        events, outcome = run_world(Wanders, episodes=4, max_turns=3)
    assert os.getcwd() == str(tmp_path)
    assert outcome.reason == "completed"
    assert sum(isinstance(e, EpisodeFinished) for e in events) == 4
    said = [e for e in logs if e["event"] == "world changed the working directory; changed back"]
    assert 1 <= len(said) <= 2 and said[0]["to"] == "/" and said[0]["back_to"] == str(tmp_path)


def test_an_event_that_says_it_is_malformed_is_refused_at_emit() -> None:
    """A plug-in memory answered three tips with one similarity: recorded, and the audit
    of the run died reading it. An event whose fields must agree says so
    (``Event.unrecordable``), and the codec's check refuses it; its log stays readable."""
    from agents.events.memory import TipsRetrieved

    good = TipsRetrieved(
        episode="ep1", worker="w", turn=0, slot="s", tip_ids=(3, 4), similarities=(0.9, 0.8),
        ranks=(0, 1), tips=("a", "b"), similar=2, slot_size=2,
    )  # fmt: skip
    codec = Codec()
    assert codec.check(good) > 0
    for change, said in (
        ({"similarities": (0.9,)}, "2 tip_ids but 1 similarities"),
        ({"calls": ("c1",)}, "2 tip_ids but 1 calls"),
        ({"similarities": (0.9, math.nan)}, "not a finite number"),
        ({"similar": -5}, "must be >= 0"),
    ):
        bad = msgspec.structs.replace(good, **change)
        with pytest.raises(EventInvalid, match=f"tips_retrieved cannot be recorded: .*{said}"):
            codec.check(bad)
        env = Envelope(seq=0, run="r", t=0, actor="mymem", event=bad)
        back = codec.decode(codec.encode(env), 0).event  # a log that holds one stays readable
        assert isinstance(back, TipsRetrieved) and back.similar == bad.similar
    assert codec.check(Named(unrecordable=True)) > 0  # a field of the method's name: no method


@event
class Named(Event, frozen=True, kw_only=True, tag="test_field_named_unrecordable"):
    """A plug-in's event with a field named as :meth:`Event.unrecordable`."""

    unrecordable: bool


@event
class Cached(Event, frozen=True, kw_only=True, tag="test_unrecordable_cached"):
    """A plug-in's check wrapped in a cache (not a plain function: it was never asked)."""

    size: int

    @functools.cache  # noqa: B019 (a test's event, a user's habit)
    def unrecordable(self) -> str:
        return "too big" if self.size > 3 else ""

    @classmethod
    def made_recordable(cls, fields: dict[str, Any]) -> dict[str, Any]:
        return {**fields, "size": min(fields["size"], 3)}  # (other tests draw every event)


@event
class Buggy(Event, frozen=True, kw_only=True, tag="test_unrecordable_buggy"):
    """A plug-in's check that raises, or answers with something other than a str."""

    answer: int

    def unrecordable(self) -> str:
        if self.answer < 0:
            raise ValueError("my check is buggy")
        return True if self.answer else ""  # type: ignore[return-value]

    @classmethod
    def made_recordable(cls, fields: dict[str, Any]) -> dict[str, Any]:
        return {**fields, "answer": 0}


def test_a_plug_in_s_check_is_asked_in_any_form_and_its_own_failure_named() -> None:
    """An outside tester: a check under ``functools.lru_cache`` (or a classmethod) was never
    asked, its event recorded; a check that raised read as the actor's own error, and one
    that answered True was taken for the reason ("cannot be recorded: True")."""
    codec = Codec()
    assert codec.check(Cached(size=1)) > 0
    with pytest.raises(EventInvalid, match="test_unrecordable_cached cannot be recorded: too big"):
        codec.check(Cached(size=9))
    with pytest.raises(EventInvalid, match=r"its unrecordable\(\) raised ValueError: my check"):
        codec.check(Buggy(answer=-1))
    with pytest.raises(EventInvalid, match=r"its unrecordable\(\) returned True, not a str"):
        codec.check(Buggy(answer=1))
    assert codec.check(Buggy(answer=0)) > 0


def test_actions_this_python_does_not_know_are_actions_and_a_spelling_shows_where_it_differs() -> (
    None
):
    """An emoji newer than this Python's Unicode data (U+1FA77) and a private-use character
    were refused as "an empty action" (not printable to Python); two long actions in two
    spellings were named by their first 60 characters, which read the same."""
    from agents.acting.world_calls import _actions  # pyright: ignore[reportPrivateUsage]

    assert _actions(["\U0001fa77", "\ue000", "x"]) == ("\U0001fa77", "\ue000", "x")
    with pytest.raises(ValueError) as info:
        _actions(["a" * 50 + "caf\xe9 now", "b", "a" * 50 + "cafe\u0301 now"])
    assert str(info.value) == (
        "admissible[2] ...'aaaaaaaaaaaaaaaaaaaaacafe\\u0301 now' repeats admissible[0] "
        "...'aaaaaaaaaaaaaaaaaaaaacaf\\xe9 now' in another Unicode spelling (the same text once "
        "NFC-normalized)"
    )
