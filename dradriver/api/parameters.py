"""The ``DeviceClaimParameters`` custom resource and how claims refer to it.

The pydantic models below are the single source of truth: they validate objects
in the controller (and, later, the admission webhook), and :func:`crd` turns
them into the CustomResourceDefinition's structural OpenAPI v3 schema, committed
as ``manifests/controller/crd-deviceclaimparameters.yaml``. Regenerate it with::

    python -m devtools.crds --write

A unit test fails when the committed file differs from what the models generate.

Claims use parameters through opaque device configuration for this driver,
either inline or by reference to an object in the claim's namespace::

    config:
      - opaque:
          driver: dradriver.dev
          parameters:                       # inline
            apiVersion: dradriver.dev/v1alpha1
            kind: DeviceClaimParameters
            spec: {profile: fast, env: {MODE: "1"}}
      - opaque:
          driver: dradriver.dev
          parameters:                       # by name
            apiVersion: dradriver.dev/v1alpha1
            kind: DeviceClaimParametersReference
            name: gpu-fast

The node-side settings in a spec (``env``, ``profile``, ``setupArgs``) map onto the
``DeviceConfig`` parameters the kubelet plugin already understands
(:mod:`dradriver.api.deviceconfig`), see :meth:`DeviceClaimParametersSpec.device_config`.

Errors are :class:`ParametersError` with field errors (:mod:`dradriver.errors`) whose paths
start at what was checked (``spec`` of an object, or the ``where`` a caller gives).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.api import group, wellknown
from dradriver.api.crdgen import CRDKind
from dradriver.api.deviceconfig import DeviceConfig, DeviceConfigError, parse_device_config
from dradriver.errors import FieldError, FieldErrors, from_validation_error, under
from dradriver.k8s import names
from dradriver.k8s.objects import now_rfc3339 as now_rfc3339  # re-exported: params.now_rfc3339

VERSION = group.VERSION  # shared with the DeviceConfig opaque parameters
KIND = group.PARAMETERS_KIND
LIST_KIND = "DeviceClaimParametersList"
REFERENCE_KIND = group.PARAMETERS_REFERENCE_KIND
PLURAL = "deviceclaimparameters"
SINGULAR = "deviceclaimparameter"
SHORT_NAMES = ("dcp",)
VALID_CONDITION = "Valid"
CRD_FILE_NAME = "crd-deviceclaimparameters.yaml"

ENV_NAME_PATTERN = names.whole(names.C_IDENTIFIER_REGEX)
DNS_LABEL_PATTERN = names.whole(names.DNS_LABEL_REGEX)
DNS_SUBDOMAIN_PATTERN = names.whole(names.DNS_SUBDOMAIN_REGEX)
MAX_ENV = 64
MAX_SETUP_ARGS = 32  # DeviceConfig.setup_args allows 32
MAX_SELECTORS = 16
MAX_COUNT = 32  # an allocation holds at most 32 results

EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN, max_length=128)]
EnvValue = Annotated[str, StringConstraints(max_length=4096)]
SetupArg = Annotated[str, StringConstraints(max_length=1024)]
CELExpression = Annotated[str, StringConstraints(min_length=1, max_length=10 * 1024)]


class ParametersError(FieldErrors):
    """Invalid parameters or a bad reference; each error names its field."""


class AllocationMode(StrEnum):
    IMMEDIATE = wellknown.IMMEDIATE
    WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"


class DeviceClaimParametersSpec(BaseModel):
    """Desired device setup and allocation for the claims that use these parameters."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, use_enum_values=True)

    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=MAX_ENV,
        description="Environment variables for the containers that use the devices.",
    )
    profile: Annotated[str, StringConstraints(pattern=DNS_LABEL_PATTERN, max_length=63)] | None = (
        Field(
            default=None,
            description="Device profile, passed to the setup hook as DRADRIVER_PROFILE "
            "(a DNS label, e.g. 'fast').",
        )
    )
    setup_args: list[SetupArg] = Field(
        default_factory=list,
        alias="setupArgs",
        max_length=MAX_SETUP_ARGS,
        description="Extra arguments for the device setup hook.",
    )
    count: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="How many devices each request the entry applies to gets (ExactCount). "
        "Applies to controller (Immediate) allocation only; the scheduler does not read it "
        "(default: what the request asks for).",
    )
    selectors: list[CELExpression] = Field(
        default_factory=list,
        max_length=MAX_SELECTORS,
        description="Extra CEL device selectors (like a request's selectors[].cel.expression), "
        "ANDed with the request's own: all must be true for a device to be chosen. Applies to "
        "controller (Immediate) allocation only; the scheduler does not read them.",
    )
    allocation_mode: AllocationMode = Field(
        default=AllocationMode.WAIT_FOR_FIRST_CONSUMER,
        alias="allocationMode",
        description="Immediate: the controller allocates claims using these parameters right "
        "away, without a pod. WaitForFirstConsumer: the scheduler allocates when a pod needs "
        "the claim.",
    )

    def device_config(self, driver: str = DEFAULT_DRIVER_NAME) -> dict[str, Any]:
        """The node-side part as ``DeviceConfig`` opaque parameters (what the plugin reads)."""
        out: dict[str, Any] = {
            "apiVersion": group.api_version(driver),
            "kind": group.DEVICE_CONFIG_KIND,
        }
        if self.env:
            out["env"] = dict(self.env)
        if self.profile is not None:
            out["profile"] = self.profile
        if self.setup_args:
            out["setupArgs"] = list(self.setup_args)
        return out

    @property
    def immediate(self) -> bool:
        return self.allocation_mode == AllocationMode.IMMEDIATE


