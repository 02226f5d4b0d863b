"""Log lines as JSON, one object per line: what `loraloom serve` and `loraloom worker` write to stderr.

Every line has `time` (UTC, ISO 8601), `level`, `logger` and `message`; the fields a call passes
as `extra={...}` become keys of their own (`request_id`, `tenant`, `job_id`, `adapter_key`,
`slot`, ...), so a log pipeline filters on them instead of parsing messages. The engine logs its
fields the same way without importing this module: it only passes `extra`, and any formatter
shows them (this one as keys).
"""
from __future__ import annotations

import json
import logging
import sys
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
    """Send every logger's lines (uvicorn's and Celery's included) to stderr as JSON."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
