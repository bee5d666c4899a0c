"""Damaged run directories: truncated and overwritten log files, flipped bytes, a newer schema,
directories that are not runs. ``coevo replay``, ``coevo replay --verify`` and ``coevo log``
each print one line naming the problem and where (the log, the seq) and exit non-zero; none
crashes (LMDB maps the file: a page past a truncated end is SIGBUS), and no event of a damaged
record is ever printed or folded.

The commands run in a child process (``scenarios.cli.main`` in a loop), so that a crash is a
failure of the case that caused it, not of the test session. The ``faults`` marker runs the
exhaustive sweep (every page of the file overwritten, every record flipped).
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import fault_counts
import lmdb
import msgspec
import pytest

from engine.events import Codec, Envelope
from engine.lifecycle import RunStopped
from stores.lmdb_log import LmdbEventLog

ROOT = Path(__file__).resolve().parents[2]
COEVO = str(Path(sys.executable).parent / "coevo")
COMMANDS = (["replay", "--verify"], ["replay"], ["log", "--json"])
PAGE = 4096

CHILD = """
import contextlib, io, json, sys
from scenarios.cli import main
for line in sys.stdin:
    name, argv = json.loads(line)
    out, err = io.StringIO(), io.StringIO()
    print(json.dumps({"name": name, "argv": argv, "started": True}), flush=True)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    print(json.dumps({"name": name, "argv": argv, "code": code, "out": out.getvalue(),
                      "err": err.getvalue()}), flush=True)
"""


@dataclass(frozen=True)
class Result:
    name: str
    argv: list[str]
    code: int
    out: str
    err: str

    def seqs(self) -> list[int]:
        """The seqs ``coevo log --json`` printed."""
        return [json.loads(line)["seq"] for line in self.out.splitlines()]


def run_cases(cases: list[tuple[str, list[str]]]) -> list[Result]:
    """Run ``coevo`` command lines in one child process; a crash fails the case it was in."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD],
        input="".join(json.dumps(case) + "\n" for case in cases),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    done = [r for r in records if "code" in r]
    if proc.returncode != 0:
        last = records[-1] if records else None
        pytest.fail(
            f"the child died (exit {proc.returncode}) in case {last}: {proc.stderr[-2000:]}"
        )
    assert len(done) == len(cases)
    return [Result(r["name"], r["argv"], r["code"], r["out"], r["err"]) for r in done]


def assert_one_line(result: Result, *fragments: str) -> None:
    lines = result.err.splitlines()
    assert result.code != 0, result
    assert len(lines) == 1 and lines[0].startswith("coevo: error: "), result
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, result)


