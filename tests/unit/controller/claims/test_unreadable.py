"""Unreadable means held (issue 21, finding 3): a claim nested deeper than the decoder's
limit holds the devices it can still be read to hold, and blocks the pools it might use
when its allocation cannot be read, until it is read or deleted.

The claims informer is the real one, fed the apiserver's JSON text through the real
decoder (a scripted list and watch, as in the informer's own tests); the reconciler,
its holdings and the allocation worker are real; the apiserver for writes is the fake.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import pytest

from controller.claims.context import ClaimContext, ClaimSources
from controller.claims.holdings import UNREADABLE_METRIC, unreadable_key
from controller.claims.reconciler import ClaimReconciler
from controller.claims.unreadable import UnreadableClaim, read_cut_claim
from controller.claims.worker import AllocationWorker
from dradriver.k8s.jsondecode import CUT, TooDeepObject, decode_list, decode_watch_event
from dradriver.k8s.objects import Obj
from dradriver.metrics import Registry
from dradriver.runtime import Backoff, Informer, RequeueAfter
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.informer import FakeInformer
from tests.metricsample import sample_value
from tests.unit.controller.claims.test_worker import GPU, claim_path, immediate
from tests.unit.dradriver.allocator.builders import DRIVER, device, node, node_slice
from tests.unit.dradriver.allocator.builders import claim as bare_claim
from tests.unit.dradriver.allocator.builders import request as bare_request
from tests.unit.dradriver.runtime.test_leaderelection import eventually

DEADLINE = 10.0
APISERVER_MAX_DEPTH = 10_000  # what the apiserver accepts in status.devices[].data
NODES = [node("node-1")]
POOL = "node-1"


def result(device_name: str, pool: str = POOL, driver: str = DRIVER) -> Obj:
    return {"request": "r", "driver": driver, "pool": pool, "device": device_name}


def deep_claim_text(name: str, rv: int, allocation: str, depth: int = APISERVER_MAX_DEPTH) -> str:
    """Claim ``name`` with ``allocation`` (JSON text) as its status.allocation and a
    ``status.devices[].data`` nested ``depth`` levels: too deep for the controller."""
    data = "[" * depth + "]" * depth
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": str(rv)}
    return (
        '{"kind":"ResourceClaim","metadata":' + json.dumps(meta) + ',"spec":'
        + json.dumps(bare_claim(name, bare_request("r"))["spec"])
        + ',"status":{"allocation":' + allocation
        + ',"devices":[{"driver":"' + DRIVER + '","pool":"' + POOL
        + '","device":"dev-0","data":' + data + "}]}}"
    )  # fmt: skip


def allocated(*results: Obj) -> str:
    return json.dumps({"devices": {"results": list(results)}})


# An allocation whose results sit below the cut (its config nests too deep, and so do the
# results' own lists): nothing says which devices it holds.
CUT_ALLOCATION = '{"devices":{"results":' + "[" * 200 + "]" * 200 + "}}"


# --- what a cut claim says it holds ----------------------------------------------------


def cut_of(text: str, limit: int = 128) -> Obj:
    obj = decode_watch_event('{"type":"ADDED","object":' + text + "}", limit)["object"]
    assert isinstance(obj, dict)
    return obj


def test_a_cut_claim_holds_its_readable_results_and_blocks_what_it_cannot_read() -> None:
    whole = read_cut_claim(cut_of(deep_claim_text("a", 1, allocated(result("dev-0")))), "own")
    assert whole == UnreadableClaim(
        {"devices": {"results": [result("dev-0")]}}, why="allocation readable"
    )
    assert not whole.blocks
    nothing = read_cut_claim(cut_of(deep_claim_text("a", 1, "null")), "own")
    assert nothing.allocation is None and not nothing.blocks
    unknown = read_cut_claim(cut_of(deep_claim_text("a", 1, CUT_ALLOCATION)), "own")
    assert unknown.allocation is None and unknown.drivers == {"own"}
    assert unknown.describe_blocked() == ["own/*"] and unknown.why == "some allocation results cut"
    # Cut higher up (a decoder limit of 4 levels cuts status.allocation.devices).
    higher = read_cut_claim(cut_of(deep_claim_text("a", 1, allocated(result("d"))), 4), "own")
    assert higher == UnreadableClaim(
        None, drivers=frozenset({"own"}), why="status.allocation.devices cut"
    )
    # Known by its name only (its metadata was cut): nothing says it holds nothing.
    named = TooDeepObject({"metadata": {"name": "a"}}, 2, identity_only=True)
    assert read_cut_claim(named, "own").drivers == {"own"}
    # One result cut below its pool, one cut whole, one whose share was cut (held whole).
    partial: Obj = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": "x.dev", "pool": "px", "device": CUT},
                        CUT,
                        {**result("dev-1"), "shareID": "s", "consumedCapacity": CUT},
                        {"driver": "y.dev", "device": "d"},
                    ]
                }
            }
        }
    }
    some = read_cut_claim(partial, "own")
    assert some.allocation == {"devices": {"results": [result("dev-1")]}}
    assert some.pools == {("x.dev", "px")} and some.drivers == {"own", "y.dev"}
    assert some.blocks_device(("x.dev", "px", "any")) and not some.blocks_device(
        ("x.dev", "q", "a")
    )


# --- the controller, fresh, with a too-deep claim in the cluster -------------------------


class TextClient:
    """Lists and watches answered with the apiserver's JSON text, through the decoder."""

    def __init__(self, items: list[str], rv: int) -> None:
        self.list_text = '{"metadata":{"resourceVersion":"' + str(rv) + '"},"items":['
        self.list_text += ",".join(items) + "]}"
        self.events: asyncio.Queue[str] = asyncio.Queue()

    async def list(self, path: str, **params: Any) -> Obj:
        return decode_list(self.list_text.encode())

    async def watch(self, path: str, resource_version: str, **params: Any) -> AsyncIterator[Obj]:
        while True:
            yield decode_watch_event((await self.events.get()).encode())

    # What FakeAPIServer.feed plays into: the controller's own writes, as watch events.
    def apply(self, obj: Obj) -> None:
        self.events.put_nowait(json.dumps({"type": "MODIFIED", "object": obj}))

    def remove(self, obj: Obj, rv: int | None = None) -> None:
        self.events.put_nowait(json.dumps({"type": "DELETED", "object": obj}))


