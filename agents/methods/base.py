"""What a learning method is: the :class:`Method` protocol the trainer drives, the table of
rollout modes, and the record a method's scoring gives the trainer.

The trainer (:mod:`agents.learning.trainer`) plans groups, keeps workers busy, runs evaluation
rounds and asks the learner for updates; everything that differs between GRPO, EMPO2,
Complementary RL and a researcher's own method goes through these hooks:

- :meth:`Method.rollout`: the rollout mode of each training episode (a row of :data:`ROLLOUTS`:
  whether it reads memory, each turn or once, and whether it is trained without it);
- :meth:`Method.shape`: what else a training job asks for (a reflection, the extractor, a slot);
- :meth:`Method.score`: a group's rewards and advantages, and what is recorded with them;
- :meth:`Method.step_events`: events due when a step's groups have all ended (a merge);
- :meth:`Method.loss`: the loss flags of an update request (EMPO2's low-probability mask);
- :meth:`Method.actors`: the actors the method adds to a run (EMPO2's memory; Complementary RL's
  bank, extractor and credit actors; a plug-in's insight list), given the run's
  :class:`RunResources` (device, batching, checkpoint stores, base models);
- ``warmup``, ``memory_eval`` and ``adapts``: steps that train nothing, an evaluation round with
  the memory shown, and whether the adaptation test has a memory to run on;
- ``base_models``: the models besides the policy the scenario layer prepares for the method
  (``"extractor"``: the extractor's starting weights as ``[complementary] extractor`` names
  them).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

from agents.events.episodes import EpisodeAssigned
from agents.events.policy import GradientRequested
from engine.actor import ActorSpec
from engine.events import Event
from engine.world import Task

if TYPE_CHECKING:  # stores.checkpoints imports torch: only where a store is built
    from stores.checkpoints import Checkpoints

ADV_EPS = 1e-6
"""The advantages' denominator epsilon, recorded in every :class:`AdvantagesComputed`."""


@dataclass(frozen=True)
class RolloutMode:
    """How an episode of this mode plays and trains.

    Attributes:
        name: the mode as recorded in ``EpisodeAssigned.rollout`` and the update's ``rollouts``.
        memory: "none" (no retrieval), "each-turn" (memory asked at every turn, shown that turn:
            EMPO2's tips) or "once" (one entry retrieved at the start, shown every turn:
            Complementary RL's guided episodes).
        distill: trained with the memory removed from the prompt (off-policy distillation).
        guided: counts in Complementary RL's guided subgroup.
    """

    name: str
    memory: Literal["none", "each-turn", "once"]
    distill: bool = False
    guided: bool = False


ROLLOUTS: dict[str, RolloutMode] = {
    m.name: m
    for m in (
        RolloutMode("plain", "none"),
        RolloutMode("tips", "each-turn"),
        RolloutMode("distill", "each-turn", distill=True),
        RolloutMode("guided", "once", guided=True),
        RolloutMode("guided-distill", "once", distill=True, guided=True),
    )
}
"""Every rollout mode, by name: the one table the env worker, the learner and the audit read."""


def mode_of(name: str) -> RolloutMode:
    """The mode named ``name``.

    Raises:
        ValueError: no such mode.
    """
    try:
        return ROLLOUTS[name]
    except KeyError:
        raise ValueError(f"unknown rollout mode {name!r}; known: {sorted(ROLLOUTS)}") from None


@dataclass(frozen=True)
class Scored:
    """A group scored by its method: what the trainer trains on and records.

    Attributes:
        rewards: per episode, the reward the advantages were computed from.
        advantages: per episode.
        rule: the formula's name (``AdvantagesComputed.rule``).
        outcomes, intrinsic, intrinsic_coef: an intrinsic bonus recorded apart from the outcome
            (empty and 0 without one).
    """

    rewards: tuple[float, ...]
    advantages: tuple[float, ...]
    rule: str
    outcomes: tuple[float, ...] = ()
    intrinsic: tuple[float, ...] = ()
    intrinsic_coef: float = 0.0


T = TypeVar("T")


