"""A NetworkDevicePool as the cluster sees it: the ResourceSlice pool ``network/<name>``
its devices are published in, the claims' results that name its devices, and the
mappers from claims and slices to the pool objects they concern.

Pure (no I/O); :mod:`controller.networkpools.reconciler` publishes and attaches.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from controller.resourceclaims import is_fence
from dradriver.api import networkpool as net
from dradriver.k8s.limits import MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
from dradriver.k8s.objects import Obj, allocation_of
from dradriver.resourceslice.pool import (
    AllNodes,
    NodeSelection,
    Owner,
    PerDeviceNodeSelection,
    PoolNodeSelector,
    SlicePool,
)


@dataclass(frozen=True)
class Wanted:
    """A device of the pool that an allocated claim holds, and where it must be attached."""

    device: str
    node: str
    claim: str  # namespace/name
    claim_uid: str


def network_results(driver: str, claim: Obj) -> list[Obj]:
    if is_fence(claim):
        return []  # a fence only keeps the scheduler from reusing a device; nothing runs
    allocation = allocation_of(claim) or {}
    return [
        r
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == driver and net.is_network_pool(str(r.get("pool", "")))
    ]


def pools_of_claim(driver: str) -> Callable[[Obj], Iterable[str]]:
    """Mapper: a claim change concerns the pools of its network devices."""

    def mapper(claim: Obj) -> Iterable[str]:
        return {net.object_name(str(r["pool"])) or "" for r in network_results(driver, claim)}

    return mapper


def pool_of_slice(driver: str) -> Callable[[Obj], Iterable[str]]:
    """Mapper: someone changed or deleted one of our network slices: republish."""

    def mapper(slice_: Obj) -> Iterable[str]:
        spec = slice_.get("spec") or {}
        name = net.object_name(str((spec.get("pool") or {}).get("name", "")))
        return [name] if spec.get("driver") == driver and name else []

    return mapper


def network_pool(
    driver: str,
    name: str,
    spec: net.NetworkDevicePoolSpec,
    owner_uid: str,
    generation: int,
    cooling: Collection[str] = (),
) -> SlicePool:
    """The ResourceSlice pool ``network/<name>`` of NetworkDevicePool ``name``.

    Owned by the pool object (its slices go with it) and labelled with its name. The
    devices reach the pool's nodeSelector, or every node, or, once a device has a
    selector of its own, each its own (perDeviceNodeSelection). ``cooling``: devices
    whose attach failed recently; they get the attach-failed taint. Slices hold at most
    the tainted-slice limit, so a taint coming or going rewrites one slice in place
    instead of moving devices between slices. The pool generation follows the object's
    generation: a spec change republishes every slice.
    """
    per_device = any(d.node_selector is not None for d in spec.devices)
    selection: NodeSelection
    pool_selector = net.selector_to_api(spec.node_selector)
    if per_device:
        selection = PerDeviceNodeSelection()
    elif pool_selector is not None:
        selection = PoolNodeSelector(pool_selector)
    else:
        selection = AllNodes()
    return SlicePool(
        driver=driver,
        name=net.pool_name(name),
        node_selection=selection,
        slice_name_prefix=f"network-{name}-{driver.replace('.', '-')}",
        devices=tuple(
            net.api_device(driver, d, per_device, spec.node_selector, d.name in cooling)
            for d in sorted(spec.devices, key=lambda d: d.name)
        ),
        owner=Owner(f"{driver}/{net.VERSION}", net.KIND, name, owner_uid),
        labels={f"{driver}/network-pool": name},
        devices_per_slice=MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS,
        min_generation=generation,
    )
