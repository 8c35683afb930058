"""One request of a claim, ready for the search: its class, compiled selectors and mode.

Invariants:
- A :class:`Req` is one ``exactly`` request or one subrequest of a ``firstAvailable`` list;
  ``full_name`` is ``request`` or ``request/subrequest``, as in allocation results.
- :func:`build_request` checks what the scheduler checks before it searches (a non-empty
  CEL expression per selector, a known device class, a supported allocation mode, valid
  capacity requests) and raises :class:`AllocationError` naming the claim and request.
- Selectors are the class's first, then the request's, each with a label for messages.
- Admin access is only for a top-level request (never for a subrequest).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.allocator.inventory import CandidateDevice, QuantityValue, SliceInventory
from dradriver.allocator.state import claim_key
from dradriver.cel import CompileError, Selector, compile_selector
from dradriver.k8s.objects import Obj
from dradriver.k8s.quantity import QuantityError

__all__ = ["AllocationError", "Req", "build_request", "tolerates", "untolerated"]


class AllocationError(Exception):
    """The attempt cannot proceed (bad class, selector, constraint, pool state)."""

    def __init__(self, message: str, node_dependent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.node_dependent = node_dependent


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """``resourceclaim.ToleratesTaint``."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Equal":
        return bool((toleration.get("value") or "") == (taint.get("value") or ""))
    return operator == "Exists"


def untolerated(
    device: CandidateDevice, tolerations: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The first NoSchedule/NoExecute taint of the device no toleration covers."""
    for taint in device.taints:
        if not any(tolerates(t, taint) for t in tolerations):
            found: Mapping[str, Any] = taint
            return found
    return None


class Req:
    """One request, or one subrequest of a ``firstAvailable`` list, ready for the search."""

    __slots__ = (
        "admin",
        "all_devices",
        "all_mode",
        "base",
        "capacity",
        "claim_index",
        "class_name",
        "full_name",
        "klass",
        "match",
        "num",
        "parent",
        "selectors",
        "sub",
        "tolerations",
        "who",
    )

    def __init__(self, claim_index: int, base: str, sub: str | None) -> None:
        self.claim_index = claim_index
        self.base = base
        self.sub = sub
        self.parent = base if sub is not None else None
        self.full_name = f"{base}/{sub}" if sub is not None else base
        self.class_name = ""
        self.klass: Mapping[str, Any] = {}
        self.selectors: list[tuple[str, Selector]] = []
        self.match = bytearray()
        self.all_mode = False
        self.num = 0
        self.all_devices: list[CandidateDevice] = []
        self.admin = False
        self.tolerations: list[Obj] = []
        self.capacity: dict[str, QuantityValue] | None = None
        """Capacity requests by name as the claim spells it (with or without a domain)."""
        self.who = f"request {self.full_name}"
        """``claim <key>, request <name>``: how messages name this request."""


def build_request(
    inventory: SliceInventory,
    ci: int,
    claim: Mapping[str, Any],
    base: str,
    sub: str | None,
    spec: Mapping[str, Any],
) -> Req:
    """A :class:`Req` with its class and compiled selectors; raises :class:`AllocationError`."""
    req = Req(ci, base, sub)
    who = req.who = f"claim {claim_key(claim)}, request {req.full_name}"
    for i, selector in enumerate(spec.get("selectors") or []):
        if not (selector.get("cel") or {}).get("expression"):
            raise AllocationError(
                f"{who}, selector #{i}: CEL expression empty (unsupported selector type?)"
            )
    class_name = str(spec.get("deviceClassName") or "")
    if not class_name:
        raise AllocationError(f"{who}: missing device class name (unsupported request type?)")
    klass = inventory.classes.get(class_name)
    if klass is None:
        raise AllocationError(
            f"{who}: could not retrieve device class {class_name}: deviceclass.resource.k8s.io "
            f'"{class_name}" not found'
        )
    req.class_name = class_name
    req.klass = klass
    _compile_selectors(req, claim, klass, spec)
    mode = spec.get("allocationMode") or "ExactCount"
    if mode == "ExactCount":
        req.num = int(spec.get("count") or 1)
    elif mode == "All":
        req.all_mode = True
    else:
        raise AllocationError(f"{who}: unsupported count mode {mode}")
    req.admin = bool(spec.get("adminAccess")) and sub is None
    req.tolerations = list(spec.get("tolerations") or [])
    requests = (spec.get("capacity") or {}).get("requests")
    if requests:
        try:
            req.capacity = {
                str(name): QuantityValue.parse(value) for name, value in requests.items()
            }
        except QuantityError as e:
            raise AllocationError(f"{who}: capacity request: {e}") from None
    return req


def _compile_selectors(
    req: Req, claim: Mapping[str, Any], klass: Mapping[str, Any], spec: Mapping[str, Any]
) -> None:
    """The class's selectors, then the request's, compiled into ``req.selectors``."""
    class_name = req.class_name
    for i, selector in enumerate((klass.get("spec") or {}).get("selectors") or []):
        expression = str((selector.get("cel") or {}).get("expression") or "")
        try:
            req.selectors.append(
                (f"class {class_name} selector #{i}", compile_selector(expression))
            )
        except CompileError as e:
            raise AllocationError(f"class {class_name}: selector #{i}: {e}") from None
    for i, selector in enumerate(spec.get("selectors") or []):
        expression = str(selector["cel"]["expression"])
        try:
            req.selectors.append(
                (f"request {req.full_name} selector #{i}", compile_selector(expression))
            )
        except CompileError as e:
            raise AllocationError(f"claim {claim_key(claim)}: selector #{i}: {e}") from None
