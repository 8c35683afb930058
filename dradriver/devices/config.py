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
      setup: {command: [/usr/local/bin/setup-device], timeoutSeconds: 30}
      teardown: {python: "mypkg.hooks:teardown"}
    devicePlugin:                  # the legacy device-plugin shim (off by default)
      enabled: true
      mode: partitioned            # or shared
      resources:
        - resourceName: dradriver.dev/mock
          devices: {names: ["dev-0", "dev-1"]}
      preStart: {command: [/usr/local/bin/setup-device]}
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Hashable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from dradriver.devices.attributes import AttributeInput, IntAttribute
from dradriver.devices.model import (
    MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE,
    AttributeName,
    CounterSet,
    Device,
    DeviceName,
    DeviceProperties,
)
from dradriver.devices.topology import MAX_NUMA_NODES, NUMA_NODE_ATTRIBUTE
from dradriver.errors import FieldError, FieldErrors, from_validation_error
from dradriver.k8s import names

DEFAULT_DRIVER_NAME = "dradriver.dev"
INDEX_ATTRIBUTE = "index"
MAX_DEVICE_COUNT = 100_000
DEFAULT_HOOK_TIMEOUT_SECONDS = 30

DEVGLOB_ATTRIBUTES = ("path",)
PCI_ATTRIBUTES = (
    "pciAddress",
    "vendorID",
    "deviceID",
    "class",
    "resource.kubernetes.io/numaNode",
    "resource.kubernetes.io/pcieRoot",
)


UNKNOWN_KEY = "unknown key (check its spelling and indentation)"


class DriverConfigError(FieldErrors):
    """The driver configuration file cannot be read or is invalid.

    ``file`` names it; ``errors`` are the field errors as text (``path: message``). Several
    errors read one per line, since a person fixes them in an editor.
    """

    def __init__(self, file: str, *errors: FieldError | str) -> None:
        super().__init__(*errors, subject=file)
        self.file = file
        self.errors = [str(e) for e in self.field_errors]
        if len(self.errors) != 1:
            lines = "\n".join(f"  {e}" for e in self.errors)
            self.args = (f"{file}: {len(self.errors)} errors:\n{lines}",)


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


def _name_prefix(value: str) -> str:
    return names.validate_dns_label(value, "namePrefix")


def _absolute_path(value: str) -> str:
    if not os.path.isabs(value):
        raise ValueError(f"{value!r} is not an absolute path")
    return value


AbsolutePath = Annotated[str, AfterValidator(_absolute_path)]


def _reserved_attributes(
    template: DeviceProperties, reserved: tuple[str, ...], added_by: str
) -> None:
    """Checks a template for devices a source discovers: room for the source's attributes."""
    clash = sorted(set(template.attributes) & set(reserved))
    if clash:
        raise ValueError(f"attributes {clash} are set by {added_by} itself")
    total = len(template.attributes) + len(template.capacity) + len(reserved)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
        raise ValueError(
            f"{added_by} adds {len(reserved)} attributes, which makes {total} "
            f"attributes and capacities; at most {MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE} "
            "are allowed per device"
        )


