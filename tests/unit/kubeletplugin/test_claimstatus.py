"""Published claim status: ``status.devices[]`` of prepared claims, written in the background.

Real parts except the apiserver: the node driver with its ledger, CDI specs and claim locks
in tmp dirs, and the real ClaimStatusWriter with its work queue. The fake apiserver keeps
resourceVersion preconditions, so a write with a stale version is a real 409; the 503s and
the one-off 409 are injected (they cannot be caused on demand otherwise), and so is an
apiserver that does not answer the status write (a PATCH that waits on an event), which is
how the test shows that prepare never waits for it.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from dradriver.host.cdi import CDIRegistry
from dradriver.host.state.ledger import Ledger
from dradriver.k8s.client import KubeClient
from dradriver.k8s.objects import Obj
from kubeletplugin.claimstatus import ClaimStatusWriter, merged_devices
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.nodedriver import NodeDriver
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.claims import (
    DRIVER,
    NODE,
    allocated_claim,
    claim_path,
    claim_ref,
    result,
    store_claim,
    with_pins,
)
from tests.unit.kubeletplugin.test_nodedriver import DEVICES

DEADLINE = 10.0  # a guard against hanging, never a timing assertion


class Plugin:
    """The node driver with the status writer hooked in, over ``api``."""

    def __init__(self, tmp: Path, api: Any, write_delay: float = 0.001) -> None:
        self.api = api
        self.writer = ClaimStatusWriter(
            cast(KubeClient, api),
            DRIVER,
            NODE,
            base_delay=0.001,
            max_delay=0.01,
            write_delay=write_delay,
        )
        self.driver = NodeDriver(
            client=cast(KubeClient, api),
            driver_name=DRIVER,
            inventory=NodeInventory(NODE, lambda: list(DEVICES)),
            ledger=Ledger.load(tmp / "plugin" / "ledger.json"),
            cdi=CDIRegistry(tmp / "cdi", DRIVER, durable=False),
            status=self.writer,
        )

    async def prepare(self, claim: Obj) -> None:
        out = await self.driver.prepare_claims([claim_ref(claim)])
        assert out[claim["metadata"]["uid"]].error == ""


def run(
    tmp: Path,
    scenario: Callable[[Plugin], Awaitable[None]],
    api: Any = None,
    write_delay: float = 0.001,
) -> None:
    async def main() -> None:
        plugin = Plugin(tmp, api if api is not None else FakeAPIServer(), write_delay)
        plugin.writer.start()
        try:
            await asyncio.wait_for(scenario(plugin), DEADLINE)
        finally:
            await plugin.writer.stop()

    asyncio.run(main())


def stored_devices(api: FakeAPIServer, claim: Obj) -> list[Obj]:
    stored = api.stored(claim_path(claim["metadata"]["namespace"], claim["metadata"]["name"]))
    assert stored is not None
    return list((stored.get("status") or {}).get("devices") or [])


def status_patches(api: FakeAPIServer) -> list[Obj]:
    return [
        cast(Obj, w.body)
        for w in api.history
        if w.method == "PATCH" and w.path.endswith("/status") and w.body is not None
    ]


def test_prepare_publishes_ready_and_data_keeping_other_entries(tmp_path: Path) -> None:
    async def scenario(plugin: Plugin) -> None:
        api = plugin.api
        claim = with_pins(
            allocated_claim("c", [result("dev-0"), result("dev-1", "other")]),
            {"fast": {"resourceVersion": "7", "config": {"profile": "fast"}}},
        )
        claim["status"]["devices"].append(
            {"driver": "other.example.com", "pool": "x", "device": "y", "data": {"a": 1}}
        )
        claim = store_claim(api, claim)
        await plugin.prepare(claim)
        await plugin.writer.settled()
        devices = stored_devices(api, claim)
        ours = {d["device"]: d for d in devices if d["driver"] == DRIVER}
        assert sorted(ours) == ["dev-0", "dev-1"]
        for name, entry in ours.items():
            (ready,) = entry["conditions"]
            assert ready["type"] == "Ready" and ready["status"] == "True"
            assert ready["reason"] == "Prepared" and ready["message"] == f"prepared on node {NODE}"
            assert ready["lastTransitionTime"].endswith("Z")
            assert entry["data"]["cdiDeviceIDs"] == [
                f"{DRIVER}/device={claim['metadata']['uid']}-{name}"
            ]
            assert entry["data"]["node"] == NODE
            # The controller's pinned parameters stay where the node reads them.
            assert entry["data"]["parameters"]["fast"]["config"] == {"profile": "fast"}
        assert {"driver": "other.example.com", "pool": "x", "device": "y", "data": {"a": 1}} in (
            devices
        )
        (patch,) = status_patches(api)
        # Guarded by the version read: a concurrent writer's change is never overwritten.
        assert patch["metadata"]["resourceVersion"] == claim["metadata"]["resourceVersion"]

    run(tmp_path, scenario)


def test_written_once_for_repeated_prepares_and_after_a_restart(tmp_path: Path) -> None:
    api = FakeAPIServer()
    claim = store_claim(api, allocated_claim("c", [result("dev-0")]))

    async def twice(plugin: Plugin) -> None:
        await plugin.prepare(claim)
        await plugin.writer.settled()
        await plugin.prepare(claim)  # the kubelet retries, or a second pod uses the claim
        await plugin.writer.settled()

    run(tmp_path, twice, api)
    assert len(status_patches(api)) == 1

    async def restarted(plugin: Plugin) -> None:  # status already there: read, not written
        await plugin.prepare(claim)
        await plugin.writer.settled()

    run(tmp_path, restarted, api)
    assert len(status_patches(api)) == 1


def test_5xx_and_conflicts_are_retried_with_backoff(tmp_path: Path) -> None:
    api = FakeAPIServer()
    claim = store_claim(api, allocated_claim("c", [result("dev-0")]))
    status = claim_path("default", "c") + "/status"
    api.fail("PATCH", status, 503, times=2)
    api.fail("PATCH", status, 429, times=1)
    api.fail("PATCH", status, 409, times=1)

    async def scenario(plugin: Plugin) -> None:
        await plugin.prepare(claim)
        await plugin.writer.settled()
        assert plugin.writer.retries == 4
        assert plugin.writer.written == 1
        assert plugin.writer.queue.num_requeues(claim["metadata"]["uid"]) == 0  # forgotten

    run(tmp_path, scenario, api)
    (entry,) = stored_devices(api, claim)
    assert entry["conditions"][0]["type"] == "Ready"


def claim_requests(api: FakeAPIServer, claim: Obj) -> list[tuple[str, str]]:
    """The requests made for the claim (prepare's and the status writer's), in order."""
    path = claim_path(claim["metadata"]["namespace"], claim["metadata"]["name"])
    return [
        (method, "status" if at.endswith("/status") else "claim")
        for method, at in api.requests
        if at.removesuffix("/status") == path
    ]


def test_the_first_write_builds_on_the_claim_prepare_read(tmp_path: Path) -> None:
    api = FakeAPIServer()
    claim = store_claim(api, allocated_claim("c", [result("dev-0"), result("dev-1")]))

    async def scenario(plugin: Plugin) -> None:
        await plugin.prepare(claim)
        await plugin.writer.settled()
        assert plugin.writer.written == 1 and plugin.writer.reads == 0

    run(tmp_path, scenario, api)
    # One GET (prepare's) and one PATCH: the status writer reads nothing of its own.
    assert claim_requests(api, claim) == [("GET", "claim"), ("PATCH", "status")]
    assert len(stored_devices(api, claim)) == 2


def test_a_claim_unprepared_before_its_status_is_due_costs_no_request(tmp_path: Path) -> None:
    api = FakeAPIServer()
    claim = store_claim(api, allocated_claim("c", [result("dev-0")]))

    async def scenario(plugin: Plugin) -> None:
        await plugin.prepare(claim)
        assert plugin.writer.pending == {claim["metadata"]["uid"]}
        await plugin.driver.unprepare_claims([claim_ref(claim)])
        await plugin.writer.settled()  # dropped, not written

    run(tmp_path, scenario, api, write_delay=3600)  # never due within the test
    assert claim_requests(api, claim) == [("GET", "claim")]  # prepare's only
    assert not stored_devices(api, claim)


class WriteAfterPrepareReadAPI(FakeAPIServer):
    """Someone else writes the claim right after prepare read it: the version that the
    status writer's first patch carries is stale by then."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    async def get_or_none(self, path: str) -> Obj | None:
        obj = await super().get_or_none(path)
        self.gets += 1
        if self.gets == 1:
            self.put(path, {**copy.deepcopy(self.objects[path]), "spec": {"x": 1}})
        return obj


