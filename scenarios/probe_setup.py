"""``coevo probe``'s assembly: a finished Complementary RL run (and its frozen control) mapped to
what :func:`agents.probe.coevolution.probe` holds fixed and the extractors it compares.

From the run directory: the resolved scenario its log stores (world, held-out split, families,
the bank's rules and embedder, the policy's prompt settings), its log (the bank-writing requests,
the extractor's versions, the final policy) and its checkpoints. An extractor version whose
checkpoint was pruned is rebuilt by re-executing the logged extractor updates from the base
(:class:`agents.audit.reexecute.Reexecution`, digests checked against the log at every step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

# safetensors types `filename` as a bare os.PathLike, unknown to strict mode
from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

from agents.acting.inference import PolicyRunner
from agents.audit.reexecute import Reexecution
from agents.events.extractor import (
    ExtractionRequested,
    ExtractorCalled,
    ExtractorGradientRequested,
    ExtractorUpdated,
    MergeDue,
    MergeRequested,
)
from agents.events.memory import TipStored
from agents.events.policy import PolicyUpdated
from agents.memory.bank_rebuild import Answer, RebuildSettings, bank_script
from agents.memory.extractor import ExtractorModel
from agents.methods.actors import bank_settings, embedder_for
from agents.methods.builtin import Complementary
from agents.models.embedder import Embedder
from agents.models.tuning import load_version
from agents.probe.coevolution import ProbeInvalid, ProbeResult, Progress, Setup, Writer, probe
from agents.probe.play import PlaySettings
from engine.eventlog import RunMeta
from engine.events import Envelope, Event
from engine.lifecycle import RunStarted
from engine.world import Task
from scenarios.loader import stored_scenario, stored_source
from scenarios.methods import complementary_settings, method_of
from scenarios.policy_models import extractor_model_dir, policy_model_dir, recorded_models
from scenarios.policy_setup import load_extractor_for, runner_for
from scenarios.schema import Scenario
from scenarios.world_tasks import world_factory, world_tasks
from stores.checkpoints import (
    load_weights,
    param_digest,
    resolve_device,
    trained_state,
    weights_file,
)
from stores.model_dirs import check_model_dir, load_model_dir
from stores.rundir import find_run

KEPT = (
    RunStarted,
    ExtractionRequested,
    MergeRequested,
    MergeDue,
    ExtractorCalled,
    TipStored,
    ExtractorGradientRequested,
    ExtractorUpdated,
    PolicyUpdated,
)
"""The kinds a probe reads (the bulky per-turn ones are left out while reading)."""
UPDATES = (ExtractorCalled, ExtractorGradientRequested, ExtractorUpdated)


MAX_EPISODES = 1_000_000
"""The most held-out episodes per bank a probe plays (its task and seed lists are built first:
an unbounded count took memory until the process was killed)."""


@dataclass(frozen=True)
class ProbeOptions:
    """``coevo probe``'s options (see :func:`probe_run`)."""

    episodes: int = 300
    versions: str = "0,mid,last"
    policy: str = "final"
    greedy: bool = False
    seed: int = 0


@dataclass
class RunLog:
    """What a probe reads of one run."""

    root: Path
    scenario: Scenario
    source: str
    seed: int
    envelopes: list[Envelope[Event]] = field(default_factory=list[Envelope[Event]])
    updates: list[ExtractorUpdated] = field(default_factory=list[ExtractorUpdated])
    policy: list[PolicyUpdated] = field(default_factory=list[PolicyUpdated])
    recorded: dict[str, Path] = field(default_factory=dict[str, Path])
    """Its embedded models where they still are (``policy_models.recorded_models``)."""


def _complementary(scenario: Scenario) -> bool:
    """The scenario's method is Complementary RL (or a plug-in built on it)."""
    if scenario.run.method == "rollout":
        return False
    try:
        return isinstance(method_of(scenario), Complementary)
    except ValueError:  # a plug-in that no longer loads: not a run the probe can read
        return False


