"""Memory of the kubelet plugin process: VmRSS and VmHWM at 1,000 devices.

Run with ``python -m bench.plugin_rss [--devices N] [--claims N] [--no-go]``. Uses the local
cluster (reuses a running one, else starts one and stops it afterwards).

Each plugin runs as its own process with its own kubelet root dir; the benchmark registers it
as the kubelet would and reads /proc/<pid>/status:

1. after start-up: registered, and its ResourceSlices published (ours) or the publish attempt
   answered by the apiserver (Go, whose single-slice pool cannot hold 1,000 devices);
2. after preparing ``--claims`` claims (concurrent single-claim NodePrepareResources calls,
   as the kubelet does for that many pods);
3. after unpreparing them again.

Ours: driver ``rss.bench.dradriver.dev`` on node ``bench-node``, a static source of N mock
devices. Go: dra-example-driver's kubelet plugin (``--num-devices=N``), driver
``gpu.example.com`` on node ``bench-go-rss`` (a cordoned, tainted Node object that exists only
while it runs).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    BENCH_NODE,
    GO_BURST,
    GO_QPS,
    BenchClaim,
    BenchError,
    DRAClient,
    PluginUnderTest,
    allocated_claims,
    bench_namespace,
    create_fake_node,
    delete_namespace,
    delete_node,
    delete_slices,
    go_binary,
    go_plugin,
    go_publish_outcome,
    ours_plugin,
    rss_kib,
    shared_layout,
    short_workdir,
    table,
    wait_published,
)
from devtools.cluster.api import AdminAPI
from devtools.cluster.local import running_cluster

SMOKE_ARGS = ("--devices", "10", "--claims", "2", "--no-go")
CLUSTER = "shared"  # the running local cluster, or one it starts (bench/__init__.py)

OUR_DRIVER = "rss.bench.dradriver.dev"
GO_NODE = "bench-go-rss"
DEADLINE = 90.0
STAGES = ("after start-up", "after preparing the claims", "after unpreparing them")


@dataclass
class Memory:
    kib: dict[str, tuple[int, int]] = field(default_factory=dict)
    startup: str = ""


async def prepare_all(plugin: PluginUnderTest, claims: list[BenchClaim], memory: Memory) -> None:
    client = DRAClient(plugin.dra_socket)
    try:
        await asyncio.gather(*(client.prepare([c]) for c in claims))
        memory.kib[STAGES[1]] = rss_kib(plugin.pid)
        await asyncio.gather(*(client.unprepare([c]) for c in claims))
        memory.kib[STAGES[2]] = rss_kib(plugin.pid)
    finally:
        await client.close()


def measure(
    api: AdminAPI, plugin: PluginUnderTest, namespace: str, devices: int, claims: int
) -> Memory:
    memory = Memory()
    try:
        delete_slices(api, plugin.node, plugin.driver)  # leftovers of an interrupted run
        started = time.monotonic()
        plugin.start()
        asyncio.run(plugin.register(DEADLINE))
        if plugin.label == "go":
            memory.startup = go_publish_outcome(api, plugin, devices, started, DEADLINE)
        else:
            if not wait_published(api, plugin, devices, DEADLINE):
                raise BenchError(f"{devices} devices were not published within {DEADLINE:.0f}s")
            memory.startup = f"published in {time.monotonic() - started:.2f}s after process start"
        memory.kib[STAGES[0]] = rss_kib(plugin.pid)
        refs = allocated_claims(api, namespace, plugin, claims)
        asyncio.run(prepare_all(plugin, refs, memory))
        plugin.check_alive()
    finally:
        plugin.stop()
        delete_slices(api, plugin.node, plugin.driver)
    return memory


def mib(kib: int | None) -> str:
    return "n/a" if kib is None else f"{kib / 1024:.1f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--no-go", action="store_true", help="skip the Go reference")
    args = parser.parse_args(argv)
    if args.claims > args.devices:
        parser.error("--claims must not exceed --devices (every claim gets its own device)")

    binary, go_how = (None, "skipped (--no-go)") if args.no_go else go_binary()
    ours: Memory | None = None
    go: Memory | None = None
    go_error = "" if binary is not None else go_how
    layout = shared_layout()
    with running_cluster(layout) as (cluster, state, _started), cluster.api() as api:
        kubeconfig = Path(state.kubeconfig)
        namespace = bench_namespace(api)
        try:
            with short_workdir() as work:
                plugin = ours_plugin(work, OUR_DRIVER, BENCH_NODE, args.devices, kubeconfig)
                ours = measure(api, plugin, namespace, args.devices, args.claims)
                if binary is not None:
                    try:
                        create_fake_node(api, GO_NODE)
                        plugin = go_plugin(binary, work, GO_NODE, args.devices, kubeconfig)
                        go = measure(api, plugin, namespace, args.devices, args.claims)
                    except BenchError as e:
                        go_error = f"the Go reference failed: {e}"
                    finally:
                        delete_node(api, GO_NODE)
        finally:
            delete_namespace(api, namespace)

    assert ours is not None
    print(
        f"\nKubelet plugin process memory (MiB, /proc/<pid>/status), {args.devices:,} devices, "
        f"{args.claims} claims prepared concurrently"
    )
    print(f"ours: dradriver kubeletplugin (python), start-up: {ours.startup}")
    if go is not None:
        print(f"go:   {go_how}, --kube-api-qps={GO_QPS} --kube-api-burst={GO_BURST}")
        print(f"      start-up: {go.startup}")
    else:
        print(f"go:   not measured: {go_error}")
    rows = []
    for stage in STAGES:
        o_rss, o_hwm = ours.kib.get(stage, (None, None))
        g_rss, g_hwm = go.kib.get(stage, (None, None)) if go else (None, None)
        rows.append([stage, mib(o_rss), mib(o_hwm), mib(g_rss), mib(g_hwm)])
    print()
    print(table(["stage", "ours VmRSS", "ours VmHWM", "go VmRSS", "go VmHWM"], rows))


if __name__ == "__main__":
    main()
