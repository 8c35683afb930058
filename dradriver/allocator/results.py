"""The AllocationResult of one claim, built from the devices the search chose.

Invariants:
- Results are in the order the search chose the devices; each names its request (or
  ``request/subrequest``), driver, pool and device, plus ``adminAccess``, the request's
  ``tolerations``, the device's binding conditions, ``shareID`` and ``consumedCapacity``
  only when they apply.
- ``config``: the device classes' configs (``FromClass``) first, each class once, then the
  claim's (``FromClaim``) that concern a chosen request; ``requests`` is left out when an
  entry concerns every chosen request.
- ``nodeSelector``: the node's name when a device is bound to one node (or binds to the
  node it was allocated for), otherwise the merged selectors of the devices' slices, or
  none when every device is usable from every node.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.allocator.inventory import CandidateDevice, QuantityValue
from dradriver.allocator.nodes import merge_selectors, node_name_selector
from dradriver.allocator.request import Req
from dradriver.k8s.objects import Obj

__all__ = ["Result", "allocation_result", "build_config", "node_selector"]


class Result:
    """One device chosen for one request (a share of it when ``share_id`` is set)."""

    __slots__ = ("consumed", "device", "req", "share_id")

    def __init__(
        self,
        req: Req,
        device: CandidateDevice,
        share_id: str | None,
        consumed: dict[str, QuantityValue] | None,
    ) -> None:
        self.req = req
        self.device = device
        self.share_id = share_id
        self.consumed = consumed


def allocation_result(
    claim: Mapping[str, Any],
    results: Sequence[Result],
    chosen: Sequence[Req],
    node_name: str | None,
) -> Obj:
    """The AllocationResult dict of ``claim`` (without ``allocationTimestamp``)."""
    entries: list[Obj] = []
    for result in results:
        device = result.device
        entry: Obj = {
            "request": result.req.full_name,
            "driver": device.driver,
            "pool": device.pool.name,
            "device": device.name,
        }
        if result.req.admin:
            entry["adminAccess"] = True
        if result.req.tolerations:
            entry["tolerations"] = copy.deepcopy(result.req.tolerations)
        if device.binding_conditions:
            entry["bindingConditions"] = list(device.binding_conditions)
        if device.binding_failure_conditions:
            entry["bindingFailureConditions"] = list(device.binding_failure_conditions)
        if result.share_id is not None:
            entry["shareID"] = result.share_id
        if result.consumed is not None:
            entry["consumedCapacity"] = {
                device.capacity[name].name: amount.text for name, amount in result.consumed.items()
            }
        entries.append(entry)
    allocation: Obj = {"devices": {"results": entries}}
    config = build_config(claim, chosen)
    if config:
        allocation["devices"]["config"] = config
    selector = node_selector(results, node_name)
    if selector is not None:
        allocation["nodeSelector"] = selector
    return allocation


def node_selector(results: Sequence[Result], node_name: str | None) -> Obj | None:
    """Where the allocated devices can be used from (None: from every node)."""
    selectors: list[Mapping[str, Any]] = []
    for result in results:
        device = result.device
        kind = device.placement.get("kind")
        if kind == "node" or device.binds_to_node:
            name = node_name or str(device.placement.get("node", ""))
            return node_name_selector(name)
        if kind == "selector" and device.placement.get("selector"):
            selectors.append(device.placement["selector"])
    return merge_selectors(selectors)


def build_config(claim: Mapping[str, Any], chosen: Sequence[Req]) -> list[Obj]:
    """``devices.config``: class configs (FromClass) first, then the claim's (FromClaim)."""
    config: list[Obj] = []
    by_class: dict[str, tuple[int, int]] = {}
    for req in chosen:
        span = by_class.get(req.class_name)
        if span is not None:
            for i in range(*span):
                config[i]["requests"].append(req.full_name)
            continue
        start = len(config)
        for entry in (req.klass.get("spec") or {}).get("config") or []:
            item: Obj = {"source": "FromClass", "requests": [req.full_name]}
            item.update({k: copy.deepcopy(v) for k, v in entry.items() if k != "requests"})
            config.append(item)
        by_class[req.class_name] = (start, len(config))
    names = {req.base for req in chosen} | {req.full_name for req in chosen}
    for entry in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
        requests = list(entry.get("requests") or [])
        if requests and not names.intersection(requests):
            continue
        item = {"source": "FromClaim"}
        if requests:
            item["requests"] = requests
        item.update({k: copy.deepcopy(v) for k, v in entry.items() if k != "requests"})
        config.append(item)
    for item in config:
        if len(item.get("requests") or []) == len(chosen):
            item.pop("requests", None)
    return config
