"""Polling until something holds, failing at once if a process it depends on has died."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """What was waited for did not happen in time; the message says what it was."""


class Watched(Protocol):
    def check(self) -> None:
        """Raise if the process has died."""


def wait_until(
    what: str,
    probe: Callable[[], T | None],
    timeout: float,
    interval: float = 0.1,
    *,
    watch: Iterable[Watched] = (),
    ignore: tuple[type[Exception], ...] = (),
) -> T:
    """Poll ``probe`` until it returns something truthy, which is returned.

    Each process in ``watch`` is checked before every probe, so a wait on a component
    that died fails with its log at once rather than at the timeout. Exceptions of an
    ``ignore`` type mean "not yet" (a server that is still starting refuses connections).
    """
    deadline = time.monotonic() + timeout
    watched = list(watch)
    while True:
        for process in watched:
            process.check()
        try:
            value = probe()
        except ignore:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
