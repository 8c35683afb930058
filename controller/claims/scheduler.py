"""What kube-scheduler may be doing right now, judged from the outside.

kube-scheduler 1.36 keeps allocated devices in a plain set fed by its claim informer
(added when a claim's allocation appears, removed when it is cleared or the claim
deleted) and may hold a device in memory for a pod it is scheduling before it writes
anything. So the controller times its own writes by two signals:

* pods with claims that wait for a first scheduling verdict: the scheduler may be
  allocating for them right now, so no allocation is written meanwhile (bounded);
* the time since a claim last let go of devices: a removal re-queues the scheduler's
  unschedulable pods, so clearing an allocation waits until that has settled.

Removals go in *waves*. A wave opens once the scheduler is quiet (no pod waiting for a
first verdict, ``removal_quiet`` seconds since the last removal) and lasts up to
``removal_window`` seconds, or until a pod with claims shows activity; within it every
claim that is ready may let go of its devices, not one per quiet period. Why that keeps
the rule: a removal is dangerous only if a scheduling cycle holds, in memory, a device
the removed claim still holds, which the scheduler does only for a device it does not
count as taken. The cycles an in-wave removal can meet are those its predecessors in
the wave re-queued, and they started after the wave opened, from a scheduler state in
which every claim still to be cleared holds its devices; so they can pick the devices
the wave freed (free for real), never one of a claim cleared later in the wave, provided
the scheduler counts that claim's allocation. That is what the per-claim condition
says: its allocation was seen ``removal_quiet`` seconds before (the same settling time
the quiet period gives a removal). A device already counted twice is no exception: the
other holder is visible, and the reconciler does not clear while one is.
"""

from __future__ import annotations

import time

from controller.claims.staleness import SchedulerStaleness
from dradriver.allocator import claim_key
from dradriver.k8s.objects import Obj, meta
from dradriver.log import get_logger
from dradriver.runtime import Informer, RequeueAfter

log = get_logger("controller")


