"""Controller allocation vs kube-scheduler: 1,000 claims over 10,000 devices, on its own cluster.

``python -m bench.controller_allocation [--claims N] [--devices N] [--workers N]
[--scheduler-qps Q --scheduler-burst B] [--outage S] [--no-finalizer-policy]``

The benchmark starts its own local cluster (a temporary state dir and free ports; no
kubelet, see below), so neither its load nor its objects reach the shared cluster the
tests use, and it stops that cluster at the end. It publishes one pool of ``--devices``
devices (``allNodes``, slices of 128, typed ``model`` and ``index`` attributes) for a unique
driver name, and one DeviceClass whose CEL selector checks the driver. Then two phases run
in the same cluster, each starting from the same free inventory:

1. **dradriver-controller**, run as the tests do (its ServiceAccount and the manifests'
   RBAC, ``--allocation-namespace`` = the bench's namespace): the claims are created with
   the annotation ``dradriver.dev/allocation: Immediate`` (one device, a CEL selector on
   ``model``), 32 at a time, and watched until every one is allocated. Claims/s is first
   create sent -> last allocation seen; claim-to-allocated is create sent -> allocation seen
   by a watch. As the chart installs on 1.36+, the allocation-finalizer
   MutatingAdmissionPolicy gives each claim the controller's finalizer at create, so the
   controller writes only the allocation (``--no-finalizer-policy``: it adds the finalizer
   itself, one more write per claim). The claims are then deleted (the controller removes
   its finalizer) and the controller is stopped.
2. **kube-scheduler** (the cluster's own, restarted with ``--kube-api-qps`` /
   ``--kube-api-burst`` from ``--scheduler-qps`` / ``--scheduler-burst``, default 1000 /
   2000, since the controller has no client-side limiter): the same claims (same requests and CEL
   selectors, without the annotation) are pre-created, untimed; then one pod per claim is
   created, 32 at a time, each referencing its claim by ``resourceClaimName``. Pods/s is
   first pod create sent -> last claim allocation seen; claim-to-allocated is the pod's
   create sent -> its claim's allocation seen. The scheduler writes the allocation in its
   DRA plugin's PreBind, before the Binding, so the end point is the same as phase 1's.

The scheduler's pods go to one Node object with no kubelet, ``allocatable.pods`` above the
pod count: a real kubelet has ``maxPods`` 110 (the kubelet config does not set it) and
NodeResourcesFit would reject pod 111 before DRA ever ran, and the device-plugin dir
``/var/lib/kubelet/device-plugins`` of a second cluster's first kubelet is the shared
cluster's. The bench renews the node's Lease so the node lifecycle controller keeps it
Ready, and the pods tolerate every taint; the pods are bound but never run (nothing is
measured after the allocation). Reported per path: items/s, claim-to-allocated p50/p99 and
the allocating process's RSS (dradriver-controller or kube-scheduler) before -> after, and
the ratio controller claims/s / scheduler pods/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.common import free_port, percentile, table
from devtools.cluster.api import AdminAPI
from devtools.cluster.config import Layout, Ports
from devtools.cluster.local import ClusterState, LocalCluster, running_cluster
from devtools.cluster.process import ManagedProcess
from devtools.cluster.wait import wait_until
from devtools.harness import finalizerpolicy
from devtools.harness.controller import ControllerProcess, controller_kubeconfig
from dradriver.api.wellknown import ALLOCATION_ANNOTATION
from dradriver.api.wellknown import CLAIM_STAGE_METRIC as METRIC
from dradriver.api.wellknown import CLAIM_STAGES as STAGES
from dradriver.k8s.client import KubeClient, load_connection
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.runtime import Informer

R = RESOURCE_V1
PER_SLICE = 128
MODELS = ("a100", "h100", "l4", "t4")
CONCURRENCY = 32
NODE = "bench-ca-node"
LEASE_RENEW = 5.0
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
SMOKE_ARGS = ("--claims", "12", "--devices", "64", "--outage", "2", "--scheduler-catchup", "5")
CLUSTER = "own"  # bench/__init__.py: starts an isolated cluster of its own (free ports)


def slices(driver: str, devices: int) -> list[Obj]:
    count = (devices + PER_SLICE - 1) // PER_SLICE
    out = []
    for s in range(count):
        first, last = s * PER_SLICE, min(devices, (s + 1) * PER_SLICE)
        out.append(
            {
                "metadata": {"name": f"{driver.split('.')[0]}-{s:03d}"},
                "spec": {
                    "driver": driver,
                    "allNodes": True,
                    "pool": {"name": "bench", "generation": 1, "resourceSliceCount": count},
                    "devices": [
                        {
                            "name": f"dev-{i:05d}",
                            "attributes": {
                                "model": {"string": MODELS[i % len(MODELS)]},
                                "index": {"int": i},
                            },
                        }
                        for i in range(first, last)
                    ],
                },
            }
        )
    return out


def claim_name(i: int) -> str:
    return f"c-{i:04d}"


def claim(
    namespace: str, name: str, cls: str, driver: str, model: str, immediate: bool = True
) -> Obj:
    metadata: Obj = {"name": name, "namespace": namespace}
    if immediate:
        metadata["annotations"] = {ALLOCATION_ANNOTATION: "Immediate"}
    return {
        "metadata": metadata,
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "exactly": {
                            "deviceClassName": cls,
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": f'device.attributes["{driver}"].model '
                                        f'== "{model}"'
                                    }
                                }
                            ],
                        },
                    }
                ]
            }
        },
    }


def pod(namespace: str, name: str, claim: str) -> Obj:
    """A pod whose only container uses the pre-created claim; it tolerates every taint."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {"name": "c", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "r"}]}}
            ],
            "resourceClaims": [{"name": "r", "resourceClaimName": claim}],
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
        },
    }


