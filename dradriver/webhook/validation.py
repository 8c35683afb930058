"""What the admission webhook checks, as pure functions over plain JSON objects.

- ``DeviceClaimParameters`` (group = the driver name): the spec against the pydantic
  models of :mod:`dradriver.api.parameters` (the CRD schema checks most of it too, but
  not everything), and every ``spec.selectors[]`` compiled as CEL, which no schema
  can do.
- ``ResourceClaim`` and ``ResourceClaimTemplate`` (``resource.k8s.io``): every
  ``devices.config[].opaque`` entry for this driver (``DeviceConfig``, inline
  ``DeviceClaimParameters`` with their selectors, ``DeviceClaimParametersReference``),
  and the CEL selectors of requests (``exactly`` and ``firstAvailable[]``) whose
  device class is one of this driver's classes.
- ``NetworkDevicePool`` (group = the driver name, cluster-scoped): name and spec against
  the pydantic models of :mod:`dradriver.api.networkpool` (:func:`~dradriver.api.networkpool.
  validate_object`), which check what the CRD schema cannot: the backend's settings
  section, unique device names, attribute values, quantities, node selector operators.

Denials name the field and, where the set is closed, the allowed values (kinds,
apiVersion, enum values, field names). An UPDATE that leaves the validated part
unchanged is always admitted, so metadata changes (finalizers, labels) on objects
created before the webhook existed are never blocked. A reference to a parameters
object that does not exist is admitted: the controller reports it on the claim.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.api import networkpool as net
from dradriver.api import parameters as params
from dradriver.api.opaqueconfig import DeviceConfig
from dradriver.cel import validate_selector
from dradriver.k8s.objects import Obj

RESOURCE_GROUP = "resource.k8s.io"


def _fields(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(f.alias or name for name, f in model.model_fields.items())


SPEC_FIELDS = _fields(params.DeviceClaimParametersSpec)
DEVICE_CONFIG_FIELDS = _fields(DeviceConfig)
INLINE_FIELDS = ("apiVersion", "kind", "spec")
REFERENCE_FIELDS = ("apiVersion", "kind", "name")

_UNKNOWN = re.compile(r"(?P<path>[^\s;]+): unknown field")
_EXTRA = re.compile(r"field (?P<path>[^\s;:]+): Extra inputs are not permitted")


@dataclass(frozen=True)
class Settings:
    """``driver``: the opaque config driver name and the parameters' API group;
    ``device_classes``: the DeviceClasses whose requests get their selectors compiled."""

    driver: str = DEFAULT_DRIVER_NAME
    device_classes: frozenset[str] = frozenset({DEFAULT_DRIVER_NAME})


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    errors: tuple[str, ...] = ()
    kind: str = ""  # what was validated, for logs and metrics ("" = not ours)

    @property
    def message(self) -> str:
        return "; ".join(self.errors)


def _with_allowed(message: str, allowed_at: Callable[[str], tuple[str, ...] | None]) -> str:
    """Add the allowed field names to every 'unknown field' in ``message``."""

    def unknown(match: re.Match[str]) -> str:
        path = match.group("path")
        names = allowed_at(path.rsplit(".", 1)[0] if "." in path else "")
        text = match.group(0)
        return f"{text} (allowed: {', '.join(names)})" if names else text

    return _UNKNOWN.sub(unknown, message)


def _selector_errors(selectors: list[str], where: str) -> list[str]:
    errors = []
    for index, expression in enumerate(selectors):
        problem = validate_selector(expression)
        if problem is not None:
            errors.append(f"{where}[{index}]: {problem}")
    return errors


def parameters_errors(obj: Obj) -> list[str]:
    """What is wrong with a DeviceClaimParameters object (field paths from its root)."""
    try:
        spec = params.parse_spec(obj.get("spec"))
    except params.ParametersError as e:
        return [_with_allowed(str(e), lambda parent: SPEC_FIELDS if parent == "spec" else None)]
    return _selector_errors(list(spec.selectors), "spec.selectors")


def _model_at(model: type[BaseModel], path: str) -> type[BaseModel] | None:
    """The pydantic model of the object at ``path`` (aliases, ``[i]`` indexes) under ``model``."""
    current: Any = model
    for part in re.sub(r"\[\d+\]", "", path).split(".") if path else ():
        fields = {f.alias or name: f for name, f in current.model_fields.items()}
        if part not in fields:
            return None
        current = _unwrap(fields[part].annotation)
        if current is None:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> type[BaseModel] | None:
    """The model inside ``X | None`` or ``list[X]`` (None if there is none)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _unwrap(arg)
            if found is not None:
                return found
    return None


