"""The controller's HTTP servers on an event loop of their own, in a thread of their own.

The admission webhook has a 10 s timeout at the apiserver (and ``failurePolicy: Fail``),
the kubelet probes ``/healthz`` and ``/readyz`` with a 1 s one: neither may wait for
reconcile work. The reconcilers' event loop runs informer handlers, JSON decoding of
large lists and the reconcilers themselves; the allocator's search is in a child process
(:mod:`controller.claims.worker`), but nothing else on that loop is bounded. So the
servers get their own loop in a daemon thread: a review waits only for the GIL, which the
main thread gives up every few milliseconds (``sys.getswitchinterval``).

What the servers' handlers read from the main thread (readiness: informers' synced flags,
the elector's state; the Prometheus registry) is safe to read from another thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol, TypeVar

__all__ = ["Server", "ServingThread"]

T = TypeVar("T")


class Server(Protocol):
    """What :class:`~dradriver.httpserver.HTTPEndpoint` and
    :class:`~dradriver.webhook.server.WebhookServer` offer."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class ServingThread:
    """Starts servers on a loop in a thread of its own; :meth:`stop` stops them and it."""

    def __init__(self, name: str = "http-servers") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[Server] = []

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    async def start(self, servers: Sequence[Server]) -> None:
        """Start the thread, then each server in it; raises what a server's start raised
        (the servers started before it are stopped again)."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            for server in servers:
                await self._run(server.start())
                self._servers.append(server)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop the servers (in-flight requests finish), then the loop and the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            for server in reversed(self._servers):
                await self._run(server.stop())
        finally:
            self._servers.clear()
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join)
            loop.close()
            self._loop = self._thread = None

    async def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))