def read_run(
    path: str,
    meta: RunMeta | None,
    read: Callable[[str], Iterable[Envelope[Event]]],
    overrides: list[str] | tuple[str, ...] = (),
) -> RunLog:
    """A Complementary RL run's scenario and the events a probe needs.

    Args:
        path: the run directory.
        meta: its log's metadata (the scenario the run was started with).
        read: the run's envelopes in order (the CLI opens the log).
        overrides: ``key.path=value`` settings of this machine for the scenario.

    Raises:
        RunNotFound: ``path`` holds no run.
        ScenarioInvalid: the log's scenario is missing or does not validate here.
        ProbeInvalid: it is not a Complementary RL run, or its log is empty.
    """
    root = find_run(path).root
    source = stored_source(str(root))
    scenario = stored_scenario(meta, str(root), overrides, ignored=("grpo", "tracking"))
    if not _complementary(scenario):
        raise ProbeInvalid(
            f"{path}: run.method = {scenario.run.method!r}: not a Complementary RL run "
            "(the probe rebuilds an extractor's bank)"
        )
    recorded = recorded_models(scenario, meta.models, overrides) if meta is not None else {}
    run = RunLog(root, scenario, source, scenario.seed, recorded=recorded)
    for env in read(path):
        ev = env.event
        if not isinstance(ev, KEPT):
            continue
        if isinstance(ev, RunStarted):
            run.seed = ev.seed
        elif isinstance(ev, ExtractorUpdated):
            run.updates.append(ev)
        elif isinstance(ev, PolicyUpdated):
            run.policy.append(ev)
        run.envelopes.append(env)
    if not run.envelopes:
        raise ProbeInvalid(f"{path}: the event log is empty")
    return run


def probe_run(
    run: RunLog,
    control: RunLog | None,
    options: ProbeOptions,
    progress: Progress | None = None,
) -> ProbeResult:
    """Probe ``run``'s extractor versions (and ``control``'s frozen extractor).

    Raises:
        ProbeInvalid: a version the run does not have, a control whose extractor trained, a
            base or checkpoint that is not the one the log names, or a policy not on disk.
        ModelUnavailable: a model cannot be found, built or loaded.
        UpdateDiverged: re-executing the extractor's updates does not reproduce the log.
    """
    if not 1 <= options.episodes <= MAX_EPISODES:
        raise ProbeInvalid(
            f"--episodes must be between 1 and {MAX_EPISODES:,}, got {options.episodes}"
        )
    s = run.scenario
    wanted = parse_versions(options.versions, _last(run))
    if control is not None and control.updates:
        raise ProbeInvalid(
            f"--control {control.root}: its extractor was updated {len(control.updates)} "
            "times; the control is a run whose extractor never trains "
            "(scenarios/complementary_frozen.toml)"
        )
    heldout = heldout_tasks(s, run.source)
    if s.policy.threads:
        torch.set_num_threads(s.policy.threads)
    model = policy_model_dir(s, run.source, run.recorded)
    ext = _extractor(run, model, options.greedy)
    writers = _versions(run, model, ext, wanted, progress or Progress())
    if control is not None:
        writers.insert(1 if 0 in wanted else 0, _control(control, ext, options.greedy, 0 in wanted))
    runner, policy = _policy(run, model, options.policy)
    setup = _setup(run, heldout, runner, policy, options)
    where = str(control.root) if control else ""
    return probe(setup, writers, progress, run=str(run.root), control=where)


