"""Per-claim mutual exclusion within a process and across processes.

The kubelet may call prepare and unprepare for the same claim concurrently,
and during a rolling update two plugin processes serve the node: an asyncio
lock covers the first case, a lock on one byte of a shared lock file the
second, so a claim's setup or teardown never runs twice at once.

The byte is the claim UID's 62-bit hash, an offset in ``claims.lock`` (a
sparse file that stays empty: locks past the end of a file are allowed), and
the lock is an open-file-description lock (``F_OFD_SETLK``): owned by this
object's open file, so two :class:`ClaimLocks` exclude each other even in one
process, nothing else closing the file can drop them, and the kernel drops
them when a holder dies. Compared with a lock file per claim (create, flock,
unlink), a claim costs no directory change, which on a busy file system waits
for the journal. Two UIDs with the same hash would only make one process wait
for the other's unrelated claim.

Waiting for another process polls the byte (5 ms, doubling to 100 ms): a
blocked lock call cannot be cancelled, and contention exists only while two
processes overlap during a rolling update.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from dradriver.plugin.interface import claim_uid_problem

LOCK_FILE = "claims.lock"
LOCK_FILE_MODE = 0o600
# struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid, padded to 32 bytes.
_FLOCK = "hhqqi4x"
_FIRST_WAIT, _LONGEST_WAIT = 0.005, 0.1


@dataclass
class _LocalLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


def lock_offset(claim_uid: str) -> int:
    """The byte of the lock file that stands for the claim."""
    digest = hashlib.blake2b(claim_uid.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


class ClaimLocks:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._local: dict[str, _LocalLock] = {}
        self._fd: int | None = None
        # Called with the claim UID before waiting for another process that holds it.
        self.on_wait: Callable[[str], None] | None = None

    @property
    def claims_in_use(self) -> int:
        """Claims someone in this process holds or waits for (the rest cost nothing)."""
        return len(self._local)

    @property
    def path(self) -> Path:
        return self.directory / LOCK_FILE

    def close(self) -> None:
        """Close the lock file (and so drop every lock of this object)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @contextlib.asynccontextmanager
    async def hold(self, claim_uid: str) -> AsyncIterator[None]:
        problem = claim_uid_problem(claim_uid)
        if problem:
            raise ValueError(problem)
        local = self._local.setdefault(claim_uid, _LocalLock())
        local.users += 1
        try:
            async with local.lock:
                fd, offset = self._file(), lock_offset(claim_uid)
                await self._lock(fd, offset, claim_uid)
                try:
                    yield
                finally:
                    _set_lock(fd, fcntl.F_UNLCK, offset)
        finally:
            local.users -= 1
            if local.users == 0:
                del self._local[claim_uid]

    def _file(self) -> int:
        if self._fd is None:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LOCK_FILE_MODE)
        return self._fd

    async def _lock(self, fd: int, offset: int, claim_uid: str) -> None:
        if _set_lock(fd, fcntl.F_WRLCK, offset):
            return
        if self.on_wait is not None:
            self.on_wait(claim_uid)
        wait = _FIRST_WAIT
        while not _set_lock(fd, fcntl.F_WRLCK, offset):
            await asyncio.sleep(wait)
            wait = min(wait * 2, _LONGEST_WAIT)


def _set_lock(fd: int, kind: int, offset: int) -> bool:
    """Lock (``F_WRLCK``) or unlock one byte without blocking; False if another holds it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, kind, os.SEEK_SET, offset, 1, 0))
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held elsewhere
        return False
    return True
