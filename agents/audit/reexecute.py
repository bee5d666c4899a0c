"""Re-executing a run's model updates from its log (``coevo replay RUN --reexecute-learner``).

Starting from the base weights (policy version 0, and the extractor's starting copy), every
recorded update is run again on its recorded inputs, in log order: the policy's
:class:`GradientRequested` on the turns the learner kept
(:class:`agents.learning.learner.SampleBuffer`, the learner's own fold) with the seed and the
torch threads :class:`PolicyUpdated` records, the extractor's
:class:`ExtractorGradientRequested` on the named :class:`ExtractorCalled` responses. Each
result must match the log bit for bit: the parameters' digest, the samples trained on, and the
checkpoint when it is still on disk. The optimisers' state is not stored; it is rebuilt by
applying the updates in order from the start, as the run did.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from agents.events.extractor import ExtractorCalled, ExtractorGradientRequested, ExtractorUpdated
from agents.events.policy import LAYOUTS, UNRECORDED_LAYOUTS, GradientRequested, PolicyUpdated
from agents.learning.learner import SampleBuffer, update_seed
from agents.learning.update import Sample, StepStats, Trainee, grpo_step
from agents.memory.extractor import ExtractorModel, extractor_step
from agents.models.tuning import torch_threads, trainable
from engine.errors import UpdateDiverged
from engine.events import Envelope, Event
from stores.checkpoints import load_weights, param_digest, weights_file


@dataclass(frozen=True, slots=True)
class Checked:
    """One update re-executed and found equal to the log.

    Attributes:
        model: "policy" or "extractor".
        update: the update's number.
        version: the version it produced.
        digest: the parameters' digest (the log's and the re-execution's).
        checkpoint: the checkpoint compared with it ("" when no longer on disk).
    """

    model: str
    update: int
    version: int
    digest: str
    checkpoint: str


@dataclass(frozen=True, slots=True)
class RequestedUpdate:
    """A policy update as its run's log asked for it: what re-execution runs again.

    Attributes:
        request: the update's :class:`GradientRequested`.
        samples: the turns the learner kept for it (its own fold, in its order).
        stale: how many of them an older policy version drew.
        seed: the seed it ran with (recorded, or derived from the run's seed in older logs).
        version: the policy version it trained (its result is ``version + 1``).
        seq: the seq of its :class:`PolicyUpdated`.
        result: that :class:`PolicyUpdated`.
    """

    request: GradientRequested
    samples: list[Sample]
    stale: int
    seed: int
    version: int
    seq: int
    result: PolicyUpdated


class UpdateInputs:
    """The fold that pairs each :class:`PolicyUpdated` in a log with its inputs: the learner's
    own :class:`SampleBuffer`, which serves requests in order, one policy version each.

    Args:
        run_seed: the run's seed (for logs that predate :attr:`PolicyUpdated.seed`).
    """

    def __init__(self, run_seed: int) -> None:
        self.run_seed = run_seed
        self._buffer = SampleBuffer()
        self._requests: dict[int, tuple[GradientRequested, list[Sample], int]] = {}

    @property
    def pending(self) -> int:
        """Requests folded that no :class:`PolicyUpdated` has answered yet."""
        return len(self._requests)

    def feed(self, env: Envelope[Event]) -> RequestedUpdate | None:
        """Fold one envelope; returns the update its :class:`PolicyUpdated` completes, if any.

        Raises:
            UpdateDiverged: the log asks for an episode it never finished, or records an
                update no request asked for.
        """
        req = self._buffer.observe(env)
        if req is not None:
            try:
                samples, stale = self._buffer.collect(req)
            except RuntimeError as exc:  # the log asks for an episode it never finished
                raise UpdateDiverged("policy", req.update, env.seq, str(exc)) from None
            self._buffer.version += 1
            self._requests[req.update] = (req, samples, stale)
            return None
        ev = env.event
        if not isinstance(ev, PolicyUpdated):
            return None
        if ev.update not in self._requests:
            raise UpdateDiverged("policy", ev.update, env.seq, "no GradientRequested before it")
        req, samples, stale = self._requests.pop(ev.update)
        seed = ev.seed if ev.seed is not None else update_seed(self.run_seed, ev.update)
        return RequestedUpdate(req, samples, stale, seed, ev.policy_version - 1, env.seq, ev)


def requested_updates(
    envelopes: Iterable[Envelope[Event]], run_seed: int
) -> Iterator[RequestedUpdate]:
    """Each policy update of a log, in order, with its inputs (nothing is run)."""
    inputs = UpdateInputs(run_seed)
    for env in envelopes:
        update = inputs.feed(env)
        if update is not None:
            yield update


@dataclass
class Summary:
    """What a whole re-execution checked."""

    policy: int = 0
    extractor: int = 0
    checkpoints: int = 0
    unapplied: int = 0  # requests the run never answered (it stopped first)


class _Model:
    """One model being re-executed: its live weights and a scratch copy for checkpoints."""

    def __init__(self, name: str, model: Any, run_dir: Path) -> None:
        self.name = name
        self.model = model
        self.scratch = copy.deepcopy(model)
        self.run_dir = run_dir
        self.digest = param_digest(model)
        self.version = 0

    def check_start(self, env: Envelope[Event], update: int, parent: str) -> None:
        """Before the first update: compare the starting weights with those the run started
        from (``parent``; "" in older logs), so that another base model is named as such and
        not run into (a vocabulary of another size fails inside the step)."""
        if parent and self.version == 0 and parent != self.digest:
            raise UpdateDiverged(
                self.name,
                update,
                env.seq,
                f"the starting weights have digest {self.digest}, the run started from "
                f"{parent} (another base model or cache?)",
                start=True,
            )

    def check(self, env: Envelope[Event], update: int, recorded: str) -> None:
        """Compare the digest after an update with the log."""
        self.digest = param_digest(self.model)
        self.version += 1
        if self.digest != recorded:
            raise UpdateDiverged(
                self.name,
                update,
                env.seq,
                f"re-executed parameters have digest {self.digest}, the log records {recorded}",
            )

    def check_checkpoint(self, env: Envelope[Event], update: int, name: str) -> str:
        """Compare the checkpoint ``name`` (relative to the run) with the log, if on disk."""
        path = weights_file(self.run_dir / name)
        if not path.is_file():
            return ""  # pruned: runs keep only the newest few
        try:
            state = load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise UpdateDiverged(self.name, update, env.seq, f"{path}: unreadable: {exc}") from None
        load_weights(self.scratch, state)
        got = param_digest(self.scratch)
        if got != self.digest:
            raise UpdateDiverged(
                self.name,
                update,
                env.seq,
                f"checkpoint {name} on disk has digest {got}, the log records {self.digest}",
            )
        return name


class Reexecution:
    """Folds a run's envelopes in order and re-executes each update when its result appears.

    Args:
        run_dir: the run directory (checkpoints are read relative to it).
        run_seed: the run's seed (for logs that predate :attr:`PolicyUpdated.seed`).
        trainee: the policy at version 0, with a fresh optimiser (None: re-execute the
            extractor's updates only; a policy update fed to it then diverges).
        extractor: the extractor at its starting weights (None: the run has none).
    """

    def __init__(
        self,
        run_dir: Path,
        run_seed: int,
        trainee: Trainee | None,
        extractor: ExtractorModel | None,
    ) -> None:
        self.trainee = trainee
        self.extractor = extractor
        self.policy = _Model("policy", trainee.model, run_dir) if trainee else None
        self.ext = _Model("extractor", extractor.model, run_dir) if extractor else None
        self.inputs = UpdateInputs(run_seed)
        self.calls: dict[str, ExtractorCalled] = {}
        self.ext_requests: dict[int, ExtractorGradientRequested] = {}
        self.summary = Summary()
        # for requests that do not record theirs (logs written before 2026-12-02)
        self._layouts: tuple[str, ...] = UNRECORDED_LAYOUTS

    def feed(self, env: Envelope[Event]) -> Checked | None:
        """Fold one envelope; returns the update it completed, if any.

        Raises:
            UpdateDiverged: the update it completes does not match the log.
        """
        ev = env.event
        if isinstance(ev, PolicyUpdated) and self.trainee is None:
            raise UpdateDiverged("policy", ev.update, env.seq, "no policy to re-execute it on")
        update = self.inputs.feed(env)
        if update is not None:
            return self._policy(env, update)
        if isinstance(ev, ExtractorCalled):
            self.calls[ev.call] = ev
        elif isinstance(ev, ExtractorGradientRequested):
            self.ext_requests[ev.update] = ev
        elif isinstance(ev, ExtractorUpdated):
            return self._extractor(env, ev)
        return None

    def run(
        self,
        envelopes: Iterable[Envelope[Event]],
        on_checked: Callable[[Checked], None] = lambda _: None,
    ) -> Summary:
        """Feed every envelope, calling ``on_checked`` after each matching update.

        Raises:
            UpdateDiverged: the first update that does not match the log.
        """
        for env in envelopes:
            checked = self.feed(env)
            if checked is not None:
                on_checked(checked)
        self.summary.unapplied = self.inputs.pending + len(self.ext_requests)
        return self.summary

    def _policy(self, env: Envelope[Event], update: RequestedUpdate) -> Checked:
        assert self.policy is not None
        req, samples, stale, ev = update.request, update.samples, update.stale, update.result
        _known_layout("policy", ev.update, env.seq, req.scoring, "request")
        self.policy.check_start(env, ev.update, ev.parent_digest)
        with torch_threads(ev.threads):  # as many as the update ran with (None: as they are)
            stats = self._policy_step(req, samples, update.seed, update.version, ev.digest)
        if (stats.samples, stale) != (ev.samples, ev.stale):
            raise UpdateDiverged(
                "policy",
                ev.update,
                env.seq,
                f"re-execution trained on {stats.samples} samples ({stale} stale), the log "
                f"records {ev.samples} ({ev.stale} stale)",
            )
        self.policy.check(env, ev.update, ev.digest)
        name = self.policy.check_checkpoint(env, ev.update, ev.checkpoint)
        self.summary.policy += 1
        self.summary.checkpoints += bool(name)
        return Checked("policy", ev.update, ev.policy_version, ev.digest, name)

    def _policy_step(
        self, req: GradientRequested, samples: list[Sample], seed: int, version: int, digest: str
    ) -> StepStats:
        """Run update ``req`` again. A request that does not record its scoring layout (logs
        written before 2026-12-02) with "score" turns ran with "packed" or "rows" (the layout of
        "generate" turns never changed): each is tried from the same
        weights and optimiser state, the one that matched the update before first, until
        one reproduces the recorded digest (the caller then checks it, and reports the last
        try's difference if none did)."""
        assert self.trainee is not None
        if req.scoring is not None or all(s.turn.mode != "score" for s in samples):
            return grpo_step(self.trainee, samples, req, seed, version)
        for k, layout in enumerate(self._layouts):
            saved = _state(self.trainee) if k + 1 < len(self._layouts) else None
            told = msgspec.structs.replace(req, scoring=layout)
            stats = grpo_step(self.trainee, samples, told, seed, version)
            if saved is None or param_digest(self.trainee.model) == digest:
                self._layouts = (layout, *(x for x in self._layouts if x != layout))
                return stats
            _restore(self.trainee, saved)
        raise AssertionError("unreachable: the last layout returns")

    def _extractor(self, env: Envelope[Event], ev: ExtractorUpdated) -> Checked:
        req = self.ext_requests.pop(ev.update, None)
        if req is None or self.extractor is None or self.ext is None:
            raise UpdateDiverged(
                "extractor", ev.update, env.seq, "no ExtractorGradientRequested before it"
            )
        missing = [c for c in req.calls if c not in self.calls]
        if missing:
            raise UpdateDiverged(
                "extractor", ev.update, env.seq, f"calls {missing[:3]} are not in the log"
            )
        self.ext.check_start(env, ev.update, ev.parent_digest)
        _known_layout("extractor", ev.update, env.seq, ev.scoring, "update")
        layout = ev.scoring or "packed"  # None: written before the layout was recorded
        stats = extractor_step(self.extractor, [self.calls[c] for c in req.calls], req, layout)
        self.extractor.version += 1
        if stats.samples != ev.samples:
            raise UpdateDiverged(
                "extractor",
                ev.update,
                env.seq,
                f"re-execution trained on {stats.samples} calls, the log records {ev.samples}",
            )
        self.ext.check(env, ev.update, ev.digest)
        name = self.ext.check_checkpoint(env, ev.update, ev.checkpoint)
        self.summary.extractor += 1
        self.summary.checkpoints += bool(name)
        return Checked("extractor", ev.update, ev.extractor_version, ev.digest, name)


def _known_layout(model: str, update: int, seq: int, layout: str | None, where: str) -> None:
    """Refuse a scoring layout this code does not know (None: not recorded, an older log)."""
    if layout is not None and layout not in LAYOUTS:
        raise UpdateDiverged(
            model, update, seq, f"the {where} names scoring {layout!r}, not one of {LAYOUTS}"
        )


def _state(trainee: Trainee) -> tuple[list[torch.Tensor], dict[str, Any] | None]:
    """A copy of what an update changes: the trainable parameters (a LoRA model's adapters,
    not its frozen base) and the optimiser's state."""
    opt = trainee.optimizer
    weights = [p.detach().clone() for p in trainable(trainee.model)]
    return weights, copy.deepcopy(opt.state_dict()) if opt is not None else None


def _restore(trainee: Trainee, saved: tuple[list[torch.Tensor], dict[str, Any] | None]) -> None:
    """Put back what :func:`_state` copied."""
    weights, opt = saved
    with torch.no_grad():
        for p, w in zip(trainable(trainee.model), weights, strict=True):
            p.copy_(w)
    if opt is None:
        trainee.optimizer = None
    else:
        assert trainee.optimizer is not None
        trainee.optimizer.load_state_dict(opt)
