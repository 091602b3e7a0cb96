"""Structured logs: one JSON object per line, with the request id of the current request."""
from __future__ import annotations

import contextvars
import json
import logging
import time
from typing import Optional

from .tracing import log_ids

__all__ = ["request_id", "setup_logging", "JsonFormatter"]

request_id: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("request_id",
                                                                           default=None)
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime",
                                                                      "color_message"}


class JsonFormatter(logging.Formatter):
    """time, level, logger, message, request_id, trace_id / span_id (a traced request:
    serve.tracing) and every ``extra=`` field."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                 + f".{int(record.msecs):03d}Z", "level": record.levelname.lower(),
                 "logger": record.name, "message": record.getMessage()}
        rid = request_id.get()
        if rid is not None:
            entry["request_id"] = rid
            ids = log_ids()
            if ids is not None:
                entry.update(ids)
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD)
        rid = request_id.get()
        prefix = f"{self.formatTime(record)} {record.levelname:<7} {record.name}"
        text = f"{prefix} [{rid}] {record.getMessage()}" if rid else \
            f"{prefix} {record.getMessage()}"
        return f"{text} {extra}".rstrip()


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    """Send irpe and uvicorn logs to stderr in one format (uvicorn's access log is replaced by
    the server's own request log; OpenTelemetry's own warnings, such as a failed export, too)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else _TextFormatter())
    for name in ("irpe", "uvicorn", "uvicorn.error", "opentelemetry"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True
