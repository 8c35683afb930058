"""The start-up probe of gated slice features: what counts as missing, and the one line."""

from __future__ import annotations

import copy

from dradriver.k8s.objects import Obj
from dradriver.resourceslice import capabilities as caps


def _stored_without(sent: Obj, device: int, *fields: str) -> Obj:
    stored = copy.deepcopy(sent)
    for name in fields:
        stored["spec"]["devices"][device].pop(name)
    return stored


def test_a_probe_device_per_feature_on_the_node_or_all_nodes() -> None:
    sent = caps.probe_slice("dradriver.dev", "node-1", "node-1", caps.NODE_FEATURES)
    spec = sent["spec"]
    assert spec["nodeName"] == "node-1" and spec["pool"]["name"] == "node-1"
    assert [d["name"] for d in spec["devices"]] == ["probe-0", "probe-1", "probe-2"]
    assert "taints" in spec["devices"][0] and "consumesCounters" in spec["devices"][1]
    network = caps.probe_slice("dradriver.dev", "network/x", None, caps.NETWORK_FEATURES)
    assert network["spec"]["allNodes"] is True
    assert network["metadata"]["generateName"].startswith("network-x-probe-")


def test_only_features_whose_fields_were_dropped_are_missing() -> None:
    sent = caps.probe_slice("d", "n", "n", caps.NODE_FEATURES)
    assert caps.missing_features(sent, copy.deepcopy(sent), caps.NODE_FEATURES) == []
    stored = _stored_without(sent, 0, "taints")
    stored = _stored_without(stored, 2, "allowMultipleAllocations")
    missing = caps.missing_features(sent, stored, caps.NODE_FEATURES)
    assert [m.feature for m in missing] == [caps.DEVICE_TAINTS, caps.CONSUMABLE]
    line = caps.summary(missing)
    assert "\n" not in line
    assert line.startswith("not available on this cluster, the rest works: device taints")
    assert "(gate DRADeviceTaints off?)" in line
    assert "(gate DRAConsumableCapacity off?)" in line
    assert caps.summary([]) == ""
