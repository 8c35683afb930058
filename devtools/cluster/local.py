"""A real Kubernetes cluster on loopback, for tests and the demo.

``LocalCluster.up`` starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, a container runtime and a kubelet per node (``node-1`` ...),
waits for each to be ready, and records what it started in a state file so
that another process (``dradriver cluster down``) can stop exactly those
processes, restore the host sysctls the kubelet changes and unmount what it
mounted.

The runtime of node-1 is the upstream fake CRI (default: no containers run) or,
with ``Layout(runtime="real")``, a containerd of its own running real
containers with runc (:mod:`devtools.cluster.containerd`, configured as
shared/reference/real-runtime.md found necessary): its images are imported
before the kubelet starts, the kubelet gets ``--node-ip=127.0.0.1`` and the
apiserver ``--kubelet-preferred-address-types=InternalIP``, and the Node's
addresses are patched once to ``InternalIP 127.0.0.1``, so the pod log API
reaches the kubelet over loopback and never resolves a node name by DNS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from devtools.cluster import containerd, images, kwok, kwokbin, pki, runtimebin
from devtools.cluster.api import AdminAPI
from devtools.cluster.binaries import KubeBinaries, ensure_binaries, resolve_version
from devtools.cluster.config import (
    NODE_IP,
    SERVICE_CIDR,
    SERVICE_IP,
    Layout,
    NodeLayout,
    format_feature_gates,
    kubelet_config,
    parse_runtime,
    write_kubeconfig,
    write_yaml,
)
from devtools.cluster.process import ManagedProcess, ProcessRecord
from devtools.cluster.wait import wait_until
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.paths import path_for
from dradriver.log import get_logger

log = get_logger("cluster")

# Host sysctls the kubelet sets at start; restored at teardown.
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
# The older resource.k8s.io versions (and DeviceTaintRule) are off by default.
RUNTIME_CONFIG = (
    "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true,resource.k8s.io/v1alpha3=true"
)
# libcni's result cache: containerd's CRI has no setting for it. CNI DEL (pod
# sandbox removal) empties it; a dir the cluster created goes at teardown.
CNI_CACHE_DIR = Path("/var/lib/cni")
# While a component starts, its probe fails to connect or is refused: "not ready yet".
STARTING = (httpx.HTTPError, KubeAPIError, OSError)


class ClusterError(RuntimeError):
    """The cluster cannot be started or used; the message says why and what to do."""


class AlreadyRunning(ClusterError):
    pass


@dataclass
class ClusterState:
    """What ``up`` started, persisted so ``down`` and ``status`` can find it."""

    kubeconfig: str
    node_name: str
    kubelet_root: str
    feature_gates: dict[str, bool]
    components: list[ProcessRecord] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    sysctls: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # node-1's runtime ("fake" or "real"); state files from before it say nothing.
    runtime: str = "fake"
    # Per containerd component: the k8s.io cgroup dirs that existed before it
    # started (teardown keeps them).
    cgroups_before: dict[str, list[str]] = field(default_factory=dict)
    # Whether `up` created /var/lib/cni (libcni's cache), so `down` removes it.
    created_cni_cache: bool = False
    # The Kubernetes release the components run; state files from before the
    # version matrix ran the only one there was.
    kube_version: str = "v1.36.3"
    # Simulated (kwok) nodes next to the kubelets (devtools.cluster.kwok).
    kwok_nodes: int = 0

    @classmethod
    def load(cls, path: Path) -> ClusterState | None:
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ClusterError(
                f"cluster state file {path} is unreadable ({e}); remove it after making "
                "sure no cluster components run"
            ) from e
        raw["components"] = [ProcessRecord(**c) for c in raw.get("components", [])]
        return cls(**raw)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    def alive(self) -> list[ProcessRecord]:
        return [c for c in self.components if c.alive()]


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root``, deepest first."""
    found = []
    prefix = str(root).rstrip("/")
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def unmount_all(root: Path) -> None:
    for _ in range(3):
        points = _mounts_under(root)
        if not points:
            return
        for point in points:
            subprocess.run(["umount", point], capture_output=True, check=False)
    for point in _mounts_under(root):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


