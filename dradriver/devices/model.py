"""The device model: one description of a device for the whole project.

A :class:`Device` says what the scheduler sees (attributes, capacity, counters it consumes,
taints, whether it can be shared) and what a container gets (:class:`ContainerEdits`), plus
how its health is judged (``health_files``). Sources build devices; ResourceSlices are
built from :meth:`Device.to_api`; the allocator reads the same objects.

Limits are the resource.k8s.io/v1 validation limits of Kubernetes 1.35/1.36 (see
/work/shared/reference/resource-v1.md §5), so a device that validates here is accepted by
the apiserver.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from dradriver.devices.attributes import AttributeInput, AttributeValue
from dradriver.host.containeredits import ContainerEdits
from dradriver.k8s import names
from dradriver.k8s.quantity import Quantity, parse_quantity, quantity_as_int

MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE = 32
MAX_TAINTS_PER_DEVICE = 16
MAX_TAINTS_FROM_CONFIG = MAX_TAINTS_PER_DEVICE - 1  # one is reserved for the unhealthy taint
MAX_COUNTER_CONSUMPTIONS_PER_DEVICE = 2
MAX_COUNTERS_PER_SET = 32
MAX_REQUEST_POLICY_VALID_VALUES = 10

UNHEALTHY_TAINT_NAME = "unhealthy"
UNHEALTHY_TAINT_VALUE = "HealthCheckFailed"


def _device_name(value: str) -> str:
    return names.validate_dns_label(value, "device name")


def _counter_name(value: str) -> str:
    return names.validate_dns_label(value, "counter name")


def _counter_set_name(value: str) -> str:
    return names.validate_dns_label(value, "counter set name")


def _attribute_name(value: str) -> str:
    return names.validate_qualified_name(value, "attribute name")


def _capacity_name(value: str) -> str:
    return names.validate_qualified_name(value, "capacity name")


def _taint_key(value: str) -> str:
    return names.validate_label_name(value, "taint key")


def _taint_value(value: str) -> str:
    return names.validate_label_value(value, "taint value")


DeviceName = Annotated[str, AfterValidator(_device_name)]
CounterName = Annotated[str, AfterValidator(_counter_name)]
CounterSetName = Annotated[str, AfterValidator(_counter_set_name)]
AttributeName = Annotated[str, AfterValidator(_attribute_name)]
CapacityName = Annotated[str, AfterValidator(_capacity_name)]


def unhealthy_taint_key(driver: str) -> str:
    """The key of the taint an unhealthy device gets, e.g. ``dradriver.dev/unhealthy``."""
    return f"{driver}/{UNHEALTHY_TAINT_NAME}"


def _counters_to_api(counters: dict[str, str]) -> dict[str, Any]:
    return {name: {"value": value} for name, value in sorted(counters.items())}


def _counters_input(value: object) -> object:
    # Counters may be written as `{memory: 4Gi}` or, like the API, `{memory: {value: 4Gi}}`.
    if isinstance(value, dict):
        return {
            k: (v["value"] if isinstance(v, dict) and set(v) == {"value"} else v)
            for k, v in value.items()
        }
    return value


# --------------------------------------------------------------------------------------------
# Capacity
# --------------------------------------------------------------------------------------------


class CapacityRequestPolicyRange(BaseModel):
    """Valid consumable amounts: ``min`` up to ``max`` (if set) in steps of ``step`` (if set)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    min: Quantity
    max: Quantity | None = None
    step: Quantity | None = None

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"min": self.min}
        if self.max is not None:
            out["max"] = self.max
        if self.step is not None:
            out["step"] = self.step
        return out


