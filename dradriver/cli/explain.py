"""``dradriver explain NAMESPACE/CLAIM``: why a claim is (not) allocated, device by device.

Reads the cluster's ResourceSlices, DeviceClasses, Nodes and all claims, then
runs dradriver's allocator (the scheduler's semantics) for the claim with
every other claim's devices taken. Works for any claim, including ones the
scheduler failed on.
"""

from __future__ import annotations

import re

from dradriver.allocator import AllocatedState, Allocator, SliceInventory, explain, format_table
from dradriver.k8s.client import KubeClient, load_connection
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj, allocation_of
from dradriver.k8s.paths import RESOURCE_V1, path_for


class ExplainError(RuntimeError):
    pass


def _parse_target(target: str) -> tuple[str, str]:
    namespace, sep, name = target.partition("/")
    if not sep or not namespace or not name:
        raise ExplainError(f"{target!r}: name the claim as NAMESPACE/NAME")
    return namespace, name


async def _items(client: KubeClient, path: str) -> list[Obj]:
    items: list[Obj] = (await client.list(path)).get("items", [])
    return items


_DRIVER_TEST = re.compile(r"""device\.driver\s*==\s*["']([^"']+)["']""")


def class_drivers(claim: Obj, classes: list[Obj]) -> set[str]:
    """Drivers the claim's DeviceClasses name in ``device.driver == "..."`` selectors."""
    wanted: set[str] = set()
    for request in (claim.get("spec") or {}).get("devices", {}).get("requests", []):
        subs = request.get("firstAvailable") or [request.get("exactly") or {}]
        wanted |= {s.get("deviceClassName", "") for s in subs}
    drivers: set[str] = set()
    for cls in classes:
        if cls["metadata"]["name"] in wanted:
            for selector in (cls.get("spec") or {}).get("selectors", []):
                drivers |= set(
                    _DRIVER_TEST.findall((selector.get("cel") or {}).get("expression", ""))
                )
    return drivers


async def explain_claim(
    client: KubeClient, target: str, show_available: bool = True, all_drivers: bool = False
) -> str:
    namespace, name = _parse_target(target)
    claim = await client.get_or_none(path_for(RESOURCE_V1, "resourceclaims", namespace, name))
    if claim is None:
        raise ExplainError(f"ResourceClaim {namespace}/{name} does not exist")
    slices = await _items(client, path_for(RESOURCE_V1, "resourceslices"))
    classes = await _items(client, path_for(RESOURCE_V1, "deviceclasses"))
    nodes = await _items(client, path_for("v1", "nodes"))
    others = [
        c
        for c in await _items(client, path_for(RESOURCE_V1, "resourceclaims"))
        if c["metadata"]["uid"] != claim["metadata"]["uid"]
    ]
    allocator = Allocator(SliceInventory(slices, classes))
    state = AllocatedState.from_claims(others)
    lines = [f"ResourceClaim {namespace}/{name}"]
    allocation = allocation_of(claim)
    if allocation:
        results = allocation.get("devices", {}).get("results", [])
        held = ", ".join(f"{r['request']}={r['driver']}/{r['pool']}/{r['device']}" for r in results)
        lines.append(f"allocated: {held}")
        lines.append("if it were allocated again now:")
    # Other drivers' devices would only say "wrong driver"; keep the table to the point.
    drivers = None if all_drivers else class_drivers(claim, classes) or None
    rows = explain(allocator, claim, state, nodes=nodes, drivers=drivers)
    lines.append(format_table(rows, include_available=show_available))
    return "\n".join(lines)


async def run_explain(
    target: str, kubeconfig: str | None, show_available: bool, all_drivers: bool = False
) -> str:
    client = KubeClient(load_connection(kubeconfig), "dradriver-explain")
    try:
        return await explain_claim(client, target, show_available, all_drivers)
    except KubeAPIError as e:
        raise ExplainError(f"cannot read from the API server: {e}") from e
    finally:
        await client.aclose()
