"""What-if replay's assembly from a run directory (``coevo audit RUN whatif EPISODE``): the
run's scenario, its world, and the policy at each version the replay needs, loaded as the run
loaded it (device, torch threads, the embedded model from the cache, a LoRA run's adapters on the
base, its sampling settings and backend) and checked against the digest the log records (a
version's checkpoint must still be on disk)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from agents.acting.inference import PolicyRunner
from agents.acting.world_calls import GuardedWorld, WorldFailed
from agents.audit.index import Stored as StoredRow
from agents.audit.index import fetch, refs, tip_rows
from agents.audit.whatif import Change, Prompting, WhatIf, check, recorded, replay, what_if
from agents.events.policy import PolicyUpdated
from engine.errors import AuditQueryInvalid, ScenarioInvalid
from engine.eventlog import ModelFiles, machine_description
from scenarios.loader import stored_scenario, stored_source
from scenarios.schema import Scenario
from scenarios.world_tasks import world_factory
from stores.fact_index import FactIndex

__all__ = ["run_whatif"]


def run_whatif(
    root: Path,
    log: Any,
    index: FactIndex,
    episode: str,
    without: int | None,
    instead: int | None,
    version: int | None,
    overrides: list[str] | tuple[str, ...] = (),
) -> WhatIf:
    """Replay ``episode`` unchanged and with the one change asked for, under the scenario the
    log stores with this machine's ``overrides`` (``key.path=value``).

    Raises:
        AuditQueryInvalid: no such episode, or entry, or version; not a policy's episode; a
            checkpoint no longer on disk or not the one the log names.
        ScenarioInvalid: the run's scenario or world cannot be loaded here.
        WorldFailed: the world could not be built, or raised, hung or answered wrongly.
    """
    meta = log.read_meta()
    scenario = stored_scenario(meta, str(root), overrides, ignored=("grpo", "eval", "tracking"))
    source = stored_source(str(root))
    if scenario.agent.kind != "policy":
        raise AuditQueryInvalid(
            f"{root}: agent.kind = {scenario.agent.kind!r}: no policy to replay"
        )
    found = refs(index, "e", episode)
    events = fetch(log, [seq for seq, _ in found])
    rec = recorded(episode, [events[seq] for seq, _ in found])
    stored, text = _entry_stored(index, instead) if instead is not None else (-1, "")
    change = Change(
        without=without,
        instead=(instead, text) if instead is not None else None,
        version=version,
    )
    check(rec, change)
    ended = max((seq for seq, kind in found if kind == "episode_finished"), default=-1)
    note = (
        f"entry {instead} was stored at seq {stored}, after the episode ended (seq {ended}): no "
        "retrieval could have shown it then"
        if instead is not None and stored > ended
        else ""
    )
    runners = _Runners(root, log, index, scenario, source, meta.models if meta else {}, overrides)
    prompting = Prompting(
        window=scenario.policy.window,
        list_actions=scenario.policy.list_actions or scenario.policy.mode == "generate",
        system=scenario.prompt.system,
        memory=scenario.prompt.memory,
    )
    world = GuardedWorld(world_factory(scenario, source), scenario.world.call_limit)
    try:
        turns = scenario.world.max_turns
        try:
            control = replay(rec, world, runners.get, prompting, max_turns=turns)
        except CheckpointGone as exc:  # it named the checkpoint, not why it was wanted
            played = sorted({s.policy_version for s in rec.sampled})
            raise AuditQueryInvalid(
                f"{exc}; episode {episode} was played by policy version"
                f"{'s' if len(played) > 1 else ''} {', '.join(map(str, played))}, and the "
                "control (the episode replayed as it was played, which the change is compared "
                "with) needs each"
            ) from None
        try:
            changed = replay(rec, world, runners.get, prompting, change, max_turns=turns)
        except CheckpointGone as exc:
            raise AuditQueryInvalid(f"{exc}; the change ({change.describe()}) needs it") from None
    except WorldFailed as exc:
        raise WorldFailed(f"replaying episode {episode}: {exc}") from None
    finally:
        world.close()
    answer = msgspec.structs.replace(
        what_if(rec, control, changed, change), note=note, overrides=tuple(overrides)
    )
    if answer.reproduced:
        return answer
    logged = meta.machine if meta else ""
    return msgspec.structs.replace(answer, logged_machine=logged, machine=machine_description())


def _entry_stored(index: FactIndex, tip: int) -> tuple[int, str]:
    """Where entry ``tip`` was stored (seq) and its text."""
    stored = [(seq, row) for seq, row in tip_rows(index, tip) if isinstance(row, StoredRow)]
    if not stored:
        raise AuditQueryInvalid(f"no entry {tip} in this run (ids are TipStored.tip_id)")
    return stored[0][0], stored[0][1].text


class CheckpointGone(AuditQueryInvalid):
    """A policy version's checkpoint is no longer on disk (pruned: ``grpo.keep_checkpoints``)."""


