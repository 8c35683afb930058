"""Decoding list and watch responses in which one object may be nested too deep for Python.

The apiserver accepts JSON nested up to 10,000 levels (a claim's
``status.devices[].data``, any custom resource), but Python's ``json`` raises
``RecursionError`` at about 1,000 and ``copy.deepcopy`` fails at about 330
(two frames per level). A list or watch response must cost such an object, not
the informer's cache: :func:`decode_list` and :func:`decode_watch_event` stand
an object nested deeper than :data:`MAX_DEPTH` in with a :class:`TooDeepObject`:
the object itself with every container deeper than the limit replaced by
:data:`CUT`, so its identity (kind, name, namespace, uid, resourceVersion) and
whatever sits above the cut (a claim's ``status.allocation.devices.results``,
about 8 levels down) stay readable. The informer keeps it out of its cache by
name, counts it and resumes after it. Every object they return, stand-ins
included, is at most :data:`MAX_DEPTH` deep, so whatever walks it recursively has
room on the stack; only a :class:`TooDeepObject` contains :data:`CUT`.

The fast path is ``json.loads`` after a depth check in a few C-speed byte
passes (skipped when the text has fewer brackets than the limit, as most
single objects do). Only a response that is too deep is scanned in Python:
containers below the limit are cut out of the text (replaced by ``NaN``, which
the apiserver never sends since it is not JSON) and the rest is decoded.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dradriver.k8s.objects import Obj

# How deep a decoded object may nest. Kubernetes' own types nest about 12 levels;
# recursive walkers take up to three frames per level and run with 100-200 frames
# already on the stack, against Python's default limit of 1,000.
MAX_DEPTH = 128

_STRUCTURAL_BYTES = b'"[]{}'
_NOT_STRUCTURAL = bytes(c for c in range(256) if c not in _STRUCTURAL_BYTES)
_SQUARE_AS_CURLY = bytes.maketrans(b"[]", b"{}")

_STRUCTURAL = re.compile(r'["\[\]{}]')
# The rest of a string after its opening quote, up to and including the closing one.
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_CUT_TOKEN = "NaN"


class Cut:
    """Where a container nested too deep was cut out (``json.loads`` gives ``NaN`` as this).

    One instance, :data:`CUT`; copies and pickles of it are that instance, so ``is CUT``
    holds wherever a cut object travels.
    """

    def __repr__(self) -> str:
        return "<cut: nested too deep>"

    def __copy__(self) -> Cut:
        return self

    def __deepcopy__(self, memo: object) -> Cut:
        return self

    def __reduce__(self) -> str:
        return "CUT"


CUT = Cut()


class TooDeepObject(dict[str, Any]):
    """Stands in for an object nested deeper than the limit: the object, cut.

    Its content is the object with each container deeper than the limit replaced by
    :data:`CUT` (or only its kind and identity when the object itself is not a JSON
    object). A ``dict`` so it travels where objects do; ``isinstance`` tells it apart,
    and it is never to be handled as a whole object (see :func:`was_cut`).
    """

    def __init__(self, content: Obj, max_depth: int, identity_only: bool = False) -> None:
        super().__init__(content)
        self.reason = f"nested deeper than {max_depth} levels"
        # True when the object had no readable metadata: its content is its identity only
        # and says nothing else (not even that a field is absent).
        self.identity_only = identity_only


def nested_deeper_than(data: bytes | str, limit: int) -> bool:
    """Whether valid JSON ``data`` nests containers more than ``limit`` levels deep.

    Byte passes only: escapes and everything but quotes and brackets are dropped,
    then string contents, then innermost ``{}`` pairs once per level. For invalid
    JSON the answer may be wrong; ``json.loads`` rejects that text anyway.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if raw.count(b"{") + raw.count(b"[") <= limit:
        return False
    # Escaped backslashes first, so that in \\" the quote still ends the string.
    s = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    s = s.translate(_SQUARE_AS_CURLY, _NOT_STRUCTURAL)
    # Adjacent quotes enclose nothing structural: dropping them keeps the pairing of
    # the others, and leaves quotes only around strings that contain brackets.
    s = s.replace(b'""', b"")
    if b'"' in s:
        s = b"".join(s.split(b'"')[::2])
    for _ in range(limit):
        reduced = s.replace(b"{}", b"")
        if reduced == s:  # empty (or unbalanced, which is not JSON)
            return False
        s = reduced
    return bool(s)