def assert_no_damaged_event_printed(result: Result) -> None:
    """``coevo log`` printed a prefix of the log: 0, 1, ..., k-1, and the error is at k or
    later (never an event of the damaged record)."""
    seqs = result.seqs()
    assert seqs == list(range(len(seqs))), result.name
    if result.code != 0 and "at seq " in result.err:
        bad = int(result.err.split("at seq ")[1].split(":")[0])
        assert len(seqs) <= bad, result


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "explore"
    scenario = str(ROOT / "scenarios" / "explore.toml")
    proc = subprocess.run(
        [COEVO, "run", scenario, "--out", str(out), "--quiet", "--set", "run.episodes=40"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def deep_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose events database has branch pages (commits of at most 4 events: about 160
    records on some 70 leaf pages under a branch page), as a long run's has."""
    out = tmp_path_factory.mktemp("runs") / "deep"
    scenario = str(ROOT / "scenarios" / "explore.toml")
    args = ["--set", "run.episodes=40", "--set", "runtime.batch_max=4"]
    proc = subprocess.run(
        [COEVO, "run", scenario, "--out", str(out), "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    with lmdb.open(str(out / "log"), max_dbs=3, readonly=True, lock=False) as env:
        db = env.open_db(b"events", create=False)
        with env.begin() as txn:
            assert txn.stat(db)["depth"] >= 2
    return out


def events_in_file(run_dir: Path) -> list[tuple[int, list[int], int]]:
    """``(first seq, offsets, length)`` of each events record's value in data.mdb: every place
    its bytes occur (copy-on-write leaves old copies in free pages; damage goes to all)."""
    data = (run_dir / "log" / "data.mdb").read_bytes()
    out = []
    with lmdb.open(str(run_dir / "log"), max_dbs=3, readonly=True, lock=False) as env:
        db = env.open_db(b"events", create=False)
        with env.begin(db=db) as txn:
            for key, value in txn.cursor():
                offsets, at = [], data.find(value)
                while at >= 0:
                    offsets.append(at)
                    at = data.find(value, at + 1)
                assert offsets
                out.append((int.from_bytes(key, "big"), offsets, len(value)))
    return out


Damage = Callable[[Path], None]


def copy_with(run_dir: Path, dest: Path, damage: Damage) -> Path:
    shutil.copytree(run_dir, dest)
    damage(dest / "log" / "data.mdb")
    return dest


def truncate_to(size: int) -> Damage:
    def damage(file: Path) -> None:
        os.truncate(file, size)

    return damage


def overwrite_page(page: int, fill: bytes) -> Damage:
    def damage(file: Path) -> None:
        with file.open("r+b") as fh:
            fh.seek(page * PAGE)
            fh.write(fill)

    return damage


def zero_newest_txnid(file: Path) -> None:
    """Zero the transaction id of the newer meta page (its magic and roots intact)."""
    from stores.lmdb_pages import read_metas

    newest = max((m for m in read_metas(file) if m), key=lambda m: m.txnid)
    with file.open("r+b") as fh:
        fh.seek(newest.page * newest.psize + 144)
        fh.write(bytes(8))


def flip_bits(offsets: list[int], bit: int = 3) -> Damage:
    def damage(file: Path) -> None:
        with file.open("r+b") as fh:
            for offset in offsets:
                fh.seek(offset)
                byte = fh.read(1)[0]
                fh.seek(offset)
                fh.write(bytes([byte ^ (1 << bit)]))

    return damage


@functools.cache
def intact_outputs(run_dir: Path) -> dict[tuple[str, ...], Result]:
    """What each command prints on the undamaged ``run_dir``, by its arguments."""
    results = run_cases([("intact", [*c, str(run_dir)]) for c in COMMANDS])
    return {tuple(r.argv[:-1]): r for r in results}


def check_damaged(results: list[Result], expect: dict[str, str], intact: Path) -> None:
    """Every command on a damaged copy of ``intact``: one line naming the log, or exit 0 with
    exactly what the same command prints on the intact run (the damage hit unused pages);
    ``coevo log`` never shows an event past the damage."""
    clean = intact_outputs(intact)
    for result in results:
        if result.code != 0 or result.name in expect:
            assert_one_line(result, "/log", *[f for f in [expect.get(result.name)] if f])
        else:
            same = clean[tuple(result.argv[:-1])]
            assert same.code == 0
            out = result.out.replace(result.argv[-1], str(intact))
            assert (out, result.err) == (same.out, same.err), result.name
        if result.argv[0] == "log":
            assert_no_damaged_event_printed(result)


def test_the_intact_run_reads(run_dir: Path) -> None:
    results = run_cases([("intact", [*c, str(run_dir)]) for c in COMMANDS])
    assert [r.code for r in results] == [0, 0, 0]
    assert results[0].out.startswith("verified ")


TORN_LIKE = ("was truncated", "must be consecutive", "checksum")


def test_truncated_overwritten_and_flipped_logs_are_one_line(run_dir: Path, tmp_path: Path) -> None:
    size = (run_dir / "log" / "data.mdb").stat().st_size
    records = events_in_file(run_dir)
    damages: dict[str, tuple[Damage, str]] = {
        "empty file": (truncate_to(0), "holds no commit (0 bytes)"),
        "one page": (truncate_to(PAGE), "cannot open event log"),
        "meta pages only": (truncate_to(2 * PAGE), "was truncated"),
        "half": (truncate_to(size // 2), "was truncated"),
        "last page lost": (truncate_to(size - PAGE), "was truncated"),
        "odd size": (truncate_to(size - 123), "was truncated"),
        "both meta pages zeroed": (overwrite_page(0, bytes(2 * PAGE)), "cannot open event log"),
        "garbage meta page": (overwrite_page(1, random.Random(1).randbytes(PAGE)), ""),
        "newest meta page's id zeroed": (zero_newest_txnid, "must be consecutive"),
    }
    for seq, offsets, length in records[1::7]:  # a flipped bit inside a record's value
        flip = flip_bits([at + length // 2 for at in offsets])
        damages[f"record {seq}"] = (flip, f"at seq {seq}: checksum")
    for page in (2, 3, size // PAGE // 2, size // PAGE - 1):
        damages[f"zeroed page {page}"] = (overwrite_page(page, bytes(PAGE)), "")
        damages[f"garbage page {page}"] = (
            overwrite_page(page, random.Random(page).randbytes(PAGE)),
            "",
        )
    cases, expect = [], {}
    for name, (damage, fragment) in damages.items():
        path = copy_with(run_dir, tmp_path / name.replace(" ", "-"), damage)
        for command in COMMANDS:
            cases.append((f"{name}: {command[0]}", [*command, str(path)]))
            if fragment:
                expect[cases[-1][0]] = fragment
    results = run_cases(cases)
    check_damaged(results, expect, run_dir)
    emptied = [r.code for r in results if r.name.startswith("empty file")]
    assert emptied == [1] * len(COMMANDS)  # damaged, as it says: exit 1 (it was 2, bad input)
    flipped = [r for r in results if r.name.startswith("record ")]
    assert flipped and all(r.code != 0 for r in flipped)
    # a torn `cp -r` of a live run reads as truncated or damaged: each such error says how to
    # copy a live run instead (it said nothing about copies)
    torn = [r for r in results if any(f in expect.get(r.name, "") for f in TORN_LIKE)]
    assert len(torn) >= 5 * len(COMMANDS)
    for result in torn:
        assert "copy a live run with `coevo copy RUN DEST`" in result.err, result


def test_damaged_pages_under_a_branch_page_are_one_line_not_an_abort(
    deep_run: Path, tmp_path: Path
) -> None:
    """LMDB asserts (``Assertion 'IS_LEAF(mp)' failed``: SIGABRT, the child dies) when a
    branch page points at a zeroed or overwritten page; coevo checks the pages first."""
    pages = (deep_run / "log" / "data.mdb").stat().st_size // PAGE
    damages: dict[str, Damage] = {}
    for page in range(2, pages, 3):
        damages[f"zeroed page {page}"] = overwrite_page(page, bytes(PAGE))
        damages[f"garbage page {page}"] = overwrite_page(page, random.Random(page).randbytes(PAGE))
    cases = []
    for name, damage in damages.items():
        path = copy_with(deep_run, tmp_path / name.replace(" ", "-"), damage)
        cases += [(f"{name}: {c[0]}", [*c, str(path)]) for c in COMMANDS]
    results = run_cases(cases)
    check_damaged(results, {}, deep_run)
    refused = [r for r in results if r.code != 0]
    assert len(refused) > len(results) // 2
    assert any("is damaged: page " in r.err for r in refused)


def test_a_log_from_a_newer_coevo_is_refused_with_its_seq(run_dir: Path, tmp_path: Path) -> None:
    newer_format = copy_with(run_dir, tmp_path / "format", lambda _: None)
    newer_event = copy_with(run_dir, tmp_path / "event", lambda _: None)
    with lmdb.open(str(newer_format / "log"), max_dbs=3) as env:
        db = env.open_db(b"meta", create=False)
        payload = msgspec.msgpack.encode(99)
        crc = __import__("zlib").crc32(payload, __import__("zlib").crc32(b"log_format"))
        with env.begin(write=True, db=db) as txn:
            txn.put(b"log_format", crc.to_bytes(4, "big") + payload)
    with LmdbEventLog.open(newer_event / "log", writable=True) as log:
        seq = log.next_seq
        env = Envelope(seq=seq, run="x", t=0, actor="runtime", event=RunStopped(reason="x"), v=9)
        log.append_encoded(log.encode([env]))
    assert Codec().encode(env)  # the envelope itself is well formed
    results = run_cases(
        [(f"{p.name}: {c[0]}", [*c, str(p)]) for p in (newer_format, newer_event) for c in COMMANDS]
    )
    for result in results[:3]:
        assert_one_line(result, "log has format 99; this coevo reads up to")
    for result in results[3:]:
        assert_one_line(result, f"seq {seq}: run_stopped v9 is newer than this coevo's v1")
        assert "/log" in result.err
    assert results[5].seqs() == list(range(seq))


def test_directories_that_are_not_runs(run_dir: Path, tmp_path: Path) -> None:
    paths: dict[str, tuple[Path, str]] = {}

    def make(name: str, fragment: str) -> Path:
        path = tmp_path / name
        paths[name] = (path, fragment)
        return path

    make("missing", "no such run directory")
    make("empty", "not a coevo run directory").mkdir()
    (make("log without data", "not a coevo run directory") / "log").mkdir(parents=True)
    file = make("a file", "not a coevo run directory")
    file.write_text('name = "x"\n')
    garbage = make("garbage data.mdb", "cannot open event log") / "log"
    garbage.mkdir(parents=True)
    (garbage / "data.mdb").write_bytes(random.Random(0).randbytes(3 * PAGE))
    directory = make("data.mdb is a directory", "not a coevo run directory") / "log"
    (directory / "data.mdb").mkdir(parents=True)
    foreign = make("another LMDB", "LMDB file without its databases") / "log"
    foreign.mkdir(parents=True)
    with lmdb.open(str(foreign)) as env, env.begin(write=True) as txn:
        txn.put(b"k", b"v")
    no_format = copy_with(run_dir, make("no format record", "no log format recorded"), str)
    with lmdb.open(str(no_format / "log"), max_dbs=3) as env:
        meta = env.open_db(b"meta", create=False)
        with env.begin(write=True, db=meta) as txn:
            txn.delete(b"log_format")
    cases = [(name, [*c, str(p)]) for name, (p, _) in paths.items() for c in COMMANDS]
    for result in run_cases(cases):
        path, fragment = paths[result.name]
        assert_one_line(result, fragment, str(path))
        assert result.out == ""
        if result.name in ("missing", "empty", "a file", "another LMDB"):
            assert result.code == 2, result  # bad input, as a wrong path is
    assert sorted(p.name for p in garbage.iterdir()) == ["data.mdb"]  # no lock.mdb left there


@pytest.mark.faults
@pytest.mark.parametrize("which", ["run_dir", "deep_run"])
def test_every_page_overwritten_and_every_record_flipped(
    which: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The exhaustive sweep (``make test-faults``): each page zeroed, each page garbage, a cut
    at each page boundary, and a flipped bit in every record; of a log whose events database
    is one leaf page and of one with a branch page above its leaves."""
    run_dir: Path = request.getfixturevalue(which)
    size = (run_dir / "log" / "data.mdb").stat().st_size
    damages: dict[str, tuple[Damage, str]] = {}
    for page in range(size // PAGE):
        damages[f"zeroed page {page}"] = (overwrite_page(page, bytes(PAGE)), "")
        rng = random.Random(page)
        damages[f"garbage page {page}"] = (overwrite_page(page, rng.randbytes(PAGE)), "")
        damages[f"cut at page {page}"] = (truncate_to(page * PAGE + rng.randrange(PAGE)), "")
    for seq, offsets, length in events_in_file(run_dir):
        flip = flip_bits([at + length // 2 for at in offsets])
        damages[f"record {seq}"] = (flip, f"at seq {seq}: checksum")
    cases, expect = [], {}
    for name, (damage, fragment) in damages.items():
        path = copy_with(run_dir, tmp_path / name.replace(" ", "-"), damage)
        for command in (["replay", "--verify"], ["log", "--json"]):
            cases.append((f"{name}: {command[0]}", [*command, str(path)]))
            if fragment:
                expect[cases[-1][0]] = fragment
    results = run_cases(cases)
    failed = sum(r.code != 0 for r in results)
    fault_counts.record(
        damaged_copies=len(damages),
        commands=len(results),
        refused_one_line=failed,
        unaffected=len(results) - failed,
        tracebacks=sum("Traceback" in r.err for r in results),
    )
    check_damaged(results, expect, run_dir)
    print(
        f"\nlog damage sweep: {len(damages)} damaged copies, {len(results)} commands, "
        f"{failed} refused with one line, {len(results) - failed} unaffected"
    )


def test_an_audit_of_a_damaged_log_names_the_log(run_dir: Path, tmp_path: Path) -> None:
    """``coevo audit`` said "event log corrupted at seq N" without saying which log (the
    other reading commands name it)."""
    seq, offsets, length = events_in_file(run_dir)[3]
    path = copy_with(run_dir, tmp_path / "flipped", flip_bits([at + length // 2 for at in offsets]))
    (result,) = run_cases([("audit", ["audit", str(path), "episode", "ep000001"])])
    assert result.code != 0
    assert_one_line(result, str(path / "log"), f"at seq {seq}: checksum")
    assert f"the events before it still read: coevo log RUN --to {seq})" in result.err


def test_the_torn_copy_hint_promises_only_what_reads(run_dir: Path, tmp_path: Path) -> None:
    """The hint said "the events before the damage still read: coevo log RUN --to SEQ" for a
    truncated file too, where ``log --to`` fails as every command does: it names the seq only
    for a damaged record, and ``log --to`` that seq reads."""
    seq, offsets, length = events_in_file(run_dir)[3]
    flipped = copy_with(
        run_dir, tmp_path / "flipped", flip_bits([at + length // 2 for at in offsets])
    )
    size = (run_dir / "log" / "data.mdb").stat().st_size
    cut = copy_with(run_dir, tmp_path / "cut", truncate_to(size // 2))
    results = run_cases(
        [
            ("flipped", ["check", str(flipped)]),
            ("flipped: before", ["log", str(flipped), "--to", str(seq), "--json"]),
            ("cut", ["check", str(cut)]),
        ]
    )
    assert f"coevo log RUN --to {seq})" in results[0].err
    assert results[1].code == 0 and len(results[1].out.splitlines()) == seq, results[1].err
    assert results[2].code != 0 and "torn like this" in results[2].err
    assert "--to" not in results[2].err, results[2].err


def test_a_copy_of_a_damaged_run_says_the_run_is_damaged(run_dir: Path, tmp_path: Path) -> None:
    """``coevo copy`` of a run whose log is damaged said it copied every event, then blamed a
    torn ``cp -r`` of the copy. It says the run's own log is damaged (the copy holds it as
    it is)."""
    seq, offsets, length = events_in_file(run_dir)[3]
    path = copy_with(run_dir, tmp_path / "flipped", flip_bits([at + length // 2 for at in offsets]))
    dest = tmp_path / "copy"
    (result,) = run_cases([("copy", ["copy", str(path), str(dest)])])
    assert result.code == 1 and "Traceback" not in result.err, result
    last = result.err.splitlines()[-1]
    assert last.startswith("coevo: error: the run's log is damaged, and its copy holds it"), result
    assert f"at seq {seq}: checksum" in last, result
