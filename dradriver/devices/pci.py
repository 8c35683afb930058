"""The ``pci`` source: PCI devices from sysfs (``<root>/bus/pci/devices/*``).

Each device (after the vendor / device / class-prefix filters) gets the attributes
``pciAddress``, ``vendorID``, ``deviceID``, ``class`` and the standard
``resource.kubernetes.io/numaNode`` (scalar int from ``numa_node``; omitted when the kernel
reports -1, as a device without NUMA affinity must not publish it, or a value beyond
Linux's 1024 nodes) and ``resource.kubernetes.io/pcieRoot``: the PCIe root complex
(``pci<domain>:<bus>``) found in the resolved sysfs path, e.g.
``/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0`` -> ``pci0000:00``. The device name
comes from the address (``0000:01:00.0`` -> ``pci-0000-01-00-0``). A device seen once stays
in the inventory and is unhealthy while its sysfs entry is gone.
"""

from __future__ import annotations

import os
import re

from dradriver.devices.attributes import AttributeValue, IntAttribute, StringAttribute
from dradriver.devices.health import HealthChecker
from dradriver.devices.model import Device, DeviceProperties
from dradriver.devices.sourceconfig import PciSourceConfig
from dradriver.devices.topology import MAX_NUMA_NODES, NUMA_NODE_ATTRIBUTE, PCIE_ROOT_ATTRIBUTE
from dradriver.log import get_logger

log = get_logger("devices.pci")

_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4,}:[0-9a-f]{2,}")


def device_name_for_address(address: str) -> str:
    """``0000:00:01.0`` -> ``pci-0000-00-01-0``."""
    return "pci-" + re.sub(r"[^0-9a-z]+", "-", address.lower()).strip("-")


def pcie_root(sysfs_device_path: str) -> str | None:
    """The root complex (``pci0000:00``) in the resolved path of a sysfs PCI device."""
    for part in os.path.realpath(sysfs_device_path).split(os.sep):
        if _PCIE_ROOT.fullmatch(part):
            return part
    return None


def _read(directory: str, name: str) -> str | None:
    try:
        with open(os.path.join(directory, name), encoding="ascii") as f:
            return f.read().strip().lower()
    except (OSError, UnicodeDecodeError):
        return None


class PciSource:
    def __init__(self, name: str, config: PciSourceConfig) -> None:
        self._name = name
        self._config = config
        self._devices_dir = os.path.join(config.sysfs_root, "bus", "pci", "devices")
        self._known: dict[str, Device] = {}  # address -> device
        self._health = HealthChecker(name)
        self._warned_missing_dir = False

    @property
    def name(self) -> str:
        return self._name

    def _matches(self, vendor: str, device: str, device_class: str) -> bool:
        config = self._config
        return (
            (config.vendor is None or vendor == config.vendor)
            and (config.device is None or device == config.device)
            and (config.device_class is None or device_class.startswith(config.device_class))
        )

    def _read_device(self, address: str) -> Device | None:
        """The device at ``address`` if it is present and matches the filters."""
        path = os.path.join(self._devices_dir, address)
        vendor, device_id = _read(path, "vendor"), _read(path, "device")
        device_class = _read(path, "class")
        if vendor is None or device_id is None or device_class is None:
            return None
        if not self._matches(vendor, device_id, device_class):
            return None
        attributes: dict[str, AttributeValue] = dict(self._config.attributes)
        attributes["pciAddress"] = StringAttribute(value=address)
        attributes["vendorID"] = StringAttribute(value=vendor)
        attributes["deviceID"] = StringAttribute(value=device_id)
        attributes["class"] = StringAttribute(value=device_class)
        numa = _read(path, "numa_node")
        if numa is not None and re.fullmatch(r"\d{1,4}", numa) and int(numa) < MAX_NUMA_NODES:
            attributes[NUMA_NODE_ATTRIBUTE] = IntAttribute(value=int(numa))
        root = pcie_root(path)
        if root is not None:
            attributes[PCIE_ROOT_ATTRIBUTE] = StringAttribute(value=root)
        properties = {f: getattr(self._config, f) for f in DeviceProperties.model_fields}
        return Device.model_validate(
            {
                **properties,
                "name": device_name_for_address(address),
                "attributes": attributes,
                "health_files": (path, *self._config.health_files),
            }
        )

    def _addresses(self) -> list[str]:
        try:
            return sorted(os.listdir(self._devices_dir))
        except OSError as err:
            if not self._warned_missing_dir:
                log.warning(
                    "no PCI devices directory",
                    source=self._name,
                    dir=self._devices_dir,
                    error=err.strerror,
                )
                self._warned_missing_dir = True
            return []

    def discover(self) -> list[Device]:
        for address in self._addresses():
            if not os.path.isdir(os.path.join(self._devices_dir, address)):
                continue  # removed during the scan: a known device stays, and is unhealthy
            device = self._read_device(address)
            if device is None:
                self._known.pop(address, None)
            else:
                if address not in self._known:
                    log.info("device found", source=self._name, device=device.name)
                self._known[address] = device
        return [self._health.check(self._known[a]) for a in sorted(self._known)]
