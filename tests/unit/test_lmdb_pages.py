"""The page check in bulk (``stores.lmdb_pages``, a tree of many leaf pages: every node of
every leaf checked at once with numpy) decides as the node by node check does: on an intact
file both pass, and on a file with damaged bytes both refuse it with the same message or both
pass it."""

from __future__ import annotations

import random
from pathlib import Path

import lmdb
import pytest

from stores import lmdb_pages
from stores.lmdb_env import DATA_FILE


@pytest.fixture(scope="module")
def many_leaves(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, lmdb_pages.Meta]:
    """An LMDB file with two named databases of small facts over hundreds of leaf pages (an
    audit index's shape), its bytes and its newest meta page."""
    root = tmp_path_factory.mktemp("index")
    env = lmdb.open(str(root), max_dbs=2, map_size=1 << 26)
    facts, meta = env.open_db(b"facts"), env.open_db(b"meta")
    rng = random.Random(0)
    with env.begin(write=True) as txn:
        for i in range(40_000):
            key = rng.randbytes(rng.randrange(4, 24)) + i.to_bytes(4, "big")
            txn.put(key, rng.randbytes(rng.randrange(0, 60)), db=facts)
        txn.put(b"upto", (5).to_bytes(8, "big"), db=meta)
        txn.put(b"big", b"x" * 20_000, db=meta)  # one value on overflow pages
    env.close()
    data = (Path(root) / DATA_FILE).read_bytes()
    newest = max(
        (m for m in lmdb_pages.read_metas(Path(root) / DATA_FILE) if m), key=lambda m: m.txnid
    )
    return data, newest


def outcome(data: bytes, meta: lmdb_pages.Meta, bulk: bool, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(lmdb_pages, "_MANY_LEAVES", 1 if bulk else 10**9)
    try:
        lmdb_pages.check_tree(data, meta)
    except lmdb_pages.PageDamaged as exc:
        return str(exc)
    return "intact"


def test_an_intact_file_passes_both_ways(many_leaves, monkeypatch: pytest.MonkeyPatch) -> None:
    data, meta = many_leaves
    assert meta.last_pgno > 600  # hundreds of leaves: the bulk check has work
    assert outcome(data, meta, True, monkeypatch) == "intact"
    assert outcome(data, meta, False, monkeypatch) == "intact"


@pytest.mark.parametrize("seed", range(60))
def test_damaged_bytes_get_the_same_answer_both_ways(
    many_leaves, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    data, meta = many_leaves
    rng = random.Random(seed)
    damaged = bytearray(data)
    psize = meta.psize
    for _ in range(rng.choice((1, 3, 20))):
        page = rng.randrange(2, meta.last_pgno + 1)
        # the header's bounds and the node pointers are where a page check can fail
        at = page * psize + rng.choice((rng.randrange(12, 40), rng.randrange(psize)))
        damaged[at] ^= 1 << rng.randrange(8)
    one_by_one = outcome(bytes(damaged), meta, False, monkeypatch)
    assert outcome(bytes(damaged), meta, True, monkeypatch) == one_by_one
