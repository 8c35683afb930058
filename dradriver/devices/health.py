"""Device health from files: a device is healthy while all of its ``health_files`` exist."""

from __future__ import annotations

import os

from dradriver.devices.model import Device
from dradriver.log import get_logger

log = get_logger("devices.health")


def missing_health_files(device: Device) -> list[str]:
    return [path for path in device.health_files if not os.path.exists(path)]


class HealthChecker:
    """Sets each device's ``healthy`` from its health files; logs every change once."""

    def __init__(self, source: str) -> None:
        self._source = source
        self._last: dict[str, bool] = {}

    def check(self, device: Device) -> Device:
        missing = missing_health_files(device)
        healthy = not missing
        previous = self._last.get(device.name, True)
        if healthy != previous:
            if healthy:
                log.info("device healthy again", source=self._source, device=device.name)
            else:
                log.warning(
                    "device unhealthy: health file missing",
                    source=self._source,
                    device=device.name,
                    missing=",".join(missing),
                )
        self._last[device.name] = healthy
        if healthy == device.healthy:
            return device
        return device.model_copy(update={"healthy": healthy})
