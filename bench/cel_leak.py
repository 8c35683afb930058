"""RSS growth from cel-expr-python's per-callback leak, with and without recycling.

``python -m bench.cel_leak [--evaluations N] [--recycle-after N]``

Evaluates a selector that makes one Python callback per evaluation (``find()``) over
distinct devices (so the memo cache does not help) in three ways and prints RSS before and
after, as a table:

* ``in-process``: the raw program in this process (what dradriver did before the worker);
* ``in-process, env recycled``: the same, but every ``--recycle-after`` callbacks the compile
  cache is cleared and a new cel-expr-python environment and program are built, to see
  whether dropping them frees the leak (it does not: the leaked objects hold a reference);
* ``worker, recycled``: through :class:`dradriver.cel.worker.Worker` (the default path for
  selectors with callbacks), which replaces its child after ``--recycle-after`` callbacks;
  the parent's RSS and the largest RSS a child reached are shown.

Not run by the tests (it takes a minute); ``tests/unit/dradriver/cel/test_worker.py`` checks that
the recycling fires.
"""

from __future__ import annotations

import argparse
import gc
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dradriver import cel
from dradriver.cel import env as cel_env
from dradriver.cel import worker

SMOKE_ARGS = ("--evaluations", "300", "--recycle-after", "100")
CLUSTER = "none"  # needs no cluster

DRIVER = "leak.bench.dradriver.dev"
SELECTOR = f'device.attributes["{DRIVER}"].model.find("[0-9]+") == "100"'
MIB = 2**20


def rss(pid: int | None = None) -> int:
    """Resident set size in bytes of this process (or ``pid``)."""
    path = f"/proc/{pid}/statm" if pid else "/proc/self/statm"
    with open(path) as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def device(i: int) -> dict[str, Any]:
    return {
        "name": f"d{i}",
        "attributes": {"model": {"string": "a100"}, "index": {"int": i}},
        "capacity": {"memory": {"value": f"{i}Gi"}},
    }


@dataclass
class Row:
    mode: str
    evaluations: int
    callbacks: int
    before: int
    after: int
    child_max: int | None = None
    recycles: int = 0


def _measure(mode: str, n: int, run: Callable[[int], None]) -> Row:
    gc.collect()
    calls = cel.stats().callback_calls
    before = rss()
    for i in range(n):
        run(i)
    gc.collect()
    return Row(mode, n, cel.stats().callback_calls - calls, before, rss())


def in_process(n: int) -> Row:
    cel.configure(use_worker=False)
    selector = cel.compile_selector(SELECTOR)
    inputs = [cel.DeviceInput(DRIVER, device(i)) for i in range(1000)]

    def run(i: int) -> None:
        assert selector.evaluate_here(inputs[i % len(inputs)]).matched

    return _measure("in-process", n, run)


def in_process_recycled(n: int, recycle_after: int) -> Row:
    cel.configure(use_worker=False)
    inputs = [cel.DeviceInput(DRIVER, device(i)) for i in range(1000)]
    state: dict[str, Any] = {"selector": cel.compile_selector(SELECTOR), "recycles": 0}

    def run(i: int) -> None:
        if i and i % recycle_after == 0:
            cel.clear_caches()
            cel_env._ENV = None  # a new environment, extension and program
            state["selector"] = cel.compile_selector(SELECTOR)
            state["recycles"] += 1
        assert state["selector"].evaluate_here(inputs[i % len(inputs)]).matched

    row = _measure("in-process, env recycled", n, run)
    row.recycles = state["recycles"]
    return row


def in_worker(n: int, recycle_after: int) -> Row:
    child = worker.Worker(recycle_after=recycle_after)
    devices = [device(i) for i in range(1000)]
    peak = 0

    def run(i: int) -> None:
        nonlocal peak
        assert child.evaluate(SELECTOR, DRIVER, devices[i % len(devices)]) == (True, None, False)
        pid = child.pid
        if pid is not None and i % 500 == 0:
            peak = max(peak, rss(pid))

    row = _measure("worker, recycled", n, run)
    row.callbacks = child.stats.callbacks_total
    row.child_max = peak
    row.recycles = child.stats.recycles
    child.close()
    return row


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evaluations", type=int, default=100_000)
    parser.add_argument("--recycle-after", type=int, default=worker.RECYCLE_AFTER_CALLBACKS)
    args = parser.parse_args(argv)
    n, every = args.evaluations, args.recycle_after
    rows = [in_process(n), in_process_recycled(n, every), in_worker(n, every)]
    print(f"selector: {SELECTOR}  (1 callback per evaluation; recycle after {every})")
    header = (
        f"{'mode':<26} {'evals':>8} {'callbacks':>9} {'recycles':>8} {'RSS before':>10} "
        f"{'RSS after':>9} {'growth':>8} {'B/eval':>7} {'child max':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        growth = r.after - r.before
        child = f"{r.child_max / MIB:7.1f}Mi" if r.child_max else "-"
        print(
            f"{r.mode:<26} {r.evaluations:>8} {r.callbacks:>9} {r.recycles:>8} "
            f"{r.before / MIB:8.1f}Mi {r.after / MIB:7.1f}Mi {growth / MIB:6.1f}Mi "
            f"{growth / r.evaluations:7.0f} {child:>9}"
        )


if __name__ == "__main__":
    main()
