"""The chart's NetworkPolicies (off by default) and the webhook's limits as values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from controller.main import build_parser, options_from
from tests.chart.test_chart import Obj, failure, one, render

CONTROLLER = "dradriver-controller"
PLUGIN = "dradriver-kubeletplugin"
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}


def rendered(helm: Path, tmp_path: Path, **chart_values: Any) -> list[Obj]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(chart_values))
    return render(helm, "--values", str(path))


def policies(docs: list[Obj]) -> dict[str, Obj]:
    return {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}


def pod_labels(docs: list[Obj], kind: str) -> dict[str, str]:
    labels: dict[str, str] = one(docs, kind)["spec"]["template"]["metadata"]["labels"]
    return labels


def test_no_network_policy_unless_enabled(helm: Path) -> None:
    assert policies(render(helm)) == {}


def test_enabled_admits_only_the_webhook_port_from_anywhere_by_default(
    helm: Path, tmp_path: Path
) -> None:
    docs = rendered(helm, tmp_path, networkPolicy={"enabled": True})
    found = policies(docs)
    controller, plugin = found[CONTROLLER], found[PLUGIN]
    # Each policy selects its component's pods.
    assert (
        controller["podSelector"]["matchLabels"].items() <= pod_labels(docs, "Deployment").items()
    )
    assert plugin["podSelector"]["matchLabels"].items() <= pod_labels(docs, "DaemonSet").items()
    assert controller["policyTypes"] == ["Ingress"] == plugin["policyTypes"]
    # The webhook port from any source (the apiserver's address is not known); not the
    # metrics/probe port 8081; the plugin admits nothing.
    assert controller["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8443}]}]
    assert plugin["ingress"] == []


def test_apiserver_cidrs_and_metrics_peers(helm: Path, tmp_path: Path) -> None:
    docs = rendered(
        helm,
        tmp_path,
        networkPolicy={
            "enabled": True,
            "apiServerCIDRs": ["10.0.0.0/24", "fd00::/64"],
            "metricsFrom": [MONITORING],
        },
        webhook={"port": 9443},
    )
    found = policies(docs)
    assert found[CONTROLLER]["ingress"] == [
        {
            "ports": [{"protocol": "TCP", "port": 9443}],
            "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}, {"ipBlock": {"cidr": "fd00::/64"}}],
        },
        {"ports": [{"protocol": "TCP", "port": 8081}], "from": [MONITORING]},
    ]
    assert found[PLUGIN]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 8080}], "from": [MONITORING]}
    ]


def test_without_the_webhook_the_controller_admits_nothing(helm: Path, tmp_path: Path) -> None:
    docs = rendered(helm, tmp_path, networkPolicy={"enabled": True}, webhook={"enabled": False})
    assert policies(docs)[CONTROLLER]["ingress"] == []


def test_a_cidr_that_is_not_one_is_refused(helm: Path, tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"networkPolicy": {"apiServerCIDRs": ["apiserver"]}}))
    assert "apiServerCIDRs" in failure(helm, "--values", str(path))


def test_webhook_limits_become_controller_flags(helm: Path, tmp_path: Path) -> None:
    limits = {"maxBodyBytes": 4194304, "smallQueue": 0, "reviewTimeoutSeconds": 7.5}
    docs = rendered(helm, tmp_path, webhook={"limits": limits})
    command = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    own = ("--webhook-address", "--webhook-cert", "--webhook-key")
    limit_flags = [c for c in command if c.startswith("--webhook-") and not c.startswith(own)]
    assert limit_flags == [
        "--webhook-max-body-bytes=4194304",
        "--webhook-review-timeout=7.5",
        "--webhook-small-queue=0",
    ]
    # They parse as the controller parses them.
    given = options_from(build_parser().parse_args(limit_flags)).webhook_limits
    assert (given.max_body_bytes, given.pool.small_queue, given.pool.timeout) == (4194304, 0, 7.5)


def test_a_review_timeout_not_below_the_registrations_is_refused(
    helm: Path, tmp_path: Path
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(
        yaml.safe_dump({"webhook": {"timeoutSeconds": 5, "limits": {"reviewTimeoutSeconds": 5}}})
    )
    assert "reviewTimeoutSeconds (5) must be below webhook.timeoutSeconds (5)" in failure(
        helm, "--values", str(path)
    )
    path.write_text(yaml.safe_dump({"webhook": {"limits": {"maxBodyBytes": 1024}}}))
    assert "maxBodyBytes" in failure(helm, "--values", str(path))
