"""Per-claim mutual exclusion within a process and across processes.

The kubelet may call prepare and unprepare for the same claim concurrently,
and during a rolling update two plugin processes serve the node: an asyncio
lock covers the first case, an flock on a per-claim file the second, so a
claim's setup or teardown never runs twice at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class ClaimLocks:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._local: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    @contextlib.asynccontextmanager
    async def hold(self, claim_uid: str) -> AsyncIterator[None]:
        if not _SAFE.match(claim_uid):
            raise ValueError(f"claim uid {claim_uid!r} is not a valid UID")
        async with self._local[claim_uid]:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.directory / f"{claim_uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    # Another process works on this claim; wait without blocking the loop.
                    await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def forget(self, claim_uid: str) -> None:
        """Drop the lock file of a claim that is gone (no holder can be waiting on it)."""
        lock = self._local.get(claim_uid)
        if lock is None or not lock.locked():
            self._local.pop(claim_uid, None)
            with contextlib.suppress(FileNotFoundError):
                (self.directory / f"{claim_uid}.lock").unlink()
