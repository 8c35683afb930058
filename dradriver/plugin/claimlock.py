"""Per-claim mutual exclusion within a process and across processes.

The kubelet may call prepare and unprepare for the same claim concurrently,
and during a rolling update two plugin processes serve the node: an asyncio
lock covers the first case, an flock on a per-claim file the second, so a
claim's setup or teardown never runs twice at once.

A lock file exists only while someone holds or waits for it: the holder unlinks
it before it unlocks, and whoever locks a file checks that it is still the one
at the path (same inode), else it starts over with the new one. So at any time
at most one process holds the lock that is at the path, and 10,000 claims that
came and went leave no files behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from dradriver.plugin.interface import claim_uid_problem


@dataclass
class _LocalLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


def _is_at(fd: int, path: Path) -> bool:
    """Whether the file open at ``fd`` is still the one at ``path``."""
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (at_path.st_dev, at_path.st_ino)


class ClaimLocks:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._local: dict[str, _LocalLock] = {}
        # Called with the claim UID before waiting for another process that holds it.
        self.on_wait: Callable[[str], None] | None = None

    @property
    def claims_in_use(self) -> int:
        """Claims someone in this process holds or waits for (the rest cost nothing)."""
        return len(self._local)

    def path_of(self, claim_uid: str) -> Path:
        return self.directory / f"{claim_uid}.lock"

    @contextlib.asynccontextmanager
    async def hold(self, claim_uid: str) -> AsyncIterator[None]:
        problem = claim_uid_problem(claim_uid)
        if problem:
            raise ValueError(problem)
        local = self._local.setdefault(claim_uid, _LocalLock())
        local.users += 1
        try:
            async with local.lock:
                path = self.path_of(claim_uid)
                fd = await self._lock_file(claim_uid, path)
                try:
                    yield
                finally:
                    # Unlinked while still locked: a process waiting on this inode finds
                    # it gone from the path once it gets the lock, and starts over.
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                    os.close(fd)
        finally:
            local.users -= 1
            if local.users == 0:
                del self._local[claim_uid]

    async def _lock_file(self, claim_uid: str, path: Path) -> int:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if self.on_wait is not None:
                        self.on_wait(claim_uid)
                    # Another process works on this claim; wait without blocking the loop.
                    await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
                if _is_at(fd, path):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the holder removed it meanwhile: lock the current one
