"""The fence lifecycle: notice removals, then create, allocate, pulse and delete fence
claims (the rules, and why fences exist, are in :mod:`controller.claims.fence_rules`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from controller.claims import fence_rules as fences
from controller.claims.context import ClaimContext
from controller.leadership import NotLeader
from controller.resourceclaims import claim_path
from dradriver.allocator import DeviceID
from dradriver.k8s.errors import KubeAPIError, is_conflict, is_not_found
from dradriver.k8s.http import TransportError
from dradriver.k8s.objects import Obj, annotations_of, now_rfc3339, revision
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger
from dradriver.runtime import RequeueAfter

log = get_logger("controller")


class Fencing:
    """Keeps one fence claim per device whose removal the scheduler may have forgotten.

    Fed by every removal the claims informer shows (:meth:`note_removal`) and by our own
    clears right after they are written (:meth:`after_removal`); :meth:`reconcile` is the
    level-based pass over one fence key. Marks of pending fence writes are kept in
    memory (:class:`~controller.claims.fence_rules.Marks`).
    """

    def __init__(self, context: ClaimContext, namespace: str) -> None:
        self.context = context
        self.namespace = namespace  # where fences live
        self.marks = fences.Marks()
        self.devices: dict[str, list[DeviceID]] = {}  # fence key -> devices (if known)
        self._lock = asyncio.Lock()  # fences are rare: one fence write at a time

    def is_fence_key(self, key: str) -> bool:
        return fences.is_fence_key(self.namespace, key)

    def in_scope(self, key: str) -> bool:
        """Whether fences guarding claim ``key`` are ours to manage.

        With ``--allocation-namespace`` the controller only acts for those namespaces, so
        several controllers (one per namespace set) never fight over the same fence.
        """
        return self.context.in_scope(key)

    def remember(self, key: str, claim: Obj) -> None:
        """The informer shows ``claim``: if it is a fence, remember the devices it holds."""
        if fences.is_fence(claim):
            self.devices[key] = fences.fence_devices(claim)

    def note_removal(self, key: str, devices: list[DeviceID], at: int) -> None:
        """Claim ``key`` let go of ``devices`` at resourceVersion ``at`` (scheduler: removed).

        A device another real claim (in scope) still holds is marked and its fence
        enqueued; a device nobody but fences holds any more has those fences enqueued (to
        be deleted). Devices of other drivers are never fenced (their claims are not ours,
        :mod:`controller.claims.scope`); a fence of one left from before is still deleted.
        """
        if devices:
            self.context.scheduler.removal_seen()
        for device in devices:
            holders = [h for h in self.context.holdings.state.dedicated.get(device, []) if h != key]
            real = [h for h in holders if not self.is_fence_key(h)]
            if any(self.in_scope(h) for h in real):
                if not self.context.drivers.covers(device[0]):
                    continue
                self.marks.mark(device, at)
                fk = fences.fence_key(self.namespace, device)
                self.devices.setdefault(fk, [device])
                self.context.enqueue(fk)
            elif not real:
                for h in holders:
                    self.context.enqueue(h)  # fences only: delete them

    async def after_removal(self, key: str, allocation: Obj, at: int) -> None:
        """Right after our own clear write: fence at once, without waiting for the informer.

        The fence's allocation is written after our clear (``at``), so the scheduler sees
        the removal first and the fence's addition last. Failures are retried by the
        workqueue (the fence keys were enqueued). Logs one ``fence check`` line.
        """
        devices = fences.exclusive(allocation)
        self.note_removal(key, devices, at)
        outcome: dict[str, str] = {}
        for device in devices:
            fk = fences.fence_key(self.namespace, device)
            if device not in self.marks:
                outcome["/".join(device)] = "not needed (no other claim holds it)"
                continue
            try:
                outcome["/".join(device)] = await self.reconcile(fk)
            except (KubeAPIError, TransportError, NotLeader, RequeueAfter) as e:
                outcome["/".join(device)] = f"failed, will retry: {e}"
        log.info("fence check after removal", claim=key, removed_at=at, devices=outcome)

    def _node_selector(self, holders: list[str]) -> Obj | None:
        for holder in holders:
            allocation = self.context.holdings.allocation(holder)
            if allocation is not None:
                selector: Obj | None = allocation.get("nodeSelector")
                return selector
        return None

    async def reconcile(self, key: str) -> str:
        """Create, allocate, re-allocate or delete the fence ``key`` (level-based).

        Reads the fence from the API server (not the cache: our own writes must be seen),
        the holders from the allocated state. Serialised by a lock, since our give-back
        path calls it directly while a worker may handle the same key. Returns what it did.
        """
        async with self._lock:
            for _ in range(4):
                fence = await self.context.client.get_or_none(claim_path(key))
                looked = self._look(key, fence)
                if isinstance(looked, str):
                    return looked
                if looked.decision.action is fences.Action.NONE:
                    return self._unchanged(key, fence, looked)
                try:
                    return await self._act(key, fence, looked)
                except KubeAPIError as e:
                    if is_not_found(e) or is_conflict(e):
                        log.info(
                            "fence changed meanwhile, looking again",
                            fence=key,
                            action=looked.decision.action.value,
                            status=e.status,
                            error=str(e)[:300],
                        )
                        continue  # changed meanwhile (or already exists): look again
                    raise
            raise RequeueAfter(1.0, f"fence {key} kept changing")

    def _look(self, key: str, fence: Obj | None) -> _Look | str:
        """The fence's devices, their real holders (those in scope first) and what to do;
        or, when the fence is not ours to touch, why."""
        if fence is not None and not fences.is_fence(fence):
            return "not a fence"  # our prefix but not our label: not ours to touch
        if fence is not None:
            holder = annotations_of(fence).get(fences.HOLDER_ANNOTATION, "")
            if not self.in_scope(holder):
                return "out of scope"  # another controller's (--allocation-namespace)
        devices = fences.fence_devices(fence) if fence else self.devices.get(key, [])
        if not devices:
            return "unknown devices"
        state = self.context.holdings.state
        holders = sorted(
            {h for d in devices for h in fences.real_holders(d, state, self.is_fence_key)},
            key=lambda h: (not self.in_scope(h), h),
        )
        mark = max(self.marks.get(d) for d in devices)
        return _Look(devices, holders, fences.decide(fence, holders, mark))

    def _unchanged(self, key: str, fence: Obj | None, looked: _Look) -> str:
        """Nothing to write: forget the marks the fence covers, or that no holder needs."""
        devices = looked.devices
        if fence is not None and fences.allocated(fence):
            for d in devices:
                self.marks.satisfied(d, revision(fence))
        elif not looked.holders:
            if any(d in self.marks for d in devices):
                log.info("no fence needed: no claim holds the device now", fence=key)
            for d in devices:
                self.marks.forget(d)
        log.debug("fence unchanged", fence=key, reason=looked.decision.reason)
        return f"unchanged: {looked.decision.reason}"

    async def _act(self, key: str, fence: Obj | None, looked: _Look) -> str:
        """Delete the fence, or create / clear it and write its allocation."""
        action, devices, holders = looked.decision.action, looked.devices, looked.holders
        if action is fences.Action.DELETE:
            quiet, why = self.context.scheduler.quiet()
            if not quiet:  # its removal must not race a scheduling cycle either
                raise RequeueAfter(1.0, f"fence deletion waits: {why}")
        self.context.require_leader(key)
        client, path = self.context.client, claim_path(key)
        if action is fences.Action.DELETE:
            assert fence is not None
            await client.request(
                "DELETE", path, {"preconditions": {"resourceVersion": str(revision(fence))}}
            )
            self.context.stats.fences_deleted += 1
            for d in devices:
                self.marks.forget(d)
            log.info("fence deleted", fence=key, reason=looked.decision.reason)
            return "deleted"
        if action is fences.Action.CREATE:
            fence = await client.create(
                path_for(RESOURCE_V1, "resourceclaims", self.namespace),
                fences.new_fence(self.namespace, devices, holders[0]),
            )
        elif action is fences.Action.PULSE:
            assert fence is not None
            fence = await client.merge_patch(
                path + "/status",
                {
                    "metadata": {"resourceVersion": str(revision(fence))},
                    "status": {"allocation": None},
                },
            )
        assert fence is not None
        allocation = fences.fence_allocation(devices, self._node_selector(holders), now_rfc3339())
        written = await client.merge_patch(
            path + "/status",
            {
                "metadata": {"resourceVersion": str(revision(fence))},
                "status": {"allocation": allocation},
            },
        )
        for d in devices:
            self.marks.satisfied(d, revision(written))
        self.context.stats.fences_allocated += 1
        log.info(
            "fence allocated",
            fence=key,
            action=action.value,
            devices=["/".join(d) for d in devices],
            holders=holders[:5],
            reason=looked.decision.reason,
        )
        return f"allocated ({action.value}) at {revision(written)}"


@dataclass(frozen=True)
class _Look:
    """One look at a fence: its devices, their real holders, and the decision."""

    devices: list[DeviceID]
    holders: list[str]
    decision: fences.Decision