class CapacityRequestPolicy(BaseModel):
    """How requests consume a shared device's capacity (KEP-5075, consumable capacity)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    default: Quantity | None = None
    valid_values: tuple[Quantity, ...] = Field(default=(), alias="validValues")
    valid_range: CapacityRequestPolicyRange | None = Field(default=None, alias="validRange")

    @model_validator(mode="after")
    def _one_kind(self) -> CapacityRequestPolicy:
        if self.valid_values and self.valid_range is not None:
            raise ValueError("set at most one of validValues and validRange")
        if len(self.valid_values) > MAX_REQUEST_POLICY_VALID_VALUES:
            raise ValueError(
                f"validValues has {len(self.valid_values)} entries; at most "
                f"{MAX_REQUEST_POLICY_VALID_VALUES} are allowed"
            )
        if (self.valid_values or self.valid_range is not None) and self.default is None:
            raise ValueError("default is required when validValues or validRange is set")
        return self

    def check_against(self, capacity: str) -> None:
        """The apiserver's checks of the policy against the capacity value it belongs to."""
        total = parse_quantity(capacity)
        if self.valid_values:
            self._check_valid_values(total)
        if self.valid_range is not None:
            self._check_range(self.valid_range, total)

    def _check_valid_values(self, total: Decimal) -> None:
        values = [parse_quantity(v) for v in self.valid_values]
        if values != sorted(values) or len(set(values)) != len(values):
            raise ValueError("validValues must be unique and in ascending order")
        if values[-1] > total:
            raise ValueError(f"validValues entry {self.valid_values[-1]} exceeds the capacity")
        assert self.default is not None
        if parse_quantity(self.default) not in values:
            raise ValueError(f"default {self.default} is not one of validValues")

    def _check_range(self, valid_range: CapacityRequestPolicyRange, total: Decimal) -> None:
        assert self.default is not None
        low, default = parse_quantity(valid_range.min), parse_quantity(self.default)
        if low > total:
            raise ValueError(f"validRange.min {valid_range.min} exceeds the capacity")
        if default < low:
            raise ValueError(f"default {self.default} is less than validRange.min")
        if valid_range.max is not None:
            high = parse_quantity(valid_range.max)
            if low > high:
                raise ValueError("validRange.min is larger than validRange.max")
            if high > total:
                raise ValueError(f"validRange.max {valid_range.max} exceeds the capacity")
            if default > high:
                raise ValueError(f"default {self.default} is more than validRange.max")
        if valid_range.step is not None:
            step = parse_quantity(valid_range.step)
            if step <= 0:
                raise ValueError("validRange.step must be positive")
            if low + step > total:
                raise ValueError("validRange.min plus one step exceeds the capacity")
            step_int, min_int = quantity_as_int(valid_range.step), quantity_as_int(valid_range.min)
            aligned = [("default", self.default)]
            if valid_range.max is not None:
                aligned.append(("validRange.max", valid_range.max))
            for what, value in aligned:
                if (quantity_as_int(value) - min_int) % step_int:
                    raise ValueError(
                        f"{what} {value} is not validRange.min plus a multiple of validRange.step"
                    )

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.default is not None:
            out["default"] = self.default
        if self.valid_values:
            out["validValues"] = list(self.valid_values)
        if self.valid_range is not None:
            out["validRange"] = self.valid_range.to_api()
        return out


class Capacity(BaseModel):
    """A device capacity: ``16Gi`` in configuration, or ``{value: 16Gi, requestPolicy: ...}``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    value: Quantity
    request_policy: CapacityRequestPolicy | None = Field(default=None, alias="requestPolicy")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if not isinstance(data, dict | Capacity):
            return {"value": data}
        return data

    @model_validator(mode="after")
    def _policy_fits(self) -> Capacity:
        if self.request_policy is not None:
            self.request_policy.check_against(self.value)
        return self

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value}
        if self.request_policy is not None:
            out["requestPolicy"] = self.request_policy.to_api()
        return out


# --------------------------------------------------------------------------------------------
# Counters (partitionable devices, KEP-4815)
# --------------------------------------------------------------------------------------------


def _counters_limit(counters: dict[str, str]) -> dict[str, str]:
    if not counters:
        raise ValueError("at least one counter is required")
    if len(counters) > MAX_COUNTERS_PER_SET:
        raise ValueError(
            f"{len(counters)} counters given; at most {MAX_COUNTERS_PER_SET} are allowed"
        )
    return counters


Counters = Annotated[
    dict[CounterName, Quantity],
    BeforeValidator(_counters_input),
    AfterValidator(_counters_limit),
]
"""Counter name -> quantity; ``{name: {value: q}}`` (the API form) is accepted as input."""


class CounterSet(BaseModel):
    """Named counters shared by the devices of a pool (published in ``sharedCounters``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: CounterSetName
    counters: Counters

    def to_api(self) -> dict[str, Any]:
        return {"name": self.name, "counters": _counters_to_api(self.counters)}


class CounterConsumption(BaseModel):
    """What allocating a device takes from one counter set."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    counter_set: CounterSetName = Field(alias="counterSet")
    counters: Counters

    def to_api(self) -> dict[str, Any]:
        return {"counterSet": self.counter_set, "counters": _counters_to_api(self.counters)}


# --------------------------------------------------------------------------------------------
# Taints
# --------------------------------------------------------------------------------------------


class DeviceTaint(BaseModel):
    """A taint on a device: requests without a matching toleration do not get it."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    key: Annotated[str, AfterValidator(_taint_key)]
    value: Annotated[str, AfterValidator(_taint_value)] = ""
    effect: Literal["NoSchedule", "NoExecute", "None"]

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key}
        if self.value:
            out["value"] = self.value
        out["effect"] = self.effect
        return out


