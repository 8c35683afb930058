"""Simulated nodes: kwok-managed Nodes next to the real kubelets (``cluster up --kwok-nodes``).

Invariants:

* A simulated node is a Node named ``kwok-node-<NNNNN>`` with the label
  ``dradriver.dev/kwok-node=true`` and the taint ``kwok.x-k8s.io/node=fake:NoSchedule``:
  only pods that tolerate the taint land there (the scale bench's do), so the other
  tests' pods never do.
* One kwok process manages exactly the Nodes with that label
  (``--manage-nodes-with-label-selector``): it writes each one's status once (Ready,
  capacity for 110 pods), keeps it alive through its Lease, makes pods bound to it
  Running and removes deleted ones at once. Its stages are written here (:func:`config`),
  not taken from kwok's examples.
* Heartbeat tuning (:func:`heartbeat`): no periodic status writes at all (the node
  lifecycle controller counts a renewed Lease as a heartbeat), and the Lease renew
  interval (kwok renews at a quarter of ``--node-lease-duration-seconds``) grows with
  the number of nodes so that all of them together renew at most ``RENEWALS_PER_SECOND``
  times a second; where that interval would exceed the controller-manager's default 50 s
  grace period, the cluster's controller-manager gets ``--node-monitor-grace-period``
  of twice the interval (:func:`controller_manager_args`).
* kwok publishes no ResourceSlices: :mod:`devtools.cluster.kwokpools` does, with
  dradriver's own slice publisher, as each node's plugin would.
* :func:`remove_nodes` deletes every simulated Node and its Lease; the slices go with the
  Node (owner reference) and are also deleted here, so a shared cluster is left as found.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from devtools import paths
from devtools.cluster.api import AdminAPI
from devtools.cluster.kwokbin import ensure_kwok
from devtools.cluster.process import ManagedProcess
from devtools.cluster.wait import wait_until
from dradriver.k8s.client import KubeClient, load_connection
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger

log = get_logger("cluster.kwok")

LABEL = "dradriver.dev/kwok-node"
SELECTOR = f"{LABEL}=true"
NODE_PREFIX = "kwok-node-"
TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
PODS_PER_NODE = 110
# All simulated nodes' Lease renewals together, per second, at most.
RENEWALS_PER_SECOND = 20.0
# kwok renews at a quarter of the lease duration; the kubelet's default duration is 40 s.
MIN_RENEW_SECONDS = 10.0
DEFAULT_GRACE_SECONDS = 50.0  # kube-controller-manager --node-monitor-grace-period
CREATE_CONCURRENCY = 32
KWOK_COMPONENT = "kwok"
POOLS_COMPONENT = "kwok-pools"


@dataclass(frozen=True)
class Heartbeat:
    """How often the simulated nodes renew their Leases, and the grace period that needs."""

    renew_seconds: float
    lease_seconds: int
    grace_seconds: float


def heartbeat(count: int) -> Heartbeat:
    """The Lease timing for ``count`` simulated nodes (see the module docstring)."""
    renew = max(MIN_RENEW_SECONDS, count / RENEWALS_PER_SECOND)
    lease = math.ceil(renew * 4)
    grace = max(DEFAULT_GRACE_SECONDS, 2 * renew)
    return Heartbeat(renew, lease, grace)


def controller_manager_args(count: int) -> list[str]:
    """Extra kube-controller-manager flags that ``count`` simulated nodes need."""
    beat = heartbeat(count)
    if count <= 0 or beat.grace_seconds <= DEFAULT_GRACE_SECONDS:
        return []
    return [f"--node-monitor-grace-period={math.ceil(beat.grace_seconds)}s"]


def node_names(count: int) -> list[str]:
    return [f"{NODE_PREFIX}{i:05d}" for i in range(count)]


def node_object(name: str) -> Obj:
    """A simulated Node as created; kwok fills its status in."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                LABEL: "true",
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"taints": [dict(TAINT)]},
    }


