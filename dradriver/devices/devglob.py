"""The ``devglob`` source: one device per path matching a glob, e.g. ``/dev/fake*``.

A device is named after its path's basename (made a DNS label), has the template's
attributes plus ``path``, and passes the path to containers as a device node. A path seen
once stays in the inventory: when it disappears the device turns unhealthy (so allocations
of it are not silently orphaned), and healthy again when it comes back.

Only character and block devices become devices: a container runtime refuses a CDI device
node whose host path is anything else, so a plain file or directory the glob matches is
skipped with a warning. A symlink to a device node (``/dev/disk/by-id/...``) is handed to
the runtime as the node it points to, since the runtime's CDI library does not follow
links; the container still sees the matched path.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import stat

from dradriver.devices.attributes import ATTRIBUTE_VALUE_MAX_LENGTH, StringAttribute
from dradriver.devices.health import HealthChecker
from dradriver.devices.model import Device, DeviceProperties
from dradriver.devices.sourceconfig import DevGlobSourceConfig
from dradriver.host.containeredits import ContainerEdits, DeviceNode
from dradriver.k8s import names
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
        self._rejected: set[str] = set()  # matches that are not device nodes, warned about
        self._health = HealthChecker(name)

    @property
    def name(self) -> str:
        return self._name

    def _device_node_host_path(self, path: str) -> str | None:
        """The device node behind ``path`` (itself or a symlink's target), or None."""
        try:
            host_path = os.path.realpath(path, strict=True)  # OSError on a symlink loop
            st = os.stat(host_path)
        except OSError as e:
            problem = f"cannot be resolved: {e.strerror or e}"
        else:
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                return host_path
            problem = "is not a character or block device"
        if path not in self._rejected:
            self._rejected.add(path)  # once per path: discovery runs every few seconds
            log.warning(
                f"glob match {problem}; skipped (containers get device nodes only)",
                source=self._name,
                path=path,
            )
        return None

    def _device_for(self, path: str, host_path: str, device_name: str) -> Device:
        template: DeviceProperties = self._template
        attributes = dict(template.attributes)
        if len(path) <= ATTRIBUTE_VALUE_MAX_LENGTH:
            attributes["path"] = StringAttribute(value=path)
        else:
            log.warning("path too long for an attribute, omitted", source=self._name, path=path)
        edits = ContainerEdits(device_nodes=(DeviceNode(path=path, host_path=host_path),))
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
            host_path = self._device_node_host_path(path)
            if host_path is None:
                continue
            self._rejected.discard(path)
            device_name = device_name_for_path(path)
            if device_name in taken:
                device_name = _disambiguated(device_name, path)
            self._known[path] = self._device_for(path, host_path, device_name)
            taken.add(device_name)
            log.info("device found", source=self._name, device=device_name, path=path)
        return [self._health.check(d) for d in self._known.values()]
