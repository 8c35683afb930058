"""Kubernetes' limits for selectors (estimated cost, length) and evaluation that never raises."""

from __future__ import annotations

from typing import Any

import pytest

from dradriver import cel
from dradriver.cel import cost
from dradriver.webhook.validation import Settings, claim_spec_errors, parameters_errors

DRIVER = "dradriver.dev"
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'

REPLACE_CHAIN = f"{A}.model" + '.replace("a", "aaaaaaaaaa")' * 10 + ' == ""'

# The selectors of the tests and the README: all far below the limit.
ORDINARY = [
    f'device.driver == "{DRIVER}"',
    f'{A}.model == "a100"',
    f"{A}.index >= 2",
    f'{A}["model"] == "a100"',
    f'"{DRIVER}" in device.attributes',
    f'{C}.memory.compareTo(quantity("16Gi")) >= 0',
    f'{C}.memory.isGreaterThan(quantity("1Gi"))',
    f'{A}.driverVersion.isGreaterThan(semver("1.2.3"))',
    f'{A}.driverVersion.compareTo(semver("v1.2", true)) > 0',
    f"{A}.exists_one(k, k == 'model')",
    f"device.attributes.exists(d, d == '{DRIVER}')",
    "device.attributes.all(d, device.attributes[d].all(k, k.size() < 64))",
    f"cel.bind(a, {A}, a.index == 3 && a.model == 'a100')",
    f"{A}.ids.includes(2) && 2 in {A}.ids && {A}.ids.size() == 3",
    f'{A}.model.matches("^a[0-9]+$") && {A}.model.find("[0-9]+") != ""',
    f'{A}.model.split(",").exists(x, x == "a100")',
    f'{A}.index == 0 || {A}.index == 1 || {A}.model.startsWith("a")',
    f'{A}.?model.orValue("none") != "none"',
    "lists.range(200).all(i, lists.range(200).all(j, true))",
]


@pytest.mark.parametrize("expression", ORDINARY)
def test_ordinary_selectors_are_within_the_limits(expression: str) -> None:
    selector = cel.compile_selector(expression)
    assert 0 < selector.estimated_cost <= cel.MAX_COST
    assert cel.validate_selector(expression) is None


@pytest.mark.parametrize(
    ("expression", "estimated"),
    [
        ("lists.range(2000000000).size() > 0", None),
        (REPLACE_CHAIN, None),
        ("lists.range(1000).all(i, lists.range(1000).all(j, i != j || true))", None),
        # Nested loops over the device multiply: 32 domains x 32 names x 32 x 32 ...
        (
            "device.attributes.all(a, device.attributes[a].all(b, device.attributes.all("
            "c, device.attributes[c].all(d, device.attributes.all(e, e != d)))))",
            None,
        ),
        # A list whose size is only known at run time is unbounded.
        (f"lists.range({A}.index).exists(i, i == 3)", cost.UNBOUNDED),
        ("[1, 2, 3].map(x, lists.range(x)).size() > 0", cost.UNBOUNDED),
    ],
)
def test_expensive_selectors_are_refused_naming_the_limit(
    expression: str, estimated: int | None
) -> None:
    with pytest.raises(cel.CompileError) as error:
        cel.compile_selector(expression)
    message = error.value.message
    assert message.startswith("too complex: estimated cost "), message
    assert "exceeds the limit 1000000" in message
    number = int(message.split("estimated cost ")[1].split()[0])
    assert number > cel.MAX_COST
    if estimated is not None:
        assert number == estimated
    assert cel.validate_selector(expression) == message


def test_cost_examples() -> None:
    def estimate(expression: str) -> int:
        with pytest.raises(cel.CompileError) as error:
            cel.compile_selector(expression)
        return int(error.value.message.split("estimated cost ")[1].split()[0])

    assert estimate("lists.range(2000000000).size() > 0") > 2_000_000_000
    # Each replace makes the (64-character) attribute string up to 10 times longer.
    assert estimate(REPLACE_CHAIN) > 64 * 10**9
    assert estimate(REPLACE_CHAIN) == 78_222_222_230
    six = f"{A}.model" + '.replace("a", "aaaaaaaaaa")' * 6 + ' == ""'
    assert estimate(six) > cel.MAX_COST
    five = f"{A}.model" + '.replace("a", "aaaaaaaaaa")' * 5 + ' == ""'
    assert cel.compile_selector(five).estimated_cost <= cel.MAX_COST


