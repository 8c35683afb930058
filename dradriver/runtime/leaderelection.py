"""Leader election on a ``coordination.k8s.io/v1`` Lease (client-go's ``leaderelection``).

Every candidate polls the Lease every ``retry_period`` (with jitter). A
candidate takes the Lease when nobody holds it, when it already holds it, or
when the holder's record has not changed for the record's
``leaseDurationSeconds`` as measured on the candidate's own clock (remote
timestamps are never compared with local ones, so clock skew does not matter).
Every write carries the resourceVersion it read, so two candidates cannot both
win (optimistic concurrency: the loser gets 409 Conflict).

The leader renews every ``retry_period``. If it cannot renew within
``renew_deadline`` of the last successful renewal (measured from when that
request was sent) it stops leading at once: the leading coroutine is cancelled
and ``on_stopped_leading`` runs. Because ``renew_deadline`` < ``lease_duration``,
the old leader has stopped before any standby can consider the lease expired,
so two leaders never act at the same time. On a graceful stop the leader
releases the Lease (empty holder), and a standby takes over on its next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from dradriver.k8s.errors import KubeAPIError, is_conflict, is_not_found
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import path_for
from dradriver.log import get_logger
from dradriver.runtime.metrics import RuntimeMetrics

log = get_logger("leaderelection")
COORDINATION_V1 = "coordination.k8s.io/v1"


class LeaseClient(Protocol):
    """What the elector needs from :class:`dradriver.k8s.client.KubeClient`."""

    async def get(self, path: str, **params: Any) -> Obj: ...

    async def create(self, path: str, body: Obj) -> Obj: ...

    async def replace(self, path: str, body: Obj) -> Obj: ...


def default_identity() -> str:
    """``<hostname>_<random>``: unique per process, readable in ``kubectl get lease``."""
    host = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4().hex[:8]}"


def micro_time(moment: datetime | None = None) -> str:
    """A ``metav1.MicroTime`` string."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaderElectionConfig:
    namespace: str
    name: str
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    # A candidate whose poll failed (apiserver down, 5xx) polls again this soon, not a
    # whole retry_period later, so leading resumes within a second of the apiserver's
    # return; while the apiserver is down such a poll is a refused connection.
    error_retry: float = 0.5
    jitter: float = 0.2
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election needs a non-empty identity")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if self.renew_deadline <= self.retry_period * (1 + self.jitter):
            raise ValueError("renew_deadline must be greater than retry_period * (1 + jitter)")
        if self.retry_period <= 0 or self.error_retry <= 0 or self.jitter < 0:
            raise ValueError(
                "retry_period and error_retry must be positive and jitter non-negative"
            )
        if round(self.lease_duration) < 1:
            raise ValueError("lease_duration must be at least 1 second")

    @property
    def lease_path(self) -> str:
        return path_for(COORDINATION_V1, "leases", self.namespace, self.name)


