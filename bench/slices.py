"""ResourceSlice publishing for 1,000 and 10,000 devices: time and API writes.

Run with ``python -m bench.slices [--sizes 1000,10000] [--no-go]``. Uses the local cluster
(reuses a running one, else starts one and stops it afterwards).

dradriver's SlicePublisher and build_node_slices run in-process against the apiserver with
the admin kubeconfig, for driver ``slices.bench.dradriver.dev`` on node ``bench-node`` (no
Node object: the slices then carry no owner reference), reading the slices from an
informer as the plugin does. Per size, each step builds the node's pool and runs one
``SlicePublisher.sync()``:

1. publish from scratch (no slices of this driver and node exist);
2. republish with an unchanged inventory (expected: 0 writes);
3. one device's attributes changed;
4. one device turned unhealthy (it gets the unhealthy taint, which lowers that slice's
   device limit from 128 to 64).

The slices are deleted afterwards. The Go reference (dra-example-driver's kubelet plugin) is
asked to publish the same number of devices too; it puts every device of its pool in one
ResourceSlice, so the outcome is reported as measured (the apiserver allows 128 devices per
slice).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    BENCH_NODE,
    GO_DRIVER,
    BenchError,
    create_fake_node,
    delete_node,
    delete_slices,
    go_binary,
    go_plugin,
    go_publish_outcome,
    node_slices,
    published_devices,
    shared_layout,
    short_workdir,
    table,
)
from devtools.cluster.api import AdminAPI
from devtools.cluster.local import running_cluster
from devtools.cluster.wait import wait_until
from dradriver.devices.model import Device
from dradriver.devices.sourceconfig import StaticDeviceEntry
from dradriver.k8s.client import KubeClient, load_connection
from dradriver.resourceslice.pool import node_pool
from dradriver.resourceslice.publisher import SlicePublisher, slice_informer

SMOKE_ARGS = ("--sizes", "10", "--no-go")
CLUSTER = "shared"  # the running local cluster, or one it starts (bench/__init__.py)

DRIVER = "slices.bench.dradriver.dev"
GO_NODE = "bench-go-slices"
GO_DEADLINE = 30.0


def devices(count: int, model: str = "bench-gpu") -> list[Device]:
    """Devices shaped like the example driver's GPUs: 4 attributes, 2 capacities."""
    entry = StaticDeviceEntry.model_validate(
        {
            "namePrefix": "dev",
            "count": count,
            "attributes": {"model": model, "driverVersion": {"version": "1.0.0"}, "numa": 0},
            "capacity": {"memory": "80Gi", "compute": "100"},
        }
    )
    return entry.expand()


@dataclass
class Step:
    name: str
    seconds: float
    writes: int
    slices: int


async def measure(api: AdminAPI, kubeconfig: Path, count: int) -> list[Step]:
    inventory = devices(count)
    client = KubeClient(load_connection(str(kubeconfig)), "dradriver-bench-slices")

    cache = slice_informer(client, DRIVER, BENCH_NODE)
    cache.start()
    await cache.wait_for_sync()
    publisher = SlicePublisher(client, DRIVER, cache, node=BENCH_NODE)
    steps: list[Step] = []

    async def step(name: str) -> None:
        before = client.write_count
        started = time.perf_counter()
        publisher.set_pool(node_pool(DRIVER, BENCH_NODE, inventory, []))
        writes = (await publisher.sync(BENCH_NODE)).writes
        seconds = time.perf_counter() - started
        if client.write_count - before != writes:
            raise BenchError(
                f"{name}: the publisher counted {writes} writes, the client "
                f"{client.write_count - before}"
            )
        count_slices = len(node_slices(api, BENCH_NODE, DRIVER))
        steps.append(Step(name, seconds, writes, count_slices))

    try:
        await step("publish from scratch")
        await step("republish, unchanged")
        middle = count // 2
        changed = devices(count, model="bench-gpu-v2")[middle]
        inventory[middle] = changed
        await step("one device's attributes changed")
        inventory[middle] = changed.model_copy(update={"healthy": False})
        await step("one device unhealthy (taint)")
        await step("republish, unchanged again")
        if published_devices(api, BENCH_NODE, DRIVER) != count:
            raise BenchError(f"the apiserver does not hold {count} devices after publishing")
    finally:
        await cache.stop()
        await client.aclose()
    return steps


def go_attempt(api: AdminAPI, binary: Path, kubeconfig: Path, count: int) -> str:
    """Start the Go plugin with ``count`` devices; what happened to its slices, measured."""
    with short_workdir() as work:
        plugin = go_plugin(binary, work, GO_NODE, count, kubeconfig)
        try:
            create_fake_node(api, GO_NODE)
            started = time.monotonic()
            plugin.start()
            asyncio.run(plugin.register())

            return go_publish_outcome(api, plugin, count, started, GO_DEADLINE)
        finally:
            plugin.stop()
            delete_slices(api, GO_NODE, GO_DRIVER)
            delete_node(api, GO_NODE)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000", help="device counts, comma-separated")
    parser.add_argument("--no-go", action="store_true", help="skip the Go reference")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    binary, go_how = (None, "skipped (--no-go)") if args.no_go else go_binary()
    results: dict[int, list[Step]] = {}
    go_results: dict[int, str] = {}
    layout = shared_layout()
    with running_cluster(layout) as (cluster, state, _started), cluster.api() as api:
        kubeconfig = Path(state.kubeconfig)
        for count in sizes:
            try:
                delete_slices(api, BENCH_NODE, DRIVER)  # leftovers of an interrupted run
                results[count] = asyncio.run(measure(api, kubeconfig, count))
            finally:
                delete_slices(api, BENCH_NODE, DRIVER)
                wait_until(
                    "benchmark slices deleted",
                    lambda: not node_slices(api, BENCH_NODE, DRIVER),
                    30,
                )
        if binary is not None:
            for count in sizes:
                try:
                    go_results[count] = go_attempt(api, binary, kubeconfig, count)
                except BenchError as e:
                    go_results[count] = f"the Go plugin failed: {e}"

    print(
        f"\nResourceSlice publishing, dradriver SlicePublisher in-process (driver {DRIVER}, "
        f"node {BENCH_NODE}),\nadmin kubeconfig; one sync() per step; devices with 4 "
        "attributes and 2 capacities\n"
    )
    rows = []
    for count, steps in results.items():
        for s in steps:
            rows.append(
                [f"{count:,}", s.name, f"{s.seconds * 1000:.0f}", str(s.writes), str(s.slices)]
            )
    print(table(["devices", "step", "time ms", "API writes", "slices after"], rows, 2))
    print(f"\nGo reference: {go_how}")
    for count, outcome in go_results.items():
        print(f"  {count:,} devices: {outcome}")
    if any(o.startswith("rejected") for o in go_results.values()):
        print(
            "  (dra-example-driver's gpu profile publishes its whole pool as one slice, so it "
            "cannot publish more than 128 devices; no Go numbers at these sizes)"
        )


if __name__ == "__main__":
    main()
