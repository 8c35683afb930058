"""A rate-limited, deduplicating work queue for asyncio (client-go's ``workqueue``).

The contract, as in client-go:

* a key added several times before a worker takes it is processed once (dedup);
* a key is handed to at most one worker at a time: adding a key that is being
  processed marks it dirty, and it is queued again when the worker calls
  :meth:`WorkQueue.done`;
* :meth:`WorkQueue.add_rate_limited` re-adds a key after a per-key exponential
  backoff, :meth:`WorkQueue.forget` resets that backoff after a success;
* :meth:`WorkQueue.shut_down` stops accepting keys and wakes the workers, whose
  :meth:`WorkQueue.get` then raises :class:`ShutDown` (after the remaining keys
  when draining).

The queue lives in one event loop; its methods are not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from dradriver.runtime.metrics import RuntimeMetrics
from dradriver.runtime.ratelimit import RateLimiter, default_controller_rate_limiter

K = TypeVar("K", bound=Hashable)


class ShutDown(Exception):
    """Raised by :meth:`WorkQueue.get` once the queue is shut down (and drained)."""


class WorkQueue(Generic[K]):
    def __init__(
        self,
        name: str = "queue",
        rate_limiter: RateLimiter | None = None,
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        self.name = name
        self._limiter = rate_limiter or default_controller_rate_limiter()
        self._metrics = metrics
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._delayed: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._getters: deque[asyncio.Future[None]] = deque()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._shutting_down = False
        self._draining = False

    # --- adding -----------------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue ``key`` unless it is already waiting; ignored after shutdown."""
        if self._shutting_down:
            return
        if key in self._dirty:
            return
        self._dirty.add(key)
        if self._metrics is not None:
            self._metrics.queue_adds.labels(self.name).inc()
        if key in self._processing:
            return  # queued again by done()
        self._queue.append(key)
        self._changed()
        self._wake_one()

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds; an earlier pending time for it wins."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        ready = loop.time() + delay
        pending = self._delayed.get(key)
        if pending is not None:
            if pending[0] <= ready:
                return
            pending[1].cancel()
        handle = loop.call_at(ready, self._fire, key)
        self._delayed[key] = (ready, handle)

    def add_rate_limited(self, key: K) -> None:
        """Queue ``key`` again after its backoff (which grows with every call until forget)."""
        if self._shutting_down:
            return
        if self._metrics is not None:
            self._metrics.queue_retries.labels(self.name).inc()
        self.add_after(key, self._limiter.when(key))

    def forget(self, key: K) -> None:
        """Reset the backoff of ``key`` (call after it was processed successfully)."""
        self._limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        return self._limiter.num_requeues(key)

    def _fire(self, key: K) -> None:
        self._delayed.pop(key, None)
        self.add(key)

    # --- processing -------------------------------------------------------------

    async def get(self) -> K:
        """The next key, waiting for one; the caller must call :meth:`done` with it.

        Raises :class:`ShutDown` once the queue is shut down (when draining, only
        after the queued keys have been handed out).
        """
        while not self._queue or (self._shutting_down and not self._draining):
            if self._shutting_down:
                raise ShutDown(self.name)
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._getters:
                    self._getters.remove(waiter)
                elif self._queue:
                    self._wake_one()  # we were woken for a key; pass it on
                raise
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        self._changed()
        return key

    def done(self, key: K) -> None:
        """Mark ``key`` as processed; it is queued again if it was added meanwhile."""
        self._processing.discard(key)
        if key in self._dirty and not (self._shutting_down and not self._draining):
            self._queue.append(key)
            self._changed()
            self._wake_one()
        self._check_idle()

    # --- introspection ----------------------------------------------------------

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def processing(self) -> frozenset[K]:
        return frozenset(self._processing)

    @property
    def delayed(self) -> int:
        return len(self._delayed)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    # --- shutdown ---------------------------------------------------------------

    def shut_down(self, drain: bool = False) -> None:
        """Stop accepting keys and wake every waiting worker.

        Without ``drain`` the queued keys are dropped; with it the workers still
        get them. Delayed (rate-limited) keys are always dropped. Keys being
        processed finish normally; :meth:`wait_idle` waits for them.
        """
        self._shutting_down = True
        self._draining = drain
        for _, handle in self._delayed.values():
            handle.cancel()
        self._delayed.clear()
        if not drain:
            self._queue.clear()
            self._dirty.clear()
            self._changed()
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        self._check_idle()

    async def wait_idle(self) -> None:
        """Wait until nothing is queued or being processed (bound it with ``asyncio.timeout``)."""
        if self._idle():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._idle_waiters:
                self._idle_waiters.remove(waiter)

    async def shutdown(self, drain: bool = False) -> None:
        """:meth:`shut_down`, then :meth:`wait_idle`."""
        self.shut_down(drain)
        await self.wait_idle()

    # --- internals --------------------------------------------------------------

    def _idle(self) -> bool:
        return not self._processing and not self._queue

    def _check_idle(self) -> None:
        if self._idle():
            for waiter in self._idle_waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _wake_one(self) -> None:
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _changed(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth.labels(self.name).set(len(self._queue))
