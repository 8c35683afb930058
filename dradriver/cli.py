"""``dradriver``: the umbrella command (local cluster, demo)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dradriver import __version__
from dradriver.cluster.binaries import BinaryError, build_dir, build_seconds, ensure_binaries
from dradriver.cluster.config import Layout, default_state_dir, parse_feature_gates
from dradriver.cluster.local import ClusterError, ComponentDied, LocalCluster
from dradriver.log import configure


def _cluster(args: argparse.Namespace) -> LocalCluster:
    gates = parse_feature_gates(args.feature_gates or "")
    return LocalCluster(Layout(state_dir=args.state_dir, nodes=args.nodes), gates)


def cmd_build(args: argparse.Namespace) -> int:
    ensure_binaries()
    took = build_seconds()
    note = f" (built in {took:.0f}s)" if took is not None else ""
    print(f"{build_dir()}{note}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    state = _cluster(args).up()
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in state.timings.items())
    print(f"cluster up ({timings})", file=sys.stderr)
    print(state.kubeconfig)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    _cluster(args).down()
    print("cluster down", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = _cluster(args).state()
    if state is None:
        print("no local cluster")
        return 1
    print(f"kubeconfig: {state.kubeconfig}")
    nodes = ", ".join(state.nodes or [state.node_name])
    print(f"nodes:      {nodes} (node-1 kubelet root {state.kubelet_root})")
    gates = ", ".join(f"{k}={v}" for k, v in state.feature_gates.items()) or "1.36 defaults"
    print(f"gates:      {gates}")
    print(f"{'COMPONENT':<26}{'PID':>8}  {'STATE':<8}{'PEAK RSS':>10}")
    healthy = True
    for rec in state.components:
        alive = rec.alive()
        healthy &= alive
        rss = rec.peak_rss_kib()
        rss_text = f"{rss / 1024:.0f} MiB" if rss is not None else "-"
        print(f"{rec.name:<26}{rec.pid:>8}  {'running' if alive else 'DEAD':<8}{rss_text:>10}")
    return 0 if healthy else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from dradriver.demo import run_demo

    return run_demo(Layout(state_dir=args.state_dir), parse_feature_gates(args.feature_gates or ""))


def cmd_explain(args: argparse.Namespace) -> int:
    import asyncio

    from dradriver.explaincmd import run_explain

    print(
        asyncio.run(
            run_explain(args.claim, args.kubeconfig, not args.only_excluded, args.all_drivers)
        )
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dradriver",
        description="dradriver: a Kubernetes DRA driver. This command runs the local "
        "test cluster and the demo; the driver itself runs as dradriver-controller and "
        "dradriver-kubeletplugin.",
    )
    parser.add_argument("--version", action="version", version=f"dradriver {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    sub = parser.add_subparsers(dest="command", required=True)

    def with_cluster_opts(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--state-dir",
            type=lambda s: __import__("pathlib").Path(s),
            default=default_state_dir(),
            help="where the cluster keeps its state (default: %(default)s; "
            "env DRADRIVER_CLUSTER_DIR)",
        )
        p.add_argument(
            "--nodes",
            type=int,
            default=1,
            help="number of nodes (kubelets): node-1 uses /var/lib/kubelet, node-K "
            "/var/lib/kubelet-node-K in its own mount namespace (default: %(default)s)",
        )
        p.add_argument(
            "--feature-gates",
            default="",
            help="Kubernetes feature gates for every component, e.g. "
            "DRADeviceTaintRules=true (default: the 1.36 defaults)",
        )
        return p

    cluster = sub.add_parser("cluster", help="the local Kubernetes 1.36 cluster")
    csub = cluster.add_subparsers(dest="action", required=True)
    csub.add_parser(
        "build", help="build (or find cached) kube binaries; print their dir"
    ).set_defaults(func=cmd_build)
    with_cluster_opts(
        csub.add_parser("up", help="start the cluster; print the kubeconfig path")
    ).set_defaults(func=cmd_up)
    with_cluster_opts(csub.add_parser("down", help="stop the cluster and clean up")).set_defaults(
        func=cmd_down
    )
    with_cluster_opts(
        csub.add_parser("status", help="show components, PIDs and peak RSS")
    ).set_defaults(func=cmd_status)
    explain = sub.add_parser(
        "explain",
        help="why a ResourceClaim is or is not allocated, device by device",
        description="Runs dradriver's allocator (the scheduler's semantics) for one claim "
        "against the cluster's slices, classes and other claims, and prints a table: "
        "for each candidate device, whether it could be allocated and why not.",
    )
    explain.add_argument("claim", metavar="NAMESPACE/CLAIM")
    explain.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
    explain.add_argument(
        "--only-excluded", action="store_true", help="leave out devices that could be allocated"
    )
    explain.add_argument(
        "--all-drivers",
        action="store_true",
        help="show every driver's devices, not only those of the drivers the claim's "
        'DeviceClasses name (device.driver == "...")',
    )
    explain.set_defaults(func=cmd_explain)
    with_cluster_opts(
        sub.add_parser("demo", help="start a cluster, run the example, tear down")
    ).set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure(args.log_level)
    try:
        code: int = args.func(args)
    except (ClusterError, BinaryError, ComponentDied, ValueError, RuntimeError) as e:
        print(f"dradriver: error: {e}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
