"""Evaluate selectors that call Python in a child process that is recycled: the leak bound.

cel-expr-python 0.1.3 leaks each Python callback's argument tuple and result (about
1.2 KB per call). The leaked objects keep an extra reference that nothing releases:
dropping the compiled programs and the environment and building new ones frees nothing
(measured with RSS and ``gc.get_objects()``: ``bench/cel_leak.py``). So selectors that
still call Python after the compile-time folding are evaluated in a child process
(:func:`main`) that is replaced once it has made
:data:`RECYCLE_AFTER_CALLBACKS` callbacks: the leak per process is bounded by roughly
``RECYCLE_AFTER_CALLBACKS * 1.2 KB`` (60 MB by default) and is returned to the system
when the child exits.

The child also bounds evaluation time: an evaluation that does not answer within
:data:`EVAL_TIMEOUT` seconds (or a child that dies) is a non-match with that reason, and
the next evaluation starts a fresh child.

Protocol: one JSON object per line on the child's stdin (``expression``, ``driver``,
``device``: the resource.k8s.io Device JSON) and one per line on its stdout (``matched``,
``error``, ``callbacks``: the child's callback count so far). The child writes nothing
else to that stream (its fd 1 is redirected to stderr). One request at a time (a lock):
cel-expr-python holds the GIL anyway.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["EVAL_TIMEOUT", "RECYCLE_AFTER_CALLBACKS", "Answer", "Worker", "WorkerStats", "main"]

RECYCLE_AFTER_CALLBACKS = 50_000
EVAL_TIMEOUT = 5.0
START_TIMEOUT = 120.0
_CHILD = "from dradriver.cel.worker import main; main()"


@dataclass
class WorkerStats:
    evaluations: int = 0
    starts: int = 0
    recycles: int = 0
    timeouts: int = 0
    failures: int = 0
    callbacks: int = 0  # made by the current child
    callbacks_total: int = 0  # made by all children so far


class Answer(NamedTuple):
    matched: bool
    error: str | None
    transient: bool = False  # the child failed (timeout, exit): do not memoise


class WorkerError(RuntimeError):
    """The child did not answer (timeout, exit, garbage); the message is the reason."""


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
        self.command = command or [sys.executable, "-c", _CHILD]
        self.stats = WorkerStats()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def evaluate(self, expression: str, driver: str, device: Mapping[str, Any]) -> Answer:
        """The result for one device; a failure of the child is a reason, not raised."""
        request = json.dumps(
            {"expression": expression, "driver": driver, "device": device},
            separators=(",", ":"),
            default=str,
        ).encode()
        with self._lock:
            self.stats.evaluations += 1
            try:
                if self._proc is None:
                    self._start()
                reply = self._call(request + b"\n", self.timeout)
            except WorkerError as e:
                self._stop(kill=True)
                return Answer(False, str(e), transient=True)
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

    # --- process handling (called with the lock held) ----------------------------------

    def _start(self) -> None:
        env = dict(os.environ)
        env["DRADRIVER_CEL_WORKER"] = "0"  # the child evaluates in-process
        self._proc = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self._buffer = b""
        self.stats.starts += 1
        self.stats.callbacks = 0
        ready = self._read(max(START_TIMEOUT, self.timeout))
        if not ready.get("ready"):
            raise WorkerError(f"CEL worker did not start: {ready!r}")

    def _stop(self, kill: bool) -> None:
        proc, self._proc = self._proc, None
        self.stats.callbacks = 0
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            if kill:
                proc.kill()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()

    def _call(self, request: bytes, timeout: float) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        try:
            proc.stdin.write(request)
            proc.stdin.flush()
        except OSError as e:
            raise self._failure(f"could not send to it: {e}") from None
        return self._read(timeout)

    def _read(self, timeout: float) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.stats.timeouts += 1
                raise WorkerError(
                    f"CEL evaluation did not finish within {timeout:g} s (evaluation stopped)"
                )
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._failure("it exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            raise self._failure(f"unreadable reply {line[:200]!r}") from None
        if not isinstance(reply, dict):
            raise self._failure(f"unexpected reply {reply!r}")
        return reply

    def _failure(self, what: str) -> WorkerError:
        self.stats.failures += 1
        code = self._proc.poll() if self._proc is not None else None
        status = f" (exit status {code})" if code is not None else ""
        return WorkerError(f"CEL evaluation failed: the evaluating process failed: {what}{status}")


def main() -> None:
    """The child: evaluate requests from stdin in-process until stdin closes."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # stray prints must not corrupt the protocol
    from dradriver.cel import env, library

    def reply(message: Mapping[str, Any]) -> None:
        out.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    reply({"ready": True, "pid": os.getpid()})
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            selector = env.compile_selector(str(request["expression"]))
            device = env.DeviceInput(str(request["driver"]), request["device"])
            result = selector.evaluate_here(device)
            answer: dict[str, Any] = {"matched": result.matched, "error": result.error}
        except env.CompileError as e:
            answer = {"matched": False, "error": str(e)}
        except Exception as e:
            answer = {"matched": False, "error": env.failure_message(e)}
        answer["callbacks"] = library.CALLBACKS.calls
        reply(answer)


if __name__ == "__main__":
    main()