class StaticDeviceEntry(DeviceProperties):
    """A device declared in configuration, or ``count`` of them named ``<namePrefix>-<i>``."""

    name: DeviceName | None = None
    name_prefix: Annotated[str, AfterValidator(_name_prefix)] | None = Field(
        default=None, alias="namePrefix"
    )
    count: int | None = Field(default=None, ge=1, le=MAX_DEVICE_COUNT)

    @model_validator(mode="after")
    def _name_or_count(self) -> StaticDeviceEntry:
        if self.count is None:
            if self.name is None:
                raise ValueError("set name, or count (with an optional namePrefix)")
            if self.name_prefix is not None:
                raise ValueError("namePrefix needs count")
            return self
        if self.name is not None:
            raise ValueError("set either name or count, not both")
        longest = f"{self.prefix}-{self.count - 1}"
        if len(longest) > names.DNS_LABEL_MAX_LENGTH:
            raise ValueError(
                f"device name {longest!r} would be longer than {names.DNS_LABEL_MAX_LENGTH} "
                "characters; use a shorter namePrefix"
            )
        _reserved_attributes(self, (INDEX_ATTRIBUTE,), "the count shorthand")
        return self

    @property
    def prefix(self) -> str:
        return self.name_prefix or "dev"

    def device_names(self) -> list[str]:
        if self.count is None:
            assert self.name is not None
            return [self.name]
        return [f"{self.prefix}-{i}" for i in range(self.count)]

    def expand(self) -> list[Device]:
        """The devices this entry declares; an expanded one gets an ``index`` attribute."""
        properties = {field: getattr(self, field) for field in DeviceProperties.model_fields}
        if self.count is None:
            return [Device.model_validate({**properties, "name": self.name})]
        return [
            Device.model_validate(
                {
                    **properties,
                    "name": name,
                    "attributes": {**self.attributes, INDEX_ATTRIBUTE: IntAttribute(value=i)},
                }
            )
            for i, name in enumerate(self.device_names())
        ]


class StaticSourceConfig(BaseModel):
    """Devices declared in configuration; with ``mockDir``, each gets a mock device node."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    mock_dir: AbsolutePath | None = Field(default=None, alias="mockDir")
    devices: tuple[StaticDeviceEntry, ...] = ()

    @model_validator(mode="after")
    def _unique_names(self) -> StaticSourceConfig:
        seen: dict[str, int] = {}
        for index, entry in enumerate(self.devices):
            for name in entry.device_names():
                if name in seen:
                    raise ValueError(
                        f"device name {name!r} of devices[{index}] is also used by "
                        f"devices[{seen[name]}]"
                    )
                seen[name] = index
        return self


HexID = Annotated[str, AfterValidator(lambda v: _hex(v, 4, 4, "a PCI ID"))]
HexClass = Annotated[str, AfterValidator(lambda v: _hex(v, 1, 6, "a PCI class prefix"))]


def _hex(value: str, low: int, high: int, what: str) -> str:
    digits = value.lower().removeprefix("0x")
    if not low <= len(digits) <= high or not re.fullmatch(r"[0-9a-f]+", digits):
        size = f"{low}" if low == high else f"{low} to {high}"
        raise ValueError(f"{value!r} is not {what}: expected {size} hex digits, e.g. 0x10de")
    return "0x" + digits


class DevGlobSourceConfig(DeviceProperties):
    """One device per path matching ``glob``; the other fields apply to every such device."""

    glob: AbsolutePath

    @model_validator(mode="after")
    def _room_for_path(self) -> DevGlobSourceConfig:
        _reserved_attributes(self, DEVGLOB_ATTRIBUTES, "the devglob source")
        return self


class PciSourceConfig(DeviceProperties):
    """PCI devices found in sysfs, filtered by vendor, device and class prefix."""

    sysfs_root: AbsolutePath = Field(default="/sys", alias="sysfsRoot")
    vendor: HexID | None = None
    device: HexID | None = None
    device_class: HexClass | None = Field(default=None, alias="class")

    @model_validator(mode="after")
    def _room_for_pci(self) -> PciSourceConfig:
        _reserved_attributes(self, PCI_ATTRIBUTES, "the pci source")
        return self


SourceKind = Literal["static", "devglob", "pci"]


class SourceConfig(BaseModel):
    """One device source: exactly one of ``static``, ``devglob``, ``pci``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    static: StaticSourceConfig | None = None
    devglob: DevGlobSourceConfig | None = None
    pci: PciSourceConfig | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SourceConfig:
        given = [k for k in ("static", "devglob", "pci") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "a source must have exactly one of the keys static, devglob, pci; "
                f"got {', '.join(given) or 'none'}"
            )
        return self

    @property
    def kind(self) -> SourceKind:
        if self.static is not None:
            return "static"
        if self.devglob is not None:
            return "devglob"
        return "pci"


