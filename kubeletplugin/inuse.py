"""DRA claims the kubelet reports in use, held again before either API serves.

When both the ledger and a claim's CDI spec are lost (a corrupt ledger after a reboot
that wiped ``/var/run/cdi``), nothing on disk says that a running container uses the
claim's devices, and the device-plugin shim could hand them out again (issue 21,
finding 7). The kubelet still knows: pod-resources v1 ``List`` reports, per container,
the DRA claims it uses (``dynamic_resources``: claim namespace and name, and per device
the driver, pool, device and CDI ids). Our CDI ids carry the claim's UID
(``<vendor>/<class>=<uid>-<device>[-<share>]``), so each such claim this driver serves
becomes a recovered ledger entry, settled like a claim known only from its CDI spec
(:meth:`kubeletplugin.recovery.Recovery.hold_in_use`): adopted if the API server says it
is allocated here to those devices, held and asked again later while the API server
cannot say, and let go if it says the claim is gone.

Invariants: a claim already in the ledger is left alone; an entry is built only from
devices of this driver whose CDI id names a claim UID; a ``List`` that fails changes
nothing (logged: the device-plugin poll and confirmations catch up).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from dradriver.host.state.schema import ClaimEntry
from dradriver.log import get_logger

log = get_logger("kubeletplugin.podresources")


@dataclass(frozen=True)
class DeviceInUse:
    pool: str
    device: str
    share_id: str | None
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class ClaimInUse:
    """A DRA claim a container uses, with this driver's devices in it (pod-resources)."""

    namespace: str
    name: str
    devices: tuple[DeviceInUse, ...]

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"


def claims_in_use(pods: Iterable[Any], driver: str) -> list[ClaimInUse]:
    """The claims of ``driver`` that pod-resources' ``pod_resources`` (the List answer)
    report in use, each once with the union of its devices."""
    found: dict[tuple[str, str], dict[tuple[str, str, str | None], DeviceInUse]] = {}
    for pod in pods:
        for container in pod.containers:
            for claim in container.dynamic_resources:
                devices = found.setdefault((claim.claim_namespace, claim.claim_name), {})
                for res in claim.claim_resources:
                    if res.driver_name != driver:
                        continue
                    share = res.share_id if res.HasField("share_id") else None
                    ids = tuple(c.name for c in res.cdi_devices)
                    devices[(res.pool_name, res.device_name, share)] = DeviceInUse(
                        res.pool_name, res.device_name, share, ids
                    )
    return [
        ClaimInUse(ns, name, tuple(devices.values()))
        for (ns, name), devices in sorted(found.items())
        if devices
    ]


def _uid_of(cdi_id: str, kind: str, device: DeviceInUse) -> str | None:
    """The claim UID in one of our CDI ids (``<kind>=<uid>-<device>[-<share>]``)."""
    prefix = f"{kind}="
    if not cdi_id.startswith(prefix):
        return None
    name = cdi_id.removeprefix(prefix)
    for suffix in (f"-{device.device}-{device.share_id}", f"-{device.device}"):
        if device.share_id is None and suffix != f"-{device.device}":
            continue
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return None


def entry_of(claim: ClaimInUse, kind: str) -> ClaimEntry | None:
    """A recovered ledger entry for ``claim`` (``kind``: our CDI ``vendor/class``), or None
    (logged) when its CDI ids do not name one claim UID."""
    uids = {
        uid for d in claim.devices for i in d.cdi_ids if (uid := _uid_of(i, kind, d)) is not None
    }
    if len(uids) != 1:
        log.warning(
            "the kubelet reports a claim of this driver in use whose CDI ids name no one "
            "claim; it is not held from pod-resources",
            claim=claim.describe(),
            cdi_ids=",".join(i for d in claim.devices for i in d.cdi_ids),
        )
        return None
    try:
        return ClaimEntry.model_validate(
            {
                "uid": uids.pop(),
                "namespace": claim.namespace,
                "name": claim.name,
                "state": "prepared",
                "devices": [
                    {
                        "pool": d.pool,
                        "device": d.device,
                        "share_id": d.share_id,
                        "cdi_ids": list(d.cdi_ids),
                    }
                    for d in claim.devices
                ],
                "recovered": True,
            }
        )
    except ValueError as e:
        log.warning("pod-resources does not describe a claim", claim=claim.describe(), error=str(e))
        return None


class PodLister(Protocol):
    socket: Path

    async def pods(self) -> list[Any]: ...


class InUseHolder(Protocol):
    async def hold_in_use(self, entries: list[ClaimEntry]) -> dict[str, int]: ...


async def hold_claims_in_use(
    recovery: InUseHolder, pod_resources: PodLister, driver: str, kind: str
) -> dict[str, int]:
    """One pod-resources List before serving; the claims of ``driver`` it reports in use
    that the ledger does not hold are held (see the module docstring). Returns the counts
    for the start-up line; a kubelet that cannot answer is logged and changes nothing."""
    try:
        pods = await pod_resources.pods()
    except (grpc.aio.AioRpcError, OSError) as e:
        log.warning(
            "cannot list pod resources before serving; DRA claims in use that the ledger "
            "lost are held only from their CDI specs and the API server",
            socket=str(pod_resources.socket),
            error=e.details() if isinstance(e, grpc.aio.AioRpcError) else str(e),
        )
        return {}
    claims = claims_in_use(pods, driver)
    entries = [entry for c in claims if (entry := entry_of(c, kind)) is not None]
    counts = await recovery.hold_in_use(entries)
    return {"claims_in_use": len(claims), **counts}
