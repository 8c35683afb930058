"""Which feature gates a running component has on, read from its own metrics.

Every Kubernetes component exports ``kubernetes_feature_enabled{name, stage}``
(1 or 0) on ``/metrics``: what it really runs with, defaults and overrides
alike, so the version matrix reports a gate as the cluster has it instead of
assuming it from the release notes.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass

import httpx

from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster

_LINE = re.compile(
    r"^kubernetes_feature_enabled\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.eE+-]+)\s*$", re.MULTILINE
)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Gate:
    name: str
    stage: str  # ALPHA, BETA, "" for GA, DEPRECATED
    enabled: bool

    def describe(self) -> str:
        stage = (self.stage or "GA").lower()
        return f"gate {self.name} ({stage}) is {'on' if self.enabled else 'off'}"


def parse_feature_metrics(text: str) -> dict[str, Gate]:
    """The gates in a Prometheus text exposition; other metrics are ignored."""
    gates: dict[str, Gate] = {}
    for match in _LINE.finditer(text):
        labels = dict(_LABEL.findall(match.group("labels")))
        name = labels.get("name")
        if not name:
            continue
        gates[name] = Gate(name, labels.get("stage", ""), float(match.group("value")) == 1)
    return gates


def apiserver_gates(api: AdminAPI) -> dict[str, Gate]:
    return parse_feature_metrics(api.text("/metrics"))


def kubelet_gates(cluster: LocalCluster, node: str) -> dict[str, Gate]:
    """A kubelet's gates, from its own /metrics with the apiserver's kubelet-client cert.

    Not through the apiserver's node proxy: that refuses loopback addresses,
    and the local cluster's nodes all live on 127.0.0.1.
    """
    [layout] = [n for n in cluster.layout.all_nodes() if n.name == node]
    pki = cluster.layout.pki
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    client = "apiserver-kubelet-client"
    context.load_cert_chain(pki / f"{client}.crt", pki / f"{client}.key")
    resp = httpx.get(f"https://127.0.0.1:{layout.port}/metrics", verify=context, timeout=10)
    resp.raise_for_status()
    return parse_feature_metrics(resp.text)


def why_off(gates: dict[str, Gate], *names: str) -> str:
    """ "gate X (alpha) is off" for the first of ``names`` that is off or unknown."""
    for name in names:
        gate = gates.get(name)
        if gate is None:
            return f"this release has no gate {name}"
        if not gate.enabled:
            return gate.describe()
    return ""
