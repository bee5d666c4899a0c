"""Structured logging: JSON lines to the run directory, readable lines on the console.

Both go through structlog on top of the standard library's logging, so third-party log records
land in the same places. The console handler prints through a rich Console, so log lines appear
above a live progress bar instead of tearing it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Any

import structlog
from rich.console import Console

from stores.rundir import torn_tail

_SHARED: list[structlog.typing.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


class _RichConsoleHandler(logging.Handler):
    def __init__(self, console: Console) -> None:
        super().__init__()
        self._console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._console.print(self.format(record), markup=False, highlight=False)
        except Exception:  # a broken console must not kill the run; stdlib's policy
            self.handleError(record)


class _JsonLinesHandler(logging.FileHandler):
    """The run's JSON lines file. A write that fails (a full disk) stops the file with one
    warning on the console, where stdlib logging would print a traceback for every record.
    A resumed session appends to the file an earlier one left: one killed within a record left
    a torn last line, ended here, so the first record of this session is a line of its own
    (not glued to the torn one, one line no JSON reader can parse). A file that cannot be
    opened (its run directory moved away as the run started) stops the same way: it was a
    traceback out of the run's start."""

    def __init__(self, path: Path, console: Console) -> None:
        super().__init__(path, encoding="utf-8", delay=True)
        self._console = console
        self._failed = False
        try:
            self.stream = self._open()  # now, as before: it follows its directory if moved
        except OSError:
            self._give_up()

    def _open(self) -> Any:
        stream = super()._open()
        if _ends_torn(Path(self.baseFilename)):
            stream.write("\n")
        return stream

    def emit(self, record: logging.LogRecord) -> None:
        if not self._failed:
            super().emit(record)

    def flush(self) -> None:
        if self._failed:
            return
        try:
            super().flush()
        except OSError:
            self._give_up()

    def handleError(self, record: logging.LogRecord) -> None:
        self._give_up()

    def _give_up(self) -> None:
        """Say once why the file stops, and close it (its buffer cannot be written either)."""
        if self._failed:
            return
        self._failed = True
        error = sys.exc_info()[1]
        with contextlib.suppress(OSError):  # the failure being reported, once more
            super().close()
        self._console.print(
            f"coevo: warning: {self.baseFilename}: cannot write ({error}); the structured "
            "log stops here (the event log is not affected)",
            markup=False,
            highlight=False,
        )


def _too_long_note(record: logging.LogRecord) -> bool:
    """Drop a tokenizer's note that a text is longer than its model's positions ("Token indices
    sequence length is longer than ... will result in indexing errors"), printed raw on the
    console when a world's action or observation was long: coevo cuts what it gives a model to
    its positions itself (``agents.models.prompts``), so no such index is ever used."""
    return not str(record.msg).startswith("Token indices sequence length is longer")


def _ends_torn(path: Path) -> bool:
    """Whether the regular file at ``path`` ends with something other than a newline."""
    with contextlib.suppress(OSError):
        return path.is_file() and torn_tail(path) is not None
    return False


def in_colour(console: Console) -> bool:
    """Whether log lines are coloured: on a terminal that shows colour, unless ``NO_COLOR`` is
    set (rich's tables already honour both; the log lines coloured on regardless)."""
    return console.is_terminal and console.color_system is not None and not console.no_color


def configure_logging(console: Console, level: str, jsonl: Path | None = None) -> None:
    """Route structlog and stdlib logging to ``console`` (at ``level``) and ``jsonl`` (all).

    Args:
        console: where readable lines go.
        level: console level name ("debug", "info", "warning", "error").
        jsonl: file for JSON lines, or None for console only.
    """
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    # a handler that cannot write (a library's log file on a full disk: W&B's) is silent,
    # not a "--- Logging error ---" traceback on stderr for every record (hundreds of lines)
    logging.raiseExceptions = False
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.DEBUG)
    torch_log = logging.getLogger("torch")  # torch sets it when its import completes; one
    if torch_log.level == logging.NOTSET:  # stopped half-way left its exit hooks' info lines
        torch_log.setLevel(logging.WARNING)
    plots_log = logging.getLogger("matplotlib")  # its notes on a HOME it cannot write to (8
    if plots_log.level == logging.NOTSET:  # lines per report) are about matplotlib's cache,
        plots_log.setLevel(logging.ERROR)  # not about coevo's output: the plots are written
    logging.getLogger("transformers.tokenization_utils_base").addFilter(_too_long_note)
    con = _RichConsoleHandler(console)
    con.setLevel(level.upper())
    con.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.dev.ConsoleRenderer(colors=in_colour(console)),
            ],
            foreign_pre_chain=_SHARED,
        )
    )
    root.addHandler(con)
    if jsonl is not None:
        fh = _JsonLinesHandler(jsonl, console)
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.JSONRenderer(),
                ],
                foreign_pre_chain=_SHARED,
            )
        )
        root.addHandler(fh)


def close_logging() -> None:
    """Flush and detach every handler (the run directory's file is closed). What is logged
    after (a library's thread still stopping) goes nowhere: with no handler at all, the
    first module-level ``logging.info`` would set up a stderr handler at the root's level,
    DEBUG, and print after the run's last line."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        handler.flush()
        root.removeHandler(handler)
        handler.close()
    root.addHandler(logging.NullHandler())