class Condition(BaseModel):
    """A metav1.Condition."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Annotated[str, StringConstraints(max_length=316)] = Field(
        description="Condition type, e.g. Valid."
    )
    status: Literal["True", "False", "Unknown"]
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        alias="observedGeneration",
        description="The .metadata.generation the condition was computed from.",
    )
    last_transition_time: str = Field(
        alias="lastTransitionTime",
        json_schema_extra={"format": "date-time"},
        description="When the status last changed.",
    )
    reason: Annotated[
        str,
        StringConstraints(
            min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
        ),
    ] = Field(description="A CamelCase reason for the last transition.")
    message: Annotated[str, StringConstraints(max_length=32768)] = Field(
        description="A human-readable explanation."
    )


class DeviceClaimParametersStatus(BaseModel):
    """What the controller observed about these parameters."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        description="Valid: the spec passed the controller's validation.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


# --- CRD -------------------------------------------------------------------------------

CRD_KIND = CRDKind(
    kind=KIND,
    plural=PLURAL,
    singular=SINGULAR,
    scope="Namespaced",
    description="Parameters for dradriver devices, referenced from ResourceClaims through "
    "opaque device configuration (kind DeviceClaimParametersReference) or copied inline.",
    spec_model=DeviceClaimParametersSpec,
    status_model=DeviceClaimParametersStatus,
    source="dradriver.api.parameters",
    file_name=CRD_FILE_NAME,
    version=VERSION,
    short_names=SHORT_NAMES,
    printer_columns=(
        {"name": "Profile", "type": "string", "jsonPath": ".spec.profile"},
        {"name": "Mode", "type": "string", "jsonPath": ".spec.allocationMode"},
        {
            "name": "Valid",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Valid")].status',
        },
    ),
)


def openapi_schema() -> dict[str, Any]:
    """The CRD's ``openAPIV3Schema``."""
    return CRD_KIND.openapi_schema()


def crd(group: str = DEFAULT_DRIVER_NAME) -> dict[str, Any]:
    """The CustomResourceDefinition for API group ``group`` (the driver name)."""
    return CRD_KIND.crd(group)


def crd_yaml(group: str = DEFAULT_DRIVER_NAME) -> str:
    return CRD_KIND.crd_yaml(group)


# --- objects and conditions -----------------------------------------------------------


def _not_an_object(where: str, value: Any) -> FieldError:
    return FieldError(where, f"must be an object, got {type(value).__name__}")


def parse_spec(spec: Any, where: str = "spec") -> DeviceClaimParametersSpec:
    """Validate a spec; errors name the field (``spec.count: ...``)."""
    if not isinstance(spec, dict):
        raise ParametersError(_not_an_object(where, spec))
    try:
        return DeviceClaimParametersSpec.model_validate(spec)
    except ValidationError as e:
        raise ParametersError(
            *under(where, from_validation_error(e, DeviceClaimParametersSpec))
        ) from e


def spec_of(obj: dict[str, Any]) -> DeviceClaimParametersSpec:
    """The validated spec of a DeviceClaimParameters object; errors have the object as subject."""
    meta = obj.get("metadata") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    try:
        return parse_spec(obj.get("spec"))
    except ParametersError as e:
        raise ParametersError(*e.field_errors, subject=f"{KIND} {name}") from e


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    generation: int | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """Conditions with ``type_`` set; lastTransitionTime changes only with the status.

    Returns the new list and whether anything changed.
    """
    out = [copy.deepcopy(c) for c in conditions if c.get("type") != type_]
    old = next((c for c in conditions if c.get("type") == type_), None)
    new: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": old["lastTransitionTime"]
        if old is not None and old.get("status") == status and old.get("lastTransitionTime")
        else now_rfc3339(),
    }
    if generation is not None:
        new["observedGeneration"] = generation
    out.append(new)
    return out, old != new


