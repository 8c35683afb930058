"""One publisher for all ResourceSlice pools of a driver: node pools and network pools.

Desired state: :class:`~dradriver.resourceslice.pool.SlicePool` objects, given with
:meth:`SlicePublisher.set_pool` and taken back with :meth:`SlicePublisher.remove_pool`.
Actual state: the driver's slices in a list+watch cache (the kubelet plugin: an informer
on its node's slices, :func:`slice_informer`; the controller: its informer of all slices).
Like the upstream Go controller, a node-local publisher (``node=``) manages the driver's
slices with that ``spec.nodeName``, any other publisher the driver's slices without one.

:meth:`SlicePublisher.sync` reconciles one pool, level-based:

* it writes only what differs from the cache (ignoring the pool generation, fields the
  apiserver adds and the spelling of quantities): an unchanged pool writes nothing;
* when the same slices hold the same devices, only the changed slices are rewritten, in
  place; any other change (slices added or removed, devices moving between slices)
  bumps the pool generation in every slice, so the scheduler never combines two layouts
  (``SlicePool.min_generation`` can ask for a bump too);
* the slices of a pool that is not desired (any more) are deleted;
* fields the apiserver dropped are reported with the feature gate that is probably off,
  and the slice is not written again for them until the desired slice changes (a gate
  that is off would otherwise cost a write per sync);
* API errors propagate: a 409 (someone else wrote, or the cache is behind), a 5xx or a
  timeout means "retry", never "done".

Own writes are remembered until the cache shows them (client-go's mutation cache), so
a sync right after a write does not act on a cache that has not seen it yet.

:meth:`SlicePublisher.run` is the loop for a process that has no controller of its own
(the kubelet plugin): a work queue of pool names fed by :meth:`~SlicePublisher.set_pool`,
by cache events for managed slices (the kubelet deletes a node's slices at its start and
30 s after losing the plugin) and by a periodic resync; at most one writing sync per pool
per ``min_interval`` (a sync that writes nothing, such as the one the cache's echo of our
own write triggers, does not delay the next change); failures retried with per-pool
exponential backoff. The controller
calls :meth:`~SlicePublisher.sync` from its own reconciler instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from dradriver.k8s.objects import Obj, name_of
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger
from dradriver.resourceslice.builder import build_slices, same_slice, slice_layout, slices_equal
from dradriver.resourceslice.pool import NodeName, SlicePool
from dradriver.runtime import (
    Informer,
    ItemExponentialRateLimiter,
    ListWatchClient,
    ShutDown,
    WorkQueue,
)

log = get_logger("plugin.slices")

# Fields a disabled feature gate makes the apiserver drop, and the gate to check.
GATED_FIELDS = {
    "taints": "DRADeviceTaints",
    "bindsToNode": "DRADeviceBindingConditions",
    "bindingConditions": "DRADeviceBindingConditions",
    "bindingFailureConditions": "DRADeviceBindingConditions",
    "consumesCounters": "DRAPartitionableDevices",
    "sharedCounters": "DRAPartitionableDevices",
    "perDeviceNodeSelection": "DRAPartitionableDevices",
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "requestPolicy": "DRAConsumableCapacity",
}
# A device's own node selection (per-device pools) is gated; the slice's is not.
_DEVICE_NODE_FIELDS = {"nodeName", "nodeSelector", "allNodes"}
_SLICES = path_for(RESOURCE_V1, "resourceslices")


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


def gate_of(path: str) -> str | None:
    """The feature gate that probably dropped the field at ``path`` (None: not a gated one)."""
    name = path.rsplit(".", 1)[-1].split("[")[0]
    if name in _DEVICE_NODE_FIELDS and ".devices[" in path:
        return "DRAPartitionableDevices"
    return GATED_FIELDS.get(name)


def dropped_report(slice_name: str, sent_spec: Obj, returned_spec: Obj) -> str | None:
    """What the apiserver dropped from a slice, and the gate to check; None if nothing."""
    dropped = dropped_fields(sent_spec, returned_spec)
    if not dropped:
        return None
    gates = sorted({g for p in dropped if (g := gate_of(p)) is not None})
    hint = f" (is the feature gate {', '.join(gates)} off?)" if gates else ""
    return f"the apiserver dropped {', '.join(dropped[:5])} from ResourceSlice {slice_name}{hint}"


class DroppedFieldsError(RuntimeError):
    """Reported (not raised) by :meth:`SlicePublisher.run` when the apiserver dropped fields."""


class SliceClient(Protocol):
    """What the publisher needs from :class:`dradriver.k8s.client.KubeClient`."""

    async def get_or_none(self, path: str) -> Obj | None: ...

    async def create(self, path: str, body: Obj) -> Obj: ...

    async def replace(self, path: str, body: Obj) -> Obj: ...

    async def delete(self, path: str, missing_ok: bool = True, **params: Any) -> None: ...


class SliceCache(Protocol):
    """What the publisher needs from :class:`dradriver.runtime.Informer`."""

    def items(self) -> list[Obj]: ...

    def add_handler(
        self,
        *,
        on_add: Callable[[Obj], None] | None = None,
        on_update: Callable[[Obj, Obj], None] | None = None,
        on_delete: Callable[[Obj], None] | None = None,
    ) -> None: ...

    async def wait_for_sync(self) -> None: ...


def slice_informer(client: ListWatchClient, driver: str, node: str) -> Informer:
    """The cache a node-local publisher needs: the driver's slices of ``node``."""
    return Informer(
        client,
        _SLICES,
        name="resourceslices",
        field_selector=f"spec.nodeName={node},spec.driver={driver}",
    )


