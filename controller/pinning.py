"""ParametersPinReconciler: pins referenced parameters into scheduler-allocated claims.

Keyed by claim. Once a claim is allocated and its allocation's config references
DeviceClaimParameters by name, the referenced objects are resolved and validated,
and their node-side settings are written into ``status.devices[].data.parameters`` of
every device of this driver (see :mod:`dradriver.api.pinnedparameters`). Pinned once:
a later change to the parameters object does not reach a claim already allocated.
A reference that cannot be resolved leaves the claim's
``dradriver.dev/allocation-status`` annotation and a ``ParametersUnresolved`` event
saying why, and is retried when the parameters appear or change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from controller.resourceclaims import is_fence
from dradriver.allocator import claim_key
from dradriver.api import parameters as params
from dradriver.api import pinnedparameters as pins
from dradriver.api.wellknown import STATUS_ANNOTATION
from dradriver.k8s.client import KubeClient
from dradriver.k8s.errors import KubeAPIError, is_conflict, is_not_found
from dradriver.k8s.events import EventRecorder
from dradriver.k8s.objects import Obj, allocation_of, annotations_of, meta
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger
from dradriver.runtime import Informer, RequeueAfter, split_key

log = get_logger("controller.pinning")


def wanted_pins(
    driver: str, claim: Obj, lookup: Callable[[str, str], Obj | None]
) -> tuple[dict[str, Obj], str | None]:
    """The pins a claim needs (``name -> {resourceVersion, config}``), or an error."""
    allocation = allocation_of(claim) or {}
    names = pins.references(driver, (allocation.get("devices") or {}).get("config") or [])
    namespace = str(meta(claim).get("namespace", ""))
    out: dict[str, Obj] = {}
    for name in names:
        obj = lookup(namespace, name)
        if obj is None:
            return {}, f"{params.KIND} {namespace}/{name} does not exist"
        try:
            spec = params.spec_of(obj)
        except params.ParametersError as e:
            return {}, f"{params.KIND} {namespace}/{name} is invalid: {e}"
        out[name] = {
            "resourceVersion": str(meta(obj).get("resourceVersion", "")),
            "config": spec.device_config(driver),
        }
    return out, None


def claims_referencing(claims: Informer, driver: str) -> Callable[[Obj], Iterable[str]]:
    """Mapper: a parameters change concerns allocated claims that reference it, unpinned."""

    def mapper(obj: Obj) -> Iterable[str]:
        namespace = meta(obj).get("namespace")
        name = meta(obj).get("name")
        out = []
        for claim in claims.items():
            if meta(claim).get("namespace") != namespace or pins.pinned(claim, driver):
                continue
            config = ((allocation_of(claim) or {}).get("devices") or {}).get("config") or []
            if name in pins.references(driver, config):
                out.append(claim_key(claim))
        return out

    return mapper


class ParametersPinReconciler:
    def __init__(
        self,
        client: KubeClient,
        driver: str,
        claims: Informer,
        parameters: Informer,
        is_leader: Callable[[], bool],
        namespaces: Iterable[str] = (),
        events: EventRecorder | None = None,
    ) -> None:
        self.client = client
        self.driver = driver
        self.claims = claims
        self.parameters = parameters
        self.is_leader = is_leader
        self.namespaces = frozenset(namespaces)
        self.events = events or EventRecorder(client)
        self.pinned_total = 0

    def _lookup(self, namespace: str, name: str) -> Obj | None:
        return self.parameters.get_by_name(namespace, name)

    async def __call__(self, key: str) -> None:
        claim = self.claims.get(key)
        if claim is None or is_fence(claim) or not allocation_of(claim):
            return
        namespace, name = split_key(key)
        if self.namespaces and namespace not in self.namespaces:
            return
        entries = pins.our_entries(claim, self.driver)
        results = [
            r
            for r in ((allocation_of(claim) or {}).get("devices") or {}).get("results") or []
            if r.get("driver") == self.driver
        ]
        if not results or (entries and pins.pinned(claim, self.driver)):
            return  # nothing of ours, or pinned already (once, never re-pinned)
        wanted, error = wanted_pins(self.driver, claim, self._lookup)
        if error is not None:
            await self._unresolved(key, claim, error)
            return
        if not wanted:
            return
        if not self.is_leader():
            raise RuntimeError(f"not pinning parameters of {key} without a fresh lease")
        devices = list((claim.get("status") or {}).get("devices") or [])
        for r in results:
            ident = (r.get("driver"), r.get("pool"), r.get("device"))
            existing = next(
                (e for e in devices if (e.get("driver"), e.get("pool"), e.get("device")) == ident),
                None,
            )
            if existing is None:
                existing = {"driver": r["driver"], "pool": r["pool"], "device": r["device"]}
                devices.append(existing)
            existing["data"] = {**(existing.get("data") or {}), pins.DATA_KEY: wanted}
        try:
            await self.client.merge_patch(
                path_for(RESOURCE_V1, "resourceclaims", namespace, name) + "/status",
                {
                    "metadata": {"resourceVersion": meta(claim)["resourceVersion"]},
                    "status": {"devices": devices},
                },
            )
        except KubeAPIError as e:
            if is_not_found(e) or is_conflict(e):
                raise RequeueAfter(0.5, f"claim {key} changed meanwhile ({e.status})") from e
            raise
        self.pinned_total += 1
        log.info("parameters pinned", claim=key, parameters=sorted(wanted))
        if annotations_of(claim).get(STATUS_ANNOTATION, "").startswith("parameters: "):
            await self.client.merge_patch(
                path_for(RESOURCE_V1, "resourceclaims", namespace, name),
                {"metadata": {"annotations": {STATUS_ANNOTATION: None}}},
            )

    async def _unresolved(self, key: str, claim: Obj, error: str) -> None:
        message = f"parameters: {error}"
        log.info("parameters cannot be pinned", claim=key, error=error)
        if annotations_of(claim).get(STATUS_ANNOTATION) != message and self.is_leader():
            namespace, name = split_key(key)
            await self.client.merge_patch(
                path_for(RESOURCE_V1, "resourceclaims", namespace, name),
                {"metadata": {"annotations": {STATUS_ANNOTATION: message}}},
            )
        await self.events.emit(claim, "ResourceClaim", "Warning", "ParametersUnresolved", error)
