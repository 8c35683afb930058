"""dradriver's node driver: prepares allocated devices for pods.

Implements the framework's DRADriver interface as an adapter: fetch the claim, plan
its devices (:mod:`kubeletplugin.planning`), and hand the plan to the claim store
(:class:`dradriver.host.state.claimstore.ClaimStore`), which runs the one
transaction (hooks, CDI spec, ledger entry, device metadata) and its one rollback.
Start-up recovery is :mod:`kubeletplugin.recovery`'s.

What the API server says about a claim is one of three answers: the claim
(check its allocation), gone (404, or the name now has another UID), or
unknown (403, 429, 5xx, a timeout). Only "gone" or an allocation that no longer
puts the claim here tears a prepared claim down; "unknown" keeps it and asks
again later.
"""

from __future__ import annotations

from functools import partial
from typing import Protocol

from dradriver.host.cdi import CDIRegistry
from dradriver.host.hooks import Hook, HookError
from dradriver.host.state.claimstore import ClaimStore, SideFiles
from dradriver.host.state.commits import GroupCommitter
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import ClaimMismatchError, DeviceBusy, LedgerError
from dradriver.k8s.client import KubeClient
from dradriver.k8s.objects import Obj
from dradriver.log import get_logger
from dradriver.plugin.claimfetch import fetch_claim
from dradriver.plugin.claimlock import ClaimLocks
from dradriver.plugin.claims import ClaimRunner
from dradriver.plugin.devicemetadata import DeviceMetadataWriter
from dradriver.plugin.interface import ClaimRef, PreparedDevice, PrepareResult
from kubeletplugin import planning
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.planning import ClaimGone, ClaimUnreadable, PlannedDevice, PrepareError
from kubeletplugin.recovery import Recovery

__all__ = ["ClaimGone", "ClaimUnreadable", "NodeDriver", "PlannedDevice", "PrepareError"]

log = get_logger("kubeletplugin.driver")


class ClaimStatusSink(Protocol):
    """Where prepared claims go to have their device status published (claimstatus.py);
    both calls return at once."""

    def prepared(self, claim: ClaimRef, devices: list[PreparedDevice], obj: Obj) -> None:
        """``obj`` is the claim as prepare read it: the first write builds on it."""
        ...

    def unprepared(self, uid: str) -> None: ...


class DRAGate(Protocol):
    """What DRA asks the device-plugin shim (same devices, one ledger)."""

    def refuse_for_dra(self, device: str) -> str | None:
        """Why DRA must not prepare ``device`` (it belongs to the device plugin), or None."""
        ...

    def explain_busy(self, error: DeviceBusy) -> str:
        """The prepare error for a device someone else holds, naming the holder."""
        ...

    def claims_changed(self) -> None:
        """A claim was prepared or unprepared: the device plugin's view may change."""
        ...


