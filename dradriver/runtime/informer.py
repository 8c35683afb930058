"""A list+watch cache for one kind of object (client-go's reflector + informer), on dicts.

The informer lists the collection (paged, consistent read), delivers the
differences to its handlers, then watches from the list's resourceVersion with
bookmarks. A watch that ends normally (server timeout, connection closed) is
resumed from the last resourceVersion seen (an event or a bookmark), so
nothing is listed again and nothing is missed. When the server answers 410
Gone (the resourceVersion left the watch window, as an HTTP status or as an
``ERROR`` event) the informer lists again and emits adds, updates and deletes
for what changed meanwhile, deletes included. Other errors are retried with
exponential backoff: a failed list is repeated, a failed watch resumes.

A watch that ends without a single event in under ``min_watch_duration`` (a server or
proxy that accepts the request and closes the stream at once) is a failure too, so such
a server sees a few attempts a second at first and one per ``cap`` later, never a tight
loop. A list and any added, modified, deleted or bookmark event reset the backoff, and
so does a quiet watch that lasted its time: a real recovery is at most one ``cap`` late.

Objects are the server's JSON as plain dicts, so no field is dropped (see
reference/python-client.md); handlers must treat them as read-only because
they are the cache's own copies. Handlers run in the informer's task and
should be quick (typically: put a key in a work queue); one that raises costs
that event, not the informer.

One object that cannot be used costs that object, never the cache: an object
nested deeper than :data:`~dradriver.k8s.jsondecode.MAX_DEPTH` (the client
hands it over as a :class:`~dradriver.k8s.jsondecode.TooDeepObject`) or
without the shape of an object (no metadata, no name) is skipped, logged by
kind, namespace and name and counted in ``dradriver_informer_skipped_total``;
the watch goes on after it and a list syncs without it. A skipped object is
never reported as deleted: if an earlier version is cached, that version
stays (stale, not gone) until the object is fixed or deleted. Every object in
the cache is therefore at most ``MAX_DEPTH`` deep, so handlers and
reconcilers may deep-copy or walk it. A too-deep object is not a silent gap
either: its cut version is shown apart, in :attr:`Informer.unreadable`, to
handlers registered with :meth:`Informer.add_unreadable_handler` (see
:mod:`dradriver.runtime.unusable`), until it is deleted or readable again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, Protocol

from dradriver.k8s.errors import KubeAPIError, is_gone
from dradriver.k8s.jsondecode import TooDeepObject
from dradriver.k8s.objects import Obj
from dradriver.log import get_logger
from dradriver.runtime.dispatch import AddHandler, DeleteHandler, Dispatch, UpdateHandler
from dradriver.runtime.dispatch import EventHandler as EventHandler  # public name, kept
from dradriver.runtime.metrics import RuntimeMetrics
from dradriver.runtime.ratelimit import Backoff
from dradriver.runtime.unusable import (
    SKIP_MALFORMED,
    UnreadableHandler,
    UnusableObjects,
    identity,
)
from dradriver.runtime.unusable import SKIP_TOO_DEEP as SKIP_TOO_DEEP  # public name, kept

log = get_logger("informer")


class ListWatchClient(Protocol):
    """What the informer needs from :class:`dradriver.k8s.client.KubeClient`."""

    async def list(self, path: str, **params: Any) -> Obj: ...

    def watch(self, path: str, resource_version: str, **params: Any) -> AsyncIterator[Obj]: ...


class Expired(Exception):
    """The resourceVersion is too old for the server (410 Gone): list again."""


class WatchError(RuntimeError):
    """The watch broke: an ``ERROR`` event other than 410, or an end at once without an event."""


def object_key(obj: Obj) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else name


def split_key(key: str) -> tuple[str | None, str]:
    """The inverse of :func:`object_key`: ``(namespace or None, name)``."""
    namespace, sep, name = key.partition("/")
    return (namespace, name) if sep else (None, key)


def resource_version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


# Watch event types the metrics count by name; anything else is counted as "other",
# so a broken or hostile stream cannot grow the label set.
_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


class Informer(Dispatch):
    """Keeps an up-to-date cache of the objects under ``path`` and tells handlers about changes.

    ``path`` is a collection path, e.g. ``path_for(RESOURCE_V1, "resourceclaims")``
    for all namespaces. ``label_selector`` and ``field_selector`` restrict what is
    listed and watched (an object that stops matching is reported as deleted).
    Run it with :meth:`run` (or :meth:`start`); :attr:`has_synced` turns true once
    the first list has been delivered to the handlers. A watch that ends without an
    event in under ``min_watch_duration`` seconds is retried after ``backoff``.
    """

    def __init__(
        self,
        client: ListWatchClient,
        path: str,
        *,
        name: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        key_func: Callable[[Obj], str] = object_key,
        page_size: int = 500,
        watch_timeout: float = 300.0,
        min_watch_duration: float = 1.0,
        resync_period: float | None = None,
        backoff: Backoff | None = None,
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        self.client = client
        self.path = path
        self.name = name or path
        self.key_func = key_func
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.min_watch_duration = min_watch_duration
        self.resync_period = resync_period
        self._selectors: dict[str, str] = {}
        if label_selector:
            self._selectors["labelSelector"] = label_selector
        if field_selector:
            self._selectors["fieldSelector"] = field_selector
        self._backoff = backoff or Backoff(base=0.8, cap=30.0)
        self._metrics = metrics
        self._cache: dict[str, Obj] = {}
        self._rv: str | None = None  # None: the next step is a full list
        self._synced = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
        self._restart_from: str | None = None
        self._progress = False  # the current watch has delivered an event
        self._task: asyncio.Task[None] | None = None
        # Counters, for tests and logs.
        self.lists = 0
        self.watch_starts = 0
        self.expired = 0
        self.bookmarks = 0
        self.errors = 0
        self.last_error: str = ""
        self._unusable = UnusableObjects(self.name, path, key_func, metrics)
        super().__init__(self.name, self._unusable.key_or_none)

    # --- handlers and cache -----------------------------------------------------

    def add_handler(
        self,
        on_add: AddHandler | None = None,
        on_update: UpdateHandler | None = None,
        on_delete: DeleteHandler | None = None,
    ) -> None:
        """Register handlers; objects already cached are replayed to ``on_add``."""
        handler = EventHandler(on_add, on_update, on_delete)
        self._handlers.append(handler)
        if on_add is not None:
            for obj in list(self._cache.values()):
                self._call("add", on_add, obj)

    def get(self, key: str) -> Obj | None:
        return self._cache.get(key)

    def get_by_name(self, namespace: str | None, name: str) -> Obj | None:
        return self._cache.get(f"{namespace}/{name}" if namespace else name)

    def items(self) -> list[Obj]:
        return list(self._cache.values())

    def keys(self) -> list[str]:
        return list(self._cache)

    def __len__(self) -> int:
        return len(self._cache)

    def __iter__(self) -> Iterator[Obj]:
        return iter(list(self._cache.values()))

    @property
    def skipped(self) -> int:
        """Objects left out of the cache so far (too deep or malformed)."""
        return self._unusable.skipped

    @property
    def unreadable(self) -> Mapping[str, Obj]:
        """Key -> cut version of each object too deep to decode (never in the cache)."""
        return self._unusable.unreadable

    def add_unreadable_handler(
        self,
        on_unreadable: UnreadableHandler | None = None,
        on_cleared: UnreadableHandler | None = None,
    ) -> None:
        """Be told ``(key, cut object)`` when an object turns (or stays) too deep to decode,
        and when it is deleted or readable again; those unreadable now are replayed."""
        self._unusable.add_handler(on_unreadable, on_cleared)

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_for_sync(self) -> None:
        """Wait until the first list has been delivered (bound it with ``asyncio.timeout``)."""
        await self._synced.wait()

    @property
    def resource_version(self) -> str | None:
        """The resourceVersion the next watch starts from (None: a list comes next)."""
        return self._rv

    # --- running ----------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Run in a background task (see :meth:`stop`)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=f"informer {self.name}")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run(self) -> None:
        """List and watch until cancelled."""
        resync = (
            asyncio.create_task(self._resync_loop(self.resync_period))
            if self.resync_period
            else None
        )
        try:
            while True:
                await self._step()
        finally:
            if resync is not None:
                resync.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await resync
            if self._metrics is not None:
                self._metrics.informer_synced.labels(self.name).set(0)

    def restart_watch(self, resource_version: str | None = None) -> None:
        """End the current watch; the next one starts from ``resource_version``.

        Without an argument the watch simply resumes from the last resourceVersion
        seen. With an old one the server answers 410 Gone and the informer lists
        again (tests use this to exercise that path against a real apiserver).
        """
        self._restart_from = resource_version
        if self._watch_task is not None:
            self._watch_task.cancel()

    async def _step(self) -> None:
        try:
            if self._rv is None:
                await self._relist()
            await self._watch()
        except asyncio.CancelledError:
            raise
        except Expired as e:
            self.expired += 1
            log.info("resource version expired, listing again", informer=self.name, reason=str(e))
            self._rv = None
        except Exception as e:
            self.errors += 1
            self.last_error = str(e) or type(e).__name__
            delay = self._backoff.next()
            log.warning(
                "list/watch failed, retrying",
                informer=self.name,
                error=self.last_error,
                retry_in=round(delay, 2),
                relist=self._rv is None,
            )
            await asyncio.sleep(delay)

    async def _list_all(self) -> tuple[list[Obj], str]:
        items: list[Obj] = []
        params: dict[str, Any] = dict(self._selectors)
        if self.page_size:
            params["limit"] = self.page_size
        rv = ""
        while True:
            page = await self.client.list(self.path, **params)
            meta = page.get("metadata") or {}
            page_items = page.get("items") or []
            if not isinstance(page_items, list) or not isinstance(meta, dict):
                raise ValueError(f"list {self.path}: not a list response")
            items.extend(page_items)
            rv = str(meta.get("resourceVersion", ""))
            token = meta.get("continue")
            if not token:
                return items, rv
            params["continue"] = token

    async def _relist(self) -> None:
        self.lists += 1
        if self._metrics is not None:
            self._metrics.informer_relists.labels(self.name).inc()
        try:
            items, rv = await self._list_all()
        except KubeAPIError as e:
            if is_gone(e):  # the continue token expired between pages
                raise Expired(str(e)) from e
            raise
        old = self._cache
        new: dict[str, Obj] = {}
        too_deep: dict[str, TooDeepObject] = {}
        skipped = 0
        for obj in items:
            key = self._unusable.usable_key(obj, "list")
            if key is not None:
                new[key] = obj
            else:
                skipped += 1
                key = self._unusable.key_or_none(obj)
                if key is not None and isinstance(obj, TooDeepObject):
                    too_deep[key] = obj
                if key is not None and key in old:  # skipped, not gone: keep the last good one
                    new[key] = old[key]
        self._cache = new
        added = updated = deleted = 0
        for key, obj in new.items():
            before = old.get(key)
            if before is None:
                added += 1
                self._dispatch_add(obj)
            elif resource_version(before) != resource_version(obj):
                updated += 1
                self._dispatch_update(before, obj)
        for key, obj in old.items():
            if key not in new:
                deleted += 1
                self._dispatch_delete(obj)
        self._unusable.relisted(too_deep, (k for k in new if k not in too_deep))
        self._rv = rv
        self._backoff.reset()
        self.last_error = ""
        first = not self._synced.is_set()
        self._synced.set()
        if self._metrics is not None:
            self._metrics.informer_synced.labels(self.name).set(1)
        log.info(
            "listed" if first else "listed again",
            informer=self.name,
            objects=len(new),
            resource_version=rv,
            added=added,
            updated=updated,
            deleted=deleted,
            skipped=skipped,
        )

    async def _watch(self) -> None:
        if self._restart_from is not None:
            self._rv, self._restart_from = self._restart_from, None
        assert self._rv is not None
        self._watch_task = asyncio.create_task(self._stream(self._rv))
        try:
            await asyncio.wait([self._watch_task])
        except asyncio.CancelledError:
            # Whatever the stream ends with (httpx may turn the cancellation into a
            # ReadError), the informer itself was cancelled: re-raise that.
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task
            raise
        task, self._watch_task = self._watch_task, None
        if task.cancelled():  # restart_watch(): the next watch starts at once
            return
        task.result()  # re-raise Expired and errors; a normal end resumes from self._rv

    async def _stream(self, rv: str) -> None:
        timeout = int(self.watch_timeout * (1 + random.random()) / 2) or 1
        params = {**self._selectors, "timeoutSeconds": str(timeout)}
        self.watch_starts += 1
        if self._metrics is not None:
            self._metrics.informer_watches.labels(self.name).inc()
        log.debug("watching", informer=self.name, resource_version=rv, timeout=timeout)
        loop = asyncio.get_running_loop()
        started, self._progress = loop.time(), False
        try:
            events = self.client.watch(self.path, rv, **params)
            try:
                async for event in events:
                    self._on_event(event)
            finally:
                aclose = getattr(events, "aclose", None)  # close the HTTP stream now
                if aclose is not None:
                    await aclose()
        except KubeAPIError as e:
            if is_gone(e):
                raise Expired(str(e)) from e
            raise
        lasted = loop.time() - started
        if not self._progress and lasted < self.min_watch_duration:
            raise WatchError(
                f"watch {self.path} ended after {lasted:.3f}s without an event "
                "(the server or a proxy closes it at once)"
            )
        self._backoff.reset()  # a watch that lasted its time, quiet or not

    def _on_event(self, event: object) -> None:
        if not isinstance(event, dict):
            self._unusable.skip(
                event, SKIP_MALFORMED, "the watch event is not a JSON object", "watch"
            )
            return
        kind = event.get("type")
        kind = kind if isinstance(kind, str) else ""
        obj = event.get("object")
        if self._metrics is not None:
            label = kind if kind in _EVENT_TYPES else "other"
            self._metrics.informer_events.labels(self.name, label).inc()
        if kind == "ERROR":
            status: Obj = obj if isinstance(obj, dict) else {}
            code = status.get("code")
            message = status.get("message") or status.get("reason") or "watch error"
            if code == 410:
                raise Expired(str(message))
            raise WatchError(f"watch {self.path}: {code} {message}")
        if kind == "BOOKMARK":
            self.bookmarks += 1
            rv = identity(obj).get("resource_version")
            if rv:
                self._rv = rv
            self._made_progress()
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            log.warning("unknown watch event type", informer=self.name, type=kind)
            return
        key = self._unusable.usable_key(obj, kind)
        if key is None:
            self._unusable_event(kind, obj)
        else:
            assert isinstance(obj, dict)
            before = self._cache.get(key)
            if kind == "DELETED":
                if before is not None:
                    del self._cache[key]
                    self._dispatch_delete(obj)
            else:
                self._cache[key] = obj
                if before is None:
                    self._dispatch_add(obj)
                else:
                    self._dispatch_update(before, obj)
            self._unusable.clear(key)  # readable again (after the cache has it), or gone
        rv = identity(obj).get("resource_version")
        if rv:  # also after a skipped object: a resumed watch starts after it
            self._rv = rv
        self._made_progress()

    def _made_progress(self) -> None:
        """An event arrived: the watch works, the next failure backs off from the start."""
        self._progress = True
        self._backoff.reset()

    def _unusable_event(self, kind: str, obj: object) -> None:
        """A skipped object: not gone (a too-deep one is kept as unreadable); but a
        deletion is one, whatever the object looks like."""
        key = self._unusable.key_or_none(obj)
        if key is None:
            return
        if kind == "DELETED":
            if key in self._cache:
                self._dispatch_delete(self._cache.pop(key))
            self._unusable.clear(key)
        elif isinstance(obj, TooDeepObject):
            self._unusable.set_unreadable(key, obj)

    async def _resync_loop(self, period: float) -> None:
        """Periodically re-deliver every cached object as an update (level-based safety net)."""
        while True:
            await asyncio.sleep(period)
            if self._synced.is_set():
                for obj in list(self._cache.values()):
                    self._dispatch_update(obj, obj)