class LeaderElector:
    """Runs ``on_started_leading()`` while this process holds the Lease.

    ``on_started_leading`` is a coroutine function; it runs in its own task and
    is cancelled the moment leadership is lost. If it returns or raises, the
    elector steps down (releasing the Lease if ``release_on_cancel``) and
    :meth:`run` returns or re-raises. ``on_stopped_leading`` is called after the
    leading task has ended; ``on_new_leader`` whenever the observed holder changes.

    :meth:`run` competes for the Lease until cancelled; after losing the Lease it
    competes again. Cancelling it stops leading and, with ``release_on_cancel``
    (the default), releases the Lease so that a standby takes over immediately.
    """

    def __init__(
        self,
        client: LeaseClient,
        config: LeaderElectionConfig,
        on_started_leading: Callable[[], Coroutine[Any, Any, None]],
        on_stopped_leading: Callable[[], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.identity = config.identity
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._metrics = metrics
        self._lease: Obj | None = None  # the last Lease read or written
        self._observed_spec: Obj | None = None
        self._observed_at = 0.0  # monotonic time the observed spec last changed
        self._last_renew: float | None = None  # monotonic send time of the last good write
        self._leading_task: asyncio.Task[None] | None = None
        self.leader: str | None = None  # the holder last observed
        self.acquisitions = 0
        self._label = f"{config.namespace}/{config.name}"
        if metrics is not None:
            metrics.leader.labels(self._label).set(0)

    # --- state ------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True while leading and the last renewal is younger than ``renew_deadline``.

        Reconcilers can check this right before a write as an extra fence.
        """
        return (
            self._leading_task is not None
            and self._last_renew is not None
            and time.monotonic() < self._last_renew + self.config.renew_deadline
        )

    @property
    def last_renew(self) -> float | None:
        """``time.monotonic()`` when the last successful acquire/renew request was sent."""
        return self._last_renew

    # --- main loop --------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                await self._acquire()
                if await self._lead():
                    return  # the leading coroutine finished: we stepped down
        finally:
            await self._stop_leading("shutting down")
            if self.config.release_on_cancel:
                with contextlib.suppress(Exception):
                    await self.release()

    async def _acquire(self) -> None:
        log.info("waiting for the lease", lease=self._label, identity=self.identity)
        while True:
            started = time.monotonic()
            try:
                if await self._try_acquire_or_renew():
                    self._last_renew = started
                    return
            except Exception as e:
                log.warning("could not get the lease", lease=self._label, error=_describe(e))
                retry = min(self.config.error_retry, self.config.retry_period)
                await asyncio.sleep(self._jittered(retry))
                continue
            await asyncio.sleep(self._jittered(self.config.retry_period))

    async def _lead(self) -> bool:
        """Lead until the lease is lost (False) or the leading coroutine ends (True)."""
        self.acquisitions += 1
        if self._metrics is not None:
            self._metrics.leader.labels(self._label).set(1)
            self._metrics.leader_acquisitions.labels(self._label).inc()
        log.info("became leader", lease=self._label, identity=self.identity)
        task = asyncio.create_task(self._on_started(), name=f"leading {self._label}")
        self._leading_task = task
        while True:
            done, _ = await asyncio.wait([task], timeout=self.config.retry_period)
            if done:
                await self._stop_leading("the leading task ended")
                if self.config.release_on_cancel:
                    await self.release()
                error = None if task.cancelled() else task.exception()
                if error is not None:
                    raise error
                return True
            if not await self._renew():
                await self._stop_leading("lost the lease")
                return False

    async def _renew(self) -> bool:
        """Renew before the renew deadline; False means leadership is lost."""
        assert self._last_renew is not None
        deadline = self._last_renew + self.config.renew_deadline
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.error(
                    "could not renew the lease in time, stepping down",
                    lease=self._label,
                    renew_deadline=self.config.renew_deadline,
                )
                return False
            started = time.monotonic()
            limit = asyncio.timeout(remaining)
            try:
                async with limit:
                    renewed = await self._try_acquire_or_renew()
            except Exception as e:
                if limit.expired():
                    continue  # the loop reports the missed deadline
                log.warning("could not renew the lease", lease=self._label, error=_describe(e))
                renewed = False
            else:
                if renewed:
                    self._last_renew = started
                    return True
                if self.leader not in (None, self.identity):
                    log.error(
                        "another process took the lease", lease=self._label, holder=self.leader
                    )
                    return False
            await asyncio.sleep(
                min(self._jittered(self.config.retry_period), max(0.0, deadline - time.monotonic()))
            )

    async def _stop_leading(self, why: str) -> None:
        task, self._leading_task = self._leading_task, None
        if task is None:
            return
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        if self._metrics is not None:
            self._metrics.leader.labels(self._label).set(0)
        log.info("stopped leading", lease=self._label, identity=self.identity, reason=why)
        if self._on_stopped is not None:
            try:
                self._on_stopped()
            except Exception:
                log.exception("on_stopped_leading failed", lease=self._label)

    # --- the Lease --------------------------------------------------------------

    def _observe(self, lease: Obj) -> None:
        self._lease = lease
        spec = dict(lease.get("spec") or {})
        if spec != self._observed_spec:
            self._observed_spec = spec
            self._observed_at = time.monotonic()
        holder = spec.get("holderIdentity") or None
        if holder != self.leader:
            self.leader = holder
            if holder is not None:
                log.info("new leader observed", lease=self._label, leader=holder)
                if self._on_new_leader is not None:
                    try:
                        self._on_new_leader(holder)
                    except Exception:
                        log.exception("on_new_leader failed", lease=self._label)

    def _spec_for_me(self, current: Obj) -> Obj:
        now = micro_time()
        mine = current.get("holderIdentity") == self.identity
        transitions = int(current.get("leaseTransitions") or 0)
        return {
            **current,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.config.lease_duration),
            "acquireTime": current.get("acquireTime") if mine else now,
            "renewTime": now,
            "leaseTransitions": transitions
            if mine or not current.get("holderIdentity")
            else (transitions + 1),
        }

    async def _try_acquire_or_renew(self) -> bool:
        path = self.config.lease_path
        # Fast path: renew what we wrote last time; a conflict means someone else wrote.
        if self._lease is not None and self._leading_task is not None:
            spec = self._lease.get("spec") or {}
            if spec.get("holderIdentity") == self.identity:
                body = {**self._lease, "spec": self._spec_for_me(spec)}
                try:
                    self._observe(await self.client.replace(path, body))
                    return True
                except KubeAPIError as e:
                    if not (is_not_found(e) or is_conflict(e)):
                        raise
        try:
            lease = await self.client.get(path)
        except KubeAPIError as e:
            if not is_not_found(e):
                raise
            return await self._create()
        self._observe(lease)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        if holder and holder != self.identity:
            duration = float(spec.get("leaseDurationSeconds") or self.config.lease_duration)
            if time.monotonic() < self._observed_at + duration:
                return False  # held by someone else and not expired
            log.info("lease expired, taking it", lease=self._label, previous=holder)
        body = {**lease, "spec": self._spec_for_me(spec)}
        try:
            self._observe(await self.client.replace(path, body))
        except KubeAPIError as e:
            if is_conflict(e):
                return False  # someone else wrote first
            raise
        return True

    async def _create(self) -> bool:
        body: Obj = {
            "apiVersion": COORDINATION_V1,
            "kind": "Lease",
            "metadata": {"name": self.config.name, "namespace": self.config.namespace},
            "spec": self._spec_for_me({}),
        }
        try:
            created = await self.client.create(
                path_for(COORDINATION_V1, "leases", self.config.namespace), body
            )
        except KubeAPIError as e:
            if is_conflict(e):
                return False  # another candidate created it first
            raise
        self._observe(created)
        return True

    async def release(self) -> bool:
        """Give the Lease up if we hold it (empty holder), so a standby takes it at once."""
        lease = self._lease
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return False
        spec = dict(lease.get("spec") or {})
        spec.pop("holderIdentity", None)
        now = micro_time()
        spec.update(leaseDurationSeconds=1, acquireTime=now, renewTime=now)
        try:
            self._observe(
                await self.client.replace(self.config.lease_path, {**lease, "spec": spec})
            )
        except Exception as e:
            log.warning("could not release the lease", lease=self._label, error=_describe(e))
            return False
        self._last_renew = None
        log.info("released the lease", lease=self._label, identity=self.identity)
        return True

    def _jittered(self, period: float) -> float:
        return period * (1 + self.config.jitter * random.random())


def _describe(e: BaseException) -> str:
    return str(e) or type(e).__name__
