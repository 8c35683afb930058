"""dradriver's node driver: prepares allocated devices for pods.

Implements the framework's DRADriver interface. Every step that changes the
node is recorded in the ledger first (two-phase: preparing → prepared,
unpreparing → gone), so a crash at any point is finished or rolled back by
:meth:`NodeDriver.reconcile` at the next start.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from typing import Protocol

from dradriver.api import networkpool as net
from dradriver.api import pinnedparameters as pins
from dradriver.api.opaqueconfig import DeviceConfigError, EffectiveConfig, effective_configs
from dradriver.api.wellknown import CONFLICT_ANNOTATION
from dradriver.host.cdi import CDIDevice, CDIRegistry, check_host_device_nodes
from dradriver.host.containeredits import ContainerEdits
from dradriver.host.hooks import Hook, HookError, run_hook
from dradriver.host.ledger import ClaimDevice, DeviceBusy, DeviceKey, Ledger, LedgerError
from dradriver.host.ledgercommits import GroupCommitter
from dradriver.k8s.client import KubeClient
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger
from dradriver.plugin.claimlock import ClaimLocks
from dradriver.plugin.interface import ClaimRef, PreparedDevice, PrepareResult
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.metrics import PluginMetrics

log = get_logger("kubeletplugin.driver")


class PrepareError(RuntimeError):
    """A claim cannot be prepared; the message goes to the kubelet and the pod's events."""


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


