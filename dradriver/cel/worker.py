"""Evaluate selectors that call Python in a child process that is recycled: the leak bound.

cel-expr-python 0.1.3 leaks each Python callback's argument tuple and result (about
1.2 KB per call). The leaked objects keep an extra reference that nothing releases:
dropping the compiled programs and the environment and building new ones frees nothing
(measured with RSS and ``gc.get_objects()``: ``bench/cel_leak.py``). So selectors that
still call Python after the compile-time folding are evaluated in a child process
(:mod:`dradriver.cel.evalchild`) that is replaced once it has made
:data:`RECYCLE_AFTER_CALLBACKS` callbacks: the leak per process is bounded by roughly
``RECYCLE_AFTER_CALLBACKS * 1.2 KB`` (60 MB by default) and is returned to the system
when the child exits.

The child also bounds evaluation time: an evaluation that does not answer within
:data:`EVAL_TIMEOUT` seconds (or a child that dies) is a non-match with that reason, and
the next evaluation starts a fresh child.

The process handling is :class:`dradriver.runtime.childworker.ChildWorker`'s. Protocol
(:data:`~dradriver.runtime.childworker.JSON_LINES`): one JSON object per line on the
child's stdin (``expression``, ``driver``, ``device``: the resource.k8s.io Device JSON)
and one per line on its stdout (``matched``, ``error``, ``callbacks``: the child's
callback count so far), after a first ``{"ready": true}``. One request at a time (a
lock): cel-expr-python holds the GIL anyway.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from dradriver.runtime.childworker import (
    JSON_LINES,
    ChildWorker,
    WorkerError,
    WorkerStats,
    WorkerTimeout,
)

__all__ = [
    "EVAL_TIMEOUT",
    "RECYCLE_AFTER_CALLBACKS",
    "Answer",
    "CelWorkerStats",
    "Worker",
    "WorkerError",
]

RECYCLE_AFTER_CALLBACKS = 50_000
EVAL_TIMEOUT = 5.0
START_TIMEOUT = 120.0
_CHILD = "from dradriver.cel.evalchild import main; main()"


@dataclass
class CelWorkerStats(WorkerStats):
    evaluations: int = 0
    recycles: int = 0
    callbacks: int = 0  # made by the current child
    callbacks_total: int = 0  # made by all children so far


class Answer(NamedTuple):
    matched: bool
    error: str | None
    transient: bool = False  # the child failed (timeout, exit): do not memoise


def _ready(message: Any) -> bool:
    return isinstance(message, dict) and bool(message.get("ready"))


class Worker:
    """A recycled child process evaluating selectors; :meth:`evaluate` is thread-safe."""

    def __init__(
        self,
        recycle_after: int = RECYCLE_AFTER_CALLBACKS,
        timeout: float = EVAL_TIMEOUT,
        command: list[str] | None = None,
    ) -> None:
        self.recycle_after = recycle_after
        self.timeout = timeout
        self.stats = CelWorkerStats()
        # The child evaluates in-process.
        env = {**os.environ, "DRADRIVER_CEL_WORKER": "0"}
        self._child = ChildWorker(
            command or [sys.executable, "-c", _CHILD],
            JSON_LINES,
            _ready,
            start_timeout=START_TIMEOUT,
            stats=self.stats,
            env=env,
        )
        self._lock = threading.Lock()

    @property
    def command(self) -> list[str]:
        """The child's command line; a change applies from the next child on."""
        return self._child.command

    @command.setter
    def command(self, command: list[str]) -> None:
        self._child.command = list(command)

    @property
    def pid(self) -> int | None:
        """The current child's process id; None when there is none."""
        return self._child.pid

    def evaluate(self, expression: str, driver: str, device: Mapping[str, Any]) -> Answer:
        """The result for one device; a failure of the child is a reason, not raised."""
        request = {"expression": expression, "driver": driver, "device": device}
        with self._lock:
            self.stats.evaluations += 1
            try:
                self._child.start_timeout = max(START_TIMEOUT, self.timeout)
                if self._child.ensure_started():
                    self.stats.callbacks = 0
                reply = self._child.call(request, self.timeout)
                if not isinstance(reply, dict):
                    raise self._child.failure(f"unexpected reply {reply!r}")
            except WorkerTimeout as e:
                self._stop(kill=True)
                message = f"CEL evaluation did not finish within {e.timeout:g} s"
                return Answer(False, f"{message} (evaluation stopped)", transient=True)
            except WorkerError as e:
                self._stop(kill=True)
                message = f"CEL evaluation failed: the evaluating process failed: {e}"
                return Answer(False, message, transient=True)
            calls = int(reply.get("callbacks", 0))
            self.stats.callbacks_total += max(0, calls - self.stats.callbacks)
            self.stats.callbacks = calls
            if calls >= self.recycle_after:
                self.stats.recycles += 1
                self._stop(kill=False)
            error = reply.get("error")
            return Answer(bool(reply.get("matched")) and error is None, error)

    def close(self) -> None:
        with self._lock:
            self._stop(kill=False)

    def _stop(self, kill: bool) -> None:
        self._child.stop(kill)
        self.stats.callbacks = 0
