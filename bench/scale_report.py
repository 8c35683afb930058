"""The tables of ``bench.scale``: one row per N (and C), then the growth exponents (a helper)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.common import percentile, table
from bench.controller_allocation import Result
from bench.scale_phases import ControllerRun, NetworkRun, Publish
from devtools.cluster import kwok


@dataclass
class Size:
    """Everything measured at one N."""

    nodes: int
    nodes_seconds: float = 0.0  # create -> all Ready
    kwok_rss: float = 0.0
    publish: Publish | None = None
    controller: dict[int, ControllerRun] = field(default_factory=dict)  # by C
    scheduler: dict[int, Result] = field(default_factory=dict)
    network: NetworkRun | None = None


def exponent(points: Sequence[tuple[float, float]]) -> str:
    """The least-squares slope of log(y) over log(x): y ~ x^b ("-" below two usable x)."""
    usable = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len({x for x, _ in usable}) < 2:
        return "-"
    mx = sum(x for x, _ in usable) / len(usable)
    my = sum(y for _, y in usable) / len(usable)
    num = sum((x - mx) * (y - my) for x, y in usable)
    den = sum((x - mx) ** 2 for x, _ in usable)
    return f"{num / den:.2f}"


def _latencies(r: Result) -> list[float]:
    return [r.seen[k] - r.sent[k] for k in r.seen]


def _ms(r: Result, q: float) -> float:
    return percentile(_latencies(r), q) * 1000


def nodes_table(sizes: Sequence[Size]) -> str:
    rows = []
    for s in sizes:
        beat = kwok.heartbeat(s.nodes)
        p = s.publish
        rows.append(
            [
                str(s.nodes),
                f"{s.nodes * 8}",
                f"{s.nodes_seconds:.1f}",
                f"{s.kwok_rss:.0f}",
                f"{beat.renew_seconds:.0f} s / {beat.grace_seconds:.0f} s",
                f"{p.seconds:.2f}" if p else "-",
                f"{p.writes}" if p else "-",
                f"{p.republish_seconds:.2f} s, {p.republish_writes}" if p else "-",
            ]
        )
    return table(
        [
            "N",
            "devices",
            "nodes Ready s",
            "kwok RSS MiB",
            "lease renew / grace",
            "pools publish s",
            "writes",
            "republish (unchanged)",
        ],
        rows,
    )


def allocation_table(sizes: Sequence[Size], claims: Sequence[int]) -> str:
    rows = []
    for s in sizes:
        for c in claims:
            ctrl, sched = s.controller.get(c), s.scheduler.get(c)
            if ctrl is None or sched is None:
                continue
            r = ctrl.result
            rows.append(
                [
                    f"{s.nodes}",
                    f"{c}",
                    f"{r.rate:.1f}",
                    f"{_ms(r, 0.5):.0f} / {_ms(r, 0.99):.0f}",
                    f"{r.rss_before:.0f} -> {r.rss_after:.0f} ({r.tree_rss_after:.0f})",
                    f"{sched.rate:.1f}",
                    f"{_ms(sched, 0.5):.0f} / {_ms(sched, 0.99):.0f}",
                    f"{sched.rss_before:.0f} -> {sched.rss_after:.0f}",
                    f"{r.rate / sched.rate:.2f}x",
                ]
            )
    return table(
        [
            "N",
            "C",
            "controller claims/s",
            "p50 / p99 ms",
            "RSS MiB (with worker)",
            "scheduler pods/s",
            "p50 / p99 ms",
            "RSS MiB",
            "ratio",
        ],
        rows,
    )


def restart_table(sizes: Sequence[Size], claims: Sequence[int]) -> str:
    rows = []
    for s in sizes:
        for c in claims:
            run = s.controller.get(c)
            if run is None:
                continue
            listed = ", ".join(f"{k} {v}" for k, v in run.listed.items())
            rows.append(
                [
                    f"{s.nodes}",
                    f"{c}",
                    f"{run.restart_ready_seconds:.2f}",
                    f"{run.restart_seconds:.2f}",
                    listed,
                    f"{run.restart_rss:.0f}",
                ]
            )
    return table(
        ["N", "C", "start -> ready s", "start -> first allocation s", "listed", "RSS MiB"], rows
    )


def stage_table(sizes: Sequence[Size], claims: Sequence[int]) -> str:
    rows = []
    for s in sizes:
        c = max((c for c in claims if c in s.controller), default=None)
        if c is None:
            continue
        for stage in s.controller[c].stages:
            rows.append([f"{s.nodes}", f"{c}", *stage.row()])
    return table(["N", "C", "stage", "claims", "mean ms", "p50 ms", "p99 ms"], rows)


def network_table(sizes: Sequence[Size]) -> str:
    rows = [
        [
            f"{s.nodes}",
            f"{s.network.devices}",
            f"{s.network.slices}",
            f"{s.network.seconds:.2f}",
            f"{s.network.writes}",
            f"{s.network.republish_writes}",
        ]
        for s in sizes
        if s.network is not None
    ]
    return table(
        ["N", "devices", "slices", "create -> Published s", "writes", "after restart writes"], rows
    )


def growth_table(
    sizes: Sequence[Size],
    claims: Sequence[int],
    fit: Callable[[Sequence[tuple[float, float]]], str],
) -> str:
    def series(name: str, get: Callable[[Size], float | None]) -> list[str]:
        points = [(float(s.nodes), v) for s in sizes if (v := get(s)) is not None]
        shown = ", ".join(f"{n:.0f}: {v:.3g}" for n, v in points)
        return [name, shown, fit(points)]

    rows = [
        series("pools publish s", lambda s: s.publish.seconds if s.publish else None),
        series("kwok RSS MiB", lambda s: s.kwok_rss),
    ]
    for c in claims:

        def ctrl(s: Size, c: int = c) -> ControllerRun | None:
            return s.controller.get(c)

        def sched(s: Size, c: int = c) -> Result | None:
            return s.scheduler.get(c)

        rows += [
            series(
                f"controller ms per claim, C={c}",
                lambda s: 1000 / r.result.rate if (r := ctrl(s)) else None,
            ),
            series(
                f"controller p50 ms, C={c}",
                lambda s: _ms(r.result, 0.5) if (r := ctrl(s)) else None,
            ),
            series(
                f"controller RSS after MiB, C={c}",
                lambda s: r.result.rss_after if (r := ctrl(s)) else None,
            ),
            series(
                f"restart -> first allocation s, C={c}",
                lambda s: r.restart_seconds if (r := ctrl(s)) else None,
            ),
            series(
                f"scheduler ms per pod, C={c}", lambda s: 1000 / r.rate if (r := sched(s)) else None
            ),
            series(
                f"scheduler RSS after MiB, C={c}",
                lambda s: r.rss_after if (r := sched(s)) else None,
            ),
        ]
    rows.append(
        series("network pool publish s", lambda s: s.network.seconds if s.network else None)
    )
    rows = [r for r in rows if r[1]]  # a C that fitted no N
    return table(["figure", "by N", "exponent b (~N^b)"], rows)


def profile_table(sizes: Sequence[Size]) -> str | None:
    for s in reversed(sizes):
        for c, run in sorted(s.controller.items(), reverse=True):
            if run.profile:
                total = max(n for _, n, _ in run.profile)
                rows = [[f, f"{own}", f"{n}"] for f, n, own in run.profile]
                head = f"N={s.nodes}, C={c}; samples on the busiest stack: {total}"
                return head + "\n\n" + table(["function (file)", "self", "inclusive"], rows)
    return None


def print_report(sizes: Sequence[Size], claims: Sequence[int]) -> None:
    print("\nSimulated nodes (kwok) and their pools (8 devices each, one publisher per node):\n")
    print(nodes_table(sizes))
    print("\nAllocation: controller (immediate claims) vs kube-scheduler (template-claim pods):\n")
    print(allocation_table(sizes, claims))
    print("\nController restart at scale (new process; a claim created while none ran):\n")
    print(restart_table(sizes, claims))
    print("\nController stages at the largest C (histogram bucket bounds for p50/p99):\n")
    print(stage_table(sizes, claims))
    print("\nA NetworkDevicePool whose node selector matches every simulated node:\n")
    print(network_table(sizes))
    profile = profile_table(sizes)
    if profile is not None:
        print("\nController profile while allocating (py-spy, controller and its worker):\n")
        print(profile)
    print("\nGrowth against N:\n")
    print(growth_table(sizes, claims, exponent))
    print(
        "\nController: immediate claims, one device each, CEL selector on `model`, leader "
        "election on, no client-side limiter.\nkube-scheduler: restarted with the given "
        "--kube-api-qps/--kube-api-burst; pods tolerate the simulated nodes' taint; time = "
        "pod create sent -> its claim's allocation seen.\nPer-claim time = 1 / claims/s "
        "(flat in N is exponent ~0); RSS = the allocating process.\nNetwork pool after a "
        "restart: where DRADeviceBindingConditions is off (1.34), the apiserver drops the "
        "devices' binding fields and a new controller rewrites each slice once."
    )


def results_points(sizes: Sequence[Size]) -> list[dict[str, float | int]]:
    """One point per (N, C) run by both sides, in the shape of ``bench.plots``' ``scale``
    list (its ``ScalePoint``): rates and the allocating processes' RSS after the phase."""
    points: list[dict[str, float | int]] = []
    for s in sizes:
        for c, ctrl in sorted(s.controller.items()):
            sched = s.scheduler.get(c)
            if sched is None:
                continue
            points.append(
                {
                    "nodes": s.nodes,
                    "claims": c,
                    "controller_per_s": round(ctrl.result.rate, 1),
                    "scheduler_per_s": round(sched.rate, 1),
                    "controller_rss_mib": round(ctrl.result.rss_after),
                    "scheduler_rss_mib": round(sched.rss_after),
                }
            )
    return points