def called(method: object, hook: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, a method's hook named ``hook``; what it raises is named (its traceback
    stays chained, and is logged): a raising ``shape``, ``loss`` or ``step_events`` read as
    the trainer's own error, naming no method.

    Raises:
        ValueError: the hook raised, naming the method, the hook and the error.
    """
    try:
        return fn(*args)
    except KeyboardInterrupt:  # maybe the user's: supervision decides
        raise
    except BaseException as exc:  # a plug-in's bug (sys.exit, a BaseException of its own)
        said = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ValueError(f"{method_label(method)}: {hook} raised {said}") from exc


def checked_step_events(events: object, method: object) -> tuple[Event, ...]:
    """What a method's ``step_events`` returned, if it is events.

    Raises:
        ValueError: anything else, naming the method (it read "dict is not an event").
    """
    where = f"{method_label(method)}: step_events()"
    if isinstance(events, str | bytes | Mapping) or not isinstance(events, Sequence):
        raise ValueError(f"{where} returned {events!r}, not a sequence of events")
    bad = [e for e in events if not isinstance(e, Event)]
    if bad:
        raise ValueError(f"{where} returned {bad[0]!r}, not an event")
    return tuple(events)


SHAPE_KEEPS = (
    "episode", "index", "worker", "family", "variant", "split", "seed", "purpose", "rollout",
)  # fmt: skip
"""What ``shape`` must leave as it was given: which task the episode plays, with what seed, as
which rollout; it adds requests (``reflect``, ``extract``) and where the memory is
(``scope``, ``slot``)."""


def checked_job(out: object, job: EpisodeAssigned, method: object) -> EpisodeAssigned:
    """What a method's ``shape(job, task)`` returned, if it is ``job`` with requests added.

    Raises:
        ValueError: not a job, or one that plays another task, seed or rollout (every episode
            of a changed family aborted, naming no method), naming the method.
    """
    return _kept(
        out,
        job,
        SHAPE_KEEPS,
        f"{method_label(method)}: shape()",
        "job",
        "it adds requests only (reflect, extract) and where the memory is (scope, slot); the "
        "task, seed and rollout are the scheduler's",
    )


def _kept(out: object, given: T, keeps: Sequence[str], where: str, what: str, only: str) -> T:
    """``out`` if it is of ``given``'s class with the fields ``keeps`` unchanged.

    Raises:
        ValueError: it is not, saying ``where`` and what the hook may change (``only``).
    """
    if not isinstance(out, type(given)):
        raise ValueError(
            f"{where} returned {type(out).__name__}, not the {type(given).__name__} it was given"
        )
    changed = [f for f in keeps if getattr(out, f) != getattr(given, f)]
    if changed:
        raise ValueError(f"{where} changed the {what}'s {', '.join(changed)}: {only}")
    return out


LOSS_KEEPS = ("update", "episodes", "advantages", "rollouts")
"""What ``loss`` must leave as it was given: the advantages come from ``score`` (where the
audit re-derives them); ``loss`` sets how the update trains on them."""


def checked_loss(out: object, req: GradientRequested, method: object) -> GradientRequested:
    """What a method's ``loss(req)`` returned, if it is ``req`` with loss settings changed.

    Raises:
        ValueError: not a request, or one whose episodes, advantages, rollout modes or update
            differ (``coevo check`` would call the run's updates wrong), naming the method.
    """
    return _kept(
        out,
        req,
        LOSS_KEEPS,
        f"{method_label(method)}: loss()",
        "request",
        "it sets loss settings only (advantages come from score(), where the audit re-derives "
        "them)",
    )


def method_label(method: object) -> str:
    """``method 'name'`` as messages name a method; a class outside coevo's own methods named
    too, since a plug-in that subclasses a built-in inherits its ``name`` (``method 'grpo'``
    alone then sent its author to coevo's GRPO)."""
    cls = type(method)
    label = f"method {getattr(method, 'name', cls.__name__)!r}"
    if cls.__module__ == "agents.methods.builtin":
        return label
    return f"{label} ({cls.__module__}:{cls.__qualname__})"


def checked_scored(scored: object, episodes: int, method: object) -> Scored:
    """``scored`` if it is what a group of ``episodes`` finished episodes can be trained on and
    recorded with: a :class:`Scored` whose rewards and advantages are that many finite numbers
    (outcomes and intrinsic: none or that many). A plug-in's ``score`` is checked here, at the
    boundary, so that a NaN advantage fails the run in its own words instead of turning every
    weight into NaN, and a short tuple is not recorded for ``coevo check`` to trip on.

    Raises:
        ValueError: anything else, naming the method and what is wrong.
    """
    where = f"{method_label(method)}: score"
    if not isinstance(scored, Scored):
        raise ValueError(f"{where} returned {type(scored).__name__}, not a Scored")
    if not isinstance(scored.rule, str):
        raise ValueError(f"{where} returned the rule {scored.rule!r}, not its name as text")
    floats: dict[str, tuple[float, ...]] = {}
    for name in ("rewards", "advantages", "outcomes", "intrinsic"):
        values = getattr(scored, name)
        if name in ("outcomes", "intrinsic") and not values:
            continue
        if not hasattr(values, "__len__"):  # None, a number
            raise ValueError(f"{where} returned {name} {values!r}, not a sequence of numbers")
        if len(values) != episodes:
            raise ValueError(
                f"{where} returned {len(values)} {name} for a group of {episodes} episodes"
            )
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, numbers.Real)]
        if bad:
            raise ValueError(f"{where} returned {name} that are not numbers: {bad[0]!r}")
        floats[name] = tuple(float(v) for v in values)  # a NumPy number is a number too
        if not all(math.isfinite(v) for v in floats[name]):
            raise ValueError(f"{where} returned {name} that are not finite: {list(values)}")
    coef = scored.intrinsic_coef
    if isinstance(coef, bool) or not isinstance(coef, numbers.Real) or not math.isfinite(coef):
        raise ValueError(f"{where} returned intrinsic_coef {coef!r}")
    return dataclasses.replace(scored, intrinsic_coef=float(coef), **floats)


