"""Structured JSON logs for every Pilotfish process.

One line per record, with the logger, level, message and any `extra=` fields, so that logs
can be filtered by pod, gate or controller without parsing prose.
"""

import datetime
import json
import logging
import sys
from typing import Any

from pilotfish.timeutil import format_micro_time

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": format_micro_time(datetime.datetime.fromtimestamp(record.created, datetime.UTC)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(level: str = "INFO") -> None:
    """Route the root logger to stderr as JSON lines; idempotent."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
