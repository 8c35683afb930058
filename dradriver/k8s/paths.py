"""REST paths of Kubernetes objects."""

from __future__ import annotations

RESOURCE_V1 = "resource.k8s.io/v1"


def path_for(
    api_version: str, plural: str, namespace: str | None = None, name: str | None = None
) -> str:
    """The REST path of a collection or object, e.g. ``path_for("v1", "pods", "default")``."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespace:
        prefix += f"/namespaces/{namespace}"
    prefix += f"/{plural}"
    return f"{prefix}/{name}" if name else prefix
