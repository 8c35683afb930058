"""Log lines: one event is one line, a value never reads as another field, formatting
never raises. Through :func:`dradriver.log.configure`, to the stderr it writes to."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

from dradriver import log

# Names, namespaces and usernames come from users; so do error messages that quote them.
HOSTILE = [
    "ns\nlevel=error msg=forged",
    "carriage\rreturn",
    "tab\tkey=value",
    "\x1b[31mred\x1b[0m",
    "nul\x00byte",
    "del\x7f",
    "next-line\x85c1",
    "line\u2028separator",
    "paragraph\u2029separator",
    "right-to-left\u202eoverride",
    "zero\u200bwidth",
    "no-break\u00a0space",
    "lone\udc80surrogate",
    "lone\ud800high",
    "tag\U000e0041char",
    'quote" name=forged',
    "back\\slash",
    "équipe-日本",
    "",
]
# A logfmt pair: a bare value, or a JSON string literal.
PAIR = re.compile(r'([^\s=]+)=("(?:[^"\\]|\\.)*"|[^\s"]*)(?: |$)')


def logfmt_fields(line: str) -> dict[str, str]:
    """Parse one logfmt line, insisting that it is nothing but ``key=value`` pairs."""
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(line):
        m = PAIR.match(line, pos)
        assert m is not None, f"not a logfmt pair at {pos}: {line[pos:]!r}"
        key, value = m.groups()
        fields[key] = json.loads(value) if value.startswith('"') else value
        pos = m.end()
    return fields


@pytest.fixture
def configured() -> Iterator[None]:
    """configure() changes the process-wide 'dradriver' logger: put it back afterwards."""
    root = logging.getLogger("dradriver")
    saved = (list(root.handlers), root.level, root.propagate)
    yield
    root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]


def lines_of(
    capsys: pytest.CaptureFixture[str], as_json: bool, msg: str, **fields: Any
) -> list[str]:
    log.configure("info", as_json=as_json)
    log.get_logger("test").info(msg, **fields)
    err = capsys.readouterr().err
    assert err.endswith("\n")
    return err[:-1].split("\n")


@pytest.mark.usefixtures("configured")
@pytest.mark.parametrize("value", HOSTILE)
def test_logfmt_escapes_what_could_split_the_line_or_forge_a_field(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    [line] = lines_of(capsys, False, f"claim {value} failed", namespace=value, user=value)
    assert line.isprintable() and len(line.splitlines()) == 1
    fields = logfmt_fields(line)
    assert list(fields) == ["ts", "level", "logger", "msg", "namespace", "user"]
    assert fields["namespace"] == fields["user"] == value
    assert fields["msg"] == f"claim {value} failed"
    assert fields["level"] == "info"


@pytest.mark.usefixtures("configured")
@pytest.mark.parametrize("value", HOSTILE)
def test_json_lines_escape_everything_outside_ascii(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    [line] = lines_of(capsys, True, f"claim {value} failed", namespace=value)
    assert line.isascii() and line.isprintable()
    doc = json.loads(line)
    assert list(doc) == ["ts", "level", "logger", "msg", "namespace"]
    assert doc["namespace"] == value and doc["msg"] == f"claim {value} failed"


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def deep_list(depth: int) -> list[Any]:
    top: list[Any] = []
    inner = top
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return top


@pytest.mark.usefixtures("configured")
@pytest.mark.parametrize("as_json", [False, True])
def test_values_that_cannot_be_printed_do_not_lose_the_line(
    capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    circular: list[Any] = []
    circular.append(circular)
    [line] = lines_of(
        capsys,
        as_json,
        "odd values",
        broken=Unprintable(),
        deep=deep_list(5_000),
        huge=10**5000,
        nan=float("nan"),
        circular=circular,
        keyed={(1, 2): "tuple key"},
        after="still here",
    )
    fields = json.loads(line) if as_json else logfmt_fields(line)
    assert fields["broken"] == "<unprintable Unprintable>"
    assert fields["deep"] == "<unprintable list>"
    assert fields["huge"] == "<unprintable int>"
    assert fields["after"] == "still here"
