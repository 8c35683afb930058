"""Scale: the controller against kube-scheduler on N simulated (kwok) nodes x 8 devices.

``python -m bench.scale [--nodes 100,1000,5000] [--claims 1000,5000] [--workers N]
[--scheduler-qps Q --scheduler-burst B] [--network-devices D]``

For each N the benchmark starts an isolated cluster of its own (free ports, temporary
state dir, no kubelet: ``bench.controller_allocation.isolated_layout``), so it needs
neither the shared cluster nor its lock, and stops it at the end. On it:

1. **nodes**: N simulated Nodes (``devtools.cluster.kwok``), kept Ready by one kwok
   process with the Lease heartbeat tuned for N (the controller-manager restarted with the
   grace period that needs); each node's pool (8 devices, ``model`` and ``index``
   attributes, as the static source declares them) published by dradriver's own slice
   publisher, one node-local publisher per node in this process
   (``devtools.cluster.kwokpools``): publish time, API writes, and an unchanged republish
   (0 writes).
2. For each C of ``--claims`` (skipped where C > N x 8 devices):
   **dradriver-controller**: C immediate claims (one device, a CEL selector on ``model``),
   as in ``bench.controller_allocation`` (its ServiceAccount and RBAC, the chart's
   allocation-finalizer policy): claims/s to the last allocation, claim-to-allocated
   p50/p99, RSS before -> after, the per-stage histogram; then **restart at scale**: a
   new controller process with N slices and C allocated claims to list, time from its
   start to its first allocation (a claim created while none ran), its RSS.
   **kube-scheduler** (restarted with ``--kube-api-qps/--kube-api-burst``, the controller
   has no client-side limiter): C pods, each with a claim from a ResourceClaimTemplate
   (same request and CEL selector), tolerating the simulated nodes' taint: pods/s to the
   last claim allocation, pod-create-to-claim-allocated p50/p99, RSS; kwok runs the pods.
3. **network pool**: a NetworkDevicePool whose node selector matches all N simulated
   nodes (``--network-devices`` devices): create -> Published, API writes; after a
   controller restart the unchanged pool is written 0 times.

At the end: tables per figure across N, and each figure's growth exponent b of a
least-squares fit ``figure ~ N^b`` (needs two or more N): per-claim time is 1 / claims/s.
With ``--results FILE`` (default: ``$BENCH_SCALE_RESULTS``, which ``make bench`` sets),
the rates and RSS per (N, C) are also written there as ``bench.plots``' results shape,
for the scale plot of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench.controller_allocation import (
    component_pid,
    create_driver_class,
    isolated_layout,
    restart_component,
    rss_mib,
)
from bench.plots import VERSION
from bench.scale_phases import (
    Publish,
    controller_phase,
    model,
    network_phase,
    publish_pools,
    scheduler_phase,
    template,
    workdir_of,
)
from bench.scale_report import Size, print_report, results_points
from devtools.cluster import kwok
from devtools.cluster.api import AdminAPI
from devtools.cluster.kwokpools import DEVICES_PER_NODE
from devtools.cluster.local import ClusterState, LocalCluster, running_cluster
from devtools.cluster.process import ManagedProcess
from devtools.harness import finalizerpolicy
from devtools.harness.controller import ControllerProcess, controller_kubeconfig
from dradriver.k8s.paths import RESOURCE_V1, path_for

SMOKE_ARGS = ("--nodes", "20", "--claims", "50", "--network-devices", "8")
CLUSTER = "own"  # bench/__init__.py: starts isolated clusters of its own (free ports)
R = RESOURCE_V1


def parse_sizes(text: str) -> list[int]:
    sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive sizes like 100,1000")
    return sizes


def add_kwok(cluster: LocalCluster, state: ClusterState, api: AdminAPI, size: Size) -> None:
    """N simulated nodes Ready under kwok, recorded in the cluster state (teardown stops it)."""
    n = size.nodes
    extra = kwok.controller_manager_args(n)
    if extra:
        restart_component(cluster, state, "kube-controller-manager", extra_args=extra)
    started = time.monotonic()
    kwok.create_nodes(str(state.kubeconfig), n)
    workdir = workdir_of(cluster.layout.state_dir / "work", kwok.KWOK_COMPONENT)
    process = ManagedProcess.start(
        kwok.KWOK_COMPONENT,
        kwok.kwok_argv(str(state.kubeconfig), n, workdir),
        log_path=cluster.layout.logs / "kwok.log",
        cwd=workdir,
    )
    state.components.append(process.record)
    state.save(cluster.layout.state_file)
    kwok.wait_ready(api, n, [process], 120 + n / 10)
    size.nodes_seconds = time.monotonic() - started
    size.kwok_rss = rss_mib(process.pid)


def run_size(n: int, args: argparse.Namespace) -> Size:
    size = Size(n)
    tag = uuid.uuid4().hex[:8]
    driver, cls, namespace = f"scale-{tag}.bench.dradriver.dev", f"scale-{tag}", f"scale-{tag}"
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    layout = isolated_layout(work)
    print(f"N={n}: isolated cluster (state {layout.state_dir}, {layout.apiserver_url})", flush=True)
    ok = False
    try:
        with running_cluster(layout) as (cluster, state, _), cluster.api() as api:
            kubeconfig = str(state.kubeconfig)
            add_kwok(cluster, state, api, size)
            names = kwok.node_names(n)
            size.publish = asyncio_run_publish(kubeconfig, driver, names)
            api.create_namespace(namespace)
            create_driver_class(api, cls, driver)
            for m in {model(i) for i in range(4)}:
                api.create(
                    path_for(R, "resourceclaimtemplates", namespace),
                    template(namespace, f"t-{m}", cls, driver, m),
                )
            controller_config = controller_kubeconfig(api, cluster, work)

            def make(name: str) -> ControllerProcess:
                return ControllerProcess(
                    f"scale-{tag}-{name}",
                    controller_config,
                    work,
                    extra_args=[
                        f"--allocation-namespace={namespace}",
                        f"--claim-workers={args.workers}",
                        "--log-level=warning",
                    ],
                )

            restart_component(
                cluster,
                state,
                "kube-scheduler",
                extra_args=[
                    f"--kube-api-qps={args.scheduler_qps}",
                    f"--kube-api-burst={args.scheduler_burst}",
                ],
            )
            sched_pid = component_pid(state, "kube-scheduler")
            for c in args.claims:
                if c > n * DEVICES_PER_NODE:
                    print(f"  C={c}: skipped, more claims than {n * DEVICES_PER_NODE} devices")
                    continue
                print(f"  C={c}: controller", flush=True)
                profile = None
                fitting = [x for x in args.claims if x <= n * DEVICES_PER_NODE]
                if args.profile and n == args.nodes[-1] and c == max(fitting):
                    profile = work / "controller-profile.txt"
                with policy(api, namespace):
                    size.controller[c] = controller_phase(
                        api, make, kubeconfig, namespace, cls, driver, c, args.deadline, profile
                    )
                print(f"  C={c}: kube-scheduler", flush=True)
                size.scheduler[c] = scheduler_phase(
                    api, kubeconfig, namespace, sched_pid, c, args.deadline
                )
            print("  network pool", flush=True)
            size.network = network_phase(api, make, kwok.LABEL, args.network_devices, tag)
        ok = True
    finally:
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work} (controller logs, cluster logs in cluster-last-logs/)")
    return size


def asyncio_run_publish(kubeconfig: str, driver: str, names: list[str]) -> Publish:
    return asyncio.run(publish_pools(kubeconfig, driver, names))


@contextlib.contextmanager
def policy(api: AdminAPI, namespace: str) -> Iterator[None]:
    """The chart's allocation-finalizer policy where the cluster serves it (as deployed)."""
    with contextlib.ExitStack() as stack:
        if finalizerpolicy.served(api):
            stack.enter_context(finalizerpolicy.installed(api, namespace))
        yield


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=parse_sizes, default=parse_sizes("100,1000,5000"))
    parser.add_argument("--claims", type=parse_sizes, default=parse_sizes("1000,5000"))
    parser.add_argument("--workers", type=int, default=16, help="the controller's --claim-workers")
    parser.add_argument("--deadline", type=float, default=1800.0, help="seconds per phase")
    parser.add_argument("--scheduler-qps", type=int, default=1000)
    parser.add_argument("--scheduler-burst", type=int, default=2000)
    parser.add_argument("--network-devices", type=int, default=64)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample the controller with py-spy ($PY_SPY or on PATH) while it allocates "
        "at the largest N and C",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep each size's work dir (logs) after a success"
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=os.environ.get("BENCH_SCALE_RESULTS") or None,
        help="write the rates and RSS per (N, C) there, as bench.plots reads them",
    )
    args = parser.parse_args(argv)
    sizes: list[Size] = []
    try:
        for n in args.nodes:
            started = time.monotonic()
            sizes.append(run_size(n, args))
            print(f"N={n}: done in {time.monotonic() - started:.0f} s", flush=True)
    finally:
        if sizes:  # a size that broke still leaves the tables of those before it
            print_report(sizes, args.claims)
            if args.results is not None:
                write_results(args.results, sizes)


def write_results(path: Path, sizes: Sequence[Size]) -> None:
    """The results file of ``--results`` (``bench.plots``' shape)."""
    measured = (
        f"bench.scale on {time.strftime('%Y-%m-%d', time.gmtime())}, "
        f"N = {', '.join(str(s.nodes) for s in sizes)}"
    )
    body = {"version": VERSION, "measured": measured, "scale": results_points(sizes)}
    path.write_text(json.dumps(body, indent=2) + "\n")


if __name__ == "__main__":
    main()
