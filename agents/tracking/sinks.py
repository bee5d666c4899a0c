"""Where tracked scalars go: TensorBoard event files, a Weights & Biases run in offline mode,
or an MLflow file store, each written through its own library (the ``tracking``, ``wandb`` and
``mlflow`` extras; :func:`open_sink` says which extra is missing).

Every sink takes the same :class:`~agents.tracking.scalars.Scalar` points, in the order the fold
gives them; ``write`` may block (file I/O: the tracker calls it in a worker thread).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import resource  # at import: out of descriptors, a late import of it fails too
import threading
from collections.abc import Mapping, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog

from agents.tracking.scalars import Scalar
from engine.errors import CoevoError
from stores.rundir import torn_tail

__all__ = ["SINKS", "ScalarSink", "SinkUnavailable", "open_sink"]

SinkName = Literal["tensorboard", "wandb", "mlflow"]
SINKS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tracking"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}
"""Each sink's module and the extra that installs it."""


class SinkUnavailable(CoevoError):
    """A tracking sink was asked for whose library is not installed, or whose store it cannot
    use (exit 2); unlike an ``OSError`` while writing, nothing was written."""

    exit_code = 2


class ScalarSink(Protocol):
    """A destination of scalar points (``name``: its ``[tracking] sinks`` name, if it has
    one, for the messages that name a failed sink)."""

    def write(self, points: Sequence[Scalar]) -> None:
        """Write ``points`` (may block)."""
        ...

    def close(self) -> None:
        """Flush and close; writing after it is an error."""
        ...


def open_sink(
    name: str, where: Path, run: str, config: Mapping[str, Any], *, continues: bool = False
) -> ScalarSink:
    """The sink ``name`` writing under ``where``.

    Args:
        name: "tensorboard" (event files in ``where``), "wandb" (an offline run under
            ``where``) or "mlflow" (a file store at ``where``).
        where: the sink's directory (created).
        run: the run's id (the W&B and MLflow run's name).
        config: the resolved scenario, recorded as the run's configuration where the sink
            keeps one (W&B, MLflow parameters).
        continues: a resumed run's session: W&B and MLflow continue the run an earlier
            session left in ``where`` (whatever the run directory is called now), so that its
            series goes on under one id and the earlier run is not left "running".

    Raises:
        SinkUnavailable: the sink's library is not installed, or it could not start there
            (its directory cannot be made, its library refused the store or the run).
        ValueError: ``name`` is no sink.
    """
    if name not in SINKS:
        raise ValueError(f"no tracking sink {name!r}; choose from {', '.join(SINKS)}")
    module, extra = SINKS[name]
    if importlib.util.find_spec(module) is None:
        raise SinkUnavailable(
            f"tracking sink {name!r} needs the {module} package: pip install 'coevo[{extra}]'"
        )
    try:
        where.mkdir(parents=True, exist_ok=True)
        if name == "tensorboard":
            return TensorBoardSink(where)
        if name == "wandb":
            return WandbSink(where, run, config, continues=continues)
        return MlflowSink(where, run, config, continues=continues)
    except Exception as exc:  # a path the file system refuses, a store MLflow cannot read, ...
        what = str(exc)
        if isinstance(exc, OSError) and exc.strerror:  # the file, where the error names one
            what = exc.strerror + (f" ({exc.filename})" if exc.filename else "")
        raise SinkUnavailable(
            f"tracking sink {name!r} cannot start in {where}: {type(exc).__name__}: {what}"
            + (_descriptors_spent() if isinstance(exc, ImportError) else "")
        ) from exc


