"""WorkQueue, rate limiters and the Controller helper (asyncio, no cluster)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from dradriver.runtime import (
    Backoff,
    BucketRateLimiter,
    Controller,
    ItemExponentialRateLimiter,
    MaxOfRateLimiter,
    RequeueAfter,
    RuntimeMetrics,
    ShutDown,
    WorkQueue,
)
from dradriver.runtime.informer import Informer
from tests.metricsample import sample_value

DEADLINE = 5.0


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))


async def eventually(what: str, cond: Callable[[], bool], deadline: float = DEADLINE) -> None:
    """Wait for ``cond`` with a deadline, yielding to the loop between checks."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out after {deadline}s waiting for {what}")
        await asyncio.sleep(0.005)


def no_backoff() -> ItemExponentialRateLimiter:
    return ItemExponentialRateLimiter(0.001, 0.01)


# --- rate limiters ----------------------------------------------------------------


def test_item_exponential_backoff_grows_per_key_and_forget_resets() -> None:
    rl = ItemExponentialRateLimiter(base=0.01, cap=0.05)
    assert [rl.when("a") for _ in range(5)] == [0.01, 0.02, 0.04, 0.05, 0.05]
    assert rl.when("b") == 0.01  # independent per key
    assert rl.num_requeues("a") == 5
    rl.forget("a")
    assert rl.num_requeues("a") == 0
    assert rl.when("a") == 0.01
    for _ in range(200):  # no overflow after very many failures
        assert rl.when("c") <= 0.05


def test_bucket_limiter_allows_burst_then_spaces_at_qps() -> None:
    now = [100.0]
    rl = BucketRateLimiter(qps=10, burst=3, clock=lambda: now[0])
    assert [rl.when(i) for i in range(3)] == [0.0, 0.0, 0.0]
    assert rl.when(3) == pytest.approx(0.1)
    assert rl.when(4) == pytest.approx(0.2)
    now[0] += 1.0  # refills, capped at the burst
    assert rl.when(5) == 0.0


def test_max_of_limiters_takes_longest_delay() -> None:
    rl = MaxOfRateLimiter(ItemExponentialRateLimiter(1.0, 100.0), ItemExponentialRateLimiter(2, 3))
    assert rl.when("k") == 2
    assert rl.when("k") == 3
    assert rl.when("k") == 4
    assert rl.num_requeues("k") == 3
    rl.forget("k")
    assert rl.num_requeues("k") == 0


def test_backoff_caps_and_resets() -> None:
    b = Backoff(base=1, cap=5, jitter=0.5, rng=lambda: 1.0)
    assert [b.next() for _ in range(5)] == [1.5, 3.0, 6.0, 7.5, 7.5]
    b.reset()
    assert b.next() == 1.5
    with pytest.raises(ValueError):
        Backoff(base=2, cap=1)


# --- queue ------------------------------------------------------------------------


def test_duplicate_adds_are_processed_once() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue("t", no_backoff())
        for key in ["a", "a", "b", "a", "b", "c"]:
            q.add(key)
        assert len(q) == 3
        got = [await q.get() for _ in range(3)]
        assert got == ["a", "b", "c"]
        assert len(q) == 0
        for key in got:
            q.done(key)
        assert len(q) == 0

    run(scenario())


def test_key_added_while_processing_waits_for_done_then_runs_once() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue("t", no_backoff())
        q.add("a")
        assert await q.get() == "a"
        q.add("a")
        q.add("a")
        # Not handed to a second worker while the first holds it.
        assert len(q) == 0
        second = asyncio.create_task(q.get())
        await asyncio.sleep(0)
        assert not second.done()
        q.done("a")
        assert await asyncio.wait_for(second, DEADLINE) == "a"
        q.done("a")
        assert len(q) == 0 and not q.processing

    run(scenario())


def test_no_key_is_processed_by_two_workers_at_once() -> None:
    """Many workers, keys re-added at random while they are processed."""

    async def scenario() -> None:
        q: WorkQueue[int] = WorkQueue("t", no_backoff())
        active: set[int] = set()
        overlaps: list[int] = []
        last_add: dict[int, int] = {}
        last_start: dict[int, int] = {}
        clock = 0
        rng = random.Random(7)

        async def worker() -> None:
            nonlocal clock
            while True:
                try:
                    key = await q.get()
                except ShutDown:
                    return
                if key in active:
                    overlaps.append(key)
                active.add(key)
                clock += 1
                last_start[key] = clock
                await asyncio.sleep(rng.random() / 1000)
                active.discard(key)
                q.done(key)

        workers = [asyncio.create_task(worker()) for _ in range(8)]
        for _ in range(2000):
            key = rng.randrange(10)
            clock += 1
            last_add[key] = clock
            q.add(key)
            if rng.random() < 0.3:
                await asyncio.sleep(0)
        await q.shutdown(drain=True)
        await asyncio.gather(*workers)
        assert overlaps == []
        # Level-triggered: each key's last add was followed by a processing that began later.
        for key, added in last_add.items():
            assert last_start[key] > added, key

    run(scenario())


