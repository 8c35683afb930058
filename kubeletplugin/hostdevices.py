"""The node's host-device profiles (``sources[].host``): how shared ones are published, and
their hot-plug watch.

Invariants:

* Sharing by count is published as consumable capacity only when the start-up probe saw the
  cluster keep it (``allowMultipleAllocations`` and a capacity with a request policy);
  otherwise, and when the probe could not tell, as N slot devices naming the same host
  node, which every release from 1.34 serves. One configuration serves both; the choice is
  made once, before the first slice is published, and said in the start-up line. Profiles
  whose extended resource the device-plugin shim serves are always slot devices (the
  device-plugin API has no capacity): :meth:`HostDevices.slots_for`.
* A change under a profile's watched directories (a node or a by-id/by-path link made,
  removed or renamed) reaches ``on_change`` within the watcher's debounce (50 ms): the
  owner rediscovers, republishes and reports health at once, not at the next health tick.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from dradriver.devices.hostdev.source import HostDeviceSource
from dradriver.devices.hostdev.watch import HotplugWatcher
from dradriver.log import get_logger
from dradriver.resourceslice.capabilities import CONSUMABLE, Missing

log = get_logger("kubeletplugin.inventory")

CAPACITY = "consumable capacity"
SLOTS = "slot devices"


def sharing_form(missing: Sequence[Missing] | None) -> str:
    """How shared host devices are published, from the probe's answer (None: no answer)."""
    if missing is None or any(m.feature == CONSUMABLE for m in missing):
        return SLOTS
    return CAPACITY


class HostDevices:
    """The host-device sources among a node's sources, their sharing form and watch."""

    def __init__(self, sources: Iterable[object], on_change: Callable[[], None]) -> None:
        self.sources = [s for s in sources if isinstance(s, HostDeviceSource)]
        self._on_change = on_change
        self._watcher: HotplugWatcher | None = None
        self._slots_only: frozenset[str] = frozenset()
        self.form = SLOTS
        self.use(SLOTS)

    def slots_for(self, extended_resources: Iterable[str]) -> None:
        """Profiles with one of these ``extendedResourceName`` stay slot devices whatever
        :meth:`use` says (call before it)."""
        self._slots_only = frozenset(extended_resources)

    def use(self, form: str) -> None:
        """Publish shared profiles as ``form`` (:data:`CAPACITY` or :data:`SLOTS`)."""
        self.form = form
        for source in self.sources:
            name = source.config.extended_resource_name
            source.consumable_capacity = form == CAPACITY and name not in self._slots_only

    @property
    def shared(self) -> bool:
        """Whether any profile is shared by count (so the form matters)."""
        return any(source.shared for source in self.sources)

    def start(self) -> None:
        """Watch every profile's directories (on the running event loop)."""
        if not self.sources or self._watcher is not None:
            return
        self._watcher = HotplugWatcher(self._changed)
        for source in self.sources:
            self._watcher.watch(source.name, source.watch_dirs())
        self._watcher.start()

    def _changed(self, keys: frozenset[str]) -> None:
        log.debug("host devices changed", sources=",".join(sorted(keys)))
        self._on_change()

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
