"""Detecting fields the apiserver dropped from a ResourceSlice, and naming the gate."""

from __future__ import annotations

import pytest

from dradriver.resourceslice.publisher import DroppedFieldsError, SlicePublisher, dropped_fields


def test_dropped_fields_are_listed_by_path() -> None:
    sent = {"devices": [{"name": "a", "taints": [{"key": "k"}], "attributes": {"x": {"int": 1}}}]}
    back = {"devices": [{"name": "a", "attributes": {"x": {"int": 1}}}]}
    assert dropped_fields(sent, back) == ["spec.devices[0].taints"]
    assert dropped_fields(sent, sent) == []


def test_dropped_gated_field_names_the_feature_gate() -> None:
    publisher = SlicePublisher.__new__(SlicePublisher)
    sent = {"metadata": {"name": "s"}, "spec": {"devices": [{"name": "a", "consumesCounters": []}]}}
    with pytest.raises(DroppedFieldsError, match="DRAPartitionableDevices"):
        publisher._check_dropped(sent, {"spec": {"devices": [{"name": "a"}]}})
