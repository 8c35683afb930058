"""The slice publisher: what it writes for node pools and network pools, and when.

Against the in-memory apiserver (tests/fakes), whose writes feed the publisher's cache
as a watch would; faults (409, 5xx, a feature gate that drops fields) are injected.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from controller.networkpools.pool import network_pool
from dradriver.api import networkpool as net
from dradriver.devices.model import Device
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.resourceslice import publisher as publisher_module
from dradriver.resourceslice.pool import SlicePool, node_pool
from dradriver.resourceslice.publisher import (
    SlicePublisher,
    SyncResult,
    dropped_fields,
    dropped_report,
)
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.informer import FakeInformer


def test_dropped_fields_are_listed_by_path() -> None:
    sent = {"devices": [{"name": "a", "taints": [{"key": "k"}], "attributes": {"x": {"int": 1}}}]}
    back = {"devices": [{"name": "a", "attributes": {"x": {"int": 1}}}]}
    assert dropped_fields(sent, back) == ["spec.devices[0].taints"]
    assert dropped_fields(sent, sent) == []


def test_dropped_gated_field_names_the_feature_gate() -> None:
    sent = {"devices": [{"name": "a", "consumesCounters": []}]}
    report = dropped_report("s", sent, {"devices": [{"name": "a"}]})
    assert report is not None and "DRAPartitionableDevices" in report
    assert dropped_report("s", sent, sent) is None


# --------------------------------------------------------------------------------------------
# The publisher's write decisions, for a node pool and for a network pool
# --------------------------------------------------------------------------------------------

DRIVER = "dradriver.dev"
NODE = "node-1"
NETWORK = "fab"
SLICES = path_for(RESOURCE_V1, "resourceslices")


def slice_path(name: str) -> str:
    return path_for(RESOURCE_V1, "resourceslices", name=name)


@dataclass
class Flavour:
    """One kind of pool: how to make it with ``count`` devices, and how it is split."""

    name: str
    pool_name: str
    big: int  # two slices
    small: int  # one slice
    make: Callable[..., SlicePool]
    node: str | None
    owner_uid: str


def _node_pool(count: int, changed: str = "", tainted: str = "") -> SlicePool:
    devices = [
        Device.model_validate(
            {
                "name": f"d-{i:03d}",
                "attributes": {
                    "index": i,
                    **({"changed": True} if f"d-{i:03d}" == changed else {}),
                },
                "taints": [TAINT] if f"d-{i:03d}" == tainted else [],
            }
        )
        for i in range(count)
    ]
    return node_pool(DRIVER, NODE, devices, [])


def _network_pool(count: int, changed: str = "", tainted: str = "") -> SlicePool:
    spec = net.parse_spec(
        {
            "attach": {"backend": "simulated"},
            "devices": [
                {
                    "name": f"d-{i:03d}",
                    "attributes": {"index": {"int": i}}
                    | ({"changed": {"bool": True}} if f"d-{i:03d}" == changed else {}),
                }
                for i in range(count)
            ],
        }
    )
    cooling = {tainted} if tainted else set()
    return network_pool(DRIVER, NETWORK, spec, "pool-uid", 1, cooling)


TAINT = {"key": "example.com/maintenance", "effect": "NoSchedule"}
FLAVOURS = [
    # Node slices fill up to 128 devices; network slices hold 64.
    Flavour("node", NODE, 150, 100, _node_pool, NODE, "node-uid"),
    Flavour("network", f"network/{NETWORK}", 100, 50, _network_pool, None, "pool-uid"),
]


class World:
    """A fake apiserver, the publisher's slice cache fed by it, and the publisher."""

    def __init__(self, flavour: Flavour, fed: bool = True) -> None:
        self.flavour = flavour
        self.api = FakeAPIServer()
        self.cache = FakeInformer()
        if fed:
            self.api.feed("resourceslices", self.cache)
        self.api.put(
            path_for("v1", "nodes", name=NODE), {"metadata": {"name": NODE, "uid": "node-uid"}}
        )
        self.publisher = SlicePublisher(self.api, DRIVER, self.cache, node=flavour.node)

    def publish(self, count: int, **change: str) -> SyncResult:
        self.publisher.set_pool(self.flavour.make(count, **change))
        return asyncio.run(self.publisher.sync(self.flavour.pool_name))

    def slices(self) -> dict[str, Obj]:
        return {
            p.rsplit("/", 1)[1]: o
            for p, o in self.api.objects.items()
            if p.startswith(SLICES + "/")
            and o["spec"]["driver"] == DRIVER
            and o["spec"]["pool"]["name"] == self.flavour.pool_name
        }

    def writes_since(self, mark: int) -> list[tuple[str, str]]:
        return self.api.writes[mark:]


