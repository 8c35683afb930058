"""NodePrepareResources / NodeUnprepareResources latency through the real gRPC socket.

Run with ``python -m bench.prepare [--iterations N] [--rounds N] [--no-go] [--baseline REV]``.
Uses the local cluster (reuses a running one, else starts one and stops it afterwards).

The benchmark plays the kubelet: it starts the plugin under test as a process with its own
kubelet root dir, registers it (GetInfo, NotifyRegistrationStatus), creates ResourceClaims
whose ``status.allocation`` it writes itself (admin, status subresource) for the plugin's
devices, and calls the DRA socket with grpc.aio over one channel. Scenarios:

* sequential: one claim per call, prepare then unprepare, ``--iterations`` times;
* 100 concurrent calls: 100 single-claim calls in flight at once, ``--rounds`` times;
* one call carrying 100 claims, ``--rounds`` times.

The same client runs against dradriver (driver ``bench.dradriver.dev``, node ``bench-node``)
and against the Go reference, dra-example-driver's kubelet plugin (driver ``gpu.example.com``,
node ``bench-go-node``, a cordoned and tainted Node object that exists only while the
benchmark runs, since the Go helper publishes no slices without it).

dradriver runs twice, as two plugins: with the per-claim work the Go reference does not do
turned off (``AS_GO_FLAGS``: the KEP-5304 metadata files and the claim status), which is the
side-by-side comparison, and as shipped ("defaults", driver ``defaults.bench.dradriver.dev``),
so the cost of those features stays in sight. The three plugins run at the same time and take
turns: one sequential iteration, or one round, each, the first of each turn rotating, so the
shared machine's slow spells fall on every side alike (run one after the other, Go's p50 of
the 100-concurrent-calls scenario moved between 108 and 180 ms from one run to the next).

``--baseline REV`` adds a fourth plugin: "ours" (as Go) from the sources of git revision REV
(driver ``before.bench.dradriver.dev``), taking turns with the others, so a change is
measured against the code it replaces in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    AS_GO_FLAGS,
    BENCH_NODE,
    GO_BURST,
    GO_DRIVER,
    GO_QPS,
    BenchClaim,
    BenchError,
    DRAClient,
    PluginUnderTest,
    allocated_claims,
    baseline_source,
    bench_namespace,
    create_fake_node,
    delete_namespace,
    delete_node,
    delete_slices,
    go_binary,
    go_plugin,
    ms,
    ours_plugin,
    percentile,
    shared_layout,
    short_workdir,
    table,
    wait_published,
)
from devtools.cluster.api import AdminAPI
from devtools.cluster.local import running_cluster

SMOKE_ARGS = ("--iterations", "3", "--rounds", "1", "--claims", "3", "--devices", "16", "--no-go")
CLUSTER = "shared"  # the running local cluster, or one it starts (bench/__init__.py)

OUR_DRIVER = "bench.dradriver.dev"
DEFAULTS_DRIVER = "defaults.bench.dradriver.dev"
BEFORE_DRIVER = "before.bench.dradriver.dev"
GO_NODE = "bench-go-node"
WARMUP = 5
SLICE_DEADLINE = 60.0

SCENARIOS = [
    ("prepare, 1 claim, sequential", "seq-prepare"),
    ("unprepare, 1 claim, sequential", "seq-unprepare"),
    ("prepare, {n} concurrent 1-claim calls", "conc-prepare"),
    ("unprepare, {n} concurrent 1-claim calls", "conc-unprepare"),
    ("prepare, 1 call with {n} claims", "batch-prepare"),
    ("unprepare, 1 call with {n} claims", "batch-unprepare"),
]


@dataclass
class Result:
    samples: dict[str, list[float]] = field(default_factory=dict)
    wall: dict[str, float] = field(default_factory=dict)
    note: str = ""

    def add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    def p(self, key: str, q: float) -> float:
        return percentile(self.samples.get(key, []), q)


@dataclass
class Side:
    """One plugin under test, its claims and what was measured."""

    plugin: PluginUnderTest
    claims: list[BenchClaim] = field(default_factory=list)
    result: Result = field(default_factory=Result)
    client: DRAClient | None = None


def rotated(sides: list[Side], turn: int) -> list[Side]:
    """``sides`` starting at a different one each turn: no side always goes first."""
    k = turn % len(sides)
    return sides[k:] + sides[:k]


async def run_interleaved(sides: list[Side], iterations: int, rounds: int) -> None:
    """Every scenario on every side, turn by turn (one sequential iteration, or one round,
    per side and turn), so a slow spell of the shared machine (etcd compaction, page
    cache writeback, the other benches' leftovers) falls on all sides alike."""
    for side in sides:
        side.client = DRAClient(side.plugin.dra_socket)
    try:

        def client(side: Side) -> DRAClient:
            assert side.client is not None
            return side.client

        for side in sides:
            for _ in range(WARMUP):
                await client(side).prepare(side.claims[:1])
                await client(side).unprepare(side.claims[:1])
        for i in range(iterations):
            for side in rotated(sides, i):
                claim = side.claims[i % len(side.claims)]
                side.result.add("seq-prepare", await client(side).prepare([claim]))
                side.result.add("seq-unprepare", await client(side).unprepare([claim]))

        for r in range(rounds):
            for side in rotated(sides, r):
                await timed(side, "conc-prepare", one_claim_calls, client(side).prepare)
                await timed(side, "conc-unprepare", one_claim_calls, client(side).unprepare)
        for r in range(rounds):
            for side in rotated(sides, r):
                await timed(side, "batch-prepare", one_call, client(side).prepare)
                await timed(side, "batch-unprepare", one_call, client(side).unprepare)
        for side in sides:
            side.plugin.check_alive()
    finally:
        for side in sides:
            if side.client is not None:
                await side.client.close()


Call = Callable[[Sequence[BenchClaim]], Awaitable[float]]


async def one_claim_calls(call: Call, claims: list[BenchClaim]) -> list[float]:
    """One call per claim, all in flight at once; their latencies."""
    return list(await asyncio.gather(*(call([c]) for c in claims)))


async def one_call(call: Call, claims: list[BenchClaim]) -> list[float]:
    """One call carrying every claim; its latency."""
    return [await call(claims)]


async def timed(
    side: Side,
    key: str,
    how: Callable[[Call, list[BenchClaim]], Awaitable[list[float]]],
    call: Call,
) -> None:
    """One round of ``side``'s claims: the latencies, and the round's wall time."""
    started = time.perf_counter()
    for latency in await how(call, side.claims):
        side.result.add(key, latency)
    side.result.wall[key] = side.result.wall.get(key, 0.0) + time.perf_counter() - started


def start_side(api: AdminAPI, side: Side, namespace: str, devices: int, claims: int) -> None:
    """Start the plugin, register it, wait for its slices, allocate its claims."""
    plugin = side.plugin
    delete_slices(api, plugin.node, plugin.driver)  # leftovers of an interrupted run
    plugin.start()
    asyncio.run(plugin.register())
    if not wait_published(api, plugin, devices, SLICE_DEADLINE):
        side.result.note = (
            f"its {devices} devices were not all published within {SLICE_DEADLINE:.0f}s"
        )
    side.claims = allocated_claims(api, namespace, plugin, claims)


def stop_side(api: AdminAPI, side: Side) -> None:
    side.plugin.stop()
    delete_slices(api, side.plugin.node, side.plugin.driver)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=300, help="sequential iterations")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the 100-claim scenarios")
    parser.add_argument("--claims", type=int, default=100, help="claims per concurrent round")
    parser.add_argument("--devices", type=int, default=128, help="devices per plugin")
    parser.add_argument("--no-go", action="store_true", help="skip the Go reference")
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also run 'ours' from the sources of git revision REV (a 'before' column)",
    )
    args = parser.parse_args(argv)
    if args.claims > args.devices:
        parser.error("--claims must not exceed --devices (every claim gets its own device)")

    binary, go_how = (None, "skipped (--no-go)") if args.no_go else go_binary()
    go_error = "" if binary is not None else go_how
    layout = shared_layout()
    with running_cluster(layout) as (cluster, state, _started), cluster.api() as api:
        kubeconfig = Path(state.kubeconfig)
        namespace = bench_namespace(api)
        started: list[Side] = []
        try:
            with short_workdir() as work:
                ours = Side(
                    ours_plugin(
                        work, OUR_DRIVER, BENCH_NODE, args.devices, kubeconfig, flags=AS_GO_FLAGS
                    )
                )
                # Its own driver name: both dradriver plugins publish at once, each its pool.
                defaults = Side(
                    ours_plugin(
                        work,
                        DEFAULTS_DRIVER,
                        BENCH_NODE,
                        args.devices,
                        kubeconfig,
                        label="defaults",
                    )
                )
                before: Side | None = None
                if args.baseline:
                    src = baseline_source(args.baseline, work / "baseline")
                    before = Side(
                        ours_plugin(
                            work,
                            BEFORE_DRIVER,
                            BENCH_NODE,
                            args.devices,
                            kubeconfig,
                            flags=AS_GO_FLAGS,
                            label="before",
                        )
                    )
                    before.plugin.env["PYTHONPATH"] = str(src)
                for side in (ours, defaults, before):
                    if side is None:
                        continue
                    started.append(side)
                    start_side(api, side, namespace, args.devices, args.claims)
                go: Side | None = None
                if binary is not None:
                    try:
                        create_fake_node(api, GO_NODE)
                        go = Side(go_plugin(binary, work, GO_NODE, args.devices, kubeconfig))
                        started.append(go)
                        start_side(api, go, namespace, args.devices, args.claims)
                    except BenchError as e:
                        go_error, go = f"the Go reference failed: {e}", None
                sides = [s for s in (ours, defaults, go, before) if s is not None]
                asyncio.run(run_interleaved(sides, args.iterations, args.rounds))
        finally:
            for side in started:
                stop_side(api, side)
            if binary is not None:
                delete_node(api, GO_NODE)
            delete_namespace(api, namespace)
    report(
        args,
        ours.result,
        defaults.result,
        go.result if go is not None else None,
        go_how,
        go_error,
        before.result if before is not None else None,
    )


