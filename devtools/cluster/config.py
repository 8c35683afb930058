"""Layout and configuration files of the local cluster (paths, ports, kubeconfigs, kubelet)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from devtools.cluster import containerd

NODE_NAME = "node-1"
SERVICE_CIDR = "10.96.0.0/24"
SERVICE_IP = "10.96.0.1"
# What runs a node's pods: the upstream fake CRI (no containers) or containerd + runc.
Runtime = Literal["fake", "real"]
RUNTIMES: tuple[Runtime, ...] = get_args(Runtime)
# The kubelet and the apiserver talk over loopback: the apiserver reaches a
# kubelet at its Node's InternalIP (pod logs), which is patched to this.
NODE_IP = "127.0.0.1"


def parse_runtime(text: str) -> Runtime:
    for runtime in RUNTIMES:
        if text == runtime:
            return runtime
    raise ValueError(f"runtime {text!r} must be one of {', '.join(RUNTIMES)}")


def default_state_dir() -> Path:
    env = os.environ.get("DRADRIVER_CLUSTER_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "dradriver" / "cluster"


def parse_feature_gates(text: str) -> dict[str, bool]:
    """Parse ``A=true,B=false`` (the Kubernetes flag syntax) into a dict."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false") or not name:
            raise ValueError(f"feature gate {item!r} must look like Name=true or Name=false")
        gates[name] = value.lower() == "true"
    return gates


def format_feature_gates(gates: dict[str, bool]) -> str:
    return ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(gates.items()))


@dataclass(frozen=True)
class Ports:
    etcd_client: int = 2379
    etcd_peer: int = 2380
    apiserver: int = 6443
    controller_manager: int = 10257
    scheduler: int = 10259
    kubelet: int = 10250
    kubelet_healthz: int = 10248

    def by_owner(self) -> dict[str, int]:
        return {
            "etcd (client)": self.etcd_client,
            "etcd (peer)": self.etcd_peer,
            "kube-apiserver": self.apiserver,
            "kube-controller-manager": self.controller_manager,
            "kube-scheduler": self.scheduler,
            "kubelet": self.kubelet,
            "kubelet (healthz)": self.kubelet_healthz,
        }


@dataclass(frozen=True)
class NodeLayout:
    """One kubelet's node: name, root dir, ports, container runtime.

    Node 1 uses the standard /var/lib/kubelet; further nodes get their own root
    dir and ports so several kubelets share this machine. The device manager's
    dir (/var/lib/kubelet/device-plugins) does not follow --root-dir, so those
    kubelets run in their own mount namespace with ``device_plugins`` mounted
    over it.

    With the real runtime the node has a containerd of its own
    (``containerd``, None for the fake runtime) whose CRI socket the kubelet
    uses, and which reads CDI specs from ``cdi_dir``: the node plugin must
    write its specs there.
    """

    index: int
    name: str
    root: Path
    port: int
    healthz_port: int
    runtime: Runtime
    cri_socket: Path
    config: Path
    device_plugins: Path | None
    pod_logs: Path
    cdi_dir: Path
    containerd: containerd.Layout | None

    @property
    def marker(self) -> Path:
        # Marks a kubelet root dir as ours, so teardown may delete it.
        return self.root / ".dradriver-local-cluster"

    @property
    def user(self) -> str:
        """The kubeconfig/certificate name of this node's kubelet."""
        return "kubelet" if self.index == 1 else f"kubelet-{self.name}"