class Controller:
    """A freshly started controller (nothing remembered) over ``claims`` (JSON texts)."""

    def __init__(self, worker: AllocationWorker, devices: int, *deep: str) -> None:
        self.api = FakeAPIServer()
        self.registry = Registry()
        readable = [
            self.api.put(claim_path(n), immediate(bare_claim(n, bare_request("r"))))
            for n in ("b", "c")
        ]
        self.client = TextClient([*deep, *(json.dumps(c) for c in readable)], 100)
        self.api.feed("resourceclaims", self.client)
        self.claims = Informer(
            self.client, "/claims", name="claims", backoff=Backoff(base=0.01, cap=0.1)
        )
        slices = [node_slice("node-1", [device(f"dev-{i}") for i in range(devices)])]
        self.rec = ClaimReconciler(
            ClaimContext.create(cast(Any, self.api), DRIVER, self.claims, registry=self.registry),
            ClaimSources(
                cast(Any, FakeInformer()),
                cast(Any, FakeInformer(*slices)),
                cast(Any, FakeInformer(GPU)),
                cast(Any, FakeInformer(*NODES)),
            ),
            worker=worker,
        )

    async def __aenter__(self) -> Controller:
        self.claims.start()
        await asyncio.wait_for(self.claims.wait_for_sync(), DEADLINE)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.claims.stop()

    def devices(self, name: str) -> list[str]:
        stored = self.api.stored(claim_path(name))
        assert stored is not None
        allocation = (stored.get("status") or {}).get("allocation") or {"devices": {}}
        return [r["device"] for r in allocation["devices"].get("results") or []]

    async def caught_up(self, name: str) -> None:
        """The informer shows claim ``name`` as the apiserver has it (our writes included)."""
        stored = self.api.stored(claim_path(name))
        assert stored is not None
        rv = stored["metadata"]["resourceVersion"]

        def cached() -> Obj:
            meta: Obj = (self.claims.get(f"ns/{name}") or {"metadata": {}})["metadata"]
            return meta

        await eventually(f"claim {name} at {rv}", lambda: cached().get("resourceVersion") == rv)

    def unreadable(self, allocation: str) -> float | None:
        return sample_value(self.registry, UNREADABLE_METRIC, {"allocation": allocation})


