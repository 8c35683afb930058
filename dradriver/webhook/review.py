"""The AdmissionReview envelope (``admission.k8s.io/v1``): any HTTP body in, the request to
validate or why the body is malformed out; verdicts out as AdmissionReview bodies.

Every body gets a well-formed AdmissionReview back, so the apiserver (and anyone else who
can reach the port) always reads an answer rather than an HTTP error:

- :func:`decode` accepts any bytes. A body that is not UTF-8 JSON, not an
  ``admission.k8s.io/v1`` AdmissionReview, nested deeper than :data:`MAX_DEPTH`, or whose
  envelope fields dradriver reads have the wrong JSON type (``request.kind`` an object of
  strings, ``request.operation`` a string, ``request.object`` an object...) is
  :class:`Malformed`, with field errors naming what is wrong.
- The request's ``uid`` is echoed only when it is a string that is valid Unicode: the
  apiserver matches it against what it sent (always a UUID), and a uid with a lone
  surrogate could not have come from it. Otherwise the answer's uid is ``""``.
- :func:`encode` writes ASCII JSON (``\\uXXXX`` escapes), so no string in a message, a lone
  surrogate included, can make the answer fail to encode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeGuard

from dradriver.errors import FieldError, render
from dradriver.k8s.objects import Obj

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
MAX_DEPTH = 128
"""Containers nested in one body. An AdmissionReview of a claim nests about a dozen deep;
Python's JSON decoder gives up near 1 000, and validation (pydantic, comparisons of the old
and new object) must stay far from the interpreter's recursion limit."""

BAD_REQUEST = 400
INVALID = 422


@dataclass(frozen=True)
class Review:
    """A well-formed AdmissionReview: its ``request``, whose envelope fields have their types."""

    uid: str
    request: Obj


@dataclass(frozen=True)
class Malformed:
    """A body that is not a usable AdmissionReview; ``uid`` is echoed ("" if not valid)."""

    uid: str
    problems: tuple[FieldError, ...]

    @property
    def message(self) -> str:
        return "malformed AdmissionReview: " + render(self.problems)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _too_deep(value: Any) -> bool:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            if depth > MAX_DEPTH:
                return True
            stack.extend(
                (child, depth) for child in (item.values() if isinstance(item, dict) else item)
            )
    return False


def valid_text(value: Any) -> TypeGuard[str]:
    """A string that can be written as UTF-8 (no lone surrogates from ``\\ud800`` escapes)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _envelope_problems(request: Obj) -> list[FieldError]:
    """Wrong JSON types in the fields of ``request`` dradriver reads (validation, logs)."""
    problems = []

    def expect(path: str, value: Any, kind: str, *, required: bool = False) -> None:
        if value is None and not required:
            return
        if _type_name(value) != kind:
            got = "missing" if value is None else f"a JSON {_type_name(value)}"
            problems.append(FieldError(path, f"must be a JSON {kind}, got {got}"))

    kind = request.get("kind")
    expect("request.kind", kind, "object", required=True)
    if isinstance(kind, dict):
        for field in ("group", "version", "kind"):
            expect(f"request.kind.{field}", kind.get(field), "string", required=field == "kind")
    expect("request.operation", request.get("operation"), "string", required=True)
    for field in ("namespace", "name", "subResource"):
        expect(f"request.{field}", request.get(field), "string")
    for field in ("object", "oldObject"):
        expect(f"request.{field}", request.get(field), "object")
    user = request.get("userInfo")
    expect("request.userInfo", user, "object")
    if isinstance(user, dict):
        expect("request.userInfo.username", user.get("username"), "string")
    for path, value in (
        ("request.kind.kind", kind.get("kind") if isinstance(kind, dict) else None),
        ("request.operation", request.get("operation")),
    ):
        if isinstance(value, str) and not valid_text(value):
            problems.append(FieldError(path, "is not valid Unicode (a lone surrogate)"))
    return problems


def decode(body: bytes) -> Review | Malformed:
    """The review in ``body``, or why it is malformed. Never raises."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        problem = f"the body is not UTF-8: byte 0x{body[e.start]:02x} at offset {e.start}"
        return Malformed("", (FieldError("", problem),))
    except RecursionError:
        return Malformed("", (FieldError("", f"the body nests deeper than {MAX_DEPTH} levels"),))
    except ValueError as e:  # json.JSONDecodeError, NaN/Infinity, an integer of 5 000 digits
        return Malformed("", (FieldError("", f"the body is not JSON: {e}"),))
    if not isinstance(value, dict):
        return Malformed(
            "", (FieldError("", f"must be a JSON object, got a JSON {_type_name(value)}"),)
        )
    request = value.get("request")
    uid = request.get("uid") if isinstance(request, dict) else None
    echo = uid if valid_text(uid) else ""
    if _too_deep(value):
        return Malformed(echo, (FieldError("", f"the body nests deeper than {MAX_DEPTH} levels"),))
    problems = []
    if value.get("kind") != KIND:
        problems.append(FieldError("kind", f"must be {KIND!r}, got {value.get('kind')!r}"))
    if value.get("apiVersion") != API_VERSION:
        problems.append(
            FieldError(
                "apiVersion",
                f"{value.get('apiVersion')!r} is not supported; use {API_VERSION!r} "
                "(admissionReviewVersions: [v1])",
            )
        )
    if not isinstance(request, dict):
        got = "missing" if request is None else f"a JSON {_type_name(request)}"
        problems.append(FieldError("request", f"must be a JSON object, got {got}"))
        return Malformed(echo, tuple(problems))
    if not isinstance(uid, str):
        got = "missing" if uid is None else f"a JSON {_type_name(uid)}"
        problems.append(FieldError("request.uid", f"must be a JSON string, got {got}"))
    elif not valid_text(uid):
        problems.append(FieldError("request.uid", "is not valid Unicode (a lone surrogate)"))
    problems += _envelope_problems(request)
    if problems:
        return Malformed(echo, tuple(problems))
    return Review(echo, request)


def encode(
    uid: str, allowed: bool, code: int = INVALID, reason: str = "", message: str = ""
) -> bytes:
    """An AdmissionReview response; a denial carries ``status`` (code, reason, message)."""
    response: Obj = {"uid": uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": code, "reason": reason, "message": message}
    document = {"apiVersion": API_VERSION, "kind": KIND, "response": response}
    return json.dumps(document, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def deny_malformed(malformed: Malformed) -> bytes:
    return encode(malformed.uid, False, BAD_REQUEST, "BadRequest", malformed.message)
