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
(:mod:`dradriver.api.opaqueconfig`), see :meth:`DeviceClaimParametersSpec.device_config`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.api.crdgen import CRDKind
from dradriver.api.opaqueconfig import API_VERSION, ConfigError, DeviceConfig, parse_parameters
from dradriver.devices.config import format_location
from dradriver.k8s.objects import now_rfc3339 as now_rfc3339  # re-exported: params.now_rfc3339

VERSION = API_VERSION  # v1alpha1, shared with the DeviceConfig opaque parameters
KIND = "DeviceClaimParameters"
LIST_KIND = "DeviceClaimParametersList"
REFERENCE_KIND = "DeviceClaimParametersReference"
PLURAL = "deviceclaimparameters"
SINGULAR = "deviceclaimparameter"
SHORT_NAMES = ("dcp",)
VALID_CONDITION = "Valid"
CRD_FILE_NAME = "crd-deviceclaimparameters.yaml"

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_ENV = 64
MAX_SETUP_ARGS = 32  # DeviceConfig.setup_args allows 32
MAX_SELECTORS = 16
MAX_COUNT = 32  # an allocation holds at most 32 results

EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN, max_length=128)]
EnvValue = Annotated[str, StringConstraints(max_length=4096)]
SetupArg = Annotated[str, StringConstraints(max_length=1024)]
CELExpression = Annotated[str, StringConstraints(min_length=1, max_length=10 * 1024)]


class ParametersError(ValueError):
    """Invalid parameters or a bad reference; the message starts with the field path."""


class AllocationMode(StrEnum):
    IMMEDIATE = "Immediate"
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
        out: dict[str, Any] = {"apiVersion": f"{driver}/{VERSION}", "kind": "DeviceConfig"}
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


def validation_message(prefix: str, error: ValidationError) -> str:
    """Each pydantic error as ``<prefix>.<field>: <message>``, joined by "; "."""
    details = error.errors(include_url=False)
    parts = []
    for d in details:
        where = format_location(tuple(d["loc"]))
        message = "unknown field" if d["type"] == "extra_forbidden" else d["msg"]
        parts.append(f"{prefix}.{where}: {message}" if where else f"{prefix}: {message}")
    return "; ".join(parts)


def parse_spec(spec: Any, where: str = "spec") -> DeviceClaimParametersSpec:
    """Validate a spec; errors name the field (``spec.count: ...``)."""
    if not isinstance(spec, dict):
        raise ParametersError(f"{where}: must be an object, got {type(spec).__name__}")
    try:
        return DeviceClaimParametersSpec.model_validate(spec)
    except ValidationError as e:
        raise ParametersError(validation_message(where, e)) from e


def spec_of(obj: dict[str, Any]) -> DeviceClaimParametersSpec:
    """The validated spec of a DeviceClaimParameters object."""
    meta = obj.get("metadata") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    try:
        return parse_spec(obj.get("spec"))
    except ParametersError as e:
        raise ParametersError(f"{KIND} {name}: {e}") from e


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
    ``spec.devices.config[0].opaque.parameters``; errors start with it.
    """
    if not isinstance(parameters, dict):
        raise ParametersError(f"{where}: must be an object, got {type(parameters).__name__}")
    expected = f"{driver}/{VERSION}"
    kind = parameters.get("kind")
    kinds = ("DeviceConfig", KIND, REFERENCE_KIND)
    if kind not in kinds:
        raise ParametersError(
            f"{where}.kind: unknown kind {kind!r}; {driver} accepts {', '.join(kinds)}"
        )
    if parameters.get("apiVersion") != expected:
        raise ParametersError(
            f"{where}.apiVersion: {parameters.get('apiVersion')!r} is not supported; "
            f"use {expected!r}"
        )
    if kind == "DeviceConfig":
        try:
            return parse_parameters(driver, parameters, where)
        except ConfigError as e:
            raise ParametersError(str(e)) from e
    try:
        if kind == KIND:
            return InlineParameters(_Inline.model_validate(parameters).spec)
        return ParametersReference(_Reference.model_validate(parameters).name)
    except ValidationError as e:
        raise ParametersError(validation_message(where, e)) from e


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
    obj = lookup(namespace, entry.source.name)
    if obj is None:
        raise ParametersError(
            f"{entry.where}.name: {KIND} {namespace}/{entry.source.name} does not exist"
        )
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        raise ParametersError(
            f"{entry.where}.name: {KIND} {namespace}/{entry.source.name} is being deleted"
        )
    try:
        return spec_of(obj)
    except ParametersError as e:
        raise ParametersError(f"{entry.where}.name: {e}") from e
