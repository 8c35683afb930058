"""Published claim status for node-local devices: ``status.devices[]`` of prepared claims.

After a claim is prepared, each of this driver's node-local devices gets an entry in the
claim's ``status.devices`` (resource.k8s.io/v1 ``AllocatedDeviceStatus``, GA in 1.37 as
DRAResourceClaimDeviceStatus, beta and on by default in 1.34-1.36): a ``Ready`` condition
(``reason: Prepared``) and ``data`` with the CDI device IDs and the node, so that
``kubectl get resourceclaim -o yaml`` shows what the node did.

Written once per claim and off the prepare path: :meth:`ClaimStatusWriter.prepared` only
queues the claim with the object prepare read, due after a short delay (a burst of
prepares is answered first, and a claim unprepared at once costs no request). A worker
task then writes a JSON merge patch of ``status.devices`` built from that object and
guarded by its resourceVersion (other entries, such as the controller's pinned
``data.parameters`` and network devices, are kept as they are): one request per claim. A
conflict (someone wrote the claim since prepare read it) reads the claim again, and so
does every retry; any other API error (429, 5xx, timeout, 403) is retried with per-claim
exponential backoff; a claim that is gone, replaced, no longer allocated here or
unprepared meanwhile is dropped. The worker handles one claim at a time and gives the
loop back between claims, so claims that need no request (published already) do not hold
the loop either. The write is what ``claim-status-policy.yaml`` admits: only entries of
this driver in the node's pool, on claims allocated to the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dradriver.api import networkpool as net
from dradriver.k8s.client import KubeClient
from dradriver.k8s.errors import KubeAPIError, is_conflict, is_not_found
from dradriver.k8s.objects import Obj, allocation_of
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger
from dradriver.plugin.interface import ClaimRef, PreparedDevice
from dradriver.runtime.ratelimit import ItemExponentialRateLimiter
from dradriver.runtime.workqueue import ShutDown, WorkQueue

log = get_logger("kubeletplugin.claimstatus")

READY_CONDITION = "Ready"
PREPARED_REASON = "Prepared"
DATA_CDI_IDS = "cdiDeviceIDs"
DATA_NODE = "node"
# One claim's status write; a slow apiserver costs this worker, never a prepare.
WRITE_TIMEOUT_SECONDS = 10.0
# How long a prepared claim waits before its status is written. A burst of prepares (a
# node's start, a job's pods) is answered before its status writes compete with it for
# the apiserver and the loop, and a claim unprepared within this time costs no request.
WRITE_DELAY_SECONDS = 0.5


@dataclass(frozen=True)
class _Pending:
    claim: ClaimRef
    devices: tuple[PreparedDevice, ...]


def _key(entry: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    """An entry's identity (the API's list-map keys)."""
    return (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_published(entry: Mapping[str, Any]) -> bool:
    """The entry carries this module's Ready condition already (written once)."""
    conditions = entry.get("conditions") or []
    return any(
        isinstance(c, dict)
        and c.get("type") == READY_CONDITION
        and c.get("reason") == PREPARED_REASON
        for c in conditions
    )


def merged_devices(
    existing: list[Any],
    driver: str,
    node: str,
    devices: tuple[PreparedDevice, ...],
    generation: int,
) -> list[Any] | None:
    """``status.devices`` with our entries added or completed; ``None`` if nothing changes.

    Entries of other drivers, other pools and our entries' other conditions and data keys
    (the controller's ``parameters``) stay as they are.
    """
    out = copy.deepcopy(existing)
    by_key = {_key(e): e for e in out if isinstance(e, dict)}
    changed = False
    for d in devices:
        if d.pool != node or net.is_network_pool(d.pool):
            continue  # network-attached devices' status is the controller's
        key = (driver, d.pool, d.device, d.share_id)
        entry = by_key.get(key)
        if entry is None:
            entry = {"driver": driver, "pool": d.pool, "device": d.device}
            if d.share_id:
                entry["shareID"] = d.share_id
            out.append(entry)
            by_key[key] = entry
        elif is_published(entry):
            continue
        conditions = [
            c
            for c in entry.get("conditions") or []
            if not (isinstance(c, dict) and c.get("type") == READY_CONDITION)
        ]
        conditions.append(
            {
                "type": READY_CONDITION,
                "status": "True",
                "reason": PREPARED_REASON,
                "message": f"prepared on node {node}",
                "lastTransitionTime": _now(),
                "observedGeneration": generation,
            }
        )
        entry["conditions"] = conditions
        data = entry.get("data")
        kept: dict[str, Any] = data if isinstance(data, dict) else {}
        entry["data"] = {**kept, DATA_CDI_IDS: list(d.cdi_ids), DATA_NODE: node}
        changed = True
    return out if changed else None


def allocated_here(claim: Obj, driver: str, node: str) -> bool:
    """The claim's allocation has results of this driver in this node's pool."""
    allocation = allocation_of(claim) or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return any(r.get("driver") == driver and r.get("pool") == node for r in results)


