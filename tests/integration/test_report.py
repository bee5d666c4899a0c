"""``coevo report``: one self-contained HTML page about a tiny Complementary RL run and a run
without a model side by side; its content read as text, and the page rendered in headless
Chromium (skipped where Debian's ``chromium`` package is not installed)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_grpo_run import of, read_events

from agents.events.extractor import CreditAssigned
from agents.events.memory import TipStored
from agents.report.curves import CURVE_FILES, EVAL_CSV, PNG, TRAIN_CSV, UPDATES_CSV
from engine.eventlog import new_run_meta
from scenarios.cli import main
from stores.lmdb_log import LmdbEventLog

CHROMIUM = shutil.which("chromium")
SECTIONS = (
    "Runs",
    "Success and return vs training episodes",
    "Policy updates",
    "Bank size and operations",
    "Retrieval usage",
    "Credit and the extractor&#x27;s reward",
    "Most-credited and most-harmful entries",
)
EXPLORE = """name = "explore-tiny"
[agent]
kind = "explorer"
[run]
episodes = 6
workers = 2
[logging]
progress = false
"""


@pytest.fixture(scope="module")
def runs(distill_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny Complementary RL run, and a scripted run with no model, bank or credit."""
    root = tmp_path_factory.mktemp("explore")
    (root / "explore.toml").write_text(EXPLORE)
    assert main(["run", str(root / "explore.toml"), "--out", str(root / "run"), "--quiet"]) == 0
    return distill_root / "run", root / "run"


