"""Log lines as JSON, one object per line: what `loraloom serve` and `loraloom worker` write to stderr.

Every line has `time` (UTC, ISO 8601), `level`, `logger` and `message`; the fields a call passes
as `extra={...}` become keys of their own (`request_id`, `tenant`, `job_id`, `adapter_key`,
`slot`, ...), so a log pipeline filters on them instead of parsing messages. The engine logs its
fields the same way without importing this module: it only passes `extra`, and any formatter
shows them (this one as keys).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
from datetime import datetime, timezone

# The attributes every LogRecord has; anything else on a record came from `extra`. uvicorn passes
# `color_message`, the message again with terminal colour codes, which a JSON line has no use for.
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName", "color_message"}


def extra_fields(record: logging.LogRecord) -> dict[str, object]:
    """The fields a log call passed as `extra`."""
    return {name: value for name, value in vars(record).items() if name not in _RECORD_ATTRIBUTES}


class JsonLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **extra_fields(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        # default=str: UUIDs, datetimes and paths are written as their text rather than failing the line.
        return json.dumps(line, default=str, ensure_ascii=False)


def configure_logging(level: int | str) -> None:
    """Send every logger's lines (uvicorn's and Celery's included) to stderr as JSON, Python's
    warnings among them (a library's DeprecationWarning, Celery's SecurityWarning), which the
    warnings module would otherwise print as plain text."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.captureWarnings(True)


def stdout_as_log_lines(logger_name: str) -> None:
    """Make whatever is written to this process's standard output (file descriptor 1) a JSON log line
    of `logger_name`, one per non-empty line, from now on. For libraries that write there directly,
    past sys.stdout: Celery's worker announces its shutdown with os.write to the original stdout.
    The children the process forks inherit the redirection, and their writes arrive here too."""
    read_end, write_end = os.pipe()
    os.dup2(write_end, 1)
    os.close(write_end)
    logger = logging.getLogger(logger_name)

    def forward() -> None:
        with os.fdopen(read_end, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if line.strip():
                    logger.info(line.rstrip("\n"))

    thread = threading.Thread(target=forward, name="stdout-to-log", daemon=True)
    thread.start()

    def drain() -> None:  # at exit: the last lines written (a shutdown message) still reach the log
        sys.stdout.flush()
        os.close(1)
        thread.join(timeout=2)

    atexit.register(drain)
