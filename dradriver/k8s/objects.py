"""Kubernetes objects as plain JSON dicts: the one type alias every module uses, and the
accessors for the metadata every kind shares.

Objects stay dicts end to end so that no field the server returns is dropped. The
accessors read leniently (a missing field is empty), because objects from a list or a
watch may omit what is empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]
"""A Kubernetes object (or any JSON object inside one), as decoded from the wire."""


def meta(obj: Mapping[str, Any]) -> Obj:
    """``metadata`` (empty if missing)."""
    value: Obj = obj.get("metadata") or {}
    return value


def name_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("name") or "")


def namespace_of(obj: Mapping[str, Any]) -> str:
    """The namespace; empty for a cluster-scoped object."""
    return str(meta(obj).get("namespace") or "")


def uid_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("uid") or "")


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    value: dict[str, str] = meta(obj).get("labels") or {}
    return value


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    value: dict[str, str] = meta(obj).get("annotations") or {}
    return value


def finalizers(obj: Mapping[str, Any]) -> list[str]:
    """A copy of ``metadata.finalizers``: callers build the new list from it."""
    return list(meta(obj).get("finalizers") or [])


def allocation_of(claim: Mapping[str, Any]) -> Obj | None:
    """A ResourceClaim's ``status.allocation``; None when it is missing or empty."""
    value: Obj | None = (claim.get("status") or {}).get("allocation")
    return value or None


def revision(obj: Mapping[str, Any]) -> int:
    """``metadata.resourceVersion`` as a number, 0 when unset or not numeric.

    resourceVersions are opaque by contract, but the apiserver's are etcd revisions:
    one counter across every object, so "this removal happened after that write" can
    be told by comparing them. Only code that needs that order uses this.
    """
    try:
        return int(meta(obj).get("resourceVersion") or 0)
    except ValueError:
        return 0


def now_rfc3339() -> str:
    """Now, in the format of a ``metav1.Time`` field (seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