class ClaimStatusWriter:
    """Queues prepared claims and writes their device status in the background."""

    def __init__(
        self,
        client: KubeClient,
        driver: str,
        node: str,
        base_delay: float = 0.5,
        max_delay: float = 300.0,
        write_delay: float = WRITE_DELAY_SECONDS,
    ) -> None:
        self.client = client
        self.driver = driver
        self.node = node
        self.write_delay = write_delay
        self.queue: WorkQueue[str] = WorkQueue(
            "claim-status", rate_limiter=ItemExponentialRateLimiter(base_delay, max_delay)
        )
        self._pending: dict[str, _Pending] = {}
        # Claims whose first attempt has not run yet: the object prepare read.
        self._read: dict[str, Obj] = {}
        self.reads = 0  # GETs of claims (the first attempt makes none)
        self._settled = asyncio.Event()
        self._settled.set()
        self._task: asyncio.Task[None] | None = None
        self.written = 0
        self.retries = 0

    # ----- called by the node driver (never blocks, never raises) --------------------

    def prepared(
        self, claim: ClaimRef, devices: list[PreparedDevice], obj: Obj | None = None
    ) -> None:
        """Queue the status of a claim that was just prepared; ``obj`` is the claim as
        prepare read it (the first attempt builds its patch on it instead of a GET)."""
        if claim.uid in self._pending or not devices:
            return
        self._pending[claim.uid] = _Pending(claim, tuple(devices))
        if obj is not None:
            self._read[claim.uid] = obj
        self._settled.clear()
        self.queue.add_after(claim.uid, self.write_delay)

    def unprepared(self, uid: str) -> None:
        """The claim was unprepared: its status is no longer worth writing."""
        self._finished(uid)
        self.queue.forget(uid)

    # ----- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="claim-status")

    async def stop(self) -> None:
        self.queue.shut_down()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def settled(self) -> None:
        """Until every queued claim is written or dropped (retries included)."""
        await self._settled.wait()

    @property
    def pending(self) -> frozenset[str]:
        """UIDs of claims whose status is still to be written."""
        return frozenset(self._pending)

    def _finished(self, uid: str) -> None:
        self._pending.pop(uid, None)
        self._read.pop(uid, None)
        if not self._pending:
            self._settled.set()

    async def _run(self) -> None:
        while True:
            try:
                uid = await self.queue.get()
            except ShutDown:
                return
            try:
                if await self._write(uid):
                    self.queue.forget(uid)
                else:
                    self.retries += 1
                    self.queue.add_rate_limited(uid)
            except Exception as e:  # a bug must not end the worker; retried with backoff
                log.exception("claim status write failed unexpectedly", uid=uid, error=str(e))
                self.retries += 1
                self.queue.add_rate_limited(uid)
            finally:
                self.queue.done(uid)
            # A claim whose write needed no request never awaited: let prepares run before
            # the next one, as the GET every claim cost once did.
            await asyncio.sleep(0)

    async def _write(self, uid: str) -> bool:
        """True when done with the claim (written, or nothing to write); False to retry."""
        pending = self._pending.get(uid)
        if pending is None:
            return True
        claim = pending.claim
        path = path_for(RESOURCE_V1, "resourceclaims", claim.namespace, claim.name)
        # Used once: after a conflict or any other failure the claim is read again.
        obj: Obj | None = self._read.pop(uid, None)
        try:
            async with asyncio.timeout(WRITE_TIMEOUT_SECONDS):
                if obj is None:
                    self.reads += 1
                    obj = await self.client.get_or_none(path)
                if obj is None or obj["metadata"].get("uid") != uid:
                    self._drop(uid, "claim gone or replaced")
                    return True
                if not allocated_here(obj, self.driver, self.node):
                    self._drop(uid, "claim no longer allocated to this node")
                    return True
                status = obj.get("status") or {}
                generation = int(obj["metadata"].get("generation") or 0)
                devices = merged_devices(
                    list(status.get("devices") or []),
                    self.driver,
                    self.node,
                    pending.devices,
                    generation,
                )
                if devices is not None:
                    if self._pending.get(uid) is not pending:
                        return True  # unprepared while the claim was read
                    await self.client.merge_patch(
                        path + "/status",
                        {
                            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                            "status": {"devices": devices},
                        },
                    )
                    self.written += 1
                    log.info("claim status published", claim=str(claim), uid=uid)
        except KubeAPIError as e:
            if is_not_found(e):
                self._drop(uid, "claim gone")
                return True
            level = log.debug if is_conflict(e) else log.warning
            level("claim status not written; retrying", claim=str(claim), status=e.status)
            return False
        except OSError as e:  # TransportError and TimeoutError are OSErrors
            log.warning(
                "claim status not written; retrying",
                claim=str(claim),
                error=str(e) or type(e).__name__,
            )
            return False
        if self._pending.get(uid) is pending:
            self._finished(uid)
        return True

    def _drop(self, uid: str, why: str) -> None:
        pending = self._pending.get(uid)
        if pending is not None:
            self._finished(uid)
            log.info("claim status not written", claim=str(pending.claim), reason=why)
