"""The fence lifecycle: notice removals, then create, allocate, pulse and delete fence
claims (the rules, and why fences exist, are in :mod:`controller.claims.fence_rules`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from controller.claims import fence_rules as fences
from controller.claims.holdings import Holdings
from controller.claims.scheduler import SchedulerActivity
from controller.claims.stats import AllocationStats
from controller.leadership import NotLeader, require_leader
from controller.resourceclaims import claim_path
from dradriver.allocator import DeviceID
from dradriver.k8s.client import KubeClient
from dradriver.k8s.errors import KubeAPIError, is_conflict, is_not_found
from dradriver.k8s.http import TransportError
from dradriver.k8s.objects import Obj, annotations_of, now_rfc3339, revision
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger
from dradriver.runtime import RequeueAfter, split_key

log = get_logger("controller")


class Fencing:
    """Keeps one fence claim per device whose removal the scheduler may have forgotten.

    Fed by every removal the claims informer shows (:meth:`note_removal`) and by our own
    clears right after they are written (:meth:`after_removal`); :meth:`reconcile` is the
    level-based pass over one fence key. Marks of pending fence writes are kept in
    memory (:class:`~controller.claims.fence_rules.Marks`).
    """

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        holdings: Holdings,
        scheduler: SchedulerActivity,
        stats: AllocationStats,
        is_leader: Callable[[], bool],
        enqueue: Callable[[str], None],
        namespaces: frozenset[str] = frozenset(),
    ) -> None:
        self.client = client
        self.namespace = namespace  # where fences live
        self.holdings = holdings
        self.scheduler = scheduler
        self.stats = stats
        self.is_leader = is_leader
        self.enqueue = enqueue
        self.namespaces = namespaces  # --allocation-namespace: whose fences we manage
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
        return not self.namespaces or split_key(key)[0] in self.namespaces

    def remember(self, key: str, claim: Obj) -> None:
        """The informer shows ``claim``: if it is a fence, remember the devices it holds."""
        if fences.is_fence(claim):
            self.devices[key] = fences.fence_devices(claim)

    def note_removal(self, key: str, devices: list[DeviceID], at: int) -> None:
        """Claim ``key`` let go of ``devices`` at resourceVersion ``at`` (scheduler: removed).

        A device another real claim (in scope) still holds is marked and its fence
        enqueued; a device nobody but fences holds any more has those fences enqueued (to
        be deleted).
        """
        if devices:
            self.scheduler.removal_seen()
        for device in devices:
            holders = [h for h in self.holdings.state.dedicated.get(device, []) if h != key]
            real = [h for h in holders if not self.is_fence_key(h)]
            if any(self.in_scope(h) for h in real):
                self.marks.mark(device, at)
                fk = fences.fence_key(self.namespace, device)
                self.devices.setdefault(fk, [device])
                self.enqueue(fk)
            elif not real:
                for h in holders:
                    self.enqueue(h)  # fences only: delete them

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
            allocation = self.holdings.allocation(holder)
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
        path = claim_path(key)
        async with self._lock:
            for _ in range(4):
                fence = await self.client.get_or_none(path)
                if fence is not None and not fences.is_fence(fence):
                    return "not a fence"  # our prefix but not our label: not ours to touch
                if fence is not None:
                    holder = annotations_of(fence).get(fences.HOLDER_ANNOTATION, "")
                    if not self.in_scope(holder):
                        return "out of scope"  # another controller's (--allocation-namespace)
                devices = fences.fence_devices(fence) if fence else self.devices.get(key, [])
                if not devices:
                    return "unknown devices"
                holders = sorted(
                    {
                        h
                        for d in devices
                        for h in fences.real_holders(d, self.holdings.state, self.is_fence_key)
                    },
                    key=lambda h: (not self.in_scope(h), h),
                )
                mark = max(self.marks.get(d) for d in devices)
                decision = fences.decide(fence, holders, mark)
                action = decision.action
                if action is fences.Action.NONE:
                    if fence is not None and fences.allocated(fence):
                        for d in devices:
                            self.marks.satisfied(d, revision(fence))
                    elif not holders:
                        if any(d in self.marks for d in devices):
                            log.info("no fence needed: no claim holds the device now", fence=key)
                        for d in devices:
                            self.marks.forget(d)
                    log.debug("fence unchanged", fence=key, reason=decision.reason)
                    return f"unchanged: {decision.reason}"
                if action is fences.Action.DELETE:
                    quiet, why = self.scheduler.quiet()
                    if not quiet:  # its removal must not race a scheduling cycle either
                        raise RequeueAfter(1.0, f"fence deletion waits: {why}")
                require_leader(self.is_leader, f"claim {key}")
                try:
                    if action is fences.Action.DELETE:
                        assert fence is not None
                        await self.client.request(
                            "DELETE",
                            path,
                            {"preconditions": {"resourceVersion": str(revision(fence))}},
                        )
                        self.stats.fences_deleted += 1
                        for d in devices:
                            self.marks.forget(d)
                        log.info("fence deleted", fence=key, reason=decision.reason)
                        return "deleted"
                    if action is fences.Action.CREATE:
                        fence = await self.client.create(
                            path_for(RESOURCE_V1, "resourceclaims", self.namespace),
                            fences.new_fence(self.namespace, devices, holders[0]),
                        )
                    elif action is fences.Action.PULSE:
                        assert fence is not None
                        fence = await self.client.merge_patch(
                            path + "/status",
                            {
                                "metadata": {"resourceVersion": str(revision(fence))},
                                "status": {"allocation": None},
                            },
                        )
                    assert fence is not None
                    written = await self.client.merge_patch(
                        path + "/status",
                        {
                            "metadata": {"resourceVersion": str(revision(fence))},
                            "status": {
                                "allocation": fences.fence_allocation(
                                    devices, self._node_selector(holders), now_rfc3339()
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
                    self.marks.satisfied(d, revision(written))
                self.stats.fences_allocated += 1
                log.info(
                    "fence allocated",
                    fence=key,
                    action=action.value,
                    devices=["/".join(d) for d in devices],
                    holders=holders[:5],
                    reason=decision.reason,
                )
                return f"allocated ({action.value}) at {revision(written)}"
            raise RequeueAfter(1.0, f"fence {key} kept changing")
