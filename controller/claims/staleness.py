"""Whether kube-scheduler may not have seen every claim allocation yet: the catch-up period.

Invariant: for ``catchup`` seconds after the last watch gap this replica saw, and until real
evidence that kube-scheduler's claim cache is current, :meth:`SchedulerStaleness.remaining`
is positive, and :class:`~controller.claims.scheduler.SchedulerActivity` then lets no new
allocation be written. Removals go on: one the stale scheduler has not seen leaves it counting
the device as taken, which collides with nothing.

Why. kube-scheduler counts a device as taken from a set fed by its claim informer. After an
apiserver outage, its informers come back on client-go's reflector backoff (0.8 s doubling to
a 30 s cap, each wait jittered up to 2x: under 60 s each; the pod and claim reflectors back
off independently, and a claim list may succeed while the watch behind it is refused and
backs off again), while this controller's come back within a second. In that window the
scheduler allocates from a claim cache that lacks what the controller wrote meanwhile: one
device in two allocations. So whatever the controller cannot vouch for -- a gap in its own
list/watch (an error, a relist) or a failed Lease request -- counts as "the scheduler may be
stale", and the controller writes nothing that could collide until:

* ``catchup`` seconds after the *last* such failure (``--scheduler-catchup``, default 75 s:
  the reflector's longest single wait, 30 s x (1 + jitter 1.0) = 60 s, counted from the
  controller's last failed attempt, which is within its 1 s retry of the apiserver serving
  again, plus 15 s for the relist, the watch and a loaded machine); or
* evidence, earlier: kube-scheduler wrote a claim (finalizer or allocation) whose version
  just before that write, in this replica's unbroken watch, was the claim's creation, and the
  claim was created more than ``EVIDENCE_MARGIN`` after the last failure. The scheduler writes
  with the resourceVersion it read in PreFilter from its assume cache, refreshing only after a
  conflict, and a creation version has no predecessor to conflict with, so it read the
  creation from its own claim cache. That cache is fed by one watch in resourceVersion order
  and updates the allocated-device set synchronously in the same handler, so every claim
  event before the creation was counted; and since the creation came after the last failure,
  the list or watch that brought it ran while the apiserver served (a watch refused then
  would have failed this replica's too). Writes after that reach the scheduler by that watch.

Not covered (stated in docs/immediate-allocation.md): a scheduler that loses its watch
while this replica does not (another apiserver instance, a network path of its own); a
write that landed just
before an outage and was not yet delivered to the scheduler's watch when it broke; a
replica started after an outage that leads before ``catchup`` has passed (it saw no gap).

A failure is detected without touching the informer: :class:`ObservedClient` wraps the client
the informers and the Lease use and reports what fails, and the claim watch's events.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any, Protocol

from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.log import get_logger

log = get_logger("controller")

DEFAULT_CATCHUP = 75.0
"""Seconds after the last gap (see the module docstring for the figure)."""

EVIDENCE_MARGIN = 2.0
"""A claim counts as evidence only if created this long after the last failure (seconds):
``creationTimestamp`` has a resolution of one second, and the apiserver's clock is not ours."""

SCHEDULER_MANAGER = "kube-scheduler"
"""The field manager of kube-scheduler's writes (client-go's default: the binary's name)."""

MAX_TRACKED = 50_000
"""Claims seen created and not yet written again, at most (the oldest are forgotten)."""


def _written_by(obj: Obj, manager: str) -> bool:
    fields = (obj.get("metadata") or {}).get("managedFields") or []
    return any(isinstance(f, dict) and f.get("manager") == manager for f in fields)


