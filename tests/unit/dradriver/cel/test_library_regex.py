"""Regular expressions in selectors: RE2 syntax and linear time, Go's ``regexp`` results."""

from __future__ import annotations

import pytest

from dradriver import cel

DRIVER = "re.example.com"
A = f'device.attributes["{DRIVER}"]'


def evaluate(expression: str, attributes: dict[str, str] | None = None) -> cel.EvalResult:
    device = {"name": "d", "attributes": {k: {"string": v} for k, v in (attributes or {}).items()}}
    return cel.compile_selector(expression).evaluate(cel.DeviceInput(DRIVER, device))


# 40 characters: Python's backtracking `re` needs about 2^40 steps for this, RE2 a few.
PATHOLOGICAL = "a" * 40 + "!"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("function", ["find", "findAll", "matches"])
def test_pathological_pattern_completes_with_the_re2_answer(function: str) -> None:
    expected = {"find": '""', "findAll": "[]", "matches": "false"}[function]
    result = evaluate(f'{A}.s.{function}("^(a+)+$") == {expected}', {"s": PATHOLOGICAL})
    assert result == cel.MATCH
    # The same pattern from an attribute (not a literal, so only known at run time).
    result = evaluate(f"{A}.s.{function}({A}.p) == {expected}", {"s": PATHOLOGICAL, "p": "^(a+)+$"})
    assert result == cel.MATCH


@pytest.mark.parametrize(
    "expression",
    [
        # Go's FindAllString skips an empty match right after a previous match.
        '"baaab".findAll("a*") == ["", "aaa", ""]',
        '"abc".findAll("") == ["", "", "", ""]',
        '"a1b22c333".findAll("[0-9]+") == ["1", "22", "333"]',
        '"a1b22c333".findAll("[0-9]+", 2) == ["1", "22"]',
        '"a1b22".findAll("[0-9]+", 0) == []',
        '"xx".find("^x") == "x" && "ax".findAll("^x") == []',
        '"héllo wörld".find("[^ ]+$") == "wörld"',
        '"abc".find("z") == ""',
        # RE2 syntax that Python's re lacks or spells differently.
        r'"x9".find("\\pN") == "9" && "ab".find("(?P<n>b)") == "b"',
        '"Ab".find("(?i)a") == "A"',
    ],
)
def test_go_regexp_results(expression: str) -> None:
    result = evaluate(expression)
    assert result == cel.MATCH, result


@pytest.mark.parametrize(
    ("pattern", "detail"),
    [
        (r"(a)\\1", "invalid escape sequence"),  # backreference
        ("a(?=b)", "invalid perl operator"),  # lookahead
        ("a(?<!b)", "invalid"),  # lookbehind
        ("(a", "missing )"),
    ],
)
@pytest.mark.parametrize("function", ["find", "findAll", "matches"])
def test_literal_pattern_that_re2_rejects_is_a_compile_error(
    function: str, pattern: str, detail: str
) -> None:
    expression = {
        "find": f'{A}.s.find("{pattern}") != ""',
        "findAll": f'{A}.s.findAll("{pattern}").size() > 0',
        "matches": f'{A}.s.matches("{pattern}")',
    }[function]
    with pytest.raises(cel.CompileError) as error:
        cel.compile_selector(expression)
    message = error.value.message
    assert f"{function}(): invalid regular expression" in message, message
    assert "RE2 syntax" in message and detail in message, message
    assert cel.validate_selector(expression) == message  # what the webhook reports


def test_global_matches_literal_is_checked_too() -> None:
    with pytest.raises(cel.CompileError, match="invalid regular expression"):
        cel.compile_selector(f'matches({A}.s, "a(?=b)")')


def test_pattern_that_re2_rejects_at_run_time_does_not_match_with_the_reason() -> None:
    result = evaluate(f'{A}.s.find({A}.p) == ""', {"s": "ab", "p": "a(?=b)"})
    assert not result.matched
    assert result.error is not None
    assert "invalid regular expression 'a(?=b)' (RE2 syntax)" in result.error, result.error
