"""The plugin's privileges: the capabilities its configuration's hooks declare must be ones
this process has, checked before anything serves.

Invariant: the plugin starts only if every capability a hook lists
(``hooks.setup.capabilities``, ``hooks.teardown.capabilities``,
``devicePlugin.preStart.capabilities``) is in the process's effective set, or the set cannot
be read (then a warning): a hook without its capability would fail every prepare of every
pod, long after the rollout looked healthy. The chart grants exactly the declared ones
(``deployments/helm/dradriver/templates/kubeletplugin/daemonset.yaml``).
"""

from __future__ import annotations

from pathlib import Path

from dradriver.devices.config import DriverConfig
from dradriver.host.capabilities import effective
from dradriver.log import get_logger

log = get_logger("kubeletplugin")


class MissingCapabilities(RuntimeError):
    """A hook declares a capability this process lacks; the message names the field and fix."""


def missing(config: DriverConfig, have: frozenset[str]) -> list[str]:
    """``<field>.capabilities: <NAME>`` for each declared capability not in ``have``."""
    return [
        f"{field}.capabilities: {name}"
        for field, hook in config.hooks_by_field()
        for name in hook.capabilities
        if name not in have
    ]


def require(config: DriverConfig, status: Path = Path("/proc/self/status")) -> None:
    """Raise :class:`MissingCapabilities` unless every declared capability is effective."""
    have = effective(status)
    if have is None:
        if any(hook.capabilities for _, hook in config.hooks_by_field()):
            log.warning("cannot read the effective capabilities; hooks' not checked")
        return
    lacking = missing(config, have)
    if lacking:
        raise MissingCapabilities(
            "hooks need capabilities this process does not have: "
            + "; ".join(lacking)
            + ". Add them to the container's securityContext.capabilities.add (the chart "
            "does so from the configuration; check that the DaemonSet was rendered from "
            "this configuration), or remove them from the hook if it does not need them"
        )
