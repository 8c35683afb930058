"""Which requests reach the webhook: the ``rules`` and ``matchConditions`` of its
ValidatingWebhookConfiguration, for a driver name and its DeviceClasses.

The webhook is registered with ``failurePolicy: Fail``: while it is down, whatever it
matches cannot be written. So it matches only what concerns this driver, with CEL
``matchConditions`` (admissionregistration.k8s.io/v1, GA since Kubernetes 1.30) on top
of the rules (CREATE and UPDATE of ResourceClaims, ResourceClaimTemplates and our two
CRDs). Both conditions must hold for the apiserver to call the webhook:

``concerns-driver``
    The object is one of our CRDs (API group = the driver name: DeviceClaimParameters,
    NetworkDevicePool), or a claim (template) whose ``spec.devices`` has an opaque config
    entry for this driver (which is also where references to our parameters live) or a
    request (``exactly`` or a ``firstAvailable`` subrequest) for one of this driver's
    DeviceClasses. These are exactly the parts :mod:`dradriver.webhook.validation` checks,
    so a request the conditions skip is one the webhook would admit.
``spec-changed``
    Not an UPDATE that leaves ``spec`` as it was: finalizers, labels, annotations and
    status (a subresource the rules do not match anyway) never need the webhook, so
    removing a finalizer works while it is down.

The apiserver evaluates the conditions on the object converted to the webhook's version
(``matchPolicy: Equivalent``), so only the ``resource.k8s.io/v1`` shape appears. Every
field access is guarded with ``has()``: an evaluation error would count as a failure to
call the webhook, which ``failurePolicy: Fail`` turns into a denial.
"""

from __future__ import annotations

from collections.abc import Sequence

from dradriver.api import networkpool as net
from dradriver.api import parameters as params
from dradriver.k8s import names
from dradriver.k8s.objects import Obj

RESOURCE_GROUP = "resource.k8s.io"
OPERATIONS = ("CREATE", "UPDATE")
EXTENDED_RESOURCE_CLASS_SUFFIX = "-mock-extended-resource"


def device_classes(driver: str) -> tuple[str, ...]:
    """The DeviceClasses this driver's manifests install (``manifests/kubeletplugin/
    deviceclass*.yaml``; a unit test keeps the two in step)."""
    return (driver, driver + EXTENDED_RESOURCE_CLASS_SUFFIX)


def rules(driver: str, scope: str | None = None) -> list[Obj]:
    """The rules of the webhook; ``scope`` ("Namespaced" or "Cluster") keeps only those."""
    every = [
        {
            "apiGroups": [RESOURCE_GROUP],
            "apiVersions": ["v1"],  # matchPolicy Equivalent converts v1beta* requests to v1
            "operations": list(OPERATIONS),
            "resources": ["resourceclaims", "resourceclaimtemplates"],
            "scope": "Namespaced",
        },
        {
            "apiGroups": [driver],
            "apiVersions": [params.VERSION],
            "operations": list(OPERATIONS),
            "resources": [params.PLURAL],
            "scope": "Namespaced",
        },
        {
            "apiGroups": [driver],
            "apiVersions": [net.VERSION],
            "operations": list(OPERATIONS),
            "resources": [net.PLURAL],
            "scope": "Cluster",
        },
    ]
    return [r for r in every if scope is None or r["scope"] == scope]


def _literal(name: str) -> str:
    """A CEL string literal of a DNS subdomain (checked, so nothing needs escaping)."""
    names.validate_dns_subdomain(name, "name in a webhook match condition")
    return f"'{name}'"


def concerns_driver(driver: str, classes: Sequence[str]) -> str:
    """The CEL expression of the ``concerns-driver`` condition."""
    ours = _literal(driver)
    class_list = "[" + ", ".join(_literal(c) for c in classes) + "]"
    return (
        f"request.resource.group == {ours} ||\n"
        "(request.resource.resource == 'resourceclaims' ? [object.spec]\n"
        " : has(object.spec.spec) ? [object.spec.spec] : []).exists(s,\n"
        "  has(s.devices) && (\n"
        "    (has(s.devices.config) && s.devices.config.exists(c,\n"
        f"      has(c.opaque) && has(c.opaque.driver) && c.opaque.driver == {ours})) ||\n"
        "    (has(s.devices.requests) && s.devices.requests.exists(r,\n"
        "      (has(r.exactly) && has(r.exactly.deviceClassName) &&\n"
        f"       r.exactly.deviceClassName in {class_list}) ||\n"
        "      (has(r.firstAvailable) && r.firstAvailable.exists(f,\n"
        f"        has(f.deviceClassName) && f.deviceClassName in {class_list}))))))"
    )


SPEC_CHANGED = (
    "request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec) ||\n"
    "object.spec != oldObject.spec"
)
"""The CEL expression of the ``spec-changed`` condition."""


def match_conditions(driver: str, classes: Sequence[str] | None = None) -> list[Obj]:
    """The webhook's ``matchConditions`` (``classes``: default :func:`device_classes`)."""
    classes = device_classes(driver) if classes is None else classes
    return [
        {"name": "concerns-driver", "expression": concerns_driver(driver, classes)},
        {"name": "spec-changed", "expression": SPEC_CHANGED},
    ]
