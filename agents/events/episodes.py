"""Episode events: what env workers and the scheduler record about episodes.

An episode is planned (``EpisodeAssigned``, by the scheduler), begins (``EpisodeStarted``), advances
one turn per ``StepTaken`` and ends with ``EpisodeFinished`` or ``EpisodeAborted``. A resumed run
records the episodes its previous session left running as ``EpisodeAbandoned`` and assigns them
again (same id, same seed), as the scheduler does with an episode whose worker was lost and
restarted mid-episode. Every field is data the world or the agent produced, so replay folds
these events and never re-runs a world.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from engine.events import Envelope, Event, event
from engine.lifecycle import RunResumed


@event
class EpisodeAssigned(Event, tag="episode_assigned", frozen=True, kw_only=True):
    """The scheduler handed episode ``episode`` (the ``index``-th of the run) to ``worker``.

    ``purpose`` is "train" or "eval" (evaluation episodes of a learning run). EMPO2's fields:
    ``rollout`` is "plain" (no memory), "tips" (tips retrieved each turn, trained on as shown)
    or "distill" (tips retrieved each turn, trained on with the tips removed from the prompt);
    ``scope`` is the memory the episode reads and writes (see ``agents.events.memory``) and
    ``slot``, when set, the exact memory slot (else the variant's slot within ``scope``);
    ``reflect`` asks the policy for a tip on the finished episode. Complementary RL's: rollout
    "guided" (one bank entry, retrieved at the start from the family's partition, shown every
    turn) or "guided-distill" (the same, trained on with the entry removed); ``extract`` sends
    the finished episode to the extractor.
    """

    episode: str
    index: int
    worker: str
    family: str
    variant: int
    split: str
    seed: int
    purpose: str = "train"
    rollout: str = "plain"
    scope: str = ""
    reflect: bool = False
    extract: bool = False
    slot: str = ""


@event
class EpisodeStarted(Event, tag="episode_started", frozen=True, kw_only=True):
    """The world was reset: the goal, the first observation and its admissible actions."""

    episode: str
    worker: str
    goal: str
    observation: str
    admissible: tuple[str, ...]


@event
class StepTaken(Event, tag="step_taken", frozen=True, kw_only=True):
    """One turn: the action chosen and what the world answered."""

    episode: str
    turn: int
    action: str
    observation: str
    admissible: tuple[str, ...]
    reward: float
    done: bool
    score: float


@event
class EpisodeFinished(Event, tag="episode_finished", frozen=True, kw_only=True):
    """The episode ended (success, failure or step limit); ``truncated``: the world had not
    ended it when it reached the run's ``[world] max_turns`` (its score and success are those
    of its last turn)."""

    episode: str
    worker: str
    family: str
    variant: int
    split: str
    steps: int
    score: float
    success: bool
    total_reward: float
    purpose: str = "train"
    truncated: bool = False


@event
class EpisodeAborted(Event, tag="episode_aborted", frozen=True, kw_only=True):
    """The episode could not finish (the world failed, the worker was restarted)."""

    episode: str
    worker: str
    reason: str
    purpose: str = "train"


@event
class EpisodeAbandoned(Event, tag="episode_abandoned", frozen=True, kw_only=True):
    """The episode's attempt was lost and the episode is assigned again with the same id and
    seed; what the attempt recorded (turns, samples) is dropped. Either the run stopped (or was
    killed) while it was running and ``coevo resume`` re-runs it (``reason`` says so; empty in
    logs before 2026-12-05), or its
    worker was lost mid-episode and restarted (``reason``: "worker restarted (the failure)").
    Unlike :class:`EpisodeAborted`, the episode is not over: it is re-run."""

    episode: str
    worker: str
    purpose: str = "train"
    reason: str = ""


def episode_success(events: Iterable[Event]) -> dict[str, bool]:
    """Whether each episode that ended succeeded: the success of its :class:`EpisodeFinished`,
    and False for one that ended :class:`EpisodeAborted` (a failure, as the trainer and the
    held-out rounds count it: a table of finished episodes alone reads too high where a
    world fails). An episode ended twice (its attempt abandoned, then run again) keeps its
    last end."""
    out: dict[str, bool] = {}
    for ev in events:
        if isinstance(ev, EpisodeFinished):
            out[ev.episode] = ev.success
        elif isinstance(ev, EpisodeAborted):
            out[ev.episode] = False
    return out


def finished_attempts(history: Iterable[Envelope[Event]]) -> Callable[[str, int], bool]:
    """For a resumed run: whether what an episode asked for at a seq (a reflection, an
    extraction, a tip) came from an attempt that finished, i.e. the episode finished and was
    not abandoned after that seq. What an attempt still running or abandoned asked for is not
    owed an answer: its episode is played again and asks again."""
    finished: set[str] = set()
    abandoned: dict[str, int] = {}
    for env in history:
        if isinstance(env.event, EpisodeFinished):
            finished.add(env.event.episode)
        elif isinstance(env.event, EpisodeAbandoned):
            abandoned[env.event.episode] = env.seq

    def of_finished(episode: str, seq: int) -> bool:
        return episode in finished and abandoned.get(episode, -1) < seq

    return of_finished


def live_attempts(history: Sequence[Envelope[Event]]) -> Callable[[str, int], bool]:
    """For an actor restarted mid-run and rebuilt from the log so far
    (``ActorSpec.recover_on_restart``): whether what an episode asked for at a seq is still
    owed an answer, i.e. its attempt finished (:func:`finished_attempts`) or is still running:
    asked in this session (after the log's last ``RunResumed``) and not abandoned since. An
    episode of this session waits for the answer; one abandoned asks again when it is re-run,
    and an earlier session's unfinished attempt was abandoned when the run resumed."""
    of_finished = finished_attempts(history)
    session = -1
    abandoned: dict[str, int] = {}
    for env in history:
        if isinstance(env.event, RunResumed):
            session = env.seq
        elif isinstance(env.event, EpisodeAbandoned):
            abandoned[env.event.episode] = env.seq

    def owed(episode: str, seq: int) -> bool:
        running = seq > session and abandoned.get(episode, -1) < seq
        return running or of_finished(episode, seq)

    return owed
