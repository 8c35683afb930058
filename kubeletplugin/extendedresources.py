"""How host profiles' extended resources (``sources[].host.extendedResourceName``) are served
on this node: through DRA or through the device-plugin shim, never both ways.

Invariants:

* One path per node, chosen once at start-up, before the shim starts and before the first
  slice is synced, and said in the start-up line. ``extendedResources: dra`` or
  ``devicePlugin`` in the driver config forces it; ``auto`` (the default) takes DRA only
  where the apiserver keeps ``DeviceClass.spec.extendedResourceName`` (DRAExtendedResource,
  asked with a dry-run create), and the device plugin where it drops the field or the probe
  got no answer: the device plugin serves the name on every release (where a device plugin
  advertises a name, the scheduler does not use the DeviceClass for it).
* Every device of such a profile carries the attribute ``extendedResource: <name>`` on both
  paths: the chart's DeviceClass for the profile selects by it, the plain class leaves it out.
* DRA path: the shim advertises none of these names (it runs only for ``devicePlugin.enabled``,
  and the configuration refuses a ``devicePlugin.resources`` entry with such a name).
* Device-plugin path: one shim resource per name, selecting the devices with that attribute
  (of every profile that has the name), kept from DRA (partitioned) whatever
  ``devicePlugin.mode`` says; shared profiles are slot devices (the device-plugin API has
  no capacity). The shim runs even where ``devicePlugin.enabled`` is false, then serving
  only these resources.

Pure, except :meth:`ExtendedResources.decide`, which asks the apiserver.
"""

from __future__ import annotations

from dataclasses import dataclass

from dradriver.devices.attributes import StringAttribute
from dradriver.devices.config import (
    EXTENDED_RESOURCE_ATTRIBUTE,
    DevicePluginConfig,
    DevicePluginResource,
    DevicePluginSelector,
    DriverConfig,
)
from dradriver.resourceslice.capabilities import (
    EXTENDED_RESOURCE_GATE,
    DryRunClient,
    keeps_extended_resource_name,
)

AUTO = "auto"
DRA = "dra"
DEVICE_PLUGIN = "devicePlugin"


@dataclass(frozen=True)
class Choice:
    """The path chosen for this node, and why (for the start-up line)."""

    path: str
    why: str


def resource_names(config: DriverConfig) -> list[str]:
    """The host profiles' extended resource names, in configuration order, each once (the
    profiles that share a name serve it together)."""
    return list(dict.fromkeys(name for _, name, _ in config.extended_resource_profiles()))


def with_attributes(config: DriverConfig) -> DriverConfig:
    """``config`` with each profile that has ``extendedResourceName`` giving its devices the
    attribute ``extendedResource: <name>`` (the configuration refuses one set by hand)."""
    sources = []
    for source in config.sources:
        host = source.host
        if host is not None and host.extended_resource_name is not None:
            attribute = StringAttribute(value=host.extended_resource_name)
            attributes = {**host.attributes, EXTENDED_RESOURCE_ATTRIBUTE: attribute}
            source = source.model_copy(
                update={"host": host.model_copy(update={"attributes": attributes})}
            )
        sources.append(source)
    return config.model_copy(update={"sources": tuple(sources)})


def choose(setting: str, keeps_field: bool | None) -> Choice:
    """The path from ``extendedResources`` and the probe's answer (None: no answer)."""
    if setting == DRA:
        return Choice(DRA, "extendedResources: dra")
    if setting == DEVICE_PLUGIN:
        return Choice(DEVICE_PLUGIN, "extendedResources: devicePlugin")
    if keeps_field is None:
        return Choice(DEVICE_PLUGIN, "the DeviceClass probe got no answer")
    if not keeps_field:
        return Choice(
            DEVICE_PLUGIN,
            f"this cluster drops DeviceClass.spec.extendedResourceName ({EXTENDED_RESOURCE_GATE} "
            "off)",
        )
    return Choice(DRA, "this cluster keeps DeviceClass.spec.extendedResourceName")


def generated_resources(names: list[str]) -> tuple[DevicePluginResource, ...]:
    """One shim resource per extended resource, selecting the devices set aside for it."""
    return tuple(
        DevicePluginResource(
            resource_name=name,
            devices=DevicePluginSelector(
                attributes={EXTENDED_RESOURCE_ATTRIBUTE: StringAttribute(value=name)}
            ),
        )
        for name in names
    )


def shim_config(config: DriverConfig, path: str | None) -> DevicePluginConfig | None:
    """The shim's configuration on ``path`` (None: no profile has an extended resource), or
    None when no shim runs on this node."""
    user = config.device_plugin
    names = resource_names(config)
    if path != DEVICE_PLUGIN or not names:
        return user if user.enabled else None
    own = user.resources if user.enabled else ()
    return user.model_copy(
        update={"enabled": True, "resources": (*generated_resources(names), *own)}
    )


class ExtendedResources:
    """The node's decision, made once by :meth:`decide`."""

    def __init__(self, config: DriverConfig) -> None:
        self.original = config
        self.config = with_attributes(config)
        """The configuration to build the sources from (with the attribute)."""
        self.names = resource_names(config)
        self.choice: Choice | None = None

    async def decide(self, client: DryRunClient, driver: str) -> Choice | None:
        """Choose the path (asking the apiserver for ``auto``); None without such profiles."""
        if not self.names:
            return None
        setting = self.original.extended_resources
        keeps = await keeps_extended_resource_name(client, driver) if setting == AUTO else None
        self.choice = choose(setting, keeps)
        return self.choice

    @property
    def path(self) -> str | None:
        return self.choice.path if self.choice is not None else None

    def shim_config(self) -> DevicePluginConfig | None:
        """What the shim serves on this node (None: no shim)."""
        return shim_config(self.original, self.path)

    @property
    def partitioned(self) -> list[str]:
        """The shim resources kept from DRA whatever ``devicePlugin.mode`` says."""
        return list(self.names) if self.path == DEVICE_PLUGIN else []

    def said(self) -> dict[str, str]:
        """Fields of the start-up line: which path serves which names, and why."""
        if self.choice is None:
            return {}
        return {
            "extended_resources": ",".join(self.names),
            "extended_resources_by": self.choice.path,
            "extended_resources_because": self.choice.why,
        }
