"""Live tracking and ``coevo export``: the tiny Complementary RL run (conftest.py) was tracked
live to every installed sink; its TensorBoard, W&B and MLflow series must equal the series
``coevo export`` writes from the finished log, and the values folded from the log's events."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import struct
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from agents.tracking.scalars import Scalar, fold_scalars
from scenarios.cli import main
from stores.lmdb_log import LmdbEventLog

Series = dict[str, list[tuple[int, float]]]
needs = {
    name: pytest.mark.skipif(
        importlib.util.find_spec(name) is None, reason=f"the {name} extra is not installed"
    )
    for name in ("tensorboard", "wandb", "mlflow")
}


def _wandb_id_of(offline_run: Path) -> str:
    """The W&B id of an offline run directory, from its records file ``run-<id>.wandb`` (its
    directory's name ends ``-<id>-1`` when a run of that id began there in the same second)."""
    (records,) = offline_run.glob("run-*.wandb")
    return records.name.removeprefix("run-").removesuffix(".wandb")


def _folded(run: Path) -> list[Scalar]:
    log = LmdbEventLog.open(run / "log", writable=False)
    try:
        return fold_scalars(log.read(0, None), block=4)
    finally:
        log.close()


def _series(points: list[Scalar], cast: type = float) -> Series:
    out: Series = defaultdict(list)
    for p in points:
        out[p.tag].append((p.step, cast(p.value)))
    return dict(out)


def _tensorboard(logdir: Path) -> tuple[Series, dict[str, list[float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    series = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags}
    walls = {t: [e.wall_time for e in acc.Scalars(t)] for t in tags}
    return series, walls


@pytest.fixture(scope="module")
def run(distill_root: Path) -> Path:
    return distill_root / "run"


@pytest.fixture(scope="module")
def folded(run: Path) -> list[Scalar]:
    return _folded(run)


def test_the_fold_covers_learning_memory_credit_and_throughput(folded: list[Scalar]) -> None:
    tags = {p.tag for p in folded}
    for tag in (
        "train/success",
        "train/return",
        "heldout/success",
        "update/loss",
        "update/kl",
        "update/clip_frac",
        "update/grad_norm",
        "bank/size",
        "bank/stored",
        "retrieval/count",
        "credit/mean",
        "extractor/loss",
        "extractor/reward",
        "throughput/episodes_per_s",
    ):
        assert tag in tags, tag
    train = [p for p in folded if p.tag == "train/success"]
    assert [p.step for p in train] == [4, 8, 12, 16, 20, 24, 28, 32]  # blocks of 4 of 32


@needs["tensorboard"]
def test_live_tensorboard_equals_export_and_the_fold(
    run: Path, folded: list[Scalar], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live, live_walls = _tensorboard(run / "tracking" / "tensorboard")
    assert main(["export", str(run), "--tensorboard", str(tmp_path / "tb")]) == 0
    assert capsys.readouterr().out.startswith(f"tensorboard: {len(folded)} points of ")
    exported, exported_walls = _tensorboard(tmp_path / "tb")
    assert live == exported
    assert live_walls == exported_walls
    f32 = lambda v: float(np.float32(v))  # noqa: E731 - TensorBoard's simple_value is float32
    assert live == _series(folded, f32)


@needs["mlflow"]
def test_live_mlflow_equals_export_and_the_fold(
    run: Path, folded: list[Scalar], tmp_path: Path
) -> None:
    def history(store: Path) -> Series:
        import os

        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=store.resolve().as_uri())
        experiment = client.get_experiment_by_name("coevo")
        assert experiment is not None
        (found,) = client.search_runs([experiment.experiment_id])
        keys = found.data.metrics.keys()
        return {
            k: [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, k)]
            for k in keys
        }

    assert main(["export", str(run), "--mlflow", str(tmp_path / "mlruns")]) == 0
    live = history(run / "tracking" / "mlruns")
    assert live == history(tmp_path / "mlruns")
    assert live == _series(folded)  # exact: MLflow keeps doubles


def _wandb_history(where: Path) -> Series:
    """The history rows of the one offline W&B run under ``where``, read from its ``.wandb``
    file (LevelDB's log format: 32 KiB blocks of chunks with a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = where.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data.startswith(b":W&B")
    out: Series = defaultdict(list)
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (n == 0 and kind == 0):
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                row = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
                steps = {k.removesuffix("_step"): v for k, v in row.items() if k.endswith("_step")}
                for key, value in row.items():
                    if "/" in key:
                        out[key].append((steps[key.split("/")[0]], value))
    return dict(out)


@needs["wandb"]
def test_live_wandb_equals_export_and_the_fold(
    run: Path, folded: list[Scalar], tmp_path: Path
) -> None:
    assert main(["export", str(run), "--wandb", str(tmp_path / "wandb")]) == 0
    live = _wandb_history(run / "tracking" / "wandb")
    assert live == _wandb_history(tmp_path / "wandb")
    assert live == _series(folded)


@needs["wandb"]
def test_a_run_directory_named_with_characters_wandb_refuses_exports(
    run: Path, folded: list[Scalar], tmp_path: Path
) -> None:
    """W&B refuses a run id with any of ``:;,#?/'``: a run directory named ``lr=1e-3,seed:7``
    was a traceback (and a live run with the sink left a log no resume could open)."""
    import shutil

    named = tmp_path / "lr=1e-3,seed:7#a"
    shutil.copytree(run, named)
    assert main(["export", str(named), "--wandb", str(tmp_path / "wandb")]) == 0
    assert _wandb_history(tmp_path / "wandb") == _series(folded)


@needs["wandb"]
def test_wandb_does_not_advertise_weave(run: Path, tmp_path: Path) -> None:
    """W&B took coevo's ``agents`` package for the OpenAI Agents SDK and printed three lines
    suggesting its Weave tracing on every export and tracked run (a process of its own: W&B
    prints them once per process, and not under pytest's capture)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    done = subprocess.run(
        [sys.executable, "-m", "scenarios.cli", "export", str(run), "--wandb", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False, env=env,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Weave" not in done.stderr and "Detected [" not in done.stderr, done.stderr


def test_a_second_export_into_the_same_directory_is_refused(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exporting twice into one directory wrote the points twice (TensorBoard reads every
    event file of a directory; MLflow held two runs of one name), without a word."""
    sinks = ["tensorboard"] + (["mlflow"] if importlib.util.find_spec("mlflow") else [])
    for sink in sinks:
        where = tmp_path / sink
        assert main(["export", str(run), f"--{sink}", str(where)]) == 0
        before = sorted(p.relative_to(where) for p in where.rglob("*"))
        capsys.readouterr()
        assert main(["export", str(run), f"--{sink}", str(where)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"coevo: error: --{sink} {where}: already holds ") and (
            "show its points twice" in err
        )
        assert sorted(p.relative_to(where) for p in where.rglob("*")) == before


def test_w_and_bs_latest_run_link_is_not_taken_for_a_run_named_run(tmp_path: Path) -> None:
    """A run whose directory is named ``run`` could be exported into no W&B directory that
    held any run: ``*-run`` matched W&B's own ``latest-run`` link."""
    from agents.tracking.sinks import written_before

    held = tmp_path / "wandb" / "offline-run-20261206_010203-other"
    held.mkdir(parents=True)
    (tmp_path / "wandb" / "latest-run").symlink_to(held)
    assert written_before("wandb", tmp_path, "run") == ""
    assert written_before("wandb", tmp_path, "other") == f"the W&B run {held.name}"


def test_a_second_export_into_the_same_directory_at_once_is_refused(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two exports into one directory at once both passed the "holds no export yet" check
    and both wrote: every point twice. The first holds the directory while it writes; the
    other is refused in one line and touches nothing."""
    from agents.tracking import sinks

    where, second = tmp_path / "tb", []
    real = sinks.written_before

    def checked(sink: str, at: Path, run_name: str) -> str:
        held = real(sink, at, run_name)
        if not second:  # the other export runs whole after this one's check
            second.append(-1)
            second[0] = main(["export", str(run), "--tensorboard", str(where)])
            second.append(capsys.readouterr().err)
        return held

    monkeypatch.setattr(sinks, "written_before", checked)
    assert main(["export", str(run), "--tensorboard", str(where)]) == 0
    assert second[0] == 2 and second[1].count("\n") == 1, second
    assert "another coevo export is writing into it now" in second[1], second
    assert len(list(where.rglob("events.out.tfevents.*"))) == 1
    both = tmp_path / "both"  # two sinks of one export in one directory: one claim
    args = ["export", str(run), "--tensorboard", str(both), "--mlflow", f"{both}/"]
    if importlib.util.find_spec("mlflow"):
        assert main(args) == 0, capsys.readouterr().err


def test_an_export_stopped_part_way_leaves_nothing_and_runs_again(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C or SIGTERM during an export left the sinks it had finished and part of the
    one it was writing, and the re-run was refused ("already holds ..."): a stopped export
    now removes what it wrote, and what the directory held before stays."""
    from agents.tracking import sinks

    sinks_now = ["tensorboard"] + (["mlflow"] if importlib.util.find_spec("mlflow") else [])
    where = {s: tmp_path / s for s in sinks_now}
    where["tensorboard"].mkdir()
    (where["tensorboard"] / "notes.txt").write_text("mine\n")  # held before: stays
    args = ["export", str(run), *(a for s in sinks_now for a in (f"--{s}", str(where[s])))]
    last = sinks_now[-1]
    cls = sinks.MlflowSink if last == "mlflow" else sinks.TensorBoardSink
    written = cls.write

    def stopped(self, points) -> None:  # the last sink is stopped after writing part
        written(self, points[: len(points) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(cls, "write", stopped)
    sigint = signal.getsignal(signal.SIGINT)
    assert main(args) == 130  # "coevo: interrupted"
    # and a program that called main goes on with its Ctrl-C: SIGINT was left ignored (the
    # process exits after a stop), and a later test's Ctrl-C and trio's KI handling with it
    assert signal.getsignal(signal.SIGINT) is sigint is not signal.SIG_IGN
    assert [p.name for p in where["tensorboard"].iterdir()] == ["notes.txt"]
    if "mlflow" in where:
        assert not where["mlflow"].exists()  # it made the directory: it goes too
    monkeypatch.undo()
    assert all(sinks.written_before(s, where[s], run.name) == "" for s in sinks_now)
    assert main(["export", str(run), "--tensorboard", str(where["tensorboard"])]) == 0


def test_an_export_stopped_while_it_reads_leaves_no_directory(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C while the log was read (seconds on a long run) left the directories the
    export had claimed, empty."""
    from agents.tracking import scalars

    def stopped(*args: object, **kwargs: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(scalars, "fold_scalars", stopped)
    assert main(["export", str(run), "--tensorboard", str(tmp_path / "tb")]) == 130
    assert not (tmp_path / "tb").exists()


def test_a_stopped_exports_writer_thread_is_closed_before_its_files_go(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorBoard's writer appends from a thread of its own, reopening its file by path: a
    Ctrl-C during an export removed the file with that thread still running, which made it
    again (536 bytes of a 9.8 MB export on a 2M-event run), and the re-run was refused. The
    sink is closed before what it wrote is removed."""
    import threading

    from agents.tracking import sinks

    target = tmp_path / "tb"

    class Threaded:
        """Writes its file late from a thread, as TensorBoard's writer does, unless closed."""

        def __init__(self, where: Path) -> None:
            where.mkdir(parents=True, exist_ok=True)
            self.file, self.stop = where / "events.out.tfevents.1", threading.Event()
            self.thread = threading.Thread(target=self._later)

        def _later(self) -> None:
            if not self.stop.wait(0.5):  # (its directory made again, as TensorBoard's is)
                self.file.parent.mkdir(parents=True, exist_ok=True)
                self.file.write_bytes(b"late")

        def write(self, points: object) -> None:
            self.file.write_bytes(b"part")
            self.thread.start()
            raise KeyboardInterrupt

        def close(self) -> None:
            self.stop.set()
            self.thread.join()

    monkeypatch.setattr(sinks, "open_sink", lambda name, where, *_: Threaded(where))
    assert main(["export", str(run), "--tensorboard", str(target)]) == 130
    time.sleep(1.0)  # the thread's own write, had it been left running
    assert not target.exists() or not any(target.iterdir())


@needs["mlflow"]
def test_an_mlflow_store_mlflow_cannot_read_is_one_line(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "store" / "0").mkdir(parents=True)
    (tmp_path / "store" / "0" / "meta.yaml").write_text("hi\n")  # not a mapping
    assert main(["export", str(run), "--mlflow", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coevo: error: tracking sink 'mlflow' cannot start in ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("spent", [False, True])
def test_a_sink_whose_library_fails_to_import_out_of_descriptors_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spent: bool
) -> None:
    """Out of file descriptors, MLflow's own import failed in its words ("cannot import name
    'MlflowClient'"), which read as a broken install: the likelier cause is named when the
    process has (almost) no descriptor left, and only then."""
    import resource

    from agents.tracking import sinks

    def broken(*args: object, **kwargs: object) -> None:
        raise ImportError("cannot import name 'MlflowClient' from 'mlflow.tracking'")

    listdir = os.listdir
    used = 31 if spent else 3  # with the one that lists them
    monkeypatch.setattr(sinks, "TensorBoardSink", broken)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (32, 32))
    monkeypatch.setattr(
        os, "listdir", lambda p: ["x"] * used if p == "/proc/self/fd" else listdir(p)
    )
    with pytest.raises(sinks.SinkUnavailable) as refused:
        sinks.open_sink("tensorboard", tmp_path / "tb", "r", {})
    said = str(refused.value)
    assert "cannot import name 'MlflowClient'" in said
    hint = "(the process has 30 files open of the 32 ulimit -n allows: too many open files"
    assert (hint in said) == spent, said


def test_export_needs_a_target_and_a_run(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(run)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "coevo: error: export needs a target: --tensorboard DIR, --wandb DIR or --mlflow DIR\n"
    )
    assert main(["export", str(tmp_path), "--tensorboard", str(tmp_path / "tb")]) == 2
    err = capsys.readouterr().err
    assert err == f"coevo: error: {tmp_path}: not a coevo run directory (no log/data.mdb inside)\n"
    (tmp_path / "notes.toml").write_text("x")  # said only "cannot write: File exists"
    assert main(["export", str(run), "--tensorboard", str(tmp_path / "notes.toml")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"coevo: error: --tensorboard {tmp_path / 'notes.toml'}: a file, not a directory for "
        "the export\n"
    )
    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b"/tb\xffx")  # its writer: a traceback's
    assert main(["export", str(run), "--tensorboard", odd]) == 2  # UnicodeEncodeError line
    err = capsys.readouterr().err
    assert "tb\\xffx': a path that holds bytes that are not UTF-8, which the tensorboard" in err
    assert not os.path.lexists(odd)


EXPLORE = str(Path(__file__).resolve().parents[2] / "scenarios" / "explore.toml")


@needs["tensorboard"]
def test_a_sink_that_cannot_start_leaves_no_run_and_a_resume_can_go_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sink that failed as the run started (W&B given a run directory name too long for its
    own directory) was a traceback, and left a log of no event that ``resume`` could not
    continue either (it started the same sink): a new run leaves nothing behind, and a
    resume may go on without live tracking."""
    from agents.tracking import sinks

    def refuse(self: object, logdir: Path) -> None:
        raise OSError(36, "File name too long", str(logdir / ("x" * 300)))

    monkeypatch.setattr(sinks.TensorBoardSink, "__init__", refuse)
    out = tmp_path / "run"
    args = ["run", EXPLORE, "--out", str(out), "--quiet", "--set", "run.episodes=8"]
    assert main([*args, "--set", 'tracking.sinks=["tensorboard"]']) == 2
    err = capsys.readouterr().err
    assert err.startswith("coevo: error: tracking sink 'tensorboard' cannot start in ")
    assert "OSError: File name too long" in err and err.count("\n") == 1
    assert f"nothing ran, and {out} is left as it was" in err
    nameless = OSError(28, "No space left on device")  # a full disk names no file
    monkeypatch.setattr(sinks.TensorBoardSink, "__init__", lambda self, logdir: _raise(nameless))
    assert main([*args, "--set", 'tracking.sinks=["tensorboard"]']) == 2
    err = capsys.readouterr().err
    assert "OSError: No space left on device;" in err and "(None)" not in err, err
    monkeypatch.setattr(sinks.TensorBoardSink, "__init__", refuse)
    assert not out.exists()
    out.mkdir()  # an empty directory given as --out stays, empty
    assert main([*args, "--set", 'tracking.sinks=["tensorboard"]']) == 2
    assert list(out.iterdir()) == []
    capsys.readouterr()

    # a run stopped before its first event (as a kill would leave it), resumed with the sink
    monkeypatch.undo()
    assert main([*args, "--set", 'tracking.sinks=["tensorboard"]', "--set", "run.episodes=4"]) == 0
    with LmdbEventLog.open(out / "log") as log:  # its events dropped: a kill at its start
        meta = log.read_meta()
    shutil.rmtree(out)
    with LmdbEventLog.create(out / "log", meta) as log:
        pass
    monkeypatch.setattr(sinks.TensorBoardSink, "__init__", refuse)
    assert main(["resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"nothing was written: `coevo resume {out} --no-tracking` continues" in err
    assert err.count("\n") == 1
    assert main(["resume", str(out), "--quiet", "--no-tracking"]) == 0
    assert main(["replay", str(out), "--verify"]) == 0
    assert not [p for p in (out / "tracking").rglob("*") if p.is_file()]  # nothing tracked


@needs["tensorboard"]
@needs["mlflow"]
def test_a_resume_refused_by_one_sink_takes_back_what_the_others_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """MLflow could not start on a resume: it said "nothing was written", and TensorBoard's
    new event file (and W&B's offline run, which `wandb sync` would upload) stayed."""
    from agents.tracking import sinks

    out = tmp_path / "run"
    two = 'tracking.sinks=["tensorboard", "mlflow"]'
    args = ["run", EXPLORE, "--out", str(out), "--quiet", "--set", "run.episodes=4"]
    assert main([*args, "--set", two]) == 0
    with LmdbEventLog.open(out / "log") as log:  # a session killed at its start, as above
        meta = log.read_meta()
    shutil.rmtree(out / "log")
    with LmdbEventLog.create(out / "log", meta) as log:
        pass
    before = sorted((out / "tracking").rglob("*"))

    def refuse(self: object, *args: object, **kw: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sinks.MlflowSink, "__init__", refuse)
    capsys.readouterr()
    assert main(["resume", str(out), "--quiet"]) == 2
    assert "nothing was written" in capsys.readouterr().err
    assert sorted((out / "tracking").rglob("*")) == before


def test_the_wandb_run_a_session_continues_is_read_from_its_records_file(tmp_path: Path) -> None:
    """Two sessions of a short run began within one second (CI): W&B named the second's
    directory ``offline-run-<time>-run-1``, whose name read as the id ``run-1``, and the next
    session would have continued a series of that id."""
    from agents.tracking.sinks import _earlier_wandb_id

    for name in ("offline-run-20261205_111437-run", "offline-run-20261205_111437-run-1"):
        (tmp_path / "wandb" / name).mkdir(parents=True)
        (tmp_path / "wandb" / name / "run-run.wandb").write_bytes(b"")
    assert _earlier_wandb_id(tmp_path) == "run"
    (tmp_path / "wandb" / "offline-run-20261205_111440-other").mkdir()  # killed before its file
    assert _earlier_wandb_id(tmp_path) == "other"


def test_a_wandb_id_fits_the_directory_wandb_names_after_it() -> None:
    from agents.tracking.sinks import wandb_id

    assert wandb_id("lr=1e-3,seed:7") == "lr=1e-3-seed-7"
    assert wandb_id("r" * 200) == "r" * 200  # as it was: a resumed run keeps its series
    long = wandb_id("r" * 240)
    assert len(long) == 200 and long.startswith("r" * 191 + "-")
    assert long != wandb_id("r" * 241)
    assert len(wandb_id("é" * 150).encode()) <= 200
    # W&B refuses an id that starts or ends with whitespace: a directory "runs/ws " did not run
    assert [wandb_id(n) for n in ("ws ", "\tnl\n", "a b", "  ")] == ["ws-", "-nl-", "a b", "--"]


@needs["mlflow"]
@needs["wandb"]
def test_a_tracked_run_killed_renamed_and_resumed_goes_on_in_one_wandb_and_mlflow_run(
    tmp_path: Path,
) -> None:
    """A tracked run killed and resumed left its first MLflow run "RUNNING" for good beside a
    second one, and after its directory was renamed, continued its W&B series under another
    id: a resumed session continues the run the earlier one left."""
    import signal

    import yaml
    from resume_kit import coevo, finish, read_log, stop_at

    first, renamed = tmp_path / "first", tmp_path / "renamed"
    tracked = 'tracking.sinks=["wandb", "mlflow"]'
    args = ["run", EXPLORE, "--out", str(first), "--quiet", "--set", "run.episodes=300"]
    code = stop_at(coevo([*args, "--set", tracked], tmp_path), first, 600, signal.SIGKILL)
    assert code == -signal.SIGKILL
    first.rename(renamed)
    finish(coevo(["resume", str(renamed), "--quiet"], tmp_path))
    assert read_log(renamed)[-1].event.reason == "completed"  # type: ignore[attr-defined]

    runs = sorted((renamed / "tracking" / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and {_wandb_id_of(r) for r in runs} == {"first"}
    metas = list((renamed / "tracking" / "mlruns").glob("*/*/meta.yaml"))
    assert len(metas) == 1  # one MLflow run, finished
    assert yaml.safe_load(metas[0].read_text())["status"] == 3  # RunStatus.FINISHED


@needs["mlflow"]
@needs["wandb"]
def test_a_session_killed_before_its_first_event_is_continued_in_the_same_tracked_runs(
    tmp_path: Path,
) -> None:
    """A session killed after its sinks opened but before its first commit leaves a log of no
    event beside an MLflow and a W&B run: its resume, with no history to fold, opened second
    runs of the same name beside them (the first MLflow run "running" for good)."""
    import yaml

    out = tmp_path / "run"
    tracked = 'tracking.sinks=["wandb", "mlflow"]'
    args = ["run", EXPLORE, "--out", str(out), "--quiet", "--set", "run.episodes=4"]
    assert main([*args, "--set", tracked]) == 0
    with LmdbEventLog.open(out / "log") as log:
        meta = log.read_meta()
    shutil.rmtree(out / "log")
    with LmdbEventLog.create(out / "log", meta):  # the log as such a kill leaves it
        pass
    assert main(["resume", str(out), "--quiet"]) == 0
    metas = list((out / "tracking" / "mlruns").glob("*/*/meta.yaml"))
    assert len(metas) == 1
    assert yaml.safe_load(metas[0].read_text())["status"] == 3  # RunStatus.FINISHED
    runs = sorted((out / "tracking" / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and len({_wandb_id_of(r) for r in runs}) == 1


@needs["mlflow"]
def test_the_mlflow_sink_sends_no_telemetry(tmp_path: Path) -> None:
    """MLflow reports its use over HTTPS when it is imported (seen in a run's log file); a
    run's tracking is offline. Outside pytest and CI, where MLflow turns it off itself."""
    import os
    import subprocess

    code = (
        "import pathlib; from agents.tracking.sinks import open_sink; "
        f"open_sink('mlflow', pathlib.Path({str(tmp_path / 'mlruns')!r}), 'r', {{}}); "
        "from mlflow.telemetry.utils import is_telemetry_disabled; "
        "print(is_telemetry_disabled())"
    )
    quiet = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "MLFLOW_DISABLE_TELEMETRY")
    env = {k: v for k, v in os.environ.items() if k not in quiet and "DO_NOT_TRACK" not in k}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


@needs["mlflow"]
def test_a_resumed_session_continues_an_mlflow_run_whose_metric_files_a_kill_tore(
    tmp_path: Path,
) -> None:
    """A session killed while MLflow appended a point can leave a metric file empty (created,
    its line not yet written) or with a torn last line. The resumed session's sink could not
    start ("Metric 'train/aborted' is malformed. No data found.", seen in CI), and a line torn
    after its second field reads as a point at step 0 that was never written."""
    from mlflow.tracking import MlflowClient

    from agents.tracking.sinks import MlflowSink, open_sink

    store = tmp_path / "mlruns"
    first = open_sink("mlflow", store, "r", {}, continues=False)
    first.write([Scalar("train/success", 1, 0.5, 1.0), Scalar("train/return", 1, 2.0, 1.0)])
    assert isinstance(first, MlflowSink)
    (metrics,) = store.glob("*/*/metrics")
    (metrics / "train" / "aborted").write_text("")
    with (metrics / "train" / "return").open("a") as f:
        f.write("1000 3.0")

    again = open_sink("mlflow", store, "r", {}, continues=True)
    assert isinstance(again, MlflowSink) and again.run_id == first.run_id
    again.write([Scalar("train/return", 2, 4.0, 2.0)])
    again.close()
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    history = client.get_metric_history(first.run_id, "train/return")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 4.0)]
    assert not (metrics / "train" / "aborted").exists()
    assert [
        (m.step, m.value) for m in client.get_metric_history(first.run_id, "train/success")
    ] == [(1, 0.5)]


ROOT = Path(__file__).resolve().parents[2]
COEVO = str(Path(sys.executable).parent / "coevo")
EXPLORE = str(ROOT / "scenarios" / "explore.toml")


def test_a_full_disk_under_tensorboard_is_no_thread_traceback(tmp_path: Path) -> None:
    """TensorBoard writes from a thread of its own: a full disk printed that thread's
    traceback ("Exception in thread ...") beside the one line that says it. A file-size
    limit fails its writes here as a full disk does."""
    import resource
    import subprocess

    run = tmp_path / "run"
    args = ("--quiet", "--set", "run.episodes=512")
    made = subprocess.run(
        [COEVO, "run", EXPLORE, "--out", str(run), *args], capture_output=True, check=False
    )
    assert made.returncode == 0, made.stderr

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    proc = subprocess.run(
        [COEVO, "export", str(run), "--tensorboard", str(tmp_path / "tb")],
        capture_output=True, text=True, check=False, preexec_fn=small_files,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"coevo: error: {tmp_path / 'tb'}: cannot write: File too large\n"


def _raise(exc: BaseException) -> None:
    raise exc
