"""ParametersPinReconciler: pins referenced parameters into scheduler-allocated claims.

The reconciler reads claims and DeviceClaimParameters from informer caches
(:class:`~tests.fakes.informer.FakeInformer`, the watch played by the test) and writes
to :class:`~tests.fakes.apiserver.FakeAPIServer`, which keeps resourceVersion
conflicts and ``/status`` semantics. After each reconcile the test feeds the stored
claim back to the cache, as the watch would.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from controller.pinning import ParametersPinReconciler, claims_referencing
from dradriver.api import parameters as params
from dradriver.api import pinnedparameters as pins
from dradriver.api.wellknown import STATUS_ANNOTATION
from dradriver.k8s.client import KubeClient
from dradriver.k8s.objects import Obj
from dradriver.runtime import Informer, RequeueAfter
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.claims import (
    CONFIG_API_VERSION,
    DRIVER,
    allocated_claim,
    claim_path,
    device_config,
    opaque,
    parameters_reference,
    result,
    store_claim,
)
from tests.fakes.informer import FakeInformer

NS = "ns"
KEY = f"{NS}/train"


def parameters_object(rv: str, **spec: Any) -> Obj:
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": params.KIND,
        "metadata": {"name": "fast", "namespace": NS, "uid": "p-1", "resourceVersion": rv},
        "spec": spec,
    }


def referencing_claim() -> Obj:
    """Allocated by the scheduler: two devices of ours, one of another driver."""
    return allocated_claim(
        "train",
        [
            result("dev-0"),
            result("dev-1", "gpu-2"),
            result("nic-0", "net", driver="other.example.com", pool="fabric"),
        ],
        namespace=NS,
        config=[
            opaque(device_config(env={"FROM_CLASS": "1"}), source="FromClass"),
            opaque(parameters_reference("fast")),
        ],
    )


class Controller:
    def __init__(self, *parameters: Obj) -> None:
        self.api = FakeAPIServer()
        self.claims = FakeInformer()
        self.parameters = FakeInformer(*parameters)
        self.leader = True
        self.reconciler = ParametersPinReconciler(
            cast(KubeClient, self.api),
            DRIVER,
            cast(Informer, self.claims),
            cast(Informer, self.parameters),
            is_leader=lambda: self.leader,
        )

    def add(self, claim: Obj) -> None:
        self.claims.apply(store_claim(self.api, claim))

    def stored(self) -> Obj:
        claim = self.api.stored(claim_path(NS, "train"))
        assert claim is not None
        return claim

    def sync(self, key: str = KEY) -> None:
        asyncio.run(self.reconciler(key))
        self.claims.apply(self.stored())  # the watch event of whatever was written

    def claim_writes(self) -> list[tuple[str, str]]:
        return [w for w in self.api.writes if "/resourceclaims/" in w[1]]

    def events(self) -> list[Obj]:
        return [o for p, o in sorted(self.api.objects.items()) if "/events/" in p]


def test_pins_the_parameters_once_into_every_device_of_the_driver() -> None:
    controller = Controller(parameters_object("7", env={"MODE": "turbo"}, profile="fast"))
    controller.add(referencing_claim())
    controller.sync()

    expected = {
        "fast": {
            "resourceVersion": "7",
            "config": device_config(env={"MODE": "turbo"}, profile="fast"),
        }
    }
    devices = controller.stored()["status"]["devices"]
    assert [(d["driver"], d["device"]) for d in devices] == [(DRIVER, "dev-0"), (DRIVER, "dev-1")]
    assert all(d["data"] == {pins.DATA_KEY: expected} for d in devices)
    assert controller.claim_writes() == [("PATCH", claim_path(NS, "train") + "/status")]
    assert controller.reconciler.pinned_total == 1
    # The allocation itself is left as the scheduler wrote it.
    stored_config = controller.stored()["status"]["allocation"]["devices"]["config"]
    assert stored_config == referencing_claim()["status"]["allocation"]["devices"]["config"]


def test_a_pin_keeps_other_data_of_the_device_status() -> None:
    controller = Controller(parameters_object("7", env={"MODE": "turbo"}))
    claim = referencing_claim()
    claim["status"]["devices"] = [
        {"driver": DRIVER, "pool": "node-1", "device": "dev-0", "data": {"attached": "yes"}}
    ]
    controller.add(claim)
    controller.sync()
    first = controller.stored()["status"]["devices"][0]
    assert first["data"]["attached"] == "yes" and pins.DATA_KEY in first["data"]


def test_a_pin_is_never_rewritten() -> None:
    controller = Controller(parameters_object("7", env={"MODE": "turbo"}))
    controller.add(referencing_claim())
    controller.sync()
    pinned = controller.stored()["status"]["devices"]
    writes = list(controller.api.writes)

    changed = parameters_object("8", env={"MODE": "eco"})
    controller.parameters.apply(changed)
    mapper = claims_referencing(cast(Informer, controller.claims), DRIVER)
    assert list(mapper(changed)) == []  # a change no longer concerns the pinned claim
    controller.sync()  # and a resync of the claim changes nothing either
    assert controller.api.writes == writes
    assert controller.stored()["status"]["devices"] == pinned


def test_an_unresolvable_reference_is_reported_and_pinned_once_it_resolves() -> None:
    controller = Controller()
    controller.add(referencing_claim())
    controller.sync()

    why = f"{params.KIND} {NS}/fast does not exist"
    stored = controller.stored()
    assert stored["metadata"]["annotations"][STATUS_ANNOTATION] == f"parameters: {why}"
    assert "devices" not in stored["status"]
    [event] = controller.events()
    assert (event["type"], event["reason"], event["message"]) == (
        "Warning",
        "ParametersUnresolved",
        why,
    )
    assert event["involvedObject"]["name"] == "train"
    writes = list(controller.api.writes)
    controller.sync()  # the same reason again: no new annotation write, no second event
    assert controller.api.writes == writes and len(controller.events()) == 1

    created = parameters_object("9", env={"MODE": "turbo"})
    mapper = claims_referencing(cast(Informer, controller.claims), DRIVER)
    assert list(mapper(created)) == [KEY]
    controller.parameters.apply(created)
    controller.sync()
    stored = controller.stored()
    assert pins.pinned(stored, DRIVER)["fast"]["resourceVersion"] == "9"
    assert STATUS_ANNOTATION not in stored["metadata"].get("annotations", {})


def test_invalid_parameters_are_reported_naming_the_field() -> None:
    controller = Controller(parameters_object("7", env={"1BAD": "x"}))
    controller.add(referencing_claim())
    controller.sync()
    message = controller.stored()["metadata"]["annotations"][STATUS_ANNOTATION]
    assert message.startswith(f"parameters: {params.KIND} {NS}/fast is invalid: ")
    assert "spec.env" in message
    assert not pins.pinned(controller.stored(), DRIVER)
    assert [e["reason"] for e in controller.events()] == ["ParametersUnresolved"]


@pytest.mark.parametrize(
    "claim",
    [
        allocated_claim("train", [result("dev-0")], namespace=NS),
        allocated_claim(
            "train",
            [result("x", driver="other.example.com")],
            namespace=NS,
            config=[opaque(parameters_reference("fast"))],
        ),
        {**referencing_claim(), "status": {}},
    ],
    ids=["no-reference", "not-our-devices", "unallocated"],
)
def test_claims_without_anything_to_pin_are_left_alone(claim: Obj) -> None:
    controller = Controller(parameters_object("7", env={"MODE": "turbo"}))
    controller.add(claim)
    controller.sync()
    assert controller.api.writes == [] and controller.events() == []


def test_a_follower_does_not_pin() -> None:
    controller = Controller(parameters_object("7", env={"MODE": "turbo"}))
    controller.add(referencing_claim())
    controller.leader = False
    with pytest.raises(RuntimeError, match="without a fresh lease"):
        controller.sync()
    assert controller.api.writes == []


def test_a_claim_that_changed_meanwhile_is_looked_at_again() -> None:
    controller = Controller(parameters_object("7", env={"MODE": "turbo"}))
    controller.add(referencing_claim())
    # Someone wrote the claim after the cache saw it: the pin must not overwrite that.
    store_claim(controller.api, referencing_claim())
    with pytest.raises(RequeueAfter):
        asyncio.run(controller.reconciler(KEY))
    assert not pins.pinned(controller.stored(), DRIVER)
