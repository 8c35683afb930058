"""``dradriver explain NAMESPACE/CLAIM``: why a claim is (not) allocated, device by device.

Reads the cluster's ResourceSlices, DeviceClasses, Nodes and all claims, then
runs dradriver's allocator (the scheduler's semantics) for the claim with
every other claim's devices taken. Works for any claim, including ones the
scheduler failed on.
"""

from __future__ import annotations

from typing import Any

from dradriver.allocator import AllocatedState, Allocator, Inventory, explain, format_table
from dradriver.kube.client import KubeAPIError, KubeClient, load_connection
from dradriver.kube.paths import RESOURCE_V1, path_for

Obj = dict[str, Any]


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


async def explain_claim(client: KubeClient, target: str, show_available: bool = True) -> str:
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
    allocator = Allocator(Inventory(slices, classes))
    state = AllocatedState.from_claims(others)
    lines = [f"ResourceClaim {namespace}/{name}"]
    allocation = (claim.get("status") or {}).get("allocation")
    if allocation:
        results = allocation.get("devices", {}).get("results", [])
        held = ", ".join(f"{r['request']}={r['driver']}/{r['pool']}/{r['device']}" for r in results)
        lines.append(f"allocated: {held}")
        lines.append("if it were allocated again now:")
    rows = explain(allocator, claim, state, nodes=nodes)
    lines.append(format_table(rows, include_available=show_available))
    return "\n".join(lines)


async def run_explain(target: str, kubeconfig: str | None, show_available: bool) -> str:
    client = KubeClient(load_connection(kubeconfig), "dradriver-explain")
    try:
        return await explain_claim(client, target, show_available)
    except KubeAPIError as e:
        raise ExplainError(f"cannot read from the API server: {e}") from e
    finally:
        await client.aclose()
