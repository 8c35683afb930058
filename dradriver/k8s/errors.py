"""The apiserver's refusals, and the three codes reconcilers act on.

Anything else (403, 429, 5xx, timeouts) means "unknown, retry" and is never read as
"gone" (design notes): the predicates are what callers branch on instead of comparing
``status`` with bare numbers.
"""

from __future__ import annotations

from dradriver.k8s.objects import Obj


class KubeAPIError(RuntimeError):
    """A request the apiserver refused; ``status`` is the HTTP code."""

    def __init__(self, method: str, path: str, status: int, body: Obj) -> None:
        self.status = status
        self.reason = str(body.get("reason", ""))
        self.body = body
        message = body.get("message") or body
        super().__init__(f"{method} {path}: {status} {self.reason}: {message}")


def _status(e: BaseException) -> int | None:
    return e.status if isinstance(e, KubeAPIError) else None


def is_not_found(e: BaseException) -> bool:
    """404: the object (or its namespace) does not exist."""
    return _status(e) == 404


def is_conflict(e: BaseException) -> bool:
    """409: a stale resourceVersion, or a create of a name that exists."""
    return _status(e) == 409


def is_gone(e: BaseException) -> bool:
    """410: a resourceVersion or continue token too old for the server; list again."""
    return _status(e) == 410
