"""What the admission webhook checks, as pure functions over plain JSON objects.

- ``DeviceClaimParameters`` (group = the driver name): the spec against the pydantic
  models of :mod:`dradriver.api.parameters` (the CRD schema checks most of it too, but
  not everything), and every ``spec.selectors[]`` compiled as CEL, which no schema
  can do.
- ``ResourceClaim`` and ``ResourceClaimTemplate`` (``resource.k8s.io``): every
  ``devices.config[].opaque`` entry for this driver (``DeviceConfig``, inline
  ``DeviceClaimParameters`` with their selectors, ``DeviceClaimParametersReference``),
  and the CEL selectors of requests (``exactly`` and ``firstAvailable[]``) whose
  device class is one of this driver's classes, and that such a request names each
  capacity once (``memory`` or ``<driver>/memory``, not both).
- ``NetworkDevicePool`` (group = the driver name, cluster-scoped): name and spec against
  the pydantic models of :mod:`dradriver.api.networkpool` (:func:`~dradriver.api.networkpool.
  validate_object`), which check what the CRD schema cannot: the backend's settings
  section, unique device names, attribute values, quantities, node selector operators.

Denials name the field and, where the set is closed, the allowed values (kinds,
apiVersion, enum values, field names). The checks report field errors
(:mod:`dradriver.errors`) relative to what they were given; the webhook puts them under the
path of that part in the admitted object. An UPDATE that leaves the validated part
unchanged is always admitted, so metadata changes (finalizers, labels) on objects
created before the webhook existed are never blocked. A reference to a parameters
object that does not exist is admitted: the controller reports it on the claim.

Cost: compiling CEL is what costs (tens of ms for a selector of 10 KiB; the rest of a
review takes well under that), so one review compiles at most
``Settings.max_selectors`` selectors of ``Settings.max_selector_bytes`` in total
(:class:`Budget`). Kubernetes allows more (32 requests of 32 selectors of 10 KiB), which no
real claim comes near; a review over the budget is denied with a message naming the limit
and the field where it was crossed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.api import networkpool as net
from dradriver.api import parameters as params
from dradriver.cel import validate_selector
from dradriver.errors import FieldError, render, under
from dradriver.k8s import names
from dradriver.k8s.objects import Obj
from dradriver.webhook.registration import device_classes

RESOURCE_GROUP = "resource.k8s.io"
CLAIM_KIND = "ResourceClaim"
TEMPLATE_KIND = "ResourceClaimTemplate"
KINDS = (params.KIND, net.KIND, CLAIM_KIND, TEMPLATE_KIND)
"""What this webhook validates (``Verdict.kind``); everything else is admitted untouched."""
DEFAULT_MAX_SELECTORS = 128
DEFAULT_MAX_SELECTOR_BYTES = 256 * 1024


@dataclass(frozen=True)
class Settings:
    """``driver``: the opaque config driver name and the parameters' API group;
    ``device_classes``: the DeviceClasses whose requests get their selectors compiled (by
    default those the driver's manifests install, which the registration's
    ``matchConditions`` name too)."""

    driver: str = DEFAULT_DRIVER_NAME
    device_classes: frozenset[str] = frozenset(device_classes(DEFAULT_DRIVER_NAME))
    max_selectors: int = DEFAULT_MAX_SELECTORS
    max_selector_bytes: int = DEFAULT_MAX_SELECTOR_BYTES

    @classmethod
    def for_driver(cls, driver: str, classes: Iterable[str] | None = None) -> Settings:
        """Settings for ``driver``; ``classes`` default: :func:`~dradriver.webhook.
        registration.device_classes`."""
        return cls(driver, frozenset(device_classes(driver) if classes is None else classes))


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    field_errors: tuple[FieldError, ...] = ()
    kind: str = ""  # what was validated, for logs and metrics ("" = not ours)

    @property
    def errors(self) -> tuple[str, ...]:
        return tuple(str(e) for e in self.field_errors)

    @property
    def message(self) -> str:
        return render(self.field_errors)


def selector_problem(expression: str) -> str | None:
    """What is wrong with a CEL selector, if anything.

    A lone surrogate (JSON ``"\\ud800"``) is valid in a Python string but not Unicode text:
    the CEL compiler cannot take it, and Kubernetes would have replaced it with U+FFFD.
    """
    try:
        expression.encode("utf-8")
    except UnicodeEncodeError as e:
        return (
            f"character {expression[e.start]!r} at offset {e.start} is a lone surrogate, "
            "not valid Unicode"
        )
    return validate_selector(expression)


class _OverBudget(Exception):
    """A review holds more CEL than :class:`Budget` allows; ``error`` names where."""

    def __init__(self, error: FieldError) -> None:
        super().__init__(str(error))
        self.error = error


class Budget:
    """The CEL one review may compile: charged before each compile, never refunded.

    :meth:`charge` raises ``_OverBudget`` at the first selector that would cross
    either limit, so the work done for one review is bounded by the limits whatever the
    object holds."""

    def __init__(self, max_selectors: int, max_bytes: int) -> None:
        self.max_selectors, self.max_bytes = max_selectors, max_bytes
        self.selectors = self.bytes = 0

    def charge(self, expression: str, where: str) -> None:
        self.selectors += 1
        self.bytes += len(expression.encode("utf-8", "surrogatepass"))
        if self.selectors > self.max_selectors:
            raise _OverBudget(
                FieldError(
                    where,
                    f"more than {self.max_selectors} CEL selectors in one object; this "
                    "webhook compiles at most that many per review: split the object or "
                    "use fewer selectors",
                )
            )
        if self.bytes > self.max_bytes:
            raise _OverBudget(
                FieldError(
                    where,
                    f"the object's CEL selectors total more than {self.max_bytes} bytes up "
                    "to here; this webhook compiles at most that much per review: split "
                    "the object or shorten the selectors",
                )
            )


def _checked(expression: str, where: str, budget: Budget | None) -> FieldError | None:
    if budget is not None:
        budget.charge(expression, where)
    problem = selector_problem(expression)
    return None if problem is None else FieldError(where, problem)


def _selector_errors(
    selectors: list[str], where: str, budget: Budget | None = None
) -> list[FieldError]:
    errors = []
    for index, expression in enumerate(selectors):
        error = _checked(expression, f"{where}[{index}]", budget)
        if error is not None:
            errors.append(error)
    return errors


def parameters_errors(obj: Obj, budget: Budget | None = None) -> list[FieldError]:
    """What is wrong with a DeviceClaimParameters object (field paths from its root)."""
    try:
        spec = params.parse_spec(obj.get("spec"), "spec")
    except params.ParametersError as e:
        return list(e.field_errors)
    return _selector_errors(list(spec.selectors), "spec.selectors", budget)


def network_pool_errors(obj: Obj, driver: str) -> list[FieldError]:
    """What is wrong with a NetworkDevicePool object (field paths from its root)."""
    try:
        net.validate_object(obj)
    except net.NetworkPoolError as e:
        return list(e.field_errors)
    return _own_domain_errors(driver, _dict(obj.get("spec")).get("devices"))


def _own_domain_errors(driver: str, devices: Any) -> list[FieldError]:
    """Attribute and capacity names that spell out the driver's own domain: published
    without it (the 1.38 kubelet-plugin helper rejects it), so ``model`` and
    ``<driver>/model`` would be one name."""
    errors: list[FieldError] = []
    for index, device in enumerate(_list(devices)):
        for field, what in (("attributes", "attribute"), ("capacity", "capacity")):
            for key in _dict(_dict(device).get(field)):
                problem = names.own_domain_prefix_problem(str(key), driver, what)
                if problem is not None:
                    errors.append(FieldError(f"spec.devices[{index}].{field}.{key}", problem))
    return errors


def opaque_errors(
    driver: str, parameters: Any, where: str, budget: Budget | None = None
) -> list[FieldError]:
    """What is wrong with this driver's ``opaque.parameters`` found at ``where``."""
    try:
        parsed = params.parse_opaque(driver, parameters, "")
    except params.ParametersError as e:
        return list(under(where, e.field_errors))
    if isinstance(parsed, params.InlineParameters):
        return _selector_errors(list(parsed.spec.selectors), f"{where}.spec.selectors", budget)
    return []


