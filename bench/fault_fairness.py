"""Row (f2) of :mod:`bench.faults`: one namespace's unsatisfiable claims against
another namespace's claim.

K claims that can never be satisfied (``count: 17`` with a ``distinctAttribute`` over 16
values, so each search runs to its budget) are created in namespace ``-a``; then, at
:data:`PROBE_TIMES` seconds after them, one claim each in namespace ``-b`` that one free
device satisfies. The row is the worst time from a ``-b`` claim's creation to its
allocation being seen (polled every :data:`POLL` s, so the figure is at most that much
late). Promised: under 2 s with K = 20. Everything is the real controller process of
:mod:`bench.faults`; the devices are a slice of this row's own, so no other row's
devices are used, and the claims are deleted (and their deletion awaited) before the
next K and before the next row.

Alone (the fault suite's cluster and controller, this row only)::

    python -c 'from bench.fault_fairness import alone; alone()' [--quick]
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench import faults
from bench.common import table
from devtools.cluster.api import AdminAPI
from devtools.cluster.wait import wait_until
from devtools.harness.controller import ControllerProcess
from dradriver.k8s.paths import RESOURCE_V1, path_for

COUNTS = (3, 20)
"""The numbers of unsatisfiable claims in namespace ``-a``, one round each."""
PROBE_TIMES = (0.5, 2.0, 4.0)
"""Seconds after the unsatisfiable claims at which a ``-b`` claim is created."""
PROMISE = 2.0
POLL = 0.05
SLOTS = 16
SLICE = "fairness-pool"


def namespaces(base: str) -> tuple[str, str]:
    """The two namespaces of the row (the controller must allocate in both)."""
    return f"{base}-a", f"{base}-b"


def controller_args(base: str) -> list[str]:
    return [f"--allocation-namespace={ns}" for ns in namespaces(base)]


def fairness_slice() -> dict[str, object]:
    """Group ``fa``: 32 devices over 16 ``slot`` values (the unsatisfiable claims' search
    space); group ``fb``: one device per probe claim."""
    devices: list[dict[str, object]] = [
        {
            "name": f"fa-{i:02d}",
            "attributes": {"group": {"string": "fa"}, "slot": {"int": i % SLOTS}},
        }
        for i in range(2 * SLOTS)
    ]
    devices += [
        {"name": f"fb-{i}", "attributes": {"group": {"string": "fb"}}}
        for i in range(len(PROBE_TIMES))
    ]
    return {
        "metadata": {"name": SLICE},
        "spec": {
            "driver": faults.DRIVER,
            "allNodes": True,
            "pool": {"name": "fairness", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _claims(namespace: str) -> str:
    return path_for(RESOURCE_V1, "resourceclaims", namespace)


def _allocated(api: AdminAPI, namespace: str, name: str) -> bool:
    obj = api.get(path_for(RESOURCE_V1, "resourceclaims", namespace, name))
    return bool((obj.get("status") or {}).get("allocation"))


@contextlib.contextmanager
def _cleaned(api: AdminAPI, base: str, timeout: float) -> Iterator[None]:
    """Every claim of both namespaces deleted afterwards, and gone (the controller
    removes its finalizer) before the next round starts."""
    try:
        yield
    finally:
        for ns in namespaces(base):
            for c in api.items(_claims(ns)):
                with contextlib.suppress(Exception):
                    api.delete(path_for(RESOURCE_V1, "resourceclaims", ns, c["metadata"]["name"]))
        wait_until(
            "the fairness row's claims deleted",
            lambda: not any(api.items(_claims(ns)) for ns in namespaces(base)),
            timeout,
        )


def one_round(
    api: AdminAPI, base: str, controller: ControllerProcess, k: int, budget: float
) -> list[float | None]:
    """The latency of each probe claim with ``k`` unsatisfiable claims ahead (None: not
    allocated within the timeout). The probes' claims are polled all along, between and
    after their creations, so each is timed from its own creation."""
    ns_a, ns_b = namespaces(base)
    selector_a = f'{faults.attr("group")} == "fa"'
    selector_b = f'{faults.attr("group")} == "fb"'
    timeout = k * budget + 60  # the whole queue ahead, first come first served
    seen: dict[str, float] = {}  # probe -> when first seen allocated

    def poll_until(end: float, done: Callable[[], bool] = lambda: False) -> None:
        while time.monotonic() < end and not done():
            controller.check()
            for c in api.items(_claims(ns_b)):
                name = c["metadata"]["name"]
                if name not in seen and (c.get("status") or {}).get("allocation"):
                    seen[name] = time.monotonic()
            time.sleep(POLL)  # the polling pace, not a synchronisation

    with _cleaned(api, base, faults.SETTLE_TIMEOUT + k * budget):
        began = time.monotonic()
        for i in range(k):
            api.create(
                _claims(ns_a),
                faults.immediate_claim(
                    f"unsat-{i:02d}", selector_a, count=SLOTS + 1, distinct=f"{faults.DRIVER}/slot"
                ),
            )
        created: list[tuple[str, float]] = []
        for n, at in enumerate(PROBE_TIMES):
            poll_until(began + at)  # the probes' schedule is the fault's
            name = f"probe-{k}-{n}"
            created.append((name, time.monotonic()))
            api.create(_claims(ns_b), faults.immediate_claim(name, selector_b))
        poll_until(created[-1][1] + timeout, lambda: all(n in seen for n, _ in created))
        return [seen[n] - sent if n in seen else None for n, sent in created]


def rows(
    api: AdminAPI, base: str, controller: ControllerProcess, s: faults.Settings
) -> list[faults.Row]:
    """One row per K: the worst latency of the other namespace's claims."""
    for ns in namespaces(base):
        api.create_namespace(ns)
    api.create(path_for(RESOURCE_V1, "resourceslices"), fairness_slice())
    budget = s.allocation_timeout if s.allocation_timeout is not None else 10.0
    # One claim allocated first: the controller leads and its worker is warm (a replica
    # that has just won the Lease is still starting its worker processes).
    with _cleaned(api, base, faults.SETTLE_TIMEOUT):
        api.create(_claims(namespaces(base)[1]), faults.immediate_claim("warm-up", "true"))
        wait_until(
            "the warm-up claim allocated",
            lambda: _allocated(api, namespaces(base)[1], "warm-up"),
            faults.SETTLE_TIMEOUT,
        )
    out = []
    for k in COUNTS:
        latencies = one_round(api, base, controller, k, budget)
        done = [x for x in latencies if x is not None]
        worst = (
            f"{max(done):.2f}"
            if len(done) == len(latencies)
            else f"> {k * budget + 60:.0f} ({len(latencies) - len(done)} not allocated)"
        )
        every = ", ".join("-" if x is None else f"{x:.2f}" for x in latencies)
        out.append(
            faults.Row(
                f"(f2) {k} unsatisfiable claims in one namespace",
                len(latencies),
                f"other namespace's claim allocated, worst s ({every})",
                worst,
                f"< {PROMISE:g}",
            )
        )
    api.delete(path_for(RESOURCE_V1, "resourceslices", name=SLICE))
    return out


