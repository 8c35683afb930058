"""Device sources: where the node's inventory comes from.

A source is anything with a ``name`` and a ``discover()`` that returns the current
inventory with health evaluated. Adding a hardware type means writing one source (and, if
needed, a setup/teardown hook), nothing else.
"""

from __future__ import annotations

from typing import Protocol

from dradriver.devices.config import DriverConfig
from dradriver.devices.devglob import DevGlobSource
from dradriver.devices.hostdev.source import HostDeviceSource
from dradriver.devices.model import Device
from dradriver.devices.pci import PciSource
from dradriver.devices.static import StaticSource


class DeviceSource(Protocol):
    @property
    def name(self) -> str:
        """Where the source comes from, for logs and errors, e.g. ``sources[0] (static)``."""
        ...

    def discover(self) -> list[Device]:
        """The current inventory, with health evaluated."""
        ...


class DeviceSourceError(Exception):
    """The inventory of the sources cannot be published."""


class DuplicateDeviceError(DeviceSourceError):
    """Two sources produced devices with the same name."""

    def __init__(self, device: str, first: str, second: str) -> None:
        super().__init__(f"device name {device!r} is produced by both {first} and {second}")
        self.device = device
        self.sources = (first, second)


def build_sources(config: DriverConfig) -> list[DeviceSource]:
    """The configured sources, in configuration order (nothing is read or created yet)."""
    sources: list[DeviceSource] = []
    for index, source in enumerate(config.sources):
        name = f"sources[{index}] ({source.kind})"
        if source.static is not None:
            sources.append(StaticSource(name, source.static))
        elif source.devglob is not None:
            sources.append(DevGlobSource(name, source.devglob))
        elif source.pci is not None:
            sources.append(PciSource(name, source.pci))
        elif source.host is not None:
            sources.append(HostDeviceSource(name, source.host))
    return sources


def discover_all(sources: list[DeviceSource]) -> list[Device]:
    """Every source's devices, sorted by name; raises :class:`DuplicateDeviceError`."""
    owner: dict[str, str] = {}
    devices: list[Device] = []
    for source in sources:
        for device in source.discover():
            if device.name in owner:
                raise DuplicateDeviceError(device.name, owner[device.name], source.name)
            owner[device.name] = source.name
            devices.append(device)
    return sorted(devices, key=lambda d: d.name)
