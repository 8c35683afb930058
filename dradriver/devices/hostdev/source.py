"""The ``host`` source: a profile's devices, remembered across scans and hot-plugs.

Invariants:

* A device seen once stays in the inventory under its name. While its nodes are gone it is
  unhealthy (so allocations of it are not silently orphaned); when the same identity comes
  back, under any kernel name, it is healthy again with edits naming the new node.
* Health is presence and the profile's ``healthFiles``; each change is logged once.
* A problem with a path (not a device node, no identity) is logged once while it lasts.
* Shared devices are published per :mod:`.slots`, as capacity when the owner says the
  cluster keeps consumable capacity (``consumable_capacity``), as slot devices otherwise.

:meth:`HostDeviceSource.discover` is the :class:`~dradriver.devices.sources.DeviceSource`
call (it rescans); :meth:`HostDeviceSource.watch_dirs` tells a hot-plug watcher where to look.
Its records go to the ``devices.hostdev`` logger.
"""

from __future__ import annotations

import os

from dradriver.devices.health import missing_health_files
from dradriver.devices.hostdev import discovery, slots
from dradriver.devices.hostdev.config import HostSourceConfig
from dradriver.devices.hostdev.sysfs import BY_ID_DIRS, BY_PATH_DIRS
from dradriver.devices.model import Device, DeviceProperties
from dradriver.host.containeredits import ContainerEdits, DeviceNode, Mount
from dradriver.log import get_logger

log = get_logger("devices.hostdev")

READ_ONLY_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")


def container_edits(
    config: HostSourceConfig, members: tuple[discovery.Member, ...]
) -> ContainerEdits:
    """The nodes of one device (at their container paths), the profile's env and mounts."""
    return ContainerEdits(
        env=dict(config.env),
        device_nodes=tuple(
            DeviceNode(path=m.container_path, host_path=m.host_path, permissions=m.node.permissions)
            for m in members
        ),
        mounts=tuple(
            Mount(
                host_path=m.host_path,
                container_path=m.container_path,
                options=READ_ONLY_MOUNT_OPTIONS,
            )
            for m in config.mounts
        ),
    )


def device_for(config: HostSourceConfig, found: discovery.Found) -> Device:
    """The exclusive device of one scan result (before slots and health)."""
    properties = {field: getattr(config, field) for field in DeviceProperties.model_fields}
    return Device.model_validate(
        {
            **properties,
            "name": found.name,
            "attributes": {**config.attributes, **found.attributes},
            "edits": container_edits(config, found.members),
        }
    )


def watch_dirs(config: HostSourceConfig) -> set[str]:
    """Directories (on disk; globs for glob directories) whose entries decide the profile's
    devices and identities."""
    dirs = {os.path.dirname(config.on_disk(node.path)) for node in config.nodes}
    for link_dir in (*BY_ID_DIRS, *BY_PATH_DIRS):
        dirs.add(os.path.join(config.dev_root, link_dir))
    return dirs


class HostDeviceSource:
    def __init__(
        self, name: str, config: HostSourceConfig, *, consumable_capacity: bool = False
    ) -> None:
        self._name = name
        self._config = config
        self.consumable_capacity = consumable_capacity
        """Whether the cluster keeps consumable capacity (the start-up probe's answer)."""
        self._known: dict[str, Device] = {}  # device name -> last seen, in discovery order
        self._healthy: dict[str, bool] = {}
        self._problems: dict[str, str] = {}  # path -> problem, as last logged

    @property
    def name(self) -> str:
        return self._name

    @property
    def config(self) -> HostSourceConfig:
        return self._config

    def watch_dirs(self) -> set[str]:
        return watch_dirs(self._config)

    @property
    def shared(self) -> bool:
        """Whether the profile is shared by count (``share``)."""
        return self._config.share is not None

    def discover(self) -> list[Device]:
        """Rescan the profile: every device it has had, with health now, slots expanded."""
        result = discovery.scan(self._config)
        self._log_problems(result.problems)
        present = set()
        for found in result.found:
            device = device_for(self._config, found)
            self._note_change(self._known.get(found.name), device)
            self._known[found.name] = device
            present.add(found.name)
        out = []
        for name, device in self._known.items():
            healthy = name in present and not missing_health_files(device)
            self._note_health(name, healthy)
            if healthy != device.healthy:
                device = device.model_copy(update={"healthy": healthy})
            out.extend(slots.publish(device, self._config.share, self.consumable_capacity))
        return out

    def _note_change(self, before: Device | None, now: Device) -> None:
        path = now.attributes.get("path")
        where = path.to_api().get("string", "") if path is not None else ""
        if before is None:
            log.info("device found", source=self._name, device=now.name, path=where)
        elif before.edits != now.edits:
            log.info("device nodes changed", source=self._name, device=now.name, path=where)

    def _note_health(self, name: str, healthy: bool) -> None:
        previous = self._healthy.get(name, True)
        if healthy != previous:
            if healthy:
                log.info("device healthy again", source=self._name, device=name)
            else:
                log.warning(
                    "device unhealthy: its nodes are gone or a health file is missing",
                    source=self._name,
                    device=name,
                )
        self._healthy[name] = healthy

    def _log_problems(self, problems: dict[str, str]) -> None:
        for path, problem in problems.items():
            if self._problems.get(path) != problem:
                log.warning(f"host device path {problem}", source=self._name, path=path)
        self._problems = dict(problems)
