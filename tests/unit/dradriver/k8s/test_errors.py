"""The apiserver error predicates: only the apiserver's own 404/409/410 count as such."""

from __future__ import annotations

import pytest

from dradriver.k8s.errors import KubeAPIError, is_conflict, is_gone, is_not_found
from dradriver.k8s.http import TransportTimeout


@pytest.mark.parametrize(
    ("status", "not_found", "conflict", "gone"),
    [
        (404, True, False, False),
        (409, False, True, False),
        (410, False, False, True),
        (403, False, False, False),  # forbidden is "unknown, retry", never "gone"
        (429, False, False, False),
        (503, False, False, False),
    ],
)
def test_predicates_read_the_status(
    status: int, not_found: bool, conflict: bool, gone: bool
) -> None:
    e = KubeAPIError("GET", "/api/v1/pods/x", status, {"reason": "R", "message": "m"})
    assert (is_not_found(e), is_conflict(e), is_gone(e)) == (not_found, conflict, gone)
    assert str(e) == f"GET /api/v1/pods/x: {status} R: m"


def test_transport_errors_are_never_an_answer() -> None:
    timeout = TransportTimeout("GET /x: no answer within the read timeout")
    assert not (is_not_found(timeout) or is_conflict(timeout) or is_gone(timeout))
