"""Structured logging: one line per event, ``key=value`` fields (logfmt) or JSON.

Every component logs through :func:`get_logger` so that fields such as
``claim=ns/name`` or ``device=dev-0`` can be grepped and parsed the same way.

Values come from outside (names, namespaces, usernames, error messages), so one
event always stays one line and a value can never read as another field: in
logfmt a value with a space, ``=``, ``"`` or any character that is not printable
(control characters, newlines and other line or paragraph separators, lone
surrogates, format characters) is written as a JSON string literal with those
characters escaped; JSON output escapes everything outside ASCII. Formatting
never raises: a value whose ``str()`` fails, or that JSON cannot encode
(too deep, circular), is written as text or a placeholder.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from typing import Any

_FORMAT_ENV = "DRADRIVER_LOG_FORMAT"
# Printable, but they would end an unquoted logfmt value or open a quoted one.
_QUOTE_IF_PRESENT = frozenset(' ="')
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def _text_of(value: Any) -> str:
    """``str(value)``, or a placeholder when that raises (a deep or broken object)."""
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _escape(char: str) -> str:
    code = ord(char)
    if code > 0xFFFF:  # JSON spells these as a surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def _string_literal(text: str) -> str:
    """A JSON string literal of ``text`` with every character that is not printable escaped."""
    literal = json.dumps(text, ensure_ascii=False)  # escapes ", \\ and C0 controls
    if literal.isprintable():
        return literal
    return "".join(c if c.isprintable() else _escape(c) for c in literal)


def _quote(value: Any) -> str:
    text = _text_of(value)
    if text and text.isprintable() and _QUOTE_IF_PRESENT.isdisjoint(text):
        return text
    return _string_literal(text)


def _key(name: str) -> str:
    """Field names come from code, but keep even an odd one from splitting the line."""
    if name.isidentifier() and name.isprintable():
        return name
    return _KEY_UNSAFE.sub("_", name) or "_"


def _json_line(doc: dict[str, Any]) -> str:
    try:
        return json.dumps(doc, default=_text_of, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        # Something JSON cannot encode (a circular or deep value, NaN, an int too long
        # to print, keys that are not strings): every such field as text.
        plain = {
            k: v if isinstance(v, str | bool) or v is None else _text_of(v) for k, v in doc.items()
        }
        return json.dumps(plain)


class _Formatter(logging.Formatter):
    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self._as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        try:
            message = record.getMessage()
        except Exception:  # a %-format that does not fit its arguments
            message = _text_of(record.msg)
        base: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": message,
        }
        if record.exc_info:
            base["error"] = self.formatException(record.exc_info)
        if self._as_json:
            return _json_line({**base, **{_text_of(k): v for k, v in fields.items()}})
        return " ".join(f"{_key(_text_of(k))}={_quote(v)}" for k, v in {**base, **fields}.items())


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