@pytest.fixture(scope="module")
def worker() -> Iterator[AllocationWorker]:
    shared = AllocationWorker()
    yield shared
    asyncio.run(shared.close())


def test_finding_3_a_too_deep_claim_keeps_its_device_after_a_restart(
    worker: AllocationWorker,
) -> None:
    """Claim A holds dev-0 and is nested too deep to decode; a controller that starts
    (restart, upgrade, failover) must not give dev-0 to claim B. On main the informer
    skipped A, so B got dev-0."""

    async def scenario() -> None:
        deep_a = deep_claim_text("a", 5, allocated(result("dev-0")))
        async with Controller(worker, 2, deep_a) as ctl:
            await ctl.rec("ns/b")
            assert ctl.devices("b") == ["dev-1"]  # not dev-0, which A holds
            assert ctl.claims.get("ns/a") is None and "ns/a" in ctl.claims.unreadable
            held = ctl.rec.holdings.state.holders((DRIVER, POOL, "dev-0"))
            assert held == [unreadable_key("ns/a")]
            assert ctl.unreadable("readable") == 1 and ctl.unreadable("unreadable") == 0
            with pytest.raises(RequeueAfter):
                await ctl.rec("ns/c")  # nothing free is left
            assert ctl.devices("c") == []
            await ctl.caught_up("c")
            # A is deleted (as seen in its too-deep form): dev-0 is free for C.
            ctl.client.events.put_nowait(
                '{"type":"DELETED","object":' + deep_claim_text("a", 6, allocated()) + "}"
            )
            await eventually("A's deletion", lambda: not ctl.claims.unreadable)
            assert ctl.rec.holdings.state.holders((DRIVER, POOL, "dev-0")) == []
            await ctl.rec("ns/c")
            assert ctl.devices("c") == ["dev-0"]
            assert ctl.unreadable("readable") == 0

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_too_deep_claim_whose_allocation_cannot_be_read_blocks_its_pools(
    worker: AllocationWorker,
) -> None:
    """Nothing of A's allocation can be read: no device of the driver's pools is given
    out until A is read (or deleted); then only what A holds stays taken."""

    async def scenario() -> None:
        async with Controller(worker, 2, deep_claim_text("a", 5, CUT_ALLOCATION)) as ctl:
            assert ctl.unreadable("unreadable") == 1
            with pytest.raises(RequeueAfter):
                await ctl.rec("ns/b")
            assert ctl.devices("b") == []
            stored = ctl.api.stored(claim_path("b"))
            assert stored is not None and "too deep to decode" in json.dumps(stored)
            # A newer version of A can be read (its deep data removed): A holds dev-1.
            readable_a = json.loads(deep_claim_text("a", 6, allocated(result("dev-1")), 1))
            ctl.client.events.put_nowait(json.dumps({"type": "MODIFIED", "object": readable_a}))
            await eventually("A read", lambda: ctl.claims.get("ns/a") is not None)
            assert not ctl.claims.unreadable and ctl.unreadable("unreadable") == 0
            await ctl.caught_up("b")
            await ctl.rec("ns/b")
            assert ctl.devices("b") == ["dev-0"]

    asyncio.run(asyncio.wait_for(scenario(), 60))
