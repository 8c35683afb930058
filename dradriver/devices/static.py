"""The ``static`` source: devices declared in configuration, optionally backed by mock nodes.

With ``mockDir`` set, every device gets a mock device node ``<mockDir>/<name>``: a character
device with the numbers of ``/dev/null`` (1:3), mode 0666, made on the first
:meth:`StaticSource.discover`. It is passed to containers as the device node
``/dev/dradriver/<name>`` with ``DRADRIVER_DEVICE_<NAME>=/dev/dradriver/<name>`` in the
environment. It has to be a real device node: a container runtime's CDI library takes a
device node's type and numbers from its host path and refuses the container
(CreateContainerError) when that path is a plain file. The node is also the device's health
file: deleting it makes the device unhealthy, recreating it (:func:`create_mock_device`)
makes it healthy again. This is what the demo and tests use.

Making device nodes needs CAP_MKNOD (the chart's DaemonSet adds it when a static source has
a ``mockDir``). Without it the source fails on its first discovery, naming the path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal

from dradriver.devices.health import HealthChecker
from dradriver.devices.model import Device
from dradriver.devices.sourceconfig import StaticSourceConfig
from dradriver.host.containeredits import ContainerEdits, DeviceNode
from dradriver.log import get_logger

log = get_logger("devices.static")

MOCK_DEVICE_DIR_IN_CONTAINER = "/dev/dradriver"
MOCK_ENV_PREFIX = "DRADRIVER_DEVICE_"
# /dev/null's numbers: a container that opens its mock device reads nothing and writes
# into the void, and every kernel has this device.
MOCK_DEVICE_MAJOR = 1
MOCK_DEVICE_MINOR = 3
MOCK_DEVICE_MODE = 0o666

MockDeviceOutcome = Literal["kept", "created", "replaced"]


class MockDeviceError(RuntimeError):
    """A mock device node cannot be made; the message names the path and what to do."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"mock device {path}: {reason}")
        self.path = path


def mock_env_name(device: str) -> str:
    """``dev-0`` -> ``DRADRIVER_DEVICE_DEV_0``."""
    return MOCK_ENV_PREFIX + device.upper().replace("-", "_")


def with_mock_device(device: Device, mock_dir: str) -> Device:
    """``device`` backed by the mock device node ``<mock_dir>/<name>``."""
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


def is_mock_device(st: os.stat_result) -> bool:
    """True for a character device with the mock numbers (whatever its mode)."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(
        MOCK_DEVICE_MAJOR, MOCK_DEVICE_MINOR
    )


def create_mock_device(path: str) -> MockDeviceOutcome:
    """Make ``path`` the mock device node; idempotent.

    A node with the mock numbers stays (its mode is set to 0666 if it differs). Anything
    else but a directory (the plain file an older dradriver wrote, a symlink, a node with
    other numbers) is replaced by a new node renamed over it, so the path never goes
    missing, which would flip the device to unhealthy for a moment.
    """
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and is_mock_device(st):
        if stat.S_IMODE(st.st_mode) != MOCK_DEVICE_MODE:
            os.chmod(path, MOCK_DEVICE_MODE)
        return "kept"
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise MockDeviceError(path, "is a directory, not a device node; remove it")
    directory, name = os.path.split(path)
    temp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        if os.path.lexists(temp):  # left by a crashed process with our PID
            os.unlink(temp)
        os.mknod(
            temp,
            stat.S_IFCHR | MOCK_DEVICE_MODE,
            os.makedev(MOCK_DEVICE_MAJOR, MOCK_DEVICE_MINOR),
        )
        os.chmod(temp, MOCK_DEVICE_MODE)  # mknod's mode is filtered by the umask
        os.replace(temp, path)
    except PermissionError as e:
        raise MockDeviceError(
            path,
            f"cannot make a character device node (mknod {MOCK_DEVICE_MAJOR}:"
            f"{MOCK_DEVICE_MINOR}): {e.strerror}; mock devices need CAP_MKNOD: run "
            "dradriver-kubeletplugin as root with CAP_MKNOD (the chart's DaemonSet adds it "
            "for a static source with mockDir), or remove mockDir from the static source",
        ) from e
    except OSError as e:
        raise MockDeviceError(
            path, f"cannot make a character device node there: {e.strerror or e}"
        ) from e
    finally:
        if os.path.lexists(temp):
            os.unlink(temp)
    return "created" if st is None else "replaced"


class StaticSource:
    def __init__(self, name: str, config: StaticSourceConfig) -> None:
        self._name = name
        self._mock_dir = config.mock_dir
        devices = [d for entry in config.devices for d in entry.expand()]
        if self._mock_dir is not None:
            devices = [with_mock_device(d, self._mock_dir) for d in devices]
        self._devices = devices
        self._mock_devices_ready = False
        self._health = HealthChecker(name)

    @property
    def name(self) -> str:
        return self._name

    def _create_mock_devices(self, mock_dir: str) -> None:
        try:
            Path(mock_dir).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MockDeviceError(mock_dir, f"cannot create the directory: {e.strerror}") from e
        outcomes = [create_mock_device(os.path.join(mock_dir, d.name)) for d in self._devices]
        replaced = [d.name for d, o in zip(self._devices, outcomes, strict=True) if o == "replaced"]
        if replaced:
            log.info(
                "replaced mock device files with device nodes",
                source=self._name,
                dir=mock_dir,
                devices=",".join(replaced),
            )
        log.info(
            "mock device nodes ready",
            source=self._name,
            dir=mock_dir,
            devices=len(self._devices),
            created=outcomes.count("created"),
            replaced=len(replaced),
        )

    def discover(self) -> list[Device]:
        if self._mock_dir is not None and not self._mock_devices_ready:
            self._create_mock_devices(self._mock_dir)
            self._mock_devices_ready = True
        return [self._health.check(d) for d in self._devices]