def valid_condition(obj: dict[str, Any]) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == VALID_CONDITION:
            return dict(c)
    return None


# --- references from claims -----------------------------------------------------------


@dataclass(frozen=True)
class InlineParameters:
    spec: DeviceClaimParametersSpec


@dataclass(frozen=True)
class ParametersReference:
    """A DeviceClaimParameters object in the claim's own namespace."""

    name: str


ParametersSource = InlineParameters | ParametersReference


class _Inline(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: str = Field(alias="apiVersion")
    kind: Literal["DeviceClaimParameters"]
    spec: DeviceClaimParametersSpec


class _Reference(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: str = Field(alias="apiVersion")
    kind: Literal["DeviceClaimParametersReference"]
    name: Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)]


def parse_opaque(
    driver: str, parameters: Any, where: str = "parameters"
) -> DeviceConfig | InlineParameters | ParametersReference:
    """Parse this driver's opaque ``parameters``: DeviceConfig, inline parameters or a reference.

    ``where`` is the path of ``parameters`` in its object, e.g.
    ``spec.devices.config[0].opaque.parameters``; error paths start with it.
    """
    if not isinstance(parameters, dict):
        raise ParametersError(_not_an_object(where, parameters))
    expected = group.api_version(driver)
    kind = parameters.get("kind")
    if kind not in group.OPAQUE_KINDS:
        raise ParametersError(
            FieldError(
                "kind", f"unknown kind {kind!r}; {driver} accepts {', '.join(group.OPAQUE_KINDS)}"
            ).under(where)
        )
    if parameters.get("apiVersion") != expected:
        raise ParametersError(
            FieldError(
                "apiVersion",
                f"{parameters.get('apiVersion')!r} is not supported; use {expected!r}",
            ).under(where)
        )
    if kind == group.DEVICE_CONFIG_KIND:
        try:
            return parse_device_config(parameters)
        except DeviceConfigError as e:
            raise ParametersError(*under(where, e.field_errors)) from e
    model: type[_Inline] | type[_Reference] = _Inline if kind == KIND else _Reference
    try:
        parsed = model.model_validate(parameters)
    except ValidationError as e:
        raise ParametersError(*under(where, from_validation_error(e, model))) from e
    if isinstance(parsed, _Inline):
        return InlineParameters(parsed.spec)
    return ParametersReference(parsed.name)


@dataclass(frozen=True)
class ClaimParameters:
    """One config entry of a claim that carries parameters for this driver."""

    index: int  # in spec.devices.config
    requests: tuple[str, ...]  # empty: every request
    source: ParametersSource

    @property
    def where(self) -> str:
        return f"spec.devices.config[{self.index}].opaque.parameters"


def claim_parameters(driver: str, claim: dict[str, Any]) -> list[ClaimParameters]:
    """The parameters entries of a ResourceClaim (or template spec) for ``driver``.

    ``DeviceConfig`` entries are left to the kubelet plugin and not returned.
    Raises :class:`ParametersError` naming the first bad field.
    """
    config = ((claim.get("spec") or {}).get("devices") or {}).get("config") or []
    out = []
    for index, entry in enumerate(config):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        where = f"spec.devices.config[{index}].opaque.parameters"
        parsed = parse_opaque(driver, opaque.get("parameters"), where)
        if isinstance(parsed, DeviceConfig):
            continue
        out.append(ClaimParameters(index, tuple(entry.get("requests") or ()), parsed))
    return out


def resolve(
    entry: ClaimParameters,
    namespace: str,
    lookup: Callable[[str, str], dict[str, Any] | None],
) -> DeviceClaimParametersSpec:
    """The spec an entry stands for; ``lookup(namespace, name)`` finds referenced objects."""
    if isinstance(entry.source, InlineParameters):
        return entry.source.spec
    at = f"{entry.where}.name"
    obj = lookup(namespace, entry.source.name)
    if obj is None:
        raise ParametersError(
            FieldError(at, f"{KIND} {namespace}/{entry.source.name} does not exist")
        )
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        raise ParametersError(
            FieldError(at, f"{KIND} {namespace}/{entry.source.name} is being deleted")
        )
    try:
        return spec_of(obj)
    except ParametersError as e:
        # The referenced object's fields are not the claim's: its errors are the message.
        raise ParametersError(FieldError(at, str(e))) from e
