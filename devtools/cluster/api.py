"""The local cluster's admin client (tests, demo, probes, benchmarks).

It is dradriver's :class:`~dradriver.k8s.client.SyncKubeClient` (plain JSON dicts, so
nothing the server returns is dropped; refusals raise
:class:`~dradriver.k8s.client.KubeAPIError`) with the cluster's admin certificate, plus
the conveniences tests need: the items of a list, namespaces that are usable or gone
when the call returns, a container's log (plain text, the one non-JSON answer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devtools.cluster.wait import wait_until
from dradriver.k8s.client import SyncKubeClient, connection_from_files
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import path_for

__all__ = ["AdminAPI"]


class AdminAPI(SyncKubeClient):
    def __init__(self, server: str, pki_dir: Path) -> None:
        conn = connection_from_files(
            server, pki_dir / "ca.crt", pki_dir / "admin.crt", pki_dir / "admin.key"
        )
        super().__init__(conn, "dradriver-devtools")

    def items(self, path: str, **params: Any) -> list[Obj]:
        items: list[Obj] = self.list(path, **params).get("items", [])
        return items

    def delete_namespace(self, name: str, timeout: float = 120) -> None:
        """Delete a namespace (if it exists) and wait until it is gone, its pods too."""
        path = path_for("v1", "namespaces", name=name)
        self.delete(path)
        wait_until(f"namespace {name} deleted", lambda: self.get_or_none(path) is None, timeout)

    def create_namespace(self, name: str, timeout: float = 60) -> None:
        """Create a namespace and wait for its default ServiceAccount (pods need it)."""
        self.create("/api/v1/namespaces", {"metadata": {"name": name}})
        wait_until(
            f"ServiceAccount {name}/default",
            lambda: self.get_or_none(path_for("v1", "serviceaccounts", name, "default")),
            timeout,
        )

    def text(self, path: str) -> str:
        """A plain-text answer (``/metrics``, a node's proxied ``/metrics``)."""
        return self.get_text(path)

    def pod_log(
        self, namespace: str, pod: str, container: str | None = None, previous: bool = False
    ) -> str:
        """What a container wrote (the pod log API: apiserver -> kubelet -> runtime).

        ``previous`` reads the container's last terminated instance. Refusals
        (no such pod, container not started yet) raise :class:`KubeAPIError`.
        """
        path = path_for("v1", "pods", namespace, pod) + "/log"
        params: dict[str, str] = {}
        if container is not None:
            params["container"] = container
        if previous:
            params["previous"] = "true"
        return self.get_text(path, **params)