def check_mode(method: Method, what: str, mode: object, memory: bool) -> None:
    """Raise ValueError unless ``mode`` is a rollout mode this run can play: known, and one
    that asks the memory only where ``memory`` (an actor answers retrievals; else an episode
    would wait for an answer that never comes)."""
    where = f"{method_label(method)}: {what} {mode!r}"
    if not isinstance(mode, str) or mode not in ROLLOUTS:
        raise ValueError(f"{where}, not a rollout mode ({', '.join(ROLLOUTS)})")
    if ROLLOUTS[mode].memory != "none" and not memory:
        raise ValueError(f"{where}, which asks the memory, but no actor of the run answers it")


def checked_attributes(method: Method) -> int:
    """The method's warm-up steps, once its attributes are what the trainer needs.

    Raises:
        ValueError: a plug-in's ``warmup``, ``memory_eval``, ``adapts`` or ``records_rollouts``
            of the wrong type or value (a negative warm-up waited forever; an unknown
            ``memory_eval`` aborted every episode of the round with memory, as a 0% round).
    """
    warmup = getattr(method, "warmup", None)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"{method_label(method)}: warmup must be an int >= 0, got {warmup!r}")
    shown = getattr(method, "memory_eval", None)
    if shown is not None:
        check_mode(method, "memory_eval is", shown, True)
    for flag in ("adapts", "records_rollouts"):
        if not isinstance(getattr(method, flag, None), bool):
            raise ValueError(
                f"{method_label(method)}: {flag} must be true or false, "
                f"got {getattr(method, flag, None)!r}"
            )
    return warmup


@dataclass(frozen=True)
class LoadedModel:
    """A base model loaded as the scenario asks: on its device, with its dtype, activation
    checkpointing and LoRA adapters, and the inference backend that samples from it.

    Attributes:
        net: the model (a ``transformers`` module, adapters attached when the scenario asks).
        tokenizer: its tokenizer.
        device: the torch device it is on.
        backend: what samples from it (:mod:`agents.models.backend`).
    """

    net: Any
    tokenizer: Any
    device: Any
    backend: Any


@dataclass(frozen=True)
class RunResources:
    """What a method's actors may use of the run they join (built by the scenario layer).

    Attributes:
        device: the scenario's ``policy.device`` ("auto", "cpu", "cuda:0", ...), checked;
            :func:`stores.checkpoints.resolve_device` turns it into a torch device.
        batch_max: most requests a model actor answers in one batch.
        batch_wait: seconds a model actor waits to fill a batch.
        checkpoints: the checkpoint store named ``name`` (a directory of the run, or memory
            when the run keeps no directory); the same name on resume gives the same store.
        base_model: the directory of a prepared base model by role: ``"policy"`` or one the
            method names in ``base_models``; None when only the settings are being checked
            (``coevo validate``): load it in the actor, never in :meth:`Method.actors`.
        load_model: the base model of a role loaded as the scenario says (:class:`LoadedModel`;
            blocking: call it in the actor, when the run starts).
        prompts: the scenario's ``[prompt]`` texts by name ("system", "reflect", "extract",
            "merge").
    """

    device: str
    batch_max: int
    batch_wait: float
    checkpoints: Callable[[str], Checkpoints]
    base_model: Callable[[str], Path | None]
    load_model: Callable[[str], LoadedModel]
    prompts: Mapping[str, str] = field(default_factory=dict[str, str])