def report(
    args: argparse.Namespace,
    ours: Result | None,
    defaults: Result | None,
    go: Result | None,
    go_how: str,
    go_error: str,
    before: Result | None = None,
) -> None:
    assert ours is not None and defaults is not None
    print(
        f"\nNodePrepareResources / NodeUnprepareResources latency (ms), DRA v1 over a unix socket"
        f"\n{args.devices} devices per plugin, {args.claims} claims, sequential "
        f"{args.iterations} iterations, {args.rounds} rounds of each {args.claims}-claim scenario "
        f"(after {WARMUP} warm-up iterations)"
    )
    print(
        f"ours: dradriver kubeletplugin, driver {OUR_DRIVER}, node {BENCH_NODE}, "
        f"{' '.join(AS_GO_FLAGS)} (what the Go reference does not do)\n"
        "defaults: the same plugin as shipped (KEP-5304 metadata files and claim status on)"
    )
    if go is not None:
        print(
            f"go:   {go_how}\n      driver {GO_DRIVER}, node {GO_NODE}, "
            f"--kube-api-qps={GO_QPS} --kube-api-burst={GO_BURST}"
        )
        if go.note:
            print(f"      note: {go.note}")
    else:
        print(f"go:   not measured: {go_error}")
    rows = []
    for title, key in SCENARIOS:
        o50, o99 = ours.p(key, 0.5), ours.p(key, 0.99)
        g50 = go.p(key, 0.5) if go else math.nan
        g99 = go.p(key, 0.99) if go else math.nan
        rows.append(
            [
                title.format(n=args.claims),
                ms(o50),
                ms(o99),
                ms(g50),
                ms(g99),
                ratio(o50, g50),
                ratio(o99, g99),
                ms(defaults.p(key, 0.5)),
                ms(defaults.p(key, 0.99)),
                *(
                    [
                        ms(before.p(key, 0.5)),
                        ms(before.p(key, 0.99)),
                        ratio(o50, before.p(key, 0.5)),
                    ]
                    if before is not None
                    else []
                ),
            ]
        )
    if before is not None:
        print(f"before: 'ours' from the sources of {args.baseline}, driver {BEFORE_DRIVER}")
    print()
    print(
        table(
            [
                "scenario",
                "ours p50",
                "ours p99",
                "go p50",
                "go p99",
                "ours/go p50",
                "ours/go p99",
                "defaults p50",
                "defaults p99",
                *(["before p50", "before p99", "ours/before p50"] if before is not None else []),
            ],
            rows,
        )
    )
    rows = []
    for title, key in SCENARIOS[2:]:
        o = ours.wall.get(key, math.nan) / args.rounds
        g = go.wall.get(key, math.nan) / args.rounds if go else math.nan
        d = defaults.wall.get(key, math.nan) / args.rounds
        rows.append([title.format(n=args.claims), ms(o), ms(g), ms(d)])
    print(f"\nwall time of one round of {args.claims} claims (ms, mean over rounds)\n")
    print(table(["scenario", "ours", "go", "defaults"], rows))


def ratio(ours: float, go: float) -> str:
    return "n/a" if math.isnan(go) or go == 0 else f"{ours / go:.2f}"


if __name__ == "__main__":
    main()