class SchedulerActivity:
    """Tells whether the scheduler is busy or quiet, from unscheduled pods and removals.

    ``pending_pods`` is an informer of pods without a node (None: no pods are watched,
    the scheduler never counts as busy). Times are monotonic.
    """

    def __init__(
        self,
        pending_pods: Informer | None,
        quiet_period: float = 0.3,
        max_defer: float = 10.0,
        removal_quiet: float = 2.0,
        removal_window: float = 30.0,
        retry_window: float = 12.0,
        staleness: SchedulerStaleness | None = None,
    ) -> None:
        self.pending_pods = pending_pods
        self.staleness = staleness  # after a watch gap: no write until the scheduler caught up
        self.quiet_period = quiet_period
        self.max_defer = max_defer
        self.removal_quiet = removal_quiet
        self.removal_window = removal_window
        self.retry_window = retry_window
        self.last_free = -float("inf")  # when any claim (anyone's) last let go of devices
        self.wave_opened = -float("inf")  # when the current wave of removals opened
        self.deferred: dict[str, float] = {}  # key -> when we first waited for the scheduler
        self.last_pod_activity = -float("inf")  # when a pod with claims last changed
        self.last_removal = -float("inf")  # when a claim last let go of devices
        if pending_pods is not None:
            pending_pods.add_handler(
                on_add=self._pod_changed,
                on_update=lambda old, new: self._pod_changed(new),
                on_delete=self._pod_changed,
            )

    def _pod_changed(self, pod: Obj) -> None:
        if (pod.get("spec") or {}).get("resourceClaims"):
            self.last_pod_activity = time.monotonic()

    def removal_seen(self) -> None:
        """A claim let go of devices just now (cleared, or deleted while allocated)."""
        self.last_removal = time.monotonic()

    def device_freed(self) -> None:
        """Any claim let go of devices just now (cleared or deleted, whoever did it): the
        scheduler retries its unschedulable pods with claims, within its pod backoff."""
        self.last_free = time.monotonic()

    def busy(self) -> list[str]:
        """Pods the scheduler may be allocating for right now (in memory, not yet written).

        Its allocated-device set is a plain set fed by its claim informer: if we wrote a
        device it reserved in memory, the two claims would hold it, and clearing either
        one later makes the scheduler forget the device although the other still holds
        it. So no allocation is written while a pod with claims waits for its first
        scheduling verdict, nor within ``quiet_period`` seconds of such a pod changing
        (the scheduler may see it before we do), nor, while a pod with claims it judged
        unschedulable waits, within ``retry_window`` seconds of any device being freed: the
        freeing re-queues that pod, retried within the scheduler's pod backoff (10 s at
        most), and it may take the freed device in memory; bounded by ``max_defer``.
        """
        if self.pending_pods is None:
            return []
        busy = []
        now = time.monotonic()
        retrying = now - self.last_free < self.retry_window
        if now - self.last_pod_activity < self.quiet_period:
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
                if retrying:
                    busy.append(f"{claim_key(pod)} (unschedulable, retried: a device was freed)")
                continue  # judged unschedulable: retried on claim events
            busy.append(claim_key(pod))
        return busy

    def quiet(self, allocated_at: float | None = None) -> tuple[bool, str]:
        """Whether clearing an allocation now is unlikely to race with a scheduling cycle.

        A removal the scheduler sees after another claim took the same device makes it
        forget that the device is taken. Removals re-queue its unschedulable pods, so: no
        pod waiting for a first verdict, and either ``removal_quiet`` seconds since the
        last removal (which opens a wave) or a wave that is still open (module docstring).
        ``allocated_at``: when the allocation to be cleared was first seen (monotonic);
        a claim allocated less than ``removal_quiet`` ago waits, since the scheduler may
        not count its devices yet. Returns why not, when not.
        """
        busy = self.busy()
        if busy:
            self.wave_opened = -float("inf")  # the scheduler is working: the wave is over
            return False, f"pods being scheduled: {busy[:3]}"
        now = time.monotonic()
        if allocated_at is not None and now - allocated_at < self.removal_quiet:
            return False, f"allocated {now - allocated_at:.1f}s ago"
        if self.wave_open(now):
            return True, ""
        since = now - self.last_removal
        if since < self.removal_quiet:
            return False, f"a device was freed {since:.1f}s ago"
        self.wave_opened = now
        return True, ""

    def wave_open(self, now: float) -> bool:
        """Whether a wave of removals is open: opened within ``removal_window`` seconds,
        and no pod with claims changed since (the scheduler has work of its own then)."""
        return now - self.wave_opened < self.removal_window and (
            self.last_pod_activity < self.wave_opened
        )

    def wait_before_allocating(self, key: str) -> None:
        """Raise :class:`RequeueAfter` while the scheduler is busy, for ``max_defer`` at most.

        Claim ``key`` is then allocated although the scheduler is still busy, so that a
        steady stream of pods cannot starve it. After a watch gap, nothing is allocated until
        the scheduler has caught up (:mod:`controller.claims.staleness`), however long.
        """
        stale = self.catching_up()
        if stale:
            assert self.staleness is not None
            raise RequeueAfter(min(self.staleness.remaining(), 1.0), stale)
        busy = self.busy()
        if busy:
            now = time.monotonic()
            since = self.deferred.setdefault(key, now)
            if now - since < self.max_defer:
                raise RequeueAfter(0.5, f"scheduler busy with {len(busy)} pod(s): {busy[:3]}")
            log.info("allocating although the scheduler is busy", claim=key, pods=busy[:5])
        self.deferred.pop(key, None)

    def catching_up(self) -> str:
        """Why the scheduler may not have seen every allocation yet ("" if it has)."""
        left = self.staleness.remaining() if self.staleness is not None else 0.0
        if left <= 0:
            return ""
        return f"kube-scheduler catching up after a watch gap ({left:.0f}s left at most)"

    def deferred_keys(self) -> list[str]:
        """The claims waiting for the scheduler to settle."""
        return list(self.deferred)

    def forget(self, key: str) -> None:
        """Claim ``key`` is gone."""
        self.deferred.pop(key, None)