@pytest.fixture(scope="module")
def page(runs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", str(runs[0]), str(runs[1]), "--out", str(out)]) == 0
    return out


def test_the_page_has_every_section_and_one_plot_per_section_with_data(page: Path) -> None:
    text = page.read_text()
    for title in SECTIONS:
        assert f"<h2>{title}</h2>" in text
    assert text.count("<svg") == 5  # success, updates, bank, retrieval, credit
    assert text.count("<figure>") == 5
    assert "coevo report: run, run" not in text  # two runs named "run": told apart


def test_the_page_loads_nothing(page: Path) -> None:
    text = page.read_text()
    assert "<script" not in text and "<link" not in text and "<img" not in text
    assert "@import" not in text
    assert set(re.findall(r"url\((.)", text)) == {"#"}  # svg clip paths, in the page
    assert set(re.findall(r'href="(.)', text)) == {"#"}  # anchors and svg uses, in the page
    for address in re.findall(r"https?://[^\"' )]+", text):
        assert address.startswith("http://www.w3.org/"), address  # xml namespaces


def test_sections_without_data_say_so(page: Path, runs: tuple[Path, Path]) -> None:
    text = html.unescape(page.read_text())
    name = f"{runs[1].parent.name}/run (rollout (explorer agent))"
    assert f"No policy update in: {name}." in text
    assert f"No bank or memory (nothing stored) in: {name}." in text
    assert (
        "No retrieval by a training episode (evaluation and adaptation rounds are left out) "
        f"in: {name}." in text
    )
    assert f"No credit (no extractor-written entry guided an episode) in: {name}." in text
    assert (
        f"No entry of {runs[1].parent.name}/run (rollout (explorer agent)) earned credit." in text
    )


def test_the_method_is_the_one_the_log_stores(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """Not ``scenario.toml``'s (a copy for people): deleted or another run's, the page says the
    same."""
    copy = tmp_path / "copy"
    shutil.copytree(runs[0], copy)
    (copy / "scenario.toml").write_text((runs[1] / "scenario.toml").read_text())
    gone = tmp_path / "gone"
    shutil.copytree(runs[1], gone)
    (gone / "scenario.toml").unlink()
    out = tmp_path / "report.html"
    assert main(["report", str(copy), str(gone), "--out", str(out)]) == 0
    text = out.read_text()
    assert "<td>tiny-complementary</td><td>complementary</td>" in text
    assert "<td>explore-tiny</td><td>rollout (explorer agent)</td>" in text


def test_entries_show_their_text_credits_and_lineage_command(
    page: Path, runs: tuple[Path, Path]
) -> None:
    events = read_events(runs[0])
    total: dict[int, float] = {}
    for c in of(events, CreditAssigned):
        total[c.entry] = total.get(c.entry, 0.0) + c.credit
    assert total, "the tiny run should credit some entries"
    worst = min(total, key=lambda e: (total[e], e))
    stored = {t.tip_id: t for t in of(events, TipStored)}
    text = page.read_text()
    card = text[text.index(f'<div class="entry" id="r0-tip{worst}">') :]
    card = card[: card.index("</div>")]
    assert f"total credit <b>{total[worst]:+.2f}</b>" in card
    credited = sum(1 for c in of(events, CreditAssigned) if c.entry == worst)
    assert f"from {credited} credited training episodes (" in card
    # as the page shows a text: what a reader could not see escaped (an embedded extractor's
    # tip may hold any byte), line breaks and tabs kept
    shown = "".join(
        c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in stored[worst].text
    )
    assert f"<blockquote>{html.escape(shown)}</blockquote>" in card
    assert f"extractor call {stored[worst].call} (extract of ep" in card
    assert f"<code>coevo audit {runs[0]} tip {worst}</code>" in card


def test_the_default_output_is_the_first_runs_report_html(
    runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(runs[1])]) == 0
    assert (runs[1] / "report.html").stat().st_size > 1000
    assert capsys.readouterr().out.startswith(f"report: {runs[1] / 'report.html'} (")


def test_out_dash_is_stdout_and_a_run_given_twice_is_refused(
    tmp_path: Path,
    runs: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--out -`` wrote a file named ``-`` in the working directory; ``report R R`` drew the
    run twice as "2 runs" (``serve`` refuses it)."""
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(runs[1]), "--out", "-"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("<!DOCTYPE html>") and out.rstrip().endswith("</html>")
    assert list(tmp_path.iterdir()) == []
    assert main(["report", str(runs[1]), str(runs[1] / "log" / "..")]) == 2
    assert capsys.readouterr().err == f"coevo: error: {runs[1]}: given more than once\n"


def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"coevo: error: {tmp_path}: not a coevo run directory (no log/data.mdb inside)\n"
    empty = tmp_path / "empty"
    meta = new_run_meta("r0", scenario_name="x", seed=0, coevo_version="0", scenario_toml="")
    LmdbEventLog.create(empty / "log", meta, durable=False).close()
    assert main(["report", str(empty)]) == 2
    assert capsys.readouterr().err == f"coevo: error: {empty}: the event log is empty\n"
    out = tmp_path / "no" / "such" / "dir.html"
    assert main(["report", str(runs[1]), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"coevo: error: {out}: cannot write: No such file or directory\n"
    # a directory read "cannot read: Is a directory"; a path under a file "no permission"
    assert main(["report", str(runs[1]), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"coevo: error: {tmp_path}: a directory; --out takes the page's file (DIR/report.html)\n"
    )
    under = runs[1] / "scenario.toml" / "r.html"
    assert main(["report", str(runs[1]), "--out", str(under)]) == 2
    err = capsys.readouterr().err
    assert f"{runs[1] / 'scenario.toml'} is a file, not a directory" in err, err


def test_a_report_replaces_only_an_earlier_report(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out never overwrites another file (a run's event log, a scenario); a second report
    replaces the first, and no partial file is left behind."""
    data = runs[1] / "log" / "data.mdb"
    before = data.read_bytes()
    assert main(["report", str(runs[1]), "--out", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"coevo: error: --out {data}: inside {data.parent}, ")  # the log's
    assert data.read_bytes() == before
    scenario = tmp_path / "s.toml"
    scenario.write_text('name = "x"\n')
    assert main(["report", str(runs[1]), "--out", str(scenario)]) == 2
    assert scenario.read_text() == 'name = "x"\n'
    assert main(["report", str(runs[1]), "--out", str(tmp_path)]) == 2
    capsys.readouterr()
    out = tmp_path / "r.html"
    assert main(["report", str(runs[1]), "--out", str(out)]) == 0
    assert main(["report", str(runs[0]), "--out", str(out)]) == 0
    assert f"coevo report: {runs[0].name}" in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "s.toml"]


def test_a_completed_run_without_its_curves_gets_them_from_its_report(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run stopped (or out of disk) between its end and its curves: ``coevo report`` writes
    the same files the run would have, from its log; the runs that have them are untouched."""
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    written = {name: (run / name).read_bytes() for name in CURVE_FILES}
    for name in (TRAIN_CSV, PNG):
        (run / name).unlink()
    assert main(["report", str(run), str(runs[1]), "--out", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out
    assert f"curves: {TRAIN_CSV}, {EVAL_CSV}, {UPDATES_CSV}, {PNG} in {run}" in out
    for name in (TRAIN_CSV, EVAL_CSV, UPDATES_CSV):
        assert (run / name).read_bytes() == written[name], name
    assert (run / PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not any((runs[1] / name).exists() for name in CURVE_FILES)  # no learning: none
    assert not [p.name for p in run.iterdir() if p.name.endswith(".partial")]


class _Dom(HTMLParser):
    """Counts what a browser's DOM holds: headings, and the drawing elements of each svg."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.svgs: list[int] = []
        self.tbody = 0
        self._in: str | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "svg":
            self.svgs.append(0)
            self._depth += 1
        elif self._depth and tag in ("path", "use", "rect", "text"):
            self.svgs[-1] += 1
        elif tag in ("h1", "h2"):
            self._in = tag
            self.headings.append("")
        self.tbody += tag == "tbody"

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._depth -= 1
        elif tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in:
            self.headings[-1] += data


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
    ]
    return subprocess.run(
        [CHROMIUM, *flags, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_headless_chromium_renders_the_headings_and_the_plots(page: Path, tmp_path: Path) -> None:
    dom = _Dom()
    dom.feed(_chromium("--dump-dom", page.as_uri(), profile=tmp_path / "profile").stdout)
    assert dom.tbody, "the DOM should be the browser's (it adds <tbody> to tables)"
    assert dom.headings[0].startswith("coevo report: ")
    assert [h.replace("'", "&#x27;") for h in dom.headings[1:]] == list(SECTIONS)
    assert len(dom.svgs) == 5 and min(dom.svgs) > 20, dom.svgs
    shot = tmp_path / "page.png"
    _chromium(
        f"--screenshot={shot}", "--window-size=1280,2600", page.as_uri(), profile=tmp_path / "p2"
    )
    from PIL import Image  # matplotlib's own dependency

    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 2600)
    colors = image.getcolors(maxcolors=1 << 20)
    assert colors is not None
    blue = sum(n for n, (r, g, b) in colors if abs(r - 31) + abs(g - 119) + abs(b - 180) < 40)
    ink = sum(n for n, rgb in colors if rgb != (255, 255, 255))
    assert blue > 1000, "the first run's curves (tab:blue) should be drawn"
    assert ink > 0.05 * 1280 * 2600, "the page should not be blank"


def test_run_labels_tell_runs_apart_however_deep_the_difference(tmp_path: Path) -> None:
    """Two runs ``x1/s/r`` and ``x2/s/r`` were both labelled ``s/r`` in the table and every
    legend, and ``report a a`` titled itself ``/a, /a``."""
    from scenarios.cli.report import _label

    deep = [tmp_path / "x1" / "s" / "r", tmp_path / "x2" / "s" / "r"]
    assert [_label(r, deep) for r in deep] == ["x1/s/r", "x2/s/r"]
    same = [tmp_path / "a", tmp_path / "a"]
    assert [_label(r, same) for r in same] == ["a", "a"]
    mixed = [tmp_path / "a", tmp_path / "b" / "a", tmp_path / "c"]
    assert [_label(r, mixed) for r in mixed] == [f"{tmp_path.name}/a", "b/a", "c"]


def test_names_matplotlib_reads_as_math_or_hides_are_drawn_as_written(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    """A run directory ``m$\\frac{$x`` stopped ``coevo report`` with a 45-line mathtext
    traceback (matplotlib read the pair of ``$`` as math), and one named ``_under`` had no
    legend entry (matplotlib leaves out labels starting with ``_``); an ESC in a name reached
    the SVG raw."""
    odd, hidden = tmp_path / "m$\\frac{$x\x1b", tmp_path / "_under"
    for run in (odd, hidden):
        assert main(["copy", str(runs[0]), str(run)]) == 0
    out = tmp_path / "report.html"
    assert main(["report", str(odd), str(hidden), "--out", str(out)]) == 0
    drawn = {html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", out.read_text())}
    assert {"m$\\frac{$x\\x1b", " _under", " _under, with bank"} <= drawn, sorted(drawn)


def test_a_world_s_text_on_the_page_is_escaped_as_serve_shows_it() -> None:
    """An entry's slot (its family) wrote a raw ESC and right-to-left override into the
    report's HTML, which ``coevo serve`` escapes."""
    from agents.report.page import _h  # pyright: ignore[reportPrivateUsage]

    assert _h("q\x1b[2J<b>\u202edrow\nx") == "q\\x1b[2J&lt;b&gt;\\u202edrow\nx"
