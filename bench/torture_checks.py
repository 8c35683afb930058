"""The torture bench's two checkers (no ``main``: a helper of :mod:`bench.torture`).

* :class:`DoubleChecker`: its own list+watch of the claims of one namespace (the project's
  informer: it lists again after a gap of its own and reports what changed meanwhile),
  following every version it sees. A *double* is a moment at which one exclusive device
  (``driver/pool/device``, not ``adminAccess``) is in the allocations of two claims; it lasts
  from the version that made it until the version that undid it, timed by arrival. A double
  that begins and ends inside the checker's own gap (while the apiserver is down nothing is
  written, so only the second or so before its relist) would be missed.
* :class:`KubeletPlay`: plays the kubelet of one fake node against a real node plugin:
  NodePrepareResources for the claims of each pod bound to the node once they are allocated
  and reserved for it, NodeUnprepareResources once the pod is gone. A *double prepared* is a
  device the plugin returned for two claims prepared at the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from bench.common import DRAClient, PluginUnderTest
from dradriver.k8s.objects import Obj
from dradriver.kubeletapi.gen import dra_v1_pb2
from dradriver.runtime import Informer

Device = tuple[str, str, str]  # driver, pool, device


def exclusive_devices(claim: Obj) -> set[Device]:
    """The devices a claim's allocation holds exclusively (adminAccess ones are shared)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return {
        (str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
        for r in results
        if isinstance(r, dict) and not r.get("adminAccess")
    }


def claim_key(claim: Obj) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}@{meta.get('uid', '')}"


@dataclass
class Double:
    device: Device
    claims: frozenset[str]
    began: float
    ended: float | None = None

    def seconds(self, now: float) -> float:
        return (self.ended if self.ended is not None else now) - self.began


@dataclass
class DoubleChecker:
    """Follows the claims informer's versions; see the module docstring."""

    holders: dict[Device, set[str]] = field(default_factory=dict)
    held: dict[str, set[Device]] = field(default_factory=dict)
    open: dict[Device, Double] = field(default_factory=dict)
    doubles: list[Double] = field(default_factory=list)
    versions: int = 0

    def attach(self, informer: Informer) -> None:
        informer.add_handler(
            on_add=self._set,
            on_update=lambda old, new: self._set(new),
            on_delete=lambda obj: self._drop(claim_key(obj)),
        )

    def _set(self, claim: Obj) -> None:
        self.versions += 1
        key = claim_key(claim)
        devices = exclusive_devices(claim)  # a claim being deleted holds them until cleared
        before = self.held.get(key, set())
        for d in before - devices:
            self.holders.get(d, set()).discard(key)
            self._settle(d)
        for d in devices - before:
            self.holders.setdefault(d, set()).add(key)
            self._settle(d)
        self.held[key] = devices

    def _drop(self, key: str) -> None:
        self.versions += 1
        for d in self.held.pop(key, set()):
            self.holders.get(d, set()).discard(key)
            self._settle(d)

    def _settle(self, device: Device) -> None:
        holders = self.holders.get(device, set())
        now = time.monotonic()
        current = self.open.get(device)
        if len(holders) >= 2:
            claims = frozenset(holders)
            if current is not None and current.claims == claims:
                return
            if current is not None:
                current.ended = now
            double = Double(device, claims, now)
            self.open[device] = double
            self.doubles.append(double)
        elif current is not None:
            current.ended = now
            del self.open[device]

    def longest(self) -> float:
        now = time.monotonic()
        return max((d.seconds(now) for d in self.doubles), default=0.0)


def pod_claim_names(pod: Obj) -> list[str]:
    """The claims a pod uses: named ones, and those generated from templates (as the
    resourceclaim controller recorded them in the pod's status)."""
    names = []
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(ref.get("name"))
        if not name:
            return []  # not generated yet: nothing to prepare
        names.append(str(name))
    return names


@dataclass
class KubeletPlay:
    """The kubelet of ``plugin.node``: prepares and unprepares (module docstring)."""

    plugin: PluginUnderTest
    pods: Informer
    claims: Informer
    namespace: str
    prepared: dict[str, tuple[Any, set[tuple[str, str]]]] = field(default_factory=dict)
    by_pod: dict[str, list[str]] = field(default_factory=dict)  # pod uid -> claim uids
    refused: int = 0
    doubles_prepared: int = 0
    prepares: int = 0
    errors: list[str] = field(default_factory=list)

    async def run(self, stop: asyncio.Event, pace: float = 0.5) -> None:
        client = DRAClient(self.plugin.dra_socket)
        try:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    await self._tick(client)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pace)  # pacing, not synchronisation
        finally:
            await client.close()

    async def _tick(self, client: DRAClient) -> None:
        live = set()
        for pod in self.pods.items():
            meta = pod.get("metadata") or {}
            if (pod.get("spec") or {}).get("nodeName") != self.plugin.node:
                continue
            uid = str(meta.get("uid"))
            live.add(uid)
            if uid in self.by_pod:
                continue
            claims = [self.claims.get(f"{self.namespace}/{n}") for n in pod_claim_names(pod)]
            if not claims or any(c is None or not self._reserved(c, uid) for c in claims):
                continue
            await self._prepare(client, uid, [c for c in claims if c is not None])
        for uid in [u for u in self.by_pod if u not in live]:
            await self._unprepare(client, self.by_pod.pop(uid))

    @staticmethod
    def _reserved(claim: Obj, pod_uid: str) -> bool:
        status = claim.get("status") or {}
        return bool(status.get("allocation")) and any(
            r.get("uid") == pod_uid for r in status.get("reservedFor") or []
        )

    async def _prepare(self, client: DRAClient, pod_uid: str, claims: list[Obj]) -> None:
        pbs = [
            dra_v1_pb2.Claim(
                namespace=c["metadata"]["namespace"],
                uid=c["metadata"]["uid"],
                name=c["metadata"]["name"],
            )
            for c in claims
        ]
        stub = client._stub  # the kubelet's view: every claim's own answer, errors included
        response = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=pbs), timeout=30
        )
        self.prepares += 1
        done = []
        for pb in pbs:
            result = response.claims.get(pb.uid)
            if result is None or result.error:
                self.refused += 1
                if result is not None and len(self.errors) < 20:
                    self.errors.append(result.error[:200])
                continue
            devices = {(d.pool_name, d.device_name) for d in result.devices}
            for other, (_, held) in self.prepared.items():
                if other != pb.uid and held & devices:
                    self.doubles_prepared += 1
            self.prepared[pb.uid] = (pb, devices)
            done.append(pb.uid)
        if len(done) == len(pbs):
            self.by_pod[pod_uid] = done
        elif done:  # the kubelet retries the pod; what was prepared stays prepared
            await self._unprepare(client, done)

    async def _unprepare(self, client: DRAClient, claim_uids: list[str]) -> None:
        pbs = [self.prepared[u][0] for u in claim_uids if u in self.prepared]
        if pbs:
            await client._stub.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=pbs), timeout=30
            )
        for u in claim_uids:
            self.prepared.pop(u, None)