def test_rate_limited_add_backs_off_per_key_and_forget_resets() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue("t", ItemExponentialRateLimiter(0.05, 10))
        loop = asyncio.get_running_loop()
        delays = []
        for _ in range(3):
            start = loop.time()
            q.add_rate_limited("k")
            assert len(q) == 0 and q.delayed == 1
            key = await asyncio.wait_for(q.get(), DEADLINE)
            delays.append(loop.time() - start)
            q.done(key)
        assert q.num_requeues("k") == 3
        # 0.05, 0.1, 0.2 s (timers never fire early).
        assert delays[0] >= 0.05 and delays[1] >= 0.1 and delays[2] >= 0.2
        q.forget("k")
        assert q.num_requeues("k") == 0

    run(scenario())


def test_add_after_keeps_the_earliest_time() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue("t", no_backoff())
        loop = asyncio.get_running_loop()
        start = loop.time()
        q.add_after("k", 60)
        q.add_after("k", 0.01)
        q.add_after("k", 30)
        assert q.delayed == 1
        assert await asyncio.wait_for(q.get(), DEADLINE) == "k"
        assert loop.time() - start < 5
        assert q.delayed == 0

    run(scenario())


def test_shutdown_wakes_workers_and_refuses_new_keys() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue("t", no_backoff())
        waiting = [asyncio.create_task(q.get()) for _ in range(3)]
        await asyncio.sleep(0)
        q.add_after("later", 60)
        q.shut_down()
        for task in waiting:
            with pytest.raises(ShutDown):
                await asyncio.wait_for(task, DEADLINE)
        q.add("x")
        q.add_rate_limited("y")
        assert len(q) == 0 and q.delayed == 0
        with pytest.raises(ShutDown):
            await q.get()

    run(scenario())


def test_shutdown_without_drain_drops_queued_keys_and_waits_for_in_flight() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue("t", no_backoff())
        for key in "abc":
            q.add(key)
        held = await q.get()
        q.add(held)  # dirty while processing: must not come back after shutdown
        stopper = asyncio.create_task(q.shutdown())
        await asyncio.sleep(0.01)
        assert not stopper.done()  # waits for the in-flight key
        q.done(held)
        await asyncio.wait_for(stopper, DEADLINE)
        with pytest.raises(ShutDown):
            await q.get()

    run(scenario())


def test_shutdown_with_drain_hands_out_remaining_keys_first() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue("t", no_backoff())
        for key in "abc":
            q.add(key)
        q.shut_down(drain=True)
        got = []
        while True:
            try:
                key = await q.get()
            except ShutDown:
                break
            got.append(key)
            q.done(key)
        assert got == ["a", "b", "c"]

    run(scenario())


def test_cancelled_getter_does_not_swallow_a_wakeup() -> None:
    async def scenario() -> None:
        q: WorkQueue[str] = WorkQueue("t", no_backoff())
        first = asyncio.create_task(q.get())
        second = asyncio.create_task(q.get())
        await asyncio.sleep(0)
        q.add("a")  # wakes `first` ...
        first.cancel()  # ... which is cancelled before it runs
        assert await asyncio.wait_for(second, DEADLINE) == "a"

    run(scenario())


def test_queue_metrics() -> None:
    async def scenario() -> None:
        metrics = RuntimeMetrics()
        q: WorkQueue[str] = WorkQueue("m", no_backoff(), metrics)
        q.add("a")
        q.add("b")
        q.add("a")
        q.add_rate_limited("c")
        r = metrics.registry
        assert sample_value(r, "dradriver_workqueue_depth", {"name": "m"}) == 2
        assert sample_value(r, "dradriver_workqueue_adds_total", {"name": "m"}) == 2
        assert sample_value(r, "dradriver_workqueue_retries_total", {"name": "m"}) == 1
        q.shut_down()

    run(scenario())


# --- controller -------------------------------------------------------------------


