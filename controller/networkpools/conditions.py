"""The binding conditions the network pool reconciler writes into a claim's
``status.devices`` entry (``<driver>/attached``, ``<driver>/attach-failed``), and whether
an entry already says the same.

Pure (no I/O).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from dradriver.k8s.objects import Obj


def condition(
    type_: str, status: Literal["True", "False"], reason: str, message: str, now: str
) -> Obj:
    """A condition (``metav1.Condition``), its message cut to the API's 1024 characters."""
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": now,
    }


def same_conditions(entry: Obj, conditions: list[Obj], data: Obj | None) -> bool:
    """Whether ``entry`` has these conditions (type, status, reason) and ``data``."""

    def essence(items: Iterable[Obj]) -> list[tuple[Any, ...]]:
        return sorted((c.get("type"), c.get("status"), c.get("reason")) for c in items)

    same = essence(entry.get("conditions") or []) == essence(conditions)
    if data is None:
        return same
    current = {k: v for k, v in (entry.get("data") or {}).items() if k in data}
    return same and json.dumps(current, sort_keys=True) == json.dumps(data, sort_keys=True)
