"""The conflict index: who uses which device, and whether a new use conflicts.

Conflict rules (Kubernetes semantics):
  * admin-access uses never conflict and never block: they do not take the device;
  * an exclusive use conflicts with every other non-admin use by another holder;
  * non-exclusive shared uses (consumable capacity, ``share_id`` set) coexist;
  * a device-plugin hold is always exclusive.

Invariant: :class:`Holds` indexes exactly the claims and holds it stores, so a
conflict check costs the uses of the devices asked for, not the whole ledger.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from dradriver.host.state.schema import (
    ClaimDevice,
    ClaimEntry,
    ClaimHolder,
    DeviceRef,
    Holder,
    LedgerData,
    PluginHold,
    PluginHolder,
)

Mode = Literal["exclusive", "shared", "admin"]
Owner = tuple[str, ...]  # ("claim", uid) or ("plugin", pod uid, container)


def claim_mode(device: ClaimDevice) -> Mode:
    if device.admin_access:
        return "admin"
    return "exclusive" if device.exclusive else "shared"


@dataclass(frozen=True)
class Use:
    mode: Mode
    holder: Holder


class Holds:
    """Claims and device-plugin holds, indexed by device.

    The index makes a conflict check cost the uses of the devices asked for, not
    the whole ledger, so a transaction of n changes is O(n), not O(n^2).
    """

    def __init__(self, data: LedgerData) -> None:
        self.claims: dict[str, ClaimEntry] = {}
        self.plugin: dict[tuple[str, str], PluginHold] = {}
        self.by_device: dict[DeviceRef, dict[Owner, list[Use]]] = {}
        for c in data.claims:
            self.set_claim(c.uid, c)
        for h in data.plugin_holds:
            self.set_hold(h.key, h)

    def snapshot(self) -> LedgerData:
        return LedgerData(
            claims=[self.claims[k] for k in sorted(self.claims)],
            plugin_holds=[self.plugin[k] for k in sorted(self.plugin)],
        )

    def _unindex(self, owner: Owner, refs: Iterable[DeviceRef]) -> None:
        for ref in refs:
            owners = self.by_device.get(ref)
            if owners is not None:
                owners.pop(owner, None)
                if not owners:
                    del self.by_device[ref]

    def _index(self, owner: Owner, ref: DeviceRef, use: Use) -> None:
        self.by_device.setdefault(ref, {}).setdefault(owner, []).append(use)

    def set_claim(self, uid: str, entry: ClaimEntry | None) -> ClaimEntry | None:
        """Replace (or with None remove) the claim's entry; returns the one it had."""
        owner = ("claim", uid)
        old = self.claims.pop(uid, None)
        if old is not None:
            self._unindex(owner, (d.ref for d in old.devices))
        if entry is not None:
            self.claims[uid] = entry
            for d in entry.devices:
                holder = ClaimHolder(
                    uid=entry.uid,
                    namespace=entry.namespace,
                    name=entry.name,
                    state=entry.state,
                    request_names=tuple(d.request_names),
                    share_id=d.share_id,
                    admin_access=d.admin_access,
                    exclusive=d.exclusive,
                )
                self._index(owner, d.ref, Use(claim_mode(d), holder))
        return old

    def set_hold(self, key: tuple[str, str], hold: PluginHold | None) -> PluginHold | None:
        owner = ("plugin", *key)
        old = self.plugin.pop(key, None)
        if old is not None:
            self._unindex(owner, old.devices)
        if hold is not None:
            self.plugin[key] = hold
            holder = PluginHolder(
                resource=hold.resource,
                pod_uid=hold.pod_uid,
                container=hold.container,
                state=hold.state,
            )
            for ref in hold.devices:
                self._index(owner, ref, Use("exclusive", holder))
        return old

    def conflicts(
        self, wanted: Iterable[tuple[DeviceRef, Mode]], me: Owner
    ) -> list[tuple[DeviceRef, list[Holder]]]:
        found: dict[DeviceRef, list[Holder]] = {}
        for ref, mode in wanted:
            if mode == "admin":
                continue
            for owner, uses in self.by_device.get(ref, {}).items():
                if owner == me:
                    continue
                for use in uses:
                    if use.mode == "admin":
                        continue
                    if mode == "exclusive" or use.mode == "exclusive":
                        bucket = found.setdefault(ref, [])
                        if use.holder not in bucket:
                            bucket.append(use.holder)
        return list(found.items())