@pytest.fixture(params=FLAVOURS, ids=lambda f: f.name)
def flavour(request: pytest.FixtureRequest) -> Flavour:
    value: Flavour = request.param
    return value


def test_first_publish_creates_the_slices(flavour: Flavour) -> None:
    world = World(flavour)
    result = world.publish(flavour.big)
    slices = world.slices()
    assert result.writes == 2 and [m for m, _ in world.api.writes] == ["POST", "POST"]
    assert len(slices) == 2
    for s in slices.values():
        assert s["spec"]["pool"] == {
            "name": flavour.pool_name,
            "generation": 1,
            "resourceSliceCount": 2,
        }
        assert s["metadata"]["ownerReferences"][0]["uid"] == flavour.owner_uid
        if flavour.node:
            assert s["spec"]["nodeName"] == NODE
        else:
            assert s["spec"]["allNodes"] is True
            assert s["metadata"]["labels"] == {f"{DRIVER}/network-pool": NETWORK}
    published = sorted(d["name"] for s in slices.values() for d in s["spec"]["devices"])
    assert published == [f"d-{i:03d}" for i in range(flavour.big)]


@pytest.mark.parametrize("fed", [True, False], ids=["cache-current", "cache-behind"])
def test_unchanged_pool_writes_nothing(flavour: Flavour, fed: bool) -> None:
    # With the cache behind (its watch has not delivered our creates yet), the publisher
    # still knows what it wrote and does not write it again.
    world = World(flavour, fed=fed)
    world.publish(flavour.big)
    mark = len(world.api.writes)
    assert world.publish(flavour.big).writes == 0
    assert world.writes_since(mark) == []


def test_one_changed_device_rewrites_its_slice_in_place(flavour: Flavour) -> None:
    world = World(flavour)
    world.publish(flavour.big)
    mark = len(world.api.writes)
    last = f"d-{flavour.big - 1:03d}"  # in the second slice
    result = world.publish(flavour.big, changed=last)
    [(method, path)] = world.writes_since(mark)
    assert method == "PUT"
    changed = world.slices()[path.rsplit("/", 1)[1]]
    assert any(d["name"] == last for d in changed["spec"]["devices"])
    assert result.generation == 1
    assert {s["spec"]["pool"]["generation"] for s in world.slices().values()} == {1}


def test_a_taint_rewrites_its_slice_in_place(flavour: Flavour) -> None:
    # Node slices drop to 64 devices when tainted, so the node pool's taint goes on a
    # device of the small second slice; network slices are always cut at 64.
    world = World(flavour)
    world.publish(flavour.big)
    mark = len(world.api.writes)
    last = f"d-{flavour.big - 1:03d}"
    world.publish(flavour.big, tainted=last)
    assert [m for m, _ in world.writes_since(mark)] == ["PUT"]
    tainted = [d for s in world.slices().values() for d in s["spec"]["devices"] if d.get("taints")]
    assert [d["name"] for d in tainted] == [last]
    assert {s["spec"]["pool"]["generation"] for s in world.slices().values()} == {1}


def test_layout_change_bumps_the_generation_and_removes_extra_slices(flavour: Flavour) -> None:
    world = World(flavour)
    world.publish(flavour.big)
    mark = len(world.api.writes)
    result = world.publish(flavour.small)
    writes = world.writes_since(mark)
    assert sorted(m for m, _ in writes) == ["DELETE", "PUT"]
    assert writes[0][0] == "DELETE"  # obsolete slices go first
    [only] = world.slices().values()
    assert only["spec"]["pool"] == {
        "name": flavour.pool_name,
        "generation": 2,
        "resourceSliceCount": 1,
    }
    assert result.generation == 2 and result.slices == 1


