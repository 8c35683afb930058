"""A claim's constraints: ``matchAttribute`` and ``distinctAttribute`` over chosen devices.

Invariants:
- A constraint covers the requests it names (a request name covers all its subrequests, a
  ``request/subrequest`` name only that one), or every request when it names none.
- ``matchAttribute``: every covered device has the attribute, with the first one's value;
  ``distinctAttribute``: every covered device has the attribute, all values differ
  (versions compared as semver).
- :meth:`Constraint.add` and :meth:`Constraint.remove` are a stack: the search removes in
  the reverse order it added.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.allocator.inventory import CandidateDevice
from dradriver.allocator.request import AllocationError, Req
from dradriver.allocator.state import claim_key
from dradriver.cel import SemverError, compare_semver, parse_semver

__all__ = ["Constraint", "parse_constraints"]


class Constraint:
    """matchAttribute or distinctAttribute over the devices chosen for some requests."""

    def __init__(self, index: int, kind: str, attribute: str, requests: Sequence[str]) -> None:
        self.index = index
        self.kind = kind
        self.attribute = attribute
        self.requests = frozenset(requests)
        self.values: list[tuple[str, Any]] = []

    def describe(self) -> str:
        scope = f" of requests {', '.join(sorted(self.requests))}" if self.requests else ""
        return f"constraint #{self.index} ({self.kind} {self.attribute}{scope})"

    def applies(self, req: Req) -> bool:
        if not self.requests:
            return True
        return req.base in self.requests or (req.sub is not None and req.full_name in self.requests)

    def admits(self, value: tuple[str, Any] | None) -> bool:
        if value is None:
            return False
        if self.kind == "matchAttribute":
            return not self.values or self.values[0] == value
        return all(not _same_value(have, value) for have in self.values)

    def add(self, req: Req, device: CandidateDevice) -> bool:
        if not self.applies(req):
            return True
        value = device.attribute(self.attribute)
        if not self.admits(value):
            return False
        assert value is not None
        self.values.append(value)
        return True

    def remove(self, req: Req) -> None:
        if self.applies(req):
            self.values.pop()


def _same_value(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "version":
        try:
            return compare_semver(parse_semver(str(a[1])), parse_semver(str(b[1]))) == 0
        except SemverError:
            return bool(a[1] == b[1])
    return bool(a[1] == b[1])


def parse_constraints(claim: Mapping[str, Any]) -> list[Constraint]:
    """The claim's constraints in order; raises :class:`AllocationError` for an empty one."""
    constraints = []
    devices = (claim.get("spec") or {}).get("devices") or {}
    for i, raw in enumerate(devices.get("constraints") or []):
        requests = [str(r) for r in raw.get("requests") or []]
        if raw.get("matchAttribute"):
            constraints.append(
                Constraint(i, "matchAttribute", str(raw["matchAttribute"]), requests)
            )
        elif raw.get("distinctAttribute"):
            constraints.append(
                Constraint(i, "distinctAttribute", str(raw["distinctAttribute"]), requests)
            )
        else:
            raise AllocationError(
                f"claim {claim_key(claim)}, constraint #{i}: empty constraint (unsupported "
                "constraint type?)"
            )
    return constraints
