"""The apiserver's decision whether to call a validating webhook: rules and
``matchConditions``, for unit and fuzz tests.

It stands in for kube-apiserver's webhook dispatch (``k8s.io/apiserver/pkg/admission/
plugin/webhook``), which only a cluster has: the cluster tier checks the real one
(``tests/cluster/test_webhook.py``); here thousands of requests can be checked in
milliseconds. The conditions are evaluated with cel-expr-python in the environment the
apiserver declares for them (``object`` and ``oldObject`` dynamic, ``request`` the
AdmissionRequest), with its rule: any false condition skips the webhook, all true call
it, and an error (none false) is a failure to call it, which ``failurePolicy: Fail``
makes a denial. Namespace and object selectors are not modelled. Strings are taken as
the apiserver holds them: Go's JSON decoder turns a lone surrogate (``"\\ud800"``) into
U+FFFD, so no lone surrogate reaches its CEL (nor can cel-expr-python take one), and an
integer outside int64 becomes a float64 in its unstructured objects. cel-expr-python
ends map keys at a NUL (``""`` and ``"\\x00"`` collide), which cel-go does not: keys are
escaped one-to-one (``\\`` -> ``\\\\``, NUL -> ``\\0``), which keeps the field names
the conditions read and the equality of specs.
"""

from __future__ import annotations

import re
from enum import Enum
from functools import cache
from typing import Any

import cel_expr_python.cel as cel

from dradriver.k8s.objects import Obj


class Decision(Enum):
    SKIP = "skip"  # admitted without calling the webhook
    CALL = "call"
    ERROR = "error"  # a condition failed to evaluate: with failurePolicy Fail, denied


@cache
def _environment() -> cel.Env:
    dyn = cel.Type.DYN
    return cel.NewEnv(variables={"object": dyn, "oldObject": dyn, "request": dyn})


@cache
def _program(expression: str) -> cel.Expression:
    return _environment().compile(expression)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _key(key: str) -> str:
    escaped = key.replace("\\", "\\\\").replace("\x00", "\\0")
    return _SURROGATE.sub("\ufffd", escaped)


def _as_go_decodes(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)  # as Go's JSON decoder does
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return float(value)
    if isinstance(value, list):
        return [_as_go_decodes(v) for v in value]
    if isinstance(value, dict):
        return {_key(k): _as_go_decodes(v) for k, v in value.items()}
    return value


def _rule_matches(rule: Obj, request: Obj) -> bool:
    resource = request["resource"]
    return (
        resource["group"] in rule["apiGroups"]
        and resource["version"] in rule["apiVersions"]
        and resource["resource"] in rule["resources"]
        and request["operation"] in rule["operations"]
    )


def decide(webhook: Obj, request: Obj) -> Decision:
    """Whether the apiserver calls ``webhook`` (one entry of a configuration's ``webhooks``)
    for the AdmissionRequest ``request`` (with ``resource``, ``operation``, ``object``,
    ``oldObject``)."""
    if not any(_rule_matches(rule, request) for rule in webhook["rules"]):
        return Decision.SKIP
    data: dict[str, Any] = _as_go_decodes(
        {
            "object": request.get("object"),
            "oldObject": request.get("oldObject"),
            "request": {k: v for k, v in request.items() if k not in ("object", "oldObject")},
        }
    )
    errors = False
    for condition in webhook.get("matchConditions") or []:
        try:
            value = _program(condition["expression"]).eval(data=data)
        except RuntimeError:  # cel-expr-python raises some evaluation errors
            errors = True
            continue
        if value.type() == cel.Type.ERROR:
            errors = True
        elif value.value() is False:
            return Decision.SKIP
        elif value.value() is not True:
            errors = True
    return Decision.ERROR if errors else Decision.CALL
