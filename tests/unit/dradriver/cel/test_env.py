"""DRA CEL selectors evaluated by the real cel-expr-python runtime, with Kubernetes semantics."""

from __future__ import annotations

import itertools
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from dradriver import cel
from dradriver.cel._types import quantity_key, semver_key
from dradriver.cel.semver import Semver, compare_semver, parse_semver

DRIVER = "gpu.example.com"

DEVICE: dict[str, Any] = {
    "name": "gpu-0",
    "attributes": {
        "model": {"string": "a100"},
        "index": {"int": 3},
        "healthy": {"bool": True},
        "driverVersion": {"version": "1.2.4"},
        "other.example.com/numa": {"int": 1},
        "ids": {"ints": [1, 2, 3]},
    },
    "capacity": {"memory": {"value": "40Gi"}, "other.example.com/bw": {"value": "10G"}},
}


def evaluate(expression: str, device: dict[str, Any] | None = None) -> cel.EvalResult:
    selector = cel.compile_selector(expression)
    return selector.evaluate(cel.DeviceInput(DRIVER, device if device is not None else DEVICE))


def matches(expression: str, device: dict[str, Any] | None = None) -> bool:
    result = evaluate(expression, device)
    assert result.error is None, result.error
    return result.matched


A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'


@pytest.mark.parametrize(
    "expression",
    [
        f'device.driver == "{DRIVER}"',
        f'{A}.model == "a100"',
        f"{A}.index >= 2",
        f"{A}.healthy",
        f'{A}["model"] == "a100"',
        f'"{DRIVER}" in device.attributes',
        'device.attributes["other.example.com"].numa == 1',
        f'{C}.memory.compareTo(quantity("16Gi")) >= 0',
        f'{C}.memory == quantity("40Gi")',
        f'{C}.memory == quantity("40960Mi")',
        'device.capacity["other.example.com"].bw.isGreaterThan(quantity("1G"))',
        f'{A}.driverVersion.isGreaterThan(semver("1.2.3"))',
        f'{A}.driverVersion.isLessThan(semver("1.10.0"))',
        f'{A}.driverVersion == semver("1.2.4")',
        f'{A}.driverVersion.compareTo(semver("v1.2", true)) > 0',
        f"{A}.driverVersion.major() == 1 && {A}.driverVersion.minor() == 2",
        f"{A}.driverVersion.patch() == 4",
        f"{A}.exists_one(k, k == 'model')",
        f"device.attributes.exists(d, d == '{DRIVER}')",
        f"cel.bind(a, {A}, a.index == 3 && a.model == 'a100')",
        "device.allowMultipleAllocations == false",
        f"{A}.ids.includes(2)",
        f'{A}.model.includes("a100")',
        f"{A}.ids.size() == 3 && 2 in {A}.ids",
    ],
)
def test_selector_matches(expression: str) -> None:
    assert matches(expression)


@pytest.mark.parametrize(
    "expression",
    [
        f'{A}.model == "h100"',
        f'{C}.memory.compareTo(quantity("80Gi")) >= 0',
        f'{A}.driverVersion.isGreaterThan(semver("1.3.0"))',
        f"{A}.ids.includes(7)",
        'device.driver == "other"',
    ],
)
def test_selector_does_not_match(expression: str) -> None:
    assert not matches(expression)


