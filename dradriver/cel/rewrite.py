"""Source-level adjustments that make cel-expr-python behave like Kubernetes' CEL for DRA.

All of them work on tokens (a small lexer that knows CEL string literals, raw/bytes/triple
quoted, and ``//`` comments), never inside string literals:

* **Unknown domain** (:func:`rewrite`): Go's ``device.attributes[D]`` and
  ``device.capacity[D]`` yield an empty map for a domain the device does not have, while
  ``D in device.attributes`` still tells whether it exists. cel-cpp's maps are plain, so
  every ``device.attributes[K]`` / ``device.capacity[K]`` (not ``[?K]``) becomes
  ``((K) in device.attributes ? device.attributes[K] : {})``. An alias made with
  ``cel.bind(a, device.attributes, a["x"])`` is not covered (documented limitation).
* **Literal folding** (:func:`rewrite`): ``quantity("16Gi")`` and ``semver("1.2.3")`` /
  ``semver("v1.2", true)`` with a valid plain string literal become message literals, so
  evaluating them needs no Python callback (each callback leaks in cel-expr-python 0.1.3).
  Invalid literals are left alone and fail at evaluation, as in Go.
* **Checks** (:func:`check`): the reserved message type names (``kubernetes.Quantity`` …)
  cannot be written by users, and ``device.<field>`` must be one of the fields Kubernetes
  declares (cel-cpp would accept any field of the ``map(string, dyn)`` variable).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dradriver.cel.quantity import QuantityError, parse_nanos
from dradriver.cel.semver import SemverError, parse_semver

__all__ = ["DEVICE_FIELDS", "Token", "calls", "check", "rewrite", "tokenize"]

DEVICE_FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")

IDENT, STRING, SPACE, OTHER = "ident", "string", "space", "other"

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STRING_START = re.compile(r"(?P<prefix>[rR][bB]?|[bB][rR]?)?(?P<quote>\"\"\"|'''|\"|')")
_SPACE = re.compile(r"(?:\s+|//[^\n]*)+")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str
    raw: bool = False
    is_bytes: bool = False
    body: str = ""


def tokenize(text: str) -> list[Token]:
    """Tokens whose texts, concatenated, give ``text`` back."""
    tokens: list[Token] = []
    pos, end = 0, len(text)
    while pos < end:
        string = _STRING_START.match(text, pos)
        if string is not None:
            prefix = (string["prefix"] or "").lower()
            quote = string["quote"]
            body_start = string.end()
            close = _string_end(text, body_start, quote, raw="r" in prefix)
            tokens.append(
                Token(
                    STRING,
                    text[pos:close],
                    raw="r" in prefix,
                    is_bytes="b" in prefix,
                    body=text[body_start : max(body_start, close - len(quote))],
                )
            )
            pos = close
            continue
        for pattern, kind in ((_SPACE, SPACE), (_IDENT, IDENT)):
            match = pattern.match(text, pos)
            if match is not None:
                tokens.append(Token(kind, match.group(0)))
                pos = match.end()
                break
        else:
            tokens.append(Token(OTHER, text[pos]))
            pos += 1
    return tokens


def _string_end(text: str, pos: int, quote: str, raw: bool) -> int:
    end = len(text)
    while pos < end:
        if text.startswith(quote, pos):
            return pos + len(quote)
        if text[pos] == "\\" and not raw:
            pos += 2
            continue
        if text[pos] == "\n" and len(quote) == 1:
            return end  # unterminated: leave the rest to the parser's error
        pos += 1
    return end


def _next(tokens: list[Token], i: int, hi: int) -> int:
    while i < hi and tokens[i].kind == SPACE:
        i += 1
    return i


def _prev(tokens: list[Token], i: int) -> int:
    i -= 1
    while i >= 0 and tokens[i].kind == SPACE:
        i -= 1
    return i


def _is_member(tokens: list[Token], i: int) -> bool:
    """Whether the identifier at ``i`` is selected from something (``x.i`` or ``x.?i``)."""
    p = _prev(tokens, i)
    if p >= 0 and tokens[p].text == "?":
        p = _prev(tokens, p)
    return p >= 0 and tokens[p].text == "."


def _closing(tokens: list[Token], i: int, hi: int, open_: str, close: str) -> int | None:
    depth = 0
    for k in range(i, hi):
        text = tokens[k].text
        if tokens[k].kind != OTHER:
            continue
        if text == open_:
            depth += 1
        elif text == close:
            depth -= 1
            if depth == 0:
                return k
    return None


def _plain_string(token: Token) -> str | None:
    if token.kind != STRING or token.is_bytes:
        return None
    if token.raw or "\\" not in token.body:
        return token.body
    return None


def _fold_call(tokens: list[Token], i: int, hi: int) -> tuple[str, int] | None:
    """A message literal replacing ``quantity("…")``/``semver("…"[, b])`` at ``i``."""
    name = tokens[i].text
    paren = _next(tokens, i + 1, hi)
    if paren >= hi or tokens[paren].text != "(":
        return None
    arg = _next(tokens, paren + 1, hi)
    if arg >= hi:
        return None
    literal = _plain_string(tokens[arg])
    if literal is None:
        return None
    after = _next(tokens, arg + 1, hi)
    normalize = False
    if name == "semver" and after < hi and tokens[after].text == ",":
        flag = _next(tokens, after + 1, hi)
        if flag >= hi or tokens[flag].text not in ("true", "false"):
            return None
        normalize = tokens[flag].text == "true"
        after = _next(tokens, flag + 1, hi)
    if after >= hi or tokens[after].text != ")":
        return None
    if name == "quantity":
        try:
            nanos = parse_nanos(literal)
        except QuantityError:
            return None
        return f'kubernetes.Quantity{{nanos: "{nanos}"}}', after + 1
    try:
        version = parse_semver(literal, normalize)
    except SemverError:
        return None
    # Pre-release identifiers are [0-9A-Za-z-.], safe inside a CEL string literal.
    return (
        f"kubernetes.Semver{{major: {version.major}, minor: {version.minor}, "
        f'patch: {version.patch}, pre: "{version.pre}"}}',
        after + 1,
    )


def _emit(tokens: list[Token], lo: int, hi: int) -> str:
    out: list[str] = []
    k = lo
    while k < hi:
        token = tokens[k]
        if token.kind == IDENT and not _is_member(tokens, k):
            if token.text == "device":
                replaced = _domain_lookup(tokens, k, hi)
                if replaced is not None:
                    out.append(replaced[0])
                    k = replaced[1]
                    continue
            elif token.text in ("quantity", "semver"):
                folded = _fold_call(tokens, k, hi)
                if folded is not None:
                    out.append(folded[0])
                    k = folded[1]
                    continue
        out.append(token.text)
        k += 1
    return "".join(out)


def _domain_lookup(tokens: list[Token], i: int, hi: int) -> tuple[str, int] | None:
    dot = _next(tokens, i + 1, hi)
    if dot >= hi or tokens[dot].text != ".":
        return None
    field = _next(tokens, dot + 1, hi)
    if field >= hi or tokens[field].text not in ("attributes", "capacity"):
        return None
    bracket = _next(tokens, field + 1, hi)
    if bracket >= hi or tokens[bracket].text != "[":
        return None
    first = _next(tokens, bracket + 1, hi)
    if first < hi and tokens[first].text == "?":
        return None
    close = _closing(tokens, bracket, hi, "[", "]")
    if close is None:
        return None
    key = _emit(tokens, bracket + 1, close)
    name = tokens[field].text
    return f"(({key}) in device.{name} ? device.{name}[{key}] : {{}})", close + 1


def rewrite(expression: str) -> str:
    """``expression`` with the unknown-domain guard and literal folding applied."""
    tokens = tokenize(expression)
    return _emit(tokens, 0, len(tokens))


def check(expression: str) -> str | None:
    """A compile error message for what cel-cpp would accept but Kubernetes does not."""
    tokens = tokenize(expression)
    for k, token in enumerate(tokens):
        if token.kind != IDENT or _is_member(tokens, k):
            continue
        if token.text == "kubernetes":
            return "undeclared reference to 'kubernetes'"
        if token.text == "device":
            dot = _next(tokens, k + 1, len(tokens))
            if dot < len(tokens) and tokens[dot].text == ".":
                field = _next(tokens, dot + 1, len(tokens))
                if field < len(tokens) and tokens[field].text == "?":
                    field = _next(tokens, field + 1, len(tokens))
                if (
                    field < len(tokens)
                    and tokens[field].kind == IDENT
                    and tokens[field].text not in DEVICE_FIELDS
                ):
                    return f"undefined field '{tokens[field].text}' of device; it has " + ", ".join(
                        DEVICE_FIELDS
                    )
    return None


def calls(expression: str) -> set[str]:
    """Names of functions called in ``expression`` (``f(`` or ``x.f(``)."""
    tokens = tokenize(expression)
    found: set[str] = set()
    for k, token in enumerate(tokens):
        if token.kind == IDENT:
            nxt = _next(tokens, k + 1, len(tokens))
            if nxt < len(tokens) and tokens[nxt].text == "(":
                found.add(token.text)
    return found
