"""DRA device selectors in CEL, evaluated with Kubernetes semantics (cel-expr-python).

Usage::

    from dradriver import cel

    selector = cel.compile_selector('device.attributes["dradriver.dev"].model == "a100"')
    result = selector.evaluate(cel.DeviceInput("dradriver.dev", device_json))
    if result.error: ...          # evaluation failed: treated as no match, with a reason

``compile_selector`` raises :class:`CompileError` (syntax, unknown function or variable,
wrong types, non-bool result); ``validate_selector`` returns the message instead, for
admission. See :mod:`dradriver.cel.env` for the library choice, the Kubernetes semantics
reproduced, the iteration budget and how the cel-expr-python callback leak is bounded.
"""

from dradriver.cel.device import DeviceInput, device_input
from dradriver.cel.env import (
    EXPRESSION_MAX_LENGTH,
    MATCH,
    MAX_COST,
    NO_MATCH,
    CelStats,
    CompileError,
    EvalResult,
    Selector,
    clear_caches,
    compile_selector,
    configure,
    set_callback_budget,
    stats,
    validate_selector,
)
from dradriver.cel.messages import ITERATION_BUDGET
from dradriver.cel.semver import Semver, SemverError, compare_semver, parse_semver

__all__ = [
    "EXPRESSION_MAX_LENGTH",
    "ITERATION_BUDGET",
    "MATCH",
    "MAX_COST",
    "NO_MATCH",
    "CelStats",
    "CompileError",
    "DeviceInput",
    "EvalResult",
    "Selector",
    "Semver",
    "SemverError",
    "clear_caches",
    "compare_semver",
    "compile_selector",
    "configure",
    "device_input",
    "parse_semver",
    "set_callback_budget",
    "stats",
    "validate_selector",
]