def test_length_limit_counts_bytes() -> None:
    clause = 'device.driver == "ä" || '  # "ä" is two bytes
    expression = clause * (cel.EXPRESSION_MAX_LENGTH // len(clause.encode()) + 1) + "true"
    assert len(expression) <= cel.EXPRESSION_MAX_LENGTH < len(expression.encode())
    with pytest.raises(cel.CompileError) as error:
        cel.compile_selector(expression)
    assert f"at most {cel.EXPRESSION_MAX_LENGTH} are allowed" in error.value.message


# --- the webhook: every selector it accepts is compiled through dradriver.cel -------------


def _parameters(selectors: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{DRIVER}/v1alpha1",
        "kind": "DeviceClaimParameters",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"selectors": selectors},
    }


def test_webhook_refuses_over_limit_selectors_in_parameters_and_claims() -> None:
    errors = [str(e) for e in parameters_errors(_parameters([ORDINARY[1], REPLACE_CHAIN]))]
    assert len(errors) == 1
    assert errors[0].startswith("spec.selectors[1]: too complex: estimated cost ")
    assert "exceeds the limit 1000000" in errors[0]
    assert parameters_errors(_parameters(ORDINARY[:5])) == []

    spec = {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": DRIVER,
                        "selectors": [
                            {"cel": {"expression": "lists.range(2000000000).size() > 0"}}
                        ],
                    },
                }
            ],
            "config": [
                {
                    "opaque": {
                        "driver": DRIVER,
                        "parameters": {
                            "apiVersion": f"{DRIVER}/v1alpha1",
                            "kind": "DeviceClaimParameters",
                            "spec": {"selectors": [REPLACE_CHAIN]},
                        },
                    }
                }
            ],
        }
    }
    errors = [str(e) for e in claim_spec_errors(Settings(), spec)]
    assert len(errors) == 2, errors
    assert all("exceeds the limit 1000000" in e for e in errors)
    assert any(e.startswith("spec.devices.requests[0].exactly.selectors[0]") for e in errors)
    assert any(e.startswith("spec.devices.config[0].opaque.parameters.spec") for e in errors)


# --- evaluation never raises ------------------------------------------------------------


class _Raising:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def eval(self, **_: Any) -> Any:
        raise self.error


@pytest.mark.parametrize(
    ("error", "fragment"),
    [
        (MemoryError(), "out of memory"),
        (RecursionError("maximum recursion depth exceeded"), "recursion limit exceeded"),
        (RuntimeError("INTERNAL: something broke [INTERNAL]"), "something broke"),
        (ValueError("odd value"), "ValueError: odd value"),
        (KeyError("k"), "KeyError"),
        (SystemError("binding bug"), "SystemError: binding bug"),
    ],
)
def test_any_exception_from_an_evaluation_is_a_non_match_with_the_reason(
    error: BaseException, fragment: str
) -> None:
    selector = cel.Selector("true", "true", _Raising(error))  # type: ignore[arg-type]
    result = selector.evaluate(cel.DeviceInput(DRIVER, {"name": "d"}))
    assert not result.matched
    assert result.error is not None and fragment in result.error, result.error


def test_explanation_carries_the_reason_of_a_failed_evaluation() -> None:
    from dradriver.allocator import SliceInventory, explain
    from tests.unit.dradriver.allocator.builders import A as BUILDER_A
    from tests.unit.dradriver.allocator.builders import (
        claim,
        device,
        device_class,
        node,
        node_slice,
    )
    from tests.unit.dradriver.allocator.builders import request as make_request

    inventory = SliceInventory(
        [node_slice("node-1", [device("gpu-0", {"s": "ab"})])], [device_class()]
    )
    failing = f'{BUILDER_A}.s.find({BUILDER_A}.s + "(?=b)") == ""'
    rows = explain(
        inventory, claim("c", make_request("gpu", selectors=[failing])), node=node("node-1")
    )
    reasons = [r.reason for r in rows if r.device == "gpu-0"]
    assert len(reasons) == 1
    assert "invalid regular expression" in reasons[0], reasons
