"""Helm values that run the dradriver chart on the local cluster (``dradriver cluster up``).

    python -m devtools.cluster.chartvalues > local.yaml
    helm install dradriver deployments/helm/dradriver -n dradriver --create-namespace -f local.yaml

What differs from a real cluster, and why:

* **hostNetwork, and the apiserver at 127.0.0.1.** Pods on node-1 get a network namespace
  with ``lo`` and a carrier-less ``eth0`` (the tap CNI: this kernel has no veth), and there
  is no kube-proxy, so a pod can reach neither the ``kubernetes`` Service nor anything else.
  In the host's network namespace the components reach the apiserver on 127.0.0.1 (its
  serving certificate names it). The apiserver cannot reach the webhook through its
  Service here: it runs with ``--enable-aggregator-routing`` (webhook calls go to the
  Service's endpoints, not its unroutable ClusterIP), but the pods' IP is the node's
  127.0.0.1, which Endpoints refuse (loopback), so the Service has none. So the webhook
  is registered by URL, ``https://127.0.0.1:<port>/validate``, with 127.0.0.1 in the
  chart-generated certificate: the one replica on node-1. The plugin serves its probes
  on a unix socket, so the surge pod of a rolling update starts next to the old one; the
  controller's ports are host ports, moved off the harness's defaults.
* **The plugin only on node-1**, the node with the real runtime: further nodes run the fake
  CRI runtime, where a container "runs" without a process, so a plugin pod there would
  never register (node selector ``kubernetes.io/hostname``).
* **One controller replica, replaced rather than surged**: with hostNetwork two replicas
  on the one real node would need the same host ports, so the standby could never be
  scheduled and a surge pod would wait forever; the Lease still passes from the old pod
  to the new one on every upgrade.
* **node-1's CDI dir**: containerd reads CDI specs from ``<state dir>/cdi/node-1``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from devtools.cluster.config import Layout, default_state_dir

# Host ports of the controller in the host network: away from the harness's defaults
# (8080/8081/8443), which test processes on this machine use.
CONTROLLER_HTTP_PORT = 18081
WEBHOOK_PORT = 18443
REAL_RUNTIME_NODE_INDEX = 1


def mock_devices_dir(layout: Layout) -> Path:
    """Where the chart's plugin makes its mock device nodes (a host path on node-1)."""
    return layout.state_dir / "chart" / "mock-devices"


def local_cluster_values(layout: Layout) -> dict[str, Any]:
    node = layout.node(REAL_RUNTIME_NODE_INDEX)
    mock = str(mock_devices_dir(layout))
    return {
        "hostNetwork": True,
        "apiServer": {"host": "127.0.0.1", "port": layout.ports.apiserver},
        "kubeletPlugin": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "kubeletRoot": str(node.root),
            "cdiDir": str(node.cdi_dir),
            "mockDevicesDir": mock,
            "config": {
                "sources": [
                    {
                        "static": {
                            "mockDir": mock,
                            "devices": [
                                {
                                    "namePrefix": "dev",
                                    "count": 4,
                                    "attributes": {"model": "mock-accelerator"},
                                },
                                {
                                    "namePrefix": "er",
                                    "count": 2,
                                    "attributes": {
                                        "model": "mock-accelerator",
                                        "extendedResource": "dradriver.dev/mock-dra",
                                    },
                                },
                            ],
                        }
                    }
                ]
            },
        },
        "controller": {
            "replicas": 1,
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            "httpPort": CONTROLLER_HTTP_PORT,
            "nodeSelector": {"kubernetes.io/hostname": node.name},
        },
        "webhook": {
            "port": WEBHOOK_PORT,
            "url": f"https://127.0.0.1:{WEBHOOK_PORT}/validate",
            "tls": {"mode": "helm", "helm": {"ipAddresses": ["127.0.0.1"]}},
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.cluster.chartvalues",
        description="Print Helm values for installing the chart on the local cluster.",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=default_state_dir(), help="default: %(default)s"
    )
    args = parser.parse_args(argv)
    layout = Layout(state_dir=args.state_dir, runtime="real")
    sys.stdout.write(yaml.safe_dump(local_cluster_values(layout), sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
