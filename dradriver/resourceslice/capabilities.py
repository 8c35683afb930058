"""Which gated ResourceSlice features this cluster keeps, found once at start-up.

A cluster whose gates are off (1.34 and 1.35 by default, or any release run
with a gate switched off) silently drops the fields of those features. Rather
than infer that from the server's version, a component asks the apiserver
itself: a dry-run create of one slice carrying every gated field it may use
(nothing is stored, and admission sees the same node and driver a real write
would have). The features whose fields come back missing are reported in one
line at start-up, with what the component does without them; everything else
keeps working, and the slice publisher still reports dropped fields per write.

DeviceClass fields are asked about the same way (a dry-run create of one class):
:func:`keeps_extended_resource_name` tells whether ``spec.extendedResourceName``
(DRAExtendedResource) survives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger
from dradriver.resourceslice.publisher import dropped_fields, gate_of

log = get_logger("plugin.slices")


class DryRunClient(Protocol):
    async def request(
        self,
        method: str,
        path: str,
        body: Obj | list[Obj] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Obj: ...


@dataclass(frozen=True)
class SliceFeature:
    """One gated feature: the device fields that carry it, and what is lost without it."""

    name: str
    device_fields: Obj
    without_it: str


DEVICE_TAINTS = SliceFeature(
    "device taints",
    {"taints": [{"key": "probe.dradriver.dev/probe", "effect": "NoSchedule"}]},
    "unhealthy devices are not tainted, the scheduler may still pick them",
)
PARTITIONABLE = SliceFeature(
    "partitionable devices",
    {"consumesCounters": [{"counterSet": "probe", "counters": {"c": {"value": "1"}}}]},
    "partitions are published without counters, so overlapping ones can be allocated together",
)
CONSUMABLE = SliceFeature(
    "consumable capacity",
    {
        "allowMultipleAllocations": True,
        "capacity": {"c": {"value": "2", "requestPolicy": {"default": "1"}}},
    },
    "shareable devices are published as exclusive ones",
)
BINDING_CONDITIONS = SliceFeature(
    "binding conditions",
    {"bindsToNode": True, "bindingConditions": ["Probe"], "bindingFailureConditions": ["Fail"]},
    "pods of network-attached devices can start before the device is attached",
)
NODE_FEATURES = (DEVICE_TAINTS, PARTITIONABLE, CONSUMABLE)
NETWORK_FEATURES = (DEVICE_TAINTS, BINDING_CONDITIONS)


@dataclass(frozen=True)
class Missing:
    feature: SliceFeature
    dropped: list[str]

    def text(self) -> str:
        gates = sorted({g for p in self.dropped if (g := gate_of(p)) is not None})
        why = f" (gate {', '.join(gates)} off?)" if gates else ""
        return f"{self.feature.name}{why}: {self.feature.without_it}"


def probe_slice(
    driver: str, pool: str, node: str | None, features: tuple[SliceFeature, ...]
) -> Obj:
    """A slice with one device per feature (named after it), for a dry-run create."""
    devices = [
        {"name": f"probe-{i}", **feature.device_fields} for i, feature in enumerate(features)
    ]
    where: Obj = {"nodeName": node} if node else {"allNodes": True}
    return {
        "apiVersion": RESOURCE_V1,
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{pool.replace('/', '-')}-probe-"},
        "spec": {
            "driver": driver,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            **where,
            "devices": devices,
        },
    }


def missing_features(sent: Obj, stored: Obj, features: tuple[SliceFeature, ...]) -> list[Missing]:
    """The features whose probe device came back without (some of) its fields."""
    dropped = dropped_fields(sent["spec"], stored.get("spec", {}))
    out = []
    for i, feature in enumerate(features):
        mine = [p for p in dropped if p.startswith(f"spec.devices[{i}].")]
        if mine:
            out.append(Missing(feature, mine))
    return out


async def probe(
    client: DryRunClient,
    driver: str,
    pool: str,
    node: str | None,
    features: tuple[SliceFeature, ...],
) -> list[Missing]:
    """Ask the apiserver (dry run: nothing is stored) which features it would drop.

    Raises the API error if the probe itself is refused; the caller logs that
    and goes on: not knowing is no reason to stop.
    """
    sent = probe_slice(driver, pool, node, features)
    stored = await client.request(
        "POST", path_for(RESOURCE_V1, "resourceslices"), sent, params={"dryRun": "All"}
    )
    return missing_features(sent, stored, features)


def summary(missing: list[Missing]) -> str:
    """The one start-up line; empty when the cluster keeps every feature probed."""
    if not missing:
        return ""
    return "not available on this cluster, the rest works: " + "; ".join(m.text() for m in missing)


async def say_what_this_cluster_lacks(
    client: DryRunClient,
    driver: str,
    pool: str,
    node: str | None,
    features: tuple[SliceFeature, ...],
) -> list[Missing] | None:
    """Probe once and log one warning line naming what is missing (nothing if all is there);
    None when the probe got no answer (the caller then assumes the least)."""
    try:
        missing = await probe(client, driver, pool, node, features)
    except Exception as e:  # refused, unreachable, odd answer: not knowing is no reason to stop
        log.warning("could not find out which slice features this cluster keeps", error=str(e))
        return None
    line = summary(missing)
    if line:
        log.warning(line)
    return missing


EXTENDED_RESOURCE_GATE = "DRAExtendedResource"


def probe_device_class(driver: str) -> Obj:
    """A DeviceClass with ``extendedResourceName``, for a dry-run create."""
    return {
        "apiVersion": RESOURCE_V1,
        "kind": "DeviceClass",
        "metadata": {"generateName": f"{driver}-probe-"},
        "spec": {
            "extendedResourceName": f"{driver}/probe",
            "selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}],
        },
    }


async def keeps_extended_resource_name(client: DryRunClient, driver: str) -> bool | None:
    """Whether the apiserver keeps ``DeviceClass.spec.extendedResourceName`` (dry run: nothing
    is stored); None, with a warning, when the probe got no answer."""
    sent = probe_device_class(driver)
    try:
        stored = await client.request(
            "POST", path_for(RESOURCE_V1, "deviceclasses"), sent, params={"dryRun": "All"}
        )
    except Exception as e:  # refused, unreachable: the caller assumes the least
        log.warning(
            "could not find out whether this cluster keeps DeviceClass.spec.extendedResourceName",
            error=str(e),
        )
        return None
    kept = stored.get("spec", {}).get("extendedResourceName")
    return bool(kept == sent["spec"]["extendedResourceName"])
