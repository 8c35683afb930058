"""The device-plugin shim's start-up error, apart from the shim: the plugin's entry point
names it without loading the shim on nodes that do not run one."""

from __future__ import annotations


class DevicePluginSetupError(ValueError):
    """The device-plugin configuration does not fit the devices found on this node."""
