"""The apiserver's admission policies (ValidatingAdmissionPolicy, MutatingAdmissionPolicy)
evaluated outside a cluster, for unit and chart tests.

It stands in for kube-apiserver's policy plugins (``k8s.io/apiserver/pkg/admission/plugin/
policy``), which only a cluster has (the cluster tier runs the real ones): resource rules
(``matchConstraints.resourceRules``, ``*`` and subresources), ``matchConditions`` (any
false skips the policy, an error is a failure that ``failurePolicy`` decides),
``variables`` (evaluated in order, each seeing the ones before), ``validations`` with
``message``/``messageExpression``, and a MutatingAdmissionPolicy's ``JSONPatch`` mutation
for the ``add`` operation. The environment is the apiserver's for policies, as far as
cel-expr-python has it: ``object``, ``oldObject``, ``request`` and ``variables`` dynamic,
the optional, strings, sets and lists libraries; ``params``, ``namespaceObject`` and
``authorizer`` are not modelled. A ``JSONPatch{...}`` literal, a type only the apiserver
declares, is read as a map with the same fields (a textual rewrite of its three fields).
Strings and keys are taken as the apiserver holds them (:mod:`tests.fakes.admission`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import cel_expr_python.cel as cel

from dradriver.k8s.objects import Obj
from tests.fakes.admission import Decision, _as_go_decodes

_CONFIG = """\
name: admission-policies
extensions:
  - name: optional
  - name: strings
    version: 2
  - name: sets
  - name: lists
"""


@cache
def _environment() -> cel.Env:
    dyn = cel.Type.DYN
    variables = {"object": dyn, "oldObject": dyn, "request": dyn, "variables": dyn}
    return cel.NewEnv(config=cel.NewEnvConfigFromYaml(_CONFIG), variables=variables)


_JSONPATCH_FIELD = re.compile(r"\b(op|path|value):")


@cache
def _program(expression: str) -> cel.Expression:
    if "JSONPatch{" in expression:
        expression = _JSONPATCH_FIELD.sub(r"'\1':", expression.replace("JSONPatch{", "{"))
    return _environment().compile(expression)


class EvaluationError(RuntimeError):
    """An expression failed to evaluate (the apiserver applies ``failurePolicy``)."""


def _eval(expression: str, data: dict[str, Any]) -> Any:
    try:
        value = _program(expression).eval(data=data)
    except RuntimeError as e:
        raise EvaluationError(f"{expression!r}: {e}") from e
    if value.type() == cel.Type.ERROR:
        raise EvaluationError(f"{expression!r}: {value.value()}")
    return _plain(value.value())


def _plain(value: Any) -> Any:
    """cel-expr-python's values as JSON values (lists and maps come back as CEL values)."""
    if isinstance(value, cel.Value):
        return _plain(value.value())
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


def admission_request(
    operation: str,
    obj: Obj | None,
    old: Obj | None = None,
    *,
    resource: str = "resourceclaims",
    group: str = "resource.k8s.io",
    version: str = "v1",
    sub_resource: str = "",
    username: str = "tester",
    extra: dict[str, list[str]] | None = None,
) -> Obj:
    """An AdmissionRequest as the apiserver builds it for a policy."""
    user: Obj = {"username": username}
    if extra:
        user["extra"] = extra
    return {
        "operation": operation,
        "resource": {"group": group, "version": version, "resource": resource},
        "subResource": sub_resource,
        "userInfo": user,
        "object": obj,
        "oldObject": old,
    }


def _rule_matches(rule: Obj, request: Obj) -> bool:
    resource = request["resource"]
    name = resource["resource"] + (f"/{request['subResource']}" if request["subResource"] else "")

    def has(values: list[str], value: str) -> bool:
        return "*" in values or value in values

    return (
        has(rule["apiGroups"], resource["group"])
        and has(rule["apiVersions"], resource["version"])
        and has(rule["resources"], name)
        and has(rule["operations"], request["operation"])
    )


def _data(request: Obj) -> dict[str, Any]:
    data: dict[str, Any] = _as_go_decodes(
        {
            "object": request.get("object"),
            "oldObject": request.get("oldObject"),
            "request": {k: v for k, v in request.items() if k not in ("object", "oldObject")},
        }
    )
    data["variables"] = {}
    return data


def decide(policy: Obj, request: Obj) -> Decision:
    """Whether ``policy`` applies to ``request``: SKIP, CALL (it applies) or ERROR."""
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    if not any(_rule_matches(rule, request) for rule in rules):
        return Decision.SKIP
    data = _data(request)
    errors = False
    for condition in policy["spec"].get("matchConditions") or []:
        try:
            value = _eval(condition["expression"], data)
        except EvaluationError:
            errors = True
            continue
        if value is False:
            return Decision.SKIP
        if value is not True:
            errors = True
    return Decision.ERROR if errors else Decision.CALL


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""


def validate(policy: Obj, request: Obj) -> Verdict:
    """A ValidatingAdmissionPolicy's answer (with ``failurePolicy`` applied to errors)."""
    spec = policy["spec"]
    decision = decide(policy, request)
    fail = spec.get("failurePolicy", "Fail") == "Fail"
    if decision is Decision.SKIP:
        return Verdict(True)
    if decision is Decision.ERROR:
        return Verdict(not fail, "a match condition failed to evaluate")
    data = _data(request)
    try:
        for variable in spec.get("variables") or []:
            data["variables"][variable["name"]] = _eval(variable["expression"], data)
        for validation in spec.get("validations") or []:
            if _eval(validation["expression"], data) is True:
                continue
            if "messageExpression" in validation:
                return Verdict(False, str(_eval(validation["messageExpression"], data)))
            return Verdict(False, str(validation.get("message", "")))
    except EvaluationError as e:
        return Verdict(not fail, str(e))
    return Verdict(True)


def mutate(policy: Obj, request: Obj) -> Obj | None:
    """The object a MutatingAdmissionPolicy makes of the request's, or None if it does
    not apply (an error with ``failurePolicy: Ignore`` also leaves the object as it is)."""
    decision = decide(policy, request)
    if decision is not Decision.CALL:
        if decision is Decision.ERROR and policy["spec"].get("failurePolicy") != "Ignore":
            raise EvaluationError("a match condition failed to evaluate")
        return None
    obj: Obj = copy.deepcopy(request["object"])
    data = _data(request)
    for mutation in policy["spec"]["mutations"]:
        assert mutation["patchType"] == "JSONPatch", "only JSONPatch is modelled"
        for op in _eval(mutation["jsonPatch"]["expression"], data):
            _add(obj, op)
    return obj


def _add(obj: Obj, op: Obj) -> None:
    assert op["op"] == "add", f"only add is modelled, not {op['op']}"
    *parents, last = op["path"].lstrip("/").split("/")
    target: Any = obj
    for part in parents:
        target = target[part]
    if last == "-":
        target.append(op["value"])
    else:
        target[last] = op["value"]
