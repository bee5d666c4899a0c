"""minilab's variants: the fixed facts of each ``(family, variant)``, generated and cached.

Every fact of a variant (where things are, which device heats what, which wire lights which
bulb) derives only from ``(family, variant)`` through a ``random.Random`` seeded with a stable
hash (:func:`stable_seed`), so it is the same in every process. Most facts follow a rule that
holds in most variants (:data:`RULE_PROB`: "metal things heat on the stove"); placements are per
variant. Train and held-out variants come from disjoint parts of the layout space
(:func:`in_heldout_space`). The episodes played over a layout are in
:mod:`scenarios.worlds.minilab`.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

FAMILIES: tuple[str, ...] = ("fetch", "heat", "unlock", "circuit", "paint")
HELDOUT_BASE = 1_000_000
"""Held-out variant ids start here, so they never meet train ids whatever the options."""
HELDOUT_SHARE = 5
"""One layout in this many is reserved for held-out variants."""
RULE_PROB = 0.75
"""Probability that a variant follows its family's cross-variant rule."""
CONTAINERS = ("bin", "box", "cabinet", "chest", "crate", "cupboard", "drawer", "sack")
ITEMS = ("apple", "ball", "book", "cloth", "coin", "feather", "shell", "stone")
HOMES = ("cupboard", "crate", "cabinet", "sack", "box", "drawer", "chest", "bin")
HOME = dict(zip(ITEMS, HOMES, strict=True))  # the fetch rule: where each item is usually kept
DESTS = ("basket", "bucket", "tub")
MATERIALS = ("clay", "glass", "metal")
OBJECTS = {
    "clay": ("clay jug", "clay mug", "clay pot", "clay vase"),
    "glass": ("glass bottle", "glass cup", "glass flask", "glass jar"),
    "metal": ("metal can", "metal pan", "metal pot", "metal spoon"),
}
DEVICES = ("oven", "burner", "stove")  # the heat rule: clay oven, glass burner, metal stove
PREP = {"oven": "in", "burner": "on", "stove": "on"}
KEYS = ("brass key", "iron key", "silver key")  # the unlock rule: the brass key opens the safe
WIRES = ("copper wire", "iron wire", "tin wire", "zinc wire")
BULBS = ("red bulb", "green bulb", "blue bulb", "yellow bulb")  # the circuit rule: WIRES[i] -> i
PAINTS = ("black paint", "blue paint", "red paint", "white paint", "yellow paint")
MIXES = {  # the paint rule, true in every variant
    "gray": ("black paint", "white paint"),
    "green": ("blue paint", "yellow paint"),
    "orange": ("red paint", "yellow paint"),
    "pink": ("red paint", "white paint"),
    "purple": ("blue paint", "red paint"),
}


@dataclass(frozen=True, eq=False, slots=True)
class Layout:
    """The fixed facts of one variant, built once and cached.

    Attributes:
        family: the task family.
        goal: the goal text; it names the task, never the hidden facts.
        containers: openable containers, all closed at the start, sorted.
        locked: containers that are locked at the start.
        start: ``(item, place)`` at the start, sorted; a place is a container or "table".
        receptacles: ``(name, verb, prep)`` of the fixtures things are put into, sorted.
        fixtures: every fixture as named in the room, sorted.
        facts: the hidden facts the family's rules read.
    """

    family: str
    goal: str
    containers: tuple[str, ...]
    locked: tuple[str, ...]
    start: tuple[tuple[str, str], ...]
    receptacles: tuple[tuple[str, str, str], ...]
    fixtures: tuple[str, ...]
    facts: Mapping[str, str]


def stable_seed(family: str, variant: int) -> int:
    """The seed of a variant's facts: a stable hash, the same in every process.

    Args:
        family: the task family.
        variant: the variant id.

    Returns:
        A 64-bit int.
    """
    text = f"minilab/{family}/{variant}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def _permutation(rng: random.Random, canonical: tuple[str, ...]) -> tuple[str, ...]:
    """``canonical`` with probability RULE_PROB, otherwise another permutation of it."""
    if rng.random() < RULE_PROB:
        return canonical
    return rng.choice([p for p in itertools.permutations(canonical) if p != canonical])


def _layout(
    family: str,
    goal: str,
    containers: Sequence[str],
    start: Sequence[tuple[str, str]],
    facts: dict[str, str],
    receptacles: Sequence[tuple[str, str, str]] = (),
    extra_fixtures: Sequence[str] = (),
    locked: Sequence[str] = (),
) -> Layout:
    return Layout(
        family=family,
        goal=goal,
        containers=tuple(sorted(containers)),
        locked=tuple(locked),
        start=tuple(sorted(start)),
        receptacles=tuple(sorted(receptacles)),
        fixtures=tuple(sorted([r[0] for r in receptacles] + list(extra_fixtures))),
        facts=facts,
    )


