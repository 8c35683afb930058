"""In-process allocator benchmark: 1,000 claims over 10,000 devices with CEL selectors.

``python -m bench.allocator [--claims N] [--nodes N] [--devices-per-node N]
[--sweep 100,1000,5000]``

The inventory is node-local pools (one slice per node, 100 nodes x 100 devices by default)
with typed attributes (model, numa, index, driverVersion) and a memory capacity, plus one
class whose selector checks the driver. Claims, allocated one after the other like
immediate allocation ("pick a node": the first node in name order that fits), mix:

* 50 %: one device of a given model (string attribute selector);
* 20 %: one device with at least 32Gi (``capacity...compareTo(quantity("32Gi")) >= 0``);
* 10 %: one device with a newer driver (``driverVersion.isGreaterThan(semver("1.2.0"))``);
* 10 %: two devices on the same NUMA node (``matchAttribute``);
* 10 %: ``firstAvailable`` (an h100, else an l4).

Runs: "pick a node" twice (cold: selectors evaluated on demand; warm: a second allocator
over the same inventory, whose selector results are cached) and "given node" (claim i on
node i mod N: spreads the claims, so many more devices get evaluated). Then one explain of
an unsatisfiable claim over the whole inventory.

Each allocation is added to the allocated state before the next claim. Reported: claims/s,
per-claim latency p50/p99 (allocate + record), allocated/failed counts, search steps, CEL
evaluations and Python callbacks (with the estimated cel-expr-python leak), and RSS.

Then the **sweep**: the same claims over each of ``--sweep`` node counts with 8 devices per
node (the shape of a cluster's node-local pools), each size in a process of its own (so its
RSS is its own): index build, the rebuild after one node's slice changed (over the
allocation worker's pool cache), warm claims/s and p50/p99, explain, RSS, and the growth
exponent b of ``figure ~ N^b`` (per-claim time should be flat: b near 0).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from dradriver import cel
from dradriver.allocator import AllocatedState, Allocator, SliceInventory, claim_key, explain
from dradriver.allocator.inventory import PoolCache
from dradriver.k8s.objects import Obj

SMOKE_ARGS = ("--claims", "10", "--nodes", "2", "--devices-per-node", "10", "--sweep", "2,4")
SWEEP_DEVICES_PER_NODE = 8
CLUSTER = "none"  # needs no cluster

DRIVER = "bench.dradriver.dev"
MODELS = ("a100", "h100", "l4", "t4")
MEMORY = ("16Gi", "40Gi", "80Gi", "24Gi")
VERSIONS = ("1.1.0", "1.2.3", "1.3.0-rc.1", "2.0.0")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_slices(nodes: int, per_node: int) -> list[Obj]:
    slices = []
    for n in range(nodes):
        node = f"bench-node-{n:03d}"
        devices = []
        for i in range(per_node):
            k = n * per_node + i
            devices.append(
                {
                    "name": f"gpu-{i}",
                    "attributes": {
                        "model": {"string": MODELS[k % len(MODELS)]},
                        "index": {"int": i},
                        "numa": {"int": i % 2},
                        "driverVersion": {"version": VERSIONS[(k // 4) % len(VERSIONS)]},
                    },
                    "capacity": {"memory": {"value": MEMORY[(k // 2) % len(MEMORY)]}},
                }
            )
        slices.append(
            {
                "metadata": {"name": f"{node}-{DRIVER}-00000"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            }
        )
    return slices


def make_classes() -> list[Obj]:
    return [
        {
            "metadata": {"name": "bench-gpu"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    ]


def _sel(expression: str) -> list[Obj]:
    return [{"cel": {"expression": expression}}]


def make_claim(i: int) -> Obj:
    d = f'device.attributes["{DRIVER}"]'
    kind = i % 10
    requests: list[Obj]
    constraints: list[Obj] = []
    if kind < 5:
        model = MODELS[i % len(MODELS)]
        requests = [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "bench-gpu",
                    "selectors": _sel(f'{d}.model == "{model}"'),
                },
            }
        ]
    elif kind < 7:
        expression = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("32Gi")) >= 0'
        requests = [
            {
                "name": "gpu",
                "exactly": {"deviceClassName": "bench-gpu", "selectors": _sel(expression)},
            }
        ]
    elif kind < 8:
        expression = f'{d}.driverVersion.isGreaterThan(semver("1.2.0"))'
        requests = [
            {
                "name": "gpu",
                "exactly": {"deviceClassName": "bench-gpu", "selectors": _sel(expression)},
            }
        ]
    elif kind < 9:
        requests = [
            {"name": "a", "exactly": {"deviceClassName": "bench-gpu"}},
            {"name": "b", "exactly": {"deviceClassName": "bench-gpu"}},
        ]
        constraints = [{"matchAttribute": f"{DRIVER}/numa"}]
    else:
        requests = [
            {
                "name": "gpu",
                "firstAvailable": [
                    {
                        "name": "h100",
                        "deviceClassName": "bench-gpu",
                        "selectors": _sel(f'{d}.model == "h100"'),
                    },
                    {
                        "name": "l4",
                        "deviceClassName": "bench-gpu",
                        "selectors": _sel(f'{d}.model == "l4"'),
                    },
                ],
            }
        ]
    return {
        "metadata": {"name": f"claim-{i:04d}", "namespace": "bench"},
        "spec": {"devices": {"requests": requests, "constraints": constraints}},
    }


@dataclass
class Result:
    label: str
    claims: int
    allocated: int
    failed: int
    seconds: float
    p50_ms: float
    p99_ms: float
    steps: int


def run(
    label: str, allocator: Allocator, claims: list[Obj], nodes: list[str], per_node: bool
) -> Result:
    state = AllocatedState()
    latencies: list[float] = []
    allocated = failed = steps = 0
    start = time.perf_counter()
    for i, claim in enumerate(claims):
        t0 = time.perf_counter()
        if per_node:
            outcome = allocator.allocate([claim], state, node=nodes[i % len(nodes)])
        else:
            outcome = allocator.allocate([claim], state, nodes=nodes)
        if outcome.ok and outcome.allocations is not None:
            state.add(claim_key(claim), outcome.allocations[0])
            allocated += 1
        else:
            failed += 1
        latencies.append(time.perf_counter() - t0)
        steps += outcome.steps
    seconds = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100)
    return Result(label, len(claims), allocated, failed, seconds, q[49] * 1000, q[98] * 1000, steps)


@dataclass
class SweepPoint:
    """One size of the sweep, measured in a process of its own."""

    nodes: int
    index_ms: float
    cold: Result
    warm: Result
    explain_ms: float
    rss_mib: float
    reindex_ms: float = 0.0  # the index again after one slice changed, over a PoolCache


def measure(nodes: int, per_node: int, claims: int) -> SweepPoint:
    """The sweep's figures for one size, in this process."""
    slices, classes, pools = make_slices(nodes, per_node), make_classes(), PoolCache()
    t0 = time.perf_counter()
    inventory = SliceInventory(slices, classes, pools=pools)
    index_ms = (time.perf_counter() - t0) * 1000
    names = [f"bench-node-{n:03d}" for n in range(nodes)]
    batch = [make_claim(i) for i in range(claims)]
    allocator = Allocator(inventory)
    cold = run("cold", allocator, batch, names, False)
    warm = run("warm", allocator, batch, names, False)
    impossible = make_claim(0)
    impossible["spec"]["devices"]["requests"][0]["exactly"]["count"] = 200
    t0 = time.perf_counter()
    explain(allocator, impossible, AllocatedState(), nodes=names)
    explain_ms = (time.perf_counter() - t0) * 1000
    # One node's slice changes (a device's health, say), as the allocation worker's child
    # sees it: the inventory again over the same pool cache (the old one is done with).
    changed = json.loads(json.dumps(slices[0]))
    changed["spec"]["devices"].pop()
    slices[0] = changed
    t0 = time.perf_counter()
    SliceInventory(slices, classes, pools=pools)
    reindex_ms = (time.perf_counter() - t0) * 1000
    # RSS now, not the peak: a child's ru_maxrss starts from its parent's at the fork.
    return SweepPoint(nodes, index_ms, cold, warm, explain_ms, rss_mib(), reindex_ms)


