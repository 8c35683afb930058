"""Device-plugin shim: RPC latency through the real socket, and health change to allocatable.

Run with ``python -m bench.deviceplugin [--iterations N] [--devices N] [--health-rounds N]``.
Uses the local cluster (reuses a running one, else starts one and stops it afterwards).

* RPCs: a dradriver-kubeletplugin process with its own kubelet root (no kubelet: the
  benchmark calls the shim's socket the way the kubelet's device manager does) serving
  ``--devices`` mock devices on two NUMA nodes and eight PCIe roots through one resource.
  GetPreferredAllocation over all devices for 1 and 4 devices; Allocate of one fresh device
  (ledger hold + CDI spec written, fsync'd), and Allocate of a device whose previous hold
  is stale (the kubelet reused it before the pod-resources poll released it).
* Health: the shim on the real node (node-1) with four devices; a mock device file is
  deleted (or restored) and the clock runs until the plugin has sent the new list
  (its ``dradriver_deviceplugin_devices`` gauge) and until the Node's
  ``status.allocatable`` shows the change. The plugin checks health every second here
  (``--health-interval=1``); the kubelet writes node status every 10 s
  (``nodeStatusUpdateFrequency``), which dominates. Each change starts at a random phase
  of that period.

Printed as tables; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import yaml
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2 as dp
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2_grpc as dp_grpc

from bench.common import (
    BenchError,
    PluginUnderTest,
    free_port,
    ms,
    percentile,
    shared_layout,
    short_workdir,
    table,
)
from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster, running_cluster
from devtools.cluster.wait import wait_until
from devtools.harness.nodeplugin import NodePlugin, start_node_plugin
from dradriver.deviceplugin.endpoints import socket_name
from dradriver.devices.static import create_mock_device
from dradriver.k8s.paths import RESOURCE_V1, path_for

SMOKE_ARGS = ("--iterations", "3", "--devices", "12", "--health-rounds", "1")
CLUSTER = "shared"  # the running local cluster, or one it starts (bench/__init__.py)

RPC_DRIVER = "dpbench.dradriver.dev"
RPC_NODE = "bench-dp-node"
HEALTH_DRIVER = "dphealth.dradriver.dev"
WARMUP = 5
NODE_STATUS_PERIOD = 10.0  # the kubelet's default nodeStatusUpdateFrequency


def rpc_config(root: Path, devices: int) -> dict[str, Any]:
    return {
        "driverName": RPC_DRIVER,
        "sources": [
            {
                "static": {
                    "mockDir": str(root / "mock"),
                    "devices": [
                        {
                            "name": f"dev-{i}",
                            "attributes": {
                                "numaNode": i * 2 // devices,
                                "resource.kubernetes.io/pcieRoot": f"pci{i * 8 // devices:04x}:00",
                            },
                        }
                        for i in range(devices)
                    ],
                }
            }
        ],
        "devicePlugin": {
            "enabled": True,
            "mode": "shared",
            "resources": [{"resourceName": f"{RPC_DRIVER}/mock"}],
        },
    }


async def timed(calls: int, call: Callable[[int], Awaitable[Any]]) -> list[float]:
    for i in range(WARMUP):
        await call(-1 - i)
    samples = []
    for i in range(calls):
        started = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - started)
    return samples


async def rpc_bench(kubeconfig: Path, iterations: int, devices: int) -> dict[str, list[float]]:
    with short_workdir() as work:
        root = work / "shim"
        root.mkdir()
        config = root / "config.yaml"
        config.write_text(yaml.safe_dump(rpc_config(root, devices)))
        plugin_dir = root / "kubelet" / "device-plugins"
        plugin = PluginUnderTest(
            label="shim",
            driver=RPC_DRIVER,
            node=RPC_NODE,
            argv=[
                sys.executable,
                "-m",
                "kubeletplugin.main",
                f"--config={config}",
                f"--node-name={RPC_NODE}",
                f"--kubeconfig={kubeconfig}",
                f"--kubelet-root={root / 'kubelet'}",
                f"--cdi-dir={root / 'cdi'}",
                f"--state-dir={root / 'state'}",
                f"--http-address=127.0.0.1:{free_port()}",
            ],
            workdir=root,
            kubelet_root=root / "kubelet",
            device_prefix="dev",
        )
        sock = plugin_dir / socket_name(f"{RPC_DRIVER}/mock", "", plugin_dir)
        plugin.start()
        try:

            def serving() -> bool:
                plugin.check_alive()
                return sock.exists()

            await asyncio.to_thread(wait_until, "the shim's socket", serving, 60)
            async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
                stub = dp_grpc.DevicePluginStub(channel)
                names = [f"dev-{i}" for i in range(devices)]
                results: dict[str, list[float]] = {}

                def preferred(size: int) -> Callable[[int], Awaitable[Any]]:
                    request = dp.PreferredAllocationRequest(
                        container_requests=[
                            dp.ContainerPreferredAllocationRequest(
                                available_deviceIDs=names, allocation_size=size
                            )
                        ]
                    )

                    async def call(_: int) -> Any:
                        return await stub.GetPreferredAllocation(request)

                    return call

                async def allocate(index: int) -> Any:
                    device = names[index % devices]
                    return await stub.Allocate(
                        dp.AllocateRequest(
                            container_requests=[dp.ContainerAllocateRequest(devices_ids=[device])]
                        )
                    )

                for size in (1, 4):
                    results[f"GetPreferredAllocation, {size} of {devices}"] = await timed(
                        iterations, preferred(size)
                    )
                # Fresh devices first (the warm-up takes the last ones), then the same
                # devices again: each Allocate then supersedes the stale hold first.
                fresh = min(iterations, devices - WARMUP)
                results["Allocate 1 device (fresh)"] = await timed(fresh, allocate)
                results["Allocate 1 device (stale hold superseded)"] = await timed(fresh, allocate)
                return results
        finally:
            plugin.stop()


def health_config(work: Path) -> dict[str, Any]:
    return {
        "driverName": HEALTH_DRIVER,
        "sources": [
            {
                "static": {
                    "mockDir": str(work / "mock"),
                    "devices": [{"namePrefix": "dev", "count": 4}],
                }
            }
        ],
        "devicePlugin": {
            "enabled": True,
            "mode": "partitioned",
            "resources": [{"resourceName": f"{HEALTH_DRIVER}/mock"}],
        },
    }


def unhealthy_gauge(plugin: NodePlugin) -> float:
    for line in plugin.metrics().splitlines():
        if line.startswith("dradriver_deviceplugin_devices{") and 'health="Unhealthy"' in line:
            return float(line.rsplit(" ", 1)[1])
    return -1.0


def allocatable(api: AdminAPI, node: str, resource: str) -> int:
    status = api.get(path_for("v1", "nodes", name=node))["status"]
    return int(status.get("allocatable", {}).get(resource, "0"))


def gauge_is(plugin: NodePlugin, value: float) -> bool:
    return unhealthy_gauge(plugin) == value


def allocatable_is(api: AdminAPI, node: str, resource: str, count: int) -> bool:
    return allocatable(api, node, resource) == count


def health_bench(cluster: LocalCluster, rounds: int) -> dict[str, list[float]]:
    work = Path("/tmp/dradriver-bench-dphealth")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700)
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(health_config(work)))
    node = cluster.layout.node_name
    resource = f"{HEALTH_DRIVER}/mock"
    results: dict[str, list[float]] = {
        "plugin sent the new list (down)": [],
        "node allocatable updated (down)": [],
        "plugin sent the new list (up)": [],
        "node allocatable updated (up)": [],
    }
    with cluster.api() as api:
        plugin = start_node_plugin(cluster, api, config, work, driver=HEALTH_DRIVER)
        try:
            wait_until("4 allocatable", lambda: allocatable(api, node, resource) == 4, 60)
            mock = work / "mock" / "dev-3"
            for _ in range(rounds):
                for direction, gauge, count in (("down", 1.0, 3), ("up", 0.0, 4)):
                    # Not a synchronisation: a random phase against the kubelet's 10 s node
                    # status period, else every change would land right after a status write.
                    time.sleep(random.uniform(0, NODE_STATUS_PERIOD))
                    started = time.monotonic()
                    if direction == "down":
                        mock.unlink()
                    else:
                        create_mock_device(str(mock))
                    wait_until(
                        "the plugin's new list",
                        partial(gauge_is, plugin, gauge),
                        60,
                        interval=0.01,
                    )
                    results[f"plugin sent the new list ({direction})"].append(
                        time.monotonic() - started
                    )
                    wait_until(
                        f"allocatable {count}",
                        partial(allocatable_is, api, node, resource, count),
                        60,
                        interval=0.05,
                    )
                    results[f"node allocatable updated ({direction})"].append(
                        time.monotonic() - started
                    )
        finally:
            plugin.stop()
            for s in api.items(
                path_for(RESOURCE_V1, "resourceslices"),
                fieldSelector=f"spec.nodeName={node},spec.driver={HEALTH_DRIVER}",
            ):
                api.delete(path_for(RESOURCE_V1, "resourceslices", name=s["metadata"]["name"]))
            shutil.rmtree(work, ignore_errors=True)
    return results


def rows(results: dict[str, list[float]]) -> list[list[str]]:
    return [
        [
            name,
            str(len(samples)),
            ms(percentile(samples, 0.5)),
            ms(percentile(samples, 0.99)),
            ms(max(samples)),
        ]
        for name, samples in results.items()
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200, help="calls per RPC scenario")
    parser.add_argument("--devices", type=int, default=128, help="devices of the RPC shim")
    parser.add_argument("--health-rounds", type=int, default=10, help="down/up cycles")
    args = parser.parse_args(argv)
    if args.devices < WARMUP + 4:
        parser.error(f"--devices must be at least {WARMUP + 4}")
    layout = shared_layout()
    with running_cluster(layout) as (cluster, state, _started):
        rpc = asyncio.run(rpc_bench(Path(state.kubeconfig), args.iterations, args.devices))
        health = health_bench(cluster, args.health_rounds)
    headers = ["scenario", "n", "p50 ms", "p99 ms", "max ms"]
    print("\nDevice-plugin RPCs through the shim's unix socket (client-side latency)\n")
    print(table(headers, rows(rpc)))
    print("\nDevice health change -> kubelet (mock file deleted / restored, real node)\n")
    print(table(headers, rows(health)))


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        sys.exit(f"bench.deviceplugin: {e}")
