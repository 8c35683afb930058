"""The real container runtime's cost: build, cluster start, pod start; real vs fake.

Run with ``python -m bench.runtime_startup [--pods 20]``; needs no running
cluster (it starts and stops its own, in a separate state dir, on the usual
ports: once with node-1 on the fake runtime, once on containerd + runc).

- Runtime build: the seconds runtimebin recorded when the cache entry was
  built (cold: each ``go build``, with whatever Go build cache there was), and
  a warm look-up (cache hit) measured here.
- Cluster start: ``up`` to a Ready node and the default ServiceAccount, per
  runtime, and ``down``.
- Pod start: create one pod at a time (no claim, node-1) and wait for the
  container's first output through the pod log API (real: the probe image's
  report) or, on the fake runtime where nothing runs, for phase Running; p50
  and max over ``--pods`` pods. On the real runtime it also gives create ->
  Running, for comparison with the fake one.

No timing is asserted; it prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from bench.common import percentile, table
from devtools.cluster import images, runtimebin
from devtools.cluster.api import AdminAPI
from devtools.cluster.binaries import ensure_binaries
from devtools.cluster.config import Layout, Runtime
from devtools.cluster.local import LocalCluster
from devtools.cluster.probe import parse_report
from devtools.cluster.wait import wait_until
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import path_for

SMOKE_ARGS = ("--pods", "1")
CLUSTER = "exclusive"  # starts clusters of its own on the usual ports (bench/__init__.py)

NAMESPACE = "default"
POD_TIMEOUT = 120.0
# Finer than wait_until's default: the steps measured take about a second.
POLL = 0.02


def _pod(name: str, runtime: Runtime) -> Obj:
    image = images.PROBE_IMAGE if runtime == "real" else images.PAUSE_IMAGE
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": "node-1",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": image, "imagePullPolicy": "IfNotPresent"}],
        },
    }


def _running(api: AdminAPI, name: str) -> bool:
    pod = api.get(path_for("v1", "pods", NAMESPACE, name))
    return bool(pod.get("status", {}).get("phase") == "Running")


def _reported(api: AdminAPI, name: str) -> bool:
    return parse_report(api.pod_log(NAMESPACE, name, "c")).ready


def start_one(api: AdminAPI, name: str, runtime: Runtime) -> dict[str, float]:
    """Create one pod; seconds to Running and (real runtime) to its container's report."""
    checks: dict[str, Callable[[], bool]] = {"running": partial(_running, api, name)}
    if runtime == "real":
        checks["output"] = partial(_reported, api, name)
    done: dict[str, float] = {}
    api.create(path_for("v1", "pods", NAMESPACE), _pod(name, runtime))
    created = time.monotonic()

    def all_seen() -> bool:
        for key, check in checks.items():
            if key not in done and check():
                done[key] = time.monotonic() - created
        return len(done) == len(checks)

    wait_until(f"pod {name}", all_seen, POD_TIMEOUT, POLL, ignore=(KubeAPIError,))
    path = path_for("v1", "pods", NAMESPACE, name)
    api.delete(path)
    wait_until(f"pod {name} gone", lambda: api.get_or_none(path) is None, POD_TIMEOUT)
    return done


def pod_starts(api: AdminAPI, runtime: Runtime, pods: int) -> dict[str, list[float]]:
    """:func:`start_one` for ``pods`` pods, one after the other."""
    out: dict[str, list[float]] = {"running": [], "output": []}
    for i in range(pods):
        for key, seconds in start_one(api, f"bench-start-{runtime}-{i}", runtime).items():
            out[key].append(seconds)
    return out


def measure(runtime: Runtime, pods: int) -> dict[str, float | list[float]]:
    bins = ensure_binaries()
    with tempfile.TemporaryDirectory(prefix="drd-bench-") as tmp:
        cluster = LocalCluster(Layout(state_dir=Path(tmp) / "cluster", runtime=runtime))
        started = time.monotonic()
        state = cluster.up(bins)
        up = time.monotonic() - started
        try:
            with cluster.api() as api:
                starts = pod_starts(api, runtime, pods)
        finally:
            started = time.monotonic()
            cluster.down()
            down = time.monotonic() - started
    result: dict[str, float | list[float]] = {"up": up, "down": down, **starts}
    result.update({f"step {k}": v for k, v in state.timings.items()})
    return result


def _seconds(values: float | list[float], q: float | None = None) -> str:
    if isinstance(values, list):
        if not values:
            return "-"
        return f"{(percentile(values, q) if q else statistics.median(values)):.2f}"
    return f"{values:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=20, help="pods per runtime (default 20)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    bin_dir = runtimebin.ensure_runtime_binaries()
    warm = time.monotonic() - started
    started = time.monotonic()
    images.ensure_images(bin_dir / "probe")
    warm_images = time.monotonic() - started
    cold = runtimebin.build_times() or {}
    rows = [[f"build {name} (cold, recorded)", f"{s:.1f}"] for name, s in cold.items()]
    rows.append(["build total (cold, recorded)", f"{sum(cold.values()):.1f}" if cold else "-"])
    rows.append(["runtime binaries, cache hit (warm)", f"{warm:.3f}"])
    rows.append(["image tarballs, cache hit (warm)", f"{warm_images:.3f}"])
    print(table(["runtime build", "seconds"], rows))

    runtimes: tuple[Runtime, ...] = ("fake", "real")
    results = {runtime: measure(runtime, args.pods) for runtime in runtimes}
    fake, real = results["fake"], results["real"]
    rows = [
        ["cluster up (to Ready, ServiceAccount)", _seconds(fake["up"]), _seconds(real["up"])],
        ["cluster down", _seconds(fake["down"]), _seconds(real["down"])],
        [
            f"pod create -> Running, p50 of {args.pods}",
            _seconds(fake["running"]),
            _seconds(real["running"]),
        ],
        [
            "pod create -> Running, max",
            _seconds(fake["running"], 1.0),
            _seconds(real["running"], 1.0),
        ],
        [
            f"pod create -> container output, p50 of {args.pods} (fake: Running)",
            _seconds(fake["running"]),
            _seconds(real["output"]),
        ],
        [
            "pod create -> container output, max (fake: Running)",
            _seconds(fake["running"], 1.0),
            _seconds(real["output"], 1.0),
        ],
    ]
    steps = [k for k in real if k.startswith("step ")]
    rows += [[k, _seconds(fake[k]) if k in fake else "-", _seconds(real[k])] for k in steps]
    print()
    print(table(["seconds", "fake runtime", "real runtime"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