def network_pool_errors(obj: Obj) -> list[str]:
    """What is wrong with a NetworkDevicePool object (field paths from its root)."""
    try:
        net.validate_object(obj)
    except net.NetworkPoolError as e:

        def allowed_at(parent: str) -> tuple[str, ...] | None:
            if parent != "spec" and not parent.startswith("spec."):
                return None
            model = _model_at(net.NetworkDevicePoolSpec, parent.removeprefix("spec")[1:])
            return _fields(model) if model is not None else None

        # pydantic prefixes the messages of the models' own checks with "Value error, ".
        return [_with_allowed(str(e).replace(": Value error, ", ": "), allowed_at)]
    return []


def opaque_errors(driver: str, parameters: Any, where: str) -> list[str]:
    """What is wrong with this driver's ``opaque.parameters`` found at ``where``."""
    kind = parameters.get("kind") if isinstance(parameters, dict) else None

    def allowed_at(parent: str) -> tuple[str, ...] | None:
        if parent == where:
            return INLINE_FIELDS if kind == params.KIND else REFERENCE_FIELDS
        if parent == f"{where}.spec":
            return SPEC_FIELDS
        return None

    try:
        parsed = params.parse_opaque(driver, parameters, where)
    except params.ParametersError as e:
        message = _with_allowed(str(e), allowed_at)
        return [
            _EXTRA.sub(
                lambda m: (
                    f"field {m.group('path')}: unknown field "
                    f"(allowed: {', '.join(DEVICE_CONFIG_FIELDS)})"
                ),
                message,
            )
        ]
    if isinstance(parsed, params.InlineParameters):
        return _selector_errors(list(parsed.spec.selectors), f"{where}.spec.selectors")
    return []


def _dict(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _request_selector_errors(settings: Settings, request: Obj, where: str) -> list[str]:
    if request.get("deviceClassName") not in settings.device_classes:
        return []
    errors = []
    for index, selector in enumerate(_list(request.get("selectors"))):
        expression = _dict(_dict(selector).get("cel")).get("expression")
        if isinstance(expression, str):
            problem = validate_selector(expression)
            if problem is not None:
                errors.append(f"{where}.selectors[{index}].cel.expression: {problem}")
    return errors


def claim_spec_errors(settings: Settings, spec: Any, where: str = "spec") -> list[str]:
    """What is wrong, for this driver, with a ResourceClaimSpec found at ``where``."""
    devices = _dict(_dict(spec).get("devices"))
    errors: list[str] = []
    for index, entry in enumerate(_list(devices.get("config"))):
        opaque = _dict(_dict(entry).get("opaque"))
        if opaque.get("driver") != settings.driver:
            continue
        errors += opaque_errors(
            settings.driver,
            opaque.get("parameters"),
            f"{where}.devices.config[{index}].opaque.parameters",
        )
    for index, raw in enumerate(_list(devices.get("requests"))):
        request = _dict(raw)
        at = f"{where}.devices.requests[{index}]"
        if "exactly" in request:
            errors += _request_selector_errors(settings, _dict(request["exactly"]), f"{at}.exactly")
        elif "deviceClassName" in request:  # resource.k8s.io/v1beta1 shape
            errors += _request_selector_errors(settings, request, at)
        for sub_index, sub in enumerate(_list(request.get("firstAvailable"))):
            errors += _request_selector_errors(
                settings, _dict(sub), f"{at}.firstAvailable[{sub_index}]"
            )
    return errors


def _target(settings: Settings, group: str, kind: str) -> tuple[str, Callable[[Obj], Any]] | None:
    """(kind, the part of the object that is validated) for the kinds this webhook knows."""
    if group == settings.driver and kind == params.KIND:
        return kind, lambda o: o.get("spec")
    if group == settings.driver and kind == net.KIND:
        return kind, lambda o: o.get("spec")
    if group == RESOURCE_GROUP and kind == "ResourceClaim":
        return kind, lambda o: o.get("spec")
    if group == RESOURCE_GROUP and kind == "ResourceClaimTemplate":
        return kind, lambda o: _dict(o.get("spec")).get("spec")
    return None


def validate(settings: Settings, request: Obj) -> Verdict:
    """The verdict on one AdmissionReview ``request``."""
    kind_ref = _dict(request.get("kind"))
    target = _target(settings, str(kind_ref.get("group", "")), str(kind_ref.get("kind", "")))
    if target is None:
        return Verdict(True)
    kind, part = target
    if request.get("operation") not in ("CREATE", "UPDATE"):
        return Verdict(True, kind=kind)
    obj = _dict(request.get("object"))
    old = request.get("oldObject")
    if request.get("operation") == "UPDATE" and isinstance(old, dict) and part(old) == part(obj):
        return Verdict(True, kind=kind)
    if kind == params.KIND:
        errors = parameters_errors(obj)
    elif kind == net.KIND:
        errors = network_pool_errors(obj)
    elif kind == "ResourceClaim":
        errors = claim_spec_errors(settings, obj.get("spec"), "spec")
    else:
        errors = claim_spec_errors(settings, _dict(obj.get("spec")).get("spec"), "spec.spec")
    return Verdict(not errors, tuple(errors), kind)