@dataclass
class Result:
    path: str
    unit: str
    sent: dict[str, float]  # claim name -> create sent (the claim's, or its pod's)
    seen: dict[str, float]  # claim name -> allocation seen
    rss_before: float
    rss_after: float
    tree_rss_after: float  # with its child processes

    @property
    def rate(self) -> float:
        return len(self.seen) / (max(self.seen.values()) - min(self.sent.values()))

    def row(self) -> list[str]:
        latencies = [self.seen[name] - self.sent[name] for name in self.seen]
        return [
            self.path,
            f"{len(self.seen)} {self.unit}",
            f"{self.rate:.1f} {self.unit}/s",
            f"{percentile(latencies, 0.5) * 1000:.1f}",
            f"{percentile(latencies, 0.99) * 1000:.1f}",
            f"{self.rss_before:.1f} -> {self.rss_after:.1f}",
            f"{self.tree_rss_after:.1f}",
        ]


async def measure(
    kubeconfig: str,
    namespace: str,
    n: int,
    deadline: float,
    create: Callable[[KubeClient, int], Awaitable[None]],
) -> tuple[dict[str, float], dict[str, float]]:
    """Run ``create(client, i)`` for i < n, 32 at a time, until claim i is allocated for all i.

    Returns (create sent, allocation seen) per claim name; ``create`` sends one request.
    """
    client = KubeClient(load_connection(kubeconfig), "bench-controller-allocation")
    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    done = asyncio.Event()

    def observe(obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if (obj.get("status") or {}).get("allocation") and name not in seen:
            seen[name] = time.monotonic()
            if len(seen) >= n:
                done.set()

    informer = Informer(client, path_for(R, "resourceclaims", namespace), name="bench")
    informer.add_handler(on_add=observe, on_update=lambda old, new: observe(new))
    informer.start()
    try:
        await informer.wait_for_sync()
        if seen:
            raise RuntimeError(f"{len(seen)} claims in {namespace} are allocated already")
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(i: int) -> None:
            async with gate:
                sent[claim_name(i)] = time.monotonic()
                await create(client, i)

        await asyncio.gather(*(one(i) for i in range(n)))
        async with asyncio.timeout(deadline):
            await done.wait()
    finally:
        await informer.stop()
        await client.aclose()
    return sent, seen


def descendants(pid: int) -> list[int]:
    """The process's children, grandchildren, ... (from /proc/<pid>/task/*/children)."""
    out: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for child in children.read_text().split():
                out += [int(child), *descendants(int(child))]
    return out


def tree_rss_mib(pid: int) -> float:
    """RSS of the process and its descendants (the controller's allocation worker)."""
    return sum(rss_mib(p) for p in [pid, *descendants(pid)])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def isolated_layout(root: Path) -> Layout:
    """A cluster of its own: state under ``root``, free ports, and no kubelet (nodes=0)."""
    picked: list[int] = []
    while len(picked) < len(Ports().by_owner()):
        port = free_port()
        if port not in picked:
            picked.append(port)
    ports = Ports(*picked)
    return Layout(
        state_dir=root / "cluster",
        kubelet_root=root / "kubelet",  # unused with nodes=0; never /var/lib/kubelet
        node_name=NODE,
        ports=ports,
        nodes=0,
    )


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def create_node(api: AdminAPI, pods: int) -> None:
    """A Ready Node without a kubelet, room for ``pods`` pods, and its Lease."""
    api.create("/api/v1/nodes", {"metadata": {"name": NODE, "labels": {"bench": "ca"}}})
    room = {"cpu": "1000", "memory": "1000Gi", "pods": str(pods)}
    status = {
        "capacity": room,
        "allocatable": room,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "benchmark node without a kubelet",
                "lastHeartbeatTime": now_micro()[:19] + "Z",
                "lastTransitionTime": now_micro()[:19] + "Z",
            }
        ],
    }
    # A merge patch, as bench.torture's nodes: no resourceVersion to lose to the node
    # controllers, which write the new Node too (a PUT of the read Node got a 409 once).
    api.merge_patch(path_for("v1", "nodes", name=NODE) + "/status", {"status": status})
    api.create(
        path_for("coordination.k8s.io/v1", "leases", "kube-node-lease"),
        {
            "metadata": {"name": NODE},
            "spec": {
                "holderIdentity": NODE,
                "leaseDurationSeconds": 40,
                "renewTime": now_micro(),
            },
        },
    )


