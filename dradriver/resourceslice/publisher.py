"""Keeps this node's ResourceSlices equal to the driver's inventory, with few writes.

Level-based: every sync lists the node's slices of this driver, compares them
with the desired ones (ignoring the pool generation) and writes only on a
difference, bumping the pool generation for every slice of the pool as the
API requires. A sync runs when the inventory changes, when a watch sees our
slices change or vanish (the kubelet deletes them at its start and 30 s after
losing the plugin), and periodically as a safety net; syncs are rate-limited.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from dradriver.k8s.client import KubeClient
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger
from dradriver.resourceslice.builder import slices_equal

log = get_logger("plugin.slices")

# Fields a disabled feature gate makes the apiserver drop, and the gate to check.
GATED_FIELDS = {
    "taints": "DRADeviceTaints",
    "bindsToNode": "DRADeviceBindingConditions",
    "bindingConditions": "DRADeviceBindingConditions",
    "bindingFailureConditions": "DRADeviceBindingConditions",
    "consumesCounters": "DRAPartitionableDevices",
    "sharedCounters": "DRAPartitionableDevices",
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "requestPolicy": "DRAConsumableCapacity",
}


def dropped_fields(sent: Any, returned: Any, path: str = "spec") -> list[str]:
    """Paths of fields we sent that the server did not keep."""
    out: list[str] = []
    if isinstance(sent, dict) and isinstance(returned, dict):
        for key, value in sent.items():
            sub = f"{path}.{key}"
            if key not in returned:
                out.append(sub)
            else:
                out += dropped_fields(value, returned[key], sub)
    elif isinstance(sent, list) and isinstance(returned, list):
        for i, (s, r) in enumerate(zip(sent, returned, strict=False)):
            out += dropped_fields(s, r, f"{path}[{i}]")
    return out


class DroppedFieldsError(RuntimeError):
    pass


class SlicePublisher:
    def __init__(
        self,
        client: KubeClient,
        driver: str,
        node: str,
        desired: Callable[[int], list[Obj]],
        min_interval: float = 1.0,
        resync_period: float = 60.0,
    ) -> None:
        """``desired(generation)`` returns the full slices (apiVersion, kind, metadata, spec)."""
        self.client = client
        self.driver = driver
        self.node = node
        self.desired = desired
        self.min_interval = min_interval
        self.resync_period = resync_period
        self.writes = 0
        self.syncs = 0
        self.on_sync: Callable[[], None] | None = None
        self._dirty = asyncio.Event()
        self._owner: Obj | None = None
        self._selector = f"spec.nodeName={node},spec.driver={driver}"

    def trigger(self) -> None:
        """Ask for a sync soon (inventory changed)."""
        self._dirty.set()

    async def _existing(self) -> tuple[dict[str, Obj], str]:
        listing = await self.client.list(
            path_for(RESOURCE_V1, "resourceslices"), fieldSelector=self._selector
        )
        items = {s["metadata"]["name"]: s for s in listing.get("items", [])}
        return items, str(listing.get("metadata", {}).get("resourceVersion", ""))

    async def _owner_ref(self) -> Obj | None:
        # Owned by the Node, so the garbage collector removes the slices with it.
        if self._owner is None:
            node = await self.client.get_or_none(path_for("v1", "nodes", name=self.node))
            if node is not None:
                self._owner = {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": self.node,
                    "uid": node["metadata"]["uid"],
                    "controller": True,
                }
        return self._owner

    async def sync(self) -> int:
        """One reconcile pass; returns the number of API writes it made."""
        self.syncs += 1
        existing, _ = await self._existing()
        generation = max(
            (s["spec"]["pool"].get("generation", 0) for s in existing.values()), default=0
        )
        want = {s["metadata"]["name"]: s for s in self.desired(generation)}
        stale = [
            n
            for n, s in want.items()
            if n not in existing
            or not slices_equal(s["spec"], existing[n]["spec"])
            or existing[n]["spec"]["pool"].get("generation") != generation
        ]
        if not stale and set(want) == set(existing):
            return 0

        def names(spec: Obj) -> list[str]:
            return [d["name"] for d in spec.get("devices", [])]

        # The same slices holding the same devices: rewrite just the changed ones in
        # place. Anything else (slices added or removed, devices moving between slices)
        # gets a new pool generation so the scheduler never sees a mixed pool.
        in_place = set(want) == set(existing) and all(
            names(want[n]["spec"]) == names(existing[n]["spec"]) for n in want
        )
        if not in_place:
            generation += 1
            want = {s["metadata"]["name"]: s for s in self.desired(generation)}
            stale = list(want)
        owner = await self._owner_ref()
        writes = 0
        for name in stale:
            obj = want[name]
            if owner is not None:
                obj.setdefault("metadata", {})["ownerReferences"] = [owner]
            if name in existing:
                obj["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
                returned = await self.client.replace(
                    path_for(RESOURCE_V1, "resourceslices", name=name), obj
                )
            else:
                returned = await self.client.create(path_for(RESOURCE_V1, "resourceslices"), obj)
            writes += 1
            self._check_dropped(obj, returned)
        for name in set(existing) - set(want):
            await self.client.delete(path_for(RESOURCE_V1, "resourceslices", name=name))
            writes += 1
        self.writes += writes
        log.info(
            "published ResourceSlices",
            node=self.node,
            slices=len(want),
            generation=generation,
            writes=writes,
        )
        return writes

    def _check_dropped(self, sent: Obj, returned: Obj) -> None:
        dropped = dropped_fields(sent["spec"], returned.get("spec", {}))
        if dropped:
            gates = sorted(
                {
                    GATED_FIELDS[p.rsplit(".", 1)[-1].split("[")[0]]
                    for p in dropped
                    if p.rsplit(".", 1)[-1].split("[")[0] in GATED_FIELDS
                }
            )
            hint = f" (is the feature gate {', '.join(gates)} off?)" if gates else ""
            raise DroppedFieldsError(
                f"the apiserver dropped {', '.join(dropped[:5])} from ResourceSlice "
                f"{sent['metadata']['name']}{hint}"
            )

    async def run(self, on_error: Callable[[BaseException, str], None]) -> None:
        """Sync on triggers, on watch events for our slices, and every resync period."""
        watcher = asyncio.create_task(self._watch_loop(on_error))
        try:
            last = 0.0
            self._dirty.set()
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._dirty.wait(), self.resync_period)
                self._dirty.clear()
                pause = self.min_interval - (time.monotonic() - last)
                if pause > 0:
                    await asyncio.sleep(pause)  # rate limit: coalesce bursts of triggers
                last = time.monotonic()
                try:
                    await self.sync()
                except Exception as e:  # never let the publisher die; retry on the next round
                    on_error(e, "publishing ResourceSlices")
                    self._dirty.set()
                if self.on_sync is not None:
                    self.on_sync()
        finally:
            watcher.cancel()

    async def _watch_loop(self, on_error: Callable[[BaseException, str], None]) -> None:
        backoff = 0.5
        while True:
            try:
                _, rv = await self._existing()
                async for event in self.client.watch(
                    path_for(RESOURCE_V1, "resourceslices"), rv, fieldSelector=self._selector
                ):
                    backoff = 0.5
                    if event.get("type") in ("DELETED", "MODIFIED", "ERROR"):
                        self._dirty.set()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                on_error(e, "watching ResourceSlices")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30)