def alone(argv: list[str] | None = None) -> None:
    """This row only, on the fault suite's isolated cluster and controller."""
    import tempfile

    from bench.controller_allocation import isolated_layout
    from devtools.cluster.local import running_cluster
    from devtools.harness.controller import controller_kubeconfig

    args = sys.argv[1:] if argv is None else argv
    s = faults.Settings(allocation_timeout=3) if "--quick" in args else faults.Settings()
    work = Path(tempfile.mkdtemp(prefix="drff-", dir="/tmp"))
    layout = isolated_layout(work)
    with (
        contextlib.ExitStack() as cleanup,
        running_cluster(layout) as (cluster, _state, _started),
        cluster.api() as api,
    ):
        if os.environ.get("DRADRIVER_BENCH_KEEP") is None:
            cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        api.create(
            path_for(RESOURCE_V1, "deviceclasses"),
            {
                "metadata": {"name": faults.DRIVER},
                "spec": {
                    "selectors": [{"cel": {"expression": f'device.driver == "{faults.DRIVER}"'}}]
                },
            },
        )
        controller = ControllerProcess(
            "fairness",
            controller_kubeconfig(api, cluster, work),
            work,
            extra_args=["--log-level=warning", *controller_args("fair")]
            + ([f"--allocation-timeout={s.allocation_timeout}"] if s.allocation_timeout else []),
        )
        controller.start()
        try:
            controller.wait_ready(faults.START_TIMEOUT)
            out = rows(api, "fair", controller, s)
        finally:
            controller.stop()
    print(table(["fault", "runs", "metric", "value", "promised"], [r.cells() for r in out]))