# --- Kubernetes library functions -------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        'quantity("200M") == quantity("0.2G")',
        'quantity("1Gi") == quantity("1024Mi")',
        'quantity("50M").isLessThan(quantity("50Mi"))',
        'quantity("1.5").compareTo(quantity("1500m")) == 0',
        'quantity("2").compareTo(quantity("1")) == 1',
        'quantity("1").compareTo(quantity("2")) == -1',
        'quantity("1Ki").asInteger() == 1024',
        'quantity("1.5").isInteger() == false',
        'quantity("3").isInteger()',
        'quantity("1.5").asApproximateFloat() == 1.5',
        'sign(quantity("-3")) == -1 && sign(quantity("0")) == 0 && sign(quantity("1m")) == 1',
        'quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi")',
        'quantity("1").add(2) == quantity("3")',
        'quantity("1Gi").sub(quantity("512Mi")) == quantity("512Mi")',
        'quantity("3").sub(1).asInteger() == 2',
        'isQuantity("1Gi") && !isQuantity("1,3G") && !isQuantity("200K") && !isQuantity("Mi")',
        'quantity("1n") == quantity("0.0000000001")',  # rounded up to 10^-9
        'semver("1.2.3-rc.1").isLessThan(semver("1.2.3"))',
        'semver("1.0.0-alpha").isLessThan(semver("1.0.0-alpha.1"))',
        'semver("1.0.0-alpha.beta").isLessThan(semver("1.0.0-beta"))',
        'semver("1.0.0-2").isLessThan(semver("1.0.0-11"))',
        'semver("1.0.0-11").isLessThan(semver("1.0.0-rc"))',
        'semver("1.2.3+build.5") == semver("1.2.3")',
        'semver("v01.02", true) == semver("1.2.0")',
        'isSemver("1.2.3") && !isSemver("v1.2.3") && isSemver("v1.2.3", true)',
        '!isSemver("01.2.3") && !isSemver("1.2") && isSemver("1.2", true)',
        '!isSemver("1.2-rc", true)',
        "[1, 2, 3].isSorted() && ![3, 1].isSorted()",
        "[1, 2, 3].sum() == 6 && [1, 5, 3].max() == 5 && [4, 2].min() == 2",
        "[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2 && [1].indexOf(9) == -1",
        '"abc123".find("[0-9]+") == "123" && "a1b2".findAll("[0-9]") == ["1", "2"]',
        '"a1b2c3".findAll("[0-9]", 2) == ["1", "2"]',
        '"ABC".lowerAscii() == "abc" && "a,b".split(",") == ["a", "b"]',
        '"x-%s".format(["y"]) == "x-y" && ["a", "b"].join("/") == "a/b"',
        "sets.contains([1, 2, 3], [2]) && sets.intersects([1], [1, 4])",
        "lists.range(3) == [0, 1, 2] && [3, 1, 2].sort() == [1, 2, 3]",
        "[1, 2].all(i, v, v > i)",
        "optional.of(1).hasValue() && !optional.none().hasValue()",
    ],
)
def test_library_functions(expression: str) -> None:
    assert matches(expression)


def test_semver_precedence() -> None:
    order = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.1.0",
        "2.0.0",
    ]
    versions = [parse_semver(v) for v in order]
    for a, b in itertools.pairwise(versions):
        assert compare_semver(a, b) == -1
        assert compare_semver(b, a) == 1
    assert parse_semver("1.2.3-x.y+build") == Semver(1, 2, 3, "x.y")
    assert parse_semver("v1", normalize=True) == Semver(1, 0, 0)
    assert parse_semver("1.02.003-rc", normalize=True) == Semver(1, 2, 3, "rc")
    with pytest.raises(cel.SemverError):
        parse_semver("1.2.3.4")


# --- unknown domain (Go's empty-map default) --------------------------------------------


def test_unknown_domain_is_an_empty_map() -> None:
    # `in` on an unknown domain is false, not an error.
    assert not matches('"m" in device.capacity["nope.example.com"]')
    assert not matches('"x" in device.attributes["nope.example.com"]')
    # The guard idiom works for devices without the domain ...
    guard = (
        '!("m" in device.capacity["nope.example.com"]) || '
        'device.capacity["nope.example.com"].m.isGreaterThan(quantity("1"))'
    )
    assert matches(guard)
    # ... and `in` on the outer map still tells whether the domain exists.
    assert not matches('"nope.example.com" in device.attributes')
    assert matches(f'has({A}.model) && !has(device.attributes["nope.example.com"].model)')
    assert matches('device.attributes["nope.example.com"].?model.orValue("none") == "none"')
    assert matches('device.attributes["nope.example.com"].size() == 0')


def test_unknown_domain_rewrite_leaves_strings_and_optional_index_alone() -> None:
    expression = 'device.attributes[?"nope.example.com"].hasValue() == false'
    assert matches(expression)
    assert matches(f'"device.attributes[\\"x\\"]" != "" && {A}.model == "a100"')


def test_missing_attribute_is_an_error_with_hint() -> None:
    result = evaluate(f'{A}.nosuch == "x"')
    assert not result.matched
    assert result.error is not None
    assert result.error.startswith("no such key: nosuch")
    assert "has()" in result.error and "orValue()" in result.error
    # Missing attribute in an unknown domain: also "no such key", like Go.
    result = evaluate('device.attributes["nope.example.com"].model == "x"')
    assert result.error is not None and result.error.startswith("no such key: model")