# --------------------------------------------------------------------------------------------
# Hooks
# --------------------------------------------------------------------------------------------

_PYTHON_TARGET = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*")


class HookSpec(BaseModel):
    """A program run around a device's use: ``command`` (argv) or ``python`` (module:function)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    command: tuple[str, ...] | None = None
    python: str | None = None
    timeout_seconds: int = Field(
        default=DEFAULT_HOOK_TIMEOUT_SECONDS, ge=1, le=3600, alias="timeoutSeconds"
    )

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


def validate_extended_resource_name(value: str) -> str:
    """The kubelet's rule for a device-plugin resource name (``IsExtendedResourceName``)."""
    if "/" not in value:
        raise ValueError(
            f"resource name {value!r} needs a domain: use <domain>/<name>, e.g. dradriver.dev/mock"
        )
    if "kubernetes.io/" in value:
        raise ValueError(
            f"resource name {value!r} is in the kubernetes.io namespace, which is reserved for "
            "native resources; use your own domain, e.g. dradriver.dev/mock"
        )
    if value.startswith("requests."):
        raise ValueError(f"resource name {value!r} must not start with 'requests.'")
    try:
        names.validate_label_name(f"requests.{value}", "resource name")
    except ValueError as err:
        raise ValueError(
            f"resource name {value!r} is not a valid extended resource name "
            f"(<DNS subdomain>/<name of letters, digits, '-', '_', '.'>): {err}"
        ) from err
    return value


ExtendedResourceName = Annotated[str, AfterValidator(validate_extended_resource_name)]


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

    def _device_properties(self) -> Iterator[tuple[str, DeviceProperties]]:
        for index, source in enumerate(self.sources):
            if source.static is not None:
                for d_index, entry in enumerate(source.static.devices):
                    yield f"sources[{index}].static.devices[{d_index}]", entry
            elif source.devglob is not None:
                yield f"sources[{index}].devglob", source.devglob
            elif source.pci is not None:
                yield f"sources[{index}].pci", source.pci

    def with_mock_dir(self, mock_dir: str) -> DriverConfig:
        """This configuration with every static source that has a ``mockDir`` using ``mock_dir``.

        For tests and the demo, which keep mock device nodes in their own state directory.
        """
        _absolute_path(mock_dir)
        sources = tuple(
            source.model_copy(
                update={"static": source.static.model_copy(update={"mock_dir": mock_dir})}
            )
            if source.static is not None and source.static.mock_dir is not None
            else source
            for source in self.sources
        )
        return self.model_copy(update={"sources": sources})


# Bounds on what the YAML parser is given and builds, so that odd input is a
# DriverConfigError instead of a RecursionError, a hang or memory exhaustion. A real
# configuration is a few KiB, at most a dozen levels deep, and a few thousand values (the
# ``count`` shorthand stands for up to 100 000 devices in one entry). PyYAML's pure-Python
# scanner reads about 50 000 tokens/s, so 1 MiB takes up to ~20 s; libyaml's CSafeLoader
# is not used because its composer recurses in C, where no recursion limit applies.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_NESTING = 64
"""Levels of mappings and sequences, counted after aliases are expanded."""
MAX_NODES = 200_000
"""Scalars, mappings and sequences after aliases are expanded: a document of a few hundred
bytes can stand for billions of values through aliases of aliases ("billion laughs")."""
MAX_REPORTED_ERRORS = 50

# What SafeConstructor raises, besides YAMLError, for a scalar it resolved but cannot
# convert: ``2001-02-30`` (ValueError), ``!!bool maybe`` (KeyError), ``!!timestamp x``
# (AttributeError), a 5 000-digit integer (ValueError).
_SCALAR_ERRORS = (ValueError, TypeError, LookupError, AttributeError, OverflowError)