class FakeInformer(Informer):
    """An informer whose cache is set by the test (no API)."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        super().__init__(client=None, path="/fake", name="fake")  # type: ignore[arg-type]
        self._cache = {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in objects}
        self._synced.set()

    def emit_add(self, obj: dict[str, Any]) -> None:
        self._cache[f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"] = obj
        self._dispatch_add(obj)


def obj(name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": "1"}}


def test_controller_enqueues_cache_on_start_retries_failures_and_forgets() -> None:
    async def scenario() -> None:
        informer = FakeInformer([obj("a"), obj("b")])
        calls: list[str] = []
        failures = {"ns/b": 2}

        async def reconcile(key: str) -> None:
            calls.append(key)
            if failures.get(key, 0) > 0:
                failures[key] -= 1
                raise RuntimeError("not yet")

        metrics = RuntimeMetrics()
        ctrl = Controller(
            "c", reconcile, workers=2, rate_limiter=lambda: no_backoff(), metrics=metrics
        )
        ctrl.watches(informer)
        task = asyncio.create_task(ctrl.run())
        await eventually("b to succeed", lambda: calls.count("ns/b") == 3)
        assert calls.count("ns/a") == 1
        queue = ctrl.queue
        assert queue is not None and queue.num_requeues("ns/b") == 0  # forgotten
        informer.emit_add(obj("c"))
        await eventually("c reconciled", lambda: "ns/c" in calls)
        await ctrl.shutdown(grace_period=DEADLINE)
        await asyncio.wait_for(task, DEADLINE)
        assert not ctrl.running
        r = metrics.registry
        assert (
            sample_value(r, "dradriver_reconcile_total", {"controller": "c", "result": "error"})
            == 2
        )

    run(scenario())


def test_controller_requeue_after_and_custom_mapper() -> None:
    async def scenario() -> None:
        informer = FakeInformer([obj("x")])
        calls: list[str] = []

        async def reconcile(key: str) -> None:
            calls.append(key)
            if len(calls) == 1:
                raise RequeueAfter(0.01, "waiting for something")

        ctrl = Controller("c", reconcile, workers=1, rate_limiter=lambda: no_backoff())
        ctrl.watches(informer, lambda o: [f"owner-of-{o['metadata']['name']}"])
        task = asyncio.create_task(ctrl.run())
        await eventually("second reconcile", lambda: len(calls) == 2)
        assert calls == ["owner-of-x", "owner-of-x"]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())


def test_controller_cancel_stops_in_flight_reconcile_and_can_run_again() -> None:
    async def scenario() -> None:
        informer = FakeInformer([obj("a")])
        started = asyncio.Event()
        cancelled = asyncio.Event()
        runs = 0

        async def reconcile(key: str) -> None:
            nonlocal runs
            runs += 1
            started.set()
            if runs == 1:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cancelled.set()
                    raise

        ctrl = Controller("c", reconcile, workers=1, rate_limiter=lambda: no_backoff())
        ctrl.watches(informer)
        task = asyncio.create_task(ctrl.run())
        await asyncio.wait_for(started.wait(), DEADLINE)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cancelled.is_set() and not ctrl.running
        informer.emit_add(obj("ignored-while-stopped"))
        second = asyncio.create_task(ctrl.run())  # e.g. leadership regained
        await eventually("reconciled again", lambda: runs >= 3)
        await ctrl.shutdown(grace_period=DEADLINE)
        await asyncio.wait_for(second, DEADLINE)

    run(scenario())


def test_controller_graceful_shutdown_waits_for_in_flight_then_cancels_after_grace() -> None:
    async def scenario() -> None:
        informer = FakeInformer([obj("slow")])
        release = asyncio.Event()
        started = asyncio.Event()
        finished: list[str] = []

        async def reconcile(key: str) -> None:
            started.set()
            await release.wait()
            finished.append(key)

        ctrl = Controller("c", reconcile, workers=1, rate_limiter=lambda: no_backoff())
        ctrl.watches(informer)
        task = asyncio.create_task(ctrl.run())
        await asyncio.wait_for(started.wait(), DEADLINE)
        stopper = asyncio.create_task(ctrl.shutdown(grace_period=DEADLINE))
        await asyncio.sleep(0.01)
        assert not stopper.done()
        release.set()
        await asyncio.wait_for(stopper, DEADLINE)
        await asyncio.wait_for(task, DEADLINE)
        assert finished == ["ns/slow"]

        # A reconcile that never ends is cancelled after the grace period.
        release.clear()
        started.clear()
        task = asyncio.create_task(ctrl.run())
        await asyncio.wait_for(started.wait(), DEADLINE)
        await asyncio.wait_for(ctrl.shutdown(grace_period=0.05), DEADLINE)
        assert task.done()

    run(scenario())
