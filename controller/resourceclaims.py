"""ResourceClaim paths and fields that every reconciler of the controller reads: the REST
path of a claim, its consumers, the node of its allocation, whether it is one of our
fence claims, and an allocation stamped with its time.

Pure (no I/O).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dradriver.k8s.objects import Obj, labels_of
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.runtime import split_key

FENCE_LABEL = "dradriver.dev/fence"
"""``dradriver.dev/fence: "true"`` marks a fence claim (:mod:`controller.claims.fence_rules`)."""


def claim_path(key: str) -> str:
    """The REST path of the ResourceClaim ``namespace/name``."""
    namespace, name = split_key(key)
    return path_for(RESOURCE_V1, "resourceclaims", namespace, name)


def reserved_for(claim: Mapping[str, Any]) -> list[Obj]:
    return list((claim.get("status") or {}).get("reservedFor") or [])


def is_fence(claim: Mapping[str, Any] | None) -> bool:
    """Whether ``claim`` is one of the controller's fence claims (its label)."""
    return claim is not None and labels_of(claim).get(FENCE_LABEL) == "true"


def allocated_node(allocation: Mapping[str, Any]) -> str | None:
    """The node an allocation is pinned to (``matchFields metadata.name In [node]``)."""
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and len(field.get("values") or []) == 1:
                return str(field["values"][0])
    return None


def with_timestamp(allocation: Obj, now: str) -> Obj:
    out = copy.deepcopy(allocation)
    out["allocationTimestamp"] = now
    return out
