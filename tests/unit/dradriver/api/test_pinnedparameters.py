"""Pinned parameters: what the controller writes and what the node substitutes."""

from __future__ import annotations

from typing import Any

import pytest

from controller.pinning import wanted_pins
from dradriver.api import parameters as params
from dradriver.api import pinnedparameters as pins

DRIVER = "dradriver.dev"
API = f"{DRIVER}/{params.VERSION}"


def reference(name: str) -> dict[str, Any]:
    return {
        "source": "FromClaim",
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": API, "kind": params.REFERENCE_KIND, "name": name},
        },
    }


def device_config() -> dict[str, Any]:
    return {
        "source": "FromClass",
        "opaque": {"driver": DRIVER, "parameters": {"apiVersion": API, "kind": "DeviceConfig"}},
    }


def claim(config: list[dict[str, Any]], data: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "allocation": {
            "devices": {
                "results": [{"request": "r", "driver": DRIVER, "pool": "n", "device": "d"}],
                "config": config,
            }
        }
    }
    if data is not None:
        status["devices"] = [{"driver": DRIVER, "pool": "n", "device": "d", "data": data}]
    return {"metadata": {"name": "c", "namespace": "ns"}, "status": status}


def params_obj(env: dict[str, str], rv: str = "7") -> dict[str, Any]:
    return {
        "metadata": {"name": "fast", "namespace": "ns", "resourceVersion": rv},
        "spec": {"env": env},
    }


def test_references_are_found_in_order_once() -> None:
    config = [reference("a"), device_config(), reference("b"), reference("a")]
    assert pins.references(DRIVER, config) == ["a", "b"]
    assert pins.references("other.dev", config) == []


def test_controller_resolves_references_into_device_configs() -> None:
    c = claim([reference("fast")])
    wanted, error = wanted_pins(DRIVER, c, lambda ns, name: params_obj({"MODE": "turbo"}))
    assert error is None
    assert wanted["fast"]["resourceVersion"] == "7"
    assert wanted["fast"]["config"]["kind"] == "DeviceConfig"
    assert wanted["fast"]["config"]["env"] == {"MODE": "turbo"}


def test_missing_or_invalid_parameters_are_explained() -> None:
    c = claim([reference("fast")])
    assert wanted_pins(DRIVER, c, lambda ns, name: None) == (
        {},
        f"{params.KIND} ns/fast does not exist",
    )
    _, error = wanted_pins(DRIVER, c, lambda ns, name: params_obj({"1BAD": "x"}))
    assert error is not None and "ns/fast is invalid" in error and "env" in error


def test_node_substitutes_the_pin_and_leaves_other_entries() -> None:
    pin = {"resourceVersion": "7", "config": {"apiVersion": API, "kind": "DeviceConfig"}}
    c = claim([device_config(), reference("fast")], {"parameters": {"fast": pin}})
    config = c["status"]["allocation"]["devices"]["config"]
    out = pins.substitute(DRIVER, config, pins.pinned(c, DRIVER))
    assert out[0] == device_config()
    assert out[1]["opaque"]["parameters"] == pin["config"]
    assert config[1] == reference("fast")  # the input is not changed


def test_node_refuses_an_unpinned_reference() -> None:
    c = claim([reference("fast")])
    with pytest.raises(pins.NotPinned, match="'fast' is not resolved yet"):
        pins.substitute(DRIVER, c["status"]["allocation"]["devices"]["config"], {})


def test_malformed_pins_are_ignored() -> None:
    c = claim([reference("fast")], {"parameters": {"fast": {"config": "nope"}, "x": 1}})
    assert pins.pinned(c, DRIVER) == {}