def _text(data: bytes | str) -> str:
    if isinstance(data, str):
        return data
    return data.decode(json.detect_encoding(data), "surrogatepass")


def _cut_deep(text: str, limit: int) -> str:
    """``text`` with every container nested deeper than ``limit`` replaced by ``NaN``."""
    out: list[str] = []
    depth = 0
    kept_from = 0  # where the text not yet copied to ``out`` starts
    cutting = False
    pos = 0
    while (m := _STRUCTURAL.search(text, pos)) is not None:
        char, at = m.group(), m.start()
        if char == '"':
            rest = _STRING_REST.match(text, at + 1)
            if rest is None:
                raise ValueError(f"unterminated string at character {at}")
            pos = rest.end()
            continue
        pos = at + 1
        if char in "[{":
            depth += 1
            if depth == limit + 1:
                out += (text[kept_from:at], _CUT_TOKEN)
                cutting = True
        else:
            depth -= 1
            if cutting and depth == limit:
                cutting = False
                kept_from = at + 1
    if cutting:
        raise ValueError("unbalanced brackets: a container is never closed")
    out.append(text[kept_from:])
    return "".join(out)


def was_cut(value: Any) -> bool:
    """Whether a decoded value is or holds a :data:`CUT` (iterative: its depth is bounded,
    but not small)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if item is CUT:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _loads(data: bytes | str, max_depth: int) -> tuple[Any, bool]:
    """The decoded document and whether containers deeper than ``max_depth`` were cut."""
    if not nested_deeper_than(data, max_depth):
        try:
            return json.loads(data), False
        except RecursionError:
            pass  # unbalanced or deeper than the check saw: scan it
    cut = _cut_deep(_text(data), max_depth)
    return json.loads(cut, parse_constant=lambda _name: CUT), True


def _stand_in(obj: Any, max_depth: int) -> TooDeepObject:
    """A cut object as its stand-in; only its kind and identity if it has no object shape."""
    if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
        return TooDeepObject(obj, max_depth)
    identity: Obj = {}
    meta_out: Obj = {}
    if isinstance(obj, dict):
        for field in ("apiVersion", "kind"):
            if isinstance(obj.get(field), str):
                identity[field] = obj[field]
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            for field in ("name", "namespace", "uid", "resourceVersion"):
                if isinstance(meta.get(field), str):
                    meta_out[field] = meta[field]
    identity["metadata"] = meta_out
    return TooDeepObject(identity, max_depth, identity_only=True)


def decode_list(data: bytes | str, max_depth: int = MAX_DEPTH) -> Obj:
    """A list response; an item nested too deep comes back as a :class:`TooDeepObject`.

    Raises ``ValueError`` for text that is not JSON, a top level that is not an
    object, and deep nesting outside ``items``.
    """
    doc, cut = _loads(data, max_depth)
    if not isinstance(doc, dict):
        raise ValueError("a list response must be a JSON object")
    if not cut:
        return doc
    items = doc.get("items")
    if isinstance(items, list):
        doc["items"] = [_stand_in(i, max_depth) if was_cut(i) else i for i in items]
    if was_cut({k: v for k, v in doc.items() if k != "items"}):
        raise ValueError(f"list response nested deeper than {max_depth} levels outside its items")
    return doc


def decode_watch_event(data: bytes | str, max_depth: int = MAX_DEPTH) -> Obj:
    """One watch event; an object nested too deep comes back as a :class:`TooDeepObject`.

    Raises ``ValueError`` for text that is not JSON and a top level that is not an object.
    """
    doc, cut = _loads(data, max_depth)
    if not isinstance(doc, dict):
        raise ValueError("a watch event must be a JSON object")
    if not cut:
        return doc
    event_type = doc.get("type")
    return {
        "type": event_type if isinstance(event_type, str) else "",
        "object": _stand_in(doc.get("object"), max_depth),
    }