def test_error_is_absorbed_by_short_circuit() -> None:
    assert not matches(f'device.driver == "other" && {A}.nosuch == "x"')
    assert matches(f'device.driver == "{DRIVER}" || {A}.nosuch == "x"')


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ('quantity("bad") == quantity("1")', "invalid quantity"),
        ('semver("1.2") == semver("1.2.0")', "invalid semantic version"),
        (f'{A}.model.compareTo(quantity("1")) == 0', "no such overload"),
        ('quantity("1").compareTo(semver("1.0.0")) == 0', "no such overload"),
        ("1 / 0 == 1", "divide by zero"),
        (f"{A}.index", "could not be converted to bool"),
        ("lists.range(200).all(i, lists.range(200).all(j, true))", "iteration budget"),
        ("[].min() == 1", "empty list"),
    ],
)
def test_runtime_errors_mean_no_match_with_reason(expression: str, fragment: str) -> None:
    result = evaluate(expression)
    assert not result.matched
    assert result.error is not None and fragment in result.error, result.error


def test_invalid_version_attribute_fails_every_selector() -> None:
    device = {"name": "d", "attributes": {"driverVersion": {"version": "1.2"}}}
    result = evaluate("true", device)
    assert not result.matched
    assert result.error is not None and "driverVersion" in result.error


# --- compile errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("1", "must evaluate to bool or the unknown type, not int"),
        ('"a"', "must evaluate to bool or the unknown type, not string"),
        ("foo(1)", "undeclared reference to 'foo'"),
        ("device.attributes[", "Syntax error"),
        ("quantity(1) == quantity(2)", "no matching overload"),
        ('1 + "a" == 2', "no matching overload"),
        ("device.nosuch == 1", "undefined field 'nosuch' of device"),
        (
            'kubernetes.Quantity{nanos: "1"} == quantity("1")',
            "undeclared reference to 'kubernetes'",
        ),
        ('ip("1.2.3.4").family() == 4', "undeclared reference to 'ip'"),
    ],
)
def test_compile_errors(expression: str, fragment: str) -> None:
    with pytest.raises(cel.CompileError) as error:
        cel.compile_selector(expression)
    assert fragment in error.value.message, error.value.message
    assert cel.validate_selector(expression) == error.value.message


def test_compile_error_points_at_the_user_text() -> None:
    with pytest.raises(cel.CompileError) as error:
        cel.compile_selector(f'{A}.model == "x" && foo()')
    message = error.value.message
    assert "<input>:1:" in message and "undeclared reference to 'foo'" in message
    assert f'{A}.model == "x" && foo()' in message  # the caret excerpt shows the original


def test_validate_selector_length_limit() -> None:
    long = " || ".join(['device.driver == "x"'] * 600)
    assert len(long) > cel.EXPRESSION_MAX_LENGTH
    problem = cel.validate_selector(long)
    assert problem is not None and "at most 10240" in problem
    assert cel.validate_selector('device.driver == "x"') is None


def test_dyn_result_compiles_and_must_be_bool_at_runtime() -> None:
    assert matches(f"{A}.healthy")
    assert (
        evaluate(f"{A}.model").error == "CEL result of type string could not be converted to bool"
    )


def test_compile_cache_and_stats() -> None:
    expression = f'{A}.model == "cache-test"'
    before = cel.stats()
    first = cel.compile_selector(expression)
    second = cel.compile_selector(expression)
    after = cel.stats()
    assert first is second
    assert after.compile_cache_hits >= before.compile_cache_hits + 1
    with pytest.raises(cel.CompileError):
        cel.compile_selector("nope(")
    with pytest.raises(cel.CompileError):
        cel.compile_selector("nope(")  # errors are cached too


def test_literal_quantities_are_folded_so_no_callback_is_made() -> None:
    selector = cel.compile_selector('quantity("1Gi") == quantity("1024Mi")')
    assert not selector.uses_callbacks
    assert "kubernetes.Quantity{" in selector.rewritten
    selector = cel.compile_selector(f'{C}.memory.compareTo(quantity("1Gi")) > 0')
    assert not selector.uses_callbacks  # compareTo is written in CEL (inline_comparisons)
    assert "quantity(" not in selector.rewritten
    selector = cel.compile_selector(f'{C}.memory.sub(quantity("1Gi")).isInteger()')
    assert selector.uses_callbacks  # sub() and isInteger() still call Python
    assert "quantity(" not in selector.rewritten


