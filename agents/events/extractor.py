"""Complementary RL's events: the extractor's calls, the credit they earn, and its updates.

An extractor call is born from a finished training episode (``ExtractionRequested``, by the env
worker: the trajectory, the outcome and the entry the actor used) or from a chunk of the bank
(``MergeRequested``, by the memory actor when the trainer says a merge is due, ``MergeDue``;
the memory actor then says how many chunks the pass has, ``MergePlanned``). The extractor
answers with ``ExtractorCalled``: its prompt and response token ids and log-probs, and the bank
operations parsed from the response (none, with the parser's errors, when it is malformed). The
memory actor applies the operations (``TipStored`` with the call and the parent entries,
``TipEvicted`` for replaced, merged and discarded entries).

Every guided episode's outcome becomes a ``CreditAssigned`` for the call behind the entry it
used; when the extractor's buffer holds enough credited calls the credit actor asks for an
update (``ExtractorGradientRequested``, naming the credits it consumed) and the extractor
answers with ``ExtractorUpdated``. At the run's end the trainer asks the credit actor to
settle (``CreditsDue``), and it answers once every episode end is folded (``CreditsSettled``).

Operations are recorded as ``(op, ids, content)`` triples: ``("add", (), text)``,
``("update", (3, 5), text)``, ``("merge", (3, 5), text)``, ``("rewrite", (4,), text)``,
``("discard", (2, 7), "")``.
"""

from __future__ import annotations

from engine.events import Event, event

Op = tuple[str, tuple[int, ...], str]


@event
class ExtractionRequested(Event, tag="extraction_requested", frozen=True, kw_only=True):
    """A finished training episode goes to the extractor's queue.

    ``entry`` is the bank entry the actor was shown (-1: a free episode); ``messages`` the
    extraction prompt.
    """

    episode: str
    worker: str
    slot: str
    entry: int
    messages: tuple[tuple[str, str], ...]
    success: bool
    score: float
    seed: int


@event
class MergeRequested(Event, tag="merge_requested", frozen=True, kw_only=True):
    """The memory actor hands a chunk of ``slot``'s entries to the extractor to merge."""

    step: int
    slot: str
    entries: tuple[int, ...]
    messages: tuple[tuple[str, str], ...]
    seed: int


@event
class MergeDue(Event, tag="merge_due", frozen=True, kw_only=True):
    """The trainer asks the memory actor for a merge pass over the bank (every few steps)."""

    step: int


@event
class MergePlanned(Event, tag="merge_planned", frozen=True, kw_only=True):
    """The memory actor's answer to a :class:`MergeDue` (its ``cause``): the pass's
    ``requests`` chunks (:class:`MergeRequested`, each also caused by the ``MergeDue``) come
    before it in the log; 0 when the bank has nothing to merge. The trainer completes a run
    only once every pass it asked for is planned and its chunks answered (older logs have
    none: their passes were not waited for)."""

    step: int
    requests: int


@event
class ExtractorCalled(Event, tag="extractor_called", frozen=True, kw_only=True):
    """One extractor call: what it read and wrote, and the operations parsed from it.

    Attributes:
        call: the call's id (``x`` + the request's sequence number), named by every entry it
            writes and every credit it earns.
        task: "extract" (an episode) or "merge" (a chunk of entries).
        source: the episode (extract) or the merge step (merge), as text.
        slot: the bank partition the operations apply to.
        ops: the parsed operations, applied in order.
        errors: the parser's message for every piece it refused.
        malformed: nothing usable could be parsed.
        prompt_cut: how many tokens the prompt lost from its middle to fit the model's
            positions (``agents.models.prompts.cut_middle``); 0: none.
        extractor_version: the extractor weights that answered.
    """

    call: str
    task: str
    source: str
    slot: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    token_logps: tuple[float, ...]
    text: str
    temperature: float
    extractor_version: int
    ops: tuple[Op, ...] = ()
    errors: tuple[str, ...] = ()
    malformed: bool = False
    prompt_cut: int = 0


