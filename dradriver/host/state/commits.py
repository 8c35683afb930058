"""Group commit for the node ledger: concurrent claims share one fsynced write.

Every ledger change must be on disk before the caller acts on it (sets a device up,
answers the kubelet). Done one by one, a NodePrepareResources call with 100 claims
costs 200 fsynced writes. Here changes are queued; a drain task applies the queue in
one :meth:`Ledger.transaction` in a worker thread, and changes queued while that
write is in progress go into the next one. Alone, a change still costs one write;
under load, one write covers many. Each caller gets its own result or exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from dradriver.host.state.ledger import Ledger

T = TypeVar("T")

_Change = tuple[Callable[[], Any], "asyncio.Future[Any]"]


class GroupCommitter:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._pending: list[_Change] = []
        self._drainer: asyncio.Task[None] | None = None
        self.writes = 0  # transactions run (for tests and metrics)
        self.changes = 0

    async def read(self, query: Callable[[], T]) -> T:
        """Run ``query`` (a Ledger read) in the worker thread, between the queued changes.

        Every ledger call takes the ledger's lock, which a write in progress holds for its
        fsyncs: called on the event loop, a read would stop the loop (every other claim,
        gRPC, probes) until that write is done. A batch of reads only writes nothing.
        """
        return await self.run(query)

    async def run(self, change: Callable[[], T]) -> T:
        """Apply ``change`` (a call of a Ledger method) durably; returns its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._pending.append((change, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain(), name="ledger group commit")
        return await future

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                outcomes = await asyncio.to_thread(self._apply, batch)
            except BaseException as err:  # the write failed: the whole batch is undone
                for _, future in batch:
                    if not future.done():
                        future.set_exception(err)
                if isinstance(err, asyncio.CancelledError):
                    raise
                continue
            for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                if future.done():
                    continue  # its caller was cancelled; the change is on disk anyway
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    def _apply(self, batch: list[_Change]) -> list[tuple[bool, Any]]:
        outcomes: list[tuple[bool, Any]] = []
        with self.ledger.transaction():
            for change, _ in batch:
                try:
                    outcomes.append((True, change()))
                except Exception as err:  # refused (busy device, bad state): only this one
                    outcomes.append((False, err))
        self.writes += 1
        self.changes += len(batch)
        return outcomes
