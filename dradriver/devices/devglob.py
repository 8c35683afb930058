"""The ``devglob`` source: one device per path matching a glob, e.g. ``/dev/fake*``.

A device is named after its path's basename (made a DNS label), has the template's
attributes plus ``path``, and passes the path to containers as a device node. A path seen
once stays in the inventory: when it disappears the device turns unhealthy (so allocations
of it are not silently orphaned), and healthy again when it comes back.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re

from dradriver.devices import names
from dradriver.devices.attributes import ATTRIBUTE_VALUE_MAX_LENGTH, StringAttribute
from dradriver.devices.config import DevGlobSourceConfig
from dradriver.devices.health import HealthChecker
from dradriver.devices.model import Device, DeviceProperties
from dradriver.host.containeredits import ContainerEdits, DeviceNode
from dradriver.log import get_logger

log = get_logger("devices.devglob")


def device_name_for_path(path: str) -> str:
    """A DNS label from a path's basename: ``/dev/Fake_GPU.0`` -> ``fake-gpu-0``."""
    base = os.path.basename(path.rstrip("/")).lower()
    label = re.sub(r"[^a-z0-9]+", "-", base).strip("-")[: names.DNS_LABEL_MAX_LENGTH]
    label = label.rstrip("-")
    if not label:
        label = "dev-" + hashlib.sha256(path.encode()).hexdigest()[:8]
    return label


def _disambiguated(label: str, path: str) -> str:
    suffix = "-" + hashlib.sha256(path.encode()).hexdigest()[:8]
    return label[: names.DNS_LABEL_MAX_LENGTH - len(suffix)].rstrip("-") + suffix


class DevGlobSource:
    def __init__(self, name: str, config: DevGlobSourceConfig) -> None:
        self._name = name
        self._pattern = config.glob
        self._template = config
        self._known: dict[str, Device] = {}  # path -> device, in discovery order
        self._health = HealthChecker(name)

    @property
    def name(self) -> str:
        return self._name

    def _device_for(self, path: str, device_name: str) -> Device:
        template: DeviceProperties = self._template
        attributes = dict(template.attributes)
        if len(path) <= ATTRIBUTE_VALUE_MAX_LENGTH:
            attributes["path"] = StringAttribute(value=path)
        else:
            log.warning("path too long for an attribute, omitted", source=self._name, path=path)
        edits = ContainerEdits(device_nodes=(DeviceNode(path=path, host_path=path),))
        return Device.model_validate(
            {
                **{field: getattr(template, field) for field in DeviceProperties.model_fields},
                "name": device_name,
                "attributes": attributes,
                "edits": edits.merged(template.edits),
                "health_files": (path, *template.health_files),
            }
        )

    def discover(self) -> list[Device]:
        taken = {d.name for d in self._known.values()}
        for path in sorted(glob.glob(self._pattern)):
            if path in self._known:
                continue
            device_name = device_name_for_path(path)
            if device_name in taken:
                device_name = _disambiguated(device_name, path)
            self._known[path] = self._device_for(path, device_name)
            taken.add(device_name)
            log.info("device found", source=self._name, device=device_name, path=path)
        return [self._health.check(d) for d in self._known.values()]
