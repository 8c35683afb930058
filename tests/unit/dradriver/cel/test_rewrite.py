"""The source rewrites and checks that give cel-expr-python Kubernetes' CEL behaviour."""

from __future__ import annotations

import pytest

from dradriver.cel import rewrite


def test_tokens_round_trip() -> None:
    text = 'device.attributes["a"] // c "x"\n && r"\\d" == b\'z\' || """m"l"""'
    assert "".join(t.text for t in rewrite.tokenize(text)) == text


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            'device.attributes["d"].m == 1',
            '(("d") in device.attributes ? device.attributes["d"] : {}).m == 1',
        ),
        (
            "device . capacity [ k ].x",
            "(( k ) in device.capacity ? device.capacity[ k ] : {}).x",
        ),
        (
            'device.attributes[device.attributes["a"].b].c',
            '(((("a") in device.attributes ? device.attributes["a"] : {}).b) in '
            'device.attributes ? device.attributes[(("a") in device.attributes ? '
            'device.attributes["a"] : {}).b] : {}).c',
        ),
        ('device.attributes[?"d"].hasValue()', 'device.attributes[?"d"].hasValue()'),
        ('"device.attributes[\\"d\\"]" == x', '"device.attributes[\\"d\\"]" == x'),
        ("x // device.attributes[1]\n", "x // device.attributes[1]\n"),
        ('other.device.attributes["d"]', 'other.device.attributes["d"]'),
        (
            'quantity("1Gi")',
            'kubernetes.Quantity{nanos: "1073741824000000000", key: "12191073741824000000000"}',
        ),
        ("quantity('1.5')", 'kubernetes.Quantity{nanos: "1500000000", key: "12101500000000"}'),
        ('quantity("bad")', 'quantity("bad")'),
        ("quantity(x)", "quantity(x)"),
        ('x.quantity("1")', 'x.quantity("1")'),
        (
            'semver("1.2.3-rc.1")',
            'kubernetes.Semver{major: 1, minor: 2, patch: 3, pre: "rc.1", '
            'key: "1111121131rc!0111"}',
        ),
        (
            'semver("v1.2", true)',
            'kubernetes.Semver{major: 1, minor: 2, patch: 0, pre: "", key: "111112110~"}',
        ),
        ('semver("v1.2")', 'semver("v1.2")'),
        ('semver("1.2.3", flag)', 'semver("1.2.3", flag)'),
        ('quantity(b"1")', 'quantity(b"1")'),
    ],
)
def test_rewrite(source: str, expected: str) -> None:
    assert rewrite.rewrite(source) == expected


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("device.nosuch", "undefined field 'nosuch'"),
        ("device.?nosuch", "undefined field 'nosuch'"),
        ('kubernetes.Semver{major: 1} == semver("1.0.0")', "undeclared reference"),
        ("device.driver == 'x' && device.allowMultipleAllocations", None),
        ('x.device.nosuch == "kubernetes.Quantity"', None),
    ],
)
def test_check(source: str, problem: str | None) -> None:
    found = rewrite.check(source)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_calls() -> None:
    assert rewrite.calls('a.compareTo(quantity("1")) && size(x) > 0 && "f(x)" != y') == {
        "compareTo",
        "quantity",
        "size",
    }


# --- comparisons written in CEL (no Python callback) --------------------------------------


@pytest.mark.parametrize(
    ("source", "receiver", "argument"),
    [
        ("a.compareTo(b) > 0", "a", "b"),
        ("a.b[c].d.isGreaterThan(x.y(z))", "a.b[c].d", "x.y(z)"),
        ("f(q).isLessThan(g(1, 2))", "f(q)", "g(1, 2)"),
        ("(x + y).compareTo(z) == 0", "(x + y)", "z"),
        ("x in l && m[?k].orValue(q).compareTo(r) == 0", "m[?k].orValue(q)", "r"),
        ("a.?b.compareTo(c) == 0", "a.?b", "c"),
        ('"s".compareTo(c) == 0', '"s"', "c"),
    ],
)
def test_inline_comparisons(source: str, receiver: str, argument: str) -> None:
    inlined = rewrite.inline_comparisons(source)
    assert inlined.count("cel.bind(_dra_l, ") == 1
    assert f"cel.bind(_dra_l, {receiver}, cel.bind(_dra_r, {argument}, " in inlined
    assert rewrite.calls(inlined) & set(rewrite.COMPARISONS) == set()


def test_nested_inline_comparisons() -> None:
    inlined = rewrite.inline_comparisons("a.compareTo(b.compareTo(c)).compareTo(d) > 0")
    assert inlined.count("cel.bind(_dra_l, ") == 3
    assert rewrite.calls(inlined) & set(rewrite.COMPARISONS) == set()


def test_reserved_names_are_refused() -> None:
    assert rewrite.check("cel.bind(_dra_l, 1, _dra_l > 0)") == "undeclared reference to '_dra_l'"
