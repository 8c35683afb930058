"""An asyncio event loop in a thread, for servers the fuzz targets call synchronously.

Hypothesis drives a test function that is not a coroutine, so the real gRPC server
runs on a loop of its own here and the test talks to it over its socket with a
blocking client, as the kubelet (a separate process) would.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
# Long enough for any server start or stop here; only a hang reaches it.
STEP_TIMEOUT = 60.0


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="fuzz-server", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(STEP_TIMEOUT)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(STEP_TIMEOUT)
        self.loop.close()
