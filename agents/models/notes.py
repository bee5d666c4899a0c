"""Notes shown to the policy: a library of hindsight notes written after scripted play, the
conditions in which pre-training and the note probe show them, and what a scripted reader
follows when it is shown several.

EMPO2's tips and Complementary RL's entries reach the policy as ``<tip> ... </tip>`` spans in its
turn prompt (:func:`agents.models.prompts.turn_messages`). An instruction-tuned model reads such a
hint; the embedded model has to be taught to. Its pre-training (:mod:`agents.models.embedded`) plays
episodes in which a note is shown and the :class:`~agents.acting.scripted.Explorer` acts on it, and
the probe (:mod:`agents.models.note_probe`) measures whether the built policy gains from a helpful
note and loses little to a wrong one. Every note here is
:func:`~agents.acting.scripted.hindsight_note` of an episode's text, never a world's hidden state.

Kinds of note shown (:data:`NOTE_KINDS`):

- ``variant``: the note of a success on the same variant (what EMPO2's per-variant memory holds
  after a success), possibly followed by failure notes of that variant;
- ``failure``: notes of failures on the same variant only (a partial plan, the actions that
  failed the task: what the memory holds before any success);
- ``family``: the note of a success on another variant of the same family, with the same goal
  where one exists (what a family-wide bank returns; it helps where the family's rule holds
  in both variants);
- ``unrelated``: the note of a success in another family;
- ``empty``: ``plan: none.`` (a note that says nothing, frequent in real memories);
- ``wrong`` (the probe only): the note of a success on another variant of the same family and
  goal whose plan, followed, fails on this variant.

Notes are shown in two forms: as written (several lines, the policy's own reflections in EMPO2)
and as an entry (:func:`entry_text`: the plan and avoid lines on one line, the form the
extractor writes in Complementary RL).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agents.acting.scripted import Explorer, hindsight_note, parse_note, run_episode
from engine.world import Task, TextWorld

NOTE_KINDS = ("none", "variant", "failure", "family", "unrelated", "empty", "wrong")
EMPTY_NOTE = "plan: none."
"""The note of an episode in which nothing earned reward and nothing failed."""


def entry_text(note: str) -> str:
    """``note`` as an experience entry: its plan and avoid lines, on one line (the ``found``
    line names where things were in one variant, which rarely carries over to another).

    >>> entry_text("plan: open box, take key.\\nfound: key after open box.\\navoid: take rock.")
    'plan: open box, take key. avoid: take rock.'
    """
    kept = [line.strip() for line in note.splitlines() if not line.startswith("found:")]
    return " ".join(line for line in kept if line)


def combine_notes(notes: Sequence[str]) -> str:
    """The note a scripted reader follows when shown ``notes`` in order: the plan of the first
    note that has one and the avoid lines of all of them (EMPO2 shows the best-scored tip
    first).

    >>> combine_notes(["plan: none.\\navoid: take b.", "plan: take a.", "plan: take c."])
    'plan: take a.\\navoid: take b.'
    """
    plan: list[str] = []
    avoid: set[str] = set()
    for note in notes:
        steps, bad = parse_note(_lines(note))
        plan = plan or steps
        avoid |= bad
    lines = [f"plan: {', '.join(plan) if plan else 'none'}."]
    if avoid:
        lines.append(f"avoid: {', '.join(sorted(avoid))}.")
    return "\n".join(lines)


def _lines(note: str) -> str:
    """A note in either form, one line per field (an entry holds them on one line)."""
    for head in ("found:", "avoid:"):
        note = note.replace(f". {head}", f".\n{head}")
    return note


@dataclass(slots=True)
class Written:
    """What scripted play wrote about one variant: the note of its first success (None when
    none was seen) and the notes of its failures that said something."""

    task: Task
    goal: str
    success: str | None = None
    failures: list[str] = field(default_factory=list[str])


def write_notes(
    world: TextWorld, task: Task, tries: int, key: str, keep_failures: int = 2
) -> Written:
    """Play the memoryless Explorer on ``task`` up to ``tries`` times (seeded from ``key``),
    stopping at the first success; its note, and up to ``keep_failures`` distinct notes of
    failures other than :data:`EMPTY_NOTE`."""
    goal = world.reset(task, 0).goal
    written = Written(task, goal)
    for i in range(tries):
        rng = random.Random(f"coevo.notes/{key}/{task.family}/{task.variant}/{i}")
        result = run_episode(world, task, i, Explorer(rng))
        note = hindsight_note(result.transcript)
        if result.success:
            written.success = note
            break
        fresh = note != EMPTY_NOTE and note not in written.failures
        if fresh and len(written.failures) < keep_failures:
            written.failures.append(note)
    return written


def write_library(
    world: TextWorld, tasks: Sequence[Task], tries: int, key: str
) -> dict[Task, Written]:
    """:func:`write_notes` of every task."""
    return {task: write_notes(world, task, tries, key) for task in tasks}


def follows_to_success(world: TextWorld, task: Task, notes: Sequence[str], seed: int = 0) -> bool:
    """Whether the Explorer shown ``notes`` succeeds on ``task`` (a check of a note's worth)."""
    rng = random.Random(f"coevo.notes/follow/{seed}")
    agent = Explorer(rng, note=combine_notes(notes))
    return run_episode(world, task, seed, agent).success


@dataclass(frozen=True, slots=True)
class Shown:
    """The notes of one condition: ``kind`` (one of :data:`NOTE_KINDS`) and the tip texts,
    in the order the prompt shows them (empty for ``none``, or when no such note exists)."""

    kind: str
    tips: tuple[str, ...] = ()


class NoteSource:
    """Picks the notes of each kind for a task, from a library of written notes.

    Args:
        library: written notes by task (the tasks notes may come from).
        world: the world, to check that a ``wrong`` note fails when followed.
    """

    def __init__(self, library: dict[Task, Written], world: TextWorld) -> None:
        self._world = world
        self._library = library
        self._by_family: dict[str, list[Written]] = {}
        for written in library.values():
            if written.success is not None:
                self._by_family.setdefault(written.task.family, []).append(written)

    def successes(self, family: str) -> list[Written]:
        """The written notes of ``family`` that hold a success, in library order."""
        return self._by_family.get(family, [])

    def pick(
        self, kind: str, task: Task, goal: str, rng: random.Random, own: Written | None = None
    ) -> Shown:
        """The notes of ``kind`` for ``task`` (whose goal is ``goal``); ``own`` is what was
        written on ``task`` itself (``variant`` and ``failure`` read it).

        Raises:
            ValueError: an unknown kind.
        """
        picker: dict[str, Callable[[], tuple[str, ...]]] = {
            "none": lambda: (),
            "empty": lambda: (EMPTY_NOTE,),
            "variant": lambda: self._variant(own, rng),
            "failure": lambda: tuple(own.failures[: rng.randint(1, 2)]) if own else (),
            "family": lambda: self._other(task, goal, rng, same_family=True),
            "unrelated": lambda: self._other(task, goal, rng, same_family=False),
            "wrong": lambda: self._wrong(task, goal, rng),
        }
        if kind not in picker:
            raise ValueError(f"unknown note kind {kind!r}, expected one of {NOTE_KINDS}")
        return Shown(kind, picker[kind]())

    @staticmethod
    def _variant(own: Written | None, rng: random.Random) -> tuple[str, ...]:
        if own is None or own.success is None:
            return ()
        extra = own.failures[: rng.choice((0, 0, 1, 2))]
        return (own.success, *extra)

    def _others(self, task: Task, goal: str, same_family: bool) -> list[Written]:
        if same_family:
            pool = [w for w in self.successes(task.family) if w.task != task]
            same_goal = [w for w in pool if w.goal == goal]
            return same_goal or pool
        return [w for family, ws in self._by_family.items() if family != task.family for w in ws]

    def _other(
        self, task: Task, goal: str, rng: random.Random, *, same_family: bool
    ) -> tuple[str, ...]:
        pool = self._others(task, goal, same_family)
        if not pool:
            return ()
        note = rng.choice(pool).success
        assert note is not None
        return (note,)

    def _wrong(self, task: Task, goal: str, rng: random.Random) -> tuple[str, ...]:
        """A same-family, same-goal success note whose plan fails here (the first found in a
        shuffled order), or none."""
        pool = [w for w in self._others(task, goal, True) if w.goal == goal]
        rng.shuffle(pool)
        for written in pool:
            assert written.success is not None
            if not follows_to_success(self._world, task, [written.success]):
                return (written.success,)
        return ()


def render(tips: Sequence[str], as_entries: bool) -> tuple[str, ...]:
    """The tips as the prompt shows them: as written, or as entries (:func:`entry_text`)."""
    return tuple(entry_text(t) for t in tips) if as_entries else tuple(tips)