class LocalCluster:
    def __init__(
        self,
        layout: Layout,
        feature_gates: dict[str, bool] | None = None,
        kube_version: str | None = None,
        kwok_nodes: int = 0,
        kwok_driver: str = "dradriver.dev",
    ) -> None:
        self.layout = layout
        self.feature_gates = dict(feature_gates or {})
        self.kwok_nodes = kwok_nodes
        self.kwok_driver = kwok_driver
        # Resolved now, so a bad choice fails before anything starts.
        self.kube_version = resolve_version(kube_version)

    # ----- public operations -------------------------------------------------

    def state(self) -> ClusterState | None:
        return ClusterState.load(self.layout.state_file)

    def running(self) -> ClusterState | None:
        """The state of a cluster whose components are all alive, else None."""
        state = self.state()
        if state and state.components and len(state.alive()) == len(state.components):
            return state
        return None

    def up(self, binaries: KubeBinaries | None = None) -> ClusterState:
        existing = self.state()
        if existing is not None:
            if existing.alive():
                raise AlreadyRunning(
                    f"a local cluster is already running (kubeconfig {existing.kubeconfig}); "
                    "use it, or stop it first with `dradriver cluster down`"
                )
            log.info("cleaning up after a cluster that is no longer running")
            self.down()
        self._check_ports()
        binaries = binaries or ensure_binaries(self.kube_version)
        runtime = self._runtime_binaries()
        self._check_kubelet_root()
        started = time.monotonic()
        state = ClusterState(
            kubeconfig=str(self.layout.admin_kubeconfig),
            node_name=self.layout.node_name,
            kubelet_root=str(self.layout.kubelet_root),
            feature_gates=self.feature_gates,
            nodes=[n.name for n in self.layout.all_nodes()],
            runtime=self.layout.runtime,
            kube_version=binaries.version,
            kwok_nodes=self.kwok_nodes,
        )
        if self.kwok_nodes:
            kwokbin.ensure_kwok()  # a build failure stops `up` before anything starts
        try:
            self._start(binaries, runtime, state, started)
        except BaseException:
            # Leave nothing behind: a half-started cluster would block the next `up`.
            state.save(self.layout.state_file)
            self.down()
            raise
        state.timings["total"] = round(time.monotonic() - started, 2)
        state.save(self.layout.state_file)
        log.info("cluster is up", kubeconfig=state.kubeconfig, seconds=state.timings["total"])
        return state

    def down(self) -> None:
        state = self.state()
        if state is not None:
            runtimes = {runtime_component(n): n for n in self._known_nodes(state)}
            # Kubelet first, so it stops touching mounts (and a node's kubelet
            # before its runtime, whose sandboxes it would recreate); etcd last.
            for record in reversed(state.components):
                node = runtimes.get(record.name)
                if node is not None and node.containerd is not None:
                    before = state.cgroups_before.get(record.name, [])
                    containerd.Containerd.adopt(node.containerd, record, before).stop()
                else:
                    ManagedProcess.adopt(record).stop()
                log.debug("stopped", component=record.name, pid=record.pid)
            self._restore_sysctls(state.sysctls)
            if state.created_cni_cache:
                remove_empty_dirs(CNI_CACHE_DIR)
        for node in self._known_nodes(state):
            if node.containerd is not None:
                containerd.unmount_under([node.containerd.base])
            unmount_all(node.root)
            if node.marker.exists():
                shutil.rmtree(node.root, ignore_errors=True)
        unmount_all(self.layout.state_dir)
        if self.layout.logs.exists():
            # Keep the logs of the last cluster for diagnosis; `up` starts afresh.
            shutil.rmtree(self.layout.last_logs, ignore_errors=True)
            self.layout.logs.rename(self.layout.last_logs)
        if self.layout.state_dir.exists():
            shutil.rmtree(self.layout.state_dir, ignore_errors=True)
        log.info("cluster is down")

    def _known_nodes(self, state: ClusterState | None) -> list[NodeLayout]:
        """The nodes of the recorded cluster (its runtime, not this command's)."""
        count = max(self.layout.nodes, len(state.nodes) if state else 0)
        layout = self.layout
        if state is not None and state.runtime != layout.runtime:
            layout = dataclasses.replace(layout, runtime=parse_runtime(state.runtime))
        return [layout.node(i) for i in range(1, count + 1)]

    def restart_component(
        self, name: str, timeout: float = 90, while_stopped: Callable[[], None] | None = None
    ) -> None:
        """Stop one component and start it again with the same command line (e.g. the kubelet).

        ``while_stopped`` runs between the two (an outage the caller observes or times)."""
        state = self.state()
        if state is None:
            raise ClusterError("no local cluster is running")
        index = next((i for i, c in enumerate(state.components) if c.name == name), None)
        if index is None:
            raise ClusterError(f"the cluster has no component {name!r}")
        old = state.components[index]
        if not old.argv:
            raise ClusterError(
                f"{name} was started by an older dradriver that did not record its command "
                "line; restart the cluster (`dradriver cluster down`, then `up`)"
            )
        ManagedProcess.adopt(old).stop()
        if while_stopped is not None:
            while_stopped()
        process = ManagedProcess.start(
            name, old.argv, log_path=Path(old.log), cwd=self.layout.workdir(name), exe=old.exe
        )
        state.components[index] = process.record
        state.save(self.layout.state_file)
        node = next((n for n in self.layout.all_nodes() if kubelet_component(n) == name), None)
        if node is not None:
            healthz = f"http://127.0.0.1:{node.healthz_port}/healthz"
            wait_until(
                "kubelet /healthz after restart",
                lambda: httpx.get(healthz, timeout=2).status_code == 200,
                timeout,
                watch=[process],
                ignore=STARTING,
            )
            with self.api() as api:
                wait_until(
                    f"node {node.name} Ready after restart",
                    lambda: node_ready(api, node.name),
                    timeout,
                    watch=[process],
                    ignore=STARTING,
                )

    def api(self) -> AdminAPI:
        """An admin client for the apiserver."""
        return AdminAPI(self.layout.apiserver_url, self.layout.pki)

    # ----- start-up ----------------------------------------------------------

    def _check_ports(self) -> None:
        owners = dict(self.layout.ports.by_owner())
        for node in self.layout.all_nodes()[1:]:
            owners[f"kubelet {node.name}"] = node.port
            owners[f"kubelet {node.name} (healthz)"] = node.healthz_port
        taken = [f"{port} ({owner})" for owner, port in owners.items() if not _port_free(port)]
        if taken:
            raise ClusterError(
                "ports needed by the local cluster are taken: "
                + ", ".join(taken)
                + "; stop whatever listens there (`ss -ltnp` shows it) and retry"
            )

    def _check_kubelet_root(self) -> None:
        for node in self.layout.all_nodes():
            root = node.root
            if root.exists() and any(root.iterdir()) and not node.marker.exists():
                raise ClusterError(
                    f"{root} holds files that dradriver's local cluster did not create "
                    "(another kubelet may use it); move them away before `cluster up`"
                )
            root.mkdir(parents=True, exist_ok=True)
            node.marker.write_text("created by dradriver cluster up\n")

    def _pki(self) -> None:
        p = self.layout.pki

        def pair(name: str) -> pki.CertPair:
            return pki.CertPair(p / f"{name}.crt", p / f"{name}.key")

        ca = pki.CertificateAuthority(pair("ca"), "dradriver-local-ca")
        front = pki.CertificateAuthority(pair("front-proxy-ca"), "dradriver-front-proxy-ca")
        pki.write_service_account_keys(p / "sa.key", p / "sa.pub")
        ca.issue(
            pair("apiserver"),
            "kube-apiserver",
            server=True,
            dns=(
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "localhost",
            ),
            ips=("127.0.0.1", SERVICE_IP),
        )
        ca.issue(
            pair("apiserver-kubelet-client"),
            "kube-apiserver-kubelet-client",
            orgs=("system:masters",),
            client=True,
        )
        front.issue(pair("front-proxy-client"), "front-proxy-client", client=True)
        clients: dict[str, tuple[str, tuple[str, ...]]] = {
            "admin": ("kubernetes-admin", ("system:masters",)),
            "controller-manager": ("system:kube-controller-manager", ()),
            "scheduler": ("system:kube-scheduler", ()),
        }
        for node in self.layout.all_nodes():
            clients[node.user] = (f"system:node:{node.name}", ("system:nodes",))
        for user, (cn, orgs) in clients.items():
            ca.issue(pair(user), cn, orgs=orgs, client=True)
            target = (
                self.layout.admin_kubeconfig if user == "admin" else self.layout.kubeconfig(user)
            )
            write_kubeconfig(
                target,
                self.layout.apiserver_url,
                p / "ca.crt",
                user,
                cert=p / f"{user}.crt",
                key=p / f"{user}.key",
            )
        for node in self.layout.all_nodes():
            ca.issue(
                pair(f"{node.user}-serving"),
                node.name,
                server=True,
                dns=(node.name, "localhost"),
                ips=("127.0.0.1",),
            )

    def _runtime_binaries(self) -> RuntimeBinaries | None:
        """containerd, runc, CNI plugins and images, if any node runs the real runtime.

        Built (or found in the cache) before anything starts, so that a cold
        build never runs with a half-started cluster.
        """
        if not any(n.containerd for n in self.layout.all_nodes()):
            return None
        bin_dir = runtimebin.ensure_runtime_binaries()
        return RuntimeBinaries(bin_dir, images.ensure_images(bin_dir / "probe"))

    def _start_containerd(
        self, node: NodeLayout, runtime: RuntimeBinaries, state: ClusterState
    ) -> containerd.Containerd:
        """Configure and start ``node``'s containerd (its images are imported by the caller,
        once the process is in the state file: a failed import must not leave it running)."""
        assert node.containerd is not None
        ctrd = node.containerd
        node.cdi_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        containerd.write_config(
            ctrd,
            runtime.bin_dir,
            cdi_spec_dirs=[node.cdi_dir],
            sandbox_image=images.PAUSE_IMAGE,
        )
        containerd.write_cni_conflist(ctrd)
        if not CNI_CACHE_DIR.exists():
            state.created_cni_cache = True
        name = runtime_component(node)
        handle = containerd.start(ctrd, runtime.bin_dir, timeout=60, name=name)
        state.cgroups_before[name] = list(handle.cgroups_before)
        return handle

    def _start(
        self,
        bins: KubeBinaries,
        runtime: RuntimeBinaries | None,
        state: ClusterState,
        t0: float,
    ) -> None:
        layout, p = self.layout, self.layout.pki
        real_nodes = [n for n in layout.all_nodes() if n.containerd is not None]
        gates = format_feature_gates(self.feature_gates)
        gate_flags = [f"--feature-gates={gates}"] if gates else []
        running: list[ManagedProcess] = []

        def start(name: str, argv: list[str], exe: str | None = None) -> ManagedProcess:
            process = ManagedProcess.start(
                name, argv, log_path=layout.logs / f"{name}.log", cwd=layout.workdir(name), exe=exe
            )
            running.append(process)
            state.components.append(process.record)
            state.save(layout.state_file)
            return process

        def wait_for(what: str, probe: Callable[[], object], timeout: float) -> None:
            """Wait for one component; fail at once if any started so far has died."""
            wait_until(what, probe, timeout, watch=running, ignore=STARTING)

        def mark(step: str) -> None:
            state.timings[step] = round(time.monotonic() - t0, 2)

        self._pki()
        mark("pki")
        ports = layout.ports
        start(
            "etcd",
            [
                str(bins["etcd"]),
                "--name=default",
                f"--data-dir={layout.etcd_data}",
                f"--listen-client-urls=http://127.0.0.1:{ports.etcd_client}",
                f"--advertise-client-urls=http://127.0.0.1:{ports.etcd_client}",
                f"--listen-peer-urls=http://127.0.0.1:{ports.etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{ports.etcd_peer}",
                f"--initial-cluster=default=http://127.0.0.1:{ports.etcd_peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        wait_for(
            "etcd",
            lambda: (
                httpx.get(f"http://127.0.0.1:{ports.etcd_client}/health", timeout=2).status_code
                == 200
            ),
            60,
        )
        mark("etcd")

        start(
            "kube-apiserver",
            [
                str(bins["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports.apiserver}",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
                # No kube-proxy: a webhook registered by Service (the Helm chart's) is
                # called at the Service's endpoints, not at its unroutable ClusterIP.
                "--enable-aggregator-routing=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
                f"--runtime-config={RUNTIME_CONFIG}",
                # Reach kubelets (pod logs) at the Node's InternalIP, patched to
                # 127.0.0.1 below: the default prefers the Hostname, resolved by DNS.
                *(["--kubelet-preferred-address-types=InternalIP"] if real_nodes else []),
                *gate_flags,
            ],
        )
        with self.api() as api:
            # /readyz answers 500 until every readiness check passes (a KubeAPIError).
            wait_for("kube-apiserver /readyz", lambda: api.get("/readyz"), 90)
        mark("kube-apiserver")

        common = [
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
            f"--client-ca-file={p / 'ca.crt'}",
            *gate_flags,
        ]
        kcm_config = layout.kubeconfig("controller-manager")
        kcm = start(
            "kube-controller-manager",
            [
                str(bins["kube-controller-manager"]),
                f"--kubeconfig={kcm_config}",
                f"--authentication-kubeconfig={kcm_config}",
                f"--authorization-kubeconfig={kcm_config}",
                f"--secure-port={ports.controller_manager}",
                "--controllers=*,device-taint-eviction-controller",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={p / 'sa.key'}",
                f"--root-ca-file={p / 'ca.crt'}",
                f"--cluster-signing-cert-file={p / 'ca.crt'}",
                f"--cluster-signing-key-file={p / 'ca.key'}",
                f"--flex-volume-plugin-dir={layout.state_dir / 'flexvolume'}",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
                *kwok.controller_manager_args(self.kwok_nodes),
                *common,
            ],
        )
        sched_config = layout.kubeconfig("scheduler")
        sched = start(
            "kube-scheduler",
            [
                str(bins["kube-scheduler"]),
                f"--kubeconfig={sched_config}",
                f"--authentication-kubeconfig={sched_config}",
                f"--authorization-kubeconfig={sched_config}",
                f"--secure-port={ports.scheduler}",
                *common,
            ],
        )
        for comp, port in ((kcm, ports.controller_manager), (sched, ports.scheduler)):
            wait_for(
                f"{comp.name} /healthz",
                lambda port=port: (
                    httpx.get(  # type: ignore[misc]
                        f"https://127.0.0.1:{port}/healthz", verify=False, timeout=2
                    ).status_code
                    == 200
                ),
                60,
            )
        mark("control-plane")

        state.sysctls = self._save_sysctls()
        state.save(layout.state_file)
        for node in layout.all_nodes():
            if node.containerd is not None:
                assert runtime is not None
                handle = self._start_containerd(node, runtime, state)
                running.append(handle.process)
                state.components.append(handle.process.record)
                state.save(layout.state_file)
                # Before the kubelet starts: it would try to pull them.
                images.import_images(
                    runtime.bin_dir / "ctr", str(handle.layout.address), runtime.images.values()
                )
                mark(f"containerd-{node.name}")
            else:
                node.cri_socket.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                start(
                    runtime_component(node),
                    [str(bins["fakecri"]), f"--endpoint=unix://{node.cri_socket}"],
                )
                wait_for(f"fake CRI socket of {node.name}", node.cri_socket.exists, 30)
            write_yaml(
                node.config,
                kubelet_config(
                    node,
                    p / "ca.crt",
                    p / f"{node.user}-serving.crt",
                    p / f"{node.user}-serving.key",
                    self.feature_gates,
                ),
            )
            argv = [
                str(bins["kubelet"]),
                f"--config={node.config}",
                f"--kubeconfig={layout.kubeconfig(node.user)}",
                f"--hostname-override={node.name}",
                f"--root-dir={node.root}",
            ]
            if node.containerd is not None:
                # It logs that a loopback node IP is invalid, and then leaves
                # the Node's addresses alone after the patch below.
                argv.append(f"--node-ip={NODE_IP}")
            start(
                kubelet_component(node),
                isolate_device_plugins(node, argv),
                exe=str(bins["kubelet"]),
            )
        with self.api() as api:
            for node in layout.all_nodes():
                wait_for(f"node {node.name} Ready", partial(node_ready, api, node.name), 90)
            for node in real_nodes:
                set_loopback_address(api, node.name)
            mark("node-ready")
            # Pods cannot be created in a namespace before its ServiceAccount exists.
            wait_for(
                "the default ServiceAccount",
                lambda: api.get_or_none("/api/v1/namespaces/default/serviceaccounts/default"),
                60,
            )
            if self.kwok_nodes:
                self._start_kwok(state, api, running, mark)
        mark("ready")

    def _start_kwok(
        self,
        state: ClusterState,
        api: AdminAPI,
        running: list[ManagedProcess],
        mark: Callable[[str], None],
    ) -> None:
        """The simulated nodes, kwok, and the publisher of their pools (components)."""
        kwok.create_nodes(state.kubeconfig, self.kwok_nodes)
        workdir = self.layout.state_dir / "work"
        for process in kwok.start(
            state.kubeconfig, self.kwok_nodes, self.kwok_driver, workdir, self.layout.logs
        ):
            running.append(process)
            state.components.append(process.record)
            state.save(self.layout.state_file)
        kwok.wait_ready(api, self.kwok_nodes, running, 60 + self.kwok_nodes / 20)
        mark("kwok-nodes")

    def _save_sysctls(self) -> dict[str, str]:
        saved = {}
        for key in KUBELET_SYSCTLS:
            with contextlib.suppress(OSError):
                saved[key] = Path("/proc/sys", key).read_text().strip()
        return saved

    def _restore_sysctls(self, saved: dict[str, str]) -> None:
        for key, value in saved.items():
            try:
                Path("/proc/sys", key).write_text(value)
            except OSError as e:
                log.warning("could not restore sysctl", key=key, value=value, error=str(e))


def kubelet_component(node: NodeLayout) -> str:
    return "kubelet" if node.index == 1 else f"kubelet-{node.name}"


def runtime_component(node: NodeLayout) -> str:
    """The name of a node's runtime process: fakecri or containerd (-node-K)."""
    kind = "containerd" if node.runtime == "real" else "fakecri"
    return kind if node.index == 1 else f"{kind}-{node.name}"


@dataclass(frozen=True)
class RuntimeBinaries:
    """The real runtime's bin dir and the image tarballs to import (name -> path)."""

    bin_dir: Path
    images: dict[str, Path]


def set_loopback_address(api: AdminAPI, node: str) -> None:
    """Make the Node's only InternalIP 127.0.0.1 (once; the kubelet keeps it).

    A JSON merge patch replaces the whole list, so the address the kubelet
    found on the host's interface is gone and the apiserver reaches this
    kubelet over loopback.
    """
    api.merge_patch(
        path_for("v1", "nodes", name=node) + "/status",
        {
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": NODE_IP},
                    {"type": "Hostname", "address": node},
                ]
            }
        },
    )


def remove_empty_dirs(root: Path) -> None:
    """rmdir ``root`` and the dirs below it, deepest first, where they are empty."""
    if not root.is_dir():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()


def isolate_device_plugins(node: NodeLayout, argv: list[str]) -> list[str]:
    """Run an extra node's kubelet with its own /var/lib/kubelet/device-plugins.

    The device manager's directory is fixed; without a mount namespace a
    second kubelet would take over the first one's kubelet.sock.
    """
    if node.device_plugins is None:
        return argv
    node.device_plugins.mkdir(parents=True, exist_ok=True, mode=0o755)
    target = "/var/lib/kubelet/device-plugins"
    script = f'mkdir -p {target} && mount --bind "$0" {target} && exec "$@"'
    return [
        "unshare",
        "--mount",
        "--propagation",
        "slave",
        "sh",
        "-c",
        script,
        str(node.device_plugins),
        *argv,
    ]


def node_ready(api: AdminAPI, node: str) -> bool:
    obj = api.get_or_none(f"/api/v1/nodes/{node}")
    if obj is None:
        return False
    conditions: list[dict[str, Any]] = obj.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@contextlib.contextmanager
def running_cluster(
    layout: Layout,
    feature_gates: dict[str, bool] | None = None,
    kube_version: str | None = None,
) -> Iterator[tuple[LocalCluster, ClusterState, bool]]:
    """Use a healthy running cluster if there is one, else start one and stop it after.

    Yields the cluster, its state, and whether this call started it.
    """
    cluster = LocalCluster(layout, feature_gates, kube_version)
    state = cluster.running()
    if state is not None:
        running_nodes = len(state.nodes) or 1
        if state.kube_version != cluster.kube_version:
            raise AlreadyRunning(
                f"a local cluster runs Kubernetes {state.kube_version}, "
                f"{cluster.kube_version} is needed; stop it first (`dradriver cluster down`)"
            )
        if state.runtime != layout.runtime:
            raise AlreadyRunning(
                f"a local cluster runs with the {state.runtime} runtime, the "
                f"{layout.runtime} one is needed; stop it first (`dradriver cluster down`)"
            )
        if state.feature_gates != (feature_gates or {}):
            raise AlreadyRunning(
                "a local cluster runs with other feature gates "
                f"({format_feature_gates(state.feature_gates) or 'defaults'}); stop it first"
            )
        if running_nodes < layout.nodes:
            raise AlreadyRunning(
                f"a local cluster runs with {running_nodes} node(s), {layout.nodes} are needed; "
                "stop it first (`dradriver cluster down`)"
            )
        reused = LocalCluster(
            dataclasses.replace(layout, nodes=running_nodes), feature_gates, cluster.kube_version
        )
        yield reused, state, False
        return
    state = cluster.up()
    try:
        yield cluster, state, True
    finally:
        cluster.down()


__all__ = [
    "AlreadyRunning",
    "ClusterError",
    "ClusterState",
    "LocalCluster",
    "running_cluster",
]
