"""The cel-expr-python callback leak: measured, and bounded by the adapter's memo cache.

cel-expr-python 0.1.3 leaks each Python callback's argument tuple and result. These tests
pin down what the adapter relies on (re-run them when changing the pin in pyproject.toml):

* the leak per callback stays below the estimate the adapter reports (``stats()``);
* selectors without callbacks do not grow memory, also when one device is evaluated over
  and over (the adapter evaluates with ``data=``, so nothing is kept per device);
* re-evaluating callback selectors on unchanged devices is served from the memo cache,
  so memory does not grow with the number of allocation attempts.
"""

from __future__ import annotations

import gc
import resource

from dradriver import cel
from dradriver.cel import env as cel_env

DRIVER = "leak.example.com"
N = 20_000


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def device(i: int) -> cel.DeviceInput:
    return cel.DeviceInput(
        DRIVER,
        {
            "name": f"d{i}",
            "attributes": {"model": {"string": "a"}, "index": {"int": i}},
            "capacity": {"memory": {"value": f"{i + 1}Gi"}},
        },
    )


def growth_per_eval(selector: cel.Selector) -> float:
    """RSS growth per evaluation of one device."""
    program = selector._program  # the raw program: bypass the memo cache on purpose
    target = device(0)
    for _ in range(1000):  # warm up allocator arenas
        program.eval(data=target.variables)
    gc.collect()
    before = rss_bytes()
    for _ in range(N):
        program.eval(data=target.variables)
    gc.collect()
    return (rss_bytes() - before) / N


SELECTOR_WITHOUT_CALLBACKS = (
    f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].model == "a" && '
    f'device.capacity["{DRIVER}"].memory == quantity("1Gi")'
)


def test_selectors_without_callbacks_do_not_leak() -> None:
    selector = cel.compile_selector(SELECTOR_WITHOUT_CALLBACKS)
    assert not selector.uses_callbacks
    assert growth_per_eval(selector) < 16


def test_callback_leak_is_within_the_reported_estimate() -> None:
    selector = cel.compile_selector(f'device.capacity["{DRIVER}"].memory.isInteger()')
    assert selector.uses_callbacks
    per_eval = growth_per_eval(selector)
    # One callback per evaluation, with a Quantity message.
    assert per_eval <= 2 * cel_env.LEAK_BYTES_PER_CALLBACK, per_eval


def test_memo_cache_bounds_repeated_evaluation() -> None:
    selector = cel.compile_selector(
        f'device.capacity["{DRIVER}"].memory.sub(quantity("2Gi")).isInteger()'
    )
    devices = [device(i) for i in range(200)]
    for d in devices:
        selector.evaluate(d)
    gc.collect()
    calls = cel.stats().callback_calls
    before = rss_bytes()
    for _ in range(100):  # 20,000 evaluations of already-seen devices
        for d in devices:
            selector.evaluate(d)
    gc.collect()
    assert cel.stats().callback_calls == calls
    assert rss_bytes() - before < 2 * 2**20