class _StrictLoader(yaml.SafeLoader):
    """A YAML loader that refuses duplicate and unhashable keys, nesting deeper than
    :data:`MAX_NESTING` (PyYAML's composer and constructor recurse) and more than
    :data:`MAX_NODES` nodes while composing, and
    turns a scalar it cannot convert into a ConstructorError that points at it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        self._nodes += 1  # stop scanning early: the expanded count checked later is larger
        try:
            problem = None
            if self._depth > MAX_NESTING:
                problem = f"nested deeper than {MAX_NESTING} levels"
            elif self._nodes > MAX_NODES:
                problem = f"more than {MAX_NODES} values (keys, scalars, mappings and sequences)"
            if problem is not None:
                event = self.peek_event()  # type: ignore[no-untyped-call]  # (types-pyyaml)
                raise yaml.composer.ComposerError(None, None, problem, event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except _SCALAR_ERRORS as err:
            value = f" {node.value!r}" if isinstance(node, yaml.ScalarNode) else ""
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read the value{value}: {err}", node.start_mark
            ) from err


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        mark = key_node.start_mark
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(
                None, None, f"a key must be a scalar, not a {type(key).__name__}", mark
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        seen.add(key)
    return dict(loader.construct_mapping(node, deep=True))


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates
)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _expansion_problem(root: yaml.Node) -> str | None:
    """Why the composed document is too big once its aliases are expanded, if it is.

    An alias is the same node object as its anchor, so the walk is over a graph: sizes and
    heights are memoised per node (linear in the text, whatever the expansion), and a node
    reached from inside itself is a recursive alias. Iterative: the graph may be deep.
    """
    done: dict[int, tuple[int, int]] = {}  # id -> (expanded nodes, height)
    started: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finishing = stack.pop()
        key = id(node)
        if finishing:
            children = [done[id(c)] for c in _children(node)]
            size = 1 + sum(s for s, _ in children)
            height = 1 + max((h for _, h in children), default=0)
            if size > MAX_NODES:
                return (
                    f"the document has more than {MAX_NODES} values (keys, scalars, mappings "
                    "and sequences, counting each use of an alias in full)"
                )
            if height > MAX_NESTING:
                return f"the document is nested deeper than {MAX_NESTING} levels through aliases"
            done[key] = (size, height)
            started.discard(key)
            continue
        if key in done:
            continue
        if key in started:
            return f"recursive alias (line {node.start_mark.line + 1}): a value contains itself"
        started.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in done)
    return None


def _load_yaml(text: str, file: str) -> Any:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise DriverConfigError(
            file, f"the configuration is {size} bytes long; at most {MAX_CONFIG_BYTES} are allowed"
        )
    loader: _StrictLoader | None = None
    try:
        loader = _StrictLoader(text)  # reads the stream: a ReaderError for a NUL, a surrogate
        node = loader.get_single_node()
        if node is None:
            return None
        problem = _expansion_problem(node)
        if problem is not None:
            raise DriverConfigError(file, problem)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        raise DriverConfigError(file, f"not valid YAML: {err}") from err
    finally:
        if loader is not None:
            loader.dispose()


def _config_error(file: str, errors: Sequence[FieldError]) -> DriverConfigError:
    """At most :data:`MAX_REPORTED_ERRORS` of ``errors``: a list of 100 000 bad entries must
    not make a message of megabytes."""
    if len(errors) <= MAX_REPORTED_ERRORS:
        return DriverConfigError(file, *errors)
    more = len(errors) - MAX_REPORTED_ERRORS
    return DriverConfigError(file, *errors[:MAX_REPORTED_ERRORS], f"... and {more} more errors")


def parse_config(text: str, file: str = "<config>") -> DriverConfig:
    """Validate a configuration given as YAML text; ``file`` names it in errors.

    Raises :class:`DriverConfigError`, and nothing else, whatever the text.
    """
    data = _load_yaml(text, file)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DriverConfigError(file, f"the top level must be a mapping, not {type(data).__name__}")
    try:
        return DriverConfig.model_validate(data)
    except ValidationError as err:
        raise _config_error(file, from_validation_error(err, unknown_field=UNKNOWN_KEY)) from err


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