async def renew_lease(kubeconfig: str, stop: asyncio.Event) -> None:
    client = KubeClient(load_connection(kubeconfig), "bench-controller-allocation-lease")
    path = path_for("coordination.k8s.io/v1", "leases", "kube-node-lease", NODE)
    try:
        while not stop.is_set():
            await client.merge_patch(path, {"spec": {"renewTime": now_micro()}})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), LEASE_RENEW)
    finally:
        await client.aclose()


def delete_claims(api: AdminAPI, namespace: str) -> None:
    api.request("DELETE", path_for(R, "resourceclaims", namespace))  # deletecollection
    wait_until(
        "claims deallocated and deleted",
        lambda: not api.items(path_for(R, "resourceclaims", namespace), limit=1),
        600,
    )


def delete_pods(api: AdminAPI, namespace: str) -> None:
    # No kubelet confirms a graceful deletion: grace period 0 removes the pods at once.
    api.request("DELETE", path_for("v1", "pods", namespace), params={"gracePeriodSeconds": 0})
    wait_until(
        "pods deleted",
        lambda: not api.items(path_for("v1", "pods", namespace), limit=1),
        120,
    )


def component_pid(state: ClusterState, name: str) -> int:
    return next(c.pid for c in state.components if c.name == name)


def restart_component(
    cluster: LocalCluster,
    state: ClusterState,
    name: str,
    down_for: float = 0.0,
    extra_args: Sequence[str] = (),
) -> None:
    """Stop component ``name``; after ``down_for`` seconds start it again, with ``extra_args``
    added to its command line. The cluster's state records the new process, so that the
    cluster's teardown stops it."""
    index = next(i for i, c in enumerate(state.components) if c.name == name)
    old = state.components[index]
    ManagedProcess.adopt(old).stop()
    if down_for:
        time.sleep(down_for)  # the outage itself, not a synchronisation
    argv = [a for a in old.argv if not any(a.startswith(e.split("=")[0] + "=") for e in extra_args)]
    process = ManagedProcess.start(
        name,
        [*argv, *extra_args],
        log_path=Path(old.log),
        cwd=cluster.layout.workdir(name),
        exe=old.exe,
    )
    state.components[index] = process.record
    state.save(cluster.layout.state_file)


