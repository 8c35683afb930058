"""Feature gates as a component reports them in its own metrics."""

from __future__ import annotations

from devtools.cluster.gates import Gate, parse_feature_metrics, why_off

METRICS = """\
# HELP kubernetes_feature_enabled [BETA] The stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="DRADeviceTaints",stage="ALPHA"} 0
kubernetes_feature_enabled{name="DRAResourceClaimDeviceStatus",stage="BETA"} 1
kubernetes_feature_enabled{name="DynamicResourceAllocation",stage=""} 1
apiserver_request_total{code="200",verb="GET"} 12
kubernetes_feature_enabled{stage="BETA"} 1
"""


def test_gates_are_read_from_the_metric_and_nothing_else() -> None:
    gates = parse_feature_metrics(METRICS)
    assert gates == {
        "DRADeviceTaints": Gate("DRADeviceTaints", "ALPHA", False),
        "DRAResourceClaimDeviceStatus": Gate("DRAResourceClaimDeviceStatus", "BETA", True),
        "DynamicResourceAllocation": Gate("DynamicResourceAllocation", "", True),
    }


def test_the_reason_names_the_first_gate_that_is_off_or_missing() -> None:
    gates = parse_feature_metrics(METRICS)
    assert why_off(gates, "DRAResourceClaimDeviceStatus") == ""
    assert why_off(gates, "DynamicResourceAllocation", "DRADeviceTaints") == (
        "gate DRADeviceTaints (alpha) is off"
    )
    assert why_off(gates, "DRAResourceClaimGranularStatusAuthorization") == (
        "this release has no gate DRAResourceClaimGranularStatusAuthorization"
    )
