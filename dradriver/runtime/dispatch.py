"""Delivering an informer's add, update and delete events to its handlers.

Invariants: handlers run in registration order, in the informer's task; one that raises
(``RecursionError`` included) costs that call, logged with the object's key, never the
informer or the handlers after it. Handlers get the cache's own objects: read-only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dradriver.k8s.objects import Obj
from dradriver.log import get_logger

log = get_logger("informer")

AddHandler = Callable[[Obj], None]
UpdateHandler = Callable[[Obj, Obj], None]
DeleteHandler = Callable[[Obj], None]


@dataclass(frozen=True)
class EventHandler:
    on_add: AddHandler | None = None
    on_update: UpdateHandler | None = None
    on_delete: DeleteHandler | None = None


class Dispatch:
    """The handlers of informer ``name`` and their delivery; ``key_of`` names an object in
    a log line (None when it has no key)."""

    def __init__(self, name: str, key_of: Callable[[object], str | None]) -> None:
        self.name = name
        self.key_of = key_of
        self._handlers: list[EventHandler] = []

    def _dispatch_add(self, obj: Obj) -> None:
        for h in self._handlers:
            if h.on_add is not None:
                self._call("add", h.on_add, obj)

    def _dispatch_update(self, old: Obj, new: Obj) -> None:
        for h in self._handlers:
            if h.on_update is not None:
                self._call("update", h.on_update, old, new)

    def _dispatch_delete(self, obj: Obj) -> None:
        for h in self._handlers:
            if h.on_delete is not None:
                self._call("delete", h.on_delete, obj)

    def _call(self, what: str, fn: Callable[..., None], *args: Obj) -> None:
        try:
            fn(*args)
        except Exception:  # RecursionError included: one event, not the informer
            log.exception(
                "event handler failed",
                informer=self.name,
                event=what,
                key=self.key_of(args[-1]) or "",
            )
