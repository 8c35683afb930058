"""An in-memory stand-in for :class:`dradriver.k8s.client.KubeClient` (unit tier only).

The cluster tier runs the real apiserver; this fake exists so that the decisions of
reconcilers, the node driver and the slice publisher can be checked in milliseconds,
and so that faults the real server cannot be made to produce on demand (a 503 on one
GET, a 409 race, a feature gate that is off) can be injected. It keeps the apiserver
rules those decisions rely on: one global resourceVersion that every write (deletes
too) advances, like etcd's revision; optimistic concurrency on
``metadata.resourceVersion`` and on a delete's ``preconditions``; ``metadata.generation``
bumped on spec changes; ``/status`` writes touching only status; deletion held by
finalizers (``deletionTimestamp``; gone once the last finalizer is removed); 404 and 409
as :class:`KubeAPIError`. It serves no watches: :meth:`FakeAPIServer.feed` plays every
write into an informer cache instead.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj


@dataclass(frozen=True)
class Write:
    """A write request as it reached the server (failed ones too), with its body."""

    method: str
    path: str
    body: Obj | list[Obj] | None


@dataclass
class Fault:
    method: str  # GET, POST, PUT, PATCH, DELETE or "*"
    path_prefix: str
    status: int
    times: int  # how many requests fail; -1 = all


def _merge(target: Obj, patch: Obj) -> Obj:
    """RFC 7386 JSON merge patch."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class WatchedCache(Protocol):
    """What :meth:`FakeAPIServer.feed` plays watch events into (``FakeInformer``)."""

    def apply(self, obj: Obj) -> None: ...

    def remove(self, obj: Obj, rv: int | None = None) -> None: ...


def _resource_of(path: str) -> str:
    """The plural of an object path (``.../resourceslices/<name>`` -> ``resourceslices``)."""
    parts = path.strip("/").split("/")
    return parts[-2] if len(parts) >= 2 else ""


