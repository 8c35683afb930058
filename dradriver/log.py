"""Structured logging: one line per event, ``key=value`` fields (logfmt) or JSON.

Every component logs through :func:`get_logger` so that fields such as
``claim=ns/name`` or ``device=dev-0`` can be grepped and parsed the same way.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

_FORMAT_ENV = "DRADRIVER_LOG_FORMAT"


def _quote(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\n'):
        return json.dumps(text)
    return text


class _Formatter(logging.Formatter):
    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self._as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        base = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            base["error"] = self.formatException(record.exc_info)
        if self._as_json:
            return json.dumps({**base, **fields}, default=str)
        return " ".join(f"{k}={_quote(v)}" for k, v in {**base, **fields}.items())


class StructLogger:
    """A logger whose calls take a message plus keyword fields."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, msg: str, exc_info: bool, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, msg, exc_info=exc_info, extra={"fields": fields})

    def debug(self, msg: str, **fields: Any) -> None:
        self._log(logging.DEBUG, msg, False, fields)

    def info(self, msg: str, **fields: Any) -> None:
        self._log(logging.INFO, msg, False, fields)

    def warning(self, msg: str, **fields: Any) -> None:
        self._log(logging.WARNING, msg, False, fields)

    def error(self, msg: str, **fields: Any) -> None:
        self._log(logging.ERROR, msg, False, fields)

    def exception(self, msg: str, **fields: Any) -> None:
        self._log(logging.ERROR, msg, True, fields)


def get_logger(name: str) -> StructLogger:
    return StructLogger(logging.getLogger(f"dradriver.{name}"))


def configure(level: str = "info", as_json: bool | None = None) -> None:
    """Send dradriver's logs to stderr; JSON when asked or ``DRADRIVER_LOG_FORMAT=json``."""
    if as_json is None:
        as_json = os.environ.get(_FORMAT_ENV, "").lower() == "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(as_json))
    root = logging.getLogger("dradriver")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