def test_callback_results_are_memoised_per_device_content() -> None:
    selector = cel.compile_selector(f'{C}.memory.sub(quantity("2Gi")).isInteger()')
    assert selector.uses_callbacks
    device = cel.DeviceInput(DRIVER, DEVICE)
    selector.evaluate(device)
    before = cel.stats()
    for _ in range(20):
        assert selector.evaluate(cel.DeviceInput(DRIVER, dict(DEVICE))).matched
    after = cel.stats()
    assert after.callback_calls == before.callback_calls
    assert after.result_cache_hits >= before.result_cache_hits + 20


def test_unqualified_names_use_the_driver_domain_and_multiple_allocations() -> None:
    device = {"name": "d", "allowMultipleAllocations": True, "attributes": {"x": {"int": 1}}}
    assert matches(
        f'device.attributes["{DRIVER}"].x == 1 && device.allowMultipleAllocations', device
    )


def test_callback_budget_reporting() -> None:
    stats = cel.stats()
    cel.set_callback_budget(stats.callback_calls)
    assert not cel.stats().over_budget
    cel.set_callback_budget(-1)
    assert cel.stats().over_budget
    cel.set_callback_budget(500_000)
    assert cel.stats().estimated_leak_bytes == cel.stats().callback_calls * 1200


def test_comparisons_are_evaluated_without_callbacks() -> None:
    cel.configure(use_worker=False)
    try:
        expressions = [
            f'{C}.memory.compareTo(quantity("16Gi")) >= 0',
            f'{C}.memory.isGreaterThan(quantity("39Gi"))',
            f'{C}.memory.isLessThan(quantity("41Gi"))',
            f'{A}.driverVersion.isGreaterThan(semver("1.2.3"))',
            f'{A}.driverVersion.compareTo(semver("1.2.4-rc.1")) == 1',
            'quantity("-1").compareTo(quantity("-2")) == 1',
            'quantity("-1m").isLessThan(quantity("0"))',
            'semver("1.0.0-alpha.1").isLessThan(semver("1.0.0-alpha.beta"))',
        ]
        selectors = [cel.compile_selector(e) for e in expressions]
        assert not any(s.uses_callbacks for s in selectors)
        before = cel.stats().callback_calls
        device = cel.DeviceInput(DRIVER, DEVICE)
        assert all(s.evaluate(device) == cel.MATCH for s in selectors)
        assert cel.stats().callback_calls == before
    finally:
        cel.configure(use_worker=True)


quantities = st.integers(min_value=-(10**30), max_value=10**30)
identifiers = st.one_of(
    st.integers(min_value=0, max_value=10**12).map(str),
    st.from_regex(r"[0-9A-Za-z-]*[A-Za-z-][0-9A-Za-z-]*", fullmatch=True).filter(bool),
)
versions = st.builds(
    Semver,
    st.integers(0, 2**63 - 1),
    st.integers(0, 1000),
    st.integers(0, 1000),
    st.lists(identifiers, max_size=3).map(".".join),
)


@hypothesis.given(quantities, quantities)
def test_quantity_keys_sort_like_quantities(a: int, b: int) -> None:
    ka, kb = quantity_key(a), quantity_key(b)
    assert (ka > kb) - (ka < kb) == (a > b) - (a < b)


@hypothesis.given(versions, versions)
def test_semver_keys_sort_by_precedence(a: Semver, b: Semver) -> None:
    ka, kb = semver_key(a), semver_key(b)
    assert (ka > kb) - (ka < kb) == compare_semver(a, b)


def test_deeply_nested_comparison_falls_back_to_the_callback() -> None:
    # Inlining nests deeper; next to cel-cpp's parse depth limit (32) the call is kept.
    expression = "(" * 28 + f'{A}.driverVersion.compareTo(semver("1.0.0")) > 0' + ")" * 28
    selector = cel.compile_selector(expression)
    assert selector.uses_callbacks and "cel.bind(_dra_l" not in selector.rewritten
    assert selector.evaluate(cel.DeviceInput(DRIVER, DEVICE)) == cel.MATCH
