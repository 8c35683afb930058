"""ResourceClaims as the scheduler (or the controller) leaves them, for the unit tier.

Plain ``resource.k8s.io/v1`` JSON, the shape the apiserver returns, so the code under
test reads the same fields it reads in a cluster: ``status.allocation.devices.results``
and ``.config``, ``status.devices[].data`` for pinned parameters, and annotations.
Store one in a :class:`~tests.fakes.apiserver.FakeAPIServer` with :func:`store_claim`;
it lives at its REST path, where the node driver and the reconcilers read it.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.api.group import api_version
from dradriver.api.parameters import REFERENCE_KIND
from dradriver.api.pinnedparameters import DATA_KEY
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.plugin.interface import ClaimRef
from tests.fakes.apiserver import FakeAPIServer

DRIVER = DEFAULT_DRIVER_NAME
NODE = "node-1"
CONFIG_API_VERSION = api_version(DRIVER)
DEVICE_CLASS = "dradriver.dev"
_UIDS = uuid.UUID("3f0b6c1e-3c1a-4f55-9b0e-6f1f1d2c9a10")


def claim_uid(namespace: str, name: str, generation: int = 0) -> str:
    """A UUID like the apiserver's, stable per claim (``generation`` for a recreated one)."""
    return str(uuid.uuid5(_UIDS, f"{namespace}/{name}/{generation}"))


def claim_path(namespace: str, name: str) -> str:
    return path_for(RESOURCE_V1, "resourceclaims", namespace, name)


def result(
    device: str,
    request: str = "gpu",
    *,
    pool: str = NODE,
    driver: str = DRIVER,
    share_id: str | None = None,
    admin_access: bool = False,
) -> Obj:
    """One ``status.allocation.devices.results[]`` entry."""
    out: Obj = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share_id is not None:
        out["shareID"] = share_id
    if admin_access:
        out["adminAccess"] = True
    return out


def device_config(**fields: Any) -> Obj:
    """``DeviceConfig`` opaque parameters of this driver (``env``, ``profile``, ``setupArgs``)."""
    return {"apiVersion": CONFIG_API_VERSION, "kind": "DeviceConfig", **fields}


def parameters_reference(name: str) -> Obj:
    """Opaque parameters that name a DeviceClaimParameters object instead of carrying it."""
    return {"apiVersion": CONFIG_API_VERSION, "kind": REFERENCE_KIND, "name": name}


def opaque(
    parameters: Obj,
    *,
    source: str = "FromClaim",
    requests: Sequence[str] = (),
    driver: str = DRIVER,
) -> Obj:
    """One ``status.allocation.devices.config[]`` entry (``source`` FromClass or FromClaim)."""
    out: Obj = {"source": source, "opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        out["requests"] = list(requests)
    return out


def allocated_claim(
    name: str,
    results: Iterable[Obj],
    *,
    namespace: str = "default",
    uid: str | None = None,
    config: Iterable[Obj] = (),
    annotations: Mapping[str, str] | None = None,
    node: str = NODE,
) -> Obj:
    """A claim allocated on ``node`` with these results and config entries."""
    results = [copy.deepcopy(r) for r in results]
    metadata: Obj = {
        "name": name,
        "namespace": namespace,
        "uid": uid or claim_uid(namespace, name),
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    requests = sorted({r["request"].split("/")[0] for r in results})
    return {
        "apiVersion": RESOURCE_V1,
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {
            "devices": {
                "requests": [
                    {"name": r, "exactly": {"deviceClassName": DEVICE_CLASS}} for r in requests
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {"results": results, "config": [copy.deepcopy(c) for c in config]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            }
        },
    }


def with_pins(claim: Obj, pins: Mapping[str, Obj], driver: str = DRIVER) -> Obj:
    """The claim with ``pins`` (``name -> {resourceVersion, config}``) in every device status
    entry of ``driver``, as dradriver-controller writes them after allocation."""
    out = copy.deepcopy(claim)
    status = out.setdefault("status", {})
    status["devices"] = [
        {
            "driver": r["driver"],
            "pool": r["pool"],
            "device": r["device"],
            "data": {DATA_KEY: copy.deepcopy(dict(pins))},
        }
        for r in status["allocation"]["devices"]["results"]
        if r["driver"] == driver
    ]
    return out


def claim_ref(claim: Obj) -> ClaimRef:
    """The claim as the kubelet names it in NodePrepareResources."""
    meta = claim["metadata"]
    return ClaimRef(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])


def store_claim(api: FakeAPIServer, claim: Obj) -> Obj:
    """Put the claim at its REST path (as if created); returns it with its resourceVersion."""
    meta = claim["metadata"]
    return api.put(claim_path(meta["namespace"], meta["name"]), claim)
