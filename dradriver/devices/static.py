"""The ``static`` source: devices declared in configuration, optionally backed by mock files.

With ``mockDir`` set, every device gets a mock device file ``<mockDir>/<name>`` (mode 0600,
created on the first :meth:`StaticSource.discover`), passed to containers as the device node
``/dev/dradriver/<name>`` with ``DRADRIVER_DEVICE_<NAME>=/dev/dradriver/<name>`` in the
environment. The file is also the device's health file: deleting it makes the device
unhealthy, recreating it makes it healthy again. This is what the demo and tests use.
"""

from __future__ import annotations

import os
from pathlib import Path

from dradriver.devices.config import StaticSourceConfig
from dradriver.devices.health import HealthChecker
from dradriver.devices.model import Device
from dradriver.host.containeredits import ContainerEdits, DeviceNode
from dradriver.log import get_logger

log = get_logger("devices.static")

MOCK_DEVICE_DIR_IN_CONTAINER = "/dev/dradriver"
MOCK_ENV_PREFIX = "DRADRIVER_DEVICE_"


def mock_env_name(device: str) -> str:
    """``dev-0`` -> ``DRADRIVER_DEVICE_DEV_0``."""
    return MOCK_ENV_PREFIX + device.upper().replace("-", "_")


def with_mock_file(device: Device, mock_dir: str) -> Device:
    """``device`` backed by the mock file ``<mock_dir>/<name>``."""
    host_path = os.path.join(mock_dir, device.name)
    container_path = f"{MOCK_DEVICE_DIR_IN_CONTAINER}/{device.name}"
    mock_edits = ContainerEdits(
        env={mock_env_name(device.name): container_path},
        device_nodes=(DeviceNode(path=container_path, host_path=host_path),),
    )
    return device.model_copy(
        update={
            "edits": mock_edits.merged(device.edits),
            "health_files": (host_path, *device.health_files),
        }
    )


def create_mock_file(path: str, content: str) -> bool:
    """Create ``path`` with mode 0600 unless it exists; True if it was created."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(content)
    return True


class StaticSource:
    def __init__(self, name: str, config: StaticSourceConfig) -> None:
        self._name = name
        self._mock_dir = config.mock_dir
        devices = [d for entry in config.devices for d in entry.expand()]
        if self._mock_dir is not None:
            devices = [with_mock_file(d, self._mock_dir) for d in devices]
        self._devices = devices
        self._mock_files_ready = False
        self._health = HealthChecker(name)

    @property
    def name(self) -> str:
        return self._name

    def _create_mock_files(self, mock_dir: str) -> None:
        Path(mock_dir).mkdir(parents=True, exist_ok=True)
        created = [
            d.name
            for d in self._devices
            if create_mock_file(os.path.join(mock_dir, d.name), f"{d.name}\n")
        ]
        log.info(
            "mock device files ready",
            source=self._name,
            dir=mock_dir,
            devices=len(self._devices),
            created=len(created),
        )

    def discover(self) -> list[Device]:
        if self._mock_dir is not None and not self._mock_files_ready:
            self._create_mock_files(self._mock_dir)
            self._mock_files_ready = True
        return [self._health.check(d) for d in self._devices]