def _setup(
    run: RunLog, heldout: list[Task], runner: PolicyRunner, policy: str, options: ProbeOptions
) -> Setup:
    """What the probe holds fixed: the run's requests, bank rules, embedder, world, prompts."""
    s, p = run.scenario, run.scenario.policy
    c = complementary_settings(s)  # a plug-in built on Complementary RL: its [method]
    embedder = embedder_for(c.embedder, c.query_chars)()
    return Setup(
        script=bank_script(run.envelopes),
        bank=bank_settings(c),
        dim=embedder.dim,
        embed=_Cached(embedder),
        rebuild=RebuildSettings(
            run_seed=run.seed,
            merge_chunk=c.merge_chunk,
            merge_max=c.merge_max,
            batch=p.batch_max,
            merge_system=s.prompt.merge,
        ),
        runner=runner,
        policy=policy,
        make_world=world_factory(s, run.source),
        heldout=heldout,
        play=PlaySettings(
            window=p.window,
            list_actions=p.list_actions or p.mode == "generate",
            greedy=s.eval.greedy,
            batch=p.batch_max,
            width=2 * p.batch_max,
            system=s.prompt.system,
            memory=s.prompt.memory,
            max_turns=s.world.max_turns,
            step_timeout=s.world.call_limit,
        ),
        episodes=options.episodes,
        seed=options.seed,
    )


