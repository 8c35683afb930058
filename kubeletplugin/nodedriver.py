"""dradriver's node driver: prepares allocated devices for pods.

Implements the framework's DRADriver interface. Every step that changes the
node is recorded in the ledger first (two-phase: preparing → prepared,
unpreparing → gone), so a crash at any point is finished or rolled back by
:meth:`NodeDriver.reconcile` at the next start.

What the API server says about a claim is one of three answers: the claim
(check its allocation), gone (404, or the name now has another UID), or
unknown (403, 429, 5xx, a timeout). Only "gone" or an allocation that no longer
puts the claim here tears a prepared claim down; "unknown" keeps it and asks
again later.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dradriver.api import networkpool as net
from dradriver.api import pinnedparameters as pins
from dradriver.api.opaqueconfig import DeviceConfigError, EffectiveConfig, effective_configs
from dradriver.api.wellknown import CONFLICT_ANNOTATION
from dradriver.host.cdi import CDIDevice, CDIError, CDIRegistry, check_host_device_nodes
from dradriver.host.containeredits import ContainerEdits
from dradriver.host.hooks import Hook, HookError, run_hook
from dradriver.host.state.commits import GroupCommitter
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import ClaimDevice, ClaimEntry, DeviceBusy, DeviceKey, LedgerError
from dradriver.k8s.client import KubeClient
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger
from dradriver.plugin.claimlock import ClaimLocks
from dradriver.plugin.interface import ClaimRef, PreparedDevice, PrepareResult, claim_ref_problem
from kubeletplugin.devicemetadata import DeviceMetadataWriter
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.metrics import PluginMetrics

log = get_logger("kubeletplugin.driver")

# One GET of a claim; the client's own read timeout is long enough for watches.
CLAIM_READ_SECONDS = 10.0
# All claim reads of the start-up reconcile together: what is not answered by then is
# checked again in the background (confirm_claims_later), so the plugin still registers.
START_READ_BUDGET_SECONDS = 20.0
READ_CONCURRENCY = 16
# The merged config goes to hooks as one environment variable (DRADRIVER_CONFIG);
# Linux refuses a single one over 128 KiB (MAX_ARG_STRLEN).
MAX_CONFIG_BYTES = 64 * 1024


class PrepareError(RuntimeError):
    """A claim cannot be prepared; the message goes to the kubelet and the pod's events."""


class ClaimGone(PrepareError):
    """The claim the kubelet named does not exist any more (404, or its name has another UID)."""


class ClaimUnreadable(PrepareError):
    """The API server could not say (403, 429, 5xx, a timeout): unknown, ask again later."""


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


def _config_strings(config: EffectiveConfig) -> Iterator[tuple[str, str]]:
    for key, value in config.env.items():
        yield f"env name {key!r}", key
        yield f"env[{key!r}]", value
    if config.profile is not None:
        yield "profile", config.profile
    for i, arg in enumerate(config.setup_args):
        yield f"setupArgs[{i}]", arg


def config_problem(config: EffectiveConfig) -> str | None:
    """Why a merged config cannot reach a hook's environment or a container, or None.

    Environment strings are C strings (no NUL) in UTF-8 (no lone surrogates), and a
    single variable is limited in size.
    """
    for where, text in _config_strings(config):
        if "\x00" in text:
            return f"{where} contains a NUL character"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return f"{where} is not valid UTF-8 (it contains a lone surrogate)"
    size = len(config.model_dump_json().encode())
    if size > MAX_CONFIG_BYTES:
        return f"the merged config is {size} bytes; at most {MAX_CONFIG_BYTES} are passed to hooks"
    return None


