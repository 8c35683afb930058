"""The simulated nodes' device pools, published as each node's dradriver plugin would.

Invariants:

* Each simulated node has one pool named after it with :data:`DEVICES_PER_NODE` devices
  declared like the static source's configuration (``namePrefix`` entries, two each of
  the models in :data:`MODELS`; the ``model`` string attribute and the ``index`` int
  attribute the static source adds), built by :func:`~dradriver.resourceslice.pool.node_pool`
  and published by a node-local :class:`~dradriver.resourceslice.publisher.SlicePublisher`
  (``node=<name>``): the kubelet plugin's own code path, so the slices are the plugin's.
* One process publishes for many nodes (the per-node RBAC is not under test here): one
  informer of the driver's slices, shared by every node's publisher through a per-node
  view (:class:`NodeSlices`), so N nodes cost one watch, not N.
* The Node UIDs for the owner references come from one list, not a GET per node.
* :meth:`NodePools.publish` syncs every pool once (at most ``concurrency`` at a time) and
  returns the API writes; :meth:`NodePools.run` keeps them published (recreating what is
  deleted, like the plugin's loop) until cancelled.

``python -m devtools.cluster.kwokpools --kubeconfig K --driver D`` runs the publisher for
every simulated node (``cluster up --kwok-nodes`` starts it as a component).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Callable, Sequence

from devtools.cluster.kwok import SELECTOR
from dradriver.devices.model import Device
from dradriver.devices.sourceconfig import StaticSourceConfig
from dradriver.k8s.client import KubeClient, load_connection
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import configure, get_logger
from dradriver.resourceslice.pool import Owner, SlicePool, node_pool
from dradriver.resourceslice.publisher import SlicePublisher
from dradriver.runtime import Informer

log = get_logger("cluster.kwokpools")

DEFAULT_DRIVER = "dradriver.dev"
MODELS = ("a100", "h100", "l4", "t4")
DEVICES_PER_NODE = 8
CONCURRENCY = 16
# The plugin's loop resyncs every 60 s; thousands of pools in one process do not need to.
RESYNC_SECONDS = 600.0

Handler = Callable[..., None]


def devices() -> list[Device]:
    """One node's devices, declared as the static source's configuration would declare them."""
    per_model = DEVICES_PER_NODE // len(MODELS)
    config = StaticSourceConfig.model_validate(
        {
            "devices": [
                {"namePrefix": model, "count": per_model, "attributes": {"model": model}}
                for model in MODELS
            ]
        }
    )
    return [d for entry in config.devices for d in entry.expand()]


class SliceIndex:
    """The driver's slices by node, kept by one informer; the per-node views read it."""

    def __init__(self, informer: Informer) -> None:
        self.informer = informer
        self.by_node: dict[str, dict[str, Obj]] = {}
        self.handlers: dict[str, list[tuple[Handler | None, Handler | None, Handler | None]]] = {}
        informer.add_handler(on_add=self._add, on_update=self._update, on_delete=self._delete)

    @staticmethod
    def _node(obj: Obj) -> str:
        return str((obj.get("spec") or {}).get("nodeName") or "")

    def _add(self, obj: Obj) -> None:
        node = self._node(obj)
        self.by_node.setdefault(node, {})[obj["metadata"]["name"]] = obj
        for on_add, _, _ in self.handlers.get(node, ()):
            if on_add is not None:
                on_add(obj)

    def _update(self, old: Obj, new: Obj) -> None:
        node = self._node(new)
        self.by_node.setdefault(node, {})[new["metadata"]["name"]] = new
        for _, on_update, _ in self.handlers.get(node, ()):
            if on_update is not None:
                on_update(old, new)

    def _delete(self, obj: Obj) -> None:
        node = self._node(obj)
        self.by_node.get(node, {}).pop(obj["metadata"]["name"], None)
        for _, _, on_delete in self.handlers.get(node, ()):
            if on_delete is not None:
                on_delete(obj)


class NodeSlices:
    """One node's view of a :class:`SliceIndex`: the cache a node-local publisher needs."""

    def __init__(self, index: SliceIndex, node: str) -> None:
        self.index = index
        self.node = node

    def items(self) -> list[Obj]:
        return list(self.index.by_node.get(self.node, {}).values())

    def add_handler(
        self,
        *,
        on_add: Handler | None = None,
        on_update: Handler | None = None,
        on_delete: Handler | None = None,
    ) -> None:
        self.index.handlers.setdefault(self.node, []).append((on_add, on_update, on_delete))

    async def wait_for_sync(self) -> None:
        await self.index.informer.wait_for_sync()


class NodePools:
    """The publishers of ``nodes``' pools for ``driver``, sharing one slice informer."""

    def __init__(self, client: KubeClient, driver: str, nodes: Sequence[str]) -> None:
        self.client = client
        self.driver = driver
        self.nodes = list(nodes)
        self.informer = Informer(
            client,
            path_for(RESOURCE_V1, "resourceslices"),
            name="kwok-resourceslices",
            field_selector=f"spec.driver={driver}",
        )
        self.index = SliceIndex(self.informer)
        self.publishers = {
            node: SlicePublisher(
                client,
                driver,
                NodeSlices(self.index, node),
                node=node,
                resync_period=RESYNC_SECONDS,
            )
            for node in self.nodes
        }

    async def start(self) -> None:
        """Start the informer and set every node's desired pool (Node UIDs from one list)."""
        uids = {
            n["metadata"]["name"]: n["metadata"]["uid"]
            for n in (await self.client.list("/api/v1/nodes", labelSelector=SELECTOR))["items"]
        }
        self.informer.start()
        await self.informer.wait_for_sync()
        wanted = devices()
        for node, publisher in self.publishers.items():
            pool = node_pool(self.driver, node, wanted, [])
            publisher.set_pool(_owned(pool, node, uids.get(node, "")))

    async def publish(self, concurrency: int = CONCURRENCY) -> int:
        """Sync every node's pool once; the number of API writes."""
        gate = asyncio.Semaphore(concurrency)

        async def one(node: str) -> int:
            async with gate:
                return (await self.publishers[node].sync(node)).writes

        return sum(await asyncio.gather(*(one(n) for n in self.nodes)))

    async def run(self) -> None:
        """Keep every pool published until cancelled."""

        def on_error(err: BaseException, what: str) -> None:
            log.warning("publisher error", what=what, error=str(err))

        await asyncio.gather(*(p.run(on_error) for p in self.publishers.values()))

    async def stop(self) -> None:
        await self.informer.stop()


def _owned(pool: SlicePool, node: str, uid: str) -> SlicePool:
    return dataclasses.replace(pool, owner=Owner("v1", "Node", node, uid)) if uid else pool


async def _serve(kubeconfig: str, driver: str) -> None:
    client = KubeClient(load_connection(kubeconfig), "dradriver-kwok-pools")
    nodes = await client.list("/api/v1/nodes", labelSelector=SELECTOR)
    names = sorted(n["metadata"]["name"] for n in nodes["items"])
    pools = NodePools(client, driver, names)
    try:
        await pools.start()
        writes = await pools.publish()
        log.info("published the simulated nodes' pools", nodes=len(names), writes=writes)
        await pools.run()
    finally:
        await pools.stop()
        await client.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.cluster.kwokpools",
        description="Publish every simulated (kwok) node's device pool; runs until stopped.",
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--driver", default=DEFAULT_DRIVER)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    configure(args.log_level)
    asyncio.run(_serve(args.kubeconfig, args.driver))
    return 0


if __name__ == "__main__":
    sys.exit(main())