# --------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------


class DeviceProperties(BaseModel):
    """Everything about a device except its name and health.

    :class:`Device` adds those; configuration templates for discovered devices reuse this
    class so a field means the same everywhere.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    attributes: dict[AttributeName, AttributeInput] = Field(default_factory=dict)
    capacity: dict[CapacityName, Capacity] = Field(default_factory=dict)
    consumes_counters: tuple[CounterConsumption, ...] = Field(default=(), alias="consumesCounters")
    taints: tuple[DeviceTaint, ...] = ()
    allow_multiple_allocations: bool = Field(default=False, alias="allowMultipleAllocations")
    edits: ContainerEdits = Field(default_factory=ContainerEdits)
    health_files: tuple[str, ...] = Field(default=(), alias="healthFiles")

    @model_validator(mode="after")
    def _api_limits(self) -> DeviceProperties:
        total = len(self.attributes) + len(self.capacity)
        if total > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
            raise ValueError(
                f"{total} attributes and capacities; at most "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE} are allowed per device"
            )
        if not self.allow_multiple_allocations:
            for name, capacity in self.capacity.items():
                if capacity.request_policy is not None:
                    raise ValueError(
                        f"capacity {name!r} has a requestPolicy, which needs "
                        "allowMultipleAllocations: true"
                    )
        if len(self.consumes_counters) > MAX_COUNTER_CONSUMPTIONS_PER_DEVICE:
            raise ValueError(
                f"consumesCounters has {len(self.consumes_counters)} entries; at most "
                f"{MAX_COUNTER_CONSUMPTIONS_PER_DEVICE} are allowed"
            )
        sets = [c.counter_set for c in self.consumes_counters]
        if len(set(sets)) != len(sets):
            raise ValueError(f"consumesCounters names a counter set twice: {sets}")
        if len(self.taints) > MAX_TAINTS_FROM_CONFIG:
            raise ValueError(
                f"{len(self.taints)} taints; at most {MAX_TAINTS_FROM_CONFIG} are allowed "
                f"(the API allows {MAX_TAINTS_PER_DEVICE}, one is kept for the unhealthy taint)"
            )
        return self

    def qualified_attributes(self, driver: str) -> dict[str, AttributeValue]:
        """Attributes under their fully qualified names (``model`` -> ``<driver>/model``)."""
        return _qualified(self.attributes, driver, "attribute")

    def qualified_capacity(self, driver: str) -> dict[str, Capacity]:
        """Capacities under their fully qualified names."""
        return _qualified(self.capacity, driver, "capacity")


_V = TypeVar("_V")


def _qualified(items: dict[str, _V], driver: str, what: str) -> dict[str, _V]:
    out: dict[str, _V] = {}
    given: dict[str, str] = {}
    for name in sorted(items):
        full = names.qualify(name, driver)
        if full in out:
            raise ValueError(f"{what} names {given[full]!r} and {name!r} both mean {full!r}")
        out[full] = items[name]
        given[full] = name
    return dict(sorted(out.items()))


class Device(DeviceProperties):
    """One allocatable device of this node."""

    name: DeviceName
    healthy: bool = True

    def api_taints(self, driver: str) -> list[dict[str, Any]]:
        """The taints to publish: the configured ones plus the unhealthy taint if unhealthy."""
        taints = [t.to_api() for t in self.taints]
        if not self.healthy:
            taints.append(
                {
                    "key": unhealthy_taint_key(driver),
                    "value": UNHEALTHY_TAINT_VALUE,
                    "effect": "NoSchedule",
                }
            )
        return taints

    def to_api(self, driver: str) -> dict[str, Any]:
        """The resource.k8s.io/v1 ``Device`` JSON (only the fields that are set)."""
        out: dict[str, Any] = {"name": self.name}
        # Qualified first, so that "model" and "<driver>/model" given together are an error,
        # then published without the driver's own domain (see names.published_name).
        attributes = self.qualified_attributes(driver)
        if attributes:
            out["attributes"] = {
                names.published_name(k, driver): v.to_api() for k, v in attributes.items()
            }
        capacity = self.qualified_capacity(driver)
        if capacity:
            out["capacity"] = {
                names.published_name(k, driver): v.to_api() for k, v in capacity.items()
            }
        if self.consumes_counters:
            out["consumesCounters"] = [c.to_api() for c in self.consumes_counters]
        taints = self.api_taints(driver)
        if taints:
            out["taints"] = taints
        if self.allow_multiple_allocations:
            out["allowMultipleAllocations"] = True
        return out