def _gen_fetch(rng: random.Random) -> Layout:
    item = rng.choice(ITEMS)
    containers = rng.sample(CONTAINERS, 4)
    home = HOME[item]
    if rng.random() < RULE_PROB:
        if home not in containers:
            containers[rng.randrange(4)] = home
        where = home
    else:
        where = rng.choice([c for c in containers if c != home])
    junk = rng.sample([i for i in ITEMS if i != item], 2)
    others = [c for c in containers if c != where]
    start = [(item, where), (junk[0], rng.choice(others)), (junk[1], "table")]
    dest = rng.choice(DESTS)
    goal = f"find the {item} and put it in the {dest}."
    facts = {"item": item, "take_earns": item}
    return _layout("fetch", goal, containers, start, facts, [(dest, "put", "in")])


def _gen_heat(rng: random.Random) -> Layout:
    devices = _permutation(rng, DEVICES)
    objects = [rng.choice(OBJECTS[m]) for m in MATERIALS]
    target = rng.choice(objects)
    facts = dict(zip(objects, devices, strict=True))
    facts.update(target=target, take_earns=target)
    receptacles = [(d, "put", PREP[d]) for d in DEVICES]
    start = [(o, "table") for o in [*objects, rng.choice(ITEMS)]]
    return _layout("heat", f"heat the {target}.", [], start, facts, receptacles)


def _gen_unlock(rng: random.Random) -> Layout:
    key = KEYS[0] if rng.random() < RULE_PROB else rng.choice(KEYS[1:])
    containers = rng.sample(CONTAINERS, 4)
    start = [*zip(KEYS, containers[:3], strict=True), (rng.choice(ITEMS), containers[3])]
    start.append(("gem", "safe"))
    facts = {"key": key, "take_wins": "gem"}
    goal = "unlock the safe and take the gem."
    return _layout("unlock", goal, [*containers, "safe"], start, facts, locked=["safe"])


def _gen_circuit(rng: random.Random) -> Layout:
    bulbs = _permutation(rng, BULBS)
    containers = rng.sample(CONTAINERS, 6)
    things = ["battery", *WIRES, *rng.sample(ITEMS, 2)]
    start = [(thing, rng.choice(containers)) for thing in things]
    target = rng.choice(BULBS)
    facts: dict[str, str] = dict(zip(WIRES, bulbs, strict=True))
    facts.update(bulb=target, take_earns="battery")
    goal = f"light the {target}."
    return _layout("circuit", goal, containers, start, facts, [("socket", "put", "in")], BULBS)


def _gen_paint(rng: random.Random) -> Layout:
    containers = rng.sample(CONTAINERS, len(PAINTS))
    paints = list(PAINTS)
    rng.shuffle(paints)
    color = rng.choice(sorted(MIXES))
    first, second = MIXES[color]
    facts = {"color": color, "first": first, "second": second}
    goal = f"make {color} paint in the bowl."
    start = [*zip(paints, containers, strict=True), ("stick", rng.choice(containers))]
    return _layout("paint", goal, containers, start, facts, [("bowl", "pour", "into")])


_GENERATORS: dict[str, Callable[[random.Random], Layout]] = {
    "fetch": _gen_fetch,
    "heat": _gen_heat,
    "unlock": _gen_unlock,
    "circuit": _gen_circuit,
    "paint": _gen_paint,
}


def in_heldout_space(layout: Layout) -> bool:
    """Whether ``layout`` is one of those reserved for held-out variants (a stable fifth)."""
    facts = sorted(layout.facts.items())
    text = repr((layout.family, layout.goal, layout.containers, layout.start, facts)).encode()
    return hashlib.blake2b(text, digest_size=8).digest()[0] % HELDOUT_SHARE == 0


@lru_cache(maxsize=1 << 16)
def layout_of(family: str, variant: int) -> Layout:
    """The facts of ``(family, variant)``, generated on first use and cached.

    Train and held-out variants draw from disjoint parts of the layout space (see
    :func:`in_heldout_space`), so no held-out variant repeats a train variant.

    Args:
        family: one of :data:`FAMILIES`.
        variant: the variant id; ids from :data:`HELDOUT_BASE` on are held-out variants.

    Returns:
        The variant's :class:`Layout`.
    """
    rng = random.Random(stable_seed(family, variant))
    heldout = variant >= HELDOUT_BASE
    while True:
        layout = _GENERATORS[family](rng)
        if in_heldout_space(layout) == heldout:
            return layout