class NodeDriver:
    def __init__(
        self,
        *,
        client: KubeClient,
        driver_name: str,
        inventory: NodeInventory,
        ledger: Ledger,
        cdi: CDIRegistry,
        setup: Hook | None = None,
        teardown: Hook | None = None,
        metrics: PluginMetrics | None = None,
        gate: DRAGate | None = None,
        status: ClaimStatusSink | None = None,
        metadata: DeviceMetadataWriter | None = None,
    ) -> None:
        self.client = client
        self.gate = gate
        self.status = status
        self.metadata = metadata
        self.driver_name = driver_name
        self.inventory = inventory
        self.ledger = ledger
        self.cdi = cdi
        self.metrics = metrics or PluginMetrics()
        self.claim_locks = ClaimLocks(ledger.path.parent / "claim-locks")
        self.runner = ClaimRunner(
            client, self, self.claim_locks, metrics=self.metrics.claims, logger=log
        )
        self.store = ClaimStore(
            driver_name=driver_name,
            ledger=ledger,
            cdi=cdi,
            setup=setup,
            teardown=teardown,
            logger=log,
        )
        self.recovery = Recovery(self)
        self.reconcile = self.recovery.reconcile
        self.confirm_unconfirmed = self.recovery.confirm_unconfirmed
        self.confirm_claims_later = self.recovery.confirm_claims_later

    @property
    def unconfirmed(self) -> set[str]:
        """Prepared claims the API server could not confirm or deny at start."""
        return self.store.unconfirmed

    @property
    def _commits(self) -> GroupCommitter:
        return self.store.commits

    # ----- DRADriver (the framework's runner: validate, lock, fetch) -----------

    async def prepare_claims(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        try:
            return await self.runner.prepare_claims(claims)
        finally:
            self._claims_changed()

    async def unprepare_claims(self, claims: list[ClaimRef]) -> dict[str, str]:
        try:
            return await self.runner.unprepare_claims(claims)
        finally:
            self._claims_changed()

    def handle_error(self, error: BaseException, context: str) -> None:
        log.error("background error", context=context, error=str(error))

    # ----- ClaimDriver: one claim, fetched and locked ------------------------

    async def prepare(self, claim: ClaimRef, obj: Obj) -> PrepareResult:
        try:
            devices = await self._prepare(claim, obj)
        except PrepareError as e:
            return PrepareResult(error=str(e))
        if self.status is not None:
            # Queued: API latency stays out of prepare; the claim as read saves a GET.
            self.status.prepared(claim, devices, obj)
        return PrepareResult(devices=devices)

    async def unprepare(self, claim: ClaimRef) -> str:
        if self.status is not None:
            self.status.unprepared(claim.uid)
        remove = None if self.metadata is None else partial(self.metadata.unprepared, claim)
        try:
            await self.store.unprepare(claim.uid, remove)
        except (HookError, OSError) as e:
            return f"ResourceClaim {claim}: {e}"
        return ""

    def _claims_changed(self) -> None:
        if self.gate is not None:
            try:
                self.gate.claims_changed()
            except Exception as e:  # the prepare itself is done; the view catches up later
                self.handle_error(e, "telling the device plugin about a claim change")

    async def fetch_claim(self, claim: ClaimRef) -> Obj:
        """The claim as the kubelet named it; ClaimGone or ClaimUnreadable otherwise."""
        found = await fetch_claim(self.client, claim)
        if found.obj is None:
            raise (ClaimGone if found.gone else ClaimUnreadable)(found.problem)
        return found.obj

    def plan(self, claim: ClaimRef, obj: Obj) -> list[PlannedDevice]:
        """The devices this node must prepare for the claim, with their merged config."""
        return planning.plan(self.driver_name, self.inventory, claim, obj)

    digest = staticmethod(planning.digest)

    def explain_busy(self, error: DeviceBusy) -> str:
        return self.gate.explain_busy(error) if self.gate is not None else str(error)

    async def _prepare(self, claim: ClaimRef, obj: Obj) -> list[PreparedDevice]:
        """The prepared devices: one transaction of the claim store."""
        planned = self.plan(claim, obj)
        ids = {p.cdi_name: self.cdi.cdi_id(claim.uid, p.cdi_name) for p in planned}
        devices = planning.prepared_devices(planned, ids)
        metadata = self.metadata
        files = None if metadata is None else metadata.plan(claim, obj, devices)
        side = None
        if metadata is not None and files is not None:
            side = SideFiles(partial(metadata.write, files), partial(metadata.unprepared, claim))
        work = planning.claim_plan(
            self.inventory, claim, planned, side_files=side, refused=self._refusal(claim, planned)
        )
        try:
            done = await self.store.prepare(work)
        except ClaimMismatchError as e:
            raise PrepareError(str(e)) from e
        except DeviceBusy as e:
            raise PrepareError(f"ResourceClaim {claim}: {self.explain_busy(e)}") from e
        except (HookError, OSError, ValueError, LedgerError) as e:
            raise PrepareError(f"ResourceClaim {claim}: {e}") from e
        devices = planning.prepared_devices(planned, done.ids)
        if done.side_files and files is not None:
            devices = DeviceMetadataWriter.with_ids(devices, files)
        return devices

    def _refusal(self, claim: ClaimRef, planned: list[PlannedDevice]) -> PrepareError | None:
        """Why the device plugin keeps one of the devices from DRA, or None."""
        if self.gate is None:
            return None
        for p in planned:
            if p.network is not None:
                continue  # not one of this node's devices: the shim never has it
            reason = self.gate.refuse_for_dra(p.device)
            if reason:
                return PrepareError(f"ResourceClaim {claim}: {reason}")
        return None
