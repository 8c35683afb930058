"""Selectors that call Python run in a recycled child process: the callback leak is bounded."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from dradriver import cel
from dradriver.cel import env as cel_env
from dradriver.cel import worker

DRIVER = "worker.example.com"
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'

# 50 iterations, each calling find() (a Python callback): 50 callbacks per evaluation.
FIFTY_CALLBACKS = f'lists.range(50).all(i, {A}.model.find("[0-9]+") == "100")'


def device(i: int) -> dict[str, object]:
    return {
        "name": f"d{i}",
        "attributes": {"model": {"string": "a100"}, "index": {"int": i}},
        "capacity": {"memory": {"value": f"{i}Gi"}},
    }


@pytest.fixture
def child() -> Iterator[worker.Worker]:
    w = worker.Worker(recycle_after=50_000)
    yield w
    w.close()


@pytest.mark.timeout(300)
def test_200k_callbacks_recycle_the_child(child: worker.Worker) -> None:
    for i in range(4_000):
        assert child.evaluate(FIFTY_CALLBACKS, DRIVER, device(i)) == (True, None, False)
    stats = child.stats
    assert stats.callbacks_total >= 200_000
    assert stats.recycles == 4  # after 50k, 100k, 150k and 200k callbacks
    assert stats.starts == 4
    assert stats.callbacks == 0  # the last child was replaced too
    assert stats.failures == stats.timeouts == 0


def test_selectors_with_callbacks_go_to_the_worker_and_are_memoised() -> None:
    cel.configure(use_worker=True)
    cel.clear_caches()
    selector = cel.compile_selector(f'{A}.model.find("[0-9]+") == "100" && {A}.index >= 0')
    assert selector.uses_callbacks
    before = cel.stats()
    inputs = [cel.DeviceInput(DRIVER, device(i)) for i in range(20)]
    assert all(selector.evaluate(d) == cel.MATCH for d in inputs)
    assert all(selector.evaluate(d) == cel.MATCH for d in inputs)  # memoised
    after = cel.stats()
    assert after.worker_enabled
    assert after.worker_evaluations == before.worker_evaluations + 20
    assert after.callback_calls == before.callback_calls  # none in this process
    assert after.result_cache_hits >= before.result_cache_hits + 20
    # Selectors without callbacks stay in this process.
    plain = cel.compile_selector(f"{A}.index >= 0")
    assert not plain.uses_callbacks
    assert plain.evaluate(inputs[0]) == cel.MATCH
    assert cel.stats().worker_evaluations == after.worker_evaluations


def test_worker_errors_are_reasons(child: worker.Worker) -> None:
    matched, error, transient = child.evaluate(f"{A}.nosuch.find('x') == ''", DRIVER, device(0))
    assert not matched and not transient
    assert error is not None and error.startswith("no such key: nosuch")
    matched, error, _ = child.evaluate("nope(", DRIVER, device(0))
    assert not matched and error is not None and "CEL compile error" in error


def test_a_child_that_hangs_is_stopped_and_replaced() -> None:
    hang = "import time; print('{\"ready\": true}', flush=True); time.sleep(600)"
    w = worker.Worker(timeout=0.5, command=[sys.executable, "-c", hang])
    try:
        matched, error, transient = w.evaluate("true", DRIVER, device(0))
        assert not matched and transient
        assert error == "CEL evaluation did not finish within 0.5 s (evaluation stopped)"
        assert w.stats.timeouts == 1
        w.evaluate("true", DRIVER, device(0))
        assert w.stats.starts == 2  # a fresh child for the next evaluation
    finally:
        w.close()


def test_a_child_that_dies_is_a_reason_not_an_exception() -> None:
    die = "print('{\"ready\": true}', flush=True); import sys; sys.stdin.readline()"
    w = worker.Worker(command=[sys.executable, "-c", die])
    try:
        matched, error, transient = w.evaluate("true", DRIVER, device(0))
        assert not matched and transient and error is not None
        assert "the evaluating process failed: it exited" in error, error
        assert w.stats.failures == 1
    finally:
        w.close()


def test_a_failed_child_is_not_memoised() -> None:
    hang = "import time; print('{\"ready\": true}', flush=True); time.sleep(600)"
    cel.clear_caches()
    cel.configure(use_worker=True, timeout=0.5)
    shared = cel_env._worker()
    assert shared is not None
    selector = cel.compile_selector(f'{A}.model.find("[0-9]+") == "100"')
    command = shared.command
    shared.close()
    shared.command = [sys.executable, "-c", hang]
    try:
        result = selector.evaluate(cel.DeviceInput(DRIVER, device(0)))
        assert not result.matched and result.error is not None and "did not finish" in result.error
    finally:
        shared.close()
        shared.command = command
        cel.configure(timeout=worker.EVAL_TIMEOUT)
    assert selector.evaluate(cel.DeviceInput(DRIVER, device(0))) == cel.MATCH
