"""A scenario's world and its tasks: the world built from ``[world]`` (:func:`world_factory`)
and the tasks of a split listed by it (:func:`world_tasks`), each checked before a run uses it: a
plug-in world's families, tasks and templates are refused with a message naming the scenario's
field, and a world that hangs while it lists them is an error, not a run that never starts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, cast

import msgspec

from agents.acting.world_calls import Abandoned, in_thread, utf8_text
from engine.errors import ScenarioInvalid
from engine.world import Task, TextWorld
from engine.world_registry import WorldOptionsInvalid, close_world, load_world
from scenarios.schema import Scenario

__all__ = ["world_factory", "world_tasks"]


def world_factory(scenario: Scenario, source: str) -> Callable[[], TextWorld]:
    """Builds the scenario's world (each call a new one); a world that cannot be built is
    :class:`ScenarioInvalid` naming ``$.world`` or ``$.world.options``."""
    return partial(_make_world, scenario.world.name, dict(scenario.world.options), source)


def _make_world(name: str, options: dict[str, Any], source: str) -> TextWorld:
    try:
        return load_world(name, options)
    except WorldOptionsInvalid as exc:
        raise ScenarioInvalid(source, f"$.world.options: {exc}") from None
    except ValueError as exc:
        raise ScenarioInvalid(source, f"$.world: {exc}") from None


def world_tasks(scenario: Scenario, split: str, source: str, pool: int = 0) -> tuple[Task, ...]:
    """The tasks of ``split`` in the scenario's families, checked (``_tasks``), from a world
    built for it and closed, in a thread given ``[world] step_timeout``
    seconds (as each world call of a run is): a plug-in world whose constructor, ``families``,
    ``tasks`` or ``close`` hangs is an error, not a ``validate`` or ``run`` that never ends.
    The hung thread is abandoned (Python cannot stop a thread)."""
    limit = scenario.world.call_limit
    make_world = world_factory(scenario, source)
    try:
        tasks, error = in_thread(
            lambda: _tasks(make_world(), scenario, split, source, pool), limit, "coevo-world-tasks"
        )
    except Abandoned:
        raise ScenarioInvalid(
            source,
            f"$.world: {scenario.world.name} did not build, list its {split} tasks and close "
            f"within {limit:g} s ([world] step_timeout); its thread was abandoned",
        ) from None
    if error is not None:
        raise error
    return cast("tuple[Task, ...]", tasks)


def _tasks(
    world: TextWorld, scenario: Scenario, split: str, source: str, pool: int = 0
) -> tuple[Task, ...]:
    """The tasks of ``split`` in the scenario's families; with ``pool``, the first ``pool``
    of each family (``world.pool``: the training set revisited). The world is closed."""
    name = scenario.world.name
    try:
        tasks = _list_tasks(world, scenario, split, source, pool)
        _check_templates(world, scenario, source)
        if split == scenario.world.split:  # (once: the world is the same for each split)
            _check_embedded_variants(world, scenario, source)
    except BaseException as exc:
        close_world(world)  # the listing's failure is the one to report
        if isinstance(exc, SystemExit):  # a plug-in's sys.exit() must not end coevo
            raise ScenarioInvalid(
                source, f"$.world: {name} called sys.exit({exc.code!r}) listing its tasks"
            ) from None
        if isinstance(exc, ScenarioInvalid) or not isinstance(exc, Exception):
            raise
        raise ScenarioInvalid(  # a plug-in world failing to list its tasks
            source, f"$.world: {name} could not list tasks: {type(exc).__name__}: {exc}"
        ) from None
    if problem := close_world(world):
        raise ScenarioInvalid(source, f"$.world: {name}: {problem}")
    return tasks


def _check_embedded_variants(world: TextWorld, scenario: Scenario, source: str) -> None:
    """Refuse a run's world whose families leave the built-in model no train variant to
    pre-train on: it keeps the last ``policy.embedded.eval_variants`` of every family's
    train variants back (every family of the world, not only the run's), and the run failed
    once its model was being built."""
    from agents.models.pretrain_play import split_train
    from scenarios.policy_models import embedded_spec

    p = scenario.policy
    if scenario.agent.kind != "policy" or p.model != "embedded":
        return
    spec = embedded_spec(scenario, source)
    if spec.world != scenario.world.name:  # built on another world: its own check
        return
    for family in world.families():
        try:
            split_train(world, family, spec.eval_variants)  # the build's own rule
        except ValueError:
            count = len(list(world.tasks(family, "train")))
            raise ScenarioInvalid(
                source,
                f"$.policy.embedded.eval_variants = {spec.eval_variants}: the built-in model "
                f"pre-trains on every family of {scenario.world.name} and keeps that many of "
                f"each one's train variants back, and family {family!r} has {count} (the "
                "world's options): it needs fewer held back, or more train variants",
            ) from None


def _check_templates(world: TextWorld, scenario: Scenario, source: str) -> None:
    """Refuse a world whose admissible actions are templates (``templates = True``, see
    :class:`~engine.world.TextWorld`) unless a policy writes its own actions: a scripted agent
    or a "score" policy picks an action among them and plays ``open OBJ`` word for word."""
    if getattr(world, "templates", False) is not True:
        return
    if scenario.agent.kind == "policy" and scenario.policy.mode == "generate":
        return
    who = (
        'policy.mode = "score" picks one of them'
        if scenario.agent.kind == "policy"
        else f"agent.kind = {scenario.agent.kind!r} picks one of them"
    )
    raise ScenarioInvalid(
        source,
        f"$.world: {scenario.world.name}'s admissible actions are templates ('open OBJ'), not "
        f"actions, and {who} as it is: they need a policy that writes its own actions "
        '(policy.mode = "generate"), or the world\'s real actions (for scienceworld, '
        'world.options.actions = "valid")',
    )


def _list_tasks(
    world: TextWorld, scenario: Scenario, split: str, source: str, pool: int
) -> tuple[Task, ...]:
    name = scenario.world.name
    returned = world.families()
    if isinstance(returned, str | bytes):  # iterated, a name would be split into letters
        raise ScenarioInvalid(
            source, f"$.world: {name}.families() returned {returned!r}, not a list of names"
        )
    listed = tuple(cast("Iterable[object]", returned))  # a plug-in's: checked
    offered = tuple(f for f in listed if isinstance(f, str))
    if len(offered) != len(listed) or len(set(offered)) != len(offered):
        why = "names that are not strings" if len(offered) != len(listed) else "a name twice"
        raise ScenarioInvalid(source, f"$.world: {name}.families() returned {listed!r}: {why}")
    for family in offered:  # every assignment logs it: the log's encoding must hold it
        try:
            utf8_text(family, f"{name}.families()'s {family!r}")
        except ValueError as exc:
            raise ScenarioInvalid(source, f"$.world: {exc}") from None
    families = scenario.world.families or list(offered)
    twice = sorted({f for f in families if families.count(f) > 1})
    if twice:  # each would get twice its share of the episodes
        raise ScenarioInvalid(source, f"$.world.families: {twice} listed more than once")
    unknown = [f for f in families if f not in offered]
    if unknown:
        raise ScenarioInvalid(
            source, f"$.world.families: unknown {unknown}; {name} offers {list(offered)}"
        )
    tasks = [
        _task(task, name, fam, split, source)
        for fam in families
        for task in _first(world.tasks(fam, split), pool)
    ]
    listed = Counter((t.family, t.variant) for t in tasks)
    twice = sorted(k for k, n in listed.items() if n > 1)
    if twice:  # each would be drawn twice as often as the others, without a word
        family, variant = twice[0]
        raise ScenarioInvalid(
            source,
            f"$.world: {name}.tasks({family!r}, {split!r}) lists variant {variant} more than "
            f"once ({len(twice)} task(s) in all are listed so; each is drawn as often as it is "
            "listed): list each task once",
        )
    if not tasks:
        why = (
            f" (eval.split = {split!r}: evaluation rounds play them; eval.every = 0 plays none)"
            if split == scenario.eval.split and split != scenario.world.split
            else ""
        )
        raise ScenarioInvalid(source, f"$.world: no {split} tasks in {families}{why}")
    return tuple(tasks)


def _task(task: object, name: str, family: str, split: str, source: str) -> Task:
    """A task a world listed, checked: a :class:`Task` of the family and split asked for,
    its fields of their types (msgspec Structs do not check on construction, and a task
    reaches the log in every assignment)."""
    if not isinstance(task, Task):
        raise ScenarioInvalid(
            source, f"$.world: {name}.tasks({family!r}, {split!r}) returned {task!r}, not a Task"
        )
    try:
        checked = msgspec.convert(msgspec.structs.asdict(task), Task)
    except msgspec.ValidationError as exc:
        raise ScenarioInvalid(
            source, f"$.world: {name}.tasks({family!r}, {split!r}) returned {task!r}: {exc}"
        ) from None
    if (checked.family, checked.split) != (family, split):
        raise ScenarioInvalid(
            source,
            f"$.world: {name}.tasks({family!r}, {split!r}) returned a task of family "
            f"{checked.family!r}, split {checked.split!r}",
        )
    return checked


def _first(tasks: Sequence[Task], pool: int) -> Sequence[Task]:
    return tasks[:pool] if pool else tasks
