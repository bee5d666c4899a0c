"""The run's structured log on a full disk: one warning, never a traceback per record."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
from rich.console import Console

from scenarios.cli.logsetup import close_logging, configure_logging

FULL = Path("/dev/full")  # every write fails with ENOSPC


@pytest.mark.skipif(not FULL.exists(), reason="no /dev/full")
def test_a_jsonl_file_that_cannot_be_written_stops_with_one_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging(Console(stderr=True, width=400), "error", FULL)
    try:
        log = structlog.get_logger("coevo")
        for i in range(5):
            log.info("turn", i=i)
    finally:
        close_logging()
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Logging error" not in err, err
    assert err == (
        "coevo: warning: /dev/full: cannot write ([Errno 28] No space left on device); the "
        "structured log stops here (the event log is not affected)\n"
    )


def test_a_library_handler_that_cannot_write_is_silent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """W&B's own log file on a full disk: Python's logging printed "--- Logging error ---"
    and a traceback for every record (hundreds of lines before coevo's one)."""
    import logging

    class Full(logging.Handler):  # as logging.FileHandler fails: handleError
        def emit(self, record: logging.LogRecord) -> None:
            try:
                raise OSError(28, "No space left on device")
            except OSError:
                self.handleError(record)

    configure_logging(Console(stderr=True, width=400), "error", None)
    lib = logging.getLogger("wandb.like")
    handler = Full()
    lib.addHandler(handler)
    try:
        for i in range(3):
            lib.warning("record %d", i)
    finally:
        lib.removeHandler(handler)
        close_logging()
    err = capsys.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err, err


def test_nothing_logged_after_the_log_is_closed_reaches_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A library's thread still stopping after the run's last line (py4j's, as a ScienceWorld
    run stops) logs through the module-level ``logging.info``: with no handler left, that
    set up a stderr handler at the root's DEBUG level and printed raw lines and tracebacks."""
    import logging

    configure_logging(Console(stderr=True, width=400), "error", None)
    close_logging()
    try:
        logging.info("Exception while sending command.")
        logging.getLogger("py4j.java_gateway").error("An error occurred", exc_info=True)
        assert capsys.readouterr().err == ""
    finally:
        logging.getLogger().handlers.clear()


def test_a_torn_last_line_a_killed_session_left_is_not_glued_to_the_next_record(
    tmp_path: Path,
) -> None:
    import json

    jsonl = tmp_path / "coevo.jsonl"
    jsonl.write_text('{"event": "whole"}\n{"event": "to')  # killed within its second record
    configure_logging(Console(stderr=True, width=400), "error", jsonl)
    try:
        structlog.get_logger("coevo").info("resumed")
    finally:
        close_logging()
    lines = jsonl.read_text().splitlines()
    assert lines[:2] == ['{"event": "whole"}', '{"event": "to']
    assert [json.loads(line)["event"] for line in lines[2:]] == ["resumed"]
    configure_logging(Console(stderr=True, width=400), "error", jsonl)  # whole: nothing added
    close_logging()
    assert jsonl.read_text().count("\n") == 3


def test_a_tokenizers_note_on_a_long_text_is_not_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """coevo cuts prompts to the model's positions itself: transformers' note that a text is
    longer than them (a world's long action) printed raw on the console."""
    from agents.testing.models import tiny_tokenizer

    configure_logging(Console(stderr=True, width=400), "warning", None)
    try:
        tokenizer = tiny_tokenizer(["go"])
        tokenizer.model_max_length = 8
        assert len(tokenizer.encode("go " * 40, add_special_tokens=False)) > 8
    finally:
        close_logging()
    assert "Token indices" not in capsys.readouterr().err


def test_a_jsonl_file_that_cannot_be_opened_stops_with_one_warning(tmp_path) -> None:
    """A run whose directory was moved away as its logging started: opening coevo.jsonl was a
    traceback out of the run's start (seen once in CI, in the moved-directory fault test)."""
    import logging

    from rich.console import Console

    from scenarios.cli.logsetup import _JsonLinesHandler

    console = Console(record=True, width=200)
    handler = _JsonLinesHandler(tmp_path / "gone" / "coevo.jsonl", console)
    record = logging.LogRecord("coevo", logging.INFO, __file__, 1, "hello", None, None)
    handler.emit(record)
    handler.emit(record)  # once said, the file stays stopped
    said = console.export_text()
    assert said.count("cannot write") == 1 and "the structured log stops here" in said
    handler.close()


def test_log_lines_are_plain_where_colour_is_not_wanted(monkeypatch: pytest.MonkeyPatch) -> None:
    """``NO_COLOR`` and ``TERM=dumb`` left the log lines coloured (rich's tables honoured them)."""
    from rich.console import Console

    from scenarios.cli.logsetup import in_colour

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert in_colour(Console(force_terminal=True))
    monkeypatch.setenv("NO_COLOR", "1")
    assert not in_colour(Console(force_terminal=True))
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not in_colour(Console(force_terminal=True))
    monkeypatch.setenv("TERM", "xterm-256color")
    assert not in_colour(Console(force_terminal=False))