def parse_versions(spec: str, last: int) -> list[int]:
    """The versions a ``--versions`` list names: integers, ``mid`` (``(last + 1) // 2``) and
    ``last``, sorted, each once.

    Raises:
        ProbeInvalid: an item is neither, or not a version of the run (0 .. ``last``).
    """
    out: set[int] = set()
    for item in (x.strip() for x in spec.split(",")):
        named = {"last": last, "mid": (last + 1) // 2}
        if item in named:
            out.add(named[item])
        elif item.isdigit() and int(item) <= last:
            out.add(int(item))
        else:
            raise ProbeInvalid(
                f"--versions: {item!r} is not an extractor version of the run "
                f"(0 .. {last}, mid, last)"
            )
    return sorted(out)


def heldout_tasks(s: Scenario, source: str) -> list[Task]:
    """The tasks the run's evaluation rounds drew from: its families on ``eval.split``.

    Raises:
        ScenarioInvalid: the world cannot be built here, or does not offer those tasks.
    """
    return list(world_tasks(s, s.eval.split, source))


def _last(run: RunLog) -> int:
    return max((u.extractor_version for u in run.updates), default=0)


def _extractor(run: RunLog, model: Path, greedy: bool) -> ExtractorModel:
    """The run's extractor at its base, checked against the digest its first update names."""
    ext = load_extractor_for(
        run.scenario, extractor_model_dir(run.scenario, run.source, model, run.recorded)
    )
    if greedy:
        ext.settings = dataclasses.replace(ext.settings, temperature=0.0)
    ext.digest = param_digest(ext.model)
    parent = run.updates[0].parent_digest if run.updates else ""
    if parent and parent != ext.digest:
        raise ProbeInvalid(
            f"{run.root}: the extractor's base has digest {ext.digest}, the run started from "
            f"{parent} (another base model or cache?)"
        )
    return ext


def _versions(
    run: RunLog, model: Path, ext: ExtractorModel, wanted: Sequence[int], progress: Progress
) -> list[Writer]:
    """The writers of the wanted versions: from a checkpoint on disk, else re-executed."""
    base = _state(ext.model)
    states: dict[int, tuple[dict[str, torch.Tensor], str]] = {0: (base, "the base")}
    missing: list[int] = []
    of = {u.extractor_version: u for u in run.updates}
    for v in (v for v in wanted if v > 0):
        upd = of[v]
        path = weights_file(run.root / upd.checkpoint)  # a LoRA run's holds its adapters
        if path.is_file():
            state = load_file(str(path))
            states[v] = (state, f"checkpoint {upd.checkpoint}")
            _check(ext, state, upd.digest, f"checkpoint {upd.checkpoint}")
        else:
            missing.append(v)
    if missing:
        states.update(_reexecuted(run, model, missing, progress))
    out: list[Writer] = []
    for v in wanted:
        state, origin = states[v]
        digest = ext.digest if v == 0 else of[v].digest
        load = _loader(ext, state, v)
        out.append(Writer(f"v{v}", v, origin, digest, load, frozen=v == 0))
    return out


def _reexecuted(
    run: RunLog, model: Path, versions: Sequence[int], progress: Progress
) -> dict[int, tuple[dict[str, torch.Tensor], str]]:
    """The extractor at ``versions``, by re-executing its logged updates from the base."""
    ext = load_extractor_for(
        run.scenario, extractor_model_dir(run.scenario, run.source, model, run.recorded)
    )
    progress.stage("re-executing extractor updates", max(versions))
    again = Reexecution(run.root, run.seed, None, ext)
    out: dict[int, tuple[dict[str, torch.Tensor], str]] = {}
    for env in run.envelopes:
        if not isinstance(env.event, UPDATES):
            continue
        checked = again.feed(env)
        if checked is not None:
            progress.advance(1)
        if checked is not None and checked.version in versions:
            origin = f"re-executed from the base (updates 1-{checked.version}, digests match)"
            out[checked.version] = (_state(ext.model), origin)
            if len(out) == len(versions):
                break
    return out


def _control(control: RunLog, ext: ExtractorModel, greedy: bool, has_v0: bool) -> Writer:
    """The frozen control's extractor: its base (sharing version 0's bank when its weights
    and settings are version 0's)."""
    model = policy_model_dir(control.scenario, control.source, control.recorded)
    c = _extractor(control, model, greedy)
    same = has_v0 and c.digest == ext.digest and c.settings == ext.settings
    origin = f"the control's base ({control.scenario.name})"
    if same:
        origin += ": the same weights and settings as v0, so the same bank"
    return Writer(
        "control",
        None,
        origin,
        c.digest,
        lambda: c.answer,
        frozen=True,
        same_as="v0" if same else "",
    )


def _loader(ext: ExtractorModel, state: dict[str, torch.Tensor], version: int) -> Any:
    def load() -> Answer:
        load_weights(ext.model, state)
        ext.version = version
        return ext.answer

    return load


def _state(model: Any) -> dict[str, torch.Tensor]:
    """A copy of what a checkpoint of ``model`` holds (its adapters, for a LoRA extractor)."""
    return {k: v.detach().clone() for k, v in trained_state(model).items()}


def _check(ext: ExtractorModel, state: dict[str, torch.Tensor], digest: str, what: str) -> None:
    load_weights(ext.model, state)
    got = param_digest(ext.model)
    if got != digest:
        raise ProbeInvalid(f"{what} has digest {got}; the log records {digest}")


def _policy(run: RunLog, model: Path, which: str) -> tuple[PolicyRunner, str]:
    """The fixed policy: the run's final checkpoint, its base, or a model directory."""
    s = run.scenario
    device = resolve_device(s.policy.device)
    if which == "base":
        path, what = model, f"the base policy ({model})"
    elif which == "final":
        if not run.policy:
            raise ProbeInvalid(f"{run.root}: the run has no policy update; use --policy base")
        last = run.policy[-1]
        path = run.root / last.checkpoint
        if not weights_file(path).is_file():
            raise ProbeInvalid(
                f"{run.root}: the final policy checkpoint {last.checkpoint} is not on disk; "
                "use --policy base or --policy PATH"
            )
        what = f"the run's final policy (version {last.policy_version}, {last.checkpoint})"
    else:
        path, what = check_model_dir(Path(which), "--policy"), which
    if which == "final":  # as the run had it: a LoRA run's adapters on the base
        net, tokenizer = load_version(path, lambda: model, s.policy.dtype, device)
    else:
        net, tokenizer = load_model_dir(path, device)
    if which == "final" and param_digest(net) != run.policy[-1].digest:
        raise ProbeInvalid(
            f"{path}: has digest {param_digest(net)}; the log records {run.policy[-1].digest}"
        )
    try:
        return runner_for(s, net, tokenizer, device), what
    except ValueError as exc:  # a backend this build lacks
        raise ProbeInvalid(f"{run.root}: [policy] backend: {exc}") from None


class _Cached:
    """An embedder that embeds each distinct text once."""

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self._vectors: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str]) -> list[np.ndarray]:
        missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if missing:
            self._vectors.update(zip(missing, self._embedder.embed(missing), strict=True))
        return [self._vectors[t] for t in texts]