@dataclass(frozen=True)
class PlannedDevice:
    """One allocation result of this driver, resolved against the inventory and config."""

    request: str
    pool: str
    device: str
    share_id: str | None
    admin_access: bool
    config: EffectiveConfig
    network: net.PinnedAttachment | None = None  # set for network-attached devices

    @property
    def cdi_name(self) -> str:
        # Shared devices appear once per share in one claim: the share ID keeps names unique.
        return f"{self.device}-{self.share_id}" if self.share_id else self.device


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
    ) -> None:
        self.client = client
        self.gate = gate
        self.driver_name = driver_name
        self.inventory = inventory
        self.ledger = ledger
        self.cdi = cdi
        self.setup = setup
        self.teardown = teardown
        self.metrics = metrics or PluginMetrics()
        self._locks = ClaimLocks(ledger.path.parent / "claim-locks")
        self._commits = GroupCommitter(ledger)

    # ----- DRADriver ---------------------------------------------------------

    async def prepare_claims(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        results = await asyncio.gather(*(self._prepare_guarded(c) for c in claims))
        return {c.uid: r for c, r in zip(claims, results, strict=True)}

    async def unprepare_claims(self, claims: list[ClaimRef]) -> dict[str, str]:
        errors = await asyncio.gather(*(self._unprepare_guarded(c) for c in claims))
        return {c.uid: e for c, e in zip(claims, errors, strict=True)}

    def handle_error(self, error: BaseException, context: str) -> None:
        log.error("background error", context=context, error=str(error))

    # ----- prepare -----------------------------------------------------------

    async def _prepare_guarded(self, claim: ClaimRef) -> PrepareResult:
        with self.metrics.in_flight.track_inprogress():
            async with self._locks.hold(claim.uid):
                with self.metrics.prepare_seconds.time():
                    try:
                        devices = await self._prepare(claim)
                    except PrepareError as e:
                        self.metrics.prepare_errors.inc()
                        log.warning("prepare failed", claim=str(claim), uid=claim.uid, error=str(e))
                        return PrepareResult(error=str(e))
                    except Exception as e:
                        self.metrics.prepare_errors.inc()
                        log.exception("prepare failed unexpectedly", claim=str(claim))
                        return PrepareResult(error=f"internal error: {e}")
                    finally:
                        self._claims_changed()
        self.metrics.prepares.inc()
        return PrepareResult(devices=devices)

    def _claims_changed(self) -> None:
        if self.gate is not None:
            try:
                self.gate.claims_changed()
            except Exception as e:  # the prepare itself is done; the view catches up later
                self.handle_error(e, "telling the device plugin about a claim change")

    async def _fetch_claim(self, claim: ClaimRef) -> Obj:
        try:
            obj = await self.client.get_or_none(
                path_for(RESOURCE_V1, "resourceclaims", claim.namespace, claim.name)
            )
        except KubeAPIError as e:
            raise PrepareError(f"cannot read ResourceClaim {claim}: {e}") from e
        if obj is None:
            raise PrepareError(f"ResourceClaim {claim} does not exist")
        if obj["metadata"]["uid"] != claim.uid:
            raise PrepareError(
                f"ResourceClaim {claim} was replaced: uid is {obj['metadata']['uid']}, "
                f"the kubelet asked for {claim.uid}"
            )
        return obj

    def plan(self, claim: ClaimRef, obj: Obj) -> list[PlannedDevice]:
        """The devices this node must prepare for the claim, with their merged config."""
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"ResourceClaim {claim} is not allocated")
        conflict = ((obj.get("metadata") or {}).get("annotations") or {}).get(CONFLICT_ANNOTATION)
        if conflict:
            raise PrepareError(
                f"ResourceClaim {claim} is held by dradriver-controller after an allocation "
                f"conflict ({conflict}); it is allocated again once the device is free"
            )
        devices = allocation.get("devices") or {}
        results = [r for r in devices.get("results") or [] if r.get("driver") == self.driver_name]
        if not results:
            raise PrepareError(f"ResourceClaim {claim} has no devices of {self.driver_name}")
        requests = sorted({r["request"] for r in results})
        try:
            # References to DeviceClaimParameters: use what the controller pinned.
            config = pins.substitute(
                self.driver_name, devices.get("config") or [], pins.pinned(obj, self.driver_name)
            )
        except pins.NotPinned as e:
            raise PrepareError(f"ResourceClaim {claim}: {e}") from e
        try:
            configs = effective_configs(self.driver_name, config, requests)
        except DeviceConfigError as e:
            raise PrepareError(f"ResourceClaim {claim}: invalid opaque config: {e}") from e
        planned = []
        for r in results:
            network = None
            if net.is_network_pool(r["pool"]):
                # Attached by the controller to this node; prepared from what it pinned.
                try:
                    network = net.attachment_of(
                        obj, self.driver_name, r["pool"], r["device"], self.inventory.pool
                    )
                except net.NetworkPoolError as e:
                    raise PrepareError(f"ResourceClaim {claim}: {e}") from e
            elif r["pool"] != self.inventory.pool or r["device"] not in self.inventory.devices:
                raise PrepareError(
                    f"ResourceClaim {claim}: device {r['pool']}/{r['device']} is not on this "
                    f"node (pool {self.inventory.pool})"
                )
            planned.append(
                PlannedDevice(
                    request=r["request"],
                    pool=r["pool"],
                    device=r["device"],
                    share_id=r.get("shareID"),
                    admin_access=bool(r.get("adminAccess")),
                    config=configs[r["request"]],
                    network=network,
                )
            )
        return planned

    @staticmethod
    def digest(planned: list[PlannedDevice]) -> str:
        text = json.dumps(
            [
                [p.request, p.pool, p.device, p.share_id, p.admin_access, p.config.model_dump()]
                for p in planned
            ],
            sort_keys=True,
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _cdi_devices(self, claim: ClaimRef, planned: list[PlannedDevice]) -> list[CDIDevice]:
        out = []
        for p in planned:
            env = {"DRADRIVER_CLAIM": f"{claim.namespace}/{claim.name}", **p.config.env}
            if p.network is not None:
                env = {
                    "DRADRIVER_NETWORK_POOL": p.pool,
                    "DRADRIVER_NETWORK_DEVICE": p.device,
                    **p.network.env,
                    **env,
                }
                out.append(CDIDevice(p.cdi_name, ContainerEdits(env=env)))
                continue
            device = self.inventory.devices[p.device]
            out.append(CDIDevice(p.cdi_name, device.edits.merged(ContainerEdits(env=env))))
        return out

    def _hook_env(self, claim: ClaimRef, p: PlannedDevice) -> dict[str, str]:
        return {
            "DRADRIVER_DRIVER": self.driver_name,
            "DRADRIVER_CLAIM_NAMESPACE": claim.namespace,
            "DRADRIVER_CLAIM_NAME": claim.name,
            "DRADRIVER_CLAIM_UID": claim.uid,
            "DRADRIVER_REQUEST": p.request,
            "DRADRIVER_POOL": p.pool,
            "DRADRIVER_DEVICE": p.device,
            "DRADRIVER_SHARE_ID": p.share_id or "",
            "DRADRIVER_ADMIN_ACCESS": "true" if p.admin_access else "false",
            "DRADRIVER_PROFILE": p.config.profile or "",
            "DRADRIVER_SETUP_ARGS": json.dumps(p.config.setup_args),
            "DRADRIVER_CONFIG": p.config.model_dump_json(),
        }

    async def _prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        obj = await self._fetch_claim(claim)
        planned = self.plan(claim, obj)
        digest = self.digest(planned)
        existing = self.ledger.get_claim(claim.uid)
        if existing is not None and existing.state == "prepared":
            if existing.config_digest == digest:
                # Repeated call (kubelet restart, retry): make sure the spec is still there.
                ids = self.cdi.write_claim(claim.uid, self._cdi_devices(claim, planned))
                return self._prepared(planned, ids)
            raise PrepareError(
                f"ResourceClaim {claim} is already prepared with a different allocation or "
                "config; unprepare it first"
            )
        if self.gate is not None:
            for p in planned:
                if p.network is not None:
                    continue  # not one of this node's devices: the shim never has it
                reason = self.gate.refuse_for_dra(p.device)
                if reason:
                    raise PrepareError(f"ResourceClaim {claim}: {reason}")
        if existing is not None:
            # A half-done attempt (crash or failure): undo it before starting over.
            await self._teardown(claim, existing.uid)
        entries = [
            ClaimDevice(
                pool=p.pool,
                device=p.device,
                request_names=[p.request],
                share_id=p.share_id,
                admin_access=p.admin_access,
                exclusive=not (p.admin_access or p.share_id),
                cdi_ids=[],
            )
            for p in planned
        ]
        try:
            await self._commits.run(
                lambda: self.ledger.begin_prepare(
                    claim.uid, claim.namespace, claim.name, entries, digest
                )
            )
        except DeviceBusy as e:
            text = self.gate.explain_busy(e) if self.gate is not None else str(e)
            raise PrepareError(f"ResourceClaim {claim}: {text}") from e
        except LedgerError as e:
            raise PrepareError(f"ResourceClaim {claim}: {e}") from e
        try:
            if self.setup is not None:
                for p in planned:
                    await run_hook(self.setup, self._hook_env(claim, p))
            cdi_devices = self._cdi_devices(claim, planned)
            # After the setup hooks (they may create nodes); a ValueError, so rolled back.
            check_host_device_nodes(cdi_devices)
            ids = self.cdi.write_claim(claim.uid, cdi_devices)
            recorded = {DeviceKey(p.pool, p.device, p.share_id): [ids[p.cdi_name]] for p in planned}
            await self._commits.run(lambda: self.ledger.complete_prepare(claim.uid, recorded))
        except (HookError, OSError, ValueError) as e:
            await self._rollback(claim, planned)
            raise PrepareError(f"ResourceClaim {claim}: {e}") from e
        log.info(
            "prepared",
            claim=str(claim),
            uid=claim.uid,
            devices=",".join(p.cdi_name for p in planned),
        )
        return self._prepared(planned, ids)

    def _prepared(self, planned: list[PlannedDevice], ids: dict[str, str]) -> list[PreparedDevice]:
        # The kubelet matches request names against containers' top-level requests.
        return [
            PreparedDevice(
                (p.request.split("/")[0],), p.pool, p.device, (ids[p.cdi_name],), p.share_id
            )
            for p in planned
        ]

    async def _rollback(self, claim: ClaimRef, planned: list[PlannedDevice]) -> None:
        if self.teardown is not None:
            for p in planned:
                try:
                    await run_hook(self.teardown, self._hook_env(claim, p))
                except HookError as e:
                    log.error("teardown during rollback failed", claim=str(claim), error=str(e))
        self.cdi.remove_claim(claim.uid)
        await self._commits.run(lambda: self.ledger.remove_claim(claim.uid))

    # ----- unprepare ---------------------------------------------------------

    async def _unprepare_guarded(self, claim: ClaimRef) -> str:
        async with self._locks.hold(claim.uid):
            with self.metrics.unprepare_seconds.time():
                try:
                    await self._teardown(claim, claim.uid)
                except (HookError, OSError) as e:
                    self.metrics.unprepare_errors.inc()
                    log.warning("unprepare failed", claim=str(claim), error=str(e))
                    return f"ResourceClaim {claim}: {e}"
                finally:
                    self._claims_changed()
        self._locks.forget(claim.uid)
        self.metrics.unprepares.inc()
        return ""

    async def _teardown(self, claim: ClaimRef, uid: str) -> None:
        entry = self.ledger.get_claim(uid)
        if entry is None:
            # Never prepared here, or already done: the spec may still be an orphan.
            self.cdi.remove_claim(uid)
            return
        await self._commits.run(lambda: self.ledger.begin_unprepare(uid))
        if self.teardown is not None:
            for d in entry.devices:
                env = {
                    "DRADRIVER_DRIVER": self.driver_name,
                    "DRADRIVER_CLAIM_NAMESPACE": entry.namespace,
                    "DRADRIVER_CLAIM_NAME": entry.name,
                    "DRADRIVER_CLAIM_UID": uid,
                    "DRADRIVER_REQUEST": ",".join(d.request_names),
                    "DRADRIVER_POOL": d.pool,
                    "DRADRIVER_DEVICE": d.device,
                    "DRADRIVER_SHARE_ID": d.share_id or "",
                }
                await run_hook(self.teardown, env)
        self.cdi.remove_claim(uid)
        await self._commits.run(lambda: self.ledger.remove_claim(uid))
        log.info("unprepared", claim=f"{entry.namespace}/{entry.name}", uid=uid)

    # ----- start-up reconcile ------------------------------------------------

    async def reconcile(self) -> dict[str, int]:
        """Make the node agree with the ledger and the API server after a (re)start.

        Half-done prepares and unprepares are rolled back or finished; claims no
        longer allocated here are torn down; missing CDI specs (e.g. /var/run/cdi
        wiped by a reboot) are written again; specs nobody owns are deleted.
        """
        counts = {"kept": 0, "regenerated": 0, "torn_down": 0, "orphans": 0}
        for entry in self.ledger.claims():
            claim = ClaimRef(entry.namespace, entry.uid, entry.name)
            keep = entry.state == "prepared"
            obj: Obj | None = None
            if keep:
                try:
                    obj = await self._fetch_claim(claim)
                    planned = self.plan(claim, obj)
                    keep = self.digest(planned) == entry.config_digest
                except PrepareError:
                    keep = False
            if not keep:
                try:
                    await self._teardown(claim, entry.uid)
                    counts["torn_down"] += 1
                except (HookError, OSError) as e:
                    log.error("reconcile teardown failed", claim=str(claim), error=str(e))
                continue
            had_spec = self.cdi.read_claim(entry.uid) is not None
            assert obj is not None
            self.cdi.write_claim(entry.uid, self._cdi_devices(claim, self.plan(claim, obj)))
            counts["kept"] += 1
            counts["regenerated"] += 0 if had_spec else 1
        known = {e.uid for e in self.ledger.claims()}
        orphans = self.cdi.claim_uids_on_disk() - known
        if self.ledger.recovered_from_corruption is not None and orphans:
            # The ledger lost its memory: these specs may belong to running pods. Keep
            # them; a later prepare re-adopts a claim, an unprepare removes its spec.
            log.warning(
                "ledger was recovered from corruption; keeping CDI specs it does not know",
                specs=len(orphans),
                kept_copy=str(self.ledger.recovered_from_corruption),
            )
            orphans = set()
        for uid in orphans:
            self.cdi.remove_claim(uid)
            counts["orphans"] += 1
        log.info("reconciled node state", **counts)
        return counts
