"""Backoff and rate limiters (client-go's ``workqueue`` rate limiters and ``wait.Backoff``)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable
from typing import Protocol


class Backoff:
    """Exponential backoff with jitter for retry loops (list/watch errors, lease retries).

    ``next()`` returns the next delay: ``base * factor**n`` capped at ``cap``, then
    stretched by up to ``jitter`` (0.1 = +10%) so that many clients do not retry in
    lock step. ``reset()`` after a success.
    """

    def __init__(
        self,
        base: float = 0.8,
        cap: float = 30.0,
        factor: float = 2.0,
        jitter: float = 0.1,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if base <= 0 or cap < base or factor < 1 or jitter < 0:
            raise ValueError("backoff needs 0 < base <= cap, factor >= 1 and jitter >= 0")
        self.base, self.cap, self.factor, self.jitter = base, cap, factor, jitter
        self._rng = rng
        self.failures = 0

    def next(self) -> float:
        delay = min(self.cap, self.base * self.factor**self.failures)
        self.failures += 1
        return delay * (1 + self.jitter * self._rng())

    def reset(self) -> None:
        self.failures = 0


class RateLimiter(Protocol):
    """How long to wait before a key may be processed again (client-go ``RateLimiter``)."""

    def when(self, key: Hashable) -> float: ...

    def forget(self, key: Hashable) -> None: ...

    def num_requeues(self, key: Hashable) -> int: ...


class ItemExponentialRateLimiter:
    """Per-key exponential backoff: ``base * 2**failures``, capped at ``cap`` seconds."""

    def __init__(self, base: float = 0.005, cap: float = 300.0) -> None:
        if base <= 0 or cap < base:
            raise ValueError("rate limiter needs 0 < base <= cap")
        self.base, self.cap = base, cap
        self._failures: dict[Hashable, int] = {}

    def when(self, key: Hashable) -> float:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        # Avoid float overflow for keys that fail for a very long time.
        if failures >= 64:
            return self.cap
        return float(min(self.cap, self.base * 2**failures))

    def forget(self, key: Hashable) -> None:
        self._failures.pop(key, None)

    def num_requeues(self, key: Hashable) -> int:
        return self._failures.get(key, 0)


class BucketRateLimiter:
    """An overall token bucket (``qps`` refill, ``burst`` size) shared by all keys."""

    def __init__(
        self, qps: float = 10.0, burst: int = 100, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("bucket rate limiter needs qps > 0 and burst >= 1")
        self.qps, self.burst = qps, burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def when(self, key: Hashable) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1  # reserve a token, possibly in the future
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def forget(self, key: Hashable) -> None:
        pass

    def num_requeues(self, key: Hashable) -> int:
        return 0


class MaxOfRateLimiter:
    """The longest delay of several limiters (client-go's default controller limiter)."""

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("MaxOfRateLimiter needs at least one limiter")
        self.limiters = limiters

    def when(self, key: Hashable) -> float:
        return max(limiter.when(key) for limiter in self.limiters)

    def forget(self, key: Hashable) -> None:
        for limiter in self.limiters:
            limiter.forget(key)

    def num_requeues(self, key: Hashable) -> int:
        return max(limiter.num_requeues(key) for limiter in self.limiters)


def default_controller_rate_limiter() -> RateLimiter:
    """Per-key 5 ms .. 300 s exponential backoff, and 10 qps / 100 burst overall."""
    return MaxOfRateLimiter(ItemExponentialRateLimiter(0.005, 300.0), BucketRateLimiter(10, 100))