@runtime_checkable
class Method(Protocol):
    """A learning method as the trainer sees it. Every hook is pure: time and seeds are
    arguments, so a resumed run (which replays the trainer) decides the same.

    Attributes:
        name: the method's name, as in ``run.method``.
        warmup: the first steps (an update's worth of groups each) train nothing.
        memory_eval: the rollout mode of a second evaluation round of the same tasks, shown the
            memory (None: no such round).
        adapts: the method has a tip memory the adaptation test can use.
        records_rollouts: the rollout modes are recorded in the advantages and requests.

    An optional attribute ``base_models`` (a tuple of roles, default empty) names the base
    models besides the policy its actors load (see :class:`RunResources`, :func:`base_models`).
    """

    name: str
    warmup: int
    memory_eval: str | None
    adapts: bool
    records_rollouts: bool

    def rollout(self, run_seed: int, step: int, index: int, member: int) -> str:
        """The rollout mode of the training episode number ``index`` of the run (counting
        training episodes only; every episode assigned before it in a run recorded without
        ``eval.own_seeds``), member ``member`` of its group, planned for step ``step``."""
        ...

    def shape(self, job: EpisodeAssigned, task: Task) -> EpisodeAssigned:
        """A training job with the method's requests added (reflection, extraction, slot)."""
        ...

    def score(
        self, outcomes: Sequence[float], rollouts: Sequence[str], similar: Sequence[Sequence[int]]
    ) -> Scored:
        """A group's advantages from its finished episodes' ``outcomes``, their ``rollouts``
        and, per episode, the number of similar memory entries at each retrieval."""
        ...

    def step_events(self, step: int) -> Sequence[Event]:
        """Events due once step ``step``'s groups have all ended (before its update)."""
        ...

    def loss(self, req: GradientRequested) -> GradientRequested:
        """The update request with the method's loss flags set."""
        ...

    def actors(self, run: RunResources) -> Sequence[ActorSpec]:
        """The actors this method adds to a run (started with the inference actor). Build
        specs only: models load in the actors, when the run starts."""
        ...


BASE_MODEL_ROLES = ("extractor",)
"""The base-model roles the scenario layer knows how to prepare besides the policy."""


def base_models(method: Method) -> tuple[str, ...]:
    """The base-model roles ``method`` asks for (none when it names none).

    Raises:
        ValueError: a role this coevo cannot prepare.
    """
    roles = tuple(getattr(method, "base_models", ()))
    unknown = [r for r in roles if r not in BASE_MODEL_ROLES]
    if unknown:
        raise ValueError(
            f"{method_label(method)} asks for base model(s) {unknown}; known roles: "
            f"{list(BASE_MODEL_ROLES)}"
        )
    return roles


def method_actors(method: Method, run: RunResources) -> tuple[ActorSpec, ...]:
    """``method.actors(run)``; a plug-in written against the first form of the protocol,
    ``actors(self)`` with no argument, is still called as it was written.

    Raises:
        ValueError: the hook raised, or returned anything but actor specs.
    """
    actors = method.actors
    try:
        takes_run = bool(inspect.signature(actors).parameters)
    except (TypeError, ValueError):  # no signature to read (a C callable): the current form
        takes_run = True
    try:
        specs = tuple(actors(run) if takes_run else actors())  # pyright: ignore[reportCallIssue]
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a plug-in's bug: one line, before any run
        raise ValueError(
            f"{method_label(method)}: actors() raised {type(exc).__name__}: {exc}"
        ) from None
    wrong = [s for s in specs if not isinstance(s, ActorSpec)]
    if wrong:
        raise ValueError(
            f"{method_label(method)}: actors() returned {wrong[0]!r}, not an ActorSpec"
        )
    return specs
