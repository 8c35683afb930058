"""The controller's reconcilers (level-based: each looks at the cache, never at events).

* :class:`ParametersReconciler` keeps the ``Valid`` condition of every
  DeviceClaimParameters object up to date, and its in-use finalizer while allocated
  claims reference it.
* :class:`ClaimReconciler` allocates the claims that ask for it (immediate
  allocation, no pod needed), explains why when it cannot, never double-allocates
  against the scheduler, and deallocates them when they are deleted
  (see :mod:`controller.claims.allocation` for the pure parts).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import httpx

from controller.claims import fences
from controller.claims.allocation import (
    FINALIZER,
    IN_USE_FINALIZER,
    STATUS_ANNOTATION,
    Request,
    allocated_node,
    allocation_of,
    allocation_request,
    annotations_of,
    claims_keeping,
    conflicts,
    effective_claim,
    finalizers,
    in_use_message,
    meta,
    pin_config,
    referenced_parameters,
    reserved_for,
    should_yield,
    with_timestamp,
)
from dradriver.allocator import (
    AllocatedState,
    Allocator,
    DeviceID,
    Inventory,
    claim_key,
    explain,
    summarize,
)
from dradriver.api import parameters as params
from dradriver.api.wellknown import CONFLICT_ANNOTATION
from dradriver.k8s.client import KubeClient
from dradriver.k8s.errors import KubeAPIError, is_conflict, is_not_found
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger
from dradriver.runtime import Informer, RequeueAfter, split_key

log = get_logger("controller")


class NotLeader(RuntimeError):
    """A write was about to happen without a fresh lease; the key is retried later."""


class ParametersReconciler:
    """Keeps the ``Valid`` condition and the in-use finalizer of DeviceClaimParameters.

    With the claims informer, an object referenced by an allocated claim of this driver
    carries :data:`~controller.claims.allocation.IN_USE_FINALIZER` until no such claim is left,
    so deleting it waits for its claims (an ``InUse`` event says which, once). The
    controller must also watch the claims with :func:`parameters_used_by`.
    """

    def __init__(
        self,
        client: KubeClient,
        driver: str,
        informer: Informer,
        is_leader: Callable[[], bool] = lambda: True,
        claims: Informer | None = None,
    ) -> None:
        self.client = client
        self.driver = driver
        self.informer = informer
        self.is_leader = is_leader
        self.claims = claims
        self.api_version = f"{driver}/{params.VERSION}"
        self.status_writes = 0
        self.events = EventRecorder(client)
        informer.add_handler(on_delete=lambda obj: self.events.forget(str(meta(obj).get("uid"))))

    def _check_leader(self, key: str) -> None:
        if not self.is_leader():
            raise NotLeader(f"not writing parameters {key} without a fresh lease")

    async def __call__(self, key: str) -> None:
        obj = self.informer.get(key)
        if obj is None:
            return
        if self.claims is not None:
            obj = await self._protect(key, obj)
            if obj is None:
                return
        if meta(obj).get("deletionTimestamp"):
            return
        await self._validate(key, obj)

    async def _protect(self, key: str, obj: Obj) -> Obj | None:
        """Add or remove the in-use finalizer; returns the object as written (None: gone)."""
        assert self.claims is not None
        namespace, name = split_key(key)
        users = claims_keeping(self.driver, self.claims.items(), namespace or "", name)
        current = finalizers(obj)
        deleting = bool(meta(obj).get("deletionTimestamp"))
        wanted = current
        if users and IN_USE_FINALIZER not in current and not deleting:
            wanted = [*current, IN_USE_FINALIZER]  # none can be added once deleting
        elif not users and IN_USE_FINALIZER in current:
            wanted = [f for f in current if f != IN_USE_FINALIZER]
        if wanted != current:
            self._check_leader(key)
            path = path_for(self.api_version, params.PLURAL, namespace, name)
            body = {
                "metadata": {"resourceVersion": meta(obj)["resourceVersion"], "finalizers": wanted}
            }
            try:
                obj = await self.client.merge_patch(path, body)
            except KubeAPIError as e:
                if is_not_found(e):
                    return None  # deleted meanwhile
                raise  # 409: the cache is behind; retried with backoff once it catches up
            log.info(
                "parameters in use" if users else "parameters no longer in use",
                parameters=key,
                claims=users[:10],
            )
        if deleting and users and IN_USE_FINALIZER in finalizers(obj):
            await self.events.emit(
                {**obj, "apiVersion": self.api_version},
                params.KIND,
                "Warning",
                "InUse",
                f"deletion waits: {in_use_message(users)}",
            )
        return obj

    async def _validate(self, key: str, obj: Obj) -> None:
        metadata = obj["metadata"]
        status: Literal["True", "False"]
        try:
            params.spec_of(obj)
        except params.ParametersError as e:
            status, reason, message = "False", "InvalidSpec", str(e)
        else:
            status, reason, message = "True", "Valid", "the spec is valid"
        current = (obj.get("status") or {}).get("conditions") or []
        conditions, changed = params.set_condition(
            current, params.VALID_CONDITION, status, reason, message, metadata.get("generation")
        )
        if not changed:
            return
        if not self.is_leader():
            raise NotLeader(f"not writing the status of {key} without a fresh lease")
        namespace, name = split_key(key)
        path = path_for(self.api_version, params.PLURAL, namespace, name) + "/status"
        body = {
            "metadata": {"resourceVersion": metadata["resourceVersion"]},
            "status": {"conditions": conditions},
        }
        try:
            await self.client.merge_patch(path, body)
        except KubeAPIError as e:
            if is_not_found(e):
                return  # deleted meanwhile
            raise  # 409: the cache is behind; retried with backoff once it catches up
        self.status_writes += 1
        log.info("parameters checked", parameters=key, valid=status, reason=reason)


class EventRecorder:
    """Posts core/v1 Events about objects; the same reason and message is posted once."""

    def __init__(self, client: KubeClient, component: str = "dradriver-controller") -> None:
        self.client = client
        self.component = component
        self._last: dict[tuple[str, str], str] = {}
        self.posted = 0

    async def emit(self, obj: Obj, kind: str, type_: str, reason: str, message: str) -> None:
        m = obj.get("metadata") or {}
        uid = str(m.get("uid", ""))
        if self._last.get((uid, reason)) == message:
            return
        self._last[(uid, reason)] = message
        now = params.now_rfc3339()
        namespace = str(m.get("namespace") or "default")
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{m.get('name')}.{uuid.uuid4().hex[:16]}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", RESOURCE_V1),
                "kind": kind,
                "name": m.get("name"),
                "namespace": namespace,
                "uid": uid,
                "resourceVersion": m.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.client.create(path_for("v1", "events", namespace), body)
            self.posted += 1
        except (KubeAPIError, httpx.HTTPError) as e:
            log.warning("event not posted", object=f"{namespace}/{m.get('name')}", error=str(e))

    def forget(self, uid: str) -> None:
        for k in [k for k in self._last if k[0] == uid]:
            del self._last[k]


@dataclass
class AllocationStats:
    allocated: int = 0
    failed: int = 0
    yielded: int = 0
    deallocated: int = 0
    fences_allocated: int = 0  # fence allocation writes (creations and pulses)
    fences_deleted: int = 0
    held: int = 0  # claims held after a conflict (not cleared while the device is shared)


class ClaimReconciler:
    """Allocates claims that ask for it, explains failures, deallocates on deletion.

    Level-based: every call looks at the claim in the cache and does the next step
    (finalizer, allocation, conflict check, annotation cleanup, deallocation).
    The allocated state is kept from the claims informer, plus the allocations this
    controller wrote that the informer has not shown yet (``inflight``), so two claims
    are never given the same device by this controller. The scheduler can still hold a
    device in memory that we then write: :meth:`_check_conflicts` runs after every write
    and whenever the informer shows another claim taking one of our devices; our claim
    gives its allocation back if nothing consumes it yet. A device that loses one of two
    holders (our give-back, or any other removal) drops out of the scheduler's
    allocated-device set although the other claim still holds it: a fence claim in
    ``fence_namespace`` puts it back (:mod:`controller.claims.fences` says why and how).
    """

    def __init__(
        self,
        client: KubeClient,
        driver: str,
        claims: Informer,
        parameters: Informer,
        slices: Informer,
        classes: Informer,
        nodes: Informer,
        is_leader: Callable[[], bool] = lambda: True,
        namespaces: Iterable[str] = (),
        retry_base: float = 1.0,
        retry_cap: float = 60.0,
        pending_pods: Informer | None = None,
        max_defer: float = 10.0,
        quiet_period: float = 0.3,
        fence_namespace: str = "dradriver",
        removal_quiet: float = 2.0,
    ) -> None:
        self.client = client
        self.driver = driver
        self.claims = claims
        self.parameters = parameters
        self.slices = slices
        self.classes = classes
        self.nodes = nodes
        self.is_leader = is_leader
        self.namespaces = frozenset(namespaces)
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.pending_pods = pending_pods
        self.max_defer = max_defer
        self.deferred: dict[str, float] = {}  # key -> when we first waited for the scheduler
        self.quiet_period = quiet_period
        self.last_pod_activity = -float("inf")  # monotonic time a pod with claims last changed
        self.removal_quiet = removal_quiet
        self.last_removal = -float("inf")  # monotonic time a claim last let go of devices
        if pending_pods is not None:
            pending_pods.add_handler(
                on_add=self._pod_changed,
                on_update=lambda old, new: self._pod_changed(new),
                on_delete=self._pod_changed,
            )
        self.events = EventRecorder(client)
        self.stats = AllocationStats()
        self.state = AllocatedState()
        self.inflight: dict[str, tuple[Obj, int | None]] = {}  # key -> (allocation, rv written)
        self.unallocatable: set[str] = set()
        self.failures: dict[str, int] = {}
        self.enqueue: Callable[[str], None] = lambda key: None
        self._allocator: Allocator | None = None
        self._params_error_logged: dict[str, str] = {}
        self.fence_namespace = fence_namespace
        self.fence_marks = fences.Marks()
        self.fence_devices: dict[str, list[DeviceID]] = {}  # fence key -> devices (if known)
        self._fence_lock = asyncio.Lock()  # fences are rare: one fence write at a time
        claims.add_handler(
            on_add=self._claim_changed,
            on_update=lambda old, new: self._claim_changed(new, old),
            on_delete=self._claim_deleted,
        )
        for informer in (slices, classes):
            informer.add_handler(
                on_add=self._inventory_changed,
                on_update=lambda old, new: self._inventory_changed(new),
                on_delete=self._inventory_changed,
            )

    # --- caches -------------------------------------------------------------------------

    def _inventory_changed(self, obj: Obj) -> None:
        self._allocator = None

    def allocator(self) -> Allocator:
        if self._allocator is None:
            self._allocator = Allocator(Inventory(self.slices.items(), self.classes.items()))
        return self._allocator

    def _ours(self, key: str) -> bool:
        claim = self.claims.get(key)
        return key in self.inflight or (claim is not None and FINALIZER in finalizers(claim))

    def _claim_changed(self, claim: Obj, old: Obj | None = None) -> None:
        key = claim_key(claim)
        if fences.is_fence(claim):
            self.fence_devices[key] = fences.fence_devices(claim)
        self._note_removal(key, fences.removed_devices(old, claim), _rv(claim))
        allocation = allocation_of(claim)
        if allocation:
            self.inflight.pop(key, None)
            for conflict in conflicts(key, allocation, self.state):
                if self._ours(conflict.other):
                    self.enqueue(conflict.other)
            self.state.add(key, allocation)
            return
        pending = self.inflight.get(key)
        if pending is not None:
            written = pending[1]
            if written is None or _rv(claim) < written:
                return  # an older version than our write: keep holding the devices
            self.inflight.pop(key, None)
        if key in self.state.claims():
            self.state.remove(key)
            self._devices_freed()

    def _claim_deleted(self, claim: Obj) -> None:
        key = claim_key(claim)
        self._note_removal(key, fences.removed_devices(claim, None), _rv(claim))
        self.inflight.pop(key, None)
        self.failures.pop(key, None)
        self.deferred.pop(key, None)
        self.unallocatable.discard(key)
        self.events.forget(str(meta(claim).get("uid", "")))
        if key in self.state.claims():
            self.state.remove(key)
            self._devices_freed()

    def _devices_freed(self) -> None:
        for key in list(self.unallocatable):
            self.enqueue(key)

    def waiting_keys(self, obj: Obj) -> Iterable[str]:
        """Mapper for slices, classes and nodes: the claims that could not be allocated."""
        return list(self.unallocatable)

    def _pod_changed(self, pod: Obj) -> None:
        if (pod.get("spec") or {}).get("resourceClaims"):
            self.last_pod_activity = time.monotonic()

    def deferred_keys(self, obj: Obj) -> Iterable[str]:
        """Mapper for unscheduled pods: the claims waiting for the scheduler to settle."""
        return list(self.deferred)

    def scheduler_busy(self) -> list[str]:
        """Pods the scheduler may be allocating for right now (in memory, not yet written).

        Its allocated-device set is a plain set fed by its claim informer: if we wrote a
        device it reserved in memory, the two claims would hold it, and clearing either
        one later makes the scheduler forget the device although the other still holds
        it. So no allocation is written while a pod with claims waits for its first
        scheduling verdict, nor within ``quiet_period`` seconds of such a pod changing
        (the scheduler may see it before we do); bounded by ``max_defer``.
        """
        if self.pending_pods is None:
            return []
        busy = []
        if time.monotonic() - self.last_pod_activity < self.quiet_period:
            busy.append("(pods with claims changed just now)")
        for pod in self.pending_pods.items():
            spec = pod.get("spec") or {}
            if spec.get("nodeName") or meta(pod).get("deletionTimestamp"):
                continue
            if not spec.get("resourceClaims"):
                continue
            conditions = (pod.get("status") or {}).get("conditions") or []
            if any(
                c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions
            ):
                continue  # judged unschedulable: retried on claim events, which we are
            busy.append(claim_key(pod))
        return busy

    def scheduler_quiet(self) -> tuple[bool, str]:
        """Whether clearing an allocation now is unlikely to race with a scheduling cycle.

        kube-scheduler 1.36 keeps allocated devices in a plain set (added when a claim's
        allocation appears, removed when it is cleared or the claim deleted). A removal
        the scheduler sees after another claim took the same device makes it forget that
        the device is taken. Removals re-queue its unschedulable pods, so: no pod waiting
        for a first verdict, and ``removal_quiet`` seconds since the last removal.
        """
        busy = self.scheduler_busy()
        if busy:
            return False, f"pods being scheduled: {busy[:3]}"
        since = time.monotonic() - self.last_removal
        if since < self.removal_quiet:
            return False, f"a device was freed {since:.1f}s ago"
        return True, ""

    def _other_holders(self, key: str, allocation: Obj) -> list[str]:
        return sorted(
            {
                h
                for d in fences.exclusive(allocation)
                for h in fences.real_holders(d, self.state, self._is_fence_key)
                if h != key
            }
        )

    # --- reconcile ----------------------------------------------------------------------

    def _lookup(self, namespace: str, name: str) -> Obj | None:
        return self.parameters.get_by_name(namespace, name)

    def _check_leader(self, key: str) -> None:
        if not self.is_leader():
            raise NotLeader(f"not writing claim {key} without a fresh lease")

    def _backoff(self, key: str) -> float:
        n = self.failures.get(key, 0) + 1
        self.failures[key] = n
        return float(min(self.retry_cap, self.retry_base * 2 ** (n - 1)))

    async def __call__(self, key: str) -> None:
        if self._is_fence_key(key):
            await self.reconcile_fence(key)
            return
        claim = self.claims.get(key)
        if claim is None:
            return
        namespace, _ = split_key(key)
        if self.namespaces and namespace not in self.namespaces:
            return
        if meta(claim).get("deletionTimestamp"):
            if FINALIZER in finalizers(claim):
                await self._deallocate(key, claim)
            return
        request = allocation_request(self.driver, claim, self._lookup)
        if not request.immediate:
            if request.error and self._params_error_logged.get(key) != request.error:
                self._params_error_logged[key] = request.error
                log.info("claim parameters are invalid", claim=key, error=request.error)
            return
        allocation = allocation_of(claim)
        if request.error and not allocation:
            # An allocated claim has its parameters pinned: a parameters object deleted
            # or changed later does not concern it.
            await self._failed(key, claim, request.error)
        if allocation:
            await self._check_conflicts(key, claim, allocation)
            if CONFLICT_ANNOTATION in annotations_of(claim):
                await self._release_held(key, claim, allocation)
            await self._settled(key, claim)
            return
        if key in self.inflight:
            return  # written; the informer's update re-enqueues the key
        if FINALIZER not in finalizers(claim):
            self._check_leader(key)
            claim = await self._patch(
                key,
                {
                    "metadata": {
                        "resourceVersion": meta(claim)["resourceVersion"],
                        "finalizers": [*finalizers(claim), FINALIZER],
                    }
                },
            )
            log.info("finalizer added", claim=key)
        await self._allocate(key, claim, request)

    async def _allocate(self, key: str, claim: Obj, request: Request) -> None:
        busy = self.scheduler_busy()
        if busy:
            now = time.monotonic()
            since = self.deferred.setdefault(key, now)
            if now - since < self.max_defer:
                raise RequeueAfter(0.5, f"scheduler busy with {len(busy)} pod(s): {busy[:3]}")
            log.info("allocating although the scheduler is busy", claim=key, pods=busy[:5])
        self.deferred.pop(key, None)
        allocator = self.allocator()
        nodes = self.nodes.items()
        effective = effective_claim(claim, request)  # the parameters' count and selectors
        outcome = allocator.allocate([effective], self.state, nodes=nodes)
        if not outcome.ok or outcome.allocations is None:
            rows = explain(allocator, effective, self.state, nodes=nodes, outcome=outcome)
            await self._failed(
                key, claim, summarize(rows) or outcome.error or "cannot be allocated"
            )
            return
        allocation = with_timestamp(outcome.allocations[0], params.now_rfc3339())
        config = (allocation.get("devices") or {}).get("config")
        if config:
            allocation["devices"]["config"] = pin_config(self.driver, config, request)
        self._check_leader(key)
        self.state.add(key, allocation)  # before the first await: no other worker takes them
        self.inflight[key] = (allocation, None)
        namespace, name = split_key(key)
        try:
            written = await self.client.merge_patch(
                path_for(RESOURCE_V1, "resourceclaims", namespace, name) + "/status",
                {
                    "metadata": {"resourceVersion": meta(claim)["resourceVersion"]},
                    "status": {"allocation": allocation},
                },
            )
        except BaseException:
            self.inflight.pop(key, None)
            if allocation_of(self.claims.get(key) or {}) is None:
                self.state.remove(key)
            raise
        if key in self.inflight:
            self.inflight[key] = (allocation, _rv(written))
        self.stats.allocated += 1
        devices = [
            f"{r['driver']}/{r['pool']}/{r['device']}"
            for r in allocation["devices"].get("results") or []
        ]
        node = allocated_node(allocation)
        log.info("claim allocated", claim=key, devices=devices, node=node or "any")
        await self.events.emit(
            written,
            "ResourceClaim",
            "Normal",
            "Allocated",
            f"allocated {', '.join(devices)}" + (f" on node {node}" if node else ""),
        )
        await self._check_conflicts(key, written, allocation)
        await self._settled(key, written)

    async def _check_conflicts(self, key: str, claim: Obj, allocation: Obj) -> None:
        # A fence is no consumer: it only mirrors another claim's hold for the scheduler.
        found = [
            c for c in conflicts(key, allocation, self.state) if not self._is_fence_key(c.other)
        ]
        if not found:
            return
        others = {c.other: self.claims.get(c.other) for c in found}
        what = ", ".join(f"{'/'.join(c.device)} also allocated to claim {c.other}" for c in found)
        if not all(should_yield(key, claim, other) for other in others.values()):
            log.warning("allocation conflict, not yielding", claim=key, conflicts=what)
            await self.events.emit(
                claim,
                "ResourceClaim",
                "Warning",
                "AllocationConflict",
                f"{what}; this claim is in use, so it keeps its allocation",
            )
            return
        # Hold, do not clear: clearing now would be a removal while the other claim
        # still holds the device, which kube-scheduler's set would forget (see
        # scheduler_quiet). The held claim is unusable (the node plugin refuses it).
        message = f"{what}; held unused until the device is free, then allocated again"
        if annotations_of(claim).get(CONFLICT_ANNOTATION) != what:
            self._check_leader(key)
            await self._patch(
                key,
                {
                    "metadata": {
                        "annotations": {CONFLICT_ANNOTATION: what, STATUS_ANNOTATION: message}
                    }
                },
            )
            self.stats.held += 1
            log.warning("allocation conflict, holding the claim", claim=key, conflicts=what)
            await self.events.emit(claim, "ResourceClaim", "Warning", "AllocationConflict", message)
        raise RequeueAfter(2.0, "allocation conflict: waiting for the other claim")

    async def _release_held(self, key: str, claim: Obj, allocation: Obj) -> None:
        """A held claim whose devices no other claim holds: give it back, allocate again.

        Only while the scheduler is quiet: the clear is a removal the scheduler applies
        to its set, harmless now that nobody else holds the devices, unless a scheduling
        cycle hands one out at the same moment.
        """
        quiet, why = self.scheduler_quiet()
        if not quiet:
            raise RequeueAfter(1.0, f"held claim waits for a quiet scheduler: {why}")
        self._check_leader(key)
        # The marker goes first: a crash after it leaves an ordinary allocated claim,
        # which the next pass checks for conflicts again.
        claim = await self._patch(key, {"metadata": {"annotations": {CONFLICT_ANNOTATION: None}}})
        cleared = await self._clear_allocation(key, claim)
        if cleared is None:
            return
        await self._fence_after_removal(key, allocation, _rv(cleared))
        self.stats.yielded += 1
        log.info("held claim gave its allocation back", claim=key)
        raise RequeueAfter(0.1, "allocate the held claim again")

    # --- fences (see controller.claims.fences) ----------------------------------------------------

    def _is_fence_key(self, key: str) -> bool:
        return fences.is_fence_key(self.fence_namespace, key)

    def _in_scope(self, key: str) -> bool:
        """Whether fences guarding claim ``key`` are ours to manage.

        With ``--allocation-namespace`` the controller only acts for those namespaces, so
        several controllers (one per namespace set) never fight over the same fence.
        """
        return not self.namespaces or split_key(key)[0] in self.namespaces

    def _note_removal(self, key: str, devices: list[DeviceID], at: int) -> None:
        """Claim ``key`` let go of ``devices`` at resourceVersion ``at`` (scheduler: removed).

        A device another real claim (in scope) still holds is marked and its fence
        enqueued; a device nobody but fences holds any more has those fences enqueued (to
        be deleted).
        """
        if devices:
            self.last_removal = time.monotonic()
        for device in devices:
            holders = [h for h in self.state.dedicated.get(device, []) if h != key]
            real = [h for h in holders if not self._is_fence_key(h)]
            if any(self._in_scope(h) for h in real):
                self.fence_marks.mark(device, at)
                fk = fences.fence_key(self.fence_namespace, device)
                self.fence_devices.setdefault(fk, [device])
                self.enqueue(fk)
            elif not real:
                for h in holders:
                    self.enqueue(h)  # fences only: delete them

    async def _fence_after_removal(self, key: str, allocation: Obj, at: int) -> None:
        """Right after our own clear write: fence at once, without waiting for the informer.

        The fence's allocation is written after our clear (``at``), so the scheduler sees
        the removal first and the fence's addition last. Failures are retried by the
        workqueue (the fence keys were enqueued). Logs one ``fence check`` line.
        """
        devices = fences.exclusive(allocation)
        self._note_removal(key, devices, at)
        outcome: dict[str, str] = {}
        for device in devices:
            fk = fences.fence_key(self.fence_namespace, device)
            if device not in self.fence_marks:
                outcome["/".join(device)] = "not needed (no other claim holds it)"
                continue
            try:
                outcome["/".join(device)] = await self.reconcile_fence(fk)
            except (KubeAPIError, httpx.HTTPError, NotLeader, RequeueAfter) as e:
                outcome["/".join(device)] = f"failed, will retry: {e}"
        log.info("fence check after removal", claim=key, removed_at=at, devices=outcome)

    def _node_selector(self, holders: list[str]) -> Obj | None:
        for holder in holders:
            claim = self.claims.get(holder)
            allocation = allocation_of(claim) if claim is not None else None
            if allocation is None and holder in self.inflight:
                allocation = self.inflight[holder][0]
            if allocation is not None:
                selector: Obj | None = allocation.get("nodeSelector")
                return selector
        return None

    async def reconcile_fence(self, key: str) -> str:
        """Create, allocate, re-allocate or delete the fence ``key`` (level-based).

        Reads the fence from the API server (not the cache: our own writes must be seen),
        the holders from the allocated state. Serialised by a lock, since our give-back
        path calls it directly while a worker may handle the same key. Returns what it did.
        """
        namespace, name = split_key(key)
        path = path_for(RESOURCE_V1, "resourceclaims", namespace, name)
        async with self._fence_lock:
            for _ in range(4):
                fence = await self.client.get_or_none(path)
                if fence is not None and not fences.is_fence(fence):
                    return "not a fence"  # our prefix but not our label: not ours to touch
                if fence is not None:
                    holder = fences.fence_annotations(fence).get(fences.HOLDER_ANNOTATION, "")
                    if not self._in_scope(holder):
                        return "out of scope"  # another controller's (--allocation-namespace)
                devices = fences.fence_devices(fence) if fence else self.fence_devices.get(key, [])
                if not devices:
                    return "unknown devices"
                holders = sorted(
                    {
                        h
                        for d in devices
                        for h in fences.real_holders(d, self.state, self._is_fence_key)
                    },
                    key=lambda h: (not self._in_scope(h), h),
                )
                mark = max(self.fence_marks.get(d) for d in devices)
                decision = fences.decide(fence, holders, mark)
                action = decision.action
                if action is fences.Action.NONE:
                    if fence is not None and fences.allocated(fence):
                        for d in devices:
                            self.fence_marks.satisfied(d, fences.rv(fence))
                    elif not holders:
                        if any(d in self.fence_marks for d in devices):
                            log.info("no fence needed: no claim holds the device now", fence=key)
                        for d in devices:
                            self.fence_marks.forget(d)
                    log.debug("fence unchanged", fence=key, reason=decision.reason)
                    return f"unchanged: {decision.reason}"
                if action is fences.Action.DELETE:
                    quiet, why = self.scheduler_quiet()
                    if not quiet:  # its removal must not race a scheduling cycle either
                        raise RequeueAfter(1.0, f"fence deletion waits: {why}")
                self._check_leader(key)
                try:
                    if action is fences.Action.DELETE:
                        assert fence is not None
                        await self.client.request(
                            "DELETE",
                            path,
                            {"preconditions": {"resourceVersion": str(fences.rv(fence))}},
                        )
                        self.stats.fences_deleted += 1
                        for d in devices:
                            self.fence_marks.forget(d)
                        log.info("fence deleted", fence=key, reason=decision.reason)
                        return "deleted"
                    if action is fences.Action.CREATE:
                        fence = await self.client.create(
                            path_for(RESOURCE_V1, "resourceclaims", self.fence_namespace),
                            fences.new_fence(self.fence_namespace, devices, holders[0]),
                        )
                    elif action is fences.Action.PULSE:
                        assert fence is not None
                        fence = await self.client.merge_patch(
                            path + "/status",
                            {
                                "metadata": {"resourceVersion": str(fences.rv(fence))},
                                "status": {"allocation": None},
                            },
                        )
                    assert fence is not None
                    written = await self.client.merge_patch(
                        path + "/status",
                        {
                            "metadata": {"resourceVersion": str(fences.rv(fence))},
                            "status": {
                                "allocation": fences.fence_allocation(
                                    devices, self._node_selector(holders), params.now_rfc3339()
                                )
                            },
                        },
                    )
                except KubeAPIError as e:
                    if is_not_found(e) or is_conflict(e):
                        log.info(
                            "fence changed meanwhile, looking again",
                            fence=key,
                            action=action.value,
                            status=e.status,
                            error=str(e)[:300],
                        )
                        continue  # changed meanwhile (or already exists): look again
                    raise
                for d in devices:
                    self.fence_marks.satisfied(d, fences.rv(written))
                self.stats.fences_allocated += 1
                log.info(
                    "fence allocated",
                    fence=key,
                    action=action.value,
                    devices=["/".join(d) for d in devices],
                    holders=holders[:5],
                    reason=decision.reason,
                )
                return f"allocated ({action.value}) at {fences.rv(written)}"
            raise RequeueAfter(1.0, f"fence {key} kept changing")

    async def _clear_allocation(self, key: str, claim: Obj) -> Obj | None:
        """Clear status.allocation (at the claim's resourceVersion) and forget our hold.

        Returns the updated claim, or None if the claim is gone.
        """
        namespace, name = split_key(key)
        try:
            updated = await self.client.merge_patch(
                path_for(RESOURCE_V1, "resourceclaims", namespace, name) + "/status",
                {
                    "metadata": {"resourceVersion": meta(claim)["resourceVersion"]},
                    "status": {"allocation": None},
                },
            )
        except KubeAPIError as e:
            if is_not_found(e):
                return None
            raise
        self.inflight.pop(key, None)
        self.state.remove(key)
        return updated

    async def _settled(self, key: str, claim: Obj) -> None:
        self.failures.pop(key, None)
        self.unallocatable.discard(key)
        if STATUS_ANNOTATION in annotations_of(claim):
            self._check_leader(key)
            await self._patch(key, {"metadata": {"annotations": {STATUS_ANNOTATION: None}}})

    async def _failed(self, key: str, claim: Obj, message: str) -> None:
        self.unallocatable.add(key)
        self.stats.failed += 1
        delay = self._backoff(key)
        log.info("claim cannot be allocated", claim=key, reason=message, retry_in=delay)
        if annotations_of(claim).get(STATUS_ANNOTATION) != message:
            self._check_leader(key)
            await self._patch(key, {"metadata": {"annotations": {STATUS_ANNOTATION: message}}})
        await self.events.emit(claim, "ResourceClaim", "Warning", "AllocationFailed", message)
        raise RequeueAfter(delay, "cannot be allocated")

    async def _deallocate(self, key: str, claim: Obj) -> None:
        consumers = reserved_for(claim)
        if consumers:
            raise RequeueAfter(
                2.0, f"claim {key} is still reserved by {len(consumers)} consumer(s)"
            )
        allocation = allocation_of(claim)
        if allocation:
            others = self._other_holders(key, allocation)
            if others:
                raise RequeueAfter(2.0, f"devices also held by {others[:3]}: not clearing yet")
            quiet, why = self.scheduler_quiet()
            if not quiet:
                raise RequeueAfter(1.0, f"deallocation waits for a quiet scheduler: {why}")
        self._check_leader(key)
        if allocation:
            cleared = await self._clear_allocation(key, claim)
            if cleared is None:
                return
            await self._fence_after_removal(key, allocation, _rv(cleared))
            claim = cleared
            self._devices_freed()
            self.stats.deallocated += 1
            log.info("claim deallocated", claim=key)
        await self._patch(
            key,
            {
                "metadata": {
                    "resourceVersion": meta(claim)["resourceVersion"],
                    "finalizers": [f for f in finalizers(claim) if f != FINALIZER],
                }
            },
        )
        log.info("finalizer removed", claim=key)

    async def _patch(self, key: str, body: Obj) -> Obj:
        namespace, name = split_key(key)
        return await self.client.merge_patch(
            path_for(RESOURCE_V1, "resourceclaims", namespace, name), body
        )


def _rv(obj: Obj) -> int:
    try:
        return int(meta(obj).get("resourceVersion") or 0)
    except ValueError:
        return 0


def claims_using(claims: Informer, driver: str) -> Callable[[Obj], Iterable[str]]:
    """Maps a DeviceClaimParameters object to the keys of the claims that reference it."""

    def mapper(obj: Obj) -> Iterable[str]:
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace"), meta.get("name")
        out = []
        for claim in claims.items():
            if (claim.get("metadata") or {}).get("namespace") != namespace:
                continue
            try:
                entries = params.claim_parameters(driver, claim)
            except params.ParametersError:
                continue
            if any(
                isinstance(e.source, params.ParametersReference) and e.source.name == name
                for e in entries
            ):
                out.append(f"{namespace}/{claim['metadata']['name']}")
        return out

    return mapper


def parameters_used_by(driver: str) -> Callable[[Obj], Iterable[str]]:
    """Maps a claim to the keys of the DeviceClaimParameters objects it references."""

    def mapper(claim: Obj) -> Iterable[str]:
        namespace = meta(claim).get("namespace")
        return [f"{namespace}/{name}" for name in referenced_parameters(driver, claim)]

    return mapper
