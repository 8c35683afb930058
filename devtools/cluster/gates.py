"""Which feature gates a running component has on, read from its own metrics.

Every Kubernetes component exports ``kubernetes_feature_enabled{name, stage}``
(1 or 0) on ``/metrics``: what it really runs with, defaults and overrides
alike, so the version matrix reports a gate as the cluster has it instead of
assuming it from the release notes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from devtools.cluster.api import AdminAPI

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


def kubelet_gates(api: AdminAPI, node: str) -> dict[str, Gate]:
    """A kubelet's gates, through the apiserver's node proxy."""
    return parse_feature_metrics(api.text(f"/api/v1/nodes/{node}/proxy/metrics"))


def why_off(gates: dict[str, Gate], *names: str) -> str:
    """ "gate X (alpha) is off" for the first of ``names`` that is off or unknown."""
    for name in names:
        gate = gates.get(name)
        if gate is None:
            return f"this release has no gate {name}"
        if not gate.enabled:
            return gate.describe()
    return ""
