"""Start-up recovery: make the node agree with the ledger and the API server.

Invariants: a claim is torn down only when the API server says it is gone or no
longer allocated here as it was prepared; "unknown" (403, 429, 5xx, a timeout)
keeps the claim, its hold and its spec, and puts it in ``unconfirmed`` to ask again
later. A claim spec the ledger does not know is adopted (its claim is still
allocated here), deleted (its claim is gone), or held from what it names while the
API server cannot say. Every decision about a claim is taken under its lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from dradriver.host.cdi import CDIError
from dradriver.host.hooks import HookError
from dradriver.host.state.claimstore import ClaimStore, same_devices
from dradriver.host.state.schema import ClaimEntry, DeviceBusy, DeviceKey
from dradriver.k8s.objects import Obj
from dradriver.log import get_logger
from dradriver.plugin.claimlock import ClaimLocks
from dradriver.plugin.interface import ClaimRef, claim_ref_problem
from kubeletplugin import planning
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.planning import ClaimUnreadable, PlannedDevice, PrepareError

log = get_logger("kubeletplugin.driver")

# All claim reads of the start-up reconcile together: what is not answered by then is
# checked again in the background (confirm_claims_later), so the plugin still registers.
START_READ_BUDGET_SECONDS = 20.0
READ_CONCURRENCY = 16

Found = Obj | PrepareError | None


def ref(entry: ClaimEntry) -> ClaimRef:
    return ClaimRef(entry.namespace, entry.uid, entry.name)


def _spec_env(device: Mapping[str, Any]) -> dict[str, str]:
    edits = device.get("containerEdits") or {}
    return dict(item.split("=", 1) for item in edits.get("env") or [] if "=" in item)


class RecoveredDriver(Protocol):
    """What recovery needs of the node driver (kubeletplugin.nodedriver.NodeDriver)."""

    store: ClaimStore
    inventory: NodeInventory
    claim_locks: ClaimLocks

    async def fetch_claim(self, claim: ClaimRef) -> Obj: ...

    def plan(self, claim: ClaimRef, obj: Obj) -> list[PlannedDevice]: ...

    def explain_busy(self, error: DeviceBusy) -> str: ...

    def handle_error(self, error: BaseException, context: str) -> None: ...


class Recovery:
    """The node driver's start-up reconcile and its later confirmations."""

    def __init__(self, driver: RecoveredDriver) -> None:
        self.driver = driver
        self.store = driver.store
        # The ledger was lost or corrupt: the first reconcile keeps specs it cannot attribute.
        self.rebuild_pending = driver.store.ledger.needs_rebuild

    async def reconcile(self) -> dict[str, int]:
        """Make the node agree with the ledger and the API server after a (re)start.

        Half-done prepares and unprepares are rolled back or finished; claims no
        longer allocated here are torn down; missing CDI specs (e.g. /var/run/cdi
        wiped by a reboot) are written again. A claim spec the ledger does not
        know (the ledger was lost, or the spec outlived it) is checked against the
        API server: a claim still allocated here is adopted (its spec is proof that
        its devices were set up, and pods may use them), a spec of a claim that is
        gone is deleted, and while the API server cannot say, the claim is held
        from what its spec names. A claim with no spec is in no container, so it
        needs no hold until the kubelet prepares it. Claims the API server did not
        answer for stay as they are, in ``unconfirmed``, for
        :meth:`confirm_claims_later`: the plugin registers without waiting.
        """
        counts = dict.fromkeys(
            ("kept", "regenerated", "adopted", "torn_down", "orphans", "unconfirmed"), 0
        )
        rebuild, self.rebuild_pending = self.rebuild_pending, False
        if rebuild:
            log.warning(
                "no ledger to trust; rebuilding holds from the CDI specs and the API server "
                "(on a node's first start there is nothing to rebuild)",
                reason=self.store.ledger.rebuild_reason,
            )
        entries = self.store.ledger.claims()
        orphans = {
            uid: self.claim_of_spec(uid)
            for uid in sorted(self.store.cdi.claim_uids_on_disk() - {e.uid for e in entries})
        }
        to_read = [ref(e) for e in entries if e.state == "prepared"]
        to_read += [ref(e) for e in orphans.values() if e is not None]
        found = await self._read_claims(to_read, START_READ_BUDGET_SECONDS)
        for entry in entries:
            for outcome in await self._settle(ref(entry), found.get(entry.uid)):
                counts[outcome] += 1
        for uid, from_spec in orphans.items():
            for outcome in await self._settle_orphan(uid, from_spec, found.get(uid), rebuild):
                counts[outcome] += 1
        log.info("reconciled node state", **counts)
        return counts

    async def hold_in_use(self, entries: list[ClaimEntry]) -> dict[str, int]:
        """Claims the kubelet reports in use (:mod:`kubeletplugin.inuse`) that the ledger
        does not know: each is settled like a claim known only from its CDI spec, before
        either API serves. Returns the count keys."""
        known = {e.uid for e in self.store.ledger.claims()}
        fresh = [e for e in entries if e.uid not in known]
        counts = dict.fromkeys(("in_use_adopted", "in_use_unconfirmed", "in_use_gone"), 0)
        if not fresh:
            return counts
        log.warning(
            "the kubelet reports claims in use that the ledger does not hold; holding them "
            "before serving",
            claims=",".join(f"{e.namespace}/{e.name}" for e in fresh),
        )
        found = await self._read_claims([ref(e) for e in fresh], START_READ_BUDGET_SECONDS)
        outcome = {"adopted": "in_use_adopted", "unconfirmed": "in_use_unconfirmed"}
        for entry in fresh:
            settled = await self._settle_orphan(entry.uid, entry, found.get(entry.uid), True)
            for key in settled or ["gone"]:
                counts[outcome.get(key, "in_use_gone")] += 1
        return counts

    async def confirm_unconfirmed(self) -> int:
        """Ask the API server once more about the claims it could not answer for;
        returns how many are still unconfirmed."""
        unconfirmed, ledger = self.store.unconfirmed, self.store.ledger
        claims = [ref(e) for uid in sorted(unconfirmed) if (e := ledger.get_claim(uid))]
        unconfirmed &= {c.uid for c in claims}
        found = await self._read_claims(claims, START_READ_BUDGET_SECONDS)
        for claim in claims:
            await self._settle(claim, found.get(claim.uid))
        return len(unconfirmed)

    async def confirm_claims_later(self, first: float = 1.0, longest: float = 300.0) -> None:
        """Retry :meth:`confirm_unconfirmed` with exponential backoff until none is left."""
        delay = first
        while self.store.unconfirmed:
            await asyncio.sleep(delay)
            try:
                left = await self.confirm_unconfirmed()
            except Exception as e:  # keep the holds and try again
                self.driver.handle_error(e, "confirming claims with the API server")
                left = len(self.store.unconfirmed)
            if left:
                log.info("claims still unconfirmed by the API server", claims=left)
            delay = min(delay * 2, longest)

    async def _read_claims(
        self, claims: list[ClaimRef], budget: float
    ) -> dict[str, Obj | PrepareError]:
        """Each claim's object, or why not; a claim not answered within ``budget`` is
        ClaimUnreadable (the start must not wait for a slow API server)."""
        found: dict[str, Obj | PrepareError] = {
            c.uid: ClaimUnreadable(f"ResourceClaim {c} was not read within {budget:.0f}s")
            for c in claims
        }
        limit = asyncio.Semaphore(READ_CONCURRENCY)

        async def read(claim: ClaimRef) -> None:
            async with limit:
                try:
                    found[claim.uid] = await self.driver.fetch_claim(claim)
                except PrepareError as e:
                    found[claim.uid] = e

        try:
            async with asyncio.timeout(budget):
                await asyncio.gather(*(read(c) for c in claims))
        except TimeoutError:
            log.warning("the API server did not answer for every claim in time", budget=budget)
        return found

    async def _settle(self, claim: ClaimRef, found: Found) -> list[str]:
        """Decide about one ledger entry from what the API server said; the count keys."""
        async with self.driver.claim_locks.hold(claim.uid):
            entry = self.store.ledger.get_claim(claim.uid)
            if entry is None:
                self.store.unconfirmed.discard(claim.uid)
                return []  # unprepared meanwhile (by another plugin instance)
            if entry.state == "prepared":
                if found is None or isinstance(found, ClaimUnreadable):
                    # Unknown is not gone: keep the claim, its hold and its spec.
                    log.warning(
                        "cannot confirm a prepared claim; keeping it and asking again later",
                        claim=str(claim),
                        uid=claim.uid,
                        error=str(found) if found is not None else "not read",
                    )
                    self.store.unconfirmed.add(claim.uid)
                    return ["unconfirmed"]
                self.store.unconfirmed.discard(claim.uid)
                planned = self._plan_or_none(claim, found)
                if planned is not None and entry.recovered and self._same(entry, planned):
                    return await self._adopted(claim, planned)
                if planned is not None and planning.digest(planned) == entry.config_digest:
                    had_spec = self._has_spec(claim.uid)
                    inventory = self.driver.inventory
                    cdi = [planning.cdi_device(inventory, claim, p) for p in planned]
                    self.store.cdi.write_claim(claim.uid, cdi)
                    return ["kept"] if had_spec else ["kept", "regenerated"]
            # Half done, gone, or no longer allocated here as it was prepared.
            try:
                await self.store.unprepare(claim.uid)
            except (HookError, OSError) as e:
                log.error("reconcile teardown failed", claim=str(claim), error=str(e))
                return []
            return ["torn_down"]

    async def _settle_orphan(
        self, uid: str, from_spec: ClaimEntry | None, found: Found, rebuild: bool
    ) -> list[str]:
        """Decide about a claim spec the ledger does not know; the count keys."""
        async with self.driver.claim_locks.hold(uid):
            if self.store.ledger.get_claim(uid) is not None:
                return []  # prepared meanwhile (by another plugin instance)
            if from_spec is None:
                if rebuild:
                    log.warning("keeping a CDI spec that names no claim", uid=uid)
                    return []
                self.store.cdi.remove_claim(uid)
                return ["orphans"]
            claim = ref(from_spec)
            if found is None or isinstance(found, ClaimUnreadable):
                try:
                    await self.store.commits.run(lambda: self.store.ledger.adopt_claim(from_spec))
                except DeviceBusy as e:
                    log.error("cannot hold the devices a CDI spec names", uid=uid, error=str(e))
                    return []
                log.warning(
                    "holding what a CDI spec names until the API server confirms its claim",
                    claim=str(claim),
                    uid=uid,
                    error=str(found) if found is not None else "not read",
                )
                self.store.unconfirmed.add(uid)
                return ["unconfirmed"]
            planned = self._plan_or_none(claim, found)
            if planned is None:
                self.store.cdi.remove_claim(uid)  # gone, or not allocated here any more
                return ["orphans"]
            if not self._same(from_spec, planned):
                # Allocated here again, to other devices: not prepared for those yet,
                # and a spec of a claim allocated here is never deleted.
                log.warning("keeping a CDI spec of an earlier allocation", claim=str(claim))
                return []
            return await self._adopted(claim, planned)

    async def _adopted(self, claim: ClaimRef, planned: list[PlannedDevice]) -> list[str]:
        try:
            await self.store.adopt(planning.claim_plan(self.driver.inventory, claim, planned))
        except DeviceBusy as e:
            text = f"ResourceClaim {claim}: {self.driver.explain_busy(e)}"
            log.error("cannot adopt a prepared claim", claim=str(claim), error=text)
            return []
        return ["adopted"]

    @staticmethod
    def _same(entry: ClaimEntry, planned: list[PlannedDevice]) -> bool:
        return same_devices(entry, {DeviceKey(p.pool, p.device, p.share_id) for p in planned})

    def _plan_or_none(
        self, claim: ClaimRef, found: Obj | PrepareError
    ) -> list[PlannedDevice] | None:
        """The claim's devices here, or None if it is gone or not allocated here as planned."""
        if isinstance(found, PrepareError):
            return None
        try:
            return self.driver.plan(claim, found)
        except PrepareError:
            return None

    def _has_spec(self, uid: str) -> bool:
        try:
            return self.store.cdi.read_claim(uid) is not None
        except CDIError:
            return False  # unreadable: written again

    def claim_of_spec(self, uid: str) -> ClaimEntry | None:
        """A recovered ledger entry rebuilt from the claim's CDI spec alone, or None if the
        spec does not say whose it is.

        Device names on disk are ``<uid>-<device>[-<share id>]`` and every device
        carries ``DRADRIVER_CLAIM=<namespace>/<name>`` (network devices also their
        pool and device). Admin access is not visible there: such a use is held as
        exclusive until the API server says otherwise.
        """
        try:
            spec = self.store.cdi.read_claim(uid)
        except (CDIError, OSError) as e:
            log.warning("unreadable CDI spec", uid=uid, error=str(e))
            return None
        if spec is None:
            return None
        prefix, owner, devices = f"{uid}-", "", []
        for item in spec["devices"]:
            env = _spec_env(item)
            owner = owner or env.get("DRADRIVER_CLAIM", "")
            cdi_name = str(item["name"]).removeprefix(prefix)
            if "DRADRIVER_NETWORK_DEVICE" in env:
                pool, device = (
                    env.get("DRADRIVER_NETWORK_POOL", ""),
                    env["DRADRIVER_NETWORK_DEVICE"],
                )
            else:
                pool, device = self.driver.inventory.pool, self._device_named(cdi_name)
            share = cdi_name.removeprefix(f"{device}-") if cdi_name != device else None
            devices.append(
                {
                    "pool": pool,
                    "device": device,
                    "share_id": share,
                    "cdi_ids": [self.store.cdi.cdi_id(uid, cdi_name)],
                }
            )
        namespace, _, name = owner.partition("/")
        if claim_ref_problem(ClaimRef(namespace, uid, name)):
            return None
        try:
            return ClaimEntry.model_validate(
                {
                    "uid": uid,
                    "namespace": namespace,
                    "name": name,
                    "state": "prepared",
                    "devices": devices,
                    "recovered": True,
                }
            )
        except ValueError as e:
            log.warning("CDI spec does not describe a claim", uid=uid, error=str(e))
            return None

    def _device_named(self, cdi_name: str) -> str:
        """The inventory device a CDI device name stands for (``<device>-<share id>``)."""
        devices = self.driver.inventory.devices
        if cdi_name in devices:
            return cdi_name
        prefixes = [d for d in devices if cdi_name.startswith(f"{d}-")]
        return max(prefixes, key=len) if prefixes else cdi_name
