"""``coevo serve``: the browser's pages for the tiny Complementary RL run (conftest.py), served
by uvicorn on a loopback port and read by headless Chromium (Debian's ``chromium``; CI installs
it), checked against what ``coevo audit`` says of the same episode and entry."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from test_grpo_run import of, read_events

from agents.events.episodes import EpisodeAssigned, EpisodeFinished
from agents.events.extractor import CreditAssigned
from engine.eventlog import new_run_meta
from engine.events import Envelope, Event
from engine.lifecycle import RunStarted, RunStopped
from scenarios.cli import main
from scenarios.cli.serve import open_views
from stores.lmdb_log import LmdbEventLog

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install chromium)"
)


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A run whose log has no final event yet (created, nothing committed): a live run, its
    lock file held open by this process, which its lock file names (as a writer's is)."""
    root = tmp_path_factory.mktemp("live") / "live"
    meta = new_run_meta("r-live", scenario_name="x", seed=0, coevo_version="0", scenario_toml="")
    LmdbEventLog.create(root / "log", meta, durable=False).close()
    held = os.open(root / "log" / "writer.lock", os.O_RDONLY)
    try:
        yield root
    finally:
        os.close(held)


@pytest.fixture(scope="module")
def server(distill_root: Path, live_run: Path) -> Iterator[str]:
    import uvicorn

    from agents.browse.app import make_app

    views = open_views([str(distill_root / "run"), str(live_run)])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(make_app(views), log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        sock.close()
        for view in views.values():
            view.close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _dom(url: str, profile: Path) -> str:
    assert CHROMIUM is not None
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
    done = subprocess.run(
        [CHROMIUM, *flags, f"--user-data-dir={profile}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    assert "<tbody>" in done.stdout  # the browser's DOM, not the page's source
    return done.stdout


def _audit(run: Path, what: str, ident: str, capsys: pytest.CaptureFixture[str]) -> Any:
    capsys.readouterr()
    assert main(["audit", str(run), what, ident, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _as_shown(text: str, keep: str = "\n\t") -> str:
    """A text as a page shows it: each character that is not printable (controls, format
    characters, spaces but the space) but those in ``keep`` written as Python writes it in a
    string (``\\x19``, ``\\u202e``): a tip the embedded extractor wrote may hold any byte."""
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def _texts(dom: str, pattern: str) -> list[str]:
    return [unescape(re.sub(r"<[^>]+>", "", m)).strip() for m in re.findall(pattern, dom, re.S)]


@pytest.fixture(scope="module")
def credited(distill_root: Path) -> CreditAssigned:
    """The first credit of the run: a trained guided episode and the entry it used."""
    return of(read_events(distill_root / "run"), CreditAssigned)[0]


@needs_chromium
def test_an_episode_page_shows_what_the_audit_says(
    server: str,
    distill_root: Path,
    credited: CreditAssigned,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = distill_root / "run"
    audit = _audit(run, "episode", credited.episode, capsys)
    dom = _dom(f"{server}/runs/run/episodes/{credited.episode}", tmp_path / "p")
    actions = [_as_shown(t["action"], keep="") for t in audit["turns"]]
    assert _texts(dom, r'<b class="action">(.*?)</b>') == actions
    observations = _texts(dom, r'<div class="turn" id="turn-\d+">.*?<pre>(.*?)</pre>')
    assert observations == [_as_shown(t["observation"]).strip() for t in audit["turns"]]
    first = audit["turns"][0]["retrieved"][0]
    assert f'href="/runs/run/entries/{first["tip"]}"' in dom
    advantage = _texts(dom, r'<p id="advantage">(.*?)</p>')[0]
    assert f"advantage {audit['advantage']['advantage']:+.4f}" in advantage
    rewards = ", ".join(f"{r:.4f}" for r in audit["advantage"]["group_rewards"])  # 1e14: short
    assert f"the group's rewards [{rewards}]" in advantage
    update = _texts(dom, r'<p id="update">(.*?)</p>')[0]
    assert f"policy v{audit['update']['version']}: {audit['update']['samples']} samples" in update
    credit = _texts(dom, r'<p id="credit">(.*?)</p>')[0]
    assert credit.startswith(f"entry {credited.entry} (call {credited.call}) credited ")
    assert f"{audit['credit']['credit']:+.3f}" in credit
    # the chosen candidate's probability is the action's probability under the sampling policy
    chosen = _texts(dom, r'<tr class="chosen"><td>.*?</td><td>(.*?)</td>')
    logps = [t["logp"] for t in audit["turns"]]
    assert [float(p) for p in chosen] == pytest.approx(
        [2.718281828459045**lp for lp in logps], abs=6e-4
    )


@needs_chromium
def test_an_entry_page_shows_what_the_audit_says_with_links(
    server: str,
    distill_root: Path,
    credited: CreditAssigned,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = distill_root / "run"
    audit = _audit(run, "tip", str(credited.entry), capsys)
    dom = _dom(f"{server}/runs/run/entries/{credited.entry}", tmp_path / "p")
    assert _texts(dom, r'<pre id="text">(.*?)</pre>') == [_as_shown(audit["text"]).strip()]
    summary = _texts(dom, r'<p id="summary">(.*?)</p>')[0]
    assert f"shown in {audit['guided']} episode" in summary
    assert f"total credit {audit['credit_sum']:+.3f}" in summary
    uses = re.search(r'<table id="uses">(.*?)</table>', dom, re.S)
    assert uses is not None
    linked = re.findall(r'href="/runs/run/episodes/(ep\d+)"', uses.group(1))
    assert linked == [u["episode"] for u in audit["uses"]]
    credits = re.search(r'<table id="credits">(.*?)</table>', dom, re.S)
    assert credits is not None
    shown = _texts(credits.group(1), r"<tr><td>\d+</td><td>.*?</td><td>.*?</td><td>(.*?)</td>")
    assert shown == [f"{c['credit']:+.3f}" for c in audit["credits"]]
    origin = _texts(dom, r'<p id="origin">(.*?)</p>')[0]
    assert origin.startswith(f"extractor call {audit['origin']['call']} ")
    lineage = re.search(r'<ul id="lineage">(.*?)</ul>\s*$', dom.split("<h2>Uses</h2>")[0], re.S)
    assert lineage is not None
    assert f'<a href="/runs/run/entries/{credited.entry}">' in lineage.group(1)
    assert "&lt;" not in lineage.group(1)  # the list's HTML was shown as text


def test_a_warm_up_group_is_said_to_be_one_not_update_minus_one(
    distill_root: Path, credited: CreditAssigned, capsys: pytest.CaptureFixture[str]
) -> None:
    """A warm-up group's advantage read "(update -1, rule ...)" on the episode page."""
    from types import SimpleNamespace

    import msgspec

    from agents.audit.episode import EpisodeAudit
    from agents.browse import app

    audit = msgspec.convert(
        _audit(distill_root / "run", "episode", credited.episode, capsys), EpisodeAudit
    )
    assert audit.advantage is not None
    warm = msgspec.structs.replace(audit.advantage, update=-1)
    page = app._TEMPLATES.get_template("episode.html").render(  # pyright: ignore[reportPrivateUsage]
        refresh=5,
        view=SimpleNamespace(name="run"),
        a=msgspec.structs.replace(audit, advantage=warm),
        candidates={},
        live=False,
        unfinished=False,
    )
    assert f"group {warm.group} (a warm-up step, not trained, rule {warm.rule})" in page
    assert "update -1" not in page


def test_an_entry_s_lineage_is_a_list_of_links_not_its_html_as_text(
    distill_root: Path, credited: CreditAssigned, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's finalizer made the lineage macro's HTML plain text again, and the page
    showed "<li><a href=...>entry 2</a> ..." as text, its links dead."""
    from types import SimpleNamespace

    import msgspec

    from agents.audit.answers import TipAudit
    from agents.browse import app

    audit = msgspec.convert(
        _audit(distill_root / "run", "tip", str(credited.entry), capsys), TipAudit
    )
    page = app._TEMPLATES.get_template("entry.html").render(  # pyright: ignore[reportPrivateUsage]
        refresh=5, view=SimpleNamespace(name="run"), a=audit, limit=10, live=False
    )
    lineage = re.search(r'<ul id="lineage">(.*?)</ul>\n', page, re.S)
    assert lineage is not None, page
    assert lineage.group(1).startswith(f'<li><a href="/runs/run/entries/{credited.entry}">')
    assert "&lt;" not in lineage.group(1)


@needs_chromium
def test_the_episode_list_filters(server: str, distill_root: Path, tmp_path: Path) -> None:
    events = read_events(distill_root / "run")
    wanted = [
        e.episode
        for e in of(events, EpisodeAssigned)
        if e.purpose == "train" and e.rollout == "guided-distill"
    ]
    dom = _dom(f"{server}/runs/run?purpose=train&rollout=guided-distill", tmp_path / "p")
    table = re.search(r'<table id="episodes">(.*?)</table>', dom, re.S)
    assert table is not None
    assert re.findall(r'href="/runs/run/episodes/(ep\d+)"', table.group(1)) == wanted
    assert _texts(dom, r'<p id="count">(.*?)</p>')[0].startswith(f"{len(wanted)} episodes")
    assert 'option value="guided-distill" selected' in dom
    assert "no episode of this run has" not in dom
    code, body = _get(f"{server}/runs/run?outcome=bogus&purpose=train")
    assert code == 200 and "0 episodes" in body
    assert "no episode of this run has outcome <b>bogus</b> (it has: " in body, body
    assert "no episode of this run has purpose" not in body


def test_bad_runs_and_ids_are_one_line_error_pages(server: str) -> None:
    for path, status, message in (
        ("/runs/nope", 404, "no run named &#39;nope&#39; here (runs: run, live)"),
        ("/runs/run/episodes/ep9999", 404, "no episode &#39;ep9999&#39; in this run"),
        ("/runs/run/entries/x1", 404, "entry id must be a non-negative integer, got &#39;x1&#39;"),
        ("/runs/run/entries/99999", 404, "no entry 99999 in this run"),
        ("/runs/run/entries/18446744073709551616", 404, "no entry 18446744073709551616 in"),
        ("/runs/run?page=0", 400, "page must be a positive integer, got &#39;0&#39;"),
        ("/runs/run?page=%C2%B2", 400, "page must be a positive integer, got &#39;²&#39;"),
        ("/runs/run?page=99", 404, "page 99: this list has 1 page(s)"),
        ("/runs/run/entries/%E2%91%A0", 404, "entry id must be a non-negative integer"),
    ):
        code, body = _get(server + path)
        assert code == status, path
        assert message in body, body
        assert "Traceback" not in body


def test_a_live_run_refreshes_and_a_finished_one_does_not(server: str) -> None:
    code, body = _get(server + "/runs/live")
    assert code == 200 and '<meta http-equiv="refresh" content="5">' in body
    assert '<span class="live">live</span>' in body
    code, body = _get(server + "/runs/run")
    assert code == 200 and "http-equiv" not in body and "completed" in body


def test_a_live_run_shows_what_it_commits_until_it_ends(server: str, live_run: Path) -> None:
    log = LmdbEventLog.open(live_run / "log", writable=True, durable=False)

    def commit(*events: Event) -> None:
        first = log.next_seq
        log.append(
            [
                Envelope(seq=first + i, run="r-live", t=first + i, actor="a", event=ev)
                for i, ev in enumerate(events)
            ]
        )

    try:
        commit(
            RunStarted(run_id="r-live", scenario="x", scenario_hash="", seed=0, coevo_version="0"),
            EpisodeAssigned(
                episode="ep000000",
                index=0,
                worker="w",
                family="fetch",
                variant=1,
                split="train",
                seed=5,
            ),
        )
        code, body = _get(server + "/runs/live")
        assert code == 200 and '<td class="running">running</td>' in body
        assert "1 episode, 1-1 shown" in body and "http-equiv" in body
        commit(
            EpisodeFinished(
                episode="ep000000",
                worker="w",
                family="fetch",
                variant=1,
                split="train",
                steps=3,
                score=1.0,
                success=True,
                total_reward=1.0,
            )
        )
        code, body = _get(server + "/runs/live")
        assert '<td class="success">success</td>' in body and "http-equiv" in body
        commit(RunStopped(reason="completed", signal="", exit_code=0))
        code, body = _get(server + "/runs/live")
        assert "http-equiv" not in body and '<span class="completed">completed</span>' in body
    finally:
        log.close()


def test_serve_refuses_a_public_address_and_bad_runs(
    distill_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(distill_root / "run")
    for host in ("0.0.0.0", "192.0.2.7", "example.org"):
        assert main(["serve", run, "--host", host]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"coevo: error: --host {host} is not a loopback address: anyone who reaches it "
            "reads the runs; add --public to serve there\n"
        )
    assert main(["serve", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"coevo: error: {tmp_path}: not a coevo run directory (no log/data.mdb inside)\n"
    (tmp_path / "link").symlink_to(distill_root / "run")
    assert main(["serve", run, str(tmp_path / "link")]) == 2  # one run twice: two views of it
    err = capsys.readouterr().err
    assert err == f"coevo: error: {(distill_root / 'run').resolve()}: given more than once\n"


def test_serve_names_the_port_it_listens_on_and_refuses_one_in_use(
    distill_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--port 0`` lets the system choose: the line printed names the chosen port (it said
    ``:0``); a port another socket holds is one line before anything is printed."""
    run = str(distill_root / "run")
    proc = subprocess.Popen(
        [sys.executable, "-m", "scenarios.cli", "serve", run, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"at http://127\.0\.0\.1:(\d+)/ ", line)
        assert found and int(found.group(1)) > 0, line
        status, _ = _get(f"http://127.0.0.1:{found.group(1)}/")
        assert status == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["serve", run, "--port", str(port)]) == 2
        out, err = capsys.readouterr()
        assert out == ""  # (a note that the audit index is open in this process may come first)
        assert err.splitlines()[-1] == (
            f"coevo: error: cannot listen on 127.0.0.1:{port}: Address already in use"
        )


KILLED = """
import sys
from pathlib import Path
from engine.eventlog import new_run_meta
from engine.events import Envelope
from engine.lifecycle import RunStarted
from stores.lmdb_log import LmdbEventLog
meta = new_run_meta("r-k", scenario_name="x", seed=0, coevo_version="0", scenario_toml="")
log = LmdbEventLog.create(Path(sys.argv[1]), meta, durable=False)
started = RunStarted(run_id="r-k", scenario="x", scenario_hash="", seed=0, coevo_version="0")
log.append([Envelope(seq=0, run="r-k", t=0, actor="a", event=started)])
"""


def test_a_run_whose_writer_is_gone_shows_as_killed_not_live(tmp_path: Path) -> None:
    """A SIGKILLed run has no final event, like a live one: the browser showed it "live" and
    reloaded its page forever. Its writer's process is gone."""
    from agents.browse.data import RunView

    root = tmp_path / "killed"
    subprocess.run([sys.executable, "-c", KILLED, str(root / "log")], check=True)  # then exits
    view = RunView.open("killed", root)
    try:
        assert view.status() == "killed"
    finally:
        view.close()
    # a writer on another machine (a shared file system): its pid cannot be asked here
    lock = root / "log" / "writer.lock"
    pid = lock.read_text().split()[0]
    lock.write_text(f"{pid} another-machine\n")
    view = RunView.open("killed", root)
    try:
        assert view.status() == "live"
    finally:
        view.close()


UNENDED = (
    KILLED
    + """
from agents.events.episodes import EpisodeAssigned
assigned = EpisodeAssigned(
    episode="ep000000", index=0, worker="w", family="fetch", variant=1, split="train", seed=5
)
log.append([Envelope(seq=1, run="r-k", t=1, actor="a", event=assigned)])
"""
)


def test_an_episode_a_killed_run_left_without_an_end_is_unfinished_not_running(
    tmp_path: Path,
) -> None:
    """A stopped or killed run's episodes without an end were listed (and filtered) as
    "running" and their pages said "ended: running": nothing plays them."""
    from starlette.testclient import TestClient

    from agents.browse.app import make_app

    root = tmp_path / "killed"
    subprocess.run([sys.executable, "-c", UNENDED, str(root / "log")], check=True)
    views = open_views([str(root)])
    try:
        client = TestClient(make_app(views))
        listed = client.get("/runs/killed").text
        assert '<td class="unfinished">unfinished</td>' in listed and ">running<" not in listed
        assert "ep000000" in client.get("/runs/killed?outcome=unfinished").text
        assert "ep000000" not in client.get("/runs/killed?outcome=running").text
        page = unescape(client.get("/runs/killed/episodes/ep000000").text)
        said = "no: the run stopped before it did (coevo resume plays it again)"
        assert f'ended: <span class="unfinished">{said}</span>' in page
    finally:
        for view in views.values():
            view.close()


def test_an_aborted_use_reads_aborted_on_the_entry_page(
    distill_root: Path, credited: CreditAssigned, capsys: pytest.CaptureFixture[str]
) -> None:
    """An episode that ended aborted is marked so, not as a failure with its score (the
    audit's use is both ended and aborted)."""
    import msgspec

    from agents.audit.answers import TipAudit
    from agents.browse import app

    audit = msgspec.convert(
        _audit(distill_root / "run", "tip", str(credited.entry), capsys), TipAudit
    )
    use = msgspec.structs.replace(audit.uses[0], ended=True, aborted="RuntimeError: lost")
    page = app._TEMPLATES.get_template("entry.html").render(  # pyright: ignore[reportPrivateUsage]
        refresh=5, view=None, a=msgspec.structs.replace(audit, uses=(use,)), limit=10, live=False
    )
    uses = re.search(r'<table id="uses">(.*?)</table>', page, re.S)
    assert uses is not None
    assert '<td class="aborted">aborted</td>' in uses.group(1), uses.group(1)


@pytest.mark.parametrize(
    ("end", "said"),
    [
        ("completed", "none (the run completed first)"),
        ("failed", "none (the run failed first)"),
        ("", "not yet"),
    ],
)
def test_a_credit_no_update_took_reads_none_once_the_run_completed(
    distill_root: Path,
    credited: CreditAssigned,
    capsys: pytest.CaptureFixture[str],
    end: str,
    said: str,
) -> None:
    """A completed run's credits still waiting for a batch will never be used: the page said
    "not yet" (the terminal's audit said "none"); a failed run's wait for a resume. A credit
    of 1e15 showed all its digits ("+1000000000000000.000")."""
    import msgspec

    from agents.audit.answers import TipAudit
    from agents.browse import app

    audit = msgspec.convert(
        _audit(distill_root / "run", "tip", str(credited.entry), capsys), TipAudit
    )
    credit = msgspec.structs.replace(audit.credits[0], update=-1, credit=1e15)
    page = app._TEMPLATES.get_template("entry.html").render(  # pyright: ignore[reportPrivateUsage]
        refresh=5,
        view=None,
        a=msgspec.structs.replace(audit, credits=(credit,), run_end=end),
        limit=10,
        live=False,
    )
    credits = re.search(r'<table id="credits">(.*?)</table>', page, re.S)
    assert credits is not None
    assert f"<td>+1.000e+15</td><td>{said}</td></tr>" in credits.group(1), credits.group(1)


def test_a_run_deleted_or_replaced_while_served_is_said_to_be(tmp_path: Path) -> None:
    """The browser kept showing a run whose directory was deleted (and kept its deleted log
    open), or the old run after the directory was replaced by another (deleted and run again,
    copied over), with no word."""
    from starlette.testclient import TestClient

    from agents.browse.app import make_app

    a_run = _a_run
    kept, swapped = tmp_path / "kept", tmp_path / "swapped"
    a_run(kept, "r-kept", 2)
    a_run(swapped, "r-old", 2)
    views = open_views([str(kept), str(swapped)])
    try:
        client = TestClient(make_app(views))
        assert "ep000001" in client.get("/runs/kept").text
        shutil.rmtree(kept)
        page = client.get("/runs/kept")
        assert page.status_code == 404 and "the run is gone (deleted or moved" in unescape(
            page.text
        )
        assert re.search(r'<td class="gone">gone</td>', client.get("/").text)
        assert views["kept"].log.closed  # its deleted files are let go
        shutil.rmtree(swapped)
        a_run(swapped, "r-new", 3)
        page = unescape(client.get("/runs/swapped").text)
        assert "ep000002" in page and "was replaced since serve started" in page
        assert "(r-new)" in page
        a_run(kept, "r-back", 1)  # a run there again
        assert client.get("/runs/kept").status_code == 200
    finally:
        for view in views.values():
            view.close()


def _a_run(root: Path, run_id: str, episodes: int) -> None:
    meta = new_run_meta(run_id, scenario_name="x", seed=0, coevo_version="0", scenario_toml="")
    log = LmdbEventLog.create(root / "log", meta, durable=False)
    try:
        events: list[Event] = [
            RunStarted(run_id=run_id, scenario="x", scenario_hash="", seed=0, coevo_version="0")
        ]
        events += [
            EpisodeAssigned(
                episode=f"ep{i:06d}",
                index=i,
                worker="w",
                family="heat",
                variant=i,
                split="train",
                seed=i,
            )
            for i in range(episodes)
        ]
        events.append(RunStopped(reason="completed", signal="", exit_code=0))
        log.append(
            [Envelope(seq=i, run=run_id, t=i, actor="a", event=e) for i, e in enumerate(events)]
        )
    finally:
        log.close()


SERVE_THROUGH = """
import os, shutil, sys
from html import unescape
from starlette.testclient import TestClient
from agents.browse.app import make_app
from scenarios.cli.serve import open_views

served, other = sys.argv[1], sys.argv[2]
data = os.path.join(served, "log", "data.mdb")
views = open_views([served])
client = TestClient(make_app(views))
print(client.get("/runs/served").status_code)
shutil.copyfile(data, data + ".kept")
os.truncate(data, 8192)  # its two meta pages: every other page it maps is gone
page = client.get("/runs/served")
print(page.status_code, unescape(page.text).count("cannot be read now"))
runs = client.get("/")
print(runs.status_code, '<td>?</td><td class="unreadable">unreadable</td>' in runs.text)
shutil.copyfile(other, data)  # in place: the same inode, another run's log
page = unescape(client.get("/runs/served").text)
print("ep000002" in page, "(r-new)" in page, "was replaced since serve started" in page)
shutil.copyfile(data + ".kept", data)  # the run serve started with, back
page = unescape(client.get("/runs/served").text)
print("ep000002" in page, "was replaced since serve started" in page)
"""


def test_a_log_truncated_or_copied_over_in_place_while_served(tmp_path: Path) -> None:
    """A log file truncated under serve killed it with SIGBUS (its pages are mapped), and one
    copied over in place (``cp`` keeps the inode) was served as the old run, mixed with the
    new one's events (a traceback page where they disagreed). Run in a child process: the
    SIGBUS would end the test session. Then (an outside tester): the truncated run was
    listed "gone" with 0 events, and the run serve started with, copied back, was called
    "replaced"."""
    _a_run(tmp_path / "served", "r-old", 2)
    _a_run(tmp_path / "other", "r-new", 3)
    other = tmp_path / "other" / "log" / "data.mdb"
    done = subprocess.run(
        [sys.executable, "-c", SERVE_THROUGH, str(tmp_path / "served"), str(other)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:5] == [
        "200",
        "500 1",
        "200 True",
        "True True True",
        "False False",
    ]


def test_a_control_character_in_a_world_s_text_is_shown_escaped() -> None:
    """A NUL in an observation was written raw into the page (no HTML may hold one)."""
    from agents.browse.app import _TEMPLATES  # pyright: ignore[reportPrivateUsage]

    page = _TEMPLATES.from_string("<p>{{ text }}</p>").render(text="a\x00b\x1b[2Jc <d>")
    assert page == "<p>a\\x00b\\x1b[2Jc &lt;d&gt;</p>"


def test_what_a_reader_could_not_see_is_shown_escaped_and_one_line_texts_stay_one_line() -> None:
    """A C1 control (``\\x9b``), a right-to-left override (the goal ``\\u202edrow`` read
    "word") and a zero-width space (``open door`` and ``open door\\u200b`` looked the same)
    were written raw, though ``coevo audit`` escapes them; an action's tab, newline and
    carriage return collapsed in the page (``wait\\r`` read "wait"). Text blocks keep their
    line breaks; a family a page shows escaped is found by the name it shows; a command to
    paste for a run directory ``-ins`` no longer reads as an option."""
    from agents.browse.app import _TEMPLATES  # pyright: ignore[reportPrivateUsage]
    from agents.browse.data import _named  # pyright: ignore[reportPrivateUsage]

    def page(template: str, text: str) -> str:
        return _TEMPLATES.from_string(template).render(text=text)

    assert page("{{ text }}", "x\x9by\u202edrow\u200b\nline\tz") == (
        "x\\x9by\\u202edrow\\u200b\nline\tz"
    )
    assert page("{{ text|line }}", "go\tnorth\nnow\r") == "go\\tnorth\\nnow\\r"
    assert page("{{ text|shell }}", "-ins") == "./-ins"
    assert page("{{ text|shell }}", "my run") == "&#39;my run&#39;"
    assert _named("q\x1b[31mR", "'q\\x1b[31mR'") and _named("heat", "heat")
    assert not _named("q\x1b[31mR", "qR") and not _named("q\\x1b[31mR", "'q\\x1b[31mR'")
    assert not _named("q\x1b[31mR", "q\\x1b[31mR")  # the name of another family
    assert page("{{ text|key }}", "q\x1b") == "&#39;q\\x1b&#39;"
    root = _TEMPLATES.from_string("{{ p }}").render(p=Path("/r/e\x1b\u202e"))
    assert root == "/r/e\\x1b\\u202e"  # a run's directory


def test_serve_out_of_file_descriptors_stays_up_and_stops_on_sigterm(live_run: Path) -> None:
    """120 connections at once under ``ulimit -n 64``: asyncio logged every failed accept
    (each through the console's rich traceback, which itself failed to open a file) and
    retried in bursts; the server spun at full CPU, wrote megabytes a second to stderr,
    answered nothing and ignored SIGTERM."""
    import resource
    import signal

    def few_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    coevo = str(Path(sys.executable).parent / "coevo")
    proc = subprocess.Popen(
        [coevo, "serve", str(live_run), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=few_files,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", line).group(1))  # type: ignore[union-attr]
        held = []
        for _ in range(120):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(s)
        time.sleep(2)
        for s in held:
            s.close()
        time.sleep(1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
            assert answer.status == 200
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 143
    assert len(err) < 100_000 and "Logging error" not in err, err[-3000:]


def header_timeout_serve(run: Path, preexec_fn: Any = None) -> tuple[subprocess.Popen[str], int]:
    """``coevo serve RUN --header-timeout 1`` on any free port: the process and the port."""
    coevo = str(Path(sys.executable).parent / "coevo")
    proc = subprocess.Popen(
        [coevo, "serve", str(run), "--port", "0", "--header-timeout", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return proc, int(re.search(r"http://127\.0\.0\.1:(\d+)/", line).group(1))  # type: ignore[union-attr]


def test_serve_closes_connections_that_never_finish_their_request_head(live_run: Path) -> None:
    """Connections that sent half a request head were held for good: as many as the
    concurrency limit kept every other client out (503) for as long as they stayed open."""
    import resource
    import signal

    def few_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    proc, port = header_timeout_serve(live_run, few_files)
    held: list[socket.socket] = []
    try:
        for _ in range(60):  # more than the limit leaves (64 files, less what serve holds)
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            held.append(s)
        time.sleep(2.5)
        closed = sum(s.recv(1024) == b"" for s in held)  # the server hung up on each
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
            assert answer.status == 200
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        for s in held:
            s.close()
        proc.kill()
    assert closed == 60
    assert proc.returncode == 143, err


def test_a_kept_alive_connection_s_next_request_head_has_the_deadline_too(
    live_run: Path,
) -> None:
    """The deadline covered a connection's first request only: one answered request, then
    half of a second head (which also cancels uvicorn's keep-alive timer), held the
    connection for good, and enough of them kept every other client out again."""
    import signal

    proc, port = header_timeout_serve(live_run)
    held: list[socket.socket] = []
    try:
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /runs/nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = b""
            while b"</html>" not in answer.lower():
                answer += s.recv(65536)
            assert answer.startswith(b"HTTP/1.1 404")
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # the next head, never finished
            held.append(s)
        time.sleep(3)
        closed = sum(s.recv(1024) == b"" for s in held)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    finally:
        for s in held:
            s.close()
        proc.kill()
    assert closed == 5


def test_serve_refuses_a_header_timeout_out_of_range(live_run: Path) -> None:
    for bad in ("0", "-1", "nan", "1e9"):
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "coevo"), "serve", str(live_run),
             "--header-timeout", bad],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert "--header-timeout must be in (0, 3600] seconds" in proc.stderr


def test_serve_refuses_other_hosts_odd_ids_and_quotes_its_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an outside attack on serve: any ``Host`` was answered (a page on another site
    could read the runs by DNS rebinding); a page number or entry id of 5,000 digits was a
    500 "internal error"; ``ep000001%00`` was shown as ep000001; the "same in a terminal"
    command of a run in ``my run`` did not paste; ``serve .`` listed a run named ""."""
    from starlette.testclient import TestClient

    from agents.browse.app import LOOPBACK_NAMES, make_app

    run = tmp_path / "my run"
    _a_run(run, "r-odd", 2)
    monkeypatch.chdir(run)
    here = open_views(["."])
    names = list(here)
    for view in here.values():
        view.close()
    assert names == ["my-run"]
    views = open_views([str(run)])
    try:
        client = TestClient(make_app(views, LOOPBACK_NAMES), base_url="http://localhost:8000")
        assert client.get("/").status_code == 200
        for host in ("127.0.0.1:8000", "[::1]:8000", "LOCALHOST"):
            assert client.get("/", headers={"host": host}).status_code == 200, host
        refused = client.get("/runs/my-run", headers={"host": "attacker.example:8000"})
        assert refused.status_code == 400 and "not &#39;attacker.example&#39;" in refused.text
        digits = "9" * 5000
        for path in (f"/runs/my-run?page={digits}", f"/runs/my-run/entries/{digits}"):
            page = client.get(path)
            assert page.status_code == 404 and "5,000 digits" in page.text, page.text[-300:]
        assert client.get("/runs/my-run/episodes/ep000001").status_code == 200
        assert client.get("/runs/my-run/episodes/ep000001%00").status_code == 404
        hint = unescape(client.get("/runs/my-run/episodes/ep000001").text)
        assert f"coevo audit '{run}' episode ep000001" in hint, hint
    finally:
        for view in views.values():
            view.close()


INDEX_CUT = """
import os, sys
from starlette.testclient import TestClient
from agents.browse.app import make_app
from scenarios.cli.serve import open_views

served = sys.argv[1]
views = open_views([served])
client = TestClient(make_app(views))
print(client.get("/runs/served/episodes/ep000001").status_code)
os.truncate(os.path.join(served, "audit", "data.mdb"), 8192)  # its meta pages only
page = client.get("/runs/served/episodes/ep000001")
print(page.status_code, "was cut or removed while served" in views["served"].note)
print(client.get("/runs/served").status_code)
"""


def test_an_audit_index_cut_while_served_is_built_again(tmp_path: Path) -> None:
    """The audit index's file truncated under serve killed it with SIGBUS (exit 135, no
    word), as a cut log's did before it was checked. Run in a child process: a SIGBUS would
    end the test session."""
    _a_run(tmp_path / "served", "r-cut", 3)
    done = subprocess.run(
        [sys.executable, "-c", INDEX_CUT, str(tmp_path / "served")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split("\n")[:3] == ["200", "200 True", "200"], done.stdout


@pytest.mark.parametrize(
    ("signals", "code", "said"),
    [
        (("SIGHUP",), 129, "coevo: hung up (SIGHUP)"),
        (("SIGINT", "SIGINT"), 130, "coevo: interrupted"),
        (("SIGTERM", "SIGINT"), 143, "coevo: terminated"),
    ],
)
def test_serve_stopped_by_signals_says_one_line(
    live_run: Path, signals: tuple[str, ...], code: int, said: str
) -> None:
    """A SIGHUP (the terminal closed) was raised inside uvicorn's event loop: two tracebacks
    before the line (uvicorn itself stops on SIGINT and SIGTERM only). A second signal, a
    Ctrl-C (pressed twice, or one that ``timeout`` passes to the process group too), cancelled
    the app's lifespan task with two tracebacks."""
    import signal

    coevo = str(Path(sys.executable).parent / "coevo")
    proc = subprocess.Popen(
        [coevo, "serve", str(live_run), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", line).group(1))  # type: ignore[union-attr]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as answer:
            assert answer.status == 200  # the server's event loop runs
        for name in signals:
            proc.send_signal(getattr(signal, name))
            time.sleep(0.01)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, err.strip()) == (code, said)


def test_serve_s_note_on_an_index_it_cannot_keep_names_no_option_it_lacks(tmp_path: Path) -> None:
    """The note said "indexing in memory (--index DIR)": an option of audit's, which serve
    refuses."""
    from agents.browse.data import RunView

    _a_run(tmp_path / "run", "r-note", 2)
    (tmp_path / "run" / "audit").write_text("a file where the index goes")
    view = RunView.open("run", tmp_path / "run")
    try:
        assert view.note.endswith("indexing in memory")
    finally:
        view.close()


def test_every_entry_and_episode_a_refusal_names_is_a_link(
    distill_root: Path, credited: CreditAssigned, capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry page's "later proposals refused as its duplicates" and an episode page's
    "refused: duplicate of 1" were plain text (an outside tester): every entry and episode
    the browser names is a link."""
    import msgspec

    from agents.audit.answers import TipAudit
    from agents.audit.episode import EpisodeAudit, Written
    from agents.browse import app

    run = distill_root / "run"
    tip = msgspec.convert(_audit(run, "tip", str(credited.entry), capsys), TipAudit)
    tip = msgspec.structs.replace(
        tip, duplicates=("ep000004", "c7"), duplicate_episodes=("ep000004", "")
    )
    page = app._TEMPLATES.get_template("entry.html").render(  # pyright: ignore[reportPrivateUsage]
        view=_Named("run"), a=tip, limit=10, live=False
    )
    said = re.search(r"<p>later proposals refused as its duplicates: (.*?)</p>", page)
    assert said is not None
    assert said.group(1) == '<a href="/runs/run/episodes/ep000004">ep000004</a>, c7'
    episode = msgspec.convert(_audit(run, "episode", credited.episode, capsys), EpisodeAudit)
    wrote = Written(
        kind="reflection", seq=1, refused=("duplicate of 3", "full"), duplicate_of=(3, -1)
    )
    page = app._TEMPLATES.get_template("episode.html").render(  # pyright: ignore[reportPrivateUsage]
        view=_Named("run"),
        a=msgspec.structs.replace(episode, written=(wrote,)),
        candidates={},
        live=False,
        unfinished=False,
    )
    assert ' refused: <a href="/runs/run/entries/3">duplicate of 3</a>, full</p>' in page


class _Named:
    """A run view as a page's template reads it: its name."""

    def __init__(self, name: str) -> None:
        self.name = name


def test_too_few_open_files_to_serve_says_how_many_would_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The refusal read "ulimit -n is 10, 12 in use: raise it": more in use than allowed,
    and no word of what would do."""
    import os
    import resource

    from scenarios.cli.common import InputInvalid
    from scenarios.cli.serve import _connections_allowed  # pyright: ignore[reportPrivateUsage]

    listdir = os.listdir
    monkeypatch.setattr(resource, "getrlimit", lambda which: (10, 10))
    monkeypatch.setattr(
        os, "listdir", lambda p: ["x"] * 13 if p == "/proc/self/fd" else listdir(p)
    )  # with the one that lists them
    with pytest.raises(InputInvalid) as refused:
        _connections_allowed()
    assert str(refused.value) == (
        "too few open files allowed to serve: ulimit -n is 10, and 12 files are open already "
        "(the runs' logs and indexes); serving needs 32 or more (ulimit -n 256)"
    )