def serving(api: AdminAPI) -> bool:
    try:
        api.get(path_for("v1", "namespaces", name="default"))
    except Exception:
        return False
    return True


def allocated(api: AdminAPI, namespace: str, name: str) -> bool:
    obj = api.get_or_none(path_for(R, "resourceclaims", namespace, name))
    return bool(obj and (obj.get("status") or {}).get("allocation"))


@dataclass
class Stage:
    stage: str
    count: float
    total: float
    buckets: list[tuple[float, float]]  # (upper bound, cumulative count)

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket that holds quantile ``q`` (histograms keep no more)."""
        want = q * self.count
        return next((le for le, n in self.buckets if n >= want), float("inf"))

    def row(self) -> list[str]:
        mean = self.total / self.count if self.count else float("nan")
        return [
            self.stage,
            f"{self.count:.0f}",
            f"{mean * 1000:.1f}",
            f"<= {self.quantile(0.5) * 1000:g}",
            f"<= {self.quantile(0.99) * 1000:g}",
        ]


def stage_times(metrics_text: str) -> list[Stage]:
    """The per-stage histogram of the controller's ``/metrics``, in pipeline order."""
    found: dict[str, Stage] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != METRIC:
            continue
        for sample in family.samples:
            stage = sample.labels.get("stage", "")
            entry = found.setdefault(stage, Stage(stage, 0.0, 0.0, []))
            if sample.name.endswith("_bucket"):
                entry.buckets.append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_count"):
                entry.count = sample.value
            elif sample.name.endswith("_sum"):
                entry.total = sample.value
    return [found[s] for s in STAGES if s in found]


def controller_claims(
    proc: ControllerProcess,
    pid: int,
    sent: dict[str, float],
    seen: dict[str, float],
    before: float,
) -> tuple[Result, list[Stage]]:
    """The controller's row for claims ``sent`` and ``seen`` allocated (RSS ``before`` the
    claims, now, and of its process tree), and its stage times from ``/metrics``."""
    result = Result(
        "dradriver-controller (claims)",
        "claims",
        sent,
        seen,
        before,
        rss_mib(pid),
        tree_rss_mib(pid),
    )
    metrics = proc.get("/metrics")
    return result, stage_times(metrics.text) if metrics is not None else []


def create_driver_class(api: AdminAPI, cls: str, driver: str) -> None:
    """A DeviceClass ``cls`` that selects every device of ``driver``."""
    selector = {"cel": {"expression": f'device.driver == "{driver}"'}}
    api.create(
        path_for(R, "deviceclasses"), {"metadata": {"name": cls}, "spec": {"selectors": [selector]}}
    )


@dataclass
class AtScale:
    deallocated: int
    deallocation_seconds: float
    outage_seconds: float
    resume_seconds: float  # apiserver answers again -> first allocation seen

    def rows(self) -> list[list[str]]:
        return [
            [
                f"deallocate {self.deallocated} immediate claims (deletecollection -> all gone)",
                f"{self.deallocation_seconds:.2f} s",
                f"{self.deallocated / self.deallocation_seconds:.1f} claims/s",
            ],
            [
                f"first allocation after a {self.outage_seconds:g} s apiserver outage "
                "(apiserver answers -> allocated)",
                f"{self.resume_seconds:.2f} s",
                "",
            ],
        ]


