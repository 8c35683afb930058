"""Objects an informer cannot put in its cache, and the unreadable ones it still shows.

Invariants: an object without the shape of an object (no metadata, no name) or nested
deeper than :data:`~dradriver.k8s.jsondecode.MAX_DEPTH` never reaches the cache or its
event handlers, so every cached object may be deep-copied and walked. It is logged by
kind, namespace and name and counted in ``dradriver_informer_skipped_total``.

An object too deep to decode (a :class:`~dradriver.k8s.jsondecode.TooDeepObject`, the
object with its deep parts cut) is not silently gone: :class:`UnusableObjects` keeps the
latest cut version per key in :attr:`UnusableObjects.unreadable` and tells the unreadable
handlers when a key becomes unreadable (``on_unreadable(key, cut)``, also for each newer
cut version) and when it stops being so (``on_cleared(key, last_cut)``: the object was
deleted, a readable version arrived, or a list no longer has it as too deep). Those
handlers see only cut objects, whose parts above the cut are plain JSON and whose cut
parts are :data:`~dradriver.k8s.jsondecode.CUT`; the normal handlers never do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dradriver.k8s.jsondecode import TooDeepObject
from dradriver.k8s.objects import Obj
from dradriver.log import get_logger
from dradriver.runtime.metrics import RuntimeMetrics

log = get_logger("informer")

# Why an object was skipped: the values of the ``reason`` label.
SKIP_TOO_DEEP = "too_deep"
SKIP_MALFORMED = "malformed"

UnreadableHandler = Callable[[str, Obj], None]


def why_unusable(obj: object) -> tuple[str, str] | None:
    """``(reason label, detail)`` if ``obj`` cannot go into the cache, else None."""
    if isinstance(obj, TooDeepObject):
        return SKIP_TOO_DEEP, obj.reason
    if not isinstance(obj, dict):
        return SKIP_MALFORMED, f"not a JSON object but {type(obj).__name__}"
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return SKIP_MALFORMED, "metadata is not an object"
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        return SKIP_MALFORMED, "metadata.name is missing or not a string"
    if namespace is not None and not isinstance(namespace, str):
        return SKIP_MALFORMED, "metadata.namespace is not a string"
    if not isinstance(meta.get("resourceVersion", ""), str):
        return SKIP_MALFORMED, "metadata.resourceVersion is not a string"
    return None


def identity(obj: object) -> dict[str, str]:
    """Kind, namespace, name and resource version as far as ``obj`` has them, for a log line."""
    out: dict[str, str] = {}
    if isinstance(obj, dict):
        if isinstance(obj.get("kind"), str):
            out["kind"] = obj["kind"]
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            for field in ("namespace", "name", "resourceVersion"):
                if isinstance(meta.get(field), str):
                    out["resource_version" if field == "resourceVersion" else field] = meta[field]
    return out


@dataclass(frozen=True)
class _UnreadableHandler:
    on_unreadable: UnreadableHandler | None
    on_cleared: UnreadableHandler | None


class UnusableObjects:
    """One informer's skipped objects (counted and logged) and its unreadable ones (kept).

    ``name`` and ``path`` are the informer's (for logs and metrics), ``key_func`` its
    cache key.
    """

    def __init__(
        self,
        name: str,
        path: str,
        key_func: Callable[[Obj], str],
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        self.name = name
        self.path = path
        self.key_func = key_func
        self._metrics = metrics
        self._unreadable: dict[str, TooDeepObject] = {}
        self._handlers: list[_UnreadableHandler] = []
        self.skipped = 0

    # --- the unreadable objects ---------------------------------------------------------

    @property
    def unreadable(self) -> Mapping[str, Obj]:
        """Key -> the latest cut version of each object too deep to decode (read-only)."""
        return MappingProxyType(self._unreadable)

    def add_handler(
        self, on_unreadable: UnreadableHandler | None, on_cleared: UnreadableHandler | None
    ) -> None:
        """Register unreadable handlers; the objects unreadable now are replayed."""
        self._handlers.append(_UnreadableHandler(on_unreadable, on_cleared))
        if on_unreadable is not None:
            for key, obj in list(self._unreadable.items()):
                self._call("unreadable", on_unreadable, key, obj)

    def set_unreadable(self, key: str, obj: TooDeepObject) -> None:
        """``key``'s latest version is ``obj``, too deep to decode."""
        self._unreadable[key] = obj
        for h in self._handlers:
            if h.on_unreadable is not None:
                self._call("unreadable", h.on_unreadable, key, obj)

    def clear(self, key: str) -> None:
        """``key`` is deleted or readable again (nothing happens if it was not unreadable)."""
        obj = self._unreadable.pop(key, None)
        if obj is None:
            return
        for h in self._handlers:
            if h.on_cleared is not None:
                self._call("cleared", h.on_cleared, key, obj)

    def relisted(self, too_deep: Mapping[str, TooDeepObject], listed: Iterable[str]) -> None:
        """After a list: ``too_deep`` are the unreadable objects it had, ``listed`` the keys
        it had readable. The others that were unreadable are cleared (deleted meanwhile);
        a listed version that differs from the one kept is reported."""
        readable = set(listed)
        for key in [k for k in self._unreadable if k not in too_deep or k in readable]:
            self.clear(key)
        for key, obj in too_deep.items():
            before = self._unreadable.get(key)
            if key not in readable and (before is None or before != obj):
                self.set_unreadable(key, obj)

    def _call(self, what: str, fn: UnreadableHandler, key: str, obj: Obj) -> None:
        try:
            fn(key, obj)
        except Exception:
            log.exception(
                "unreadable-object handler failed", informer=self.name, event=what, key=key
            )

    # --- skipping -----------------------------------------------------------------------

    def usable_key(self, obj: object, event: str) -> str | None:
        """The cache key of an object fit for the cache; None (skipped, logged) otherwise."""
        problem = why_unusable(obj)
        if problem is None:
            assert isinstance(obj, dict)
            try:
                return self.key_func(obj)
            except Exception as e:
                problem = (SKIP_MALFORMED, f"no cache key: {e!r}")
        self.skip(obj, *problem, event)
        return None

    def key_or_none(self, obj: object) -> str | None:
        """The cache key of a usable or too-deep object, if it has one."""
        if not isinstance(obj, TooDeepObject) and why_unusable(obj) is not None:
            return None
        assert isinstance(obj, dict)
        try:
            key = self.key_func(obj)
        except Exception:
            return None
        return key or None

    def skip(self, obj: object, reason: str, detail: str, event: str) -> None:
        self.skipped += 1
        if self._metrics is not None:
            self._metrics.informer_skipped.labels(self.name, reason).inc()
        who = identity(obj)
        log.warning(
            "skipped an object the informer cannot use; the others go on",
            informer=self.name,
            kind=who.get("kind") or self.path.rstrip("/").rsplit("/", 1)[-1],
            namespace=who.get("namespace", ""),
            name=who.get("name", ""),
            resource_version=who.get("resource_version", ""),
            event=event,
            reason=detail,
        )