def sweep(sizes: Sequence[int], claims: int) -> list[SweepPoint]:
    """Each size measured by a child process (``--measure``), one after the other."""
    points = []
    for nodes in sizes:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.allocator",
                "--measure",
                str(nodes),
                "--claims",
                str(claims),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        raw = json.loads(out.strip().splitlines()[-1])
        raw["cold"], raw["warm"] = Result(**raw["cold"]), Result(**raw["warm"])
        points.append(SweepPoint(**raw))
    return points


def print_sweep(points: Sequence[SweepPoint], claims: int) -> None:
    from bench.scale_report import exponent  # the scale bench's least-squares fit

    print(
        f"\nsweep: {claims} claims, {SWEEP_DEVICES_PER_NODE} devices per node, "
        "each size in a process of its own"
    )
    header = (
        f"{'nodes':>6s} {'devices':>8s} {'index ms':>9s} {'1-slice reindex ms':>18s} "
        f"{'cold/s':>7s} {'warm/s':>7s} "
        f"{'warm p50 ms':>11s} {'warm p99 ms':>11s} {'explain ms':>10s} {'RSS MiB':>8s}"
    )
    print(header)
    print("-" * len(header))
    for p in points:
        print(
            f"{p.nodes:6d} {p.nodes * SWEEP_DEVICES_PER_NODE:8d} {p.index_ms:9.0f} "
            f"{p.reindex_ms:18.1f} "
            f"{p.cold.claims / p.cold.seconds:7.0f} {p.warm.claims / p.warm.seconds:7.0f} "
            f"{p.warm.p50_ms:11.3f} {p.warm.p99_ms:11.3f} {p.explain_ms:10.0f} {p.rss_mib:8.0f}"
        )

    def fit(get: Callable[[SweepPoint], float]) -> str:
        return exponent([(float(p.nodes), float(get(p))) for p in points])

    print(
        "growth exponent b (figure ~ N^b): "
        f"warm time per claim {fit(lambda p: p.warm.seconds / p.warm.claims)}, "
        f"warm p50 {fit(lambda p: p.warm.p50_ms)}, "
        f"cold time per claim {fit(lambda p: p.cold.seconds / p.cold.claims)}, "
        f"index {fit(lambda p: p.index_ms)}, reindex {fit(lambda p: p.reindex_ms)}, "
        f"explain {fit(lambda p: p.explain_ms)}, "
        f"RSS {fit(lambda p: p.rss_mib)}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--devices-per-node", type=int, default=100)
    parser.add_argument(
        "--sweep",
        default="100,1000,5000",
        help="node counts for the sweep (8 devices each), comma-separated; empty: none",
    )
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)  # one sweep size
    args = parser.parse_args(argv)
    if args.measure is not None:
        point = measure(args.measure, SWEEP_DEVICES_PER_NODE, args.claims)
        print(json.dumps(asdict(point)))
        return

    rss0 = rss_mib()
    t0 = time.perf_counter()
    slices = make_slices(args.nodes, args.devices_per_node)
    inventory = SliceInventory(slices, make_classes())
    index_s = time.perf_counter() - t0
    nodes = [f"bench-node-{n:03d}" for n in range(args.nodes)]
    claims = [make_claim(i) for i in range(args.claims)]
    before = cel.stats()

    cold = run("pick a node, cold", Allocator(inventory), claims, nodes, False)
    warm_allocator = Allocator(inventory)
    warm = run("pick a node, warm", warm_allocator, claims, nodes, False)
    spread_inventory = SliceInventory(slices, make_classes())
    spread = run("given node (round robin), cold", Allocator(spread_inventory), claims, nodes, True)
    after = cel.stats()

    # Explaining a claim that cannot be allocated looks at every device for every request.
    impossible = make_claim(0)
    impossible["spec"]["devices"]["requests"][0]["exactly"]["count"] = 200
    state = AllocatedState()
    t0 = time.perf_counter()
    rows = explain(warm_allocator, impossible, state, nodes=nodes)
    explain_s = time.perf_counter() - t0
    gc.collect()

    devices = args.nodes * args.devices_per_node
    print(
        f"allocator benchmark: {args.claims} claims over {devices} devices "
        f"({args.nodes} nodes), CEL selectors, pick-a-node immediate allocation"
    )
    print(f"inventory index built in {index_s * 1000:.0f} ms")
    header = (
        f"{'run':34s} {'claims/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} "
        f"{'ok':>6s} {'failed':>6s} {'steps':>8s}"
    )
    print(header)
    print("-" * len(header))
    for r in (cold, warm, spread):
        print(
            f"{r.label:34s} {r.claims / r.seconds:9.0f} {r.p50_ms:8.3f} {r.p99_ms:8.3f} "
            f"{r.allocated:6d} {r.failed:6d} {r.steps:8d}"
        )
    print()
    print(
        f"CEL: {after.compiles - before.compiles} compiles, "
        f"{after.evaluations - before.evaluations} evaluations, "
        f"{after.callback_calls - before.callback_calls} Python callbacks "
        f"(~{(after.estimated_leak_bytes - before.estimated_leak_bytes) / 2**20:.1f} MiB "
        "leaked by cel-expr-python 0.1.3)"
    )
    print(
        f"explain of an unsatisfiable claim over {devices} devices: {explain_s * 1000:.0f} ms, "
        f"{len(rows)} rows"
    )
    print(f"RSS: {rss0:.0f} MiB at start, {rss_mib():.0f} MiB now, peak {peak_rss_mib():.0f} MiB")
    sizes = sorted({int(n) for n in args.sweep.split(",") if n.strip()})
    if sizes:
        print_sweep(sweep(sizes, args.claims), args.claims)


if __name__ == "__main__":
    main()
