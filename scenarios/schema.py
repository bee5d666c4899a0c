"""The typed schema of scenario files.

A scenario is TOML decoded into these Structs; unknown keys are rejected, every number has a
range, and errors carry the key path (``$.run.episodes``). Defaults are the embedded defaults:
a scenario file only states what differs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from agents.memory.extraction import EXTRACT_SYSTEM, MERGE_SYSTEM
from agents.methods.settings import ComplementaryConfig, Empo2Config, EvalConfig, GrpoConfig
from agents.models.prompts import REFLECT_SYSTEM, TURN_SYSTEM
from agents.models.tuning import LoraSettings

PositiveInt = Annotated[int, Meta(ge=1, le=1_000_000_000)]
NonNegInt = Annotated[int, Meta(ge=0, le=1_000_000_000)]
Name = Annotated[str, Meta(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")]
Family = Annotated[str, Meta(min_length=1, max_length=300)]
"""A task family as its world names it (``"日本語"``, ``"c d"``): checked against what the world
offers when the scenario is assembled, not against a pattern of coevo's own."""


class WorldConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which world, which of its task families, and options passed to its constructor.

    Attributes:
        name: a built-in world name (``minilab``) or an import path ``package.module:Class``.
        families: task families to draw episodes from (empty: all the world offers).
        split: variants to draw from: "train" or "heldout".
        options: keyword arguments for the world's constructor.
        step_timeout: seconds a blocking world's ``reset``, ``step`` or ``close`` may take
            before the episode is aborted as hung (0: no limit; worlds stepped on the event
            loop, like minilab, are not timed); its constructor, ``families`` and ``tasks``
            have as long (at assembly, in a worker, in pre-training, ``whatif`` and ``probe``).
        max_turns: the most turns of one episode; one the world has not ended by then
            finishes as truncated (``EpisodeFinished.truncated``, with the score and success of
            its last turn), so a world that never says done cannot run (and fill the disk)
            forever; 0: no limit. Worlds end their episodes long before the default (minilab in
            tens of turns; ScienceWorld and TextWorld by their own ``max_steps``).
        pool: training draws from the first ``pool`` variants of each family of ``split``
            only, so each is met many times (the papers train on a fixed set of tasks for many
            passes); 0 draws from every variant. Evaluation rounds are not limited by it: with
            ``eval.split = "heldout"`` they stay on variants never trained on.
    """

    name: Annotated[str, Meta(min_length=1, max_length=300)] = "minilab"
    families: list[Family] = msgspec.field(default_factory=list[str])
    split: Literal["train", "heldout"] = "train"
    options: dict[str, Any] = msgspec.field(default_factory=dict[str, Any])
    step_timeout: Annotated[float, Meta(ge=0, le=86_400)] = 600.0
    max_turns: Annotated[int, Meta(ge=0, le=10**9)] = 1000
    pool: NonNegInt = 0

    @property
    def call_limit(self) -> float | None:
        """``step_timeout`` as the seconds each world call may take: None for 0, no limit."""
        return self.step_timeout or None


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The agent acting in the world.

    Attributes:
        kind: "random" (uniform over admissible actions), "explorer" (memoryless heuristic) or
            "policy" (the ``[policy]`` language model, through the inference actor).
    """

    kind: Literal["random", "explorer", "policy"] = "random"


class RunConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The budget: how many (training) episodes, on how many concurrent env workers.

    Attributes:
        episodes: episodes to play; with ``method = "grpo"`` the training episodes (rounded
            down to whole updates of ``groups_per_update * group_size``).
        workers: concurrent env workers.
        method: "rollout" (play, no learning), "grpo" (learn with GRPO) or "empo2" (GRPO's
            loss with EMPO2's tip memory, rollout modes and novelty bonus: the ``[empo2]``
            section) or "complementary" (Complementary RL: an extractor model writes the
            bank, guided and free subgroups, credit; the ``[complementary]`` section); learning
            needs ``agent.kind = "policy"``. Any other learning method is named by the
            short name a plug-in package registers (``coevo.methods`` entry points) or by an
            import path ``package.module:Class`` (docs/METHODS.md); its options are the
            ``[method]`` table.
    """

    episodes: Annotated[int, Meta(ge=1, le=10_000_000)] = 100
    workers: Annotated[int, Meta(ge=1, le=256)] = 4
    method: Annotated[str, Meta(min_length=1, max_length=300)] = "rollout"


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The policy model and how it acts.

    Attributes:
        model: "embedded" (the built-in small model, built and cached on first use) or the path
            of a local Hugging Face model directory (its tokenizer and chat template).
        embedded: fields of ``agents.models.embedded.EmbeddedSpec`` to change (embedded model only).
        device: "cpu", "cuda", "cuda:N" or "auto" (cuda when available).
        threads: torch CPU threads (0: torch's default). One can beat two on a shared machine.
        learner_threads: 0 (the default): the learner trains in the run's process, with
            ``threads``. N: it trains in a process of its own with N torch threads, while
            inference keeps ``threads`` (torch's thread count is process-wide); worth it when
            rollouts wait on the learner and cores are free then (docs/BENCHMARKS.md). An
            update's digest depends on its thread count: each records it and re-execution
            runs with as many; with as many as ``threads``, its updates are bit for bit the
            in-process ones. A lost process (killed) restarts the learner as ``runtime``'s
            ``on_failure`` says, from the log. Needs a run directory (the checkpoints are
            shared on disk).
        learner_stall_timeout: with ``learner_threads``, seconds the learner's process may
            work on a call without a sign of life (it sends one every second) before it
            counts as lost, is killed and restarts the learner: a process stopped (SIGSTOP) or
            hung with its interpreter stuck.
        mode: "score" (sample among the admissible actions by their log-probs) or "generate"
            (free text; for instruction-tuned models).
        temperature: sampling temperature (0: greedy).
        max_new_tokens: longest generated response ("generate" mode).
        window: past turns shown in the prompt.
        list_actions: list the admissible actions in the prompt (always in "generate" mode).
        batch_max: most requests in one forward pass of the inference actor.
        batch_wait_ms: how long the inference actor waits to fill a batch.
        batches_in_flight: most batches the inference actor answers at once, each in its own
            thread: while one is in its forward pass the next gathers and starts (on another
            core, or overlapping the first's tokenizing and the engine's work). Each forward
            pass uses ``threads`` torch threads: give it ``batches_in_flight x threads`` cores.
            1: one at a time (also what a model whose rotary embedding changes in its forward
            pass, "dynamic" or "longrope", gets whatever is set).
        backend: what samples for the policy and the extractor (``agents.models.backend``):
            "hf", the ``transformers`` model in this process.
        lora: LoRA adapters (``{r, alpha, targets}``, ``agents.models.tuning.LoraSettings``):
            the learner trains the adapters only and checkpoints them; ``r = 0`` (the
            default): every parameter.
        dtype: the base weights' dtype in the sampler, the learner and the extractor:
            "float32" or "bfloat16" (needs ``lora``: the adapters stay float32).
        gradient_checkpointing: recompute activations in the backward pass (less memory,
            about a third more compute) in the learner and the extractor.
    """

    model: Annotated[str, Meta(min_length=1, max_length=4096)] = "embedded"
    embedded: dict[str, Any] = msgspec.field(default_factory=dict[str, Any])
    device: Annotated[str, Meta(pattern=r"^(cpu|cuda|cuda:[0-9]+|auto)$")] = "cpu"
    threads: Annotated[int, Meta(ge=0, le=256)] = 1
    learner_threads: Annotated[int, Meta(ge=0, le=256)] = 0
    learner_stall_timeout: Annotated[float, Meta(ge=5, le=86_400)] = 120.0
    mode: Literal["score", "generate"] = "score"
    temperature: Annotated[float, Meta(ge=0, le=10)] = 1.0
    max_new_tokens: Annotated[int, Meta(ge=1, le=4096)] = 24
    window: Annotated[int, Meta(ge=0, le=100)] = 4
    list_actions: bool = False
    batch_max: Annotated[int, Meta(ge=1, le=4096)] = 16
    batch_wait_ms: Annotated[float, Meta(ge=0, le=10_000)] = 2.0
    batches_in_flight: Annotated[int, Meta(ge=1, le=64)] = 2
    backend: Annotated[str, Meta(min_length=1, max_length=100)] = "hf"
    lora: LoraSettings = msgspec.field(default_factory=LoraSettings)
    dtype: Literal["float32", "bfloat16"] = "float32"
    gradient_checkpointing: bool = False


class PromptConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a turn's prompt says besides the episode (``agents.models.prompts.turn_messages``).

    Attributes:
        system: the system message's text.
        memory: the message the memory's entries (EMPO2's tips, Complementary RL's entry) are
            appended to, each on its own ``<tip> ... </tip>`` line: "user" (after the
            observation) or "system" (after the system text). Distillation removes them from
            the same message.
        reflect: the system text of the prompt asking for a reflection (EMPO2's tips).
        extract: the system text of the prompt asking Complementary RL's extractor for
            operations after an episode; ``{max_ops}`` in it becomes ``[complementary] max_ops``.
        merge: the system text of the prompt asking the extractor to tidy a chunk of entries.

    The embedded model learns the default texts in pre-training; other texts are for a real
    model (or to study what the words change).
    """

    system: Annotated[str, Meta(min_length=1, max_length=10_000)] = TURN_SYSTEM
    memory: Literal["user", "system"] = "user"
    reflect: Annotated[str, Meta(min_length=1, max_length=10_000)] = REFLECT_SYSTEM
    extract: Annotated[str, Meta(min_length=1, max_length=10_000)] = EXTRACT_SYSTEM
    merge: Annotated[str, Meta(min_length=1, max_length=10_000)] = MERGE_SYSTEM


class RayPlacementConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where one kind of actor runs on Ray and what each of them reserves
    (``engine.ray_backend.Placement``).

    Attributes:
        num_cpus: CPUs each reserves (fractions allowed: 0.25 packs four on a CPU).
        num_gpus: GPUs each reserves.
        resources: custom resources each reserves, e.g. ``{env = 1}`` to keep them on the
            nodes started with ``ray start --resources='{"env": 8}'``.
        in_flight: deliveries on their way to one remote actor before the driver waits.
        start_timeout: seconds a remote actor may take to be placed and started before it
            counts as lost.
        per_process: actors one Ray worker process hosts (each with its own thread and event
            loop; the process reserves their resources together). A lost process takes them
            all, and each restarts (docs/DEPLOY.md).
        stall_timeout: seconds a remote actor's process may leave the driver's poll
            unanswered (stopped, hung, or its event loop blocked) before it counts as lost and
            its actors restart (0: wait for good).
    """

    num_cpus: Annotated[float, Meta(ge=0, le=1024)] = 1.0
    num_gpus: Annotated[float, Meta(ge=0, le=64)] = 0.0
    resources: dict[Name, Annotated[float, Meta(ge=0)]] = msgspec.field(
        default_factory=dict[str, float]
    )
    in_flight: Annotated[int, Meta(ge=1, le=1024)] = 2
    start_timeout: Annotated[float, Meta(gt=0, le=86_400)] = 120.0
    per_process: Annotated[int, Meta(ge=1, le=1024)] = 1
    stall_timeout: Annotated[float, Meta(ge=0, le=86_400)] = 300.0

    def __post_init__(self) -> None:
        # Ray's own resources have keywords of their own: in `resources` Ray refuses them
        # as each actor starts (a run failed after its restarts), so they are refused here
        own = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": None, "object_store_memory": None}
        for name in sorted(set(self.resources) & set(own)):
            instead = f"set {own[name]} instead" if own[name] else "Ray sets it itself"
            raise ValueError(f"resources: {name!r} is one of Ray's own resources ({instead})")


class RaySection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The Ray cluster a run with ``backend = "ray"`` places actors on (docs/DEPLOY.md).

    Attributes:
        address: "local" (a Ray instance started in the driver's process for the run), "auto"
            (the cluster ``ray start`` made on this machine) or a cluster's ``HOST:PORT``.
        num_cpus: CPUs a "local" instance offers (0: the machine's).
        env_workers: the env workers' placement.
        inference: the policy's inference actor's placement (e.g. ``num_gpus = 1``); absent:
            it runs in the driver. It builds its model in its Ray process from the scenario's
            settings and reads new policy versions from the run directory's checkpoints.
        learner: the learner's placement; absent: it runs in the driver. It writes its
            checkpoints to the run directory (a cluster needs it on storage every node
            reads, docs/DEPLOY.md) and, its process lost, restarts from the newest one the
            log names.
        extractor: Complementary RL's extractor's placement (e.g. ``num_gpus = 1``); absent:
            it runs in the driver. Like the learner it writes its checkpoints to the run
            directory and, its process lost, restarts from the newest one the log names.
        memory: the memory actor's placement (EMPO2's tips, Complementary RL's bank, with its
            embedder); absent: it runs in the driver. Its process lost, it rebuilds its bank
            from the log. The other actors (scheduler or trainer, credit) run in the driver;
            placing an actor the run's method does not have is refused.
    """

    address: Annotated[str, Meta(min_length=1, max_length=300)] = "local"
    num_cpus: Annotated[int, Meta(ge=0, le=100_000)] = 0
    env_workers: RayPlacementConfig = msgspec.field(default_factory=RayPlacementConfig)
    inference: RayPlacementConfig | None = None
    learner: RayPlacementConfig | None = None
    extractor: RayPlacementConfig | None = None
    memory: RayPlacementConfig | None = None


class RuntimeSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Engine knobs (see ``engine.runtime.RuntimeConfig``) and supervision.

    Attributes:
        durable: fsync every commit (a crash of the machine loses nothing committed).
        batch_max: most events per commit.
        batch_wait_ms: how long the writer lingers to fill a batch.
        write_buffer: queued events before a source actor waits.
        write_buffer_mb: the same in MiB of events encoded, and the most per commit (an
            env worker whose world answers megabytes a turn waits for the disk here).
        mailbox: queued batches per actor before delivery waits.
        checksum_every: events between projection checksums (0: only at the end), at least.
        snapshot_every: events between projection snapshots (0: never), at least.
        checksum_budget: bytes of projection state a checksum digests per event since the one
            before, at most: once the states outgrow ``checksum_budget * checksum_every``
            bytes (an episode table of a long run), checksums come further apart, so that
            their cost per event stays bounded (0: no bound).
        snapshot_budget: the same for the bytes a snapshot stores (0: no bound).
        on_failure: what supervision does when an env worker raises, or the process of a
            learner (``policy.learner_threads``) or of an actor on Ray is lost: "restart"
            (a learner, extractor or memory rebuilt from the log) or "stop". Other
            actors' errors stop the run.
        max_restarts: restarts per actor before the run stops.
        backend: "local" (every actor a trio task of this process) or "ray" (the env workers
            on a Ray cluster, ``[runtime.ray]``; the log and its writer stay here).
        ray: the Ray cluster and placements (used with ``backend = "ray"``).
    """

    durable: bool = True
    batch_max: Annotated[int, Meta(ge=1, le=100_000)] = 4096
    batch_wait_ms: Annotated[float, Meta(ge=0, le=10_000)] = 0.0
    write_buffer: Annotated[int, Meta(ge=1, le=10_000_000)] = 8192
    write_buffer_mb: Annotated[float, Meta(ge=0.001, le=1_048_576)] = 64.0
    mailbox: Annotated[int, Meta(ge=1, le=100_000)] = 64
    checksum_every: NonNegInt = 1000
    snapshot_every: NonNegInt = 20_000
    checksum_budget: NonNegInt = 256
    snapshot_budget: NonNegInt = 32
    on_failure: Literal["restart", "stop"] = "restart"
    max_restarts: Annotated[int, Meta(ge=0, le=1000)] = 3
    backend: Literal["local", "ray"] = "local"
    ray: RaySection = msgspec.field(default_factory=RaySection)


class LoggingConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Console verbosity (the JSON log file in the run directory always gets everything)."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    progress: bool = True


class TrackingConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Live experiment tracking (docs/TRACKING.md): a tracker actor writes the run's scalars as
    it goes, the same ones ``coevo export`` writes from the finished log.

    Attributes:
        sinks: where: "tensorboard" (event files in ``RUN/tracking/tensorboard``), "wandb" (an
            offline Weights & Biases run in ``RUN/tracking/wandb``), "mlflow" (an MLflow file
            store ``RUN/tracking/mlruns``); each needs its extra. Empty: no tracker.
        block: training episodes per point of the per-block series (success, return, bank,
            retrievals, credit, throughput).
    """

    sinks: list[Literal["tensorboard", "wandb", "mlflow"]] = msgspec.field(
        default_factory=list[Literal["tensorboard", "wandb", "mlflow"]]
    )
    block: Annotated[int, Meta(ge=1, le=1_000_000)] = 16


class Scenario(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A whole scenario file."""

    name: Name
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0
    description: Annotated[str, Meta(max_length=10_000)] = ""
    world: WorldConfig = msgspec.field(default_factory=WorldConfig)
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    run: RunConfig = msgspec.field(default_factory=RunConfig)
    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    prompt: PromptConfig = msgspec.field(default_factory=PromptConfig)
    grpo: GrpoConfig = msgspec.field(default_factory=GrpoConfig)
    eval: EvalConfig = msgspec.field(default_factory=EvalConfig)
    empo2: Empo2Config = msgspec.field(default_factory=Empo2Config)
    complementary: ComplementaryConfig = msgspec.field(default_factory=ComplementaryConfig)
    method: dict[str, Any] = msgspec.field(default_factory=dict[str, Any])
    runtime: RuntimeSection = msgspec.field(default_factory=RuntimeSection)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    tracking: TrackingConfig = msgspec.field(default_factory=TrackingConfig)


def table_defaults(
    world: str | None = None, method: str | None = None
) -> dict[str, dict[str, Any]]:
    """The defaults of the tables a scenario fills only with what it changes (dotted table ->
    key -> value, as TOML gives them): ``policy.embedded`` (:class:`EmbeddedSpec`) and
    ``complementary.ops`` (:class:`OpsSpec`), less the fields the rest of the scenario sets
    (the world, the window, ``max_ops``, ``max_new_tokens``). The resolved scenario a run
    records leaves these tables as written, so comparing two runs needs them filled in.

    Given ``world``, also ``world.options``: the defaults of that world's constructor; given
    ``method``, ``method``: a plug-in method's ``Settings`` defaults (both only where they can
    be imported here; two runs of different worlds or methods have no common defaults)."""
    from agents.methods.registry import option_defaults as method_defaults
    from agents.models.specs import EmbeddedSpec, OpsSpec
    from engine.world_registry import option_defaults as world_defaults

    def defaults(spec: msgspec.Struct, derived: set[str]) -> dict[str, Any]:
        fields: dict[str, Any] = msgspec.to_builtins(spec)
        return {k: v for k, v in fields.items() if k not in derived}

    tables = {
        "policy.embedded": defaults(EmbeddedSpec(), {"world", "world_options", "window"}),
        "complementary.ops": defaults(OpsSpec(), {"max_ops", "max_new_tokens"}),
    }
    if world is not None:
        tables["world.options"] = world_defaults(world)
    if method is not None:
        tables["method"] = method_defaults(method)
    return tables
