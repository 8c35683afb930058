"""The ``dradriver cluster ...`` and ``dradriver demo`` subcommands (dev tooling).

``dradriver`` (in the product) adds these when this package is installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from devtools.cluster.binaries import (
    PRIMARY_VERSION,
    SUPPORTED_VERSIONS,
    VERSION_ENV,
    BinaryError,
    build_dir,
    build_seconds,
    ensure_binaries,
)
from devtools.cluster.config import (
    RUNTIMES,
    Layout,
    default_state_dir,
    parse_feature_gates,
    parse_runtime,
)
from devtools.cluster.containerd import ContainerdError
from devtools.cluster.cri import CRIError
from devtools.cluster.helmbin import cached_helm
from devtools.cluster.images import ImageError
from devtools.cluster.kwok import SELECTOR
from devtools.cluster.kwokbin import KwokBuildError
from devtools.cluster.local import ClusterError, LocalCluster
from devtools.cluster.process import ProcessDied
from devtools.cluster.runtimebin import RuntimeBuildError
from devtools.cluster.wait import WaitTimeout

ERRORS: tuple[type[Exception], ...] = (
    ClusterError,
    BinaryError,
    ProcessDied,
    WaitTimeout,
    RuntimeBuildError,
    ImageError,
    ContainerdError,
    CRIError,
    KwokBuildError,
)


def _cluster(args: argparse.Namespace) -> LocalCluster:
    gates = parse_feature_gates(args.feature_gates or "")
    # down and status take the runtime from the running cluster's state file.
    runtime = parse_runtime(getattr(args, "runtime", "fake"))
    layout = Layout(state_dir=args.state_dir, nodes=args.nodes, runtime=runtime)
    kwok_nodes = getattr(args, "kwok_nodes", 0)
    return LocalCluster(layout, gates, getattr(args, "kube_version", None), kwok_nodes)


def cmd_build(args: argparse.Namespace) -> int:
    versions = SUPPORTED_VERSIONS if args.all else [args.kube_version]
    for version in versions:
        bins = ensure_binaries(version)
        took = build_seconds(bins.version)
        note = f" (built in {took:.0f}s)" if took is not None else ""
        print(f"{build_dir(bins.version)}{note}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    state = _cluster(args).up()
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in state.timings.items())
    print(f"cluster up ({timings})", file=sys.stderr)
    for line in usage_hints(state.kubeconfig, build_dir(state.kube_version), cached_helm()):
        print(line, file=sys.stderr)
    print(state.kubeconfig)
    return 0


def usage_hints(kubeconfig: str, kube_bin: Path, helm: Path | None) -> list[str]:
    """How to reach the new cluster with the kubectl and helm this repository builds."""
    helm_how = str(helm) if helm else "$(make -s helm)"
    return [
        f"kubectl: KUBECONFIG={kubeconfig} {kube_bin / 'kubectl'} get nodes",
        f"helm:    KUBECONFIG={kubeconfig} {helm_how} list -A"
        + ("" if helm else "   (`make -s helm` builds helm v3 and prints its path)"),
        "install dradriver on it: README, 'On the local cluster'",
    ]


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
    print(f"kubernetes: {state.kube_version}")
    nodes = ", ".join(state.nodes or [state.node_name])
    print(f"nodes:      {nodes} (node-1 kubelet root {state.kubelet_root})")
    gates = ", ".join(f"{k}={v}" for k, v in state.feature_gates.items())
    gates = gates or f"the {state.kube_version} defaults"
    print(f"gates:      {gates}")
    print(f"runtime:    node-1 {state.runtime}" + (", others fake" if len(state.nodes) > 1 else ""))
    if state.kwok_nodes:
        print(f"simulated:  {state.kwok_nodes} kwok nodes (label {SELECTOR}), 8 devices each")
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
    from devtools.demo.main import run_demo

    layout = Layout(state_dir=args.state_dir, runtime=parse_runtime(args.runtime))
    return run_demo(layout, parse_feature_gates(args.feature_gates or ""), args.kube_version)


def with_version_opt(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "--kube-version",
        default=None,
        help=f"the Kubernetes release to run: one of {', '.join(SUPPORTED_VERSIONS)} or a "
        f"minor like v1.35 (default: ${VERSION_ENV}, else {PRIMARY_VERSION})",
    )
    return p


def with_cluster_opts(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "--state-dir",
        type=Path,
        default=default_state_dir(),
        help="where the cluster keeps its state (default: %(default)s; env DRADRIVER_CLUSTER_DIR)",
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
        "DRADeviceTaintRules=true (default: the chosen release's defaults)",
    )
    return p


def kwok_nodes_count(text: str) -> int:
    count = int(text)
    if not 0 <= count <= 10_000:
        raise argparse.ArgumentTypeError(f"--kwok-nodes must be between 0 and 10000, not {count}")
    return count


def with_runtime_opt(p: argparse.ArgumentParser, default_runtime: str) -> argparse.ArgumentParser:
    p.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=default_runtime,
        help="node-1's container runtime: the upstream fake CRI (no containers run) or a "
        "containerd + runc of its own with real containers; further nodes always run "
        "the fake one (default: %(default)s)",
    )
    return p


def register(sub: Any) -> None:
    """Add ``cluster`` and ``demo`` to the ``dradriver`` command's subparsers."""
    cluster = sub.add_parser("cluster", help="the local Kubernetes cluster (1.34 to 1.38)")
    csub = cluster.add_subparsers(dest="action", required=True)
    build = with_version_opt(
        csub.add_parser("build", help="build (or find cached) kube binaries; print their dir")
    )
    build.add_argument("--all", action="store_true", help="every supported release, oldest first")
    build.set_defaults(func=cmd_build)
    up = with_version_opt(
        with_runtime_opt(
            with_cluster_opts(
                csub.add_parser("up", help="start the cluster; print the kubeconfig path")
            ),
            "fake",
        )
    )
    up.add_argument(
        "--kwok-nodes",
        type=kwok_nodes_count,
        default=0,
        metavar="N",
        help="add N simulated nodes kept by kwok (built on first use), tainted "
        "kwok.x-k8s.io/node=fake:NoSchedule, each publishing 8 devices of the driver "
        "dradriver.dev (default: %(default)s)",
    )
    up.set_defaults(func=cmd_up)
    with_cluster_opts(csub.add_parser("down", help="stop the cluster and clean up")).set_defaults(
        func=cmd_down
    )
    with_cluster_opts(
        csub.add_parser("status", help="show components, PIDs and peak RSS")
    ).set_defaults(func=cmd_status)
    # The demo shows what containers printed, which needs real containers.
    with_version_opt(
        with_runtime_opt(
            with_cluster_opts(
                sub.add_parser("demo", help="start a cluster, run the example, tear down")
            ),
            "real",
        )
    ).set_defaults(func=cmd_demo)
