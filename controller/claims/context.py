"""What every part of the claim pipeline shares, built once and passed once.

Invariants: one :class:`ClaimContext` per :class:`~controller.claims.reconciler.ClaimReconciler`,
shared by all its parts (the conflict hold, the fence lifecycle, the search batches); it is
frozen, so no part swaps a collaborator for the others; ``enqueue`` is the claims
controller's own, which exists before the parts (a key enqueued while the controller is
not running is dropped, as the controller's ``enqueue`` does).

:class:`ClaimSources` and :class:`ClaimSettings` are what the reconciler alone reads: the
informers it allocates from and its few settings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from controller.claims.holdings import Holdings
from controller.claims.scheduler import SchedulerActivity
from controller.claims.scope import Drivers
from controller.claims.stages import StageTimes
from controller.claims.stats import AllocationStats
from controller.leadership import require_leader
from controller.resourceclaims import claim_path
from dradriver.k8s.client import KubeClient
from dradriver.k8s.events import EventRecorder
from dradriver.k8s.objects import Obj
from dradriver.metrics import Registry
from dradriver.runtime import Informer, split_key


def _nowhere(key: str) -> None:
    """The default ``enqueue``: no queue (tests that drive the reconciler by hand)."""


@dataclass(frozen=True)
class ClaimContext:
    """The client, the holdings, the scheduler's activity, the counters and events, the
    lease check and the work queue of the claim pipeline.

    ``namespaces`` (``--allocation-namespace``; empty: all) are the claims this
    controller allocates and whose fences it manages; ``allocation_drivers``
    (``--allocation-driver``) are drivers besides ``driver`` whose classes make a claim
    ours (:mod:`controller.claims.scope`).
    """

    client: KubeClient
    driver: str
    holdings: Holdings
    scheduler: SchedulerActivity
    stages: StageTimes
    events: EventRecorder
    is_leader: Callable[[], bool]
    enqueue: Callable[[str], None]
    namespaces: frozenset[str] = frozenset()
    stats: AllocationStats = field(default_factory=AllocationStats)
    allocation_drivers: tuple[str, ...] = ()

    @classmethod
    def create(
        cls,
        client: KubeClient,
        driver: str,
        claims: Informer,
        *,
        scheduler: SchedulerActivity | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        enqueue: Callable[[str], None] = _nowhere,
        namespaces: Iterable[str] = (),
        registry: Registry | None = None,
        allocation_drivers: Iterable[str] = (),
    ) -> ClaimContext:
        """A context over the claims informer ``claims``; ``scheduler`` defaults to one
        watching no pods (never busy), ``registry`` to a private one."""
        return cls(
            client=client,
            driver=driver,
            holdings=Holdings(client, claims, driver, registry),
            scheduler=scheduler if scheduler is not None else SchedulerActivity(None),
            stages=StageTimes(registry),
            events=EventRecorder(client),
            is_leader=is_leader,
            enqueue=enqueue,
            namespaces=frozenset(namespaces),
            allocation_drivers=tuple(allocation_drivers),
        )

    @property
    def claims(self) -> Informer:
        """The claims informer."""
        return self.holdings.claims

    @property
    def drivers(self) -> Drivers:
        """The drivers whose claims are ours (:mod:`controller.claims.scope`)."""
        return Drivers(self.driver, self.allocation_drivers)

    def require_leader(self, key: str) -> None:
        """Raise :class:`~controller.leadership.NotLeader` unless we lead (before a write to
        claim ``key``)."""
        require_leader(self.is_leader, f"claim {key}")

    def in_scope(self, key: str) -> bool:
        """Whether claim ``key`` is in ``namespaces`` (all are when none is given)."""
        return not self.namespaces or split_key(key)[0] in self.namespaces

    async def patch_claim(self, key: str, body: Obj) -> Obj:
        """Merge-patch the claim ``key`` (its metadata; ``/status`` writes are the holdings')."""
        return await self.client.merge_patch(claim_path(key), body)


@dataclass(frozen=True)
class ClaimSources:
    """The informers the reconciler reads besides the claims: the parameters it resolves,
    the slices, classes and nodes it allocates from."""

    parameters: Informer
    slices: Informer
    classes: Informer
    nodes: Informer


@dataclass(frozen=True)
class ClaimSettings:
    """The reconciler's own settings.

    ``fence_namespace``: where fence claims live; ``allocation_timeout``: wall-clock
    seconds one claim's search may take (``--allocation-timeout``); ``retry_base`` and
    ``retry_cap``: the backoff, in seconds, of a claim that cannot be allocated.
    """

    fence_namespace: str = "dradriver"
    allocation_timeout: float = 10.0
    retry_base: float = 1.0
    retry_cap: float = 60.0
