"""A child process that answers one request at a time, each within a deadline.

Invariants:

* At most one child at a time. :meth:`ChildWorker.ensure_started` starts one when there is
  none (or it exited); a new child must send a *ready* message within ``start_timeout``.
* Every reply is read against a deadline: a reply not complete by then raises
  :class:`WorkerTimeout`, a child that exits, answers garbage or cannot be written to
  raises :class:`WorkerError` (whose message says which, with the exit status when known).
  The caller then stops the child with ``kill=True`` (kill on budget); the next request
  starts a new one.
* The child's replies travel on a duplicate of its stdout; its fd 1 then points at stderr,
  so stray prints cannot corrupt the protocol (:class:`ChildEnd`).
* Not thread-safe, except :meth:`ChildWorker.interrupt` (kill from another thread): the
  owner serialises requests (a lock, a one-thread executor).

Two framings (:class:`Framing`): :data:`PICKLE_FRAMES` (an 8-byte big-endian length, then
a pickle: large Python objects) and :data:`JSON_LINES` (one compact JSON object a line).

The specialisations: :mod:`dradriver.cel.worker` (CEL evaluation, recycled against a
leak) and ``controller.claims.worker`` (the allocator's search, within a budget).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

__all__ = [
    "JSON_LINES",
    "PICKLE_FRAMES",
    "ChildEnd",
    "ChildWorker",
    "Framing",
    "WorkerError",
    "WorkerStats",
    "WorkerTimeout",
]


class WorkerError(RuntimeError):
    """The child did not answer (exit, garbage, a broken pipe); the message says how."""


class WorkerTimeout(WorkerError):
    """No complete reply within ``timeout`` seconds."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"no answer within {timeout:g} s")
        self.timeout = timeout


@dataclass
class WorkerStats:
    """What happened to the children so far (specialisations add their own counters)."""

    starts: int = 0
    kills: int = 0  # stopped with kill=True while running, or interrupted
    timeouts: int = 0
    failures: int = 0  # exited, garbage, could not be written to


class Framing:
    """How messages travel on the pipes; the base class is the pickle framing."""

    header = 8

    def encode(self, message: Any) -> bytes:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        return len(payload).to_bytes(self.header, "big") + payload

    def decode(self, payload: bytes) -> Any:
        return pickle.loads(payload)

    def split(self, buffer: bytes) -> tuple[bytes, bytes] | None:
        """``(payload, rest)`` when ``buffer`` holds a whole frame, else None."""
        if len(buffer) < self.header:
            return None
        end = self.header + int.from_bytes(buffer[: self.header], "big")
        return (buffer[self.header : end], buffer[end:]) if len(buffer) >= end else None

    def missing(self, buffer: bytes) -> int:
        """Bytes still missing from the frame at the start of ``buffer`` (0: unknown)."""
        if len(buffer) < self.header:
            return self.header - len(buffer)
        return max(0, self.header + int.from_bytes(buffer[: self.header], "big") - len(buffer))

    def read(self, stream: BinaryIO) -> bytes | None:
        """The next payload from a blocking stream; None at its end."""
        header = stream.read(self.header)
        if len(header) < self.header:
            return None
        return stream.read(int.from_bytes(header, "big"))


class _JsonLines(Framing):
    def encode(self, message: Any) -> bytes:
        return json.dumps(message, separators=(",", ":"), default=str).encode() + b"\n"

    def decode(self, payload: bytes) -> Any:
        return json.loads(payload)

    def split(self, buffer: bytes) -> tuple[bytes, bytes] | None:
        line, newline, rest = buffer.partition(b"\n")
        return (line, rest) if newline else None

    def missing(self, buffer: bytes) -> int:
        return 0

    def read(self, stream: BinaryIO) -> bytes | None:
        line = stream.readline()
        return line or None


PICKLE_FRAMES = Framing()
JSON_LINES: Framing = _JsonLines()

_READ_SIZE = 1 << 16


class ChildWorker:
    """The parent's side: starts, talks to and stops one child process (module docstring)."""

    def __init__(
        self,
        command: Sequence[str],
        framing: Framing,
        is_ready: Callable[[Any], bool],
        *,
        start_timeout: float,
        stats: WorkerStats | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.command = list(command)
        self.framing = framing
        self.is_ready = is_ready
        self.start_timeout = start_timeout
        self.stats = stats if stats is not None else WorkerStats()
        self.env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._interrupted: int | None = None  # the child killed by interrupt()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def ensure_started(self) -> bool:
        """Start a child unless one is running; True when this started one."""
        if self._proc is not None and self._proc.poll() is None:
            return False
        self.stop(kill=True)
        self._proc = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
            close_fds=True,
        )
        self._buffer = b""
        self.stats.starts += 1
        ready = self.receive(self.start_timeout)
        if not self.is_ready(ready):
            raise self.failure(f"it did not start: {ready!r}")
        return True

    def call(self, message: Any, timeout: float) -> Any:
        """Send ``message`` and return the reply, within ``timeout`` seconds."""
        self.send(message)
        return self.receive(timeout)

    def send(self, message: Any) -> None:
        proc = self._proc
        assert proc is not None and proc.stdin is not None, "ensure_started() first"
        try:
            proc.stdin.write(self.framing.encode(message))
            proc.stdin.flush()
        except OSError as e:
            raise self.failure(f"could not send to it: {e}") from None

    def receive(self, timeout: float) -> Any:
        """The next reply, read until ``timeout`` seconds have passed."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None, "ensure_started() first"
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while (whole := self.framing.split(self._buffer)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                self.stats.timeouts += 1
                raise WorkerTimeout(timeout)
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                continue
            chunk = os.read(fd, max(_READ_SIZE, self.framing.missing(self._buffer)))
            if not chunk:
                raise self.failure("it exited")
            self._buffer += chunk
        payload, self._buffer = whole
        try:
            return self.framing.decode(payload)
        except Exception as e:
            raise self.failure(f"unreadable reply {payload[:200]!r}: {e}") from None

    def failure(self, what: str) -> WorkerError:
        """A :class:`WorkerError` for ``what``, with the child's exit status when known."""
        self.stats.failures += 1
        proc = self._proc
        code = proc.poll() if proc is not None else None
        return WorkerError(what + (f" (exit status {code})" if code is not None else ""))

    def interrupt(self) -> None:
        """Kill the child from another thread; the owner sees its exit on its next read."""
        proc = self._proc
        if proc is not None and proc.returncode is None and proc.pid != self._interrupted:
            self._interrupted = proc.pid  # counted once, here, not again by stop()
            self.stats.kills += 1
            with contextlib.suppress(OSError):
                proc.kill()

    def stop(self, kill: bool) -> None:
        """End the child: killed, or told to exit by the end of its input."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if kill and proc.poll() is None:
            if proc.pid != self._interrupted:
                self.stats.kills += 1
            proc.kill()
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()  # the child's end of input: it exits
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


class ChildEnd:
    """The child's side: requests from stdin, replies on a duplicate of stdout (fd 1 is
    pointed at stderr, so stray prints cannot corrupt the protocol)."""

    def __init__(self, framing: Framing, *, ignore_sigint: bool = False) -> None:
        if ignore_sigint:  # Ctrl-C is for the parent to handle
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.framing = framing
        self._out = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)
        self._in = sys.stdin.buffer

    def send(self, message: Any) -> None:
        self._out.write(self.framing.encode(message))
        self._out.flush()

    def requests(self) -> Iterator[bytes]:
        """Each request's payload (undecoded), until the parent closes our input."""
        while (payload := self.framing.read(self._in)) is not None:
            yield payload
