"""Row (f0) of :mod:`bench.faults`: an apiserver outage while immediate claims and pods' claims
compete (issue 21, finding 0). A helper, no ``main``: one round of :mod:`bench.torture` with
the outage as its fault, on the fault suite's own cluster, after row (d) (its controller is
stopped by then; this round starts the two leader-elected replicas the torture bench runs).

Metrics, promised 0: devices seen in two allocations in the API at any moment (the
torture bench's watch-based checker) and devices prepared for two claims at once (its
played kubelet, against real node plugins); the longest double is printed alongside.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.torture import Settings, run_rounds
from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster

FAULT = "(f0) apiserver stopped {:.0f}s while pods and immediate claims compete"


def outage_race(
    cluster: LocalCluster, api: AdminAPI, kubeconfig: Path, work: Path, outage: float
) -> list[tuple[str, str, str]]:
    """``(metric, value, promised)`` rows; ``outage`` seconds down, observed long enough
    after for kube-scheduler's informers to come back (or briefly, for a short outage)."""
    s = Settings(
        rounds=1,
        outage_min=outage,
        outage_max=outage,
        observe_outage=75.0 if outage >= 20 else 8.0,
        kinds=("outage",),
    )
    (work / "race").mkdir(parents=True, exist_ok=True)
    outcome = asyncio.run(run_rounds(s, cluster, api, kubeconfig, work / "race"))
    return [
        ("devices in two allocations (API)", str(outcome.doubles), "0"),
        ("devices prepared for two claims", str(outcome.doubles_prepared), "0"),
        ("longest double in the API (s)", f"{outcome.longest:.1f}", "-"),
    ]
