"""Run dradriver's kubelet plugin against the local cluster, as a DaemonSet pod would.

The plugin runs as a host process (the fake runtime runs no containers), but
with the identity a real deployment has: the manifests' RBAC, and a service
account token bound to a placeholder pod on the node, so the apiserver sees
the same node association (``authentication.kubernetes.io/node-name``) and
the node-scoped admission policy applies.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from devtools import paths
from devtools.cluster.api import AdminAPI, APIError, path_for, wait_until
from devtools.cluster.config import write_kubeconfig
from devtools.cluster.local import LocalCluster
from devtools.cluster.process import log_tail
from dradriver.k8s.paths import RESOURCE_V1

NAMESPACE = "dradriver"
SERVICE_ACCOUNT = "dradriver-kubeletplugin"
MANIFESTS = paths.MANIFESTS
PLUGIN_MANIFESTS = ("rbac.yaml", "deviceclass.yaml")
# The admission policies that confine the plugin to its node, pool and driver.
PLUGIN_POLICIES = ("slice-node-policy.yaml", "claim-status-policy.yaml")
POLICY_DRIVERS_VARIABLE = "drivers"

# kind -> (apiVersion path segment, plural, namespaced)
_KINDS = {
    "Namespace": ("v1", "namespaces", False),
    "ServiceAccount": ("v1", "serviceaccounts", True),
    "ConfigMap": ("v1", "configmaps", True),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings", True),
    "DeviceClass": (RESOURCE_V1, "deviceclasses", False),
    "ValidatingAdmissionPolicy": (
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
    "CustomResourceDefinition": ("apiextensions.k8s.io/v1", "customresourcedefinitions", False),
}


def apply(api: AdminAPI, doc: dict[str, Any]) -> None:
    """Create the object, or replace it if it exists."""
    version, plural, namespaced = _KINDS[doc["kind"]]
    ns = doc["metadata"].get("namespace") if namespaced else None
    name = doc["metadata"]["name"]
    current = api.get_or_none(path_for(version, plural, ns, name))
    if current is None:
        api.create(path_for(version, plural, ns), doc)
    else:
        body = {
            **doc,
            "metadata": {
                **doc["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        api.request("PUT", path_for(version, plural, ns, name), json=body)


def apply_file(api: AdminAPI, path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            apply(api, doc)


def install_plugin_policies(api: AdminAPI, driver: str) -> None:
    """Install the plugin's admission policies, allowing ``driver`` besides those already allowed.

    The manifests name one driver; tests run plugins of several drivers under the one service
    account at the same time, so the installed list is the union of all of them. The list is a
    CEL list literal of strings, which is JSON as well.
    """
    for name in PLUGIN_POLICIES:
        for doc in yaml.safe_load_all((MANIFESTS / "kubeletplugin" / name).read_text()):
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
    for name in PLUGIN_MANIFESTS:
        apply_file(api, MANIFESTS / "kubeletplugin" / name)
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
                    "containers": [{"name": "plugin", "image": "dradriver:0.1.0"}],
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
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        suffix = f"-{self.instance}" if self.instance else ""
        return self.workdir / f"kubeletplugin{suffix}.log"

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
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True
        )
        log.close()

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(
                f"dradriver-kubeletplugin exited {self.proc.returncode}:\n{log_tail(self.log_path)}"
            )
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 60) -> None:
        try:
            wait_until("the kubelet plugin to register", self.ready, timeout)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{log_tail(self.log_path)}") from e

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: the crash the ledger must survive."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


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
        cdi_dir=workdir / "cdi",
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
    "APIError",
    "NodePlugin",
    "apply",
    "apply_file",
    "install_plugin_policies",
    "plugin_identity",
    "start_node_plugin",
    "wait_for_slices",
]
