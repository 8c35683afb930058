"""Consumable capacity (DRAConsumableCapacity) with exact arithmetic.

Semantics of the scheduler's ``consumable_capacity.go``:

* a request names capacities with or without the driver's domain, and so may the device's
  slice; both spellings are one name (an unqualified name means the device's driver's
  domain; a slice spelling both keeps the driver-qualified entry). A device lacking one of
  them does not fit; a request naming one capacity of the device in both spellings is an
  :class:`~dradriver.allocator.request.AllocationError` (as in the 1.38 scheduler; 1.34 to 1.37
  matched only the slice's exact spelling);
* for **every** capacity of the device the consumed amount is: the requested value rounded
  up by the capacity's ``requestPolicy`` (``validRange``: at least ``min``, then up to the
  next ``min + k·step``; ``validValues``: the first value ≥ the request), or, when not
  requested, the policy's ``default``, or else the whole capacity;
* the amount must not violate the policy (above ``max``, off-step, not a valid value) and,
  added to what is consumed already (by allocated claims and by this allocation attempt),
  must not exceed the capacity's value.

Values are :class:`~decimal.Decimal`, so fractional ranges need no milli-value special
case.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from dradriver.allocator.inventory import CandidateDevice, Capacity, QuantityValue
from dradriver.allocator.request import AllocationError, Req
from dradriver.allocator.state import qualify
from dradriver.cel.quantity import display_quantity, format_quantity, is_binary_quantity

__all__ = ["consumed_capacity", "fit"]


def _round_up(requested: QuantityValue, cap: Capacity) -> QuantityValue:
    if not cap.has_policy:
        return requested
    if cap.range_min is not None:
        low = cap.range_min
        if requested.value < low.value:
            return low
        if cap.range_step is None or cap.range_step.value <= 0:
            return requested
        step = cap.range_step.value
        steps, rest = divmod(requested.value - low.value, step)  # both >= 0 here
        value = low.value + (steps + (1 if rest else 0)) * step
        if value == requested.value:
            return requested
        binary = is_binary_quantity(cap.range_step.text) or is_binary_quantity(low.text)
        return QuantityValue(value, format_quantity(value, binary))
    if cap.valid_values:
        for valid in cap.valid_values:
            if requested.value <= valid.value:
                return valid
    return requested


def _violates(amount: QuantityValue, cap: Capacity) -> bool:
    if not cap.has_policy:
        return False
    if cap.default is not None and amount.value == cap.default.value:
        return False
    if cap.range_min is not None:
        if cap.range_max is not None and amount.value > cap.range_max.value:
            return True
        if cap.range_step is not None and cap.range_step.value > 0:
            return (amount.value - cap.range_min.value) % cap.range_step.value != 0
        return False
    if cap.valid_values:
        return all(amount.value != v.value for v in cap.valid_values)
    return False


def consumed_capacity(
    req: Req, device: CandidateDevice
) -> tuple[dict[str, QuantityValue] | None, str | None]:
    """What the device gives up for the request, by qualified name, or why it cannot.

    The reason covers a capacity the device lacks and a policy violation; whether the
    amount still fits is :func:`fit`'s business. Raises :class:`AllocationError` (naming
    the request and both spellings) when the request names a capacity of the device both
    with and without the driver's domain.
    """
    resolved: dict[str, QuantityValue] = {}
    spelled: dict[str, str] = {}
    missing: str | None = None
    for name, value in (req.capacity or {}).items():
        qualified = qualify(name, device.driver)
        if qualified not in device.capacity:
            missing = missing or name
            continue
        if qualified in spelled:
            bare, full = sorted((name, spelled[qualified]), key=len)
            raise AllocationError(
                f"{req.who}: capacity {bare!r} requested both as {bare!r} and as {full!r}, "
                f"which name the same capacity of {device.driver} devices: request it once",
                node_dependent=True,
            )
        resolved[qualified] = value
        spelled[qualified] = name
    if missing is not None:
        return None, f"has no capacity {missing}"
    consumed: dict[str, QuantityValue] = {}
    for qualified, cap in device.capacity.items():
        requested = resolved.get(qualified)
        if requested is None:
            amount = cap.default if cap.default is not None else cap.value
        else:
            amount = _round_up(requested, cap)
        if amount.value < 0:
            return None, f"capacity {cap.name}: negative amount {amount.text}"
        if _violates(amount, cap):
            return None, f"capacity {cap.name}: {amount.text} is not allowed by its request policy"
        consumed[qualified] = amount
    return consumed, None


def fit(
    consumed: Mapping[str, QuantityValue],
    device: CandidateDevice,
    in_use: Mapping[str, Decimal] | None,
    allocating: Mapping[str, Decimal] | None,
) -> str | None:
    """Why ``consumed`` does not fit next to what is in use, or None when it fits."""
    for qualified, amount in consumed.items():
        cap = device.capacity[qualified]
        used = Decimal(0)
        if in_use:
            used += in_use.get(qualified, Decimal(0))
        if allocating:
            used += allocating.get(qualified, Decimal(0))
        if used + amount.value > cap.value.value:
            free = cap.value.value - used
            return (
                f"not enough {cap.name}: needs {amount.text}, "
                f"{display_quantity(max(free, Decimal(0)))} of {cap.value.text} free"
            )
    return None
