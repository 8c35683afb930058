"""Run dradriver's kubelet plugin against the local cluster, as a DaemonSet pod would.

The plugin runs as a host process (not in a container, on either runtime), but
with the identity a real deployment has: the manifests' RBAC, and a service
account token bound to a placeholder pod on the node, so the apiserver sees
the same node association (``authentication.kubernetes.io/node-name``) and
the node-scoped admission policy applies. On a node with the real runtime the
plugin writes its CDI specs into the dir that node's containerd reads.
"""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from devtools import paths
from devtools.cluster.api import AdminAPI
from devtools.cluster.apply import apply, apply_manifests
from devtools.cluster.config import write_kubeconfig
from devtools.cluster.local import LocalCluster
from devtools.cluster.process import ManagedProcess
from devtools.cluster.wait import wait_until
from dradriver.k8s.paths import RESOURCE_V1, path_for

NAMESPACE = "dradriver"
SERVICE_ACCOUNT = "dradriver-kubeletplugin"
PLUGIN_MANIFESTS = ("rbac.yaml", "deviceclass.yaml")
PLACEHOLDER_IMAGE = "registry.k8s.io/pause:3.10"
# The admission policies that confine the plugin to its node, pool and driver.
PLUGIN_POLICIES = ("slice-node-policy.yaml", "claim-status-policy.yaml")
POLICY_DRIVERS_VARIABLE = "drivers"


def install_plugin_policies(api: AdminAPI, driver: str) -> None:
    """Install the plugin's admission policies, allowing ``driver`` besides those already allowed.

    The manifests name one driver; tests run plugins of several drivers under the one service
    account at the same time, so the installed list is the union of all of them. The list is a
    CEL list literal of strings, which is JSON as well.
    """
    for name in PLUGIN_POLICIES:
        for doc in yaml.safe_load_all((paths.MANIFESTS / "kubeletplugin" / name).read_text()):
            if not doc:
                continue
            if doc["kind"] == "ValidatingAdmissionPolicy":
                variable = _drivers_variable(doc)
                drivers = set(json.loads(variable["expression"])) | {driver}
                installed = api.get_or_none(
                    path_for(
                        "admissionregistration.k8s.io/v1",
                        "validatingadmissionpolicies",
                        name=doc["metadata"]["name"],
                    )
                )
                if installed is not None:
                    drivers |= _installed_drivers(installed)
                variable["expression"] = json.dumps(sorted(drivers))
            apply(api, doc)


def _drivers_variable(policy: dict[str, Any]) -> dict[str, Any]:
    variables: list[dict[str, Any]] = policy["spec"].get("variables", [])
    for variable in variables:
        if variable["name"] == POLICY_DRIVERS_VARIABLE:
            return variable
    raise ValueError(f"policy {policy['metadata']['name']} has no variable 'drivers'")


def _installed_drivers(policy: dict[str, Any]) -> set[str]:
    """The drivers an installed policy allows; none if it predates the variable."""
    try:
        return set(json.loads(_drivers_variable(policy)["expression"]))
    except ValueError:
        return set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plugin_identity(
    api: AdminAPI, cluster: LocalCluster, node: str, workdir: Path, driver: str = "dradriver.dev"
) -> Path:
    """A kubeconfig for the plugin's service account of ``driver``, bound to a pod on ``node``."""
    apply_manifests(api, "namespace.yaml", *(f"kubeletplugin/{name}" for name in PLUGIN_MANIFESTS))
    install_plugin_policies(api, driver)
    wait_until(
        "plugin ServiceAccount",
        lambda: api.get_or_none(path_for("v1", "serviceaccounts", NAMESPACE, SERVICE_ACCOUNT)),
        30,
    )
    pod_name = f"dradriver-kubeletplugin-{node}"
    pod = api.get_or_none(path_for("v1", "pods", NAMESPACE, pod_name))
    if pod is None:
        pod = api.create(
            path_for("v1", "pods", NAMESPACE),
            {
                "metadata": {
                    "name": pod_name,
                    "labels": {"app.kubernetes.io/name": SERVICE_ACCOUNT},
                },
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "automountServiceAccountToken": False,
                    # An image every runtime has: on the real one the
                    # placeholder runs, and no registry is reachable.
                    "containers": [
                        {
                            "name": "plugin",
                            "image": PLACEHOLDER_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                        }
                    ],
                },
            },
        )
    bound = {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod["metadata"]["uid"]}
    return service_account_kubeconfig(
        api, cluster, NAMESPACE, SERVICE_ACCOUNT, workdir / "plugin.kubeconfig", bound
    )


