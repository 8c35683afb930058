"""Network-attached device pools: the NetworkDevicePool custom resource and its slices.

A NetworkDevicePool (cluster-scoped, ``<driver>/v1alpha1``) lists devices that live
outside any node (a fabric-attached accelerator, a remote NIC) and which nodes can reach
them. The controller publishes each pool as ResourceSlices of pool ``network/<name>``
(:func:`api_device` is each device's wire form) with a node selector (or ``allNodes``)
instead of a node name; every device has ``bindsToNode`` and the binding conditions
below, so the scheduler picks a node, writes the allocation, and holds the pod until the
controller has attached the device to that node and set ``<driver>/attached`` in the
claim's ``status.devices``. The kubelet
plugin on the node then prepares the device from what the controller pinned in that
status entry (:func:`attachment_of`), without reading the pool object.

The pydantic models are the single source of the CRD's schema (``python -m devtools.crds
--write``; a unit test fails when the committed file drifts), like
:mod:`dradriver.api.parameters`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.api import group
from dradriver.api.crdgen import CRDKind
from dradriver.api.parameters import DNS_LABEL_PATTERN, ENV_NAME_PATTERN, MAX_ENV
from dradriver.devices.attributes import attribute_value
from dradriver.errors import FieldError, FieldErrors, from_validation_error, under
from dradriver.k8s import names
from dradriver.k8s.quantity import QuantityError, parse_quantity

VERSION = group.VERSION
KIND = "NetworkDevicePool"
LIST_KIND = "NetworkDevicePoolList"
PLURAL = "networkdevicepools"
SINGULAR = "networkdevicepool"
SHORT_NAMES = ("ndp",)
POOL_PREFIX = "network/"
"""Pool names of network pools; node-local pools are named after their node (no '/')."""
FINALIZER = "dradriver.dev/detach"
"""Held by the controller until every device of a deleted pool is detached."""
MAX_DEVICES = 1024
CRD_FILE_NAME = "crd-networkdevicepools.yaml"

DNSLabel = Annotated[
    str,
    StringConstraints(pattern=DNS_LABEL_PATTERN, max_length=names.DNS_LABEL_MAX_LENGTH),
]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN, max_length=128)]
EnvValue = Annotated[str, StringConstraints(max_length=4096)]
QualifiedName = Annotated[
    str,
    StringConstraints(
        pattern=names.whole(names.QUALIFIED_NAME_REGEX),
        max_length=96,
    ),
]


def attached_condition(driver: str) -> str:
    """Binding condition the controller sets True once the device is attached."""
    return f"{driver}/attached"


def attach_failed_condition(driver: str) -> str:
    """Binding failure condition: True sends the pod back to scheduling."""
    return f"{driver}/attach-failed"


def pool_name(pool: str) -> str:
    """The ResourceSlice pool name of NetworkDevicePool ``pool``."""
    return POOL_PREFIX + pool


def is_network_pool(pool: str) -> bool:
    return pool.startswith(POOL_PREFIX)


def object_name(pool: str) -> str | None:
    """The NetworkDevicePool behind slice pool name ``pool``, or None for a node pool."""
    return pool[len(POOL_PREFIX) :] if is_network_pool(pool) else None


class NetworkPoolError(FieldErrors):
    """A NetworkDevicePool is invalid (each error names its field), or a network device is
    not attached to this node (yet)."""


# --- spec -------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class NodeSelectorRequirement(_Strict):
    key: Annotated[str, StringConstraints(min_length=1, max_length=317)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[Annotated[str, StringConstraints(max_length=63)]] = Field(
        default_factory=list, max_length=64
    )

    @model_validator(mode="after")
    def _values_fit_operator(self) -> NodeSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and len(self.values) != 1:
            raise ValueError(f"operator {self.operator} needs exactly one integer value")
        return self


class NodeSelectorTerm(_Strict):
    match_expressions: list[NodeSelectorRequirement] = Field(
        default_factory=list, alias="matchExpressions", max_length=32
    )
    match_fields: list[NodeSelectorRequirement] = Field(
        default_factory=list, alias="matchFields", max_length=32
    )

    @model_validator(mode="after")
    def _not_empty(self) -> NodeSelectorTerm:
        if not self.match_expressions and not self.match_fields:
            raise ValueError("a node selector term needs matchExpressions or matchFields")
        for field in self.match_fields:
            if field.key != "metadata.name" or field.operator not in ("In", "NotIn"):
                raise ValueError(
                    "matchFields supports only key metadata.name with operator In or NotIn"
                )
        return self


class NodeSelector(_Strict):
    """Which nodes can reach the devices (core NodeSelector with exactly one term)."""

    node_selector_terms: list[NodeSelectorTerm] = Field(
        alias="nodeSelectorTerms", min_length=1, max_length=1
    )


class AttributeSpec(_Strict):
    """A device attribute as in a ResourceSlice: exactly one of int, bool, string, version."""

    int_: int | None = Field(default=None, alias="int")
    bool_: bool | None = Field(default=None, alias="bool")
    string: Annotated[str, StringConstraints(max_length=64)] | None = None
    version: Annotated[str, StringConstraints(max_length=64)] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> AttributeSpec:
        set_ = self.model_dump(by_alias=True, exclude_none=True)
        if len(set_) != 1:
            raise ValueError(
                "an attribute needs exactly one of int, bool, string, version; "
                f"got {', '.join(set_) or 'none'}"
            )
        attribute_value(set_)  # range and format checks of the slice API
        return self

    def to_api(self) -> dict[str, Any]:
        return attribute_value(self.model_dump(by_alias=True, exclude_none=True)).to_api()


class CapacitySpec(_Strict):
    value: Annotated[str, StringConstraints(min_length=1, max_length=64)]

    @model_validator(mode="after")
    def _quantity(self) -> CapacitySpec:
        try:
            parse_quantity(self.value)
        except QuantityError as e:
            raise ValueError(f"capacity value {self.value!r} is not a quantity: {e}") from e
        return self


class NetworkDevice(_Strict):
    name: DNSLabel = Field(description="Device name, unique in the pool (a DNS label).")
    attributes: dict[QualifiedName, AttributeSpec] = Field(
        default_factory=dict,
        max_length=32,
        description="Attributes as in a ResourceSlice; names without a domain get the driver's.",
    )
    capacity: dict[QualifiedName, CapacitySpec] = Field(default_factory=dict, max_length=32)
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=MAX_ENV,
        description="Environment variables for containers using the device (set by the node "
        "plugin next to what the attach backend returns).",
    )
    node_selector: NodeSelector | None = Field(
        default=None,
        alias="nodeSelector",
        description="Nodes that can reach this device, if it differs from the pool's.",
    )

    @model_validator(mode="after")
    def _limits(self) -> NetworkDevice:
        if len(self.attributes) + len(self.capacity) > 32:
            raise ValueError("at most 32 attributes and capacities per device")
        return self


class SimulatedBackend(_Strict):
    """Records attachments in memory; for tests and the demo."""

    latency_seconds: float = Field(
        default=0.2, ge=0, le=60, alias="latencySeconds", description="Delay of each call."
    )
    fail_devices: list[DNSLabel] = Field(
        default_factory=list,
        alias="failDevices",
        max_length=MAX_DEVICES,
        description="Attaching these devices fails (failure injection).",
    )


class ExecBackend(_Strict):
    """Runs ``command attach|detach`` with DRADRIVER_* variables in its environment."""

    command: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = Field(
        min_length=1, max_length=32
    )
    timeout_seconds: float = Field(default=60, gt=0, le=600, alias="timeoutSeconds")

    @model_validator(mode="after")
    def _absolute(self) -> ExecBackend:
        if not self.command[0].startswith("/"):
            raise ValueError(f"command[0] must be an absolute path, not {self.command[0]!r}")
        return self


class AttachSpec(_Strict):
    backend: Literal["simulated", "exec"] = Field(description="simulated or exec.")
    simulated: SimulatedBackend | None = None
    exec_: ExecBackend | None = Field(default=None, alias="exec")
    failure_cooldown_seconds: float = Field(
        default=60,
        ge=0,
        le=3600,
        alias="failureCooldownSeconds",
        description="After a failed attach the device carries a NoSchedule taint "
        "<driver>/attach-failed for this long, so the scheduler picks another device "
        "(needs DRADeviceTaints, on by default from 1.36); 0 disables.",
    )

    @model_validator(mode="after")
    def _settings_match(self) -> AttachSpec:
        if self.backend == "exec" and self.exec_ is None:
            raise ValueError("backend exec needs the exec section (command)")
        if self.backend == "simulated" and self.exec_ is not None:
            raise ValueError("the exec section is only for backend exec")
        if self.backend == "exec" and self.simulated is not None:
            raise ValueError("the simulated section is only for backend simulated")
        return self


class NetworkDevicePoolSpec(_Strict):
    """Devices reachable over a fabric, and the nodes that can reach them."""

    node_selector: NodeSelector | None = Field(
        default=None,
        alias="nodeSelector",
        description="Nodes that can reach the pool (one term); omitted: every node.",
    )
    attach: AttachSpec
    devices: list[NetworkDevice] = Field(min_length=1, max_length=MAX_DEVICES)

    @model_validator(mode="after")
    def _unique(self) -> NetworkDevicePoolSpec:
        seen: set[str] = set()
        for device in self.devices:
            if device.name in seen:
                raise ValueError(f"device name {device.name!r} is given twice")
            seen.add(device.name)
        return self


class Attachment(_Strict):
    """One device attached to one node for one claim (kept in the pool's status)."""

    device: str
    node: str
    claim: str = Field(description="namespace/name of the claim")
    claim_uid: str = Field(alias="claimUID")
    handle: str = Field(default="", description="What the backend returned for detach.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Container environment the backend returned."
    )
    attached_at: str = Field(alias="attachedAt")


class PoolCondition(_Strict):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = Field(default=None, alias="lastTransitionTime")
    observed_generation: int | None = Field(default=None, alias="observedGeneration")


class NetworkDevicePoolStatus(_Strict):
    conditions: list[PoolCondition] = Field(default_factory=list)
    attachments: list[Attachment] = Field(default_factory=list)


def parse_spec(spec: Any, where: str = "spec") -> NetworkDevicePoolSpec:
    """Validate a pool spec; :class:`NetworkPoolError` names each bad field."""
    try:
        return NetworkDevicePoolSpec.model_validate(spec if spec is not None else {})
    except ValidationError as e:
        raise NetworkPoolError(
            *under(where, from_validation_error(e, NetworkDevicePoolSpec))
        ) from e


def parse_status(obj: Mapping[str, Any]) -> NetworkDevicePoolStatus:
    """The status the controller wrote; an unreadable one counts as empty (and is logged)."""
    try:
        return NetworkDevicePoolStatus.model_validate(obj.get("status") or {})
    except ValidationError:
        return NetworkDevicePoolStatus()


def validate_object(obj: Mapping[str, Any]) -> NetworkDevicePoolSpec:
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise NetworkPoolError(FieldError("metadata", "must be an object"))
    name = metadata.get("name", "")
    if not isinstance(name, str):
        raise NetworkPoolError(FieldError("metadata.name", "must be a string"))
    try:
        names.validate_dns_label(name, "NetworkDevicePool name")
    except ValueError as e:
        raise NetworkPoolError(FieldError("metadata.name", str(e))) from e
    return parse_spec(obj.get("spec"))


# --- devices as published -----------------------------------------------------------------


def selector_to_api(selector: NodeSelector | None) -> dict[str, Any] | None:
    """A node selector in wire form (None: every node)."""
    return None if selector is None else selector.model_dump(by_alias=True, exclude_defaults=True)


def attach_failed_taint(driver: str) -> dict[str, Any]:
    """Put on a device whose attach just failed, for the pool's failure cooldown."""
    return {"key": f"{driver}/attach-failed", "value": "cooldown", "effect": "NoSchedule"}


def api_device(
    driver: str,
    device: NetworkDevice,
    per_device: bool,
    pool: NodeSelector | None,
    cooling: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": device.name}
    if device.attributes:
        out["attributes"] = {
            names.published_name(k, driver): v.to_api()
            for k, v in sorted(device.attributes.items())
        }
    if device.capacity:
        out["capacity"] = {
            names.published_name(k, driver): {"value": v.value}
            for k, v in sorted(device.capacity.items())
        }
    if per_device:
        selector = selector_to_api(device.node_selector or pool)
        if selector is None:
            out["allNodes"] = True
        else:
            out["nodeSelector"] = selector
    if cooling:
        out["taints"] = [attach_failed_taint(driver)]
    out["bindsToNode"] = True
    out["bindingConditions"] = [attached_condition(driver)]
    out["bindingFailureConditions"] = [attach_failed_condition(driver)]
    return out


# --- what the controller pins for the node plugin -----------------------------------------


@dataclass(frozen=True)
class PinnedAttachment:
    """The ``status.devices[].data`` of an attached network device, as the plugin reads it."""

    node: str
    handle: str
    env: dict[str, str]

    def to_data(self) -> dict[str, Any]:
        return {"node": self.node, "handle": self.handle, "env": dict(self.env)}


def device_status(
    claim: Mapping[str, Any], driver: str, pool: str, device: str
) -> dict[str, Any] | None:
    for entry in (claim.get("status") or {}).get("devices") or []:
        if (entry.get("driver"), entry.get("pool"), entry.get("device")) == (driver, pool, device):
            value: dict[str, Any] = entry
            return value
    return None


def condition_true(entry: Mapping[str, Any] | None, type_: str) -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == "True"
        for c in (entry or {}).get("conditions") or []
    )


def attachment_of(
    claim: Mapping[str, Any], driver: str, pool: str, device: str, node: str
) -> PinnedAttachment:
    """What the controller recorded for an attached device; NetworkPoolError says what is
    missing (the node plugin turns that into a prepare error the kubelet retries)."""
    entry = device_status(claim, driver, pool, device)
    if not condition_true(entry, attached_condition(driver)):
        raise NetworkPoolError(
            f"network device {pool}/{device} is not attached yet (condition "
            f"{attached_condition(driver)} is not True in the claim's status.devices)"
        )
    data = (entry or {}).get("data") or {}
    attached_to = data.get("node")
    if attached_to != node:
        raise NetworkPoolError(
            f"network device {pool}/{device} is attached to node {attached_to!r}, not to {node!r}"
        )
    env = data.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise NetworkPoolError(f"network device {pool}/{device}: data.env must map strings")
    return PinnedAttachment(node=node, handle=str(data.get("handle") or ""), env=dict(env))


# --- CRD --------------------------------------------------------------------------------

CRD_KIND = CRDKind(
    kind=KIND,
    plural=PLURAL,
    singular=SINGULAR,
    scope="Cluster",
    description="Devices reachable over a network fabric, published by dradriver's "
    "controller as ResourceSlices that span nodes; attached to a node on allocation.",
    spec_model=NetworkDevicePoolSpec,
    status_model=NetworkDevicePoolStatus,
    source="dradriver.api.networkpool",
    file_name=CRD_FILE_NAME,
    version=VERSION,
    short_names=SHORT_NAMES,
    printer_columns=(
        {"name": "Backend", "type": "string", "jsonPath": ".spec.attach.backend"},
        {
            "name": "Published",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Published")].status',
        },
    ),
)


def crd(group: str = DEFAULT_DRIVER_NAME) -> dict[str, Any]:
    return CRD_KIND.crd(group)


def crd_yaml(group: str = DEFAULT_DRIVER_NAME) -> str:
    return CRD_KIND.crd_yaml(group)
