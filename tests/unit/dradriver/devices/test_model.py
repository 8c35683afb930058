"""The device model: API JSON, typed attributes, names and quantities checked like the API."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from dradriver.devices.attributes import (
    BoolAttribute,
    IntAttribute,
    StringAttribute,
    VersionAttribute,
    attribute_value,
)
from dradriver.devices.model import (
    CounterConsumption,
    CounterSet,
    Device,
    DeviceTaint,
    unhealthy_taint_key,
)
from dradriver.host.containeredits import ContainerEdits, DeviceNode
from dradriver.k8s.names import qualify
from dradriver.k8s.quantity import QuantityError, parse_quantity, quantity_as_int

DRIVER = "dradriver.dev"


def _error(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    return "\n".join(str(e.get("ctx", {}).get("error", e["msg"])) for e in exc.value.errors())


# --------------------------------------------------------------------------------------------
# Attributes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "api"),
    [
        (7, {"int": 7}),
        (-(2**63), {"int": -(2**63)}),
        (True, {"bool": True}),
        (False, {"bool": False}),
        ("A100", {"string": "A100"}),
        ("", {"string": ""}),
        ({"version": "1.2.3"}, {"version": "1.2.3"}),
        ({"version": "1.0.0-rc.1+build.5"}, {"version": "1.0.0-rc.1+build.5"}),
        ({"int": 3}, {"int": 3}),
        ({"bool": False}, {"bool": False}),
        ({"string": "1.2.3"}, {"string": "1.2.3"}),
    ],
)
def test_each_attribute_type_in_api_json(raw: object, api: dict[str, Any]) -> None:
    device = Device(name="dev-0", attributes={"a": raw})
    assert device.to_api(DRIVER)["attributes"] == {"a": api}


def test_attribute_values_keep_their_python_types() -> None:
    assert attribute_value(1) == IntAttribute(value=1)
    assert attribute_value(True) == BoolAttribute(value=True)  # a bool is not an int here
    assert attribute_value("x") == StringAttribute(value="x")
    assert attribute_value({"version": "2.0.0"}) == VersionAttribute(value="2.0.0")
    device = Device(name="d", attributes={"v": VersionAttribute(value="1.0.0")})
    assert device.attributes["v"] == VersionAttribute(value="1.0.0")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (1.5, "number with a fraction"),
        (2**63, "does not fit in a signed 64-bit integer"),
        ("x" * 65, "at most 64 are allowed"),
        ({"version": "1.2"}, "not a semantic version"),
        ({"version": "01.2.3"}, "not a semantic version"),
        ({"version": 1.2}, "must be a string"),
        ({"int": "3"}, "int attribute must be an integer"),
        ({"int": True}, "int attribute must be an integer"),
        ({"bool": "yes"}, "must be true or false"),
        ({"float": 1.0}, "exactly one key out of int, bool, string, version"),
        ({"int": 1, "string": "x"}, "exactly one key"),
        ([1, 2], "not list"),
        (None, "not NoneType"),
    ],
)
def test_invalid_attribute_values_say_why(raw: object, message: str) -> None:
    with pytest.raises(ValidationError) as exc:
        Device(name="dev-0", attributes={"a": raw})
    assert message in _error(exc)
    assert exc.value.errors()[0]["loc"] == ("attributes", "a")


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------


def test_own_names_are_published_without_the_driver_domain_other_domains_kept() -> None:
    # The 1.38 kubelet-plugin helper rejects names that spell out the driver's own domain;
    # unqualified names in a slice belong to its driver, so selectors read them the same.
    device = Device(
        name="gpu-0",
        attributes={
            "model": "x",
            "gpu.example.org/firmware": "1",
            "resource.kubernetes.io/pcieRoot": "pci0000:00",
        },
        capacity={"memory": "1Gi", "example.com/slots": 4},
    )
    api = device.to_api("gpu.example.org")
    assert set(api["attributes"]) == {"firmware", "model", "resource.kubernetes.io/pcieRoot"}
    assert api["capacity"] == {
        "memory": {"value": "1Gi"},
        "example.com/slots": {"value": "4"},
    }
    assert device.qualified_attributes("gpu.example.org").keys() == {
        "gpu.example.org/firmware",
        "gpu.example.org/model",
        "resource.kubernetes.io/pcieRoot",
    }
    assert qualify("model", DRIVER) == "dradriver.dev/model"
    assert qualify("a.b/model", DRIVER) == "a.b/model"


def test_a_short_and_a_qualified_name_for_the_same_attribute_clash() -> None:
    device = Device(name="d", attributes={"model": "a", "dradriver.dev/model": "b"})
    with pytest.raises(ValueError, match=r"both mean 'dradriver\.dev/model'"):
        device.to_api(DRIVER)
    device.to_api("other.dev")  # no clash under another driver name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Dev-0", "not a DNS label"),
        ("dev_0", "not a DNS label"),
        ("-dev", "not a DNS label"),
        ("dev-", "not a DNS label"),
        ("", "not a DNS label"),
        ("d" * 64, "64 characters long; at most 63"),
    ],
)
def test_invalid_device_names(name: str, message: str) -> None:
    with pytest.raises(ValidationError) as exc:
        Device(name=name)
    assert message in _error(exc)
    Device(name="d" * 63)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("1model", "not a C identifier"),
        ("mo-del", "not a C identifier"),
        ("m" * 33, "33 characters long; at most 32"),
        ("a/b/c", "more than one '/'"),
        ("/model", "empty domain"),
        ("example.com/", "empty identifier"),
        ("Example.com/model", "not a DNS subdomain"),
        ("example_com/model", "not a DNS subdomain"),
        ("a" * 64 + "/model", "64 characters long; at most 63"),
        ("example.com/1x", "not a C identifier"),
    ],
)
def test_invalid_attribute_and_capacity_names(name: str, message: str) -> None:
    with pytest.raises(ValidationError) as exc:
        Device(name="d", attributes={name: 1})
    assert message in _error(exc)
    with pytest.raises(ValidationError) as exc:
        Device(name="d", capacity={name: "1"})
    assert message in _error(exc)
    assert "capacity name" in _error(exc)


def test_longest_valid_qualified_name() -> None:
    name = "a" * 63 + "/" + "B" * 32
    assert list(Device(name="d", attributes={name: 1}).to_api(DRIVER)["attributes"]) == [name]


# --------------------------------------------------------------------------------------------
# Quantities
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4", Decimal(4)),
        ("1Gi", Decimal(1024**3)),
        ("1024Mi", Decimal(1024**3)),
        ("100m", Decimal("0.1")),
        ("1.5k", Decimal(1500)),
        ("1e3", Decimal(1000)),
        ("1E-3", Decimal("0.001")),
        ("1E", Decimal(10**18)),
        ("2Ei", Decimal(2 * 2**60)),
        (".5", Decimal("0.5")),
        ("1.", Decimal(1)),
        ("+1", Decimal(1)),
        ("-2", Decimal(-2)),
        ("5n", Decimal("0.000000005")),
        ("3u", Decimal("0.000003")),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("1GB", "unknown suffix 'GB'"),
        ("1gi", "unknown suffix 'gi'"),
        ("1 Gi", "unknown suffix ' Gi'"),
        ("1.2.3", "unknown suffix '.3'"),
        ("", "expected a number"),
        ("Gi", "expected a number"),
        (".", "expected a number"),
        ("e3", "expected a number"),
        ("1e", "unknown suffix 'e'"),
        ("1e99999", "out of range"),
    ],
)
def test_invalid_quantities_are_named(text: str, reason: str) -> None:
    with pytest.raises(QuantityError, match="invalid quantity") as exc:
        parse_quantity(text)
    assert reason in str(exc.value)
    assert exc.value.text == text


def test_quantity_as_int_rounds_up_like_go() -> None:
    assert quantity_as_int("100m") == 1
    assert quantity_as_int("1Ki") == 1024
    assert quantity_as_int("-1500m") == -1


def test_capacity_accepts_numbers_and_rejects_bad_quantities() -> None:
    device = Device(name="d", capacity={"cores": 8, "ratio": 0.5, "mem": "16Gi"})
    assert device.to_api(DRIVER)["capacity"]["cores"] == {"value": "8"}
    assert device.capacity["ratio"].value == "0.5"
    with pytest.raises(ValidationError) as exc:
        Device(name="d", capacity={"mem": "16GB"})
    assert "invalid quantity '16GB'" in _error(exc)
    with pytest.raises(ValidationError) as exc:
        Device(name="d", capacity={"mem": True})
    assert "a boolean is not a quantity" in _error(exc)


# --------------------------------------------------------------------------------------------
# Consumable capacity, counters, taints, limits
# --------------------------------------------------------------------------------------------


def test_consumable_capacity_in_api_json() -> None:
    device = Device(
        name="nic-0",
        allow_multiple_allocations=True,
        capacity={
            "bandwidth": {
                "value": "10G",
                "requestPolicy": {"default": "1G", "validRange": {"min": "1G", "step": "1G"}},
            },
            "queues": {
                "value": 8,
                "requestPolicy": {"default": 2, "validValues": [1, 2, 4, 8]},
            },
        },
    )
    api = device.to_api(DRIVER)
    assert api["allowMultipleAllocations"] is True
    assert api["capacity"]["bandwidth"] == {
        "value": "10G",
        "requestPolicy": {"default": "1G", "validRange": {"min": "1G", "step": "1G"}},
    }
    assert api["capacity"]["queues"]["requestPolicy"] == {
        "default": "2",
        "validValues": ["1", "2", "4", "8"],
    }
    assert "allowMultipleAllocations" not in Device(name="x").to_api(DRIVER)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"default": "1", "validValues": ["2", "1"]}, "ascending order"),
        ({"default": "3", "validValues": ["1", "2"]}, "not one of validValues"),
        ({"default": "1", "validValues": ["1", "99"]}, "exceeds the capacity"),
        ({"validValues": ["1"]}, "default is required"),
        ({"default": "1", "validValues": ["1"], "validRange": {"min": "1"}}, "at most one of"),
        ({"default": "1", "validValues": [str(i) for i in range(1, 12)]}, "at most 10"),
        ({"default": "1", "validRange": {"min": "2"}}, "less than validRange.min"),
        ({"default": "2", "validRange": {"min": "1", "step": "2"}}, "multiple of"),
        ({"default": "1", "validRange": {"min": "1", "max": "20"}}, "exceeds the capacity"),
    ],
)
def test_request_policy_checks(policy: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as exc:
        Device(
            name="d",
            allow_multiple_allocations=True,
            capacity={"c": {"value": "10", "requestPolicy": policy}},
        )
    assert message in _error(exc)


def test_request_policy_needs_allow_multiple_allocations() -> None:
    with pytest.raises(ValidationError) as exc:
        Device(name="d", capacity={"c": {"value": "10", "requestPolicy": {"default": "1"}}})
    assert "needs allowMultipleAllocations: true" in _error(exc)


def test_counters_in_api_json() -> None:
    device = Device(
        name="gpu-0-half",
        consumes_counters=[
            CounterConsumption(counter_set="gpu-0", counters={"memory": "8Gi", "sms": 50})
        ],
    )
    assert device.to_api(DRIVER)["consumesCounters"] == [
        {"counterSet": "gpu-0", "counters": {"memory": {"value": "8Gi"}, "sms": {"value": "50"}}}
    ]
    counter_set = CounterSet.model_validate(
        {"name": "gpu-0", "counters": {"sms": {"value": 100}, "memory": "16Gi"}}
    )
    assert counter_set.to_api() == {
        "name": "gpu-0",
        "counters": {"memory": {"value": "16Gi"}, "sms": {"value": "100"}},
    }


def test_counter_limits() -> None:
    with pytest.raises(ValidationError, match="at most 2 are allowed"):
        Device.model_validate(
            {
                "name": "d",
                "consumesCounters": [
                    {"counterSet": f"s{i}", "counters": {"c": 1}} for i in range(3)
                ],
            }
        )
    with pytest.raises(ValidationError, match="names a counter set twice"):
        Device.model_validate(
            {"name": "d", "consumesCounters": [{"counterSet": "s", "counters": {"c": 1}}] * 2}
        )
    with pytest.raises(ValidationError, match="at most 32 are allowed"):
        CounterSet(name="s", counters={f"c{i}": "1" for i in range(33)})
    with pytest.raises(ValidationError, match="at least one counter"):
        CounterSet(name="s", counters={})
    with pytest.raises(ValidationError, match="counter name 'Mem' is not a DNS label"):
        CounterSet(name="s", counters={"Mem": "1"})
    with pytest.raises(ValidationError, match="counter set name 'S_1' is not a DNS label"):
        CounterSet(name="S_1", counters={"c": "1"})


def test_attribute_and_capacity_limit() -> None:
    attributes: dict[str, object] = {f"a{i}": i for i in range(20)}
    capacity: dict[str, object] = {f"c{i}": i for i in range(12)}
    Device.model_validate({"name": "d", "attributes": attributes, "capacity": capacity})
    capacity["one_more"] = 1
    with pytest.raises(ValidationError, match="33 attributes and capacities; at most 32"):
        Device.model_validate({"name": "d", "attributes": attributes, "capacity": capacity})


def test_taints() -> None:
    taint = DeviceTaint(key="example.com/maintenance", value="planned", effect="NoExecute")
    device = Device(name="d", taints=[taint, DeviceTaint(key="flaky", effect="None")])
    assert device.to_api(DRIVER)["taints"] == [
        {"key": "example.com/maintenance", "value": "planned", "effect": "NoExecute"},
        {"key": "flaky", "effect": "None"},
    ]
    with pytest.raises(ValidationError, match="Input should be 'NoSchedule', 'NoExecute'"):
        Device.model_validate({"name": "d", "taints": [{"key": "k", "effect": "Evict"}]})
    with pytest.raises(ValidationError, match="taint key 'bad key'"):
        Device.model_validate({"name": "d", "taints": [{"key": "bad key", "effect": "None"}]})
    with pytest.raises(ValidationError, match="taint value"):
        Device.model_validate(
            {"name": "d", "taints": [{"key": "k", "value": "a b", "effect": "None"}]}
        )
    with pytest.raises(ValidationError, match="one is kept for the unhealthy taint"):
        Device(name="d", taints=[DeviceTaint(key=f"k{i}", effect="None") for i in range(16)])


def test_unhealthy_device_gets_a_no_schedule_taint_under_the_driver_domain() -> None:
    taint = DeviceTaint(key="example.com/x", effect="NoExecute")
    device = Device(name="dev-0", taints=[taint])
    assert device.to_api(DRIVER)["taints"] == [taint.to_api()]
    sick = device.model_copy(update={"healthy": False})
    assert sick.to_api("gpu.example.org")["taints"] == [
        taint.to_api(),
        {"key": "gpu.example.org/unhealthy", "value": "HealthCheckFailed", "effect": "NoSchedule"},
    ]
    assert unhealthy_taint_key(DRIVER) == "dradriver.dev/unhealthy"
    assert "taints" not in Device(name="x").to_api(DRIVER)


def test_api_json_has_only_set_fields_and_edits_stay_local() -> None:
    edits = ContainerEdits(env={"A": "1"}, device_nodes=(DeviceNode(path="/dev/x"),))
    device = Device(name="d", edits=edits, health_files=("/dev/x",))
    assert device.to_api(DRIVER) == {"name": "d"}
    assert device.edits.to_cdi()["env"] == ["A=1"]


def test_devices_are_frozen_and_reject_unknown_fields() -> None:
    device = Device(name="d")
    with pytest.raises(ValidationError):
        device.name = "e"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="Extra inputs"):
        Device.model_validate({"name": "d", "atributes": {}})
