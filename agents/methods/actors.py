"""The built-in methods' actors, as their :meth:`~agents.methods.base.Method.actors` hooks build
them: EMPO2's tip memory; Complementary RL's experience bank, extractor and credit actors.

Only specs are built here (and settings checked); models and embedders load in the actors when
the run starts. Imported by the hooks when called, so choosing a method imports no torch; the
extractor's module (torch) is imported by its actor's factory, so building the specs (``coevo
validate``) imports none either.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from agents.learning.credit_actor import CreditActor, credit_settings
from agents.memory.bank import MemorySettings
from agents.memory.extraction import MERGE_SYSTEM
from agents.memory.memory_actor import MemoryActor
from agents.methods.base import LoadedModel, RunResources
from agents.methods.settings import ComplementaryConfig, Empo2Config
from agents.models.embedder import (
    BoundedEmbedder,
    Embedder,
    EmbedderName,
    make_embedder,
    minilm_dir,
)
from engine.actor import Actor, ActorSpec

if TYPE_CHECKING:
    from agents.memory.extractor import ExtractorModel
    from stores.checkpoints import Checkpoints

MEMORY = "memory"
EXTRACTOR = "extractor"
CREDIT = "credit"


def embedder_for(name: EmbedderName, query_chars: int) -> Callable[[], Embedder]:
    """What builds a memory's embedder in its actor, every text cut to ``query_chars``
    characters first (:func:`agents.models.embedder.bound_text`; 0: not cut); a missing MiniLM
    package is reported now, as a one-line error before the run starts, not as an actor
    failure.

    Raises:
        ModelUnavailable: ``name`` is a MiniLM and its package is missing or incomplete.
    """
    if name.startswith("minilm"):
        minilm_dir()
    return partial(_bounded, name, query_chars)


def _bounded(name: EmbedderName, query_chars: int) -> Embedder:
    return BoundedEmbedder(make_embedder(name), query_chars)


def empo2_actors(e: Empo2Config) -> list[ActorSpec]:
    """EMPO2's memory actor with its embedder and bank rules."""
    settings = MemorySettings(
        capacity=e.capacity, threshold=e.threshold, top_k=e.top_k, index=e.index
    )
    memory = partial(MemoryActor, embedder_for(e.embedder, e.query_chars), settings)
    return [ActorSpec(name=MEMORY, factory=memory)]


def bank_settings(c: ComplementaryConfig) -> MemorySettings:
    """Complementary RL's bank rules."""
    return MemorySettings(
        capacity=c.capacity, index=c.index, lam=c.lam, recent=c.recent, pool=c.pool
    )


def complementary_actors(c: ComplementaryConfig, run: RunResources) -> list[ActorSpec]:
    """Complementary RL's memory (the bank), extractor and credit actors."""
    memory = partial(
        MemoryActor,
        embedder_for(c.embedder, c.query_chars),
        bank_settings(c),
        merge_chunk=c.merge_chunk,
        merge_max=c.merge_max,
        merge_system=run.prompts.get("merge", MERGE_SYSTEM),
    )
    run.base_model(EXTRACTOR)  # prepared for the run (an unknown role fails now)
    load = partial(_load_extractor, c, run.load_model)
    extractor = partial(_extractor, load, run.checkpoints(EXTRACTOR), run.batch_max, run.batch_wait)
    return [
        ActorSpec(name=MEMORY, factory=memory),
        ActorSpec(name=EXTRACTOR, factory=extractor),
        ActorSpec(name=CREDIT, factory=partial(CreditActor, credit_settings(c))),
    ]


def _extractor(
    load: Callable[[], ExtractorModel],
    checkpoints: Checkpoints,
    batch_max: int,
    batch_wait: float,
) -> Actor:
    from agents.memory.extractor import ExtractorActor

    return ExtractorActor(load, checkpoints, batch_max=batch_max, batch_wait=batch_wait)


def _load_extractor(
    c: ComplementaryConfig, load_model: Callable[[str], LoadedModel]
) -> ExtractorModel:
    return load_extractor(c, load_model(EXTRACTOR))


def load_extractor(c: ComplementaryConfig, base: LoadedModel) -> ExtractorModel:
    """The extractor over its base model, loaded as the scenario says (blocking)."""
    from agents.memory.extractor import ExtractorModel, ExtractorSettings

    settings = ExtractorSettings(
        temperature=c.temperature,
        max_new_tokens=c.max_new_tokens,
        max_ops=c.max_ops,
        plain_add=c.plain_add,
        device=base.device,
    )
    return ExtractorModel(base.net, base.tokenizer, settings, backend=base.backend)
