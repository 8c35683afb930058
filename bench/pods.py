"""End to end: N pods with claim templates to Running, through dradriver's plugin and Go's.

Run with ``python -m bench.pods [--pods 50,120,200] [--devices N] [--runtime fake|real]
[--no-go]``. Uses the local cluster (reuses a running one, else starts one and stops it
afterwards); run it under the cluster lock. The whole path is real: the apiserver, the
scheduler allocating each pod's claim, the kubelet calling the plugin's
NodePrepareResources over its socket, the container runtime.

For each N, first dradriver's kubelet plugin (driver ``pods.bench.dradriver.dev``), then
the Go reference (dra-example-driver's kubelet plugin, driver ``gpu.example.com``) serve
the same number of devices on node-1 through node-1's kubelet, one plugin at a time, with
the same admin kubeconfig (Go's client limits lifted as in bench.prepare). Each gets a
DeviceClass of its own; every pod gets its own claim from one ResourceClaimTemplate, and
each plugin N + 1 devices (a warm-up pod, which shows that the kubelet has registered the
plugin, keeps one). The Go reference publishes its pool as one ResourceSlice, at most 128
devices, so it is measured up to 127 pods (hence the default 50,120,200).
Pods are created one after the other as fast as the apiserver answers; a watch sees each
become Running. Reported: pods/s (N over first create to last Running), create→Running
p50/p99, and the kubelet's own view of the plugin calls from its metrics, as the mean
(sum/count over the run; the kubelet's DRA histograms start at a 100 ms bucket, so their
buckets cannot resolve a p50): ``dra_grpc_operations_duration_seconds`` for the
plugin's NodePrepareResources and ``dra_operations_duration_seconds`` for the kubelet's
whole PrepareResources step of a pod.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    GO_BURST,
    GO_DRIVER,
    GO_QPS,
    BenchError,
    PluginUnderTest,
    delete_slices,
    go_binary,
    go_plugin,
    ours_plugin,
    percentile,
    short_workdir,
    table,
    wait_published,
)
from devtools.cluster.api import AdminAPI
from devtools.cluster.config import Layout, NodeLayout, default_state_dir, parse_runtime
from devtools.cluster.local import LocalCluster, running_cluster
from devtools.cluster.wait import wait_until
from dradriver.k8s.client import KubeClient, connection_from_files
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for

OUR_DRIVER = "pods.bench.dradriver.dev"
IMAGE = "registry.k8s.io/pause:3.10"  # on every runtime of the local cluster
TEMPLATE = "one-device"
PUBLISH_DEADLINE = 90.0
# How long N pods may take to run before the bench gives up (not a timing assertion).
RUN_DEADLINE_BASE = 120.0
RUN_DEADLINE_PER_POD = 2.0
CLEANUP_DEADLINE = 300.0
GRPC_METRIC = "dra_grpc_operations_duration_seconds"
STEP_METRIC = "dra_operations_duration_seconds"
PREPARE_METHOD = "NodePrepareResources"
# The API's limit for one ResourceSlice; the Go reference publishes its pool as one slice.
GO_MAX_DEVICES = 128


@dataclass
class Run:
    """One plugin's pods: when each was created and seen Running, and the kubelet's view."""

    created: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    grpc_prepare: tuple[float, float] = (0.0, 0.0)  # (sum, count) during the run
    step_prepare: tuple[float, float] = (0.0, 0.0)
    note: str = ""

    def latencies(self) -> list[float]:
        return [self.running[p] - self.created[p] for p in self.running if p in self.created]

    def pods_per_second(self) -> float:
        if not self.running or not self.created:
            return math.nan
        span = max(self.running.values()) - min(self.created.values())
        return len(self.running) / span if span > 0 else math.nan


# --------------------------------------------------------------------------------------------
# The kubelet's metrics
# --------------------------------------------------------------------------------------------


def kubelet_metrics(cluster: LocalCluster, node: NodeLayout) -> str:
    """The kubelet's /metrics, with the admin certificate (in an SSL context: httpx 0.28
    sends no client certificate given as ``cert=``)."""
    pki = cluster.layout.pki
    tls = connection_from_files(
        cluster.layout.apiserver_url, pki / "ca.crt", pki / "admin.crt", pki / "admin.key"
    ).tls
    with httpx.Client(verify=tls, timeout=30) as http:
        resp = http.get(f"https://127.0.0.1:{node.port}/metrics")
        resp.raise_for_status()
        return resp.text


def histogram_totals(text: str, name: str, labels: dict[str, str]) -> tuple[float, float]:
    """(sum, count) of the histogram series whose labels include ``labels``, added up."""
    total, count = 0.0, 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if not all(sample.labels.get(k, "").endswith(v) for k, v in labels.items()):
                continue
            if sample.name == f"{name}_sum":
                total += sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
    return total, count


def delta(after: tuple[float, float], before: tuple[float, float]) -> tuple[float, float]:
    return after[0] - before[0], after[1] - before[1]


def mean_ms(totals: tuple[float, float]) -> str:
    return "n/a" if totals[1] <= 0 else f"{totals[0] / totals[1] * 1000:.1f}"


# --------------------------------------------------------------------------------------------
# Objects
# --------------------------------------------------------------------------------------------


def device_class(name: str, driver: str) -> Obj:
    return {
        "apiVersion": f"{RESOURCE_V1}",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def claim_template(namespace: str, device_class_name: str) -> Obj:
    return {
        "apiVersion": RESOURCE_V1,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "dev", "exactly": {"deviceClassName": device_class_name}}]
                }
            }
        },
    }


def pod(namespace: str, name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": TEMPLATE}],
            "containers": [
                {
                    "name": "c",
                    "image": IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "resources": {"claims": [{"name": "dev"}]},
                }
            ],
        },
    }


@contextlib.contextmanager
def namespace_for(api: AdminAPI, label: str, n: int) -> Iterator[str]:
    name = f"dradriver-bench-pods-{label}-{n}"
    api.delete_namespace(name, timeout=CLEANUP_DEADLINE)  # leftovers of an interrupted run
    api.create_namespace(name)
    try:
        yield name
    finally:
        # Pods first, and wait for their claims: the kubelet unprepares them through the
        # plugin, which must still be running.
        with contextlib.suppress(Exception):
            api.delete(path_for("v1", "pods", name), gracePeriodSeconds="0")
            wait_until(
                f"claims of {name} released",
                lambda: not api.items(path_for(RESOURCE_V1, "resourceclaims", name)),
                CLEANUP_DEADLINE,
                0.5,
            )
        api.delete_namespace(name, timeout=CLEANUP_DEADLINE)


# --------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------


async def run_pods(cluster: LocalCluster, api: AdminAPI, namespace: str, names: list[str]) -> Run:
    """Create the pods one after the other and watch them until every one is Running."""
    run = Run()
    pki = cluster.layout.pki
    watcher = KubeClient(
        connection_from_files(
            cluster.layout.apiserver_url, pki / "ca.crt", pki / "admin.crt", pki / "admin.key"
        ),
        "dradriver-bench",
    )
    pods_path = path_for("v1", "pods", namespace)
    start_rv = str((await watcher.list(pods_path))["metadata"]["resourceVersion"])
    wanted = set(names)
    deadline = RUN_DEADLINE_BASE + RUN_DEADLINE_PER_POD * len(names)

    async def watch() -> None:
        rv = start_rv
        while not wanted <= run.running.keys():
            async for event in watcher.watch(pods_path, rv):
                obj = event.get("object") or {}
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                name = (obj.get("metadata") or {}).get("name")
                phase = (obj.get("status") or {}).get("phase")
                if name in wanted and phase == "Running" and name not in run.running:
                    run.running[name] = time.monotonic()
                if wanted <= run.running.keys():
                    return

    def create_all() -> None:
        for name in names:
            api.create(pods_path, pod(namespace, name))
            run.created[name] = time.monotonic()

    watching = asyncio.create_task(watch())
    try:
        await asyncio.to_thread(create_all)
        try:
            await asyncio.wait_for(asyncio.shield(watching), deadline)
        except TimeoutError:
            run.note = (
                f"{len(wanted - run.running.keys())} of {len(names)} pods were not Running "
                f"within {deadline:.0f}s"
            )
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        await watcher.aclose()
    return run


def bench_plugin(
    cluster: LocalCluster,
    api: AdminAPI,
    plugin: PluginUnderTest,
    class_name: str,
    devices: int,
    n: int,
) -> Run:
    node = cluster.layout.all_nodes()[0]
    api.apply(
        path_for(RESOURCE_V1, "deviceclasses", name=class_name),
        device_class(class_name, plugin.driver),
        "dradriver-bench",
    )
    try:
        delete_slices(api, plugin.node, plugin.driver)
        plugin.start()
        if not wait_published(api, plugin, devices, PUBLISH_DEADLINE):
            raise BenchError(f"the {plugin.label} plugin did not publish {devices} devices")
        with namespace_for(api, plugin.label, n) as namespace:
            api.create(
                path_for(RESOURCE_V1, "resourceclaimtemplates", namespace),
                claim_template(namespace, class_name),
            )
            # One pod first: the kubelet has registered the plugin once it runs.
            warmup = asyncio.run(run_pods(cluster, api, namespace, ["warmup"]))
            if warmup.note:
                raise BenchError(f"the {plugin.label} plugin's first pod: {warmup.note}")
            before = kubelet_metrics(cluster, node)
            run = asyncio.run(run_pods(cluster, api, namespace, [f"p-{i}" for i in range(n)]))
            after = kubelet_metrics(cluster, node)
            grpc = {"driver_name": plugin.driver, "method_name": PREPARE_METHOD}
            run.grpc_prepare = delta(
                histogram_totals(after, GRPC_METRIC, grpc),
                histogram_totals(before, GRPC_METRIC, grpc),
            )
            step = {"operation_name": "PrepareResources", "is_error": "false"}
            run.step_prepare = delta(
                histogram_totals(after, STEP_METRIC, step),
                histogram_totals(before, STEP_METRIC, step),
            )
        plugin.check_alive()
        return run
    finally:
        plugin.stop()
        delete_slices(api, plugin.node, plugin.driver)
        with contextlib.suppress(Exception):
            api.delete(path_for(RESOURCE_V1, "deviceclasses", name=class_name))


def allocatable_pods(api: AdminAPI, node: str) -> int:
    status = api.get(path_for("v1", "nodes", name=node)).get("status") or {}
    return int((status.get("allocatable") or {}).get("pods", "0"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", default="50,120,200", help="comma-separated pod counts")
    parser.add_argument(
        "--devices", type=int, default=0, help="devices per plugin (default: pods + 1)"
    )
    parser.add_argument("--runtime", type=parse_runtime, default="fake", help="fake or real")
    parser.add_argument("--no-go", action="store_true", help="skip the Go reference")
    args = parser.parse_args()
    counts = [int(c) for c in args.pods.split(",") if c.strip()]
    if not counts or min(counts) < 1:
        parser.error("--pods needs positive counts, e.g. 50,200")
    # One device a pod, and one for the warm-up pod, which keeps its device.
    if args.devices and args.devices <= max(counts):
        parser.error("--devices must exceed the largest pod count (one device a pod + warm-up)")

    binary, go_how = (None, "skipped (--no-go)") if args.no_go else go_binary()
    results: dict[tuple[str, int], Run | str] = {}
    layout = Layout(state_dir=default_state_dir(), runtime=args.runtime)
    with running_cluster(layout) as (cluster, state, _), cluster.api() as api:
        node = cluster.layout.all_nodes()[0]
        room = allocatable_pods(api, node.name)
        if room < max(counts) + 2:
            raise SystemExit(
                f"node {node.name} takes {room} pods, {max(counts) + 2} are needed; restart the "
                "local cluster (`dradriver cluster down`) so its kubelet gets maxPods 250"
            )
        kubeconfig = Path(state.kubeconfig)
        cdi_dir = node.cdi_dir if node.runtime == "real" else None
        with short_workdir() as work:
            for n in counts:
                devices = args.devices or n + 1
                ours = ours_plugin(
                    work / f"ours-{n}",
                    OUR_DRIVER,
                    node.name,
                    devices,
                    kubeconfig,
                    kubelet_root=node.root,
                    cdi_dir=cdi_dir,
                )
                results[("ours", n)] = bench_plugin(
                    cluster, api, ours, "bench-pods-ours", devices, n
                )
                if binary is None:
                    continue
                if devices > GO_MAX_DEVICES:
                    results[("go", n)] = (
                        f"not measured: the Go reference publishes one ResourceSlice, at most "
                        f"{GO_MAX_DEVICES} devices, and {devices} are needed"
                    )
                    continue
                go = go_plugin(
                    binary,
                    work / f"go-{n}",
                    node.name,
                    devices,
                    kubeconfig,
                    kubelet_root=node.root,
                    cdi_dir=cdi_dir,
                )
                try:
                    results[("go", n)] = bench_plugin(cluster, api, go, "bench-pods-go", devices, n)
                except BenchError as e:
                    results[("go", n)] = f"the Go reference failed: {e}"
    report(args, counts, node.runtime, results, go_how)


def report(
    args: argparse.Namespace,
    counts: Sequence[int],
    runtime: str,
    results: dict[tuple[str, int], Run | str],
    go_how: str,
) -> None:
    print(
        f"\nPods with one claim each (ResourceClaimTemplate) to Running on node-1, "
        f"{args.devices or 'pods + 1'} devices per plugin (the warm-up pod keeps one), "
        f"{runtime} runtime; pods created one after the other"
    )
    print(f"ours: dradriver kubeletplugin, driver {OUR_DRIVER}")
    print(
        f"go:   {go_how}\n      driver {GO_DRIVER}, --kube-api-qps={GO_QPS} "
        f"--kube-api-burst={GO_BURST}"
    )
    rows = []
    for n in counts:
        for label in ("ours", "go"):
            run = results.get((label, n))
            if run is None:
                continue
            if isinstance(run, str):
                rows.append([f"{n}", label, run, "", "", "", ""])
                continue
            lat = run.latencies()
            rows.append(
                [
                    f"{n}",
                    label,
                    f"{run.pods_per_second():.2f}",
                    f"{percentile(lat, 0.5):.2f}",
                    f"{percentile(lat, 0.99):.2f}",
                    mean_ms(run.grpc_prepare),
                    mean_ms(run.step_prepare),
                ]
            )
            if run.note:
                rows[-1][0] += " *"
                print(f"  * {label}, {n} pods: {run.note}")
    print()
    print(
        table(
            [
                "pods",
                "plugin",
                "pods/s",
                "create->Running p50 (s)",
                "p99 (s)",
                "kubelet: NodePrepareResources mean (ms)",
                "kubelet: PrepareResources step mean (ms)",
            ],
            rows,
            text_columns=2,
        )
    )
    ratios = []
    for n in counts:
        o, g = results.get(("ours", n)), results.get(("go", n))
        if isinstance(o, Run) and isinstance(g, Run):
            ol, gl = o.latencies(), g.latencies()
            ratios.append(
                [
                    f"{n}",
                    f"{o.pods_per_second() / g.pods_per_second():.2f}",
                    f"{percentile(ol, 0.5) / percentile(gl, 0.5):.2f}",
                    f"{percentile(ol, 0.99) / percentile(gl, 0.99):.2f}",
                ]
            )
    if ratios:
        print("\nours/go (pods/s: higher is better; latencies: lower is better)\n")
        print(table(["pods", "pods/s", "p50", "p99"], ratios))


if __name__ == "__main__":
    main()