def test_a_stale_version_is_a_real_conflict_and_is_read_again(tmp_path: Path) -> None:
    api = WriteAfterPrepareReadAPI()
    claim = store_claim(api, allocated_claim("c", [result("dev-0")]))

    async def scenario(plugin: Plugin) -> None:
        await plugin.prepare(claim)
        await plugin.writer.settled()
        assert plugin.writer.retries == 1 and plugin.writer.written == 1
        assert plugin.writer.reads == 1

    run(tmp_path, scenario, api)
    (entry,) = stored_devices(api, claim)
    assert entry["conditions"][0]["reason"] == "Prepared"
    assert claim_requests(api, claim) == [
        ("GET", "claim"),  # prepare's
        ("PATCH", "status"),  # on prepare's version: 409
        ("GET", "claim"),  # read again after the conflict
        ("PATCH", "status"),
    ]
    stored = api.stored(claim_path("default", "c"))
    assert stored is not None and stored["spec"] == {"x": 1}  # the other write is kept


class StalledStatusAPI(FakeAPIServer):
    """An apiserver whose claim status writes do not answer until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.patch_started = asyncio.Event()

    async def merge_patch(self, path: str, body: Obj) -> Obj:
        if path.endswith("/status"):
            self.patch_started.set()
            await self.release.wait()
        return await super().merge_patch(path, body)


def test_prepare_never_waits_for_the_status_write(tmp_path: Path) -> None:
    async def scenario(plugin: Plugin) -> None:
        api = cast(StalledStatusAPI, plugin.api)
        claim = store_claim(api, allocated_claim("c", [result("dev-0")]))
        await plugin.prepare(claim)  # returns although the status write cannot finish
        second = store_claim(api, allocated_claim("d", [result("dev-1")]))
        await api.patch_started.wait()
        await plugin.prepare(second)  # and so does the next one, while the write hangs
        assert not stored_devices(api, claim) and not stored_devices(api, second)
        api.release.set()
        await plugin.writer.settled()
        assert stored_devices(api, claim) and stored_devices(api, second)

    run(tmp_path, scenario, StalledStatusAPI())


def test_unprepared_gone_or_replaced_claims_are_dropped(tmp_path: Path) -> None:
    api = StalledStatusAPI()
    api.release.set()
    unprepared = store_claim(api, allocated_claim("u", [result("dev-0")]))
    gone = store_claim(api, allocated_claim("g", [result("dev-1")]))
    replaced = store_claim(api, allocated_claim("r", [result("dev-2")]))

    async def scenario(plugin: Plugin) -> None:
        api.release.clear()
        await plugin.prepare(unprepared)
        await api.patch_started.wait()  # the first write is in flight, the rest queued
        await plugin.prepare(gone)
        await plugin.prepare(replaced)
        del api.objects[claim_path("default", "g")]
        api.put(
            claim_path("default", "r"),
            {**allocated_claim("r", [result("dev-2")]), "metadata": {"name": "r", "uid": "new"}},
        )
        await plugin.driver.unprepare_claims([claim_ref(unprepared)])
        api.release.set()
        await plugin.writer.settled()
        assert plugin.writer.pending == frozenset()

    run(tmp_path, scenario, api)
    # Only the write already in flight for "u" could land. The first patches of "g" and "r"
    # carried the versions prepare read: refused (404, 409), and "r" is then read again.
    assert api.stored(claim_path("default", "g")) is None
    stored = api.stored(claim_path("default", "r"))
    assert stored is not None and stored["metadata"]["uid"] == "new"
    assert not (stored.get("status") or {}).get("devices")


def test_the_worker_gives_the_loop_back_between_claims_that_need_no_request() -> None:
    """Claims published already cost the worker no request, so no await: it still lets
    other tasks (prepares) run after each claim, as the GET each claim cost once did."""
    from dradriver.plugin.interface import PreparedDevice

    api = FakeAPIServer()
    device = PreparedDevice(("gpu",), NODE, "dev-0", ("x",))

    async def main() -> list[int]:
        writer = ClaimStatusWriter(cast(KubeClient, api), DRIVER, NODE, write_delay=0)
        for i in range(5):
            claim = store_claim(api, allocated_claim(f"c{i}", [result("dev-0")]))
            claim["status"]["devices"] = merged_devices([], DRIVER, NODE, (device,), 1)
            writer.prepared(claim_ref(claim), [device], claim)
        seen = []
        writer.start()
        try:
            async with asyncio.timeout(DEADLINE):
                while writer.pending:
                    seen.append(len(writer.pending))
                    await asyncio.sleep(0)
        finally:
            await writer.stop()
        return seen

    # The loop got back after every claim: the other task saw each count.
    assert asyncio.run(main()) == [5, 4, 3, 2, 1]
    assert api.requests == []  # nothing to write, nothing read


def test_network_and_foreign_pool_devices_are_left_to_their_owners() -> None:
    from dradriver.plugin.interface import PreparedDevice

    devices = (
        PreparedDevice(("a",), NODE, "dev-0", ("x",)),
        PreparedDevice(("a",), "network/fabric", "nic-0", ("y",)),
        PreparedDevice(("a",), "node-2", "dev-0", ("z",)),
        PreparedDevice(("a",), NODE, "dev-1", ("s",), share_id="0b8e-uid"),
    )
    out = merged_devices([], DRIVER, NODE, devices, 3)
    assert out is not None
    assert [(e["pool"], e["device"], e.get("shareID")) for e in out] == [
        (NODE, "dev-0", None),
        (NODE, "dev-1", "0b8e-uid"),
    ]
    assert out[0]["conditions"][0]["observedGeneration"] == 3
    assert merged_devices(out, DRIVER, NODE, devices, 3) is None  # published: nothing to do
