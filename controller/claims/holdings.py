"""Which claims hold which devices, as this controller knows it, and the writes of
``status.allocation`` that change it.

The claims informer shows an allocation some milliseconds after it is written; until
then the devices must still count as taken, or two workers would give the same device to
two claims. So the holdings are the informer's allocations plus those this controller
wrote that the informer has not shown yet.

Unreadable means held: a claim the informer shows only cut (nested too deep to decode,
:mod:`controller.claims.unreadable`) counts as holding every allocation result it can
still read, under the key :func:`unreadable_key`, next to whatever its last readable
version (the informer's cached one) holds. Where its allocation cannot be read, the pools
it might use are blocked: every device of them is held in what the searches see
(:meth:`Holdings.snapshot`), and :meth:`Holdings.reserve` refuses a device of them, until
the claim is read or deleted. Each such claim is logged and counted in
``dradriver_controller_unreadable_claims``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from controller.claims.unreadable import UnreadableClaim, pool_devices, read_cut_claim
from controller.resourceclaims import claim_path
from dradriver.allocator import AllocatedState, Held
from dradriver.k8s.client import KubeClient
from dradriver.k8s.errors import KubeAPIError, is_not_found
from dradriver.k8s.objects import Obj, allocation_of, meta, revision
from dradriver.log import get_logger
from dradriver.metrics import Gauge, Registry
from dradriver.runtime import Informer, RequeueAfter

log = get_logger("controller")

UNREADABLE_METRIC = "dradriver_controller_unreadable_claims"


def unreadable_key(key: str) -> str:
    """The holdings key of what claim ``key``, too deep to decode, still says it holds."""
    return f"{key} (too deep to decode)"


def blocked_key(key: str) -> str:
    """The snapshot key of the pools claim ``key``, too deep to decode, blocks."""
    return f"{key} (too deep to decode: pools blocked)"


class Holdings:
    """``state`` counts every allocated claim's devices; ``inflight`` our unseen writes.

    ``inflight`` maps a key to the allocation written and the claim's resourceVersion
    after the write (None while the write is on its way); the informer's event handler
    drops the entry once it shows the allocation, or a version at least that new.
    """

    def __init__(
        self, client: KubeClient, claims: Informer, driver: str, registry: Registry | None = None
    ) -> None:
        self.client = client
        self.claims = claims
        self.driver = driver
        self.state = AllocatedState()
        self.inflight: dict[str, tuple[Obj, int | None]] = {}
        # key -> when the informer first showed the claim's current allocation
        # (monotonic): how long the scheduler has had to count its devices.
        self.seen_at: dict[str, float] = {}
        # Claims too deep to decode: what they say they hold (see the module docstring).
        self.unreadable: dict[str, UnreadableClaim] = {}
        self._blocked_held: dict[str, tuple[Held, ...]] = {}  # stable for the worker's diff
        self.on_freed: Callable[[], None] = lambda: None  # devices held may be free now
        self.gauge = Gauge(
            UNREADABLE_METRIC,
            "Claims too deep to decode, by whether their allocation could be read (their "
            "devices count as held) or not (the pools they might use are blocked)",
            ["allocation"],
            registry=registry if registry is not None else Registry(),
        )
        claims.add_unreadable_handler(self._unreadable, self._readable_again)

    # --- unreadable means held ----------------------------------------------------------

    def _unreadable(self, key: str, cut: Obj) -> None:
        """The informer shows claim ``key`` only cut: hold what it can still say."""
        before = self.unreadable.get(key)
        claim = read_cut_claim(cut, self.driver)
        self.unreadable[key] = claim
        if claim.allocation is not None:
            self.state.add(unreadable_key(key), claim.allocation)
        else:
            self.state.remove(unreadable_key(key))
        self._count()
        if claim == before:
            return
        held = ["/".join(h.device) for h in self.state.held_by(unreadable_key(key)) or ()]
        if claim.blocks:
            log.warning(
                "claim too deep to decode and its allocation cannot be read: allocation from "
                "the pools it might use is blocked until it is read or deleted",
                claim=key,
                where=claim.why,
                held=held,
                blocked_pools=claim.describe_blocked(),
            )
        else:
            log.warning(
                "claim too deep to decode: the devices of its allocation count as held "
                "until it is read or deleted",
                claim=key,
                where=claim.why,
                held=held,
            )
        if before is not None:
            self.on_freed()  # it may hold less than before

    def _readable_again(self, key: str, cut: Obj) -> None:
        """Claim ``key`` was deleted or can be read again: its cut holds go."""
        claim = self.unreadable.pop(key, None)
        self._blocked_held.pop(key, None)
        self.state.remove(unreadable_key(key))
        self._count()
        if claim is not None:
            log.info("claim too deep to decode is deleted or readable again", claim=key)
            self.on_freed()

    def _count(self) -> None:
        blocked = sum(1 for c in self.unreadable.values() if c.blocks)
        self.gauge.labels("unreadable").set(blocked)
        self.gauge.labels("readable").set(len(self.unreadable) - blocked)

    def blocked_by(self, allocation: Obj) -> str | None:
        """The claim too deep to decode that blocks a device of ``allocation``, if any."""
        for result in (allocation.get("devices") or {}).get("results") or []:
            device = (str(result.get("driver")), str(result.get("pool")), str(result["device"]))
            for key, claim in self.unreadable.items():
                if claim.blocks_device(device):
                    return key
        return None

    def snapshot(self, slices: Iterable[Obj] = ()) -> dict[str, tuple[Held, ...]]:
        """What each claim holds (:meth:`AllocatedState.snapshot`), plus every device of
        ``slices`` in a pool a claim too deep to decode blocks: what searches see."""
        out = self.state.snapshot()
        blocking = {k: c for k, c in self.unreadable.items() if c.blocks}
        if not blocking:
            return out
        listed = list(slices)
        for key, claim in blocking.items():
            held = pool_devices(listed, claim)
            if self._blocked_held.get(key) != held:
                self._blocked_held[key] = held
            out[blocked_key(key)] = self._blocked_held[key]
        return out

    def allocation_seen(self, key: str) -> None:
        """The informer shows claim ``key`` allocated (the first time is recorded)."""
        self.seen_at.setdefault(key, time.monotonic())

    def allocation_gone(self, key: str) -> None:
        """The informer shows claim ``key`` without an allocation, or gone."""
        self.seen_at.pop(key, None)

    def seen_since(self, key: str) -> float:
        """When claim ``key``'s allocation was first seen; now if it has not been yet."""
        return self.seen_at.get(key, time.monotonic())

    def allocation(self, key: str) -> Obj | None:
        """Claim ``key``'s allocation: the informer's, else the one we wrote meanwhile."""
        claim = self.claims.get(key)
        allocation = allocation_of(claim) if claim is not None else None
        if allocation is None and key in self.inflight:
            allocation = self.inflight[key][0]
        return allocation

    def reserve(self, key: str, allocation: Obj) -> None:
        """Count ``allocation``'s devices as taken by ``key`` before it is written.

        Raises :class:`RequeueAfter` (nothing taken) if a device is in a pool a claim too
        deep to decode blocks (it turned up during the search)."""
        blocker = self.blocked_by(allocation)
        if blocker is not None:
            raise RequeueAfter(
                1.0,
                f"claim {blocker} is too deep to decode and may hold devices of this pool; "
                "waiting until it is read or deleted",
            )
        self.state.add(key, allocation)
        self.inflight[key] = (allocation, None)

    def unreserve(self, key: str) -> None:
        """Give back what :meth:`reserve` took, unless the informer shows ``key`` allocated."""
        self.inflight.pop(key, None)
        if allocation_of(self.claims.get(key) or {}) is None:
            self.state.remove(key)

    async def write(self, key: str, claim: Obj, allocation: Obj) -> Obj:
        """Write ``allocation`` into the claim (at its resourceVersion); returns the claim.

        The devices are taken (:meth:`reserve`, if the caller did not already) before the
        first await, so no other worker takes them; a failed write gives them back unless
        the informer meanwhile shows the claim allocated.
        """
        try:
            self.reserve(key, allocation)
            written = await self.client.merge_patch(
                claim_path(key) + "/status",
                {
                    "metadata": {"resourceVersion": meta(claim)["resourceVersion"]},
                    "status": {"allocation": allocation},
                },
            )
        except BaseException:
            self.unreserve(key)
            raise
        if key in self.inflight:
            self.inflight[key] = (allocation, revision(written))
        return written

    async def clear(self, key: str, claim: Obj) -> Obj | None:
        """Clear status.allocation (at the claim's resourceVersion) and forget our hold.

        Returns the updated claim, or None if the claim is gone.
        """
        try:
            updated = await self.client.merge_patch(
                claim_path(key) + "/status",
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
        self.allocation_gone(key)
        return updated
