"""NetworkPoolReconciler: publishes network pools, attaches and detaches their devices.

Keyed by NetworkDevicePool name; level-based. Each pass compares

* *desired* attachments: every allocated claim (by the scheduler or by this controller)
  whose results name a device of the pool, on the node of the claim's allocation
  (devices have ``bindsToNode``, so the allocation's node selector names one node);
* *recorded* attachments: ``status.attachments`` of the pool object, written after each
  successful attach and before the claim is told, so a restarted or new leader knows
  what to detach.

Stale records are detached, missing ones attached (concurrently), then the claim's
``status.devices`` entry gets ``<driver>/attached`` (the scheduler's binding condition)
or ``<driver>/attach-failed`` (the binding failure condition: the scheduler gives up
the binding, the pod goes back to the queue and its claim is deallocated). Attach
backends must be idempotent: a crash between attach and the status write repeats it.
Deleting a pool waits (finalizer) until every device is detached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Literal

from controller.networkpools.attach import (
    AttachBackend,
    AttachError,
    AttachRequest,
    AttachResult,
    backend_for,
)
from controller.networkpools.conditions import condition, same_conditions
from controller.networkpools.pool import Wanted, network_pool, network_results
from controller.resourceclaims import allocated_node, reserved_for
from dradriver.allocator import claim_key
from dradriver.api import networkpool as net
from dradriver.api import parameters as params
from dradriver.k8s.client import KubeClient
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.events import EventRecorder
from dradriver.k8s.objects import Obj, allocation_of, finalizers, meta
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger
from dradriver.resourceslice.publisher import SlicePublisher
from dradriver.runtime import Informer, RequeueAfter

log = get_logger("controller.networkpools")

PUBLISHED = "Published"


class NetworkPoolReconciler:
    def __init__(
        self,
        client: KubeClient,
        driver: str,
        pools: Informer,
        claims: Informer,
        slices: Informer,
        is_leader: Callable[[], bool],
        events: EventRecorder | None = None,
        namespaces: Iterable[str] = (),
    ) -> None:
        self.client = client
        # A controller limited to some namespaces manages only their claims' attachments
        # (and leaves other records alone), like its claim allocation.
        self.namespaces = frozenset(namespaces)
        self.driver = driver
        self.pools = pools
        self.claims = claims
        self.slices = slices
        self.is_leader = is_leader
        self.events = events or EventRecorder(client)
        self.api_version = f"{driver}/{net.VERSION}"
        # The driver's one slice publisher, reading this controller's slice cache; the
        # leader check runs before each of its writes.
        self.publisher = SlicePublisher(client, driver, slices, before_write=self._check_leader)
        self._backends: dict[str, tuple[str, AttachBackend]] = {}
        # (pool, device) -> monotonic time its attach-failed taint ends (in memory: a new
        # leader starts without taints, which only costs one more failed attempt).
        self.cooldown: dict[tuple[str, str], float] = {}
        self.failures: dict[str, int] = {}
        self.attached_total = 0
        self.attach_failures_total = 0
        self.detached_total = 0

    # --- helpers ----------------------------------------------------------------------

    def _check_leader(self, key: str) -> None:
        if not self.is_leader():
            raise RuntimeError(f"not writing for network pool {key} without a fresh lease")

    def backend(self, name: str, spec: net.NetworkDevicePoolSpec) -> AttachBackend:
        """One backend per pool, rebuilt when its attach settings change."""
        fingerprint = spec.attach.model_dump_json(by_alias=True)
        cached = self._backends.get(name)
        if cached is None or cached[0] != fingerprint:
            cached = (fingerprint, backend_for(spec.attach))
            self._backends[name] = cached
        return cached[1]

    def wanted(self, name: str) -> dict[str, Wanted]:
        pool = net.pool_name(name)
        out: dict[str, Wanted] = {}
        for claim in self.claims.items():
            if not self._in_scope(claim_key(claim)):
                continue
            for result in network_results(self.driver, claim):
                if result["pool"] != pool:
                    continue
                node = allocated_node(allocation_of(claim) or {})
                if node is None:
                    log.warning(
                        "network device allocated without a node; not attaching",
                        claim=claim_key(claim),
                        device=result["device"],
                    )
                    continue
                out[result["device"]] = Wanted(
                    result["device"], node, claim_key(claim), meta(claim).get("uid", "")
                )
        return out

    def _in_scope(self, claim: str) -> bool:
        return not self.namespaces or claim.split("/", 1)[0] in self.namespaces

    def _backoff(self, key: str) -> float:
        n = self.failures.get(key, 0) + 1
        self.failures[key] = n
        return float(min(60.0, 2.0 ** (n - 1)))

    # --- reconcile --------------------------------------------------------------------

    async def __call__(self, key: str) -> None:
        obj = self.pools.get(key)
        if obj is None:
            # The finalizer saw to detaching. Its slices would go with it (ownerReferences);
            # deleting them now takes its devices off the scheduler's list at once.
            self._backends.pop(key, None)
            self.publisher.remove_pool(net.pool_name(key))
            await self.publisher.sync(net.pool_name(key))
            return
        deleting = bool(meta(obj).get("deletionTimestamp"))
        try:
            spec = net.validate_object(obj)
        except net.NetworkPoolError as e:
            await self._set_published(key, obj, "False", "InvalidSpec", str(e))
            if deleting:
                await self._drop_finalizer(key, obj)
            return
        if not deleting and net.FINALIZER not in finalizers(obj):
            self._check_leader(key)
            obj = await self.client.merge_patch(
                self._path(key),
                {
                    "metadata": {
                        "resourceVersion": meta(obj)["resourceVersion"],
                        "finalizers": [*finalizers(obj), net.FINALIZER],
                    }
                },
            )
        errors = await self._sync_attachments(key, obj, spec, deleting)
        if deleting:
            if not errors:
                await self._drop_finalizer(key, self.pools.get(key) or obj)
        else:
            # After attaching: a failure there taints the device in the slices.
            await self._publish(key, obj, spec)
        cooling_ends = self._cooling(key).values()
        if errors:
            delay = self._backoff(key)
            raise RequeueAfter(min([delay, *cooling_ends]), "; ".join(errors)[:500])
        self.failures.pop(key, None)
        if cooling_ends:
            raise RequeueAfter(min(cooling_ends), "a device's attach-failed taint expires")

    def _path(self, name: str, sub: str = "") -> str:
        return path_for(self.api_version, net.PLURAL, None, name) + sub

    def _cooling(self, key: str) -> dict[str, float]:
        """Devices of pool ``key`` in their attach-failure cooldown: seconds left."""
        now = time.monotonic()
        out = {}
        for (pool, device), until in list(self.cooldown.items()):
            if until <= now:
                del self.cooldown[(pool, device)]
            elif pool == key:
                out[device] = until - now
        return out

    async def _publish(self, key: str, obj: Obj, spec: net.NetworkDevicePoolSpec) -> None:
        pool = network_pool(
            self.driver,
            key,
            spec,
            meta(obj)["uid"],
            int(meta(obj).get("generation") or 1),
            cooling=self._cooling(key),
        )
        self.publisher.set_pool(pool)
        result = await self.publisher.sync(pool.name)
        if result.writes:
            log.info("network pool published", pool=key, slices=result.slices, writes=result.writes)
        message = (
            f"{len(spec.devices)} device(s) in {result.slices} ResourceSlice(s) of pool {pool.name}"
        )
        dropped = self.publisher.dropped(pool.name)
        if dropped:
            message += "; " + "; ".join(dropped)
        await self._set_published(key, obj, "True", "Published", message)

    async def _set_published(
        self, key: str, obj: Obj, status: Literal["True", "False"], reason: str, message: str
    ) -> None:
        current = (obj.get("status") or {}).get("conditions") or []
        conditions, changed = params.set_condition(
            current, PUBLISHED, status, reason, message, meta(obj).get("generation")
        )
        if not changed:
            return
        self._check_leader(key)
        await self.client.merge_patch(
            self._path(key, "/status"), {"status": {"conditions": conditions}}
        )
        if status == "False":
            await self.events.emit(
                {**obj, "apiVersion": self.api_version}, net.KIND, "Warning", reason, message
            )

    async def _drop_finalizer(self, key: str, obj: Obj) -> None:
        if net.FINALIZER not in finalizers(obj):
            return
        self._check_leader(key)
        try:
            await self.client.merge_patch(
                self._path(key),
                {
                    "metadata": {
                        "resourceVersion": meta(obj)["resourceVersion"],
                        "finalizers": [f for f in finalizers(obj) if f != net.FINALIZER],
                    }
                },
            )
        except KubeAPIError as e:
            if e.status != 404:
                raise
        log.info("network pool released", pool=key)

    # --- attachments ------------------------------------------------------------------

    async def _sync_attachments(
        self, key: str, obj: Obj, spec: net.NetworkDevicePoolSpec, deleting: bool
    ) -> list[str]:
        backend = self.backend(key, spec)
        recorded = {a.device: a for a in net.parse_status(obj).attachments}
        wanted = {} if deleting else self.wanted(key)
        known = {d.name for d in spec.devices}
        device_env = {d.name: dict(d.env) for d in spec.devices}
        errors: list[str] = []

        stale = [
            a
            for device, a in recorded.items()
            if self._in_scope(a.claim)
            and (
                device not in wanted
                or (wanted[device].claim_uid, wanted[device].node) != (a.claim_uid, a.node)
            )
        ]
        outcomes = await asyncio.gather(
            *(self._detach(key, backend, a) for a in stale), return_exceptions=True
        )
        kept = dict(recorded)
        for a, outcome in zip(stale, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                errors.append(f"detach {a.device} from {a.node}: {outcome}")
            else:
                del kept[a.device]

        todo = [
            w
            for device, w in sorted(wanted.items())
            if device not in kept and device in known and not self._gave_up(key, w)
        ]
        results = await asyncio.gather(
            *(self._attach(key, backend, w) for w in todo), return_exceptions=True
        )
        failed: dict[str, str] = {}
        now = params.now_rfc3339()
        for w, result in zip(todo, results, strict=True):
            if isinstance(result, AttachResult):
                kept[w.device] = net.Attachment(
                    device=w.device,
                    node=w.node,
                    claim=w.claim,
                    claim_uid=w.claim_uid,
                    handle=result.handle,
                    env={**device_env.get(w.device, {}), **result.env},
                    attached_at=now,
                )
            else:
                failed[w.device] = str(result)
                errors.append(f"attach {w.device} to {w.node}: {result}")
                if spec.attach.failure_cooldown_seconds:
                    until = time.monotonic() + spec.attach.failure_cooldown_seconds
                    self.cooldown[(key, w.device)] = until
        for device in wanted:
            if device not in known:
                failed[device] = f"device {device} is not (any more) in NetworkDevicePool {key}"

        if kept != recorded:
            self._check_leader(key)
            await self.client.merge_patch(
                self._path(key, "/status"),
                {
                    "status": {
                        "attachments": [
                            a.model_dump(by_alias=True) for _, a in sorted(kept.items())
                        ]
                    }
                },
            )
        await self._tell_claims(key, wanted, kept, failed)
        return errors

    def _gave_up(self, key: str, w: Wanted) -> bool:
        # The binding failure is reported: the scheduler deallocates the claim; attaching
        # again in between would only race with that. Controller-allocated claims are
        # retried by the backoff requeue once the condition is older than one pass.
        claim = self.claims.get(w.claim)
        entry = net.device_status(claim or {}, self.driver, net.pool_name(key), w.device)
        return reserved_for(claim or {}) != [] and net.condition_true(
            entry, net.attach_failed_condition(self.driver)
        )

    async def _attach(self, key: str, backend: AttachBackend, w: Wanted) -> AttachResult:
        self._check_leader(key)
        request = AttachRequest(key, w.device, w.node, w.claim, w.claim_uid)
        try:
            result = await backend.attach(request)
        except AttachError:
            self.attach_failures_total += 1
            raise
        except Exception as e:  # a backend bug must not stop the other devices
            self.attach_failures_total += 1
            raise AttachError(f"attach backend error: {e}") from e
        self.attached_total += 1
        log.info("device attached", pool=key, device=w.device, node=w.node, claim=w.claim)
        return result

    async def _detach(self, key: str, backend: AttachBackend, a: net.Attachment) -> None:
        self._check_leader(key)
        await backend.detach(AttachRequest(key, a.device, a.node, a.claim, a.claim_uid), a.handle)
        self.detached_total += 1
        log.info("device detached", pool=key, device=a.device, node=a.node, claim=a.claim)

    async def _tell_claims(
        self,
        key: str,
        wanted: dict[str, Wanted],
        attached: dict[str, net.Attachment],
        failed: dict[str, str],
    ) -> None:
        """Write the binding (failure) conditions into each claim's ``status.devices``."""
        pool = net.pool_name(key)
        by_claim: dict[str, list[Wanted]] = {}
        for w in wanted.values():
            by_claim.setdefault(w.claim, []).append(w)
        now = params.now_rfc3339()
        ok_type = net.attached_condition(self.driver)
        fail_type = net.attach_failed_condition(self.driver)
        for claim_name, items in sorted(by_claim.items()):
            claim = self.claims.get(claim_name)
            if claim is None:
                continue
            entries = list((claim.get("status") or {}).get("devices") or [])
            changed = False
            for w in items:
                a = attached.get(w.device)
                if a is not None and a.claim_uid == w.claim_uid and a.node == w.node:
                    pinned = net.PinnedAttachment(w.node, a.handle, {**a.env})
                    conditions = [
                        condition(ok_type, "True", "Attached", f"attached to node {w.node}", now),
                        condition(fail_type, "False", "Attached", "", now),
                    ]
                    data: Obj | None = pinned.to_data()
                elif w.device in failed:
                    conditions = [
                        condition(ok_type, "False", "AttachFailed", failed[w.device], now),
                        condition(fail_type, "True", "AttachFailed", failed[w.device], now),
                    ]
                    data = None
                else:
                    continue
                entry = net.device_status(claim, self.driver, pool, w.device)
                if entry is not None and same_conditions(entry, conditions, data):
                    continue
                new_entry: Obj = {
                    "driver": self.driver,
                    "pool": pool,
                    "device": w.device,
                    "conditions": conditions,
                }
                # Keep what others pinned there (e.g. resolved parameters).
                merged = {**((entry or {}).get("data") or {}), **(data or {})}
                if merged:
                    new_entry["data"] = merged
                entries = [
                    e
                    for e in entries
                    if (e.get("driver"), e.get("pool"), e.get("device"))
                    != (self.driver, pool, w.device)
                ] + [new_entry]
                changed = True
                await self._emit_outcome(claim, w, failed.get(w.device))
            if not changed:
                continue
            namespace, name = claim_name.split("/", 1)
            self._check_leader(key)
            try:
                await self.client.merge_patch(
                    path_for(RESOURCE_V1, "resourceclaims", namespace, name) + "/status",
                    {
                        "metadata": {"resourceVersion": meta(claim)["resourceVersion"]},
                        "status": {"devices": entries},
                    },
                )
            except KubeAPIError as e:
                if e.status in (404, 409):  # gone, or the cache is behind: next pass
                    raise RequeueAfter(0.5, f"claim {claim_name} changed: {e.status}") from e
                raise

    async def _emit_outcome(self, claim: Obj, w: Wanted, error: str | None) -> None:
        if error is None:
            await self.events.emit(
                claim, "ResourceClaim", "Normal", "Attached", f"{w.device} attached to {w.node}"
            )
            return
        message = f"attaching network device {w.device} to node {w.node} failed: {error}"
        await self.events.emit(claim, "ResourceClaim", "Warning", "AttachFailed", message)
        for ref in reserved_for(claim):
            if ref.get("resource") != "pods":
                continue
            pod = {
                "apiVersion": "v1",
                "metadata": {
                    "name": ref.get("name"),
                    "namespace": meta(claim).get("namespace"),
                    "uid": ref.get("uid"),
                },
            }
            await self.events.emit(pod, "Pod", "Warning", "AttachFailed", message)
