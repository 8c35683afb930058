"""Informers feed keys into a work queue; workers call a level-based ``reconcile(key)``.

``reconcile`` looks at the current state (usually through informer caches) and
makes the world match it; it is called with a key, never with an event, so it
must work the same whether it runs once or ten times. Raise to retry the key
with per-key exponential backoff; raise :class:`RequeueAfter` to look again
later without counting it as a failure.

A :class:`Controller` can be run, stopped and run again (each :meth:`Controller.run`
gets a fresh queue and starts by enqueuing every cached object), which is what
leader election needs: run while leading, cancel at once when the lease is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dradriver.k8s.objects import Obj
from dradriver.log import get_logger
from dradriver.runtime.informer import Informer, object_key
from dradriver.runtime.metrics import RuntimeMetrics
from dradriver.runtime.ratelimit import RateLimiter, default_controller_rate_limiter
from dradriver.runtime.workqueue import ShutDown, WorkQueue

log = get_logger("controller")

Reconcile = Callable[[str], Awaitable[None]]
KeyMapper = Callable[[Obj], Iterable[str]]


class RequeueAfter(Exception):
    """Raised by ``reconcile`` to look at the key again after ``delay`` seconds."""

    def __init__(self, delay: float, reason: str = "") -> None:
        super().__init__(reason or f"requeue after {delay}s")
        self.delay = delay


def own_key(obj: Obj) -> Iterable[str]:
    """The default mapper: the object's own ``namespace/name`` key."""
    return (object_key(obj),)


@dataclass(frozen=True)
class _Source:
    informer: Informer
    mapper: KeyMapper


class Controller:
    def __init__(
        self,
        name: str,
        reconcile: Reconcile,
        *,
        workers: int = 2,
        rate_limiter: Callable[[], RateLimiter] = default_controller_rate_limiter,
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("a controller needs at least one worker")
        self.name = name
        self.workers = workers
        self._reconcile = reconcile
        self._rate_limiter = rate_limiter
        self._metrics = metrics
        self._sources: list[_Source] = []
        self._queue: WorkQueue[str] | None = None
        self._run_task: asyncio.Task[Any] | None = None
        self._workers_started = False

    def watches(self, informer: Informer, mapper: KeyMapper = own_key) -> Controller:
        """Enqueue the keys ``mapper`` returns for every add, update and delete of ``informer``."""
        source = _Source(informer, mapper)
        self._sources.append(source)

        def on_change(obj: Obj) -> None:
            self._enqueue_from(source, obj)

        def on_update(old: Obj, new: Obj) -> None:
            self._enqueue_from(source, old)
            self._enqueue_from(source, new)

        informer.add_handler(on_add=on_change, on_update=on_update, on_delete=on_change)
        return self

    def _enqueue_from(self, source: _Source, obj: Obj) -> None:
        if self._queue is None:
            return  # not running: run() enqueues everything when it starts
        for key in source.mapper(obj):
            self._queue.add(key)

    def enqueue(self, key: str) -> None:
        """Queue a key by hand (ignored while the controller is not running)."""
        if self._queue is not None:
            self._queue.add(key)

    def enqueue_after(self, key: str, delay: float) -> None:
        if self._queue is not None:
            self._queue.add_after(key, delay)

    @property
    def running(self) -> bool:
        return self._queue is not None

    @property
    def queue(self) -> WorkQueue[str] | None:
        return self._queue

    @property
    def synced(self) -> bool:
        return all(s.informer.has_synced for s in self._sources)

    async def run(self) -> None:
        """Wait for the informers' caches, then reconcile until cancelled or shut down.

        Cancelling stops at once (in-flight reconciles are cancelled too: that is
        what losing the lease requires). :meth:`shutdown` stops gracefully.
        """
        if self._queue is not None:
            raise RuntimeError(f"controller {self.name} is already running")
        queue: WorkQueue[str] = WorkQueue(self.name, self._rate_limiter(), self._metrics)
        self._queue = queue
        self._run_task = asyncio.current_task()
        tasks: list[asyncio.Task[None]] = []
        try:
            for source in self._sources:
                await source.informer.wait_for_sync()
            for source in self._sources:
                for obj in source.informer.items():
                    for key in source.mapper(obj):
                        queue.add(key)
            self._workers_started = True
            log.info("controller started", controller=self.name, workers=self.workers)
            tasks = [
                asyncio.create_task(self._worker(queue), name=f"{self.name} worker {i}")
                for i in range(self.workers)
            ]
            await asyncio.gather(*tasks)
        finally:
            queue.shut_down()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self._queue = None
            self._run_task = None
            self._workers_started = False
            log.info("controller stopped", controller=self.name)

    async def shutdown(self, grace_period: float | None = None) -> None:
        """Stop taking keys and let in-flight reconciles finish, then :meth:`run` returns.

        Reconciles still running after ``grace_period`` seconds are cancelled.
        """
        queue, task = self._queue, self._run_task
        if queue is None:
            return
        queue.shut_down()
        if not self._workers_started and task is not None:
            task.cancel()  # still waiting for the caches: nothing in flight
        try:
            async with asyncio.timeout(grace_period):
                await queue.wait_idle()
        except TimeoutError:
            log.warning(
                "reconciles still running after the grace period, cancelling",
                controller=self.name,
                keys=sorted(queue.processing),
            )
            if task is not None:
                task.cancel()
        if task is not None and task is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)

    async def _worker(self, queue: WorkQueue[str]) -> None:
        while True:
            try:
                key = await queue.get()
            except ShutDown:
                return
            try:
                await self._process(queue, key)
            finally:
                queue.done(key)

    async def _process(self, queue: WorkQueue[str], key: str) -> None:
        started = time.monotonic()
        result = "success"
        try:
            await self._reconcile(key)
        except RequeueAfter as e:
            result = "requeue"
            queue.forget(key)
            queue.add_after(key, e.delay)
            log.debug("requeue", controller=self.name, key=key, after=e.delay, reason=str(e))
        except asyncio.CancelledError:
            result = "cancelled"
            raise
        except Exception as e:
            result = "error"
            retries = queue.num_requeues(key)
            queue.add_rate_limited(key)
            log.warning(
                "reconcile failed, will retry",
                controller=self.name,
                key=key,
                retries=retries + 1,
                error=str(e) or type(e).__name__,
            )
        else:
            queue.forget(key)
        finally:
            if self._metrics is not None:
                self._metrics.reconciles.labels(self.name, result).inc()
                self._metrics.reconcile_seconds.labels(self.name).observe(
                    time.monotonic() - started
                )