def service_account_kubeconfig(
    api: AdminAPI,
    cluster: LocalCluster,
    namespace: str,
    account: str,
    path: Path,
    bound_object: dict[str, Any] | None = None,
) -> Path:
    """A kubeconfig with a fresh token of a ServiceAccount (bound to ``bound_object`` if given)."""
    spec: dict[str, Any] = {"expirationSeconds": 86400}
    if bound_object is not None:
        spec["boundObjectRef"] = bound_object
    token = api.create(
        path_for("v1", "serviceaccounts", namespace, account) + "/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )["status"]["token"]
    write_kubeconfig(
        path, cluster.layout.apiserver_url, cluster.layout.pki / "ca.crt", account, token=token
    )
    return path


@dataclass
class NodePlugin:
    """A running dradriver-kubeletplugin process for one node."""

    node: str
    driver: str
    config: Path
    kubeconfig: Path
    workdir: Path
    kubelet_root: Path
    cdi_dir: Path
    port: int
    instance: str = ""
    process: ManagedProcess | None = None

    @property
    def name(self) -> str:
        return f"kubeletplugin-{self.instance}" if self.instance else "kubeletplugin"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "kubeletplugin.main",
            f"--config={self.config}",
            f"--node-name={self.node}",
            f"--kubeconfig={self.kubeconfig}",
            f"--kubelet-root={self.kubelet_root}",
            f"--cdi-dir={self.cdi_dir}",
            f"--state-dir={self.state_dir}",
            f"--http-address=127.0.0.1:{self.port}",
            "--health-interval=1",
            f"--instance={self.instance}",
        ]
        self.process = ManagedProcess.start(
            self.name, argv, log_path=self.log_path, cwd=self.workdir / f"{self.name}.cwd"
        )

    def ready(self) -> bool:
        """Registered with the kubelet (/readyz); raises :class:`ProcessDied` if it exited."""
        if self.process is not None:
            self.process.check()
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 60) -> None:
        if self.process is None:
            raise RuntimeError(f"{self.name} for {self.node} is not started")
        self.process.wait_ready("the kubelet plugin to register", self.ready, timeout)

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=15)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: the crash the ledger must survive."""
        if self.process is not None:
            self.process.kill()
        self.process = None


def start_node_plugin(
    cluster: LocalCluster,
    api: AdminAPI,
    config: Path,
    workdir: Path,
    node: str | None = None,
    driver: str = "dradriver.dev",
) -> NodePlugin:
    node = node or cluster.layout.node_name
    layouts = {n.name: n for n in cluster.layout.all_nodes()}
    if node not in layouts:
        raise ValueError(f"the local cluster has no node {node!r} (nodes: {sorted(layouts)})")
    kubeconfig = plugin_identity(api, cluster, node, workdir, driver)
    plugin = NodePlugin(
        node=node,
        driver=driver,
        config=config,
        kubeconfig=kubeconfig,
        workdir=workdir,
        kubelet_root=layouts[node].root,
        # containerd reads specs from its node's CDI dir only; the fake
        # runtime reads none, so there each plugin keeps its own.
        cdi_dir=layouts[node].cdi_dir if layouts[node].runtime == "real" else workdir / "cdi",
        port=free_port(),
    )
    plugin.start()
    plugin.wait_ready()
    return plugin


def node_slices(api: AdminAPI, node: str, driver: str) -> list[dict[str, Any]]:
    return api.items(
        path_for(RESOURCE_V1, "resourceslices"),
        fieldSelector=f"spec.nodeName={node},spec.driver={driver}",
    )


def wait_for_slices(
    api: AdminAPI, node: str, driver: str, devices: int, timeout: float = 30
) -> list[dict[str, Any]]:
    def published() -> list[dict[str, Any]] | None:
        slices = node_slices(api, node, driver)
        count = sum(len(s["spec"].get("devices", [])) for s in slices)
        return slices if count == devices else None

    return wait_until(f"{devices} devices published for {node}", published, timeout)


__all__ = [
    "NodePlugin",
    "install_plugin_policies",
    "node_slices",
    "plugin_identity",
    "start_node_plugin",
    "wait_for_slices",
]