@dataclass(frozen=True)
class Layout:
    """Every path the cluster uses; all state lives under ``state_dir``, never in a repo."""

    state_dir: Path
    kubelet_root: Path = Path("/var/lib/kubelet")
    node_name: str = NODE_NAME
    ports: Ports = field(default_factory=Ports)
    nodes: int = 1
    # The runtime of node-1; further nodes always run the fake one, since their
    # kubelets live in mount namespaces of their own (docs/contributing/local-cluster.md).
    runtime: Runtime = "fake"

    def node(self, index: int) -> NodeLayout:
        """Node ``index`` (1-based)."""
        if index == 1:
            name, root = self.node_name, self.kubelet_root
            port, healthz, device_plugins = self.ports.kubelet, self.ports.kubelet_healthz, None
        else:
            name = f"node-{index}"
            root = self.kubelet_root.with_name(f"{self.kubelet_root.name}-{name}")
            port, healthz = 11250 + index, 11350 + index
            device_plugins = self.state_dir / name / "device-plugins"
        runtime: Runtime = self.runtime if index == 1 else "fake"
        ctrd = self.containerd_layout(name) if runtime == "real" else None
        return NodeLayout(
            index=index,
            name=name,
            root=root,
            port=port,
            healthz_port=healthz,
            runtime=runtime,
            cri_socket=(ctrd.address if ctrd else self.state_dir / "run" / f"fakecri-{name}.sock"),
            config=self.state_dir / f"kubelet-{name}.yaml",
            device_plugins=device_plugins,
            pod_logs=self.state_dir / "pod-logs" / name,
            cdi_dir=self.state_dir / "cdi" / name,
            containerd=ctrd,
        )

    def containerd_layout(self, node: str) -> containerd.Layout:
        """Where ``node``'s containerd keeps its state, all of it under the cluster's.

        Only the shim sockets live elsewhere: containerd allows their dir 42
        characters, so it is ``/run/drd-<digest of the state dir>-<node>``,
        unique per cluster state dir.
        """
        digest = hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:8]
        return containerd.Layout(
            base=self.state_dir / "containerd" / node,
            shim_socket_dir=Path("/run") / f"drd-{digest}-{node}",
        )

    def all_nodes(self) -> list[NodeLayout]:
        return [self.node(i) for i in range(1, self.nodes + 1)]

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    @property
    def last_logs(self) -> Path:
        """Where ``down`` moves the logs of the cluster it stopped."""
        return self.state_dir.with_name(self.state_dir.name + "-last-logs")

    @property
    def admin_kubeconfig(self) -> Path:
        return self.state_dir / "admin.kubeconfig"

    def kubeconfig(self, user: str) -> Path:
        return self.state_dir / "kubeconfigs" / f"{user}.kubeconfig"

    def workdir(self, component: str) -> Path:
        return self.state_dir / "work" / component

    @property
    def etcd_data(self) -> Path:
        return self.state_dir / "etcd-data"

    @property
    def cri_socket(self) -> Path:
        return self.node(1).cri_socket

    @property
    def kubelet_config(self) -> Path:
        return self.node(1).config

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def marker(self) -> Path:
        return self.node(1).marker


def write_kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    user: str,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
) -> None:
    """A one-context kubeconfig (mode 0600) with a client certificate or a bearer token."""
    credentials: dict[str, Any] = (
        {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    )
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "dradriver-local",
                "cluster": {"server": server, "certificate-authority": str(ca)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [
            {"name": "dradriver-local", "context": {"cluster": "dradriver-local", "user": user}}
        ],
        "current-context": "dradriver-local",
    }
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f)


def kubelet_config(
    node: NodeLayout,
    ca: Path,
    serving_cert: Path,
    serving_key: Path,
    gates: dict[str, bool],
) -> dict[str, Any]:
    """A KubeletConfiguration that runs on this kind of machine (cgroup v1, either runtime).

    The real runtime needs nothing else here: the kubelet takes the cgroup
    driver (cgroupfs) from containerd's runc options, and writes container logs
    to ``podLogsDir``, where containerd appends to them.
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": node.port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.healthz_port,
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{node.cri_socket}",
        # Both runtimes serve the image service on the runtime socket (the
        # kubelet's default, spelled out as the real-runtime notes ask).
        "imageServiceEndpoint": f"unix://{node.cri_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        # 1.36 refuses cgroup v1 hosts unless told otherwise.
        "failCgroupV1": False,
        "localStorageCapacityIsolation": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "volumePluginDir": str(node.root / "volume-plugins"),
        "podLogsDir": str(node.pod_logs),
        "resolvConf": "",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        # bench.pods runs 200 pods with claims on node-1 (the default is 110).
        "maxPods": 250,
        "featureGates": gates,
    }


def write_yaml(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
