"""Builders for resource.k8s.io/v1 JSON used by the allocator tests (no tests here)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dradriver.allocator import Outcome
from dradriver.k8s.objects import Obj

DRIVER = "gpu.alloc.test"
A = f'device.attributes["{DRIVER}"]'


def attr(value: object) -> Obj:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    text = str(value)
    if text.startswith("v:"):
        return {"version": text[2:]}
    return {"string": text}


def device(
    name: str,
    attrs: Mapping[str, object] | None = None,
    capacity: Mapping[str, object] | None = None,
    **extra: Any,
) -> Obj:
    out: Obj = {"name": name}
    if attrs:
        out["attributes"] = {k: attr(v) for k, v in attrs.items()}
    if capacity:
        out["capacity"] = {
            k: (dict(v) if isinstance(v, Mapping) else {"value": str(v)})
            for k, v in capacity.items()
        }
    out.update(extra)
    return out


def node_slice(
    node: str,
    devices: Sequence[Obj],
    *,
    name: str | None = None,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    driver: str = DRIVER,
    **spec: Any,
) -> Obj:
    return {
        "metadata": {"name": name or f"{node}-{pool or node}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count},
            "devices": list(devices),
            **spec,
        },
    }


def shared_slice(
    name: str,
    pool: str,
    devices: Sequence[Obj] = (),
    *,
    node_selector: Obj | None = None,
    all_nodes: bool = False,
    per_device: bool = False,
    generation: int = 1,
    count: int = 1,
    driver: str = DRIVER,
    **spec: Any,
) -> Obj:
    out: Obj = {
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            **spec,
        },
    }
    if devices:
        out["spec"]["devices"] = list(devices)
    if node_selector is not None:
        out["spec"]["nodeSelector"] = node_selector
    elif all_nodes:
        out["spec"]["allNodes"] = True
    elif per_device:
        out["spec"]["perDeviceNodeSelection"] = True
    return out


def label_selector(key: str, *values: str) -> Obj:
    return {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": key, "operator": "In", "values": list(values)}]}
        ]
    }


def device_class(
    name: str = "gpu",
    selectors: Iterable[str] = (f'device.driver == "{DRIVER}"',),
    config: Sequence[Obj] = (),
) -> Obj:
    spec: Obj = {"selectors": [{"cel": {"expression": s}} for s in selectors]}
    if config:
        spec["config"] = [{"opaque": {"driver": DRIVER, "parameters": c}} for c in config]
    return {"metadata": {"name": name}, "spec": spec}


def exact(
    cls: str = "gpu",
    selectors: Iterable[str] = (),
    count: int | None = None,
    mode: str | None = None,
    admin: bool | None = None,
    tolerations: Sequence[Obj] | None = None,
    capacity: Mapping[str, str] | None = None,
) -> Obj:
    out: Obj = {"deviceClassName": cls}
    sels = [{"cel": {"expression": s}} for s in selectors]
    if sels:
        out["selectors"] = sels
    if count is not None:
        out["count"] = count
    if mode is not None:
        out["allocationMode"] = mode
    if admin is not None:
        out["adminAccess"] = admin
    if tolerations is not None:
        out["tolerations"] = list(tolerations)
    if capacity is not None:
        out["capacity"] = {"requests": dict(capacity)}
    return out


def request(name: str, cls: str = "gpu", **kwargs: Any) -> Obj:
    return {"name": name, "exactly": exact(cls, **kwargs)}


def first_available(name: str, *subs: tuple[str, Obj]) -> Obj:
    return {"name": name, "firstAvailable": [{"name": n, **spec} for n, spec in subs]}


def claim(
    name: str,
    *requests: Obj,
    constraints: Sequence[Obj] = (),
    config: Sequence[Obj] = (),
    namespace: str = "ns",
) -> Obj:
    devices: Obj = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = list(constraints)
    if config:
        devices["config"] = list(config)
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"devices": devices}}


def node(name: str, **labels: str) -> Obj:
    return {"metadata": {"name": name, "labels": dict(labels)}}


def picked(outcome: Outcome, index: int = 0) -> list[tuple[str, str]]:
    """(request, device) pairs of one claim's allocation."""
    assert outcome.ok, outcome.error or "unsatisfiable"
    assert outcome.allocations is not None
    return [(r["request"], r["device"]) for r in outcome.allocations[index]["devices"]["results"]]


def allocated_claim(name: str, allocation: Obj, namespace: str = "ns") -> Obj:
    """A claim object with ``status.allocation`` set, for AllocatedState.from_claims."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": allocation},
    }


def result(
    device_name: str,
    pool: str,
    request_name: str = "r",
    driver: str = DRIVER,
    **extra: Any,
) -> Obj:
    return {"request": request_name, "driver": driver, "pool": pool, "device": device_name, **extra}


def allocation(outcome: Outcome, index: int = 0) -> Obj:
    """One claim's AllocationResult of a successful outcome."""
    assert outcome.ok and outcome.allocations is not None, outcome.error or "unsatisfiable"
    return outcome.allocations[index]
