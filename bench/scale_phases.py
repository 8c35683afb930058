"""The phases of ``bench.scale`` on one isolated cluster with N simulated nodes (a helper).

Each phase starts from the same free inventory and leaves it free: the claims (or pods)
it made are deleted and their deallocation awaited before it returns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from bench import scale_profile
from bench.controller_allocation import (
    CONCURRENCY,
    Result,
    Stage,
    allocated,
    claim,
    claim_name,
    controller_claims,
    delete_claims,
    measure,
    rss_mib,
    tree_rss_mib,
)
from devtools.cluster.api import AdminAPI
from devtools.cluster.kwok import TOLERATION
from devtools.cluster.kwokpools import MODELS, NodePools
from devtools.cluster.wait import wait_until
from devtools.harness.controller import ControllerProcess
from dradriver.api import networkpool as net
from dradriver.k8s.client import KubeClient, load_connection
from dradriver.k8s.http import TransportError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.runtime import Informer

R = RESOURCE_V1
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
NETWORK_DRIVER = "dradriver.dev"  # the controller's default --driver-name
POOLS = f"{NETWORK_DRIVER}/{net.VERSION}"


def model(i: int) -> str:
    return MODELS[i % len(MODELS)]


# --- node pools -----------------------------------------------------------------------------


@dataclass
class Publish:
    nodes: int
    seconds: float
    writes: int
    republish_seconds: float
    republish_writes: int


async def publish_pools(kubeconfig: str, driver: str, nodes: list[str]) -> Publish:
    """Every node's pool published once (timed, writes counted), then once more unchanged."""
    client = KubeClient(load_connection(kubeconfig), "bench-scale-pools")
    pools = NodePools(client, driver, nodes)
    try:
        started = time.monotonic()
        await pools.start()
        writes = await pools.publish()
        took = time.monotonic() - started
        started = time.monotonic()
        again = await pools.publish()
        return Publish(len(nodes), took, writes, time.monotonic() - started, again)
    finally:
        await pools.stop()
        await client.aclose()


# --- the controller ---------------------------------------------------------------------------


@dataclass
class ControllerRun:
    result: Result
    stages: list[Stage]
    restart_seconds: float  # process start -> first allocation (a claim created before)
    restart_ready_seconds: float  # process start -> /readyz
    restart_rss: float  # after that first allocation
    listed: dict[str, int] = field(default_factory=dict)  # what the new process had to list
    profile: list[tuple[str, int, int]] = field(default_factory=list)  # scale_profile.stop


def controller_phase(
    api: AdminAPI,
    make: Callable[[str], ControllerProcess],
    kubeconfig: str,
    namespace: str,
    cls: str,
    driver: str,
    count: int,
    deadline: float,
    profile_to: Path | None = None,
) -> ControllerRun:
    """``count`` immediate claims; then a restart with them cached; then all deleted.

    With ``profile_to``, py-spy samples the controller while it allocates."""
    proc = make("a")
    proc.start()
    try:
        wait_until("controller ready", proc.ready, 120)
        assert proc.process is not None
        pid = proc.process.pid
        before = rss_mib(pid)

        async def create(client: KubeClient, i: int) -> None:
            body = claim(namespace, claim_name(i), cls, driver, model(i))
            await client.create(path_for(R, "resourceclaims", namespace), body)

        recording = scale_profile.start(pid, profile_to) if profile_to else None
        try:
            sent, seen = asyncio.run(measure(kubeconfig, namespace, count, deadline, create))
        finally:
            profile = scale_profile.stop(recording)
        result, stages = controller_claims(proc, pid, sent, seen, before)
    finally:
        proc.stop()
    # Restart at scale: a new process with every slice and claim to list; the first
    # allocation is that of a claim created while no controller ran.
    probe = "restart-probe"
    wait_until(  # the admin connection sat idle through the phase (see scheduler_phase)
        "restart probe claim created",
        lambda: api.create(
            path_for(R, "resourceclaims", namespace), claim(namespace, probe, cls, driver, model(0))
        ),
        60,
        ignore=(TransportError,),
    )
    listed = {
        "resourceslices": len(api.items(path_for(R, "resourceslices"))),
        "resourceclaims": len(api.items(path_for(R, "resourceclaims"))),
        "nodes": len(api.items("/api/v1/nodes")),
    }
    proc = make("b")
    started = time.monotonic()
    proc.start()
    try:
        watch = [proc.process] if proc.process is not None else []
        wait_until("restarted controller ready", proc.ready, 300, interval=0.05, watch=watch)
        ready = time.monotonic() - started
        wait_until(
            "first allocation after the restart",
            lambda: allocated(api, namespace, probe),
            300,
            interval=0.05,
            watch=watch,
        )
        first = time.monotonic() - started
        assert proc.process is not None
        restart_rss = rss_mib(proc.process.pid)
        delete_claims(api, namespace)  # the controller releases its finalizers
    finally:
        proc.stop()
    return ControllerRun(result, stages, first, ready, restart_rss, listed, profile)


# --- kube-scheduler ---------------------------------------------------------------------------


def template(namespace: str, name: str, cls: str, driver: str, want: str) -> Obj:
    body = claim(namespace, name, cls, driver, want, immediate=False)
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"spec": body["spec"]}}