def _descriptors_spent() -> str:
    """A note for an import that failed where the process has (almost) no file descriptor
    left: a library's own module then fails to load in its own words (MLflow's "cannot
    import name 'MlflowClient'"), which read as a broken install. Empty otherwise."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        used = len(os.listdir("/proc/self/fd")) - 1  # less the one listing them
    except OSError:  # no /proc: nothing to say
        return ""
    if soft == resource.RLIM_INFINITY or used < soft - 8:
        return ""
    return (
        f" (the process has {used} files open of the {soft} ulimit -n allows: too many open "
        "files is the likelier cause; raise the limit)"
    )


def written_before(name: str, where: Path, run: str) -> str:
    """What of run ``run`` sink ``name`` already holds in ``where`` ("" if nothing): a second
    export there would show every point twice (TensorBoard reads every event file of a
    directory; W&B and MLflow would hold two runs of one name)."""
    if name == "tensorboard":
        found = sorted(p.name for p in where.glob("events.out.tfevents.*"))
        return f"TensorBoard event files ({found[0]}, ...)" if found else ""
    if name == "wandb":  # offline-run-<time>-<id>; not W&B's own latest-run link
        runs = (where / "wandb").glob(f"*-{wandb_id(run)}")
        found = sorted(p.name for p in runs if p.name.startswith(("offline-run-", "run-")))
        return f"the W&B run {found[0]}" if found else ""
    for tag in where.glob("*/*/tags/mlflow.runName"):  # the file store's runs, by name
        if tag.read_text(errors="replace").strip() == run:
            return f"the MLflow run {tag.parent.parent.name} named {run!r}"
    return ""


class TensorBoardSink:
    """TensorBoard event files in ``logdir`` (``simple_value`` scalars: float32)."""

    name = "tensorboard"

    def __init__(self, logdir: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        _quiet_writer_threads()
        self._writer = EventFileWriter(str(logdir))

    def write(self, points: Sequence[Scalar]) -> None:
        # generated protobuf modules define their classes at import: no types to check
        Event = importlib.import_module("tensorboard.compat.proto.event_pb2").Event
        Summary = importlib.import_module("tensorboard.compat.proto.summary_pb2").Summary
        for p in points:
            value = Summary.Value(tag=p.tag, simple_value=p.value)
            self._writer.add_event(
                Event(wall_time=p.wall_time, step=p.step, summary=Summary(value=[value]))
            )
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _quiet_writer_threads() -> None:
    """Keep a TensorBoard writing thread's ``OSError`` (a full disk) from printing a traceback:
    the thread keeps it, and the writer raises it on this side at its next write or flush,
    where the tracker (or ``coevo export``) says it in one line."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    before = threading.excepthook
    if getattr(before, "coevo_quiet", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if isinstance(args.thread, _AsyncWriterThread) and isinstance(args.exc_value, OSError):
            return
        before(args)

    hook.coevo_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


_WANDB_ID_MAX = 200
"""Longest W&B run id kept as it is: W&B names the offline run's directory
``offline-run-YYYYMMDD_HHMMSS-<id>``, which must fit a file name (255 bytes)."""


def wandb_id(run: str) -> str:
    """A W&B run id for the run named ``run`` (its directory's name): W&B refuses an id with
    any of ``:;,#?/'`` (a directory named ``lr=1e-3,seed=7`` is common), or one starting or
    ending with whitespace (``runs/ws ``: the run refused to start), so each of those becomes
    ``-``; an id longer than 200 bytes keeps its first 191 characters and a digest of the
    whole name. The name W&B shows stays the directory's."""
    safe = re.sub(r"[:;,#?/']", "-", run)
    inner = safe.strip()
    lead = len(safe) - len(safe.lstrip())
    safe = "-" * lead + inner + "-" * (len(safe) - lead - len(inner))
    if len(safe.encode()) <= _WANDB_ID_MAX:
        return safe
    head = safe.encode()[: _WANDB_ID_MAX - 9].decode(errors="ignore")
    return f"{head}-{hashlib.sha256(run.encode(errors='surrogatepass')).hexdigest()[:8]}"


class WandbSink:
    """A Weights & Biases run in offline mode under ``where`` (``wandb sync`` uploads it).

    Each series group (``train``, ``update``, ...) gets its own step metric (``train_step``,
    ...), since W&B's own step must only grow and the groups count different things.
    """

    name = "wandb"

    def __init__(
        self, where: Path, run: str, config: Mapping[str, Any], *, continues: bool = False
    ) -> None:
        # W&B takes coevo's ``agents`` package for the OpenAI Agents SDK and suggests its
        # Weave tracing on every run; a scalar sink has no LLM calls to trace
        os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")
        import wandb

        earlier = _earlier_wandb_id(where) if continues else None
        try:
            self._run = wandb.init(
                mode="offline",
                dir=str(where),
                project="coevo",
                name=run,
                id=earlier or wandb_id(run),
                config=dict(config),
                settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
            )
        except BaseException:
            wandb.teardown()  # the service process W&B may have started for it
            raise
        self._groups: set[str] = set()

    def write(self, points: Sequence[Scalar]) -> None:
        for (group, step), same in groupby(points, key=lambda p: (p.tag.split("/")[0], p.step)):
            if group not in self._groups:
                self._run.define_metric(f"{group}_step", hidden=True)
                self._run.define_metric(f"{group}/*", step_metric=f"{group}_step")
                self._groups.add(group)
            self._run.log({f"{group}_step": step, **{p.tag: p.value for p in same}})

    def close(self) -> None:
        """Finish the run and stop W&B's service process: ``finish`` alone may return before
        the service has written the run's last records to its file."""
        import wandb

        self._run.finish()
        wandb.teardown()

    @property
    def directory(self) -> Path:
        """The offline run's directory (``wandb/offline-run-...``)."""
        return Path(self._run.dir).parent


def _earlier_wandb_id(where: Path) -> str | None:
    """The id of the latest offline W&B run under ``where`` (None if there is none), from its
    records file ``run-<id>.wandb``: W&B names the directory ``offline-run-YYYYMMDD_HHMMSS-
    <id>``, but ``...-<id>-1`` when a run of that id began there in the same second (two
    sessions of a short run), which read as the id ``<id>-1``."""
    runs = sorted(p for p in (where / "wandb").glob("offline-run-*-*") if p.is_dir())
    if not runs:
        return None
    records = sorted(runs[-1].glob("run-*.wandb"))
    if records:
        return records[0].name.removeprefix("run-").removesuffix(".wandb")
    return runs[-1].name.split("-", 3)[3]  # killed before its records file was made


class MlflowSink:
    """An MLflow run in the file store at ``where`` (experiment "coevo").

    MLflow 3 keeps its file store in maintenance mode and refuses it unless
    ``MLFLOW_ALLOW_FILE_STORE`` is true: a file store is what a run directory can hold with no
    database, so the sink sets it (unless the user set it) before MLflow reads it.
    """

    name = "mlflow"

    def __init__(
        self, where: Path, run: str, config: Mapping[str, Any], *, continues: bool = False
    ) -> None:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        # MLflow reports its use over HTTPS as it is imported (config.mlflow-telemetry.io): a
        # run's tracking is local files, offline, unless the user asks otherwise
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=where.resolve().as_uri())
        found = self._client.get_experiment_by_name("coevo")
        experiment = (
            found.experiment_id if found is not None else self._client.create_experiment("coevo")
        )
        if continues and (mended := mend_torn_metrics(where)):
            structlog.get_logger("coevo").bind(actor="tracker").warning(
                "mlflow metric files a killed session left half-written mended", files=mended
            )
        earlier = (
            self._client.search_runs([experiment], order_by=["attribute.start_time DESC"])
            if continues and found is not None
            else []
        )
        if earlier:  # an earlier session's run, "running" if it was killed: it goes on
            self.run_id: str = earlier[0].info.run_id
            self._client.update_run(self.run_id, status="RUNNING")
            return
        self.run_id = self._client.create_run(experiment, run_name=run).info.run_id
        params = _flat(config)
        for key, value in params.items():
            self._client.log_param(self.run_id, key, value[:6000])

    def write(self, points: Sequence[Scalar]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(p.tag, p.value, int(p.wall_time * 1000), p.step) for p in points]
        for i in range(0, len(metrics), 1000):  # MLflow's limit per batch
            self._client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def mend_torn_metrics(where: Path) -> int:
    """Drop what a killed session left half-written in the MLflow file store at ``where``;
    the number of metric files mended.

    The store appends one line per point to a file per metric (``<experiment>/<run>/metrics/
    <key>``, every line ending in a newline). A process killed between creating such a file and
    writing its first line leaves it empty, which MLflow refuses to read ("No data found": the
    resumed session could not continue its run); killed within a line, it leaves a torn last
    line, which MLflow refuses or, cut after its second field, reads as a point at step 0 that
    was never written. Each file keeps its whole lines; one with none is removed. A point so
    dropped was committed to the run's log before it was written (``coevo export`` writes it).
    """
    mended = 0
    for path in where.glob("*/*/metrics/**/*"):
        if not path.is_file():
            continue
        whole = torn_tail(path) if path.stat().st_size else 0
        if whole is None:
            continue
        if whole:
            os.truncate(path, whole)
        else:
            path.unlink()
        mended += 1
    return mended


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested mapping as ``a.b.c -> str(value)`` (MLflow's parameters are flat strings),
    a None left out as the run's resolved scenario leaves it out (TOML has none): the same
    parameters live and from ``coevo export`` (live tracking logged ``'None'`` strings)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        elif value is not None:
            out[f"{prefix}{key}"] = str(value)
    return out