def _dict(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _request_selector_errors(
    settings: Settings, request: Obj, where: str, budget: Budget | None, name: str
) -> list[FieldError]:
    class_name = request.get("deviceClassName")
    if not isinstance(class_name, str) or class_name not in settings.device_classes:
        return []
    errors = []
    for index, selector in enumerate(_list(request.get("selectors"))):
        expression = _dict(_dict(selector).get("cel")).get("expression")
        if isinstance(expression, str):
            error = _checked(expression, f"{where}.selectors[{index}].cel.expression", budget)
            if error is not None:
                errors.append(error)
    return errors + _capacity_name_errors(settings.driver, request, where, name)


def _capacity_name_errors(driver: str, request: Obj, where: str, name: str) -> list[FieldError]:
    """A request of the driver's classes may name a capacity with or without the driver's
    domain (``memory`` or ``<driver>/memory``, one name, as the 1.38 scheduler resolves
    them), but not both ways at once: the scheduler refuses such a claim."""
    requests = _dict(_dict(request.get("capacity")).get("requests"))
    errors = []
    for key in requests:
        bare = names.published_name(str(key), driver)
        if bare != key and bare in requests:
            errors.append(
                FieldError(
                    f"{where}.capacity.requests.{key}",
                    f"request {name!r} asks for capacity {bare!r} both as {bare!r} and as "
                    f"{key!r}, which name the same capacity of {driver} devices: keep one",
                )
            )
    return errors


def claim_spec_errors(
    settings: Settings, spec: Any, where: str = "spec", budget: Budget | None = None
) -> list[FieldError]:
    """What is wrong, for this driver, with a ResourceClaimSpec found at ``where``."""
    devices = _dict(_dict(spec).get("devices"))
    errors: list[FieldError] = []
    for index, entry in enumerate(_list(devices.get("config"))):
        opaque = _dict(_dict(entry).get("opaque"))
        if opaque.get("driver") != settings.driver:
            continue
        errors += opaque_errors(
            settings.driver,
            opaque.get("parameters"),
            f"{where}.devices.config[{index}].opaque.parameters",
            budget,
        )
    for index, raw in enumerate(_list(devices.get("requests"))):
        request = _dict(raw)
        at = f"{where}.devices.requests[{index}]"
        name = str(request.get("name", ""))
        if "exactly" in request:
            exactly = _dict(request["exactly"])
            errors += _request_selector_errors(settings, exactly, f"{at}.exactly", budget, name)
        elif "deviceClassName" in request:  # resource.k8s.io/v1beta1 shape
            errors += _request_selector_errors(settings, request, at, budget, name)
        for sub_index, raw_sub in enumerate(_list(request.get("firstAvailable"))):
            sub = _dict(raw_sub)
            errors += _request_selector_errors(
                settings,
                sub,
                f"{at}.firstAvailable[{sub_index}]",
                budget,
                f"{name}/{sub.get('name', '')}",
            )
    return errors


def _target(settings: Settings, group: str, kind: str) -> tuple[str, Callable[[Obj], Any]] | None:
    """(kind, the part of the object that is validated) for the kinds this webhook knows."""
    if group == settings.driver and kind == params.KIND:
        return kind, lambda o: o.get("spec")
    if group == settings.driver and kind == net.KIND:
        return kind, lambda o: o.get("spec")
    if group == RESOURCE_GROUP and kind == CLAIM_KIND:
        return kind, lambda o: o.get("spec")
    if group == RESOURCE_GROUP and kind == TEMPLATE_KIND:
        return kind, lambda o: _dict(o.get("spec")).get("spec")
    return None


def validate(settings: Settings, request: Obj) -> Verdict:
    """The verdict on one AdmissionReview ``request``; a review holding more CEL than the
    settings' budget is denied naming the limit."""
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
    budget = Budget(settings.max_selectors, settings.max_selector_bytes)
    try:
        if kind == params.KIND:
            errors = parameters_errors(obj, budget)
        elif kind == net.KIND:
            errors = network_pool_errors(obj, settings.driver)
        elif kind == CLAIM_KIND:
            errors = claim_spec_errors(settings, obj.get("spec"), "spec", budget)
        else:
            spec = _dict(obj.get("spec")).get("spec")
            errors = claim_spec_errors(settings, spec, "spec.spec", budget)
    except _OverBudget as e:
        return Verdict(False, (e.error,), kind)
    return Verdict(not errors, tuple(errors), kind)
