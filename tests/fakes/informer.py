"""An informer cache without a watch (unit tier): tests play the watch events themselves.

Stands in for :class:`dradriver.runtime.informer.Informer`, whose real list+watch runs
against the real apiserver in the cluster tier.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import cast

from dradriver.k8s.objects import Obj


def key_of(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


class FakeInformer:
    """A cache with handlers: :meth:`apply` and :meth:`remove` play watch events."""

    def __init__(self, *objs: Obj) -> None:
        self.cache: dict[str, Obj] = {key_of(o): o for o in objs}
        self.handlers: list[dict[str, Callable[..., None] | None]] = []
        self.synced = True

    def add_handler(self, **handlers: Callable[..., None] | None) -> None:
        self.handlers.append(handlers)

    def add_unreadable_handler(
        self,
        on_unreadable: Callable[[str, Obj], None] | None = None,
        on_cleared: Callable[[str, Obj], None] | None = None,
    ) -> None:
        """Objects too deep to decode: this fake has none (the real informer's tests and
        the controller's finding-3 tests play them)."""

    @property
    def has_synced(self) -> bool:
        return self.synced

    async def wait_for_sync(self) -> None:
        assert self.synced, "a FakeInformer that is not synced never becomes synced"

    def get(self, key: str) -> Obj | None:
        return self.cache.get(key)

    def get_by_name(self, namespace: str, name: str) -> Obj | None:
        return self.cache.get(f"{namespace}/{name}" if namespace else name)

    def items(self) -> list[Obj]:
        return list(self.cache.values())

    def __iter__(self) -> Iterator[Obj]:
        return iter(self.items())

    def apply(self, obj: Obj) -> None:
        obj = copy.deepcopy(obj)
        key = key_of(obj)
        old = self.cache.get(key)
        self.cache[key] = obj
        for h in self.handlers:
            if old is None and h.get("on_add"):
                cast(Callable[[Obj], None], h["on_add"])(obj)
            elif old is not None and h.get("on_update"):
                cast(Callable[[Obj, Obj], None], h["on_update"])(old, obj)

    def remove(self, obj: Obj, rv: int | None = None) -> None:
        if key_of(obj) not in self.cache:
            return  # a watch reports deletes of objects it has seen only
        gone = copy.deepcopy(self.cache.pop(key_of(obj)))
        if rv is not None:
            gone["metadata"]["resourceVersion"] = str(rv)
        for h in self.handlers:
            if h.get("on_delete"):
                cast(Callable[[Obj], None], h["on_delete"])(gone)