class _Runners:
    """The policy at each version, loaded on first use."""

    def __init__(
        self,
        root: Path,
        log: Any,
        index: FactIndex,
        s: Scenario,
        source: str,
        models: Mapping[str, ModelFiles],
        overrides: Sequence[str] = (),
    ) -> None:
        self._root, self._log, self._index, self._s, self._source = root, log, index, s, source
        self._models = models  # the run's recorded model directories
        self._overrides = overrides
        self._cache: dict[int, PolicyRunner] = {}

    def get(self, version: int) -> PolicyRunner:
        if version not in self._cache:
            self._cache[version] = self._load(version)
        return self._cache[version]

    def _load(self, version: int) -> PolicyRunner:
        import torch

        from scenarios.policy_setup import runner_for
        from stores.checkpoints import param_digest, resolve_device

        s = self._s
        if s.policy.threads:
            torch.set_num_threads(s.policy.threads)
        device = resolve_device(s.policy.device)
        if version == 0:
            path, digest = self._base(), self._parent_digest()
            net, tokenizer = self._version_zero(path)
        else:
            update = self._updated(version)
            path, digest = self._root / update.checkpoint, update.digest
            net, tokenizer = self._checkpoint(path, version, update.checkpoint, device)
        if digest and param_digest(net) != digest:
            from scenarios.policy_models import model_overrides

            named = model_overrides(self._overrides)
            raise AuditQueryInvalid(
                f"{path}: has digest {param_digest(net)}; the log records {digest} for policy "
                f"version {version}"
                + (f" (--set {named[0]} gives another model than the run's)" if named else "")
            )
        try:
            return runner_for(s, net, tokenizer, device, version)
        except ValueError as exc:  # a backend this build lacks
            raise ScenarioInvalid(self._source, f"$.policy.backend: {exc}") from None

    @functools.cached_property
    def _recorded(self) -> dict[str, Path]:
        from scenarios.policy_models import recorded_models

        return recorded_models(self._s, self._models, self._overrides)

    def _base(self) -> Path:
        from scenarios.policy_models import policy_model_dir

        return policy_model_dir(self._s, self._source, self._recorded)

    def _version_zero(self, base: Path) -> tuple[Any, Any]:
        """The base model as the run's actors loaded it: in its dtype and, in a LoRA run, with
        the untrained adapters drawn from the run's seed (which the first update's digest
        covers)."""
        from scenarios.policy_setup import load_base_for

        loaded = load_base_for(self._s, base, "policy")
        return loaded.net, loaded.tokenizer

    def _checkpoint(self, path: Path, version: int, name: str, device: Any) -> tuple[Any, Any]:
        """A version's checkpoint: the whole model, or a LoRA run's adapters on the base (as
        ``coevo probe`` loads them).

        Raises:
            AuditQueryInvalid: its weights are no longer on disk.
        """
        from agents.models.tuning import load_version
        from stores.checkpoints import weights_file

        if not weights_file(path).is_file():
            raise CheckpointGone(
                f"the checkpoint of policy version {version} ({name}) is no longer on disk "
                "(runs keep the newest few: grpo.keep_checkpoints)"
            )
        return load_version(path, self._base, self._s.policy.dtype, device)

    def _updated(self, version: int) -> PolicyUpdated:
        for seq, kind in refs(self._index, "u", str(version - 1)):
            if kind == "policy_updated":
                ev = fetch(self._log, [seq])[seq].event
                assert isinstance(ev, PolicyUpdated)
                return ev
        raise AuditQueryInvalid(f"the run has no policy version {version}")

    def _parent_digest(self) -> str:
        """The base weights' digest, as the first update records it ("" without updates)."""
        try:
            return self._updated(1).parent_digest
        except AuditQueryInvalid:
            return ""
