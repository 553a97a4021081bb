"""Structured logs: one JSON object per line, one line per request, never a secret or a prompt."""

from __future__ import annotations

import json
import logging
import sys
import time

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}

request_log = logging.getLogger("frontier_runtime.requests")
QUIET_LIBRARIES = ("botocore", "boto3", "s3transfer", "urllib3")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str = "info", json_logs: bool = True) -> None:
    """Route the runtime's and uvicorn's loggers to stderr, as JSON lines when ``json_logs``."""
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # botocore's debug output prints whole response bodies — a secret's value included — so the
    # AWS libraries never log below WARNING, whatever the runtime's own level.
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    # One line per request comes from the runtime itself, with ids and timings; uvicorn's
    # access log would only duplicate it.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
