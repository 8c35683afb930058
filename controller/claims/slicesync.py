"""What the allocation worker's child holds of the ResourceSlices, and what it lacks.

Invariants:

* A :class:`SliceSnapshot` names, by its ``generation``, one set of slices and classes;
  the parent makes a new one whenever a slice or class changes.
* A :class:`SliceDelta` between the slices the child holds (by name) and a snapshot
  carries exactly the slices the child's copy lacks (another object with another
  ``resourceVersion``, or no copy) and the names of those gone: applied to that copy it
  gives the snapshot's slices. With nothing held it is a reset carrying every slice.
* The child keeps each unchanged slice's object, so its
  :class:`~dradriver.allocator.inventory.PoolCache` reuses that slice's pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from dradriver.k8s.objects import Obj, meta, name_of

__all__ = ["SliceDelta", "SliceSnapshot"]


@dataclass(frozen=True)
class SliceSnapshot:
    """The ResourceSlices and DeviceClasses to allocate from; ``generation`` names them."""

    generation: int
    slices: tuple[Obj, ...]
    classes: tuple[Obj, ...]

    @cached_property
    def by_name(self) -> dict[str, Obj]:
        """The slices by name (made once per snapshot: the delta and the parent's record of
        what the child holds both read it)."""
        return {name_of(s): s for s in self.slices}


@dataclass(frozen=True)
class SliceDelta:
    """What the child's copy of the slices lacks to be snapshot ``generation``.

    ``reset``: the child drops its copy first (a new child: ``changed`` is every slice).
    """

    generation: int
    changed: tuple[Obj, ...]
    removed: tuple[str, ...]
    classes: tuple[Obj, ...]
    reset: bool = False

    @classmethod
    def between(cls, sent: Mapping[str, Obj], snapshot: SliceSnapshot) -> SliceDelta:
        """From the slices the child holds (by name) to ``snapshot``; with nothing sent,
        a reset."""
        current = snapshot.by_name
        return cls(
            snapshot.generation,
            tuple(s for name, s in current.items() if not _same(sent.get(name), s)),
            tuple(name for name in sent if name not in current),
            snapshot.classes,
            reset=not sent,
        )

    def apply(self, slices: dict[str, Obj]) -> None:
        """Make ``slices`` (the child's copy, by name) the snapshot's."""
        if self.reset:
            slices.clear()
        for name in self.removed:
            slices.pop(name, None)
        for item in self.changed:
            slices[name_of(item)] = item


def _same(sent: Obj | None, item: Obj) -> bool:
    """The child's copy is ``item``: the same object, or the same resourceVersion of it."""
    if sent is None:
        return False
    if sent is item:
        return True
    version = str(meta(item).get("resourceVersion") or "")
    return bool(version) and version == str(meta(sent).get("resourceVersion"))