_NODE_STATUS = """\
phase: Running
capacity: {cpu: "32", memory: 256Gi, pods: "%(pods)d"}
allocatable: {cpu: "32", memory: 256Gi, pods: "%(pods)d"}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: kwok
  kubeProxyVersion: kwok
conditions:
- type: Ready
  status: "True"
  reason: KubeletReady
  message: a simulated node kept by kwok
  lastHeartbeatTime: {{ Now | Quote }}
  lastTransitionTime: {{ Now | Quote }}
"""

_POD_STATUS = """\
phase: Running
{{ with NodeIP }}hostIP: {{ . | Quote }}{{ end }}
{{ with PodIP }}podIP: {{ . | Quote }}{{ end }}
startTime: {{ Now | Quote }}
conditions:
- {type: Initialized, status: "True", lastTransitionTime: {{ Now | Quote }}}
- {type: ContainersReady, status: "True", lastTransitionTime: {{ Now | Quote }}}
- {type: Ready, status: "True", lastTransitionTime: {{ Now | Quote }}}
- {type: PodScheduled, status: "True", lastTransitionTime: {{ Now | Quote }}}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  restartCount: 0
  state: {running: {startedAt: {{ Now | Quote }}}}
{{ end }}
"""


def _stage(name: str, kind: str, match: list[Obj], next_: Obj) -> Obj:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": kind},
            "selector": {"matchExpressions": match},
            "next": next_,
        },
    }


def config(count: int) -> list[Obj]:
    """kwok's configuration: its options and the three stages it plays (node status once,
    pods Running, deleted pods gone)."""
    beat = heartbeat(count)
    options = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageNodesWithLabelSelector": SELECTOR,
            "nodeLeaseDurationSeconds": beat.lease_seconds,
            "cidr": "10.128.0.1/9",
            "nodeIP": "10.127.0.1",
            "enableDebuggingHandlers": False,
            # kwok's documented defaults, which its binary does not fill in itself
            "nodeLeaseParallelism": 4,
            "nodePlayStageParallelism": 4,
            "podPlayStageParallelism": 4,
            "podsOnNodeSyncParallelism": 1,
        },
    }
    not_deleted = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
    return [
        options,
        _stage(
            "dradriver-node-ready",
            "Node",
            [{"key": ".status.phase", "operator": "NotIn", "values": ["Running"]}],
            {"statusTemplate": _NODE_STATUS % {"pods": PODS_PER_NODE}},
        ),
        _stage(
            "dradriver-pod-running",
            "Pod",
            [not_deleted, {"key": ".status.phase", "operator": "NotIn", "values": ["Running"]}],
            {"statusTemplate": _POD_STATUS},
        ),
        _stage(
            "dradriver-pod-delete",
            "Pod",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            {"finalizers": {"empty": True}, "delete": True},
        ),
    ]


def kwok_argv(kubeconfig: str, count: int, workdir: Path) -> list[str]:
    """kwok's command line for ``count`` simulated nodes (its config written into
    ``workdir``); builds kwok on a cache miss."""
    binary = ensure_kwok()
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "kwok.yaml"
    conf.write_text(yaml.safe_dump_all(config(count), sort_keys=False))
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={conf}",
        f"--manage-nodes-with-label-selector={SELECTOR}",
        f"--node-lease-duration-seconds={heartbeat(count).lease_seconds}",
        "--server-address=",
        "--node-port=0",  # no kubelet-like server (two clusters would share its port)
        "-v=WARN",
    ]


def pools_argv(kubeconfig: str, driver: str) -> list[str]:
    """The command line of the process that publishes the simulated nodes' pools."""
    return [
        sys.executable,
        "-m",
        "devtools.cluster.kwokpools",
        f"--kubeconfig={kubeconfig}",
        f"--driver={driver}",
        "--log-level=warning",
    ]