def template_pod(namespace: str, name: str, tmpl: str) -> Obj:
    """A pod with one claim from ``tmpl``; it tolerates the simulated nodes' taint."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {"name": "c", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "r"}]}}
            ],
            "resourceClaims": [{"name": "r", "resourceClaimTemplateName": tmpl}],
            "tolerations": [TOLERATION],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
        },
    }


async def measure_pods(
    kubeconfig: str, namespace: str, count: int, deadline: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Create ``count`` pods, 32 at a time; (pod create sent, its claim's allocation seen)."""
    client = KubeClient(load_connection(kubeconfig), "bench-scale-pods")
    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    done = asyncio.Event()

    def observe(obj: Obj) -> None:
        owners = obj["metadata"].get("ownerReferences") or []
        pod = next((o["name"] for o in owners if o.get("kind") == "Pod"), None)
        if pod and (obj.get("status") or {}).get("allocation") and pod not in seen:
            seen[pod] = time.monotonic()
            if len(seen) >= count:
                done.set()

    informer = Informer(client, path_for(R, "resourceclaims", namespace), name="bench-pods")
    informer.add_handler(on_add=observe, on_update=lambda old, new: observe(new))
    informer.start()
    try:
        await informer.wait_for_sync()
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(i: int) -> None:
            name = f"p-{i:05d}"
            async with gate:
                sent[name] = time.monotonic()
                await client.create(
                    path_for("v1", "pods", namespace),
                    template_pod(namespace, name, f"t-{model(i)}"),
                )

        await asyncio.gather(*(one(i) for i in range(count)))
        async with asyncio.timeout(deadline):
            await done.wait()
    finally:
        await informer.stop()
        await client.aclose()
    return sent, seen


async def delete_pods(kubeconfig: str, namespace: str, names: list[str]) -> None:
    """Delete the pods ``names`` at once (grace period 0), CONCURRENCY at a time."""
    client = KubeClient(load_connection(kubeconfig), "bench-scale-pods")
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(name: str) -> None:
        async with gate:
            await client.delete(path_for("v1", "pods", namespace, name), gracePeriodSeconds=0)

    try:
        await asyncio.gather(*(one(name) for name in names))
    finally:
        await client.aclose()


def _empty(api: AdminAPI, collection: str) -> bool:
    return not api.items(collection, limit=1)


def scheduler_phase(
    api: AdminAPI, kubeconfig: str, namespace: str, sched_pid: int, count: int, deadline: float
) -> Result:
    """``count`` pods with template claims on the simulated nodes, then all deleted."""
    before = rss_mib(sched_pid)
    sent, seen = asyncio.run(measure_pods(kubeconfig, namespace, count, deadline))
    result = Result(
        "kube-scheduler (pods)",
        "pods",
        sent,
        seen,
        before,
        rss_mib(sched_pid),
        tree_rss_mib(sched_pid),
    )
    # One DELETE per pod, CONCURRENCY at a time: a deletecollection of thousands of pods
    # outlasts the client's read timeout (and each retry starts it again).
    asyncio.run(delete_pods(kubeconfig, namespace, sorted(sent)))
    for what, group, plural in (("pods", "v1", "pods"), ("claims", R, "resourceclaims")):
        collection = path_for(group, plural, namespace)
        wait_until(
            f"{what} deleted",
            partial(_empty, api, collection),
            600,
            interval=0.5,
        )
    return result


# --- a network pool spanning every simulated node ---------------------------------------------


@dataclass
class NetworkRun:
    devices: int
    slices: int
    seconds: float
    writes: int
    republish_writes: int


def _network_pool(name: str, devices: int, selector: Obj) -> Obj:
    return {
        "apiVersion": POOLS,
        "kind": net.KIND,
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [selector]}]},
            "attach": {"backend": "simulated", "simulated": {"latencySeconds": 0}},
            "devices": [
                {"name": f"nic-{i}", "attributes": {"kind": {"string": name}}}
                for i in range(devices)
            ],
        },
    }


def _pool_slices(api: AdminAPI, name: str) -> dict[str, str]:
    """Slice name -> resourceVersion for the network pool ``name``."""
    return {
        s["metadata"]["name"]: s["metadata"]["resourceVersion"]
        for s in api.items(path_for(R, "resourceslices"))
        if s["spec"]["pool"]["name"] == net.pool_name(name)
    }


def _published(api: AdminAPI, name: str) -> bool:
    pool = api.get_or_none(path_for(POOLS, net.PLURAL, name=name)) or {}
    conditions = (pool.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Published" and c["status"] == "True" for c in conditions)


def network_phase(
    api: AdminAPI, make: Callable[[str], ControllerProcess], label: str, devices: int, tag: str
) -> NetworkRun:
    """A NetworkDevicePool whose node selector matches every simulated node: publish time
    and writes; then a controller restart, after which the unchanged pool costs 0 writes
    (checked once a second pool, created after the restart, is published: the restarted
    controller queued the first one before it)."""
    selector = {"key": label, "operator": "In", "values": ["true"]}
    name, barrier = f"bench-span-{tag}", f"bench-barrier-{tag}"
    proc = make("net-a")
    proc.start()
    try:
        wait_until("controller ready", proc.ready, 120)
        started = time.monotonic()
        api.create(path_for(POOLS, net.PLURAL), _network_pool(name, devices, selector))
        wait_until("network pool published", lambda: _published(api, name), 300, interval=0.05)
        took = time.monotonic() - started
        first = _pool_slices(api, name)
    finally:
        proc.stop()
    proc = make("net-b")
    proc.start()
    try:
        wait_until("controller ready", proc.ready, 120)
        api.create(path_for(POOLS, net.PLURAL), _network_pool(barrier, 1, selector))
        wait_until("barrier pool published", lambda: _published(api, barrier), 300)
        again = _pool_slices(api, name)
        rewritten = sum(1 for s, rv in again.items() if first.get(s) != rv)
        for pool in (name, barrier):
            api.delete(path_for(POOLS, net.PLURAL, name=pool))
        wait_until("network pools removed", lambda: not _pool_slices(api, name), 120)
    finally:
        proc.stop()
    return NetworkRun(devices, len(first), took, len(first), rewritten)


def workdir_of(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    return path