def test_a_pool_no_longer_desired_is_deleted(flavour: Flavour) -> None:
    world = World(flavour)
    world.publish(flavour.big)
    foreign = {
        # Not this publisher's: another driver's slice, and another node's.
        "other-driver": {"driver": "other.dev", "pool": {"name": flavour.pool_name}},
        "other-node": {"driver": DRIVER, "nodeName": "node-2", "pool": {"name": "node-2"}},
    }
    for name, spec in foreign.items():
        world.api.put(slice_path(name), {"metadata": {"name": name}, "spec": spec})
    world.publisher.remove_pool(flavour.pool_name)
    result = asyncio.run(world.publisher.sync(flavour.pool_name))
    assert result.writes == 2 and result.slices == 0
    assert world.slices() == {}
    assert all(slice_path(n) in world.api.objects for n in foreign)


def test_a_stray_pool_of_ours_is_deleted(flavour: Flavour) -> None:
    world = World(flavour)
    stray = "node-1-old" if flavour.node else "network/gone"
    spec: Obj = {"driver": DRIVER, "pool": {"name": stray, "generation": 3}}
    spec |= {"nodeName": NODE} if flavour.node else {"allNodes": True}
    world.api.put(slice_path("stray"), {"metadata": {"name": "stray"}, "spec": spec})
    assert asyncio.run(world.publisher.sync(stray)).writes == 1
    assert slice_path("stray") not in world.api.objects


def _drop_gated(flavour: Flavour) -> tuple[Callable[[Obj], None], str, dict[str, str]]:
    """The field a gate that is off drops, that gate, and the change that sends the field."""
    last = f"d-{flavour.big - 1:03d}"
    if flavour.node:

        def drop_taints(obj: Obj) -> None:
            for d in obj.get("spec", {}).get("devices") or []:
                d.pop("taints", None)

        return drop_taints, "DRADeviceTaints", {"tainted": last}

    def drop_binding(obj: Obj) -> None:
        for d in obj.get("spec", {}).get("devices") or []:
            for key in ("bindsToNode", "bindingConditions", "bindingFailureConditions"):
                d.pop(key, None)

    return drop_binding, "DRADeviceBindingConditions", {}


def test_a_dropped_field_is_reported_with_its_gate_and_not_written_again(
    flavour: Flavour,
) -> None:
    world = World(flavour)
    drop, gate, change = _drop_gated(flavour)
    world.api.on_write(SLICES, drop)
    result = world.publish(flavour.big, **change)
    assert result.dropped and all(gate in r for r in result.dropped)
    assert world.publisher.dropped(flavour.pool_name) == list(result.dropped)
    mark = len(world.api.writes)
    # The apiserver cannot keep more; asking again would be one write per sync for ever.
    again = world.publish(flavour.big, **change)
    assert again.writes == 0 and again.dropped == ()
    assert world.writes_since(mark) == []
    assert any(gate in r for r in world.publisher.dropped(flavour.pool_name))
    # A real change is still written.
    assert world.publish(flavour.big, changed="d-000", **change).writes == 1


@pytest.mark.parametrize(("method", "status"), [("PUT", 409), ("POST", 503), ("DELETE", 500)])
def test_an_apiserver_error_is_retried_not_taken_for_success(
    flavour: Flavour, method: str, status: int
) -> None:
    world = World(flavour)
    if method != "POST":
        world.publish(flavour.big)
    count = flavour.small if method == "DELETE" else flavour.big
    change = {"changed": "d-000"} if method == "PUT" else {}
    world.api.fail(method, SLICES, status, times=1)
    with pytest.raises(KubeAPIError) as error:
        world.publish(count, **change)
    assert error.value.status == status
    # The next sync finishes the job: nothing was recorded as done.
    assert world.publish(count, **change).writes >= 1
    slices = world.slices()
    assert len(slices) == (1 if method == "DELETE" else 2)
    devices = {d["name"]: d for s in slices.values() for d in s["spec"]["devices"]}
    assert len(devices) == count
    if change:
        assert any("changed" in str(k) for k in devices["d-000"]["attributes"])


