"""Local cluster start-up: time to each readiness step and peak RSS per component.

Run with ``python -m bench.cluster_startup [--runs N]``; needs no running cluster
(it starts and stops its own, in a separate state dir, on the usual ports).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from devtools.cluster.binaries import build_seconds, ensure_binaries
from devtools.cluster.config import Layout
from devtools.cluster.local import LocalCluster

SMOKE_ARGS = ("--runs", "1")
CLUSTER = "exclusive"  # starts clusters of its own on the usual ports (bench/__init__.py)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    bins = ensure_binaries()
    steps: dict[str, list[float]] = {}
    rss: dict[str, list[int]] = {}
    teardown: list[float] = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="dradriver-bench-") as tmp:
            cluster = LocalCluster(Layout(state_dir=Path(tmp) / "cluster"))
            state = cluster.up(bins)
            for step, seconds in state.timings.items():
                steps.setdefault(step, []).append(seconds)
            for rec in state.components:
                rss.setdefault(rec.name, []).append(rec.peak_rss_kib() or 0)
            started = time.monotonic()
            cluster.down()
            teardown.append(time.monotonic() - started)
    built = build_seconds()
    print(
        f"kube binaries: this cache entry was built in {built:.0f}s (a warm Go build cache makes "
        "that seconds; a cold one about 5 minutes on 2 cores)"
        if built
        else "kube binaries: prebuilt"
    )
    print(f"\n{'step (cumulative)':<20}{'median s':>10}{'max s':>10}")
    for step, values in steps.items():
        print(f"{step:<20}{statistics.median(values):>10.2f}{max(values):>10.2f}")
    print(f"{'teardown':<20}{statistics.median(teardown):>10.2f}{max(teardown):>10.2f}")
    print(f"\n{'component':<26}{'peak RSS MiB':>14}")
    for name, kib in rss.items():
        print(f"{name:<26}{max(kib) / 1024:>14.0f}")
    print(f"{'total':<26}{sum(max(v) for v in rss.values()) / 1024:>14.0f}")


if __name__ == "__main__":
    main()