@event
class CreditAssigned(Event, tag="credit_assigned", frozen=True, kw_only=True):
    """A guided episode's outcome credited to the call that wrote the entry it used.

    ``credit`` is +1 (success) or -1 (failure); ``rule`` names the formula.
    """

    episode: str
    entry: int
    call: str
    success: bool
    credit: float
    step: int
    rule: str = "outcome-pm1"


@event
class ExtractorGradientRequested(
    Event, tag="extractor_gradient_requested", frozen=True, kw_only=True
):
    """The credit actor asks for extractor update ``update`` on ``calls``.

    ``rewards[i]`` is call i's mean credit so far, ``advantages[i]`` its reward minus the
    batch mean, ``weights[i]`` the count-aware reweighting (0 in cooldown), ``credits`` the
    episodes whose :class:`CreditAssigned` this update consumes (one credit per episode). The
    loss settings are recorded so the update re-derives from the log.
    """

    update: int
    step: int
    calls: tuple[str, ...]
    rewards: tuple[float, ...]
    advantages: tuple[float, ...]
    weights: tuple[float, ...]
    credits: tuple[str, ...]
    lr: float
    clip_low: float = 0.1
    clip_high: float = 0.1
    max_grad_norm: float = 1.0
    alpha: float = 0.5
    cooldown: int = 1


@event
class ExtractorUpdated(Event, tag="extractor_updated", frozen=True, kw_only=True):
    """The extractor applied update ``update``: it is now ``extractor_version``.

    ``digest`` is the blake2b of the new parameters, ``parent_digest`` that of the parameters
    the update started from (version 0: the starting weights; "" in older logs).
    ``trainable_params``, ``total_params``, ``optimizer_bytes``, ``peak_bytes``: what the
    trained state costs (``agents.models.tuning.MemoryUse``; None in older logs).
    ``scoring``: where the update's forward pass ran the output layer
    (``agents.events.policy.LAYOUTS``: "kept", at the places that predict a response token;
    None in logs written before 2026-12-05, whose updates ran it at every place, "packed"),
    which re-execution follows.
    """

    extractor_version: int
    update: int
    samples: int
    loss: float
    grad_norm: float
    clip_frac: float
    digest: str
    checkpoint: str
    seconds: float
    parent_digest: str = ""
    trainable_params: int | None = None
    total_params: int | None = None
    optimizer_bytes: int | None = None
    peak_bytes: int | None = None
    scoring: str | None = None


Subject = tuple[str, str, str]
"""What an extractor call is about: its task ("extract" or "merge"), its source (the episode,
or ``merge`` + the merge step) and its slot, as :class:`ExtractorCalled` names them."""


def subject_of(ev: ExtractionRequested | MergeRequested | ExtractorCalled) -> Subject:
    """What a request to the extractor, or its answer, is about (the answer names its
    request's subject: the ``requests`` invariant and the trainer's count of open requests
    both match them so)."""
    if isinstance(ev, ExtractionRequested):
        return ("extract", ev.episode, ev.slot)
    if isinstance(ev, MergeRequested):
        return ("merge", f"merge{ev.step}", ev.slot)
    return (ev.task, ev.source, ev.slot)


@event
class CreditsDue(Event, tag="credits_due", frozen=True, kw_only=True):
    """The trainer, its own work done (every episode ended, every policy update made), asks
    the credit actor to account for every episode end before it: the credit actor answers
    :class:`CreditsSettled` (its ``cause``), after any extractor update request those ends
    made it ask, so the trainer completes the run only once that update is made too. Older
    logs have none (their last request was not waited for)."""

    policy_version: int


@event
class CreditsSettled(Event, tag="credits_settled", frozen=True, kw_only=True):
    """The credit actor's answer to a :class:`CreditsDue`: it has folded every episode end
    logged before it, and asked for ``updates`` extractor updates in all
    (:class:`ExtractorGradientRequested`, each before it in the log)."""

    updates: int