def test_a_node_pool_is_owned_by_its_node_once_there_is_one() -> None:
    world = World(FLAVOURS[0])
    node = world.api.objects.pop(path_for("v1", "nodes", name=NODE))
    world.publish(1)
    [only] = world.slices().values()
    assert "ownerReferences" not in only["metadata"]
    world.api.put(path_for("v1", "nodes", name=NODE), node)
    mark = len(world.api.writes)
    world.publish(1)
    assert [m for m, _ in world.writes_since(mark)] == ["PUT"]
    [only] = world.slices().values()
    assert only["metadata"]["ownerReferences"][0]["uid"] == "node-uid"


def test_a_publisher_takes_only_pools_of_its_scope() -> None:
    node_world, network_world = World(FLAVOURS[0]), World(FLAVOURS[1])
    with pytest.raises(ValueError, match="only pools on that node"):
        node_world.publisher.set_pool(_network_pool(1))
    with pytest.raises(ValueError, match="needs its node's publisher"):
        network_world.publisher.set_pool(_node_pool(1))


# --------------------------------------------------------------------------------------------
# The loop: retries with backoff, republishes what vanishes
# --------------------------------------------------------------------------------------------


def test_run_retries_a_failed_sync_and_republishes_deleted_slices() -> None:
    world = World(FLAVOURS[0])
    # 503 on the first create, with the node's two slices not yet there.
    world.api.fail("POST", SLICES, 503, times=1)
    publisher = SlicePublisher(
        world.api, DRIVER, world.cache, node=NODE, min_interval=0.001, retry_cap=0.01
    )
    publisher.set_pool(_node_pool(FLAVOURS[0].big))
    errors: list[BaseException] = []

    async def scenario() -> None:
        complete = asyncio.Event()

        def check(*_: Obj) -> None:
            if len(world.slices()) == 2:
                complete.set()
            else:
                complete.clear()

        world.cache.add_handler(on_add=check, on_update=check, on_delete=check)
        task = asyncio.create_task(publisher.run(lambda e, _: errors.append(e)))
        try:
            await asyncio.wait_for(complete.wait(), 30)
            assert [getattr(e, "status", None) for e in errors] == [503]
            # The kubelet deletes the node's slices (at its start): they come back.
            gone = next(iter(world.slices()))
            await world.api.delete(slice_path(gone))
            await asyncio.wait_for(complete.wait(), 30)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(scenario())
    assert {s["spec"]["pool"]["generation"] for s in world.slices().values()} == {2}


class _Clock:
    """The publisher's clock (``time.monotonic``), moved by the test: a fake, because the
    case needs more than ``min_interval`` to pass between two syncs, and waiting for it would
    be a sleep."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_a_sync_that_writes_nothing_does_not_delay_the_next_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sync that writes nothing (the cache's echo of our own write, a resync) does not
    restart the rate limit: a change after it is written at once if the last write is
    ``min_interval`` old (a hot-plugged device), not ``min_interval`` after the no-op."""
    clock = _Clock()
    monkeypatch.setattr(publisher_module, "time", clock)
    world = World(FLAVOURS[0])
    interval = 1.0
    publisher = SlicePublisher(
        world.api, DRIVER, world.cache, node=NODE, min_interval=interval, resync_period=0.05
    )
    publisher.set_pool(_node_pool(4))
    sync = publisher.sync
    idle: list[asyncio.Event] = []

    async def counted(pool_name: str) -> SyncResult:
        result = await sync(pool_name)
        if result.writes == 0 and world.slices() and idle:
            idle[-1].set()
        return result

    publisher.sync = counted  # type: ignore[method-assign]

    async def scenario() -> float:
        task = asyncio.create_task(publisher.run(lambda e, _: None))
        try:
            idle.append(asyncio.Event())
            await asyncio.wait_for(idle[-1].wait(), 30)  # written, then a sync with no write
            clock.now += 5 * interval  # the write is old now
            idle.append(asyncio.Event())
            await asyncio.wait_for(idle[-1].wait(), 30)  # a resync since: it wrote nothing
            written = asyncio.Event()
            world.cache.add_handler(on_update=lambda *_: written.set())
            changed = asyncio.get_running_loop().time()
            publisher.set_pool(_node_pool(4, changed="d-001"))
            await asyncio.wait_for(written.wait(), 30)
            return asyncio.get_running_loop().time() - changed
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    delay = asyncio.run(scenario())
    assert delay < interval / 2, f"the change waited {delay:.2f} s behind a sync that wrote nothing"