def _created_at(obj: Obj) -> float | None:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class SchedulerStaleness:
    """The catch-up period after a gap, and the evidence that ends it early.

    ``clock`` (monotonic) and ``wall`` (epoch seconds) are injectable for tests. A ``catchup``
    of 0 turns the period off.
    """

    def __init__(
        self,
        catchup: float = DEFAULT_CATCHUP,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.catchup = catchup
        self._clock = clock
        self._wall = wall
        self.last_gap: float | None = None  # monotonic time of the last failure
        self.last_gap_wall = 0.0
        self._ended_for: float | None = None  # the last_gap that evidence ended
        self._created: dict[str, float] = {}  # claim uid -> creationTimestamp (epoch)
        self.gaps = 0
        self.evidence = 0

    # --- what the wrapped client reports ---------------------------------------

    def gap(self, source: str, error: BaseException) -> None:
        """A list, watch or Lease request failed: the scheduler may be stale from now on."""
        started = self.remaining() == 0
        self.last_gap, self.last_gap_wall = self._clock(), self._wall()
        self.gaps += 1
        if started and self.catchup > 0:
            log.warning(
                "watch gap: kube-scheduler may not see every allocation; "
                "allocating again once it has caught up",
                source=source,
                error=str(error) or type(error).__name__,
                catchup_seconds=self.catchup,
            )

    def claims_listed(self) -> None:
        """The claim watch starts over from a list: what it showed before is no sequence."""
        self._created.clear()

    def claim_event(self, kind: object, obj: object) -> None:
        """One event of the claim watch, in order (see the module docstring: evidence)."""
        if not isinstance(obj, dict):
            return
        uid = (obj.get("metadata") or {}).get("uid")
        if not isinstance(uid, str):
            return
        if kind == "ADDED":
            created = _created_at(obj)
            if created is not None and not _written_by(obj, SCHEDULER_MANAGER):
                if len(self._created) >= MAX_TRACKED:
                    self._created.pop(next(iter(self._created)))
                self._created[uid] = created
        elif kind == "MODIFIED":
            created = self._created.pop(uid, None)
            if created is not None and _written_by(obj, SCHEDULER_MANAGER):
                self._evidence(created, obj)
        elif kind == "DELETED":
            self._created.pop(uid, None)

    def _evidence(self, created: float, obj: Obj) -> None:
        if self.remaining() == 0 or created <= self.last_gap_wall + EVIDENCE_MARGIN:
            return
        self._ended_for = self.last_gap
        self.evidence += 1
        meta = obj.get("metadata") or {}
        log.info(
            "kube-scheduler has caught up: allocating again",
            claim=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
            seconds_after_gap=round(self._clock() - (self.last_gap or 0.0), 1),
        )

    # --- what the claim pipeline asks ------------------------------------------

    def remaining(self) -> float:
        """Seconds the catch-up period still lasts (0: the scheduler counts as current)."""
        if self.last_gap is None or self.catchup <= 0 or self._ended_for == self.last_gap:
            return 0.0
        return max(0.0, self.last_gap + self.catchup - self._clock())


class _Client(Protocol):
    async def list(self, path: str, **params: Any) -> Obj: ...

    def watch(self, path: str, resource_version: str, **params: Any) -> AsyncIterator[Obj]: ...

    async def get(self, path: str, **params: Any) -> Obj: ...

    async def create(self, path: str, body: Obj) -> Obj: ...

    async def replace(self, path: str, body: Obj) -> Obj: ...


def _apiserver_trouble(e: BaseException, gone_counts: bool = False) -> bool:
    """A failure that says the apiserver was not there, or (``gone_counts``) that a watch must
    start over from a list: a 410. Not a 403, 404 or 409 (a missing CRD, RBAC, a conflict)."""
    if not isinstance(e, KubeAPIError):
        return True
    return e.status >= 500 or e.status == 429 or (gone_counts and e.status == 410)


SCHEDULER_WATCHES = ("/api/", "/apis/resource.k8s.io/")
"""Path prefixes of the lists and watches whose failures count: the core API and
resource.k8s.io, which kube-scheduler watches too. The driver's own CRDs do not count: the
scheduler does not watch them, and a CRD's watch cache answers 429 "storage is
(re)initializing" for a while after the chart installs it, which made a fresh install wait
out a whole catch-up period (bench.scale saw it at 1,000 and 5,000 nodes)."""


def _scheduler_watches(path: str) -> bool:
    return path.startswith(SCHEDULER_WATCHES)


class ObservedClient:
    """The informers' and the Lease's client, reporting failures to ``staleness``.

    A failure counts when the apiserver was not there (a transport error, a 5xx, a 429) or,
    for a list or watch, when the watch must start over (a 410, an ``ERROR`` event); a 403,
    404 or 409 does not, nor does a cancellation, nor a list or watch of a resource the
    scheduler does not watch (:data:`SCHEDULER_WATCHES`). Events of the watch on
    ``claims_path`` go to :meth:`SchedulerStaleness.claim_event`.
    """

    def __init__(self, client: _Client, staleness: SchedulerStaleness, claims_path: str) -> None:
        self._client = client
        self._staleness = staleness
        self._claims_path = claims_path

    async def list(self, path: str, **params: Any) -> Obj:
        if path == self._claims_path and not params.get("continue"):
            self._staleness.claims_listed()
        try:
            return await self._client.list(path, **params)
        except Exception as e:
            if _apiserver_trouble(e, gone_counts=True) and _scheduler_watches(path):
                self._staleness.gap(f"list {path}", e)
            raise

    async def watch(self, path: str, resource_version: str, **params: Any) -> AsyncIterator[Obj]:
        events = self._client.watch(path, resource_version, **params)
        claims = path == self._claims_path
        counts = _scheduler_watches(path)
        try:
            async for event in events:
                kind = event.get("type") if isinstance(event, dict) else None
                if kind is None:
                    pass  # not an event the informer can use: it skips it
                elif kind == "ERROR":
                    if counts:
                        error = RuntimeError(str(event.get("object")))
                        self._staleness.gap(f"watch {path}", error)
                elif claims:
                    self._staleness.claim_event(kind, event.get("object"))
                yield event
        except Exception as e:
            if _apiserver_trouble(e, gone_counts=True) and counts:
                self._staleness.gap(f"watch {path}", e)
            raise
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await aclose()

    async def get(self, path: str, **params: Any) -> Obj:
        return await self._lease_call(f"get {path}", self._client.get(path, **params))

    async def create(self, path: str, body: Obj) -> Obj:
        return await self._lease_call(f"create {path}", self._client.create(path, body))

    async def replace(self, path: str, body: Obj) -> Obj:
        return await self._lease_call(f"replace {path}", self._client.replace(path, body))

    async def _lease_call(self, what: str, call: Any) -> Obj:
        try:
            result: Obj = await call
        except Exception as e:
            if _apiserver_trouble(e):
                self._staleness.gap(what, e)
            raise
        return result
