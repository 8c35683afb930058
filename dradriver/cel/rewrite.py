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

from dradriver.cel._types import quantity_key, semver_key
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
        return f'kubernetes.Quantity{{nanos: "{nanos}", key: "{quantity_key(nanos)}"}}', after + 1
    try:
        version = parse_semver(literal, normalize)
    except SemverError:
        return None
    # Pre-release identifiers are [0-9A-Za-z-.], safe inside a CEL string literal (the key
    # adds digits, "~" and "!").
    return (
        f"kubernetes.Semver{{major: {version.major}, minor: {version.minor}, "
        f'patch: {version.patch}, pre: "{version.pre}", key: "{semver_key(version)}"}}',
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


def rewrite(expression: str, inline: bool = True) -> str:
    """``expression`` with the unknown-domain guard, literal folding and (``inline``) the
    comparisons written in CEL."""
    tokens = tokenize(expression)
    text = _emit(tokens, 0, len(tokens))
    return inline_comparisons(text) if inline else text


# --- comparisons in CEL itself ------------------------------------------------------------

COMPARISONS = {
    "compareTo": "(_dra_l.key < _dra_r.key ? -1 : _dra_l.key == _dra_r.key ? 0 : 1)",
    "isGreaterThan": "_dra_l.key > _dra_r.key",
    "isLessThan": "_dra_l.key < _dra_r.key",
}
"""Member functions on Quantity/Semver that :func:`inline_comparisons` writes in CEL."""

RESERVED_PREFIX = "_dra_"

_SAME_TYPE = (
    "(type(_dra_l) == kubernetes.Quantity && type(_dra_r) == kubernetes.Quantity || "
    "type(_dra_l) == kubernetes.Semver && type(_dra_r) == kubernetes.Semver)"
)


def _postfix_end(token: Token) -> bool:
    """Whether ``token`` can end an operand that ``.f(...)``/``[...]`` applies to."""
    if token.kind == STRING:
        return True
    if token.kind == IDENT:
        return token.text != "in"
    return token.text in (")", "]", "}")


def _opening(tokens: list[Token], close: int, open_: str, close_: str) -> int | None:
    depth = 0
    for k in range(close, -1, -1):
        if tokens[k].kind != OTHER:
            continue
        if tokens[k].text == close_:
            depth += 1
        elif tokens[k].text == open_:
            depth -= 1
            if depth == 0:
                return k
    return None


_PAIRS = {")": "(", "]": "[", "}": "{"}


def _receiver_start(tokens: list[Token], dot: int) -> int | None:
    """Index of the first token of the member operand that ends just before ``dot``.

    CEL's member expressions: a primary (identifier, call, literal, ``(...)``, ``[...]``,
    ``{...}``, ``Name{...}``) followed by ``.f``, ``.?f``, ``.f(...)``, ``[k]``, ``[?k]``.
    None when the text before ``dot`` is not something this walk understands.
    """
    i = _prev(tokens, dot)
    while i >= 0:
        token = tokens[i]
        if token.kind == OTHER and token.text in _PAIRS:
            start = _opening(tokens, i, _PAIRS[token.text], token.text)
            if start is None:
                return None
            before = _prev(tokens, start)
            if token.text == "]" and before >= 0 and _postfix_end(tokens[before]):
                i = before  # an index: the indexed operand continues
                continue
            if token.text in ")}" and before >= 0 and tokens[before].kind == IDENT:
                if tokens[before].text == "in":
                    return start
                start = before  # a call f(...) or a message Name{...}
        elif token.kind in (IDENT, STRING):
            if token.kind == IDENT and token.text == "in":
                return None
            start = i
        else:
            return None
        p = _prev(tokens, start)
        if p >= 0 and tokens[p].text == "?":
            q = _prev(tokens, p)
            if q >= 0 and tokens[q].text == ".":
                p = q
        if p >= 0 and tokens[p].text == "." and tokens[start].kind == IDENT:
            operand = _prev(tokens, p)
            if operand < 0 or not _postfix_end(tokens[operand]):
                return p  # a leading-dot name (.name)
            i = operand
            continue
        return start
    return None


def _inline_one(text: str) -> str | None:
    tokens = tokenize(text)
    n = len(tokens)
    for k, token in enumerate(tokens):
        if token.kind != IDENT or token.text not in COMPARISONS:
            continue
        dot = _prev(tokens, k)
        paren = _next(tokens, k + 1, n)
        if dot < 0 or tokens[dot].text != "." or paren >= n or tokens[paren].text != "(":
            continue
        start = _receiver_start(tokens, dot)
        close = _closing(tokens, paren, n, "(", ")")
        if start is None or close is None:
            continue
        receiver = "".join(t.text for t in tokens[start:dot]).strip()
        if receiver == "_dra_l":
            continue  # the fallback of an inlined call
        argument = "".join(t.text for t in tokens[paren + 1 : close])
        if _top_level_comma(tokens, paren + 1, close):
            continue  # wrong arity: leave it to the type checker's error
        inlined = (
            f"cel.bind(_dra_l, {receiver}, cel.bind(_dra_r, {argument}, {_SAME_TYPE} ? "
            f"{COMPARISONS[token.text]} : _dra_l.{token.text}(_dra_r)))"
        )
        head = "".join(t.text for t in tokens[:start])
        tail = "".join(t.text for t in tokens[close + 1 :])
        return head + inlined + tail
    return None


def _top_level_comma(tokens: list[Token], lo: int, hi: int) -> bool:
    depth = 0
    for token in tokens[lo:hi]:
        if token.kind != OTHER:
            continue
        if token.text in "([{":
            depth += 1
        elif token.text in ")]}":
            depth -= 1
        elif token.text == "," and depth == 0:
            return True
    return False


def inline_comparisons(expression: str) -> str:
    """``x.compareTo(y)``, ``x.isGreaterThan(y)``, ``x.isLessThan(y)`` written in CEL.

    Both sides are bound once (``cel.bind``); when both are Quantities or both Semvers,
    their ``key`` fields (:mod:`dradriver.cel._types`) are compared with CEL's string
    operators; otherwise the original Python function is called, which reports "no such
    overload" as before. So the typical ``capacity.compareTo(quantity("16Gi")) >= 0``
    needs no Python callback. A call whose receiver the token walk does not understand is
    left as it is (it still works, through a callback).
    """
    text = expression
    while True:
        inlined = _inline_one(text)
        if inlined is None:
            return text
        text = inlined


def check(expression: str) -> str | None:
    """A compile error message for what cel-cpp would accept but Kubernetes does not."""
    tokens = tokenize(expression)
    for k, token in enumerate(tokens):
        if token.kind != IDENT or _is_member(tokens, k):
            continue
        if token.text == "kubernetes":
            return "undeclared reference to 'kubernetes'"
        if token.text.startswith(RESERVED_PREFIX):
            return f"undeclared reference to '{token.text}'"
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
    """Names of functions called in ``expression`` (``f(`` or ``x.f(``), leaving out the
    fallbacks of inlined comparisons (called only for mismatched types, an error)."""
    tokens = tokenize(expression)
    found: set[str] = set()
    for k, token in enumerate(tokens):
        if token.kind == IDENT and token.text in COMPARISONS:
            dot = _prev(tokens, k)
            receiver = _prev(tokens, dot) if dot >= 0 and tokens[dot].text == "." else -1
            if receiver >= 0 and tokens[receiver].text == "_dra_l":
                continue
        if token.kind == IDENT:
            nxt = _next(tokens, k + 1, len(tokens))
            if nxt < len(tokens) and tokens[nxt].text == "(":
                found.add(token.text)
    return found