def _spec_env(device: Mapping[str, Any]) -> dict[str, str]:
    edits = device.get("containerEdits") or {}
    return dict(item.split("=", 1) for item in edits.get("env") or [] if "=" in item)


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
        self.setup = setup
        self.teardown = teardown
        self.metrics = metrics or PluginMetrics()
        self.claim_locks = ClaimLocks(ledger.path.parent / "claim-locks")
        self._commits = GroupCommitter(ledger)
        # Prepared claims the API server could not confirm or deny at start.
        self.unconfirmed: set[str] = set()
        # The ledger was lost or corrupt: the first reconcile keeps specs it cannot attribute.
        self._rebuild_pending = ledger.needs_rebuild

    # ----- DRADriver ---------------------------------------------------------

    async def prepare_claims(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        try:
            results = await asyncio.gather(*(self._prepare_guarded(c) for c in claims))
        finally:
            self._claims_changed()
        return {c.uid: r for c, r in zip(claims, results, strict=True)}

    async def unprepare_claims(self, claims: list[ClaimRef]) -> dict[str, str]:
        try:
            errors = await asyncio.gather(*(self._unprepare_guarded(c) for c in claims))
        finally:
            self._claims_changed()
        return {c.uid: e for c, e in zip(claims, errors, strict=True)}

    def handle_error(self, error: BaseException, context: str) -> None:
        log.error("background error", context=context, error=str(error))

    # ----- prepare -----------------------------------------------------------

    async def _prepare_guarded(self, claim: ClaimRef) -> PrepareResult:
        problem = claim_ref_problem(claim)
        if problem:
            self.metrics.prepare_errors.inc()
            return PrepareResult(error=f"ResourceClaim {claim}: {problem}")
        with self.metrics.in_flight.track_inprogress():
            async with self.claim_locks.hold(claim.uid):
                with self.metrics.prepare_seconds.time():
                    try:
                        devices, obj = await self._prepare(claim)
                    except PrepareError as e:
                        self.metrics.prepare_errors.inc()
                        log.warning("prepare failed", claim=str(claim), uid=claim.uid, error=str(e))
                        return PrepareResult(error=str(e))
                    except Exception as e:
                        self.metrics.prepare_errors.inc()
                        log.exception("prepare failed unexpectedly", claim=str(claim))
                        return PrepareResult(error=f"internal error: {e}")
        self.metrics.prepares.inc()
        if self.status is not None:
            # Queued: API latency stays out of prepare; the claim as read saves a GET.
            self.status.prepared(claim, devices, obj)
        return PrepareResult(devices=devices)

    def _claims_changed(self) -> None:
        if self.gate is not None:
            try:
                self.gate.claims_changed()
            except Exception as e:  # the prepare itself is done; the view catches up later
                self.handle_error(e, "telling the device plugin about a claim change")

    async def _fetch_claim(self, claim: ClaimRef) -> Obj:
        """The claim as the kubelet named it; ClaimGone or ClaimUnreadable otherwise."""
        try:
            async with asyncio.timeout(CLAIM_READ_SECONDS):
                obj = await self.client.get_or_none(
                    path_for(RESOURCE_V1, "resourceclaims", claim.namespace, claim.name)
                )
        except (KubeAPIError, OSError) as e:  # TransportError and timeouts are OSErrors
            raise ClaimUnreadable(
                f"cannot read ResourceClaim {claim}: {e or type(e).__name__}"
            ) from e
        if obj is None:
            raise ClaimGone(f"ResourceClaim {claim} does not exist")
        if obj["metadata"]["uid"] != claim.uid:
            raise ClaimGone(
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
        for request in requests:
            problem = config_problem(configs[request])
            if problem:
                raise PrepareError(
                    f"ResourceClaim {claim}: invalid opaque config for request {request}: {problem}"
                )
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

    @staticmethod
    def _ledger_devices(
        planned: list[PlannedDevice], ids: Mapping[str, str] | None = None
    ) -> list[ClaimDevice]:
        return [
            ClaimDevice(
                pool=p.pool,
                device=p.device,
                request_names=[p.request],
                share_id=p.share_id,
                admin_access=p.admin_access,
                exclusive=not (p.admin_access or p.share_id),
                cdi_ids=[ids[p.cdi_name]] if ids is not None else [],
            )
            for p in planned
        ]

    async def _prepare(self, claim: ClaimRef) -> tuple[list[PreparedDevice], Obj]:
        """The prepared devices, and the claim as read (for its status)."""
        obj = await self._fetch_claim(claim)
        return await self._prepare_read(claim, obj), obj

    async def _prepare_read(self, claim: ClaimRef, obj: Obj) -> list[PreparedDevice]:
        planned = self.plan(claim, obj)
        digest = self.digest(planned)
        if self.setup is None and self.gate is None:
            # The usual case, a claim the ledger does not know yet, takes one trip to the
            # ledger's worker thread: read, spec, record. A known claim takes the path below.
            outcome = await self._first_prepare(claim, obj, planned, digest)
            if not isinstance(outcome, ClaimEntry):
                log.info(
                    "prepared",
                    claim=str(claim),
                    uid=claim.uid,
                    devices=",".join(p.cdi_name for p in planned),
                )
                return outcome
            existing: ClaimEntry | None = outcome
        else:
            existing = await self._commits.read(lambda: self.ledger.get_claim(claim.uid))
        if existing is not None and existing.state == "prepared":
            if existing.recovered and self._same_devices(existing, planned):
                # Rebuilt from its CDI spec after the ledger was lost: set up already.
                ids = await self._adopt(claim, planned, digest)
                self.unconfirmed.discard(claim.uid)
                return await self._with_metadata(claim, obj, self._prepared(planned, ids))
            if existing.config_digest == digest:
                # Repeated call (kubelet restart, retry): make sure the spec is still there.
                ids = self.cdi.write_claim(claim.uid, self._cdi_devices(claim, planned))
                self.unconfirmed.discard(claim.uid)
                return await self._with_metadata(claim, obj, self._prepared(planned, ids))
            if not existing.recovered:
                raise PrepareError(
                    f"ResourceClaim {claim} is already prepared with a different allocation "
                    "or config; unprepare it first"
                )
        if self.gate is not None:
            for p in planned:
                if p.network is not None:
                    continue  # not one of this node's devices: the shim never has it
                reason = self.gate.refuse_for_dra(p.device)
                if reason:
                    raise PrepareError(f"ResourceClaim {claim}: {reason}")
        if existing is not None:
            # A half-done attempt (crash or failure), or a stale recovered entry: undo it
            # before starting over.
            await self._teardown(claim, existing.uid)
        if self.setup is None:
            ids = await self._prepare_in_one_write(claim, planned, digest)
            log.info(
                "prepared",
                claim=str(claim),
                uid=claim.uid,
                devices=",".join(p.cdi_name for p in planned),
            )
            return await self._with_metadata(claim, obj, self._prepared(planned, ids))
        entries = self._ledger_devices(planned)
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
        except Exception as e:
            # Whatever failed, the claim must not stay "preparing", holding its devices.
            await self._rollback(claim, planned)
            if isinstance(e, HookError | OSError | ValueError | LedgerError):
                raise PrepareError(f"ResourceClaim {claim}: {e}") from e
            raise
        log.info(
            "prepared",
            claim=str(claim),
            uid=claim.uid,
            devices=",".join(p.cdi_name for p in planned),
        )
        return await self._with_metadata(claim, obj, self._prepared(planned, ids))

    async def _first_prepare(
        self, claim: ClaimRef, obj: Obj, planned: list[PlannedDevice], digest: str
    ) -> list[PreparedDevice] | ClaimEntry:
        """:meth:`_prepare_in_one_write` for a claim the ledger does not know, in one change
        run by the group committer: the prepared devices, or the claim's entry if it has one
        (then nothing was changed). The device metadata files are written in the same change,
        after the entry (a failed metadata write fails neither this claim nor the batch's
        others). Without a gate only: the shim's answers belong on the loop."""
        cdi_devices = self._cdi_devices(claim, planned)
        ids = {d.name: self.cdi.cdi_id(claim.uid, d.name) for d in cdi_devices}
        entries = self._ledger_devices(planned, ids)
        devices = self._prepared(planned, ids)
        metadata = None if self.metadata is None else self.metadata.plan(claim, obj, devices)
        wrote_spec = wrote_metadata = False

        def change() -> list[PreparedDevice] | ClaimEntry:
            nonlocal wrote_spec, wrote_metadata
            existing = self.ledger.get_claim(claim.uid)
            if existing is not None:
                return existing
            check_host_device_nodes(cdi_devices)
            wrote_spec = True
            self.cdi.write_claim(claim.uid, cdi_devices)
            self.ledger.record_prepared(claim.uid, claim.namespace, claim.name, entries, digest)
            if self.metadata is None or metadata is None:
                return devices
            wrote_metadata = True
            try:
                return self.metadata.written(metadata, devices)
            except Exception as e:  # the claim is recorded: only its metadata is lost
                log.exception("device metadata not written", claim=str(claim), error=str(e))
                return devices

        try:
            return await self._commits.run(change)
        except BaseException as e:
            if wrote_spec:  # refused, or the batch's write failed: never handed out
                try:
                    self.cdi.remove_claim(claim.uid)
                except OSError as removing:
                    log.error(
                        "removing the CDI spec of a failed prepare failed",
                        claim=str(claim),
                        error=str(removing),
                    )
            if wrote_metadata and self.metadata is not None:
                self.metadata.unprepared(claim)  # logs its own failure
            if isinstance(e, DeviceBusy | LedgerError | OSError | ValueError):
                raise PrepareError(f"ResourceClaim {claim}: {e}") from e
            raise

    async def _prepare_in_one_write(
        self, claim: ClaimRef, planned: list[PlannedDevice], digest: str
    ) -> dict[str, str]:
        """Prepare a claim no setup hook works on: its CDI spec, then one durable ledger write.

        Nothing outside the plugin changes before the kubelet gets the answer (the spec names
        the claim UID, so no container can use it before then), so the two-phase entry buys
        nothing here and would cost a second fsynced write. A crash between the spec and the
        ledger write leaves a spec the ledger does not know: start-up adopts its claim if it is
        still allocated here, else deletes it (:meth:`reconcile`). A refused or failed ledger
        write removes the spec again.
        """
        cdi_devices = self._cdi_devices(claim, planned)
        try:
            check_host_device_nodes(cdi_devices)
            ids = self.cdi.write_claim(claim.uid, cdi_devices)
        except (OSError, ValueError) as e:
            raise PrepareError(f"ResourceClaim {claim}: {e}") from e
        entries = self._ledger_devices(planned, ids)
        try:
            await self._commits.run(
                lambda: self.ledger.record_prepared(
                    claim.uid, claim.namespace, claim.name, entries, digest
                )
            )
        except BaseException as e:
            try:
                self.cdi.remove_claim(claim.uid)
            except OSError as removing:
                log.error(
                    "removing the CDI spec of a failed prepare failed",
                    claim=str(claim),
                    error=str(removing),
                )
            if isinstance(e, DeviceBusy):
                text = self.gate.explain_busy(e) if self.gate is not None else str(e)
                raise PrepareError(f"ResourceClaim {claim}: {text}") from e
            if isinstance(e, LedgerError | OSError):
                raise PrepareError(f"ResourceClaim {claim}: {e}") from e
            raise
        return ids

    async def _adopt(
        self, claim: ClaimRef, planned: list[PlannedDevice], digest: str
    ) -> dict[str, str]:
        """Record what the API server says about a claim whose devices are set up already
        (its spec survived a lost ledger); write its spec as prepare would."""
        ids = {p.cdi_name: self.cdi.cdi_id(claim.uid, p.cdi_name) for p in planned}
        entry = ClaimEntry(
            uid=claim.uid,
            namespace=claim.namespace,
            name=claim.name,
            state="prepared",
            devices=self._ledger_devices(planned, ids),
            config_digest=digest,
        )
        try:
            await self._commits.run(lambda: self.ledger.adopt_claim(entry))
        except DeviceBusy as e:
            text = self.gate.explain_busy(e) if self.gate is not None else str(e)
            raise PrepareError(f"ResourceClaim {claim}: {text}") from e
        return self.cdi.write_claim(claim.uid, self._cdi_devices(claim, planned))

    @staticmethod
    def _same_devices(entry: ClaimEntry, planned: list[PlannedDevice]) -> bool:
        """The entry holds exactly the device uses the allocation asks for."""
        wanted = {DeviceKey(p.pool, p.device, p.share_id) for p in planned}
        return len(wanted) == len(entry.devices) and wanted == {d.key for d in entry.devices}

    async def _with_metadata(
        self, claim: ClaimRef, obj: Obj, devices: list[PreparedDevice]
    ) -> list[PreparedDevice]:
        """The devices with the device-metadata CDI IDs (devicemetadata.py), if enabled; the
        files are written in a worker thread, off the loop that serves every other claim."""
        if self.metadata is None:
            return devices
        files = self.metadata.plan(claim, obj, devices)
        if files is None:
            return devices
        return await asyncio.to_thread(self.metadata.written, files, devices)

    def _prepared(self, planned: list[PlannedDevice], ids: dict[str, str]) -> list[PreparedDevice]:
        # The kubelet matches request names against containers' top-level requests.
        return [
            PreparedDevice(
                (p.request.split("/")[0],), p.pool, p.device, (ids[p.cdi_name],), p.share_id
            )
            for p in planned
        ]

    async def _rollback(self, claim: ClaimRef, planned: list[PlannedDevice]) -> None:
        """Undo a failed prepare, best effort: each step is tried even if one before failed."""
        if self.teardown is not None:
            for p in planned:
                try:
                    await run_hook(self.teardown, self._hook_env(claim, p))
                except Exception as e:
                    log.error("teardown during rollback failed", claim=str(claim), error=str(e))
        try:
            self.cdi.remove_claim(claim.uid)
        except OSError as e:
            log.error(
                "removing the CDI spec during rollback failed", claim=str(claim), error=str(e)
            )
        await self._commits.run(lambda: self.ledger.remove_claim(claim.uid))

    # ----- unprepare ---------------------------------------------------------

    async def _unprepare_guarded(self, claim: ClaimRef) -> str:
        problem = claim_ref_problem(claim)
        if problem:
            self.metrics.unprepare_errors.inc()
            return f"ResourceClaim {claim}: {problem}"
        if self.status is not None:
            self.status.unprepared(claim.uid)
        async with self.claim_locks.hold(claim.uid):
            with self.metrics.unprepare_seconds.time():
                try:
                    await self._teardown(claim, claim.uid, with_metadata=True)
                except (HookError, OSError) as e:
                    self.metrics.unprepare_errors.inc()
                    log.warning("unprepare failed", claim=str(claim), error=str(e))
                    return f"ResourceClaim {claim}: {e}"
        self.metrics.unprepares.inc()
        return ""

    async def _teardown(self, claim: ClaimRef, uid: str, with_metadata: bool = False) -> None:
        """Undo a claim's preparation; ``with_metadata`` (an unprepare) also removes its
        device-metadata files (start-up's restore() handles those of the other callers)."""
        if self.teardown is None:
            # Nothing is half done between the spec's removal and the ledger write: a crash
            # there leaves a prepared entry without a spec, which start-up writes again
            # (claim still allocated here; the kubelet then unprepares again) or tears
            # down. So the "unpreparing" write is only for the hook.
            await self._teardown_in_one_write(uid, claim if with_metadata else None)
            return
        entry = await self._commits.read(lambda: self.ledger.get_claim(uid))
        if entry is None:
            # Never prepared here, or already done: the spec may still be an orphan.
            self.cdi.remove_claim(uid)
            self.unconfirmed.discard(uid)
            if with_metadata and self.metadata is not None:
                await asyncio.to_thread(self.metadata.unprepared, claim)
            return
        await self._commits.run(lambda: self.ledger.begin_unprepare(uid))
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
        self.unconfirmed.discard(uid)
        if with_metadata and self.metadata is not None:
            await asyncio.to_thread(self.metadata.unprepared, claim)
        log.info("unprepared", claim=f"{entry.namespace}/{entry.name}", uid=uid)

    async def _teardown_in_one_write(self, uid: str, metadata_of: ClaimRef | None) -> None:
        """Without a teardown hook: the spec, then the entry, in one change run by the group
        committer (the spec is gone before the write that removes the entry; see
        :meth:`_teardown`). Also removes an orphan spec of a claim the ledger does not know,
        and the device-metadata files of ``metadata_of`` (like the spec, before the write:
        off the event loop, and a failed write is an unprepare the kubelet calls again)."""

        def change() -> ClaimEntry | None:
            entry = self.ledger.get_claim(uid)
            self.cdi.remove_claim(uid)
            if entry is not None:
                self.ledger.remove_claim(uid)
            if metadata_of is not None and self.metadata is not None:
                try:
                    self.metadata.unprepared(metadata_of)  # logs its own failure
                except Exception as e:  # the entry is removed: only files are left behind
                    log.exception(
                        "device metadata not removed", claim=str(metadata_of), error=str(e)
                    )
            return entry

        entry = await self._commits.run(change)
        self.unconfirmed.discard(uid)
        if entry is not None:
            log.info("unprepared", claim=f"{entry.namespace}/{entry.name}", uid=uid)

    # ----- start-up reconcile ------------------------------------------------

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
        answer for stay as they are, in :attr:`unconfirmed`, for
        :meth:`confirm_claims_later`: the plugin registers without waiting.
        """
        counts = dict.fromkeys(
            ("kept", "regenerated", "adopted", "torn_down", "orphans", "unconfirmed"), 0
        )
        rebuild, self._rebuild_pending = self._rebuild_pending, False
        if rebuild:
            log.warning(
                "no ledger to trust; rebuilding holds from the CDI specs and the API server "
                "(on a node's first start there is nothing to rebuild)",
                reason=self.ledger.rebuild_reason,
            )
        entries = self.ledger.claims()
        orphans = {
            uid: self._claim_of_spec(uid)
            for uid in sorted(self.cdi.claim_uids_on_disk() - {e.uid for e in entries})
        }
        to_read = [_ref(e) for e in entries if e.state == "prepared"]
        to_read += [_ref(e) for e in orphans.values() if e is not None]
        found = await self._read_claims(to_read, START_READ_BUDGET_SECONDS)
        for entry in entries:
            for outcome in await self._settle(_ref(entry), found.get(entry.uid)):
                counts[outcome] += 1
        for uid, from_spec in orphans.items():
            for outcome in await self._settle_orphan(uid, from_spec, found.get(uid), rebuild):
                counts[outcome] += 1
        log.info("reconciled node state", **counts)
        return counts

    async def confirm_unconfirmed(self) -> int:
        """Ask the API server once more about the claims it could not answer for;
        returns how many are still unconfirmed."""
        claims = [_ref(e) for uid in sorted(self.unconfirmed) if (e := self.ledger.get_claim(uid))]
        self.unconfirmed &= {c.uid for c in claims}
        found = await self._read_claims(claims, START_READ_BUDGET_SECONDS)
        for claim in claims:
            await self._settle(claim, found.get(claim.uid))
        return len(self.unconfirmed)

    async def confirm_claims_later(self, first: float = 1.0, longest: float = 300.0) -> None:
        """Retry :meth:`confirm_unconfirmed` with exponential backoff until none is left."""
        delay = first
        while self.unconfirmed:
            await asyncio.sleep(delay)
            try:
                left = await self.confirm_unconfirmed()
            except Exception as e:  # keep the holds and try again
                self.handle_error(e, "confirming claims with the API server")
                left = len(self.unconfirmed)
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
                    found[claim.uid] = await self._fetch_claim(claim)
                except PrepareError as e:
                    found[claim.uid] = e

        try:
            async with asyncio.timeout(budget):
                await asyncio.gather(*(read(c) for c in claims))
        except TimeoutError:
            log.warning("the API server did not answer for every claim in time", budget=budget)
        return found

    async def _settle(self, claim: ClaimRef, found: Obj | PrepareError | None) -> list[str]:
        """Decide about one ledger entry from what the API server said; the count keys."""
        async with self.claim_locks.hold(claim.uid):
            entry = self.ledger.get_claim(claim.uid)
            if entry is None:
                self.unconfirmed.discard(claim.uid)
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
                    self.unconfirmed.add(claim.uid)
                    return ["unconfirmed"]
                self.unconfirmed.discard(claim.uid)
                planned = self._plan_or_none(claim, found)
                if planned is not None and entry.recovered and self._same_devices(entry, planned):
                    return await self._adopted(claim, planned)
                if planned is not None and self.digest(planned) == entry.config_digest:
                    had_spec = self._has_spec(claim.uid)
                    self.cdi.write_claim(claim.uid, self._cdi_devices(claim, planned))
                    return ["kept"] if had_spec else ["kept", "regenerated"]
            # Half done, gone, or no longer allocated here as it was prepared.
            try:
                await self._teardown(claim, claim.uid)
            except (HookError, OSError) as e:
                log.error("reconcile teardown failed", claim=str(claim), error=str(e))
                return []
            return ["torn_down"]

    async def _settle_orphan(
        self,
        uid: str,
        from_spec: ClaimEntry | None,
        found: Obj | PrepareError | None,
        rebuild: bool,
    ) -> list[str]:
        """Decide about a claim spec the ledger does not know; the count keys."""
        async with self.claim_locks.hold(uid):
            if self.ledger.get_claim(uid) is not None:
                return []  # prepared meanwhile (by another plugin instance)
            if from_spec is None:
                if rebuild:
                    log.warning("keeping a CDI spec that names no claim", uid=uid)
                    return []
                self.cdi.remove_claim(uid)
                return ["orphans"]
            claim = _ref(from_spec)
            if found is None or isinstance(found, ClaimUnreadable):
                try:
                    await self._commits.run(lambda: self.ledger.adopt_claim(from_spec))
                except DeviceBusy as e:
                    log.error("cannot hold the devices a CDI spec names", uid=uid, error=str(e))
                    return []
                log.warning(
                    "holding what a CDI spec names until the API server confirms its claim",
                    claim=str(claim),
                    uid=uid,
                    error=str(found) if found is not None else "not read",
                )
                self.unconfirmed.add(uid)
                return ["unconfirmed"]
            planned = self._plan_or_none(claim, found)
            if planned is None:
                self.cdi.remove_claim(uid)  # gone, or not allocated here any more
                return ["orphans"]
            if not self._same_devices(from_spec, planned):
                # Allocated here again, to other devices: not prepared for those yet,
                # and a spec of a claim allocated here is never deleted.
                log.warning("keeping a CDI spec of an earlier allocation", claim=str(claim))
                return []
            return await self._adopted(claim, planned)

    async def _adopted(self, claim: ClaimRef, planned: list[PlannedDevice]) -> list[str]:
        try:
            await self._adopt(claim, planned, self.digest(planned))
        except PrepareError as e:
            log.error("cannot adopt a prepared claim", claim=str(claim), error=str(e))
            return []
        return ["adopted"]

    def _plan_or_none(
        self, claim: ClaimRef, found: Obj | PrepareError
    ) -> list[PlannedDevice] | None:
        """The claim's devices here, or None if it is gone or not allocated here as planned."""
        if isinstance(found, PrepareError):
            return None
        try:
            return self.plan(claim, found)
        except PrepareError:
            return None

    def _has_spec(self, uid: str) -> bool:
        try:
            return self.cdi.read_claim(uid) is not None
        except CDIError:
            return False  # unreadable: written again

    def _claim_of_spec(self, uid: str) -> ClaimEntry | None:
        """A recovered ledger entry rebuilt from the claim's CDI spec alone, or None if the
        spec does not say whose it is.

        Device names on disk are ``<uid>-<device>[-<share id>]`` and every device
        carries ``DRADRIVER_CLAIM=<namespace>/<name>`` (network devices also their
        pool and device). Admin access is not visible there: such a use is held as
        exclusive until the API server says otherwise.
        """
        try:
            spec = self.cdi.read_claim(uid)
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
                pool, device = self.inventory.pool, self._device_named(cdi_name)
            share = cdi_name.removeprefix(f"{device}-") if cdi_name != device else None
            devices.append(
                {
                    "pool": pool,
                    "device": device,
                    "share_id": share,
                    "cdi_ids": [self.cdi.cdi_id(uid, cdi_name)],
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
        if cdi_name in self.inventory.devices:
            return cdi_name
        prefixes = [d for d in self.inventory.devices if cdi_name.startswith(f"{d}-")]
        return max(prefixes, key=len) if prefixes else cdi_name


def _ref(entry: ClaimEntry) -> ClaimRef:
    return ClaimRef(entry.namespace, entry.uid, entry.name)