class FakeAPIServer:
    """Objects keyed by their REST path; every write is recorded in :attr:`writes`."""

    def __init__(self) -> None:
        self.objects: dict[str, Obj] = {}
        self.writes: list[tuple[str, str]] = []  # (method, path)
        self.history: list[Write] = []  # the same writes, with their bodies
        self.requests: list[tuple[str, str]] = []
        self.faults: list[Fault] = []
        self._rv = itertools.count(1)
        self._last_rv = 0
        self._uid = itertools.count(1)
        self.write_count = 0
        self._write_filters: list[tuple[str, Callable[[Obj], None]]] = []
        self._feeds: list[tuple[str, WatchedCache]] = []

    # --- test controls ------------------------------------------------------------------

    def fail(self, method: str, path_prefix: str, status: int, times: int = -1) -> None:
        """Make matching requests fail with ``status`` (``times`` of them; -1: until cleared)."""
        self.faults.append(Fault(method, path_prefix, status, times))

    def clear_faults(self) -> None:
        self.faults.clear()

    def on_write(self, path_prefix: str, change: Callable[[Obj], None]) -> None:
        """Let ``change`` edit every object created or updated under ``path_prefix`` before
        it is stored: e.g. drop the fields a disabled feature gate makes the apiserver drop."""
        self._write_filters.append((path_prefix, change))

    def feed(self, resource: str, cache: WatchedCache) -> None:
        """Play every later write of objects of ``resource`` (plural) into ``cache``, as a
        watch would (at once: a test that wants a cache behind the server does not feed)."""
        self._feeds.append((resource, cache))

    def put(self, path: str, obj: Obj) -> Obj:
        """Store ``obj`` at ``path`` as if it had been created (no write recorded; fed caches
        see it)."""
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._uid)}")
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = self._next_rv()
        self.objects[path] = stored
        self._notify(path, stored)
        return copy.deepcopy(stored)

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion issued (etcd's current revision)."""
        return self._last_rv

    def _next_rv(self) -> str:
        self._last_rv = next(self._rv)
        return str(self._last_rv)

    def stored(self, path: str) -> Obj | None:
        obj = self.objects.get(path)
        return copy.deepcopy(obj) if obj is not None else None

    # --- KubeClient's surface -------------------------------------------------------------

    def _check_fault(self, method: str, path: str) -> None:
        for fault in self.faults:
            if fault.method in (method, "*") and path.startswith(fault.path_prefix):
                if fault.times == 0:
                    continue
                if fault.times > 0:
                    fault.times -= 1
                raise KubeAPIError(method, path, fault.status, {"reason": "Injected"})

    def _split(self, path: str) -> tuple[str, str | None]:
        for sub in ("/status", "/binding", "/driver"):
            base = path.removesuffix(sub)
            if base != path and base in self.objects:
                return base, sub
        return path, None

    async def request(
        self,
        method: str,
        path: str,
        body: Obj | list[Obj] | None = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        self.requests.append((method, path))
        self._check_fault(method, path)
        if method != "GET":
            self.write_count += 1
            self.writes.append((method, path))
            self.history.append(Write(method, path, copy.deepcopy(body)))
        if method == "GET":
            return self._get(path, params or {})
        assert body is None or isinstance(body, dict)
        if method == "POST":
            out = self._create(path, body or {})
            self._notify(f"{path.rstrip('/')}/{out['metadata']['name']}", out)
        elif method in ("PUT", "PATCH"):
            base, _ = self._split(path)
            out = self._update(path, body or {}, merge=method == "PATCH")
            self._notify(base, self.objects.get(base), out)
        elif method == "DELETE":
            before = self.objects.get(path)
            out = self._delete(path, body or {})
            self._notify(path, self.objects.get(path), before)
        else:
            raise AssertionError(f"unexpected method {method}")
        return out

    def _filter(self, path: str, obj: Obj) -> None:
        for prefix, change in self._write_filters:
            if path.startswith(prefix):
                change(obj)

    def _notify(self, path: str, now: Obj | None, last: Obj | None = None) -> None:
        for resource, cache in self._feeds:
            if _resource_of(path) != resource:
                continue
            if now is not None:
                cache.apply(copy.deepcopy(now))
            elif last is not None:
                cache.remove(copy.deepcopy(last), rv=self.resource_version)

    @staticmethod
    def is_collection(path: str) -> bool:
        parts = path.strip("/").split("/")
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if len(rest) >= 3 and rest[0] == "namespaces":
            rest = rest[2:]
        return len(rest) == 1

    def _get(self, path: str, params: dict[str, Any]) -> Obj:
        obj = self.objects.get(path)
        if obj is not None:
            return copy.deepcopy(obj)
        if not self.is_collection(path):
            raise KubeAPIError("GET", path, 404, {"reason": "NotFound"})
        prefix = path.rstrip("/") + "/"
        items = [
            copy.deepcopy(o)
            for p, o in sorted(self.objects.items())
            if p.startswith(prefix) and "/" not in p[len(prefix) :]
        ]
        selector = params.get("labelSelector")
        if selector:
            wanted = dict(term.split("=", 1) for term in str(selector).split(","))
            items = [
                o
                for o in items
                if all(o["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
            ]
        return {
            "kind": "List",
            "metadata": {"resourceVersion": self._next_rv()},
            "items": items,
        }

    def _create(self, path: str, body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if "name" not in meta:
            meta["name"] = f"{meta.get('generateName', 'obj-')}{next(self._uid):05d}"
        target = f"{path.rstrip('/')}/{meta['name']}"
        parts = path.strip("/").split("/")
        if "namespaces" in parts[:-1]:
            meta["namespace"] = parts[parts.index("namespaces") + 1]  # as the real one does
        if target in self.objects:
            raise KubeAPIError("POST", path, 409, {"reason": "AlreadyExists"})
        meta["uid"] = f"uid-{next(self._uid)}"
        meta["generation"] = 1
        meta["resourceVersion"] = self._next_rv()
        self._filter(target, obj)
        self.objects[target] = obj
        return copy.deepcopy(obj)

    def _update(self, path: str, body: Obj, merge: bool) -> Obj:
        base, sub = self._split(path)
        current = self.objects.get(base)
        if current is None:
            raise KubeAPIError("PATCH" if merge else "PUT", path, 404, {"reason": "NotFound"})
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and str(want) != current["metadata"]["resourceVersion"]:
            raise KubeAPIError("PATCH" if merge else "PUT", path, 409, {"reason": "Conflict"})
        if sub is not None:
            new = copy.deepcopy(current)
            if merge:
                new = _merge(new, {"status": body.get("status")} if "status" in body else {})
            else:
                new["status"] = copy.deepcopy(body.get("status"))
        else:
            new = _merge(current, body) if merge else copy.deepcopy(body)
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])  # the main resource keeps status
            new.setdefault("metadata", {})
            for key in ("uid", "generation", "creationTimestamp"):
                if key in current["metadata"]:
                    new["metadata"][key] = current["metadata"][key]
            if "deletionTimestamp" in current["metadata"]:
                new["metadata"]["deletionTimestamp"] = current["metadata"]["deletionTimestamp"]
            self._filter(base, new)
            if new.get("spec") != current.get("spec"):
                new["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
        new["metadata"]["resourceVersion"] = self._next_rv()
        if "deletionTimestamp" in new["metadata"] and not new["metadata"].get("finalizers"):
            del self.objects[base]  # the last finalizer is gone: so is the object
            return copy.deepcopy(new)
        self.objects[base] = new
        return copy.deepcopy(new)

    def _delete(self, path: str, body: Obj) -> Obj:
        obj = self.objects.get(path)
        if obj is None:
            raise KubeAPIError("DELETE", path, 404, {"reason": "NotFound"})
        preconditions = body.get("preconditions") or {}
        for field in ("resourceVersion", "uid"):
            want = preconditions.get(field)
            if want is not None and str(want) != obj["metadata"].get(field):
                raise KubeAPIError("DELETE", path, 409, {"reason": "Conflict"})
        if obj["metadata"].get("finalizers"):
            # Held until the finalizers are removed; a second delete changes nothing.
            if "deletionTimestamp" not in obj["metadata"]:
                obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                obj["metadata"]["resourceVersion"] = self._next_rv()
            return copy.deepcopy(obj)
        del self.objects[path]
        self._next_rv()
        return {"kind": "Status", "status": "Success"}

    async def get(self, path: str, **params: Any) -> Obj:
        return await self.request("GET", path, params=params or None)

    async def get_or_none(self, path: str) -> Obj | None:
        try:
            return await self.get(path)
        except KubeAPIError as e:
            if e.status == 404:
                return None
            raise

    async def list(self, path: str, **params: Any) -> Obj:
        return await self.get(path, **params)

    async def create(self, path: str, body: Obj) -> Obj:
        return await self.request("POST", path, body)

    async def replace(self, path: str, body: Obj) -> Obj:
        return await self.request("PUT", path, body)

    async def merge_patch(self, path: str, body: Obj) -> Obj:
        return await self.request("PATCH", path, body)

    async def apply(self, path: str, body: Obj, field_manager: str, force: bool = True) -> Obj:
        if path not in self.objects:
            collection = path.rsplit("/", 1)[0]
            return await self.request("POST", collection, body)
        return await self.request("PATCH", path, body)

    async def delete(self, path: str, missing_ok: bool = True, **params: Any) -> None:
        try:
            await self.request("DELETE", path, params=params or None)
        except KubeAPIError as e:
            if not (missing_ok and e.status == 404):
                raise

    async def watch(self, path: str, resource_version: str, **params: Any) -> AsyncIterator[Obj]:
        raise AssertionError("FakeAPIServer does not serve watches; feed informers directly")
        yield {}  # pragma: no cover - makes this an async generator

    async def aclose(self) -> None:
        pass
