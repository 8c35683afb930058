"""What a claim needs on this node: its devices, their merged config, and its digest.

Pure: a claim as the API server returned it and the node's inventory in, planned
devices (or a :class:`PrepareError` that says what is wrong with the claim) out. The
store's :class:`~dradriver.host.state.claimstore.ClaimPlan` is built here too, so
the node driver only fetches, plans and hands the plan to the store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

from dradriver.api import networkpool as net
from dradriver.api import pinnedparameters as pins
from dradriver.api.opaqueconfig import DeviceConfigError, EffectiveConfig, effective_configs
from dradriver.api.wellknown import CONFLICT_ANNOTATION
from dradriver.host.cdi import CDIDevice
from dradriver.host.containeredits import ContainerEdits
from dradriver.host.state.claimstore import ClaimPlan, DevicePlan, SideFiles, setup_env
from dradriver.host.state.schema import ClaimDevice
from dradriver.k8s.objects import Obj, allocation_of
from dradriver.plugin.interface import ClaimRef, PreparedDevice
from kubeletplugin.inventory import NodeInventory

# The merged config goes to hooks as one environment variable (DRADRIVER_CONFIG);
# Linux refuses a single one over 128 KiB (MAX_ARG_STRLEN).
MAX_CONFIG_BYTES = 64 * 1024


class PrepareError(RuntimeError):
    """A claim cannot be prepared; the message goes to the kubelet and the pod's events."""


class ClaimGone(PrepareError):
    """The claim the kubelet named does not exist any more (404, or its name has another UID)."""


class ClaimUnreadable(PrepareError):
    """The API server could not say (403, 429, 5xx, a timeout): unknown, ask again later."""


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


def _configs(
    driver: str, claim: ClaimRef, obj: Obj, devices: Obj, requests: list[str]
) -> dict[str, EffectiveConfig]:
    """Each request's merged opaque config (``devices``: the allocation's)."""
    try:
        # References to DeviceClaimParameters: use what the controller pinned.
        config = pins.substitute(driver, devices.get("config") or [], pins.pinned(obj, driver))
    except pins.NotPinned as e:
        raise PrepareError(f"ResourceClaim {claim}: {e}") from e
    try:
        configs = effective_configs(driver, config, requests)
    except DeviceConfigError as e:
        raise PrepareError(f"ResourceClaim {claim}: invalid opaque config: {e}") from e
    for request in requests:
        problem = config_problem(configs[request])
        if problem:
            raise PrepareError(
                f"ResourceClaim {claim}: invalid opaque config for request {request}: {problem}"
            )
    return configs


def plan(driver: str, inventory: NodeInventory, claim: ClaimRef, obj: Obj) -> list[PlannedDevice]:
    """The devices this node must prepare for the claim, with their merged config."""
    allocation = allocation_of(obj)
    if not allocation:
        raise PrepareError(f"ResourceClaim {claim} is not allocated")
    conflict = ((obj.get("metadata") or {}).get("annotations") or {}).get(CONFLICT_ANNOTATION)
    if conflict:
        raise PrepareError(
            f"ResourceClaim {claim} is held by dradriver-controller after an allocation "
            f"conflict ({conflict}); it is allocated again once the device is free"
        )
    devices = allocation.get("devices") or {}
    results = [r for r in devices.get("results") or [] if r.get("driver") == driver]
    if not results:
        raise PrepareError(f"ResourceClaim {claim} has no devices of {driver}")
    configs = _configs(driver, claim, obj, devices, sorted({r["request"] for r in results}))
    planned = []
    for r in results:
        network = None
        if net.is_network_pool(r["pool"]):
            # Attached by the controller to this node; prepared from what it pinned.
            try:
                network = net.attachment_of(obj, driver, r["pool"], r["device"], inventory.pool)
            except net.NetworkPoolError as e:
                raise PrepareError(f"ResourceClaim {claim}: {e}") from e
        elif r["pool"] != inventory.pool or r["device"] not in inventory.devices:
            raise PrepareError(
                f"ResourceClaim {claim}: device {r['pool']}/{r['device']} is not on this "
                f"node (pool {inventory.pool})"
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


def digest(planned: list[PlannedDevice]) -> str:
    """Identifies the allocation and config a claim was prepared with."""
    text = json.dumps(
        [
            [p.request, p.pool, p.device, p.share_id, p.admin_access, p.config.model_dump()]
            for p in planned
        ],
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cdi_device(inventory: NodeInventory, claim: ClaimRef, p: PlannedDevice) -> CDIDevice:
    """The CDI device of one planned use: the device's edits plus the claim's env."""
    env = {"DRADRIVER_CLAIM": f"{claim.namespace}/{claim.name}", **p.config.env}
    if p.network is not None:
        env = {
            "DRADRIVER_NETWORK_POOL": p.pool,
            "DRADRIVER_NETWORK_DEVICE": p.device,
            **p.network.env,
            **env,
        }
        return CDIDevice(p.cdi_name, ContainerEdits(env=env))
    device = inventory.devices[p.device]
    return CDIDevice(p.cdi_name, device.edits.merged(ContainerEdits(env=env)))


def ledger_use(p: PlannedDevice) -> ClaimDevice:
    """How the ledger records the use (CDI IDs are the store's to add)."""
    return ClaimDevice(
        pool=p.pool,
        device=p.device,
        request_names=[p.request],
        share_id=p.share_id,
        admin_access=p.admin_access,
        exclusive=not (p.admin_access or p.share_id),
    )


def claim_plan(
    inventory: NodeInventory,
    claim: ClaimRef,
    planned: list[PlannedDevice],
    *,
    side_files: SideFiles | None = None,
    refused: Exception | None = None,
) -> ClaimPlan:
    """The store's transaction for the claim."""
    return ClaimPlan(
        uid=claim.uid,
        namespace=claim.namespace,
        name=claim.name,
        devices=tuple(
            DevicePlan(
                use=ledger_use(p),
                cdi=cdi_device(inventory, claim, p),
                hook_env=setup_env(
                    p.admin_access,
                    p.config.profile,
                    p.config.setup_args,
                    p.config.model_dump_json(),
                ),
            )
            for p in planned
        ),
        digest=digest(planned),
        side_files=side_files,
        refused=refused,
    )


def prepared_devices(planned: list[PlannedDevice], ids: dict[str, str]) -> list[PreparedDevice]:
    """The kubelet's answer; it matches request names against containers' top-level requests."""
    return [
        PreparedDevice((p.request.split("/")[0],), p.pool, p.device, (ids[p.cdi_name],), p.share_id)
        for p in planned
    ]