def start(
    kubeconfig: str, count: int, driver: str, workdir: Path, logs: Path
) -> list[ManagedProcess]:
    """Start kwok and the pools' publisher for nodes made by :func:`create_nodes`."""
    processes = [
        ManagedProcess.start(
            KWOK_COMPONENT,
            kwok_argv(kubeconfig, count, workdir / KWOK_COMPONENT),
            log_path=logs / f"{KWOK_COMPONENT}.log",
            cwd=workdir / KWOK_COMPONENT,
        )
    ]
    processes.append(
        ManagedProcess.start(
            POOLS_COMPONENT,
            pools_argv(kubeconfig, driver),
            log_path=logs / f"{POOLS_COMPONENT}.log",
            cwd=workdir / POOLS_COMPONENT,
            env={**os.environ, "PYTHONPATH": str(paths.REPO)},
        )
    )
    return processes


async def _create_nodes(kubeconfig: str, names: list[str]) -> None:
    client = KubeClient(load_connection(kubeconfig), "dradriver-kwok-nodes")
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one(name: str) -> None:
        async with gate:
            try:
                await client.create("/api/v1/nodes", node_object(name))
            except KubeAPIError as e:
                if e.status != 409:  # already there (a restart): kwok adopts it
                    raise

    try:
        await asyncio.gather(*(one(n) for n in names))
    finally:
        await client.aclose()


def create_nodes(kubeconfig: str, count: int) -> list[str]:
    """Create the ``count`` simulated Node objects (kwok makes them Ready)."""
    names = node_names(count)
    asyncio.run(_create_nodes(kubeconfig, names))
    return names


def ready_count(api: AdminAPI) -> int:
    """How many simulated nodes are Ready."""
    count = 0
    for node in api.items("/api/v1/nodes", labelSelector=SELECTOR):
        conditions = (node.get("status") or {}).get("conditions") or []
        count += any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return count


def wait_ready(api: AdminAPI, count: int, watch: list[ManagedProcess], timeout: float) -> None:
    wait_until(
        f"{count} simulated nodes Ready",
        lambda: ready_count(api) >= count,
        timeout,
        interval=0.5,
        watch=watch,
    )


def remove_nodes(api: AdminAPI, timeout: float = 300) -> int:
    """Delete every simulated Node, its Lease and its slices; how many Nodes there were."""
    names = [n["metadata"]["name"] for n in api.items("/api/v1/nodes", labelSelector=SELECTOR)]
    if not names:
        return 0
    api.request("DELETE", "/api/v1/nodes", params={"labelSelector": SELECTOR})
    leases = path_for("coordination.k8s.io/v1", "leases", "kube-node-lease")
    for name in names:
        api.delete(f"{leases}/{name}", missing_ok=True)
    wanted = set(names)
    slices = path_for(RESOURCE_V1, "resourceslices")
    for s in api.items(slices):
        if (s.get("spec") or {}).get("nodeName") in wanted:
            api.delete(f"{slices}/{s['metadata']['name']}", missing_ok=True)
    wait_until(
        "simulated nodes deleted",
        lambda: not api.items("/api/v1/nodes", labelSelector=SELECTOR, limit=1),
        timeout,
        interval=0.5,
    )
    log.info("removed simulated nodes", nodes=len(names))
    return len(names)


@contextlib.contextmanager
def simulated(
    api: AdminAPI, kubeconfig: str, count: int, driver: str, workdir: Path
) -> Iterator[list[str]]:
    """``count`` simulated nodes on a running cluster, kwok and their pools' publisher for
    the block (the tests' fixture); on exit both stop and the nodes are removed."""
    remove_nodes(api)  # an interrupted run's
    names = create_nodes(kubeconfig, count)
    processes: list[ManagedProcess] = []
    try:
        processes = start(kubeconfig, count, driver, workdir, workdir / "logs")
        wait_ready(api, count, processes, 60 + count / 20)
        yield names
    finally:
        for process in reversed(processes):
            process.stop()
        remove_nodes(api)