def deallocate_and_outage(
    cluster: LocalCluster,
    state: ClusterState,
    api: AdminAPI,
    namespace: str,
    n: int,
    outage: float,
    make_claim: Callable[[str], Obj],
    proc: ControllerProcess,
) -> AtScale:
    """With the controller running: delete every claim, then an apiserver outage."""
    started = time.monotonic()
    delete_claims(api, namespace)
    deallocation = time.monotonic() - started
    restart_component(cluster, state, "kube-apiserver", down_for=outage)
    wait_until("apiserver answers after the outage", lambda: serving(api), 120, interval=0.02)
    back = time.monotonic()
    name = "after-outage"
    # The apiserver may still refuse writes for a moment while it starts (e.g. webhooks):
    # retried until the claim exists; the time counts from its first answer all the same.
    wait_until(
        "claim created after the outage",
        lambda: api.create(path_for(R, "resourceclaims", namespace), make_claim(name)),
        60,
        interval=0.02,
        ignore=(Exception,),
    )
    wait_until(
        "first allocation after the outage",
        lambda: allocated(api, namespace, name),
        120,
        interval=0.02,
        watch=[proc.process] if proc.process is not None else [],
        ignore=(Exception,),
    )
    resumed = time.monotonic() - back
    delete_claims(api, namespace)
    return AtScale(n, deallocation, outage, resumed)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=16, help="the controller's --claim-workers")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds for all claims")
    parser.add_argument("--scheduler-qps", type=int, default=1000, help="kube-scheduler QPS")
    parser.add_argument("--scheduler-burst", type=int, default=2000, help="kube-scheduler burst")
    parser.add_argument("--outage", type=float, default=60.0, help="apiserver outage, seconds")
    parser.add_argument(
        "--scheduler-catchup",
        type=float,
        help="the controller's --scheduler-catchup (default: its own, 75 s): no allocation "
        "is written that long after the outage unless kube-scheduler shows it caught up",
    )
    parser.add_argument(
        "--finalizer-policy",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="install the chart's allocation-finalizer MutatingAdmissionPolicy for the "
        "controller phase, as the chart does on 1.36+ (default: on)",
    )
    args = parser.parse_args(argv)
    if args.claims > args.devices:
        parser.error("--claims must not exceed --devices")
    bench_id = uuid.uuid4().hex[:8]
    driver = f"bca-{bench_id}.bench.dradriver.dev"
    cls = f"bca-{bench_id}"
    namespace = f"bench-ca-{bench_id}"
    n = args.claims
    limits = f"QPS {args.scheduler_qps} / burst {args.scheduler_burst}"
    work = Path(tempfile.mkdtemp(prefix="bench-ca-"))
    layout = isolated_layout(work)
    print(
        f"starting an isolated cluster (state {layout.state_dir}, apiserver {layout.apiserver_url})"
    )
    ok = False
    try:
        with running_cluster(layout) as (cluster, state, _started), cluster.api() as api:
            kubeconfig = str(state.kubeconfig)
            published = slices(driver, args.devices)
            api.create_namespace(namespace)
            create_driver_class(api, cls, driver)
            for obj in published:
                api.create(path_for(R, "resourceslices"), obj)

            def model(i: int) -> str:
                return MODELS[i % len(MODELS)]

            # Phase 1: dradriver-controller, immediate allocation, as deployed (leader
            # election on, no client-side rate limit).
            proc = ControllerProcess(
                f"bench-{bench_id}",
                controller_kubeconfig(api, cluster, work),
                work,
                extra_args=[
                    f"--allocation-namespace={namespace}",
                    f"--claim-workers={args.workers}",
                    "--log-level=warning",
                    *(
                        [f"--scheduler-catchup={args.scheduler_catchup:g}"]
                        if args.scheduler_catchup is not None
                        else []
                    ),
                ],
            )
            policy = contextlib.ExitStack()
            policy_note = "not installed (--no-finalizer-policy)"
            if args.finalizer_policy:
                if finalizerpolicy.served(api):
                    policy.enter_context(finalizerpolicy.installed(api, namespace, classes=[cls]))
                    policy_note = "installed (the chart's default where the API is served)"
                else:
                    policy_note = "not served by this cluster (before 1.36)"
            proc.start()
            try:
                wait_until("controller ready", proc.ready, 120)
                assert proc.process is not None
                pid = proc.process.pid
                before = rss_mib(pid)

                async def create_claim(client: KubeClient, i: int) -> None:
                    await client.create(
                        path_for(R, "resourceclaims", namespace),
                        claim(namespace, claim_name(i), cls, driver, model(i)),
                    )

                sent, seen = asyncio.run(
                    measure(kubeconfig, namespace, n, args.deadline, create_claim)
                )
                controller, stages = controller_claims(proc, pid, sent, seen, before)
                at_scale = deallocate_and_outage(
                    cluster,
                    state,
                    api,
                    namespace,
                    n,
                    args.outage,
                    lambda name: claim(namespace, name, cls, driver, model(0)),
                    proc,
                )
            finally:
                proc.stop()
                policy.close()

            # Phase 2: kube-scheduler through pods, same claims, same free inventory, its
            # client limits lifted as the controller has none.
            restart_component(
                cluster,
                state,
                "kube-scheduler",
                extra_args=[
                    f"--kube-api-qps={args.scheduler_qps}",
                    f"--kube-api-burst={args.scheduler_burst}",
                ],
            )
            create_node(api, n + 100)
            for i in range(n):
                api.create(
                    path_for(R, "resourceclaims", namespace),
                    claim(namespace, claim_name(i), cls, driver, model(i), immediate=False),
                )
            sched_pid = component_pid(state, "kube-scheduler")
            before = rss_mib(sched_pid)

            async def create_pod(client: KubeClient, i: int) -> None:
                await client.create(
                    path_for("v1", "pods", namespace),
                    pod(namespace, f"p-{i:04d}", claim_name(i)),
                )

            async def scheduler_phase() -> tuple[dict[str, float], dict[str, float]]:
                stop = asyncio.Event()
                renewer = asyncio.create_task(renew_lease(kubeconfig, stop))
                try:
                    return await measure(kubeconfig, namespace, n, args.deadline, create_pod)
                finally:
                    stop.set()
                    await renewer

            sent, seen = asyncio.run(scheduler_phase())
            scheduler = Result(
                "kube-scheduler (pods)",
                "pods",
                sent,
                seen,
                before,
                rss_mib(sched_pid),
                tree_rss_mib(sched_pid),
            )
            bound = sum(
                1
                for p in api.items(path_for("v1", "pods", namespace))
                if p["spec"].get("nodeName") == NODE
            )
            delete_pods(api, namespace)
            delete_claims(api, namespace)

            print(
                f"\nAllocation of {n} claims (1 device each, CEL selector on `model`) over "
                f"{args.devices} devices ({len(published)} allNodes slices), isolated cluster\n"
            )
            rows = [controller.row(), scheduler.row()]
            rows[0].insert(1, "none (no client-side limiter)")
            rows[1].insert(1, limits)
            print(
                table(
                    [
                        "path",
                        "client limits",
                        "allocated",
                        "rate",
                        "p50 ms",
                        "p99 ms",
                        "process RSS MiB",
                        "with children MiB",
                    ],
                    rows,
                )
            )
            print(
                f"\nratio: controller claims/s / scheduler pods/s = "
                f"{controller.rate / scheduler.rate:.2f}x"
            )
            print(f"\nController stages ({METRIC}, per claim):\n")
            print(
                table(
                    ["stage", "claims", "mean ms", "p50 ms", "p99 ms"],
                    [s.row() for s in stages],
                )
            )
            print("\nController at scale (same controller process, after the allocation):\n")
            print(table(["scenario", "time", "rate"], at_scale.rows()))
            print(
                "\ncontroller: immediate claims (annotation), "
                f"{args.workers} claim workers, leader election on; time = claim create sent -> "
                "allocation seen;\nthe chart's allocation-finalizer MutatingAdmissionPolicy "
                f"(finalizer added at create): {policy_note}.\n"
                f"scheduler: the cluster's kube-scheduler restarted with client {limits},\n"
                "one pod per pre-created claim (resourceClaimName) on a kubelet-less node with\n"
                f"allocatable pods {n + 100} (a kubelet's maxPods 110 would stop NodeResourcesFit\n"
                "before DRA); time = pod create sent -> claim allocation seen (written in\n"
                "PreBind, before binding). Pods bound right after the last allocation: "
                f"{bound}/{n}.\n"
                "RSS = the allocating process (dradriver-controller / kube-scheduler), "
                "before -> after (both cache the same slices and claims; the scheduler also "
                "the pods);\nwith children: after, plus its child processes (the "
                "controller's allocation worker).\n"
                "Stage p50/p99 are histogram bucket bounds."
            )
        ok = True
    finally:
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work} (controller log, last cluster logs in cluster-last-logs/)")


if __name__ == "__main__":
    main()