@dataclass(frozen=True)
class SyncResult:
    """What one :meth:`SlicePublisher.sync` did."""

    pool: str
    writes: int
    slices: int  # the pool's slices now (0: removed)
    generation: int
    dropped: tuple[str, ...] = ()  # found by this sync's writes (see SlicePublisher.dropped)


def _rv(obj: Obj) -> int | None:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion", ""))
    except ValueError:
        return None  # not an integer: trust the cache


def _pool_of(obj: Obj) -> str:
    return str(((obj.get("spec") or {}).get("pool") or {}).get("name", ""))


def _generation(obj: Obj) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation", 0))


class _OwnWrites:
    """Slices this publisher wrote or deleted that the cache may not show yet.

    An entry goes once the cache shows that object at the same or a newer resourceVersion,
    or after ``ttl`` seconds: a slice created and deleted by someone else while the
    informer was relisting would otherwise be believed to exist for ever.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._by_name: dict[str, tuple[int, Obj | None, float]] = {}

    def wrote(self, obj: Obj) -> None:
        rv = _rv(obj)
        if rv is not None:
            self._by_name[name_of(obj)] = (rv, obj, time.monotonic())

    def deleted(self, obj: Obj) -> None:
        rv = _rv(obj)
        if rv is not None:
            self._by_name[name_of(obj)] = (rv, None, time.monotonic())

    def seen(self, obj: Obj) -> None:
        entry = self._by_name.get(name_of(obj))
        rv = _rv(obj)
        if entry is not None and rv is not None and rv >= entry[0]:
            del self._by_name[name_of(obj)]

    def overlay(self, cached: dict[str, Obj]) -> dict[str, Obj]:
        now = time.monotonic()
        out = dict(cached)
        for name, (rv, obj, at) in list(self._by_name.items()):
            current = out.get(name)
            current_rv = _rv(current) if current is not None else None
            if now - at > self.ttl or (current_rv is not None and current_rv >= rv):
                del self._by_name[name]
            elif obj is None:
                out.pop(name, None)
            else:
                out[name] = obj
        return out


class SlicePublisher:
    def __init__(
        self,
        client: SliceClient,
        driver: str,
        slices: SliceCache,
        *,
        node: str | None = None,
        before_write: Callable[[str], None] | None = None,
        on_write: Callable[[], None] | None = None,
        min_interval: float = 1.0,
        retry_cap: float = 60.0,
        resync_period: float = 60.0,
        own_write_ttl: float = 60.0,
    ) -> None:
        """``before_write(pool)`` runs before every API write and may raise to prevent it
        (the controller's lease check); ``on_write`` counts writes (the metric)."""
        if min_interval <= 0 or retry_cap < min_interval:
            raise ValueError("the publisher needs 0 < min_interval <= retry_cap")
        self.client = client
        self.driver = driver
        self.node = node
        self.slices = slices
        self.before_write = before_write
        self.on_write = on_write
        self.min_interval = min_interval
        self.retry_cap = retry_cap
        self.resync_period = resync_period
        self.writes = 0
        self.syncs = 0
        self._pools: dict[str, SlicePool] = {}
        self._own = _OwnWrites(own_write_ttl)
        # Slice name -> (what we sent, what the apiserver kept) after it dropped fields.
        self._stored: dict[str, tuple[Obj, Obj]] = {}
        self._node_uids: dict[str, str] = {}
        self._queue: WorkQueue[str] | None = None
        self._last_write: dict[str, float] = {}  # pool -> when a sync last wrote or failed
        slices.add_handler(
            on_add=self._observed,
            on_update=lambda old, new: self._observed(new),
            on_delete=self._observed,
        )

    # --- desired state ------------------------------------------------------------------

    def set_pool(self, pool: SlicePool) -> None:
        """Publish ``pool`` (replacing what was desired for it); a change queues a sync."""
        if pool.driver != self.driver:
            raise ValueError(f"pool {pool.name} is for driver {pool.driver}, not {self.driver}")
        if self.node is not None and pool.node_selection != NodeName(self.node):
            raise ValueError(
                f"pool {pool.name}: the publisher of node {self.node} publishes "
                "only pools on that node"
            )
        if self.node is None and isinstance(pool.node_selection, NodeName):
            raise ValueError(f"pool {pool.name}: a node-local pool needs its node's publisher")
        if self._pools.get(pool.name) != pool:
            self._pools[pool.name] = pool
            self._enqueue(pool.name)

    def remove_pool(self, name: str) -> None:
        """Stop publishing pool ``name``: its next sync deletes its slices."""
        self._pools.pop(name, None)
        self._enqueue(name)

    @property
    def pools(self) -> list[str]:
        return sorted(self._pools)

    def dropped(self, pool: str) -> list[str]:
        """Fields the apiserver did not keep in the pool's slices, with the likely gate."""
        reports = (
            dropped_report(name, sent["spec"], kept.get("spec") or {})
            for name, (sent, kept) in sorted(self._stored.items())
            if _pool_of(kept) == pool
        )
        return [r for r in reports if r]

    # --- actual state -------------------------------------------------------------------

    def manages(self, obj: Obj) -> bool:
        spec = obj.get("spec") or {}
        if spec.get("driver") != self.driver:
            return False
        return spec.get("nodeName") == self.node if self.node else not spec.get("nodeName")

    def _observed(self, obj: Obj) -> None:
        if self.manages(obj):
            self._own.seen(obj)
            self._enqueue(_pool_of(obj))

    def _existing(self, pool: str) -> dict[str, Obj]:
        cached = {name_of(s): s for s in self.slices.items() if self.manages(s)}
        return {n: s for n, s in self._own.overlay(cached).items() if _pool_of(s) == pool}

    def _as_wanted(self, desired: Obj, existing: Obj) -> bool:
        if same_slice(desired, existing):
            return True
        # The apiserver cannot keep more of this slice than it did last time.
        stored = self._stored.get(name_of(desired))
        return (
            stored is not None
            and same_slice(desired, stored[0])
            and slices_equal(stored[1].get("spec") or {}, existing.get("spec") or {})
        )

    async def _owner_uid(self, pool: SlicePool) -> str:
        # Slices owned by the Node go with it (garbage collector). Without a Node object
        # they get no owner reference.
        owner = pool.owner
        if owner is None or owner.uid or not owner.is_node:
            return ""
        if owner.name not in self._node_uids:
            node = await self.client.get_or_none(path_for("v1", "nodes", name=owner.name))
            if node is None:
                return ""
            self._node_uids[owner.name] = str(node["metadata"]["uid"])
        return self._node_uids[owner.name]

    # --- reconcile ----------------------------------------------------------------------

    async def sync(self, pool_name: str) -> SyncResult:
        """Make the slices of ``pool_name`` match the desired pool (or delete them)."""
        self.syncs += 1
        existing = self._existing(pool_name)
        pool = self._pools.get(pool_name)
        if pool is None:
            for name in sorted(existing):
                await self._delete(pool_name, existing[name])
            if existing:
                log.info("removed ResourceSlices", pool=pool_name, writes=len(existing))
            return SyncResult(pool_name, len(existing), 0, 0)

        uid = await self._owner_uid(pool)
        generation = max((_generation(s) for s in existing.values()), default=0)
        want = {name_of(s): s for s in build_slices(pool, generation, uid)}
        stale = [
            n
            for n, s in want.items()
            if n not in existing
            or _generation(existing[n]) != generation
            or not self._as_wanted(s, existing[n])
        ]
        if not stale and want.keys() == existing.keys() and pool.min_generation <= generation:
            return SyncResult(pool_name, 0, len(want), generation)

        # The same slices holding the same devices: rewrite just the changed ones in
        # place. Anything else gets a new pool generation in every slice.
        in_place = want.keys() == existing.keys() and all(
            slice_layout(want[n]["spec"]) == slice_layout(existing[n]["spec"]) for n in want
        )
        if not in_place or pool.min_generation > generation:
            generation = max(generation + 1, pool.min_generation)
            want = {name_of(s): s for s in build_slices(pool, generation, uid)}
            stale = list(want)
        writes = 0
        dropped: list[str] = []
        # Obsolete slices first (as the upstream controller does): devices the driver no
        # longer has go even if writing the new slices fails.
        for name in sorted(existing.keys() - want.keys()):
            await self._delete(pool_name, existing[name])
            writes += 1
        for name in stale:
            report = await self._write(pool_name, want[name], existing.get(name))
            writes += 1
            if report is not None:
                dropped.append(report)
        log.info(
            "published ResourceSlices",
            pool=pool_name,
            slices=len(want),
            generation=generation,
            writes=writes,
        )
        return SyncResult(pool_name, writes, len(want), generation, tuple(dropped))

    async def _write(self, pool: str, obj: Obj, current: Obj | None) -> str | None:
        if self.before_write is not None:
            self.before_write(pool)
        name = name_of(obj)
        if current is not None:
            obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            returned = await self.client.replace(
                path_for(RESOURCE_V1, "resourceslices", name=name), obj
            )
        else:
            returned = await self.client.create(_SLICES, obj)
        self._count_write()
        self._own.wrote(returned)
        report = dropped_report(name, obj["spec"], returned.get("spec") or {})
        if report is None:
            self._stored.pop(name, None)
        else:
            self._stored[name] = (obj, returned)
            log.warning("fields dropped", pool=pool, slice=name, report=report)
        return report

    async def _delete(self, pool: str, obj: Obj) -> None:
        if self.before_write is not None:
            self.before_write(pool)
        await self.client.delete(path_for(RESOURCE_V1, "resourceslices", name=name_of(obj)))
        self._count_write()
        self._own.deleted(obj)
        self._stored.pop(name_of(obj), None)

    def _count_write(self) -> None:
        self.writes += 1
        if self.on_write is not None:
            self.on_write()

    # --- the loop -----------------------------------------------------------------------

    def _enqueue(self, pool: str) -> None:
        queue = self._queue
        if queue is None or not pool:
            return  # not running: run() queues every pool when it starts
        last = self._last_write.get(pool)
        wait = 0.0 if last is None else last + self.min_interval - time.monotonic()
        queue.add_after(pool, wait)  # rate limit: coalesce bursts of triggers

    def _pool_names(self) -> set[str]:
        seen = {_pool_of(s) for s in self.slices.items() if self.manages(s)}
        return (set(self._pools) | seen) - {""}

    async def run(self, on_error: Callable[[BaseException, str], None]) -> None:
        """Sync pools on changes, on cache events and every resync period, until cancelled."""
        if self._queue is not None:
            raise RuntimeError("the slice publisher is already running")
        queue: WorkQueue[str] = WorkQueue(
            "resourceslices", ItemExponentialRateLimiter(self.min_interval, self.retry_cap)
        )
        await self.slices.wait_for_sync()
        self._queue = queue
        for name in sorted(self._pool_names()):
            queue.add(name)
        resync = asyncio.create_task(self._resync())
        try:
            while True:
                try:
                    name = await queue.get()
                except ShutDown:
                    return
                try:
                    result = await self.sync(name)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # never let the publisher die; retry with backoff
                    on_error(e, f"publishing the ResourceSlices of pool {name}")
                    self._last_write[name] = time.monotonic()
                    queue.add_rate_limited(name)
                else:
                    if result.writes:
                        self._last_write[name] = time.monotonic()
                    queue.forget(name)
                    for report in result.dropped:
                        on_error(DroppedFieldsError(report), "publishing ResourceSlices")
                finally:
                    queue.done(name)
        finally:
            self._queue = None
            queue.shut_down()
            resync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await resync

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_period)  # safety net: level-based, so harmless
            for name in sorted(self._pool_names()):
                self._enqueue(name)
