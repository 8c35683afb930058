"""The log formatter on any text and any value: one event is one line, fields round-trip,
formatting never raises. Through :func:`dradriver.log.configure` to the stderr it writes."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dradriver import log
from tests.fuzz.strategies import any_text, json_values
from tests.unit.dradriver.test_log import logfmt_fields

FUZZ = settings.get_profile("fuzz")


class Captured:
    """stderr as a UTF-8 stream that refuses what UTF-8 cannot encode (a lone surrogate),
    the way a pod's log stream does."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()
        self.stream = io.TextIOWrapper(self.buffer, encoding="utf-8", errors="strict")

    def take(self) -> str:
        self.stream.flush()
        text = self.buffer.getvalue().decode("utf-8")
        self.buffer.seek(0)
        self.buffer.truncate()
        return text


@pytest.fixture(scope="module")
def stderr() -> Iterator[Captured]:
    """configure() changes the process-wide 'dradriver' logger: put it back afterwards."""
    root = logging.getLogger("dradriver")
    saved = (list(root.handlers), root.level, root.propagate)
    yield Captured()
    root.handlers[:], root.level, root.propagate = saved


def one_line(stderr: Captured, as_json: bool, msg: str, **fields: Any) -> str:
    log.configure("info", as_json=as_json)
    [handler] = logging.getLogger("dradriver").handlers
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stderr.stream)
    # Logging reports a formatting or encoding failure as "--- Logging error ---" and a
    # traceback on sys.stderr, not in the stream: so an empty or extra line shows it.
    log.get_logger("fuzz").info(msg, **fields)
    out = stderr.take()
    assert out.endswith("\n") and out.count("\n") == 1, out
    line = out[:-1]
    assert line.isprintable() and len(line.splitlines()) == 1
    return line


@settings(FUZZ, derandomize=True, max_examples=1000, deadline=None)
@given(msg=any_text, values=st.lists(any_text, min_size=1, max_size=4))
def test_logfmt_text_fields_round_trip_on_one_line(
    stderr: Captured, msg: str, values: list[str]
) -> None:
    fields = {f"f{i}": v for i, v in enumerate(values)}
    line = one_line(stderr, False, msg, **fields)
    parsed = logfmt_fields(line)
    assert list(parsed) == ["ts", "level", "logger", "msg", *fields]
    assert parsed["msg"] == msg
    assert {k: parsed[k] for k in fields} == fields


@settings(FUZZ, derandomize=True, max_examples=500, deadline=None)
@given(msg=any_text, values=st.lists(any_text, min_size=1, max_size=4))
def test_json_text_fields_round_trip_on_one_ascii_line(
    stderr: Captured, msg: str, values: list[str]
) -> None:
    fields = {f"f{i}": v for i, v in enumerate(values)}
    line = one_line(stderr, True, msg, **fields)
    assert line.isascii()
    doc = json.loads(line)
    assert doc["msg"] == msg
    assert {k: doc[k] for k in fields} == fields


odd_values = (
    json_values()
    | st.binary(max_size=20)
    | st.floats()
    | st.integers()
    | st.sets(st.integers(), max_size=3)
    | st.tuples(any_text, st.integers())
    | st.dictionaries(st.integers() | st.tuples(st.integers()), any_text, max_size=2)
)


@settings(FUZZ, derandomize=True, max_examples=500, deadline=None)
@given(as_json=st.booleans(), value=odd_values)
def test_any_value_gives_one_parseable_line(stderr: Captured, as_json: bool, value: Any) -> None:
    line = one_line(stderr, as_json, "value", v=value, after="end")
    parsed = json.loads(line) if as_json else logfmt_fields(line)
    assert parsed["after"] == "end"
    assert "v" in parsed
