"""Controller allocation on the local cluster: 1,000 immediate claims over 10,000 devices.

``python -m bench.controller_allocation [--claims N] [--devices N] [--workers N]``

The benchmark publishes one pool of ``--devices`` devices (``allNodes``, slices of 128,
typed ``model`` and ``index`` attributes) for a unique driver name, and one DeviceClass
whose CEL selector checks the driver. It runs ``dradriver-controller`` as the tests do
(its ServiceAccount and the manifests' RBAC, ``--allocation-namespace`` = the bench's own
namespace), then creates the claims (annotation ``dradriver.dev/allocation: Immediate``,
one device with a CEL selector on ``model``) 32 at a time and watches them until every
one is allocated.

Reported: claims/s (first create sent -> last allocation seen), claim-to-allocated p50/p99
(create sent -> allocation seen by a watch), and the controller's RSS with the slices and
claims cached. The kube-scheduler comparison (the same claims through pods) is not
implemented yet. Everything the bench creates is deleted at the end (claims first, while
the controller runs, so its finalizer is removed).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import percentile, table
from controller.allocation import ALLOCATION_ANNOTATION
from controller.localcluster import ControllerProcess, controller_kubeconfig
from dradriver.cluster.api import AdminAPI, wait_until
from dradriver.cluster.config import Layout, default_state_dir
from dradriver.cluster.local import running_cluster
from dradriver.controllerruntime import Informer
from dradriver.kube.client import KubeClient, load_connection
from dradriver.kube.paths import RESOURCE_V1, path_for

Obj = dict[str, Any]
R = RESOURCE_V1
PER_SLICE = 128
MODELS = ("a100", "h100", "l4", "t4")
CONCURRENCY = 32


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


def claim(namespace: str, name: str, cls: str, driver: str, model: str) -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {ALLOCATION_ANNOTATION: "Immediate"},
        },
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


async def run_claims(
    kubeconfig: str, namespace: str, cls: str, driver: str, n: int, deadline: float
) -> tuple[dict[str, float], dict[str, float]]:
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
        gate = asyncio.Semaphore(CONCURRENCY)

        async def create(i: int) -> None:
            name = f"c-{i:04d}"
            async with gate:
                sent[name] = time.monotonic()
                await client.create(
                    path_for(R, "resourceclaims", namespace),
                    claim(namespace, name, cls, driver, MODELS[i % len(MODELS)]),
                )

        await asyncio.gather(*(create(i) for i in range(n)))
        async with asyncio.timeout(deadline):
            await done.wait()
    finally:
        await informer.stop()
        await client.aclose()
    return sent, seen


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cleanup_claims(api: AdminAPI, namespace: str) -> None:
    api.request("DELETE", path_for(R, "resourceclaims", namespace))  # deletecollection
    wait_until(
        "claims deallocated and deleted",
        lambda: not api.items(path_for(R, "resourceclaims", namespace), limit=1),
        600,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4, help="controller reconcile workers")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds for all claims")
    args = parser.parse_args()
    if args.claims > args.devices:
        parser.error("--claims must not exceed --devices")
    bench_id = uuid.uuid4().hex[:8]
    driver = f"bca-{bench_id}.bench.dradriver.dev"
    cls = f"bca-{bench_id}"
    namespace = f"bench-ca-{bench_id}"
    layout = Layout(state_dir=default_state_dir())
    work = Path(tempfile.mkdtemp(prefix="bench-ca-"))
    with running_cluster(layout) as (cluster, state, _started), cluster.api() as api:
        published = slices(driver, args.devices)
        proc: ControllerProcess | None = None
        api.create_namespace(namespace)
        try:
            api.create(
                path_for(R, "deviceclasses"),
                {
                    "metadata": {"name": cls},
                    "spec": {
                        "selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]
                    },
                },
            )
            for obj in published:
                api.create(path_for(R, "resourceslices"), obj)
            kubeconfig = controller_kubeconfig(api, cluster, work)
            proc = ControllerProcess(
                f"bench-{bench_id}",
                kubeconfig,
                work,
                extra_args=[
                    "--no-leader-elect",
                    f"--allocation-namespace={namespace}",
                    f"--workers={args.workers}",
                    "--log-level=warning",
                ],
            )
            proc.start()
            wait_until("controller ready", proc.ready, 120)
            assert proc.proc is not None
            rss_before = rss_mib(proc.proc.pid)
            sent, seen = asyncio.run(
                run_claims(
                    str(state.kubeconfig), namespace, cls, driver, args.claims, args.deadline
                )
            )
            rss_after = rss_mib(proc.proc.pid)
            latencies = [seen[name] - sent[name] for name in seen]
            elapsed = max(seen.values()) - min(sent.values())
            print(
                f"\nController allocation: {args.claims} immediate claims over {args.devices} "
                f"devices ({len(published)} slices, CEL selectors), {args.workers} workers\n"
            )
            print(
                table(
                    ["path", "claims", "claims/s", "p50 ms", "p99 ms", "controller RSS MiB"],
                    [
                        [
                            "dradriver-controller",
                            str(len(seen)),
                            f"{len(seen) / elapsed:.1f}",
                            f"{percentile(latencies, 0.5) * 1000:.1f}",
                            f"{percentile(latencies, 0.99) * 1000:.1f}",
                            f"{rss_before:.1f} -> {rss_after:.1f}",
                        ],
                        ["kube-scheduler via pods", "n/a", "not measured", "", "", ""],
                    ],
                )
            )
        finally:
            if proc is not None:
                if proc.proc is not None:
                    cleanup_claims(api, namespace)  # the controller removes its finalizer
                proc.stop()
            for obj in published:
                api.delete(path_for(R, "resourceslices", name=obj["metadata"]["name"]))
            api.delete(path_for(R, "deviceclasses", name=cls))
            api.delete(path_for("v1", "namespaces", name=namespace))
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
