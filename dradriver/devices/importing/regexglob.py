"""Simple regular expressions over device names as shell globs.

Invariants:

* :func:`regex_to_globs` returns globs only for an expression anchored at both ends (``^...$``)
  made of literal characters, ``.``, ``\\d``, character classes, ``*``/``+`` after a class or
  ``.``, and alternation (``^(a|b)$``, ``^a$|^b$``); anything else is ``None``, never a guess.
* The glob of a wildcard part is looser than the expression (``[0-9]*`` -> ``*``: a glob has no
  "digits only"), never stricter, so no device the expression matched is left out.
* A :class:`Glob` is ``literal`` when it names exactly one path (no wildcard at all).
"""

from __future__ import annotations

from dataclasses import dataclass

_LITERAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-/:,=@%~")
_ESCAPABLE = frozenset(".-/_:,=@%~")
_CLASS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


@dataclass(frozen=True)
class Glob:
    pattern: str
    literal: bool

    @property
    def prefix(self) -> str:
        """The literal part before the first wildcard (``ttyUSB`` of ``ttyUSB*``)."""
        for index, char in enumerate(self.pattern):
            if char in "*?[":
                return self.pattern[:index]
        return self.pattern


def regex_to_globs(regex: str) -> list[Glob] | None:
    """The globs (relative to /dev) matching what ``regex`` matches, or None if not simple."""
    alternatives = _split_top(regex, "|")
    if alternatives is None:
        return None
    if len(alternatives) > 1:
        joined: list[Glob] = []
        for alternative in alternatives:
            globs = regex_to_globs(alternative)
            if globs is None:
                return None
            joined.extend(globs)
        return joined
    if not (regex.startswith("^") and regex.endswith("$") and not regex.endswith("\\$")):
        return None
    body = regex[1:-1]
    inner = _group_body(body)
    parts = [body] if inner is None else _split_top(inner, "|")
    if parts is None:
        return None
    out = []
    for part in parts:
        glob = _body_to_glob(part)
        if glob is None:
            return None
        out.append(glob)
    return out


def _split_top(text: str, separator: str) -> list[str] | None:
    """``text`` split at ``separator`` outside groups, classes and escapes; None if the
    parentheses or brackets do not balance."""
    parts, depth, start, index, in_class = [], 0, 0, 0, False
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                return None
        elif char == separator and depth == 0:
            parts.append(text[start:index])
            start = index + 1
        index += 1
    if depth or in_class:
        return None
    parts.append(text[start:])
    return parts


def _group_body(body: str) -> str | None:
    """The inside of ``(...)`` or ``(?:...)`` when that group is the whole body."""
    for opening in ("(?:", "("):
        if body.startswith(opening) and body.endswith(")"):
            inner = body[len(opening) : -1]
            if _split_top(inner, "|") is not None and "(" not in inner and ")" not in inner:
                return inner
    return None


def _body_to_glob(body: str) -> Glob | None:
    out: list[str] = []
    literal = True
    index = 0
    while index < len(body):
        atom, index = _atom(body, index)
        if atom is None:
            return None
        quantifier = body[index] if index < len(body) else ""
        if quantifier in ("*", "+"):
            if len(atom) == 1 and atom not in "?":
                return None  # a repeated literal character
            index += 1
            atom = "*" if quantifier == "*" else atom + "*"
        if atom != "" and not (len(atom) == 1 and atom not in "*?"):
            literal = False
        if atom == "*" and out and out[-1].endswith("*"):
            continue
        out.append(atom)
    pattern = "".join(out)
    if not pattern or pattern.startswith("/") or "//" in pattern:
        return None
    return Glob(pattern, literal)


def _atom(body: str, index: int) -> tuple[str | None, int]:
    """One atom at ``index`` as glob text, and the index after it; None if not simple."""
    char = body[index]
    if char in _LITERAL:
        return char, index + 1
    if char == ".":
        return "?", index + 1
    if char == "\\" and index + 1 < len(body):
        escaped = body[index + 1]
        if escaped == "d":
            return "[0-9]", index + 2
        if escaped in _ESCAPABLE:
            return escaped, index + 2
        return None, index
    if char == "[":
        end = body.find("]", index + 1)
        if end < 0:
            return None, index
        inside = body[index + 1 : end]
        negated = inside.startswith("^")
        chars = inside[1:] if negated else inside
        if not chars or not set(chars) <= _CLASS_CHARS:
            return None, index
        return "[" + ("!" if negated else "") + chars + "]", end + 1
    return None, index
