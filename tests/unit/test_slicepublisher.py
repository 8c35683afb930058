"""Detecting fields the apiserver dropped from a ResourceSlice, and naming the gate."""

from __future__ import annotations

from dradriver.resourceslice.publisher import dropped_fields, dropped_report


def test_dropped_fields_are_listed_by_path() -> None:
    sent = {"devices": [{"name": "a", "taints": [{"key": "k"}], "attributes": {"x": {"int": 1}}}]}
    back = {"devices": [{"name": "a", "attributes": {"x": {"int": 1}}}]}
    assert dropped_fields(sent, back) == ["spec.devices[0].taints"]
    assert dropped_fields(sent, sent) == []


def test_dropped_gated_field_names_the_feature_gate() -> None:
    sent = {"devices": [{"name": "a", "consumesCounters": []}]}
    report = dropped_report("s", sent, {"devices": [{"name": "a"}]})
    assert report is not None and "DRAPartitionableDevices" in report
    assert dropped_report("s", sent, sent) is None
