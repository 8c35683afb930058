"""Where the devices come from: the ``sources`` list of the driver configuration.

Invariants: a source entry has exactly one kind (``static``, ``devglob``, ``pci``, ``host``: the
host-device profiles of :mod:`dradriver.devices.hostdev`);
a template for discovered devices leaves room for the attributes its source sets itself.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from dradriver.devices.attributes import IntAttribute
from dradriver.devices.configfields import AbsolutePath, HexClass, HexID, reserved_attributes
from dradriver.devices.hostdev.config import HostSourceConfig
from dradriver.devices.model import Device, DeviceName, DeviceProperties
from dradriver.k8s import names

INDEX_ATTRIBUTE = "index"
MAX_DEVICE_COUNT = 100_000

DEVGLOB_ATTRIBUTES = ("path",)
PCI_ATTRIBUTES = (
    "pciAddress",
    "vendorID",
    "deviceID",
    "class",
    "resource.kubernetes.io/numaNode",
    "resource.kubernetes.io/pcieRoot",
)


def _name_prefix(value: str) -> str:
    return names.validate_dns_label(value, "namePrefix")


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
        reserved_attributes(self, (INDEX_ATTRIBUTE,), "the count shorthand")
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


class DevGlobSourceConfig(DeviceProperties):
    """One device per path matching ``glob``; the other fields apply to every such device."""

    glob: AbsolutePath

    @model_validator(mode="after")
    def _room_for_path(self) -> DevGlobSourceConfig:
        reserved_attributes(self, DEVGLOB_ATTRIBUTES, "the devglob source")
        return self


class PciSourceConfig(DeviceProperties):
    """PCI devices found in sysfs, filtered by vendor, device and class prefix."""

    sysfs_root: AbsolutePath = Field(default="/sys", alias="sysfsRoot")
    vendor: HexID | None = None
    device: HexID | None = None
    device_class: HexClass | None = Field(default=None, alias="class")

    @model_validator(mode="after")
    def _room_for_pci(self) -> PciSourceConfig:
        reserved_attributes(self, PCI_ATTRIBUTES, "the pci source")
        return self


SourceKind = Literal["static", "devglob", "pci", "host"]
SOURCE_KINDS: tuple[SourceKind, ...] = ("static", "devglob", "pci", "host")


class SourceConfig(BaseModel):
    """One device source: exactly one of ``static``, ``devglob``, ``pci``, ``host``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    static: StaticSourceConfig | None = None
    devglob: DevGlobSourceConfig | None = None
    pci: PciSourceConfig | None = None
    host: HostSourceConfig | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SourceConfig:
        given = [k for k in SOURCE_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "a source must have exactly one of the keys static, devglob, pci, host; "
                f"got {', '.join(given) or 'none'}"
            )
        return self

    @property
    def kind(self) -> SourceKind:
        if self.static is not None:
            return "static"
        if self.devglob is not None:
            return "devglob"
        if self.host is not None:
            return "host"
        return "pci"
