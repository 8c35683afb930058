"""Per-claim work for the kubelet's batches: validate, lock, fetch, then the driver.

:class:`ClaimRunner` is a :class:`~dradriver.plugin.interface.DRADriver` built
from a :class:`~dradriver.plugin.interface.ClaimDriver`, so a driver author writes
prepare, unprepare and error handling for one claim only (as with Go's
kubelet-plugin helper).

Invariants: the claims of a batch run concurrently, each under its claim lock
(:mod:`dradriver.plugin.claimlock`: one prepare or unprepare of a claim at a time,
across processes too); a claim reaches the driver's prepare only as the API server
has it under the UID the kubelet named (:mod:`dradriver.plugin.claimfetch`); one
bad claim fails alone, with a message for the kubelet, never the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dradriver.k8s.client import KubeClient
from dradriver.log import StructLogger, get_logger
from dradriver.metrics import Counter, Gauge, Histogram
from dradriver.plugin.claimfetch import fetch_claim
from dradriver.plugin.claimlock import ClaimLocks
from dradriver.plugin.interface import ClaimDriver, ClaimRef, PrepareResult, claim_ref_problem


@dataclass(frozen=True)
class ClaimMetrics:
    """The per-claim metrics the runner keeps (the application names and registers them)."""

    prepares: Counter
    prepare_errors: Counter
    prepare_seconds: Histogram
    in_flight: Gauge
    unprepares: Counter
    unprepare_errors: Counter
    unprepare_seconds: Histogram


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


class ClaimRunner:
    def __init__(
        self,
        client: KubeClient,
        driver: ClaimDriver,
        locks: ClaimLocks,
        *,
        metrics: ClaimMetrics | None = None,
        logger: StructLogger | None = None,
    ) -> None:
        self.client = client
        self.driver = driver
        self.locks = locks
        self.metrics = metrics
        self.log = logger or get_logger("plugin.helper")

    async def prepare_claims(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        results = await asyncio.gather(*(self._prepare(c) for c in claims))
        return {c.uid: r for c, r in zip(claims, results, strict=True)}

    async def unprepare_claims(self, claims: list[ClaimRef]) -> dict[str, str]:
        errors = await asyncio.gather(*(self._unprepare(c) for c in claims))
        return {c.uid: e for c, e in zip(claims, errors, strict=True)}

    def handle_error(self, error: BaseException, context: str) -> None:
        self.driver.handle_error(error, context)

    def _count(self, pick: Callable[[ClaimMetrics], Counter]) -> None:
        if self.metrics is not None:
            pick(self.metrics).inc()

    async def _prepare(self, claim: ClaimRef) -> PrepareResult:
        problem = claim_ref_problem(claim)
        if problem:
            self._count(lambda m: m.prepare_errors)
            return PrepareResult(error=f"ResourceClaim {claim}: {problem}")
        m = self.metrics
        with m.in_flight.track_inprogress() if m else _nothing():
            async with self.locks.hold(claim.uid):
                with m.prepare_seconds.time() if m else _nothing():
                    result = await self._prepare_locked(claim)
        if result.error:
            self._count(lambda m: m.prepare_errors)
        else:
            self._count(lambda m: m.prepares)
        return result

    async def _prepare_locked(self, claim: ClaimRef) -> PrepareResult:
        try:
            found = await fetch_claim(self.client, claim)
            if found.obj is None:
                result = PrepareResult(error=found.problem)
            else:
                result = await self.driver.prepare(claim, found.obj)
        except Exception as e:
            self.log.exception("prepare failed unexpectedly", claim=str(claim))
            return PrepareResult(error=f"internal error: {e}")
        if result.error:
            self.log.warning("prepare failed", claim=str(claim), uid=claim.uid, error=result.error)
        return result

    async def _unprepare(self, claim: ClaimRef) -> str:
        problem = claim_ref_problem(claim)
        if problem:
            self._count(lambda m: m.unprepare_errors)
            return f"ResourceClaim {claim}: {problem}"
        m = self.metrics
        async with self.locks.hold(claim.uid):
            with m.unprepare_seconds.time() if m else _nothing():
                error = await self.driver.unprepare(claim)
        if error:
            self._count(lambda m: m.unprepare_errors)
            self.log.warning("unprepare failed", claim=str(claim), error=error)
        else:
            self._count(lambda m: m.unprepares)
        return error
