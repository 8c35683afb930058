"""The driver configuration file: one YAML document validated by pydantic models.

Keys are camelCase in YAML and snake_case in Python; unknown keys are errors, and every
error names the file and the field path, e.g.
``driver.yaml: sources[0].static.devices[2].name: device name 'Dev_2' is not a DNS label``.

Example::

    driverName: dradriver.dev
    counterSets:
      - name: gpu-0-memory
        counters: {memory: 16Gi}
    sources:
      - static:
          mockDir: /var/run/dradriver/mock
          devices:
            - namePrefix: dev
              count: 4
              attributes: {model: mock-1, firmware: {version: 1.2.3}}
      - devglob: {glob: /dev/fake*}
      - pci: {vendor: "0x10de", class: "0x03"}
    hooks:
      setup: {command: [/usr/local/bin/setup-device], timeoutSeconds: 30,
              capabilities: [NET_ADMIN]}   # what the hook needs (the chart grants it)
      teardown: {python: "mypkg.hooks:teardown"}
    devicePlugin:                  # the legacy device-plugin shim (off by default)
      enabled: true
      mode: partitioned            # or shared
      resources:
        - resourceName: dradriver.dev/mock
          devices: {names: ["dev-0", "dev-1"]}
      preStart: {command: [/usr/local/bin/setup-device]}
    extendedResources: auto        # how host profiles' extendedResourceName is served:
                                   # auto (probe the cluster), dra or devicePlugin
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from dradriver.devices.attributes import AttributeInput, IntAttribute
from dradriver.devices.configfields import ExtendedResourceName, check_absolute_path
from dradriver.devices.configyaml import (
    MAX_CONFIG_BYTES,
    UNKNOWN_KEY,
    DriverConfigError,
    config_error,
    load_yaml,
)
from dradriver.devices.hostdev.config import HOST_ATTRIBUTES, HostSourceConfig
from dradriver.devices.model import (
    MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE,
    AttributeName,
    CounterSet,
    Device,
    DeviceProperties,
)
from dradriver.devices.sourceconfig import SourceConfig
from dradriver.devices.topology import MAX_NUMA_NODES, NUMA_NODE_ATTRIBUTE
from dradriver.errors import from_validation_error
from dradriver.host.capabilities import check_name as check_capability_name
from dradriver.k8s import names

DEFAULT_DRIVER_NAME = "dradriver.dev"
DEFAULT_HOOK_TIMEOUT_SECONDS = 30
EXTENDED_RESOURCE_ATTRIBUTE = "extendedResource"
"""The attribute that sets a device aside for an extended resource (``<driver>/extendedResource``):
DeviceClasses with ``extendedResourceName`` select by it, the plain class leaves it out."""
ExtendedResourcesPath = Literal["auto", "dra", "devicePlugin"]


# --------------------------------------------------------------------------------------------
# Hooks
# --------------------------------------------------------------------------------------------

_PYTHON_TARGET = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*")


class HookSpec(BaseModel):
    """A program run around a device's use: ``command`` (argv) or ``python`` (module:function).

    ``capabilities``: the Linux capabilities the hook needs beyond root's file access
    (``NET_ADMIN`` to create network interfaces, ``SYS_ADMIN`` to attach loop devices or
    mount); the chart adds them to the plugin's container, and the plugin refuses to start
    without them (:mod:`kubeletplugin.privileges`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    command: tuple[str, ...] | None = None
    python: str | None = None
    timeout_seconds: int = Field(
        default=DEFAULT_HOOK_TIMEOUT_SECONDS, ge=1, le=3600, alias="timeoutSeconds"
    )
    capabilities: tuple[Annotated[str, AfterValidator(check_capability_name)], ...] = ()

    @model_validator(mode="after")
    def _exactly_one(self) -> HookSpec:
        if (self.command is None) == (self.python is None):
            raise ValueError("set exactly one of command and python")
        if self.command is not None and (not self.command or not self.command[0]):
            raise ValueError("command must be a non-empty list whose first item is the program")
        if self.python is not None and not _PYTHON_TARGET.fullmatch(self.python):
            raise ValueError(f"python {self.python!r} must have the form 'package.module:function'")
        return self


class Hooks(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    setup: HookSpec | None = None
    teardown: HookSpec | None = None


# --------------------------------------------------------------------------------------------
# The device-plugin shim
# --------------------------------------------------------------------------------------------

# The kubelet gives PreStartContainer 30 s; the hook must finish (and the answer travel) first.
KUBELET_PRE_START_TIMEOUT_SECONDS = 30
MAX_PRE_START_HOOK_SECONDS = 28


class DevicePluginSelector(BaseModel):
    """Which devices a resource serves: all of the given conditions must hold.

    ``names`` are device names or shell patterns (``dev-*``); ``attributes`` must all be
    equal (names as in ``sources``: ``model`` means ``<driver>/model``). An empty selector
    selects every device.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    names: tuple[Annotated[str, Field(min_length=1)], ...] = ()
    attributes: dict[AttributeName, AttributeInput] = Field(default_factory=dict)

    def matches(self, device: Device, driver: str) -> bool:
        if self.names and not any(fnmatch.fnmatchcase(device.name, p) for p in self.names):
            return False
        if self.attributes:
            have = device.qualified_attributes(driver)
            for name, value in self.attributes.items():
                if have.get(names.qualify(name, driver)) != value:
                    return False
        return True


class DevicePluginResource(BaseModel):
    """One extended resource served through the device-plugin API."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    resource_name: ExtendedResourceName = Field(alias="resourceName")
    devices: DevicePluginSelector = Field(default_factory=DevicePluginSelector)


class DevicePluginConfig(BaseModel):
    """The legacy device-plugin shim: the same devices through the v1beta1 API.

    ``partitioned``: the devices the resources select are served only through the device
    plugin, the rest only through DRA. ``shared``: DRA sees every device too; a device held
    through one API is hidden from the other (``hideFromDRA``: tainted or removed in the
    ResourceSlices; reported Unhealthy in ListAndWatch).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    enabled: bool = False
    mode: Literal["partitioned", "shared"] = "partitioned"
    resources: tuple[DevicePluginResource, ...] = ()
    pre_start: HookSpec | None = Field(default=None, alias="preStart")
    preferred_allocation: bool = Field(default=True, alias="preferredAllocation")
    hide_from_dra: Literal["taint", "remove"] = Field(default="taint", alias="hideFromDRA")
    pod_resources_interval_seconds: float = Field(
        default=2.0, gt=0, le=300, alias="podResourcesIntervalSeconds"
    )
    release_grace_seconds: float = Field(default=60.0, ge=0, le=3600, alias="releaseGraceSeconds")

    @model_validator(mode="after")
    def _check(self) -> DevicePluginConfig:
        if self.enabled and not self.resources:
            raise ValueError(
                "resources: the device plugin is enabled but serves no resource; add at least "
                "one {resourceName: <domain>/<name>, devices: {...}}"
            )
        seen: dict[str, int] = {}
        for index, resource in enumerate(self.resources):
            if resource.resource_name in seen:
                raise ValueError(
                    f"resources[{index}].resourceName: {resource.resource_name!r} is also used "
                    f"by resources[{seen[resource.resource_name]}]"
                )
            seen[resource.resource_name] = index
        hook = self.pre_start
        if (
            hook is not None
            and "timeout_seconds" in hook.model_fields_set
            and hook.timeout_seconds > MAX_PRE_START_HOOK_SECONDS
        ):
            raise ValueError(
                f"preStart.timeoutSeconds: {hook.timeout_seconds} is too long; the kubelet gives "
                f"PreStartContainer {KUBELET_PRE_START_TIMEOUT_SECONDS} s, so use at most "
                f"{MAX_PRE_START_HOOK_SECONDS}"
            )
        return self

    @property
    def pre_start_timeout(self) -> float:
        if self.pre_start is None:
            return 0.0
        return float(min(self.pre_start.timeout_seconds, MAX_PRE_START_HOOK_SECONDS))

    def resource_of(self, device: Device, driver: str) -> str | None:
        """The resource serving ``device`` (the first whose selector matches), if any."""
        for resource in self.resources:
            if resource.devices.matches(device, driver):
                return resource.resource_name
        return None

    def overlaps(self, devices: Iterable[Device], driver: str) -> list[str]:
        """Devices more than one resource selects, described for an error message."""
        out = []
        for device in devices:
            hits = [r.resource_name for r in self.resources if r.devices.matches(device, driver)]
            if len(hits) > 1:
                out.append(f"{device.name} ({', '.join(hits)})")
        return out


# --------------------------------------------------------------------------------------------
# The file
# --------------------------------------------------------------------------------------------


class DriverConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    driver_name: Annotated[str, AfterValidator(names.validate_driver_name)] = Field(
        default=DEFAULT_DRIVER_NAME, alias="driverName"
    )
    sources: tuple[SourceConfig, ...] = ()
    counter_sets: tuple[CounterSet, ...] = Field(default=(), alias="counterSets")
    hooks: Hooks = Field(default_factory=Hooks)
    device_plugin: DevicePluginConfig = Field(
        default_factory=DevicePluginConfig, alias="devicePlugin"
    )
    extended_resources: ExtendedResourcesPath = Field(default="auto", alias="extendedResources")
    """How host profiles' ``extendedResourceName`` is served on a node: through DRA (a
    DeviceClass with ``extendedResourceName``) or the device-plugin shim; ``auto`` asks the
    cluster at start-up (kubeletplugin.extendedresources)."""

    @model_validator(mode="after")
    def _counter_references(self) -> DriverConfig:
        declared: dict[str, set[str]] = {}
        for index, counter_set in enumerate(self.counter_sets):
            if counter_set.name in declared:
                raise ValueError(
                    f"counterSets[{index}].name: counter set {counter_set.name!r} is declared twice"
                )
            declared[counter_set.name] = set(counter_set.counters)
        for path, properties in self._device_properties():
            for c_index, consumption in enumerate(properties.consumes_counters):
                where = f"{path}.consumesCounters[{c_index}]"
                known = declared.get(consumption.counter_set)
                if known is None:
                    raise ValueError(
                        f"{where}.counterSet: counter set {consumption.counter_set!r} is not "
                        "declared in counterSets"
                    )
                unknown = sorted(set(consumption.counters) - known)
                if unknown:
                    raise ValueError(
                        f"{where}.counters: counter set {consumption.counter_set!r} has no "
                        f"counters {unknown}"
                    )
        return self

    @model_validator(mode="after")
    def _attribute_names(self) -> DriverConfig:
        for path, properties in self._device_properties():
            for field, keys in (
                ("attributes", properties.attributes),
                ("capacity", properties.capacity),
            ):
                what = "attribute" if field == "attributes" else "capacity"
                for key in keys:
                    problem = names.own_domain_prefix_problem(key, self.driver_name, what)
                    if problem is not None:
                        raise ValueError(f"{path}.{field}.{key}: {problem}")
            numa = properties.attributes.get(NUMA_NODE_ATTRIBUTE)
            if numa is not None and not (
                isinstance(numa, IntAttribute) and 0 <= numa.value < MAX_NUMA_NODES
            ):
                raise ValueError(
                    f"{path}.attributes.{NUMA_NODE_ATTRIBUTE}: must be an int NUMA node from 0 "
                    f"to {MAX_NUMA_NODES - 1}; leave it out for a device without NUMA affinity"
                )
        return self

    @model_validator(mode="after")
    def _extended_resource_names(self) -> DriverConfig:
        """No ``devicePlugin.resources`` entry takes a host profile's ``extendedResourceName``
        (several profiles may share one: their devices serve it together), and the profiles
        have room for the ``extendedResource`` attribute the name adds to their devices."""
        owner: dict[str, str] = {}
        for path, name, profile in self.extended_resource_profiles():
            owner.setdefault(name, path)
            if EXTENDED_RESOURCE_ATTRIBUTE in profile.attributes:
                raise ValueError(
                    f"{path}.attributes.{EXTENDED_RESOURCE_ATTRIBUTE}: set from "
                    f"{path}.extendedResourceName; remove the attribute"
                )
            total = len(profile.attributes) + len(profile.capacity) + len(HOST_ATTRIBUTES) + 2
            if total > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
                raise ValueError(
                    f"{path}.attributes: extendedResourceName adds the attribute "
                    f"{EXTENDED_RESOURCE_ATTRIBUTE}, which makes {total} attributes and "
                    f"capacities; at most {MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE} are allowed "
                    "per device, so remove one"
                )
        for index, resource in enumerate(self.device_plugin.resources):
            if resource.resource_name in owner:
                raise ValueError(
                    f"devicePlugin.resources[{index}].resourceName: {resource.resource_name!r} "
                    f"is {owner[resource.resource_name]}.extendedResourceName, which the "
                    "driver serves itself (through DRA or the device plugin, see "
                    "extendedResources); remove this resource or the profile's "
                    "extendedResourceName"
                )
        return self

    def hooks_by_field(self) -> Iterator[tuple[str, HookSpec]]:
        """``(field path, hook)`` of every hook the configuration sets."""
        for name, hook in (
            ("hooks.setup", self.hooks.setup),
            ("hooks.teardown", self.hooks.teardown),
            ("devicePlugin.preStart", self.device_plugin.pre_start),
        ):
            if hook is not None:
                yield name, hook

    def extended_resource_profiles(self) -> Iterator[tuple[str, str, HostSourceConfig]]:
        """``(field path, extendedResourceName, profile)`` of each host profile that has one."""
        for index, source in enumerate(self.sources):
            host = source.host
            if host is not None and host.extended_resource_name is not None:
                yield f"sources[{index}].host", host.extended_resource_name, host

    def _device_properties(self) -> Iterator[tuple[str, DeviceProperties]]:
        for index, source in enumerate(self.sources):
            if source.static is not None:
                for d_index, entry in enumerate(source.static.devices):
                    yield f"sources[{index}].static.devices[{d_index}]", entry
            elif source.devglob is not None:
                yield f"sources[{index}].devglob", source.devglob
            elif source.pci is not None:
                yield f"sources[{index}].pci", source.pci
            elif source.host is not None:
                yield f"sources[{index}].host", source.host

    def with_mock_dir(self, mock_dir: str) -> DriverConfig:
        """This configuration with every static source that has a ``mockDir`` using ``mock_dir``.

        For tests and the demo, which keep mock device nodes in their own state directory.
        """
        check_absolute_path(mock_dir)
        sources = tuple(
            source.model_copy(
                update={"static": source.static.model_copy(update={"mock_dir": mock_dir})}
            )
            if source.static is not None and source.static.mock_dir is not None
            else source
            for source in self.sources
        )
        return self.model_copy(update={"sources": sources})


def parse_config(text: str, file: str = "<config>") -> DriverConfig:
    """Validate a configuration given as YAML text; ``file`` names it in errors.

    Raises :class:`DriverConfigError`, and nothing else, whatever the text.
    """
    data = load_yaml(text, file)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DriverConfigError(file, f"the top level must be a mapping, not {type(data).__name__}")
    try:
        return DriverConfig.model_validate(data)
    except ValidationError as err:
        raise config_error(file, from_validation_error(err, unknown_field=UNKNOWN_KEY)) from err


def load_config(path: str | os.PathLike[str]) -> DriverConfig:
    """Read and validate the configuration file; raises :class:`DriverConfigError`."""
    file = str(path)
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)  # bounded: the path may be /dev/zero or a FIFO
    except OSError as err:
        raise DriverConfigError(
            file, f"cannot read the configuration file: {err.strerror}"
        ) from err
    if len(data) > MAX_CONFIG_BYTES:
        raise DriverConfigError(file, f"the configuration is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DriverConfigError(
            file, f"not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start}"
        ) from err
    return parse_config(text, file)
