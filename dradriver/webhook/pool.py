"""Where reviews are validated: off the event loop, in two bounded lanes.

Invariants:

* The event loop never validates; it reads, decodes and answers. Validation runs in a
  lane chosen by the body's size:

  - *small* (bodies up to ``small_body_bytes``: every ordinary claim, template or
    parameters object): a few threads of this process. Such a review compiles little CEL
    and is answered in milliseconds.
  - *large*: a pool of child processes, spawned (never forked: the controller serving
    this app has threads). Compiling CEL holds the GIL for tens of milliseconds at a
    time, so a large review in a thread would slow the event loop and the small lane;
    in a child it costs this process only the pickling of the request.

* Each lane admits at most ``workers + queue`` reviews at a time; one more is refused at
  once (:class:`Refused`, saying why), never queued without bound.
* A review not validated within ``timeout`` seconds (under the apiserver's 10 s) is
  :class:`Refused`; its slot is freed only when its work ends, so the bound on
  work in progress holds whatever the clients do.
* A child that dies breaks the process pool: the reviews it held fail with the error, and
  the next large review gets a new pool.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from dradriver.k8s.objects import Obj
from dradriver.webhook.validation import Settings, Verdict, validate

__all__ = ["Lane", "PoolLimits", "Refused", "ValidationPool"]


@dataclass(frozen=True)
class PoolLimits:
    small_body_bytes: int = 16 * 1024
    small_workers: int = 2
    small_queue: int = 64
    large_workers: int = 2
    large_queue: int = 4
    timeout: float = 8.0


@dataclass(frozen=True)
class Refused:
    """The review was not validated: its lane is full, or it took too long."""

    message: str


class Lane:
    """Runs ``validate`` in executors made by ``make_executor``, at most ``capacity`` at
    once, each answered within ``deadline`` seconds; a broken executor is replaced on the
    next call."""

    def __init__(
        self, name: str, capacity: int, deadline: float, make_executor: Callable[[], Executor]
    ) -> None:
        self.name = name
        self.capacity = capacity
        self.deadline = deadline
        self._make_executor = make_executor
        self._executor: Executor | None = None
        self._lock = threading.Lock()  # in_flight is released from executor threads
        self.in_flight = 0

    def _release(self, _: object) -> None:
        with self._lock:
            self.in_flight -= 1

    async def run(self, settings: Settings, request: Obj) -> Verdict | Refused:
        with self._lock:
            if self.in_flight >= self.capacity:
                return Refused(
                    f"the webhook is already validating {self.capacity} {self.name} objects; "
                    "retry shortly"
                )
            self.in_flight += 1
            if self._executor is None:
                self._executor = self._make_executor()
            executor = self._executor
        try:
            future = executor.submit(validate, settings, request)
        except BaseException:
            self._release(None)
            raise
        future.add_done_callback(self._release)
        try:
            async with asyncio.timeout(self.deadline):
                return await asyncio.shield(asyncio.wrap_future(future))
        except TimeoutError:
            return Refused(
                f"validating this {self.name} object took longer than {self.deadline:g} s"
            )
        except BrokenProcessPool:
            with self._lock:
                if self._executor is executor:
                    self._executor = None
            executor.shutdown(wait=False, cancel_futures=True)
            raise

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


class ValidationPool:
    """The two lanes (see the module docstring); :meth:`close` stops their workers."""

    def __init__(self, settings: Settings, limits: PoolLimits | None = None) -> None:
        self.settings = settings
        self.limits = limits = limits or PoolLimits()
        for field in ("small_workers", "large_workers"):
            if getattr(limits, field) < 1:
                raise ValueError(f"PoolLimits.{field} must be at least 1")
        self.small = Lane(
            "small",
            limits.small_workers + limits.small_queue,
            limits.timeout,
            lambda: ThreadPoolExecutor(limits.small_workers, "webhook-validate"),
        )
        self.large = Lane(
            "large",
            limits.large_workers + limits.large_queue,
            limits.timeout,
            lambda: ProcessPoolExecutor(
                limits.large_workers, mp_context=multiprocessing.get_context("spawn")
            ),
        )

    def lane(self, body_size: int) -> Lane:
        return self.small if body_size <= self.limits.small_body_bytes else self.large

    async def validate(self, request: Obj, body_size: int) -> Verdict | Refused:
        """The verdict on ``request`` (whose body had ``body_size`` bytes), or why it was
        not validated; raises what validation raised."""
        return await self.lane(body_size).run(self.settings, request)

    def close(self) -> None:
        self.small.close()
        self.large.close()
